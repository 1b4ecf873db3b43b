// Workers: the server's worker registry (`GET /v1/workers`) and stuck jobs
// (`GET /v1/jobs/stuck`) where the server has them, and, on any server, who holds leases now
// (running jobs grouped by the lease's worker id).

import { h, mount, update, when, num, duration, emptyState, jobLink, actionsHeader } from '../dom.js';
import * as api from '../api.js';
import { rowLinks } from './shared.js';

// Columns first when present; other fields follow in the order the server sends them.
const PREFERRED = ['id', 'worker_id', 'name', 'state', 'command', 'status', 'host', 'hostname', 'pid', 'queues',
  'busy', 'running', 'active', 'concurrency', 'jobs', 'last_seen_at', 'last_heartbeat_at', 'started_at', 'version'];

const ISO_TIME = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}/;

function title(key) {
  const text = key.replace(/_at$/, '').replace(/_ms$/, '').replace(/_/g, ' ');
  return text[0].toUpperCase() + text.slice(1);
}

function cell(key, value) {
  if (value === null || value === undefined) return h('span', { class: 'muted', text: '—' });
  if (key === 'command' && typeof value === 'string') {
    return h('span', { class: 'badge badge-paused', title: value === 'quiet' ? 'Gets no jobs; finishes those it holds' : 'Gets no jobs; exits once drained', text: value });
  }
  if ((key === 'state' || key === 'status') && typeof value === 'string') {
    return h('span', { class: `badge worker-${value}`, text: value });
  }
  if (key === 'id' || key === 'worker_id') return h('span', { class: 'strong mono', text: String(value) });
  if (typeof value === 'string' && ISO_TIME.test(value)) return when(value);
  if (typeof value === 'number') return key.endsWith('_ms') ? duration(value) : num(value);
  if (typeof value === 'boolean') return value ? 'yes' : 'no';
  if (Array.isArray(value)) {
    if (value.every((v) => typeof v !== 'object')) return value.join(', ');
    return h('span', { class: 'mono small', text: JSON.stringify(value) });
  }
  if (typeof value === 'object') return h('span', { class: 'mono small', text: JSON.stringify(value) });
  return String(value);
}

/**
 * A table of whatever records the server answers, so a newer server's fields just show up;
 * `actions(record)`, when given, fills a last column of buttons.
 */
function recordTable(records, id, actions) {
  const keys = [];
  for (const key of PREFERRED) if (records.some((r) => key in r)) keys.push(key);
  for (const record of records) for (const key of Object.keys(record)) if (!keys.includes(key)) keys.push(key);
  return h('div', { class: 'table-wrap' }, h('table', { class: 'table', id },
    h('thead', {}, h('tr', {}, keys.map((key) => h('th', { text: title(key) })),
      actions ? actionsHeader() : null)),
    h('tbody', {}, records.map((record) => h('tr', { dataset: { worker: record.id || record.worker_id || '' } },
      keys.map((key) => h('td', {}, cell(key, record[key]))),
      actions ? h('td', { class: 'actions' }, actions(record)) : null)))));
}

/** The first array in an answer such as `{"workers": [...]}`. */
function records(answer, name) {
  if (Array.isArray(answer)) return answer;
  if (answer && Array.isArray(answer[name])) return answer[name];
  const first = answer && Object.values(answer).find(Array.isArray);
  return first || [];
}

