// Job list: `GET /v1/jobs` filtered by queue, state and kind, newest first, paged with the
// API's cursor, refreshed live (the page shown stays the same page).

import { h, update, stateBadge, jobLink, when, emptyState, routeHref, STATES } from '../dom.js';
import * as api from '../api.js';
import { queueSelect, textFilter, field, pager, lastError, rowLinks } from './shared.js';

const PAGE_SIZE = 25;

/** The time that matters most for a job in its state. */
export function stateTime(job) {
  switch (job.state) {
    case 'scheduled':
    case 'retryable':
    case 'available':
      return { label: job.state === 'available' ? 'ready' : 'runs', at: job.run_at };
    case 'running':
      return { label: 'started', at: job.started_at };
    default:
      return { label: 'finished', at: job.finished_at };
  }
}

export function jobRow(job, extra = []) {
  const time = stateTime(job);
  return h('tr', { dataset: { job: job.id, state: job.state } },
    h('td', {}, jobLink(job.id)),
    h('td', { class: 'strong', text: job.kind }),
    h('td', { text: job.queue }),
    h('td', {}, stateBadge(job.state)),
    h('td', { class: 'num', text: `${job.attempt} / ${job.max_attempts}` }),
    h('td', {}, when(job.created_at)),
    h('td', {}, h('span', { class: 'muted small', text: `${time.label} ` }), when(time.at)),
    h('td', { class: 'cell-error' }, lastError(job)),
    extra);
}

export function jobHead(extra = []) {
  return h('thead', {}, h('tr', {},
    ['Job', 'Kind', 'Queue', 'State'].map((t) => h('th', { text: t })),
    h('th', { class: 'num', text: 'Attempts' }),
    h('th', { text: 'Created' }),
    h('th', { text: 'When' }),
    h('th', { text: 'Last error' }),
    extra));
}

export default {
  title: 'Jobs',
  create(ctx, params) {
    const filters = {
      queue: params.get('queue') || '',
      state: params.get('state') || '',
      kind: params.get('kind') || '',
    };
    const errors = h('div', { class: 'slot-error' });
    const list = h('div', { id: 'jobs-table' });
    const paging = pager(() => ctx.refreshNow());
    rowLinks(list);

    const changed = () => {
      paging.reset();
      list.dataset.key = '';
      ctx.replaceRoute(routeHref('/jobs', filters));
      ctx.refreshNow();
    };
    const queue = queueSelect(ctx, filters.queue, (value) => {
      filters.queue = value;
      changed();
    });
    const stateSelect = h('select', { id: 'filter-state', name: 'state', onchange: () => {
      filters.state = stateSelect.value;
      changed();
    } },
    h('option', { value: '', text: 'All states' }),
    STATES.map((s) => h('option', { value: s, text: s })));
    stateSelect.value = filters.state;
    const kind = textFilter({ id: 'filter-kind', name: 'kind', value: filters.kind, placeholder: 'e.g. email.send', onChange: (value) => {
      filters.kind = value;
      changed();
    } });

    const el = h('section', { id: 'view-jobs' },
      h('div', { class: 'view-head' },
        h('div', {},
          h('h1', { text: 'Jobs' }),
          h('p', { class: 'subtitle', text: 'Newest first. Pick a job to see its payload and error history.' }))),
      h('div', { class: 'filters' },
        field('Queue', queue.el),
        field('State', stateSelect),
        field('Kind', kind),
        h('a', { class: 'filters-clear', href: '#/jobs', text: 'Clear filters', onclick: (event) => {
          event.preventDefault();
          filters.queue = '';
          filters.state = '';
          filters.kind = '';
          queue.el.value = '';
          stateSelect.value = '';
          kind.value = '';
          changed();
        } })),
      errors,
      h('div', { class: 'panel panel-flush' }, list, paging.el));

    return {
      el,
      async refresh() {
        queue.sync();
        await ctx.guard(errors, async () => {
          const page = await api.jobs.list({ ...filters, limit: PAGE_SIZE, after: paging.after });
          const jobs = page.jobs || [];
          paging.show(page, jobs.length);
          update(list, JSON.stringify([page, paging.after]), () => {
            if (!jobs.length) {
              const filtered = filters.queue || filters.state || filters.kind;
              if (paging.after) return emptyState('No older jobs', 'This is past the last page.');
              return filtered
                ? emptyState('No jobs match these filters', 'Try another state or clear the filters.')
                : emptyState('No jobs yet', 'Jobs show up here as soon as they are enqueued.');
            }
            return h('div', { class: 'table-wrap' }, h('table', { class: 'table table-rows' },
              jobHead(),
              h('tbody', {}, jobs.map((job) => jobRow(job)))));
          });
        }, 'Cannot list jobs:');
      },
    };
  },
};
