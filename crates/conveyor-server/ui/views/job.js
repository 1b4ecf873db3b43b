// One job: its state (live), details, payload and result as the API returns them (sensitive
// fields are redacted by the server, not here), and its attempts with the error history.
// Dead and expired jobs can be replayed (dead ones discarded), unfinished ones cancelled.

import { h, mount, update, stateBadge, when, localTime, prettyJson, emptyState, duration, routeHref } from '../dom.js';
import * as api from '../api.js';
import { limitHref } from './limits.js';

const UNFINISHED = ['scheduled', 'available', 'running', 'retryable'];

function detail(label, value) {
  return [h('dt', { text: label }), h('dd', {}, value === null || value === undefined || value === '' ? h('span', { class: 'muted', text: '—' }) : value)];
}

function jsonBlock(value, id) {
  return h('pre', { class: 'code', id, tabindex: '0' }, prettyJson(value));
}

/** `hosts`: worker id → host, from the worker registry (which keeps ended workers a day). */
function attempts(job, hosts = {}) {
  const errors = job.errors || [];
  // A replay marks the failure that ended the run (`replayed_at`); the attempts after it are
  // run 2, 3, ... counted from 1 again.
  const runs = errors.filter((e) => e.replayed_at).length;
  let run = 1;
  const items = [];
  errors.forEach((error) => {
    // Who ran the attempt, when it started and how long it took (stores record these since
    // they were added; older entries have only the time of the failure).
    const took = error.started_at ? Date.parse(error.at) - Date.parse(error.started_at) : null;
    const host = error.worker_id ? hosts[error.worker_id] : null;
    const where = [
      error.worker_id ? `on ${error.worker_id}` : null,
      host ? `host ${host}` : null,
      error.started_at ? `started ${localTime(error.started_at)}` : null,
      took !== null && took >= 0 ? `ran ${duration(took)}` : null,
    ].filter(Boolean).join(' · ');
    items.push(h('li', { class: 'timeline-item timeline-failed', dataset: { attempt: String(error.attempt), run: String(run) } },
      h('div', { class: 'timeline-head' },
        h('span', { class: 'strong', text: runs ? `Run ${run} · attempt ${error.attempt}` : `Attempt ${error.attempt}` }),
        h('span', { class: 'error-class', text: error.class }),
        h('span', { class: 'muted small' }, when(error.at))),
      where ? h('p', { class: 'muted small flush attempt-where', text: where }) : null,
      h('pre', { class: 'error-message', text: error.message }),
      error.backtrace
        ? h('details', { class: 'attempt-backtrace' },
          h('summary', { text: 'Backtrace' }),
          h('pre', { class: 'code small', text: error.backtrace }))
        : null));
    if (error.replayed_at) {
      run += 1;
      items.push(h('li', { class: 'timeline-item timeline-replay', dataset: { replay: String(run) } },
        h('div', { class: 'timeline-head' },
          h('span', { class: 'strong', text: `Replayed: run ${run} starts` }),
          h('span', { class: 'muted small' }, when(error.replayed_at)),
          h('span', { class: 'muted small', text: 'attempts counted from 1 again' }))));
    }
  });
  // The attempt in progress or the one that completed. A replay starts the attempts afresh but
  // keeps the history, so the number may repeat one of the failures above.
  const label = runs ? `Run ${run} · attempt ${job.attempt}` : `Attempt ${job.attempt}`;
  if (job.state === 'running') {
    items.push(h('li', { class: 'timeline-item timeline-running' },
      h('div', { class: 'timeline-head' },
        h('span', { class: 'strong', text: label }),
        stateBadge('running'),
        h('span', { class: 'muted small' }, 'started ', when(job.started_at),
          job.lease ? ` on ${job.lease.worker_id}, lease until ${localTime(job.lease.expires_at)}` : ''))));
  } else if (job.state === 'completed') {
    items.push(h('li', { class: 'timeline-item timeline-ok' },
      h('div', { class: 'timeline-head' },
        h('span', { class: 'strong', text: label }),
        stateBadge('completed'),
        h('span', { class: 'muted small' }, when(job.finished_at)))));
  }
  const summary = `${job.attempt} of ${job.max_attempts} attempts used · ${errors.length} error${errors.length === 1 ? '' : 's'} recorded`;
  return [
    h('p', { class: 'muted small flush', text: summary }),
    items.length
      ? h('ol', { class: 'timeline', id: 'job-attempts' }, items)
      : emptyState('No attempts yet', job.state === 'scheduled' ? 'The job waits for its run time.' : 'The job waits for a worker.'),
  ];
}

