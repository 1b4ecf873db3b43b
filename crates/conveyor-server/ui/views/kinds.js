// Kinds: every job kind that had work in the chosen span, per queue, with its throughput,
// failure rate, run time and queue wait (p50/p95), from the store's history (`GET /v1/stats`),
// and how a kind's jobs go out when it is handled in batches (`GET /v1/kinds`).

import { h, update, num, emptyState, routeHref } from '../dom.js';
import * as api from '../api.js';
import { rangePicker, rangeOf, savedRange, saveRange, statsLoader, latencyText, rateText, perMinuteText } from './history.js';

const RANGE_KEY = 'conveyor.kinds.range';

/** A kind's batch setting in a cell: `≤ 100 · 2 s · payload.account`, or a dash. */
function batchText(batch) {
  if (!batch) return '—';
  const parts = [`≤ ${num(batch.max_size)}`];
  if (batch.max_wait_ms) parts.push(latencyText(batch.max_wait_ms));
  if (batch.key) parts.push(batch.key);
  return parts.join(' · ');
}

export default {
  title: 'Kinds',
  create(ctx) {
    const errors = h('div', { class: 'slot-error' });
    const picker = h('div', { id: 'kinds-range' });
    const summary = h('p', { class: 'muted small panel-note', id: 'kinds-summary' });
    const table = h('div', { id: 'kinds-table' });
    const loader = statsLoader();
    // Batch settings by kind; a store that cannot say leaves the column blank, not the view.
    let batches = new Map();
    async function loadSettings() {
      try {
        const answer = await api.kinds.list();
        batches = new Map(answer.kinds.filter((k) => k.batch).map((k) => [k.kind, k.batch]));
      } catch {
        batches = new Map();
      }
    }
    let range = savedRange(RANGE_KEY, '24h');
    const el = h('section', { id: 'view-kinds' },
      h('div', { class: 'view-head' },
        h('div', {},
          h('h1', { text: 'Kinds' }),
          h('p', { class: 'subtitle', text: 'How each kind of job fares: throughput, failures, run time and time waiting to start.' })),
        picker),
      errors,
      h('div', { class: 'panel panel-flush' }, summary, table));

    function render() {
      const chosen = rangeOf(range);
      update(picker, range, () => rangePicker(range, (id) => {
        range = id;
        saveRange(RANGE_KEY, id);
        render();
        loader.load(range).then(render);
      }));
      if (loader.error) {
        update(errors, `e:${loader.error.status}:${loader.error.message}`, () => ctx.problem(loader.error, 'Cannot read the history:'));
      } else {
        update(errors, 'ok', () => []);
      }
      const report = loader.report;
      if (!report) return;
      const kinds = [...report.kinds].sort((a, b) => (b.completed + b.failed) - (a.completed + a.failed)
        || a.kind.localeCompare(b.kind) || a.queue.localeCompare(b.queue));
      summary.textContent = `Last ${chosen.label}: ${num(report.totals.completed)} completed, ${num(report.totals.failed)} failed attempts, `
        + `${num(report.totals.dead)} died, failure rate ${rateText(report.totals.failure_rate)}.`;
      update(table, JSON.stringify([range, kinds, [...batches]]), () => {
        if (!kinds.length) {
          return emptyState(`No jobs in the last ${chosen.label}`,
            h('span', {}, 'Kinds appear here once their jobs are enqueued, started or finished through this server.'));
        }
        return h('div', { class: 'table-wrap' }, h('table', { class: 'table kinds-table' },
          h('thead', {}, h('tr', {},
            h('th', { text: 'Kind' }),
            h('th', { text: 'Queue' }),
            h('th', { class: 'num', text: 'Throughput' }),
            h('th', { class: 'num', text: 'Enqueued' }),
            h('th', { class: 'num', text: 'Completed' }),
            h('th', { class: 'num', text: 'Failed' }),
            h('th', { class: 'num', text: 'Failure rate' }),
            h('th', { class: 'num', text: 'Died' }),
            h('th', { class: 'num', text: 'Run p50' }),
            h('th', { class: 'num', text: 'Run p95' }),
            h('th', { class: 'num', text: 'Wait p50' }),
            h('th', { class: 'num', text: 'Wait p95' }),
            h('th', { text: 'Batches', title: 'Handled in batches: at most this many, waiting up to this long, one key per batch' }))),
          h('tbody', {}, kinds.map((k) => h('tr', { dataset: { kind: k.kind, queue: k.queue } },
            h('td', {}, h('a', { class: 'strong', href: routeHref('/jobs', { kind: k.kind }), text: k.kind })),
            h('td', {}, h('a', { href: routeHref('/jobs', { queue: k.queue }), text: k.queue })),
            h('td', { class: 'num', dataset: { col: 'throughput' }, text: perMinuteText(k.throughput_per_min) }),
            h('td', { class: 'num', text: num(k.enqueued) }),
            h('td', { class: 'num', dataset: { col: 'completed' }, text: num(k.completed) }),
            h('td', { class: 'num', dataset: { col: 'failed' }, text: num(k.failed) }),
            h('td', { class: `num${k.failure_rate > 0.1 ? ' warn' : ''}`, dataset: { col: 'failure-rate' }, text: rateText(k.failure_rate) }),
            h('td', { class: 'num', text: num(k.dead) }),
            h('td', { class: 'num', dataset: { col: 'run-p50' }, text: k.run_time ? latencyText(k.run_time.p50_ms) : '—' }),
            h('td', { class: 'num', dataset: { col: 'run-p95' }, text: k.run_time ? latencyText(k.run_time.p95_ms) : '—' }),
            h('td', { class: 'num', dataset: { col: 'wait-p50' }, text: k.queue_wait ? latencyText(k.queue_wait.p50_ms) : '—' }),
            h('td', { class: 'num', dataset: { col: 'wait-p95' }, text: k.queue_wait ? latencyText(k.queue_wait.p95_ms) : '—' }),
            h('td', { dataset: { col: 'batch' }, text: batchText(batches.get(k.kind)) }))))));
      });
    }

    return {
      el,
      async refresh() {
        await Promise.all([loader.load(range), loadSettings()]);
        render();
      },
    };
  },
};