/** Stuck jobs: running longer than their threshold (a fixed one, or the kind's usual p95). */
function stuckTable(list) {
  return h('div', { class: 'table-wrap' }, h('table', { class: 'table table-rows', id: 'stuck-table' },
    h('thead', {}, h('tr', {},
      ['Job', 'Kind', 'Queue', 'Worker'].map((t) => h('th', { text: t })),
      h('th', { class: 'num', text: 'Attempt' }),
      h('th', { class: 'num', text: 'Running for' }),
      h('th', { class: 'num', text: 'Threshold' }),
      h('th', { text: 'Started' }))),
    h('tbody', {}, list.map((job) => h('tr', { dataset: { job: job.id } },
      h('td', {}, jobLink(job.id)),
      h('td', { class: 'strong', text: job.kind }),
      h('td', { text: job.queue }),
      h('td', { class: 'mono small', text: job.worker_id || '—' }),
      h('td', { class: 'num', text: num(job.attempt) }),
      h('td', { class: 'num warn', text: duration(job.running_ms) }),
      h('td', { class: 'num', title: job.typical_ms ? `usually ${duration(job.typical_ms)} (p95)` : null },
        duration(job.threshold_ms), job.basis ? h('span', { class: 'muted small', text: ` (${String(job.basis).replace(/_/g, ' ')})` }) : null),
      h('td', {}, when(job.started_at)))))));
}

function notAvailable(what, detail) {
  return h('div', { class: 'empty empty-na', dataset: { available: 'false' } },
    h('p', { class: 'empty-title', text: `${what}: not available` }),
    h('p', { class: 'empty-detail', text: detail }));
}