/** The limit keys a job holds (`per-customer:acme`), each linking to its limit's page. */
function limitKeys(keys) {
  if (!keys || !keys.length) return null;
  return h('span', { class: 'tags', id: 'job-limits' }, keys.map((key) => {
    const at = key.indexOf(':');
    const name = at < 0 ? key : key.slice(0, at);
    const value = at < 0 ? '' : key.slice(at + 1);
    return h('a', { class: 'tag mono', href: limitHref(name), title: value ? `limit ${name}, key ${value}` : `limit ${name} (no key)`, text: value ? `${name}: ${value}` : name });
  }));
}

/**
 * Why an available job waits (`blocked_by`): "Held back by limit per-customer, key acme:
 * 3/3 running" for each of its keys with no room now.
 */
function blockedNote(blocked) {
  if (!blocked || !blocked.length) return null;
  const waiting = blocked.find((b) => b.sequence);
  if (waiting) return sequenceNote(waiting);
  return h('div', { class: 'alert alert-info limit-blocked', id: 'job-blocked', role: 'status' },
    blocked.map((b) => {
      const figures = [];
      if (b.concurrency != null) figures.push(`${b.running}/${b.concurrency} running`);
      if (b.rate) figures.push(`${b.recent_starts}/${b.rate.count} started in ${duration(b.rate.period_ms)}`);
      if (!figures.length) figures.push(`${b.running} running`);
      return h('p', { dataset: { limit: b.limit, key: b.key } },
        'Held back by limit ', h('a', { href: limitHref(b.limit), text: b.limit }),
        b.key ? `, key ${b.key}` : '', `: ${figures.join(' · ')}`);
    }),
    h('p', { class: 'small', text: blocked.some((b) => b.rate && b.recent_starts >= b.rate.count)
      ? 'It starts once every key it holds has room again: when a running job under the limit ends, or older starts leave the rate\'s period.'
      : 'It starts once every key it holds has room again: when a running job under the limit ends.' }));
}

/** Where the jobs of sequence `key` are listed. */
function sequenceHref(key) {
  return routeHref('/jobs', { sequence: key });
}

/**
 * Why a blocked job waits: "Waits in sequence payload.account=acme (no. 4) behind job 0193…
 * (retryable, no. 3)", with links to that job and to the sequence's jobs.
 */
function sequenceNote(b) {
  return h('div', { class: 'alert alert-info sequence-blocked', id: 'job-blocked', role: 'status' },
    h('p', { dataset: { sequence: b.sequence } },
      'Waits in sequence ', h('a', { href: sequenceHref(b.sequence), class: 'mono', text: b.sequence }),
      ` (no. ${b.no})`,
      b.job ? [' behind job ', h('a', { href: `#/jobs/${encodeURIComponent(b.job)}`, class: 'mono', id: 'job-blocked-by', text: `${b.job.slice(0, 8)}…` }),
        ` (${b.state}${b.holder_no != null ? `, no. ${b.holder_no}` : ''})`] : ''),
    h('p', { class: 'small', text: 'It becomes available when every earlier job of its sequence has finished: completed, cancelled, expired, or discarded from the dead-letter queue.' }));
}

