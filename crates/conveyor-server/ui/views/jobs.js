// Job list: `GET /v1/jobs` filtered by queue, state and kind and searched by id prefix, tag,
// tenant, sequence, creation time and payload, newest first, paged with the API's cursor, refreshed
// live (the page shown stays the same page). Rows, or everything the search matches, can be
// cancelled, retried or discarded at once through `POST /v1/jobs/bulk`, always after a
// confirmation whose count comes from a dry run of exactly that request. While rows are
// selected (or when paused by hand) the list holds still.

import { h, update, stateBadge, jobLink, when, emptyState, routeHref, num, STATES } from '../dom.js';
import * as api from '../api.js';
import { queueSelect, textFilter, field, checkedField, pager, liveToggle, lastError, rowLinks } from './shared.js';

const PAGE_SIZE = 25;

/** Every search criterion, as named by the API (query parameters and bulk filter alike). */
const CRITERIA = ['queue', 'state', 'kind', 'id_prefix', 'tag', 'tenant', 'sequence', 'created_after', 'created_before', 'payload'];

/** The bulk actions: what each applies to and how it is told. */
const ACTIONS = {
  cancel: {
    label: 'Cancel', past: 'Cancelled', applies: 'unfinished', danger: true, dismiss: 'Keep them',
    note: 'A cancelled job does not run (a running one loses its lease); finished jobs are left as they are.',
  },
  retry: {
    label: 'Retry', past: 'Retried', applies: 'dead or expired', danger: false, dismiss: 'Cancel',
    note: 'They go back to their queues with a fresh set of attempts; their error histories are kept.',
  },
  discard: {
    label: 'Discard', past: 'Discarded', applies: 'dead or expired', danger: true, dismiss: 'Cancel',
    note: 'Their payloads and error histories are deleted. This cannot be undone.',
  },
};

const plural = (n, word = 'job') => `${num(n)} ${word}${n === 1 ? '' : 's'}`;

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