export default {
  title: 'Workers',
  create(ctx) {
    const registry = h('div', { id: 'workers-registry' });
    const leases = h('div', { id: 'workers-leases' });
    const stuck = h('div', { id: 'workers-stuck' });
    rowLinks(stuck);
    const registryError = h('div', { class: 'slot-error' });
    const leasesError = h('div', { class: 'slot-error' });
    const stuckError = h('div', { class: 'slot-error' });
    const el = h('section', { id: 'view-workers' },
      h('div', { class: 'view-head' },
        h('div', {},
          h('h1', { text: 'Workers' }),
          h('p', { class: 'subtitle', text: 'Who is connected, what they are running, and jobs that look stuck.' }))),
      h('div', { class: 'panel' }, h('h2', { text: 'Registered workers' }), registryError, registry),
      h('div', { class: 'panel' }, h('h2', { text: 'Leases held now' }),
        h('p', { class: 'muted small', text: 'Running jobs grouped by the worker holding their lease.' }), leasesError, leases),
      h('div', { class: 'panel' }, h('h2', { text: 'Stuck jobs' }), stuckError, stuck));

    async function command(worker, action) {
      if (action === 'stop') {
        const asked = await ctx.confirm({
          title: `Stop the worker ${worker.id}?`,
          text: 'It gets no more jobs and exits once the jobs it holds are done (the Rust worker and conveyor work exit; other HTTP workers stay quiet).',
          ok: 'Stop worker',
          danger: true,
        });
        if (!asked) return;
      }
      const done = {
        quiet: `Worker ${worker.id} told to quiet: it gets no more jobs.`,
        stop: `Worker ${worker.id} told to stop: it exits once drained.`,
        resume: `Worker ${worker.id} resumed: it gets jobs again.`,
      };
      await ctx.guard(registryError, async () => {
        await api.workers.command(worker.id, action);
        ctx.notify(done[action]);
        await loadRegistry();
      }, `Cannot ${action} the worker ${worker.id}:`);
    }

    /** Quiet, stop and resume for live workers (admins only). */
    function workerActions(worker) {
      if (worker.state !== 'alive') return null;
      const canOperate = ctx.canOperate;
      const button = (action, label, extra = '') => h('button', {
        class: `btn btn-small${extra}`, type: 'button',
        dataset: { action: `worker-${action}` },
        disabled: !canOperate,
        title: canOperate ? null : 'Needs the admin role',
        text: label,
        onclick: () => command(worker, action),
      });
      return [
        worker.command ? button('resume', 'Resume') : button('quiet', 'Quiet'),
        worker.command === 'stop' ? null : button('stop', 'Stop', ' btn-danger-outline'),
      ];
    }

    async function loadRegistry() {
      await ctx.guard(registryError, async () => {
        let answer;
        try {
          answer = await api.workers.list();
        } catch (error) {
          if (!api.notAvailable(error)) throw error;
          update(registry, 'na', () => notAvailable('Worker registry', 'This server does not report workers (GET /v1/workers). Leases below show who is running jobs.'));
          return;
        }
        const list = records(answer, 'workers');
        update(registry, JSON.stringify([list, ctx.canOperate]), () => (list.length
          ? recordTable(list, 'workers-table', workerActions)
          : emptyState('No workers connected', h('span', {}, 'Start one with ', h('code', { text: 'conveyor work --exec CMD' }), '.'))));
      }, 'Cannot list workers:');
    }

    async function loadLeases() {
      await ctx.guard(leasesError, async () => {
        const page = await api.jobs.list({ state: 'running', limit: 500 });
        const byWorker = new Map();
        for (const job of page.jobs || []) {
          const worker = job.lease ? job.lease.worker_id : '(unknown)';
          const entry = byWorker.get(worker) || { worker, jobs: [], queues: new Set(), kinds: new Set(), oldest: null, expires: null };
          entry.jobs.push(job);
          entry.queues.add(job.queue);
          entry.kinds.add(job.kind);
          if (job.started_at && (!entry.oldest || job.started_at < entry.oldest)) entry.oldest = job.started_at;
          if (job.lease && (!entry.expires || job.lease.expires_at < entry.expires)) entry.expires = job.lease.expires_at;
          byWorker.set(worker, entry);
        }
        const rows = [...byWorker.values()].sort((a, b) => b.jobs.length - a.jobs.length || a.worker.localeCompare(b.worker));
        const key = JSON.stringify(rows.map((r) => [r.worker, r.jobs.map((j) => j.id), r.oldest, r.expires]));
        update(leases, key, () => (rows.length
          ? h('div', { class: 'table-wrap' }, h('table', { class: 'table', id: 'leases-table' },
            h('thead', {}, h('tr', {},
              h('th', { text: 'Worker' }), h('th', { class: 'num', text: 'Running' }), h('th', { text: 'Queues' }),
              h('th', { text: 'Kinds' }), h('th', { text: 'Longest running since' }), h('th', { text: 'Next lease expiry' }), h('th', { text: 'Jobs' }))),
            h('tbody', {}, rows.map((row) => h('tr', { dataset: { worker: row.worker } },
              h('td', { class: 'strong mono', text: row.worker }),
              h('td', { class: 'num', text: num(row.jobs.length) }),
              h('td', { text: [...row.queues].sort().join(', ') }),
              h('td', { text: [...row.kinds].sort().join(', ') }),
              h('td', {}, when(row.oldest)),
              h('td', {}, when(row.expires)),
              h('td', { class: 'job-links' }, row.jobs.slice(0, 3).map((job) => jobLink(job.id)),
                row.jobs.length > 3 ? h('span', { class: 'muted small', text: ` +${row.jobs.length - 3}` }) : null))))))
          : emptyState('No job is running', 'Idle workers hold no lease.')));
      }, 'Cannot list running jobs:');
    }

    async function loadStuck() {
      await ctx.guard(stuckError, async () => {
        let answer;
        try {
          answer = await api.workers.stuck();
        } catch (error) {
          if (!api.notAvailable(error)) throw error;
          update(stuck, 'na', () => notAvailable('Stuck-job detection', 'This server does not report stuck jobs (GET /v1/jobs/stuck).'));
          return;
        }
        const list = records(answer, 'jobs');
        update(stuck, JSON.stringify(list), () => {
          if (!list.length) return emptyState('Nothing looks stuck', 'Every running job is heartbeating within its lease.');
          if (list.every((item) => item && item.id && typeof item.running_ms === 'number')) return stuckTable(list);
          return recordTable(list, 'stuck-table');
        });
      }, 'Cannot list stuck jobs:');
    }

    mount(registry, h('p', { class: 'muted small', text: 'Loading…' }));
    return {
      el,
      async refresh() {
        await Promise.all([loadRegistry(), loadLeases(), loadStuck()]);
      },
    };
  },
};
