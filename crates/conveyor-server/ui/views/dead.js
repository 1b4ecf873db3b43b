// The dead-letter queue: dead jobs with their last error, filtered by queue and kind, replayed
// or discarded one by one, by selection, or everything matching the filter — always after a
// confirmation. While jobs are selected (or when paused by hand) the list holds still.

import { h, update, jobLink, when, emptyState, routeHref, num, actionsHeader } from '../dom.js';
import * as api from '../api.js';
import { queueSelect, textFilter, field, pager, liveToggle, lastError, rowLinks } from './shared.js';

const PAGE_SIZE = 50;

export default {
  title: 'Dead letters',
  create(ctx, params) {
    const filters = { queue: params.get('queue') || '', kind: params.get('kind') || '' };
    const selected = new Set();
    let shown = [];
    let lastPage = null;
    // The next refresh loads the list even while it is paused (the user asked for new rows).
    let force = false;
    const errors = h('div', { class: 'slot-error' });
    const actionError = h('div', { class: 'slot-error' });
    const list = h('div', { id: 'dead-table' });
    const live = liveToggle('dead-live', () => ctx.refreshNow());
    const paging = pager(() => {
      selected.clear();
      selectionChanged();
      reload();
    });
    rowLinks(list);

    function reload() {
      force = true;
      ctx.refreshNow();
    }

    /** Any selection pauses the list; an empty one resumes it unless it was paused by hand. */
    function selectionChanged() {
      live.selection(selected.size);
    }

    const changed = () => {
      paging.reset();
      selected.clear();
      selectionChanged();
      list.dataset.key = '';
      ctx.replaceRoute(routeHref('/dead', filters));
      reload();
    };
    const queue = queueSelect(ctx, filters.queue, (value) => {
      filters.queue = value;
      changed();
    });
    const kind = textFilter({ id: 'filter-kind', name: 'kind', value: filters.kind, placeholder: 'e.g. email.send', onChange: (value) => {
      filters.kind = value;
      changed();
    } });

    const selectionLabel = h('span', { class: 'muted small', id: 'dead-selection' });
    const replaySelected = h('button', { class: 'btn btn-primary btn-small', type: 'button', id: 'dead-replay-selected', text: 'Replay selected', onclick: () => bulkReplay() });
    const discardSelected = h('button', { class: 'btn btn-danger-outline btn-small', type: 'button', id: 'dead-discard-selected', text: 'Discard selected', onclick: () => bulkDiscard() });
    const replayMatching = h('button', { class: 'btn btn-small', type: 'button', id: 'dead-replay-matching', onclick: () => replayMatchingFilter() });
    const toolbar = h('div', { class: 'toolbar' }, selectionLabel, replaySelected, discardSelected, h('span', { class: 'toolbar-gap' }), replayMatching, h('span', { class: 'toolbar-sep' }), live.el);

    function syncToolbar() {
      const canOperate = ctx.canOperate;
      selectionLabel.textContent = selected.size ? `${selected.size} selected` : 'Select jobs to act on several at once';
      replaySelected.disabled = !canOperate || selected.size === 0;
      discardSelected.disabled = !canOperate || selected.size === 0;
      const scope = filters.queue || filters.kind ? 'Replay all matching' : 'Replay all';
      replayMatching.textContent = scope;
      replayMatching.disabled = !canOperate || shown.length === 0;
      const hint = canOperate ? null : 'Needs the admin role';
      for (const button of [replaySelected, discardSelected, replayMatching]) {
        if (hint) button.title = hint;
        else button.removeAttribute('title');
      }
    }

    async function act(run, prefix) {
      await ctx.guard(actionError, async () => {
        try {
          await run();
        } finally {
          selectionChanged();
          force = true;
        }
        await ctx.refreshNow();
      }, prefix);
    }

    async function replayOne(job) {
      if (!await ctx.confirm({ title: 'Replay this job?', text: `${job.kind} (${job.id}) goes back to ${job.queue} with a fresh set of attempts.`, ok: 'Replay' })) return;
      await act(async () => {
        const answer = await api.dead.replay({ ids: [job.id] });
        selected.delete(job.id);
        ctx.notify(answer.replayed ? 'Job replayed.' : 'Nothing replayed: the job was no longer dead.');
      }, 'Cannot replay:');
    }

    async function discardOne(job) {
      if (!await ctx.confirm({ title: 'Discard this job for good?', text: `${job.kind} (${job.id}) and its history are deleted. This cannot be undone.`, ok: 'Discard', danger: true })) return;
      await act(async () => {
        await api.dead.discard(job.id);
        selected.delete(job.id);
        ctx.notify('Job discarded.');
      }, 'Cannot discard:');
    }

    async function bulkReplay() {
      const ids = [...selected];
      if (!ids.length) return;
      if (!await ctx.confirm({ title: `Replay ${ids.length} job${ids.length === 1 ? '' : 's'}?`, text: 'They go back to their queues with a fresh set of attempts; their error histories are kept.', ok: 'Replay' })) return;
      await act(async () => {
        const answer = await api.dead.replay({ ids });
        selected.clear();
        ctx.notify(`Replayed ${num(answer.replayed)} job${answer.replayed === 1 ? '' : 's'}.`);
      }, 'Cannot replay:');
    }

    async function bulkDiscard() {
      const ids = [...selected];
      if (!ids.length) return;
      if (!await ctx.confirm({ title: `Discard ${ids.length} job${ids.length === 1 ? '' : 's'} for good?`, text: 'Their payloads and error histories are deleted. This cannot be undone.', ok: 'Discard', danger: true })) return;
      await act(async () => {
        // The API discards one job per call; stop at the first failure so the message is exact.
        let done = 0;
        try {
          for (const id of ids) {
            try {
              await api.dead.discard(id);
            } catch (error) {
              if (error.status !== 404) throw error; // already gone: nothing to do
            }
            selected.delete(id);
            done += 1;
          }
        } finally {
          if (done) ctx.notify(`Discarded ${num(done)} job${done === 1 ? '' : 's'}.`);
        }
      }, 'Cannot discard:');
    }

    async function replayMatchingFilter() {
      const selector = {};
      if (filters.queue) selector.queue = filters.queue;
      if (filters.kind) selector.kind = filters.kind;
      const scoped = Object.keys(selector).length > 0;
      const what = scoped
        ? `every dead job${filters.kind ? ` of kind ${filters.kind}` : ''}${filters.queue ? ` in queue ${filters.queue}` : ''}`
        : 'every dead job in every queue';
      if (!await ctx.confirm({ title: 'Replay all matching?', text: `This replays ${what}, not only the ones on this page.`, ok: 'Replay all' })) return;
      await act(async () => {
        const answer = await api.dead.replay(scoped ? selector : { all: true });
        selected.clear();
        ctx.notify(`Replayed ${num(answer.replayed)} job${answer.replayed === 1 ? '' : 's'}.`);
      }, 'Cannot replay:');
    }

    const el = h('section', { id: 'view-dead' },
      h('div', { class: 'view-head' },
        h('div', {},
          h('h1', { text: 'Dead letters' }),
          h('p', { class: 'subtitle', text: 'Jobs that failed permanently or ran out of attempts. Replay them once the cause is fixed.' }))),
      h('div', { class: 'filters' }, field('Queue', queue.el), field('Kind', kind)),
      errors,
      actionError,
      h('div', { class: 'panel panel-flush' }, toolbar, list, paging.el));

    function render(page) {
      const canOperate = ctx.canOperate;
      const key = JSON.stringify([page, [...selected], canOperate]);
      update(list, key, () => {
        if (!shown.length) {
          return paging.after
            ? emptyState('No older dead jobs', 'This is past the last page.')
            : emptyState('The dead-letter queue is empty', filters.queue || filters.kind ? 'No dead job matches these filters.' : 'No job has died. Jobs land here after their last attempt fails.');
        }
        const all = shown.every((job) => selected.has(job.id));
        const toggleAll = h('input', { type: 'checkbox', 'aria-label': 'Select all on this page', checked: all, onchange: () => {
          for (const job of shown) {
            if (toggleAll.checked) selected.add(job.id);
            else selected.delete(job.id);
          }
          selectionChanged();
          render(page);
        } });
        return h('div', { class: 'table-wrap' }, h('table', { class: 'table table-rows' },
          h('thead', {}, h('tr', {},
            h('th', { class: 'check' }, toggleAll),
            ['Job', 'Kind', 'Queue'].map((t) => h('th', { text: t })),
            h('th', { class: 'num', text: 'Attempts' }),
            h('th', { text: 'Died' }),
            h('th', { text: 'Last error' }),
            actionsHeader())),
          h('tbody', {}, shown.map((job) => {
            const box = h('input', { type: 'checkbox', 'aria-label': `Select ${job.id}`, checked: selected.has(job.id), onchange: () => {
              if (box.checked) selected.add(job.id);
              else selected.delete(job.id);
              selectionChanged();
              render(page);
            } });
            return h('tr', { dataset: { job: job.id }, class: selected.has(job.id) ? 'selected' : null },
              h('td', { class: 'check' }, box),
              h('td', {}, jobLink(job.id)),
              h('td', { class: 'strong', text: job.kind }),
              h('td', { text: job.queue }),
              h('td', { class: 'num', text: `${job.attempt} / ${job.max_attempts}` }),
              h('td', {}, when(job.finished_at)),
              h('td', { class: 'cell-error' }, lastError(job)),
              h('td', { class: 'actions' },
                h('button', { class: 'btn btn-small', type: 'button', dataset: { action: 'replay' }, disabled: !canOperate, text: 'Replay', onclick: () => replayOne(job) }),
                h('button', { class: 'btn btn-small btn-danger-outline', type: 'button', dataset: { action: 'discard' }, disabled: !canOperate, text: 'Discard', onclick: () => discardOne(job) })));
          }))));
      });
      syncToolbar();
    }

    syncToolbar();
    return {
      el,
      async refresh() {
        queue.sync();
        const forced = force;
        force = false;
        // Paused (by hand or by a selection): the rows stay exactly as they are.
        if (live.paused && !forced && lastPage) return;
        await ctx.guard(errors, async () => {
          const page = await api.dead.list({ ...filters, limit: PAGE_SIZE, after: paging.after });
          // Something was selected while the page was on its way: keep the rows as they are.
          if (live.paused && !forced && lastPage) return;
          lastPage = page;
          shown = page.jobs || [];
          // Forget selections of jobs that left this page (replayed or discarded elsewhere).
          const ids = new Set(shown.map((job) => job.id));
          const before = selected.size;
          for (const id of [...selected]) if (!ids.has(id)) selected.delete(id);
          if (selected.size !== before) selectionChanged();
          paging.show(page, shown.length);
          render(page);
        }, 'Cannot list dead jobs:');
      },
    };
  },
};