/** A job's row; `lead` is an optional first cell (the selection checkbox). */
export function jobRow(job, extra = [], lead = null) {
  const time = stateTime(job);
  return h('tr', { dataset: { job: job.id, state: job.state } },
    lead,
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

export function jobHead(extra = [], lead = null) {
  return h('thead', {}, h('tr', {},
    lead,
    ['Job', 'Kind', 'Queue', 'State'].map((t) => h('th', { text: t })),
    h('th', { class: 'num', text: 'Attempts' }),
    h('th', { text: 'Created' }),
    h('th', { text: 'When' }),
    h('th', { text: 'Last error' }),
    extra));
}

/** A `datetime-local` value (local time, no zone) as an RFC 3339 UTC timestamp; '' stays ''. */
export function localToUtc(value) {
  if (!value) return '';
  const at = new Date(value);
  return Number.isNaN(at.getTime()) ? '' : at.toISOString().replace(/\.000Z$/, 'Z');
}

/** An RFC 3339 timestamp as a `datetime-local` value in local time ('' if it is not one). */
export function utcToLocal(iso) {
  if (!iso) return '';
  const at = new Date(iso);
  if (Number.isNaN(at.getTime())) return '';
  const pad = (n) => String(n).padStart(2, '0');
  const seconds = at.getSeconds() ? `:${pad(at.getSeconds())}` : '';
  return `${at.getFullYear()}-${pad(at.getMonth() + 1)}-${pad(at.getDate())}T${pad(at.getHours())}:${pad(at.getMinutes())}${seconds}`;
}

export default {
  title: 'Jobs',
  create(ctx, params) {
    const filters = Object.fromEntries(CRITERIA.map((key) => [key, params.get(key) || '']));
    // The selection: ids on the page shown, or (allMatching) everything the search matches.
    const selected = new Set();
    let allMatching = null;
    // The dry-run count offered as "Select all N matching", for the filters it was made for.
    let matchCount = null;
    let shown = [];
    let loaded = false;
    // The next refresh loads the list even while it is paused (the user asked for new rows).
    let force = false;

    const errors = h('div', { class: 'slot-error' });
    const actionError = h('div', { class: 'slot-error' });
    const list = h('div', { id: 'jobs-table' });
    const paging = pager(() => {
      clearSelection();
      reload();
    });
    const live = liveToggle('jobs-live', () => ctx.refreshNow());
    rowLinks(list);

    function reload() {
      force = true;
      list.dataset.key = '';
      ctx.refreshNow();
    }

    const changed = () => {
      paging.reset();
      clearSelection();
      ctx.replaceRoute(routeHref('/jobs', filters));
      reload();
    };
    const setter = (key) => (value) => {
      filters[key] = value;
      changed();
    };

    const queue = queueSelect(ctx, filters.queue, setter('queue'));
    const stateSelect = h('select', { id: 'filter-state', name: 'state', onchange: () => setter('state')(stateSelect.value) },
      h('option', { value: '', text: 'All states' }),
      STATES.map((s) => h('option', { value: s, text: s })));
    stateSelect.value = filters.state;
    const text = (key, id, placeholder, type) => textFilter({ id, name: key, value: filters[key], placeholder, type, onChange: setter(key) });
    const kind = text('kind', 'filter-kind', 'e.g. email.send');
    const idPrefix = text('id_prefix', 'filter-id', 'e.g. 0193a5f2');
    const tag = text('tag', 'filter-tag', 'e.g. vip');
    const tenant = text('tenant', 'filter-tenant', 'e.g. acme');
    const sequence = text('sequence', 'filter-sequence', 'e.g. payload.account=acme');
    const payload = text('payload', 'filter-payload', '{"user_id": 7}', 'text');
    payload.classList.add('input-wide');
    const timeInput = (key, id) => {
      const input = h('input', { id, name: key, type: 'datetime-local', value: utcToLocal(filters[key]), onchange: () => {
        const value = localToUtc(input.value);
        if (value !== filters[key]) setter(key)(value);
      } });
      return input;
    };
    const createdAfter = timeInput('created_after', 'filter-created-after');
    const createdBefore = timeInput('created_before', 'filter-created-before');

    // The fields whose value the server may refuse, by the name it gives them.
    const checked = {
      kind: checkedField('Kind', kind),
      id_prefix: checkedField('Id prefix', idPrefix),
      tag: checkedField('Tag', tag),
      tenant: checkedField('Tenant', tenant),
      sequence: checkedField('Sequence', sequence),
      created_after: checkedField('Created after', createdAfter),
      created_before: checkedField('Created before', createdBefore),
      payload: checkedField('Payload contains', payload),
    };
    /** Shows the server's complaint next to its field; false when it names no field shown here. */
    function fieldError(error) {
      const name = String(error.field || '').replace(/^filter\./, '');
      if (error.status !== 400 || !checked[name]) return false;
      for (const [key, slot] of Object.entries(checked)) slot.set(key === name ? error.message : null);
      return true;
    }
    function clearFieldErrors() {
      for (const slot of Object.values(checked)) slot.set(null);
    }

    const searching = () => CRITERIA.some((key) => filters[key]);
    /** The bulk request's filter: the criteria in use, the payload as the object it spells. */
    function bulkFilter() {
      const filter = {};
      for (const key of CRITERIA) {
        if (!filters[key]) continue;
        if (key !== 'payload') filter[key] = filters[key];
        else {
          try {
            filter.payload = JSON.parse(filters.payload);
          } catch (error) {
            throw new api.ApiError(400, 'invalid', 'payload', `must be a JSON object such as {"user_id": 7}: ${error.message}`);
          }
        }
      }
      return filter;
    }

    // The toolbar above the table: what is selected, the bulk actions, live or paused.
    const selectionLabel = h('span', { class: 'muted small', id: 'jobs-selection' });
    const selectMatching = h('button', { class: 'btn-link', type: 'button', id: 'jobs-select-matching', hidden: true, onclick: () => selectAllMatching() });
    const clearLink = h('button', { class: 'btn-link', type: 'button', id: 'jobs-clear-selection', hidden: true, text: 'Clear selection', onclick: () => clearSelection() });
    const actionButtons = Object.entries(ACTIONS).map(([action, spec]) => h('button', {
      class: `btn btn-small ${spec.danger ? 'btn-danger-outline' : ''}`.trim(),
      type: 'button',
      id: `jobs-${action}`,
      dataset: { action },
      text: spec.label,
      onclick: () => bulk(action),
    }));
    const toolbar = h('div', { class: 'toolbar' },
      selectionLabel, selectMatching, clearLink,
      h('span', { class: 'toolbar-gap' }),
      actionButtons,
      h('span', { class: 'toolbar-sep' }),
      live.el);

    function syncToolbar() {
      const canOperate = ctx.canOperate;
      const any = Boolean(allMatching) || selected.size > 0;
      if (allMatching) {
        selectionLabel.textContent = `All ${plural(allMatching.matched)} matching this search selected${allMatching.truncated ? ' (acted on 100,000 at a time)' : ''}`;
      } else if (selected.size) {
        selectionLabel.textContent = `${num(selected.size)} selected`;
      } else {
        selectionLabel.textContent = 'Select jobs to act on several at once';
      }
      const wholePage = shown.length > 0 && shown.every((job) => selected.has(job.id));
      const offer = !allMatching && wholePage && searching();
      selectMatching.hidden = !offer;
      if (offer) {
        const key = JSON.stringify(filters);
        if (!matchCount || matchCount.key !== key) countMatching(key);
        selectMatching.textContent = matchCount.matched === null
          ? 'Select all matching…'
          : `Select all ${num(matchCount.matched)} matching`;
      }
      clearLink.hidden = !any;
      const hint = canOperate ? null : 'Needs the admin role';
      for (const button of actionButtons) {
        button.disabled = !canOperate || !any;
        if (hint) button.title = hint;
        else button.removeAttribute('title');
      }
    }

    /** The count for "Select all N matching": a dry run of the filter (nothing changes). */
    async function countMatching(key) {
      const mine = { key, matched: null };
      matchCount = mine;
      await ctx.guard(actionError, async () => {
        const answer = await api.jobs.bulk({ filter: bulkFilter(), action: 'cancel', dry_run: true });
        mine.matched = answer.matched;
      }, 'Cannot count the matching jobs:');
      if (matchCount === mine) syncToolbar();
    }

    async function selectAllMatching() {
      await ctx.guard(actionError, async () => {
        const answer = await api.jobs.bulk({ filter: bulkFilter(), action: 'cancel', dry_run: true });
        allMatching = { matched: answer.matched, truncated: answer.truncated };
        selectionChanged();
      }, 'Cannot count the matching jobs:');
    }

    function clearSelection() {
      selected.clear();
      allMatching = null;
      matchCount = null;
      selectionChanged();
    }

    /** Shows the selection on the rows in place (no rebuild: focus stays on the checkbox). */
    function syncSelection() {
      for (const row of list.querySelectorAll('tr[data-job]')) {
        const on = Boolean(allMatching) || selected.has(row.dataset.job);
        row.classList.toggle('selected', on);
        const box = row.querySelector('input.row-check');
        if (box) box.checked = on;
      }
      const all = list.querySelector('input.page-check');
      if (all) {
        const count = shown.filter((job) => selected.has(job.id)).length;
        all.checked = Boolean(allMatching) || (shown.length > 0 && count === shown.length);
        all.indeterminate = !all.checked && count > 0;
      }
    }

    function selectionChanged() {
      live.selection(allMatching ? Math.max(1, allMatching.matched) : selected.size);
      syncSelection();
      syncToolbar();
    }

    async function bulk(action) {
      const spec = ACTIONS[action];
      await ctx.guard(actionError, async () => {
        const target = allMatching ? { filter: bulkFilter() } : { ids: [...selected] };
        if (!allMatching && !target.ids.length) return;
        const dry = await api.jobs.bulk({ ...target, action, dry_run: true });
        const scope = allMatching ? 'this search' : 'the selection';
        if (!dry.eligible) {
          ctx.notify(`Nothing to ${action}: none of the ${plural(dry.matched)} in ${scope} ${dry.matched === 1 ? 'is' : 'are'} ${spec.applies}.`, 'error');
          return;
        }
        const left = dry.matched - dry.eligible;
        const text = [
          `${plural(dry.matched)} in ${scope}; ${num(dry.eligible)} ${dry.eligible === 1 ? 'is' : 'are'} ${spec.applies} and will be ${spec.past.toLowerCase()}${left ? ` (the other ${num(left)} ${left === 1 ? 'is' : 'are'} left alone)` : ''}.`,
          spec.note,
          dry.truncated ? 'More jobs match than one request acts on (100,000): repeat it for the rest.' : '',
        ].filter(Boolean).join(' ');
        const ok = await ctx.confirm({
          title: `${spec.label} ${plural(dry.eligible)}?`,
          text,
          ok: `${spec.label} ${plural(dry.eligible)}`,
          dismiss: spec.dismiss,
          danger: spec.danger,
        });
        if (!ok) return;
        const done = await api.jobs.bulk({ ...target, action });
        clearSelection();
        ctx.notify(`${spec.past} ${plural(done.applied)}.`);
        reload();
      }, `Cannot ${action}:`);
    }

    function clearFilters() {
      for (const key of CRITERIA) filters[key] = '';
      queue.el.value = '';
      stateSelect.value = '';
      for (const input of [kind, idPrefix, tag, tenant, sequence, payload]) input.resetTo('');
      createdAfter.value = '';
      createdBefore.value = '';
      clearFieldErrors();
      changed();
    }

    const el = h('section', { id: 'view-jobs' },
      h('div', { class: 'view-head' },
        h('div', {},
          h('h1', { text: 'Jobs' }),
          h('p', { class: 'subtitle', text: 'Newest first. Search, select and act on many at once, or pick a job to see its payload and error history.' }))),
      h('div', { class: 'filters' },
        field('Queue', queue.el),
        field('State', stateSelect),
        checked.kind.el,
        checked.id_prefix.el,
        checked.tag.el,
        checked.tenant.el,
        checked.sequence.el,
        checked.created_after.el,
        checked.created_before.el,
        checked.payload.el,
        h('a', { class: 'filters-clear', href: '#/jobs', id: 'filters-clear', text: 'Clear filters', onclick: (event) => {
          event.preventDefault();
          clearFilters();
        } })),
      errors,
      actionError,
      h('div', { class: 'panel panel-flush' }, toolbar, list, paging.el));

    function render(page) {
      const jobs = page.jobs || [];
      update(list, JSON.stringify([page, paging.after]), () => {
        if (!jobs.length) {
          if (paging.after) return emptyState('No older jobs', 'This is past the last page.');
          return searching()
            ? emptyState('No jobs match this search', 'Try other criteria or clear the filters.')
            : emptyState('No jobs yet', 'Jobs show up here as soon as they are enqueued.');
        }
        const pageBox = h('input', { type: 'checkbox', class: 'page-check', 'aria-label': 'Select every job on this page', onchange: () => {
          if (pageBox.checked) for (const job of shown) selected.add(job.id);
          else {
            selected.clear();
            allMatching = null;
          }
          selectionChanged();
        } });
        return h('div', { class: 'table-wrap' }, h('table', { class: 'table table-rows' },
          jobHead([], h('th', { class: 'check' }, pageBox)),
          h('tbody', {}, jobs.map((job) => {
            const box = h('input', { type: 'checkbox', class: 'row-check', 'aria-label': `Select ${job.id}`, onchange: () => {
              if (allMatching) {
                // Leaving "everything matching": what stays selected is this page's rows.
                allMatching = null;
                for (const other of shown) selected.add(other.id);
              }
              if (box.checked) selected.add(job.id);
              else selected.delete(job.id);
              selectionChanged();
            } });
            return jobRow(job, [], h('td', { class: 'check' }, h('label', { class: 'check-hit' }, box)));
          }))));
      });
      syncSelection();
    }

    syncToolbar();
    return {
      el,
      async refresh() {
        queue.sync();
        const forced = force;
        force = false;
        // Paused (by hand or by a selection): the rows stay exactly as they are.
        if (live.paused && !forced && loaded) return;
        await ctx.guard(errors, async () => {
          let page;
          try {
            page = await api.jobs.list({ ...filters, limit: PAGE_SIZE, cursor: paging.after });
          } catch (error) {
            if (!fieldError(error)) throw error;
            shown = [];
            loaded = true;
            paging.show({}, 0);
            update(list, `invalid:${error.field}:${error.message}`, () => emptyState('The search has a mistake', 'Correct the highlighted field to see jobs again.'));
            syncToolbar();
            return;
          }
          // Something was selected while the page was on its way: keep the rows as they are.
          if (live.paused && !forced && loaded) return;
          clearFieldErrors();
          shown = page.jobs || [];
          loaded = true;
          paging.show(page, shown.length);
          render(page);
          syncToolbar();
        }, 'Cannot list jobs:');
      },
    };
  },
};