/** A shell word, single-quoted. */
function quoted(text) {
  return `'${String(text).replace(/'/g, `'\\''`)}'`;
}

/** The same job read again, enqueued again, from the CLI and with curl, to copy. */
function shellCommands(job) {
  const origin = window.location.origin;
  const enqueue = { kind: job.kind, queue: job.queue, payload: job.payload, priority: job.priority, max_attempts: job.max_attempts };
  if (job.tenant) enqueue.tenant = job.tenant;
  const lines = [
    ['Show it', `conveyor job show ${job.id} --server ${origin}`],
    ['Show it (curl)', `curl -s -H "Authorization: Bearer $CONVEYOR_TOKEN" ${origin}/v1/jobs/${job.id}`],
    ['Enqueue it again', `conveyor enqueue ${quoted(job.kind)} --queue ${quoted(job.queue)} --payload ${quoted(JSON.stringify(job.payload))} --server ${origin}`],
    ['Enqueue it again (curl)', `curl -s -X POST -H "Authorization: Bearer $CONVEYOR_TOKEN" -H 'Content-Type: application/json' ${origin}/v1/jobs -d ${quoted(JSON.stringify(enqueue))}`],
  ];
  return h('dl', { class: 'details shell-commands' }, lines.flatMap(([label, command]) => {
    const copy = h('button', { type: 'button', class: 'btn btn-small', text: 'Copy' });
    copy.addEventListener('click', async () => {
      try {
        await navigator.clipboard.writeText(command);
        copy.textContent = 'Copied';
      } catch {
        copy.textContent = 'Select and copy';
      }
    });
    return [h('dt', { text: label }), h('dd', {}, h('code', { class: 'mono small', text: command }), ' ', copy)];
  }));
}

export default {
  title: 'Job',
  create(ctx, _params, id) {
    const errors = h('div', { class: 'slot-error' });
    const actionError = h('div', { class: 'slot-error' });
    const body = h('div', { id: 'job-body' });
    const header = h('div', { class: 'view-head' });
    const el = h('section', { id: 'view-job', dataset: { job: id } }, header, errors, actionError, body);
    let missing = false;
    let job = null;

    async function act(run, failurePrefix) {
      await ctx.guard(actionError, async () => {
        await run();
        await ctx.refreshNow();
      }, failurePrefix);
    }

    async function replay() {
      const ok = await ctx.confirm({
        title: 'Replay this job?',
        text: `${job.kind} goes back to ${job.queue} as available, with a fresh set of ${job.max_attempts} attempts. Its error history is kept.`,
        ok: 'Replay',
      });
      if (!ok) return;
      await act(async () => {
        const answer = await api.dead.replay({ ids: [id] });
        ctx.notify(answer.replayed ? 'Job replayed: it is available again.' : 'Nothing replayed: the job was no longer dead.');
      }, 'Cannot replay:');
    }

    async function discard() {
      const ok = await ctx.confirm({
        title: 'Discard this job for good?',
        text: `${job.kind} and its payload and error history are deleted. This cannot be undone.`,
        ok: 'Discard',
        danger: true,
      });
      if (!ok) return;
      await ctx.guard(actionError, async () => {
        await api.dead.discard(id);
        ctx.notify('Job discarded.');
        location.hash = '#/dead';
      }, 'Cannot discard:');
    }

    async function cancel() {
      const ok = await ctx.confirm({
        title: 'Cancel this job?',
        text: job.state === 'running'
          ? 'Its worker loses the lease: its next heartbeat or completion is refused.'
          : 'It will not run.',
        ok: 'Cancel job',
        danger: true,
      });
      if (!ok) return;
      await act(async () => {
        await api.jobs.cancel(id);
        ctx.notify('Job cancelled.');
      }, 'Cannot cancel:');
    }

    function renderHeader() {
      const canOperate = ctx.canOperate;
      const buttons = [];
      const hint = canOperate ? null : 'Needs the admin role';
      if (job.state === 'dead' || job.state === 'expired') {
        buttons.push(h('button', { class: 'btn btn-primary', type: 'button', id: 'job-replay', text: 'Replay', disabled: !canOperate, title: hint, onclick: replay }));
        if (job.state === 'dead') {
          buttons.push(h('button', { class: 'btn btn-danger-outline', type: 'button', id: 'job-discard', text: 'Discard', disabled: !canOperate, title: hint, onclick: discard }));
        }
      } else if (UNFINISHED.includes(job.state)) {
        buttons.push(h('button', { class: 'btn btn-danger-outline', type: 'button', id: 'job-cancel', text: 'Cancel job', disabled: !canOperate, title: hint, onclick: cancel }));
      }
      update(header, JSON.stringify([job.state, job.kind, job.queue, canOperate]), () => [
        h('div', {},
          h('p', { class: 'crumbs' },
            h('a', { href: '#/jobs', text: 'Jobs' }), ' / ',
            h('a', { href: routeHref('/jobs', { queue: job.queue }), text: job.queue })),
          h('h1', { class: 'job-title' }, h('span', { text: job.kind }), h('span', { id: 'job-state' }, stateBadge(job.state))),
          h('p', { class: 'subtitle mono', text: job.id })),
        h('div', { class: 'view-actions' }, buttons),
      ]);
    }

    // Each attempt's host, looked up in the registry by the worker id the attempt recorded;
    // asked again only for an id not seen yet, at most every 30 s (not for roles that may not
    // read the registry, nor on a server without one).
    let hosts = {};
    let hostsAskedAt = 0;
    let hostsAvailable = true;
    async function loadHosts() {
      const wanted = (job.errors || []).map((e) => e.worker_id).filter((w) => w && !(w in hosts));
      if (!hostsAvailable || !wanted.length || Date.now() - hostsAskedAt < 30000) return;
      hostsAskedAt = Date.now();
      try {
        const answer = await api.workers.list();
        const next = { ...hosts };
        for (const worker of answer.workers || []) if (worker.host) next[worker.id] = worker.host;
        hosts = next;
      } catch (error) {
        if (error.status === 403 || api.notAvailable(error)) hostsAvailable = false;
      }
    }

    function renderBody() {
      const started = job.started_at ? Date.parse(job.started_at) : null;
      const finished = job.finished_at ? Date.parse(job.finished_at) : null;
      update(body, JSON.stringify([job, hosts]), () => [blockedNote(job.blocked_by), h('div', { class: 'job-grid' },
        h('div', { class: 'panel' },
          h('h2', { text: 'Details' }),
          h('dl', { class: 'details' },
            detail('State', stateBadge(job.state)),
            detail('Queue', h('a', { href: routeHref('/jobs', { queue: job.queue }), text: job.queue })),
            detail('Kind', job.kind),
            detail('Priority', String(job.priority)),
            detail('Attempts', `${job.attempt} of ${job.max_attempts}`),
            job.progress ? detail('Progress', h('span', { id: 'job-progress' },
              h('progress', { max: '100', value: String(job.progress.percent) }),
              ` ${job.progress.percent}%${job.progress.message ? ` · ${job.progress.message}` : ''}`)) : null,
            job.flow ? detail('Flow', h('span', {},
              h('a', { href: `#/flows/${encodeURIComponent(job.flow.flow_id)}`, class: 'mono', text: `${job.flow.flow_id.slice(0, 8)}…` }),
              ` · step ${job.flow.step}`)) : null,
            detail('Created', h('span', {}, when(job.created_at), h('span', { class: 'muted small', text: ` · ${localTime(job.created_at)}` }))),
            detail('Run at', when(job.run_at)),
            detail('Started', job.started_at ? when(job.started_at) : null),
            detail('Finished', job.finished_at ? when(job.finished_at) : null),
            detail('Took', started && finished && finished >= started ? duration(finished - started) : null),
            detail('Timeout', job.timeout_ms ? duration(job.timeout_ms) : null),
            detail('Tenant', job.tenant),
            job.sequence ? detail('Sequence', h('span', { id: 'job-sequence' },
              h('a', { href: sequenceHref(job.sequence.key), class: 'mono', text: job.sequence.key }),
              ` · no. ${job.sequence.no}${job.sequence.on_dead === 'skip' ? ' · dead jobs skipped' : ''}`)) : null,
            job.limit_keys && job.limit_keys.length ? detail('Limits', limitKeys(job.limit_keys)) : null,
            job.expires_at ? detail('Expires', localTime(job.expires_at)) : null,
            job.trace ? detail('Trace', job.trace.traceparent.split('-')[1]) : null,
            detail('Tags', job.tags && job.tags.length ? h('span', { class: 'tags' }, job.tags.map((t) => h('span', { class: 'tag', text: t }))) : null),
            detail('Idempotency key', job.idempotency_key ? h('span', { class: 'mono small', text: job.idempotency_key }) : null),
            job.unique_key ? detail('Unique key', h('span', { class: 'mono small', title: job.unique_key, text: `${job.unique_key.slice(0, 16)}…` })) : null,
            job.lease ? detail('Lease', `${job.lease.worker_id}, until ${localTime(job.lease.expires_at)}`) : null)),
        h('div', { class: 'stack' },
          h('div', { class: 'panel' }, h('h2', { text: 'Payload' }), jsonBlock(job.payload, 'job-payload')),
          job.result !== null && job.result !== undefined
            ? h('div', { class: 'panel' }, h('h2', { text: 'Result' }), jsonBlock(job.result, 'job-result'))
            : null,
          h('div', { class: 'panel' }, h('h2', { text: 'Attempts and errors' }), attempts(job, hosts)),
          h('div', { class: 'panel' }, h('h2', { text: 'From the shell' }), shellCommands(job))))]);
    }

    return {
      el,
      get title() { return `Job ${id.slice(0, 8)}`; },
      async refresh() {
        if (missing) return;
        await ctx.guard(errors, async () => {
          try {
            job = await api.jobs.get(id);
          } catch (error) {
            if (error.status === 404 || (error.status === 400 && error.field === 'id')) {
              missing = true;
              mount(header, h('div', {}, h('h1', { text: 'Job not found' })));
              mount(body, emptyState(
                error.status === 404 ? 'No job has this id' : 'This is not a job id',
                h('span', {}, 'It may have been discarded from the dead-letter queue. ',
                  h('a', { href: '#/jobs', text: 'Back to the jobs' }))));
              return;
            }
            throw error;
          }
          await loadHosts();
          renderHeader();
          renderBody();
        }, 'Cannot load the job:');
      },
    };
  },
};
