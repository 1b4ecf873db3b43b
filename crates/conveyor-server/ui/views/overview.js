// Overview: totals per state, throughput, failure and run-time charts, one row per queue with
// its counts, oldest waiting job, circuit breaker and pause/resume, and the circuit breakers
// with open/close. Counts come from `GET /v1/queues`, which the shell polls every second. The
// charts show the store's history (`GET /v1/stats`) over 1 h, 24 h or 7 d from the first load;
// "Live" draws per-second rates from differences between successive `/v1/queues` answers
// instead, for the minutes this page has been open.

import { h, mount, update, num, duration, emptyState, routeHref, when, localTime, actionsHeader } from '../dom.js';
import { lineChart } from '../charts.js';
import * as api from '../api.js';
import { limitHref } from './limits.js';
import { rangePicker, rangeOf, savedRange, saveRange, statsLoader, latencyText, rateText, perMinuteText } from './history.js';

const LIVE = { id: 'live', label: 'Live' };
const RANGE_KEY = 'conveyor.overview.range';

const CARD_STATES = [
  ['available', 'Available', 'waiting for a worker'],
  ['running', 'Running', 'leased by a worker'],
  ['scheduled', 'Scheduled', 'due later'],
  ['retryable', 'Retryable', 'failed, will retry'],
  ['dead', 'Dead', 'out of attempts'],
  ['completed', 'Completed', 'finished'],
];
const TABLE_STATES = ['available', 'running', 'scheduled', 'retryable', 'dead', 'completed', 'cancelled', 'expired', 'blocked'];
const RATE_WINDOW_MS = 60 * 1000;

/** Per-second rates of `pick(sample)` between successive samples; drops (replays, purges) count as 0. */
function rates(history, pick) {
  const points = [];
  for (let i = 1; i < history.length; i += 1) {
    const dt = (history[i].t - history[i - 1].t) / 1000;
    if (dt <= 0) continue;
    const delta = pick(history[i]) - pick(history[i - 1]);
    points.push({ t: history[i].t, v: Math.max(0, delta) / dt });
  }
  return points;
}

/** How much `pick` grew over the last `windowMs` (only increases count). */
function growth(history, pick, windowMs, now) {
  let total = 0;
  for (let i = 1; i < history.length; i += 1) {
    if (history[i].t < now - windowMs) continue;
    total += Math.max(0, pick(history[i]) - pick(history[i - 1]));
  }
  return total;
}

/** "14:03:20" today-ish, the full date and time further away. */
function clockTime(iso) {
  const t = new Date(iso);
  if (Number.isNaN(t.getTime())) return String(iso);
  return Math.abs(t.getTime() - Date.now()) < 12 * 3600 * 1000 ? t.toLocaleTimeString() : localTime(iso);
}

/** When a breaker opens, from its settings: "opens at ≥ 50 % failed of ≥ 10 attempts in 1 m". */
function breakerRule(settings) {
  if (!settings) return 'no settings: opened by hand';
  const ratio = Math.round(settings.failure_ratio * 1000) / 10;
  return `opens at ≥ ${ratio} % failed of ≥ ${num(settings.min_calls)} attempts in ${duration(settings.window_ms)}, `
    + `stays open ${duration(settings.open_ms)}, then ${num(settings.half_open_calls)} probe${settings.half_open_calls === 1 ? '' : 's'}`;
}

/** A breaker's state in words, for tooltips: until when, probes, why. */
function breakerDetail(breaker) {
  const parts = [];
  if (breaker.state === 'open') {
    parts.push(breaker.open_until ? `open until ${localTime(breaker.open_until)}, then probing` : 'open until closed by hand');
  } else if (breaker.state === 'half_open') {
    const wanted = breaker.settings ? breaker.settings.half_open_calls : 1;
    parts.push(`probing: ${num(breaker.probe_successes)} of ${num(wanted)} probe${wanted === 1 ? '' : 's'} succeeded`);
  }
  if (breaker.manual && breaker.state !== 'closed') parts.push('by hand');
  if (breaker.reason) parts.push(`reason: ${breaker.reason}`);
  if (breaker.state === 'closed') parts.push(breakerRule(breaker.settings));
  return parts.join(' · ');
}

/** Red "circuit open", amber "probing", or a faint "breaker" for a closed, configured one. */
function breakerBadge(breaker) {
  const title = breakerDetail(breaker) || null;
  const dataset = { breaker: breaker.state };
  if (breaker.state === 'open') return h('span', { class: 'badge badge-circuit-open', title, dataset, text: 'circuit open' });
  if (breaker.state === 'half_open') return h('span', { class: 'badge badge-circuit-probing', title, dataset, text: 'probing' });
  return h('span', { class: 'badge badge-none', title, dataset, text: 'breaker' });
}

/** Under an open breaker's badge: until when, and why. */
function breakerNote(breaker) {
  if (breaker.state !== 'open') return null;
  const until = breaker.open_until
    ? h('span', { title: localTime(breaker.open_until), text: `until ${clockTime(breaker.open_until)}` })
    : 'until closed';
  return h('div', { class: 'breaker-note muted small', title: breaker.reason || null },
    until, breaker.reason ? ` · ${breaker.reason}` : null);
}

function perSecond(value) {
  if (value >= 100) return `${Math.round(value)}/s`;
  if (value >= 10) return `${value.toFixed(1)}/s`;
  return `${value.toFixed(value > 0 && value < 1 ? 2 : 1)}/s`;
}

export default {
  title: 'Overview',
  create(ctx) {
    const errors = h('div', { class: 'slot-error' });
    const cards = h('div', { class: 'cards', id: 'overview-cards' });
    const throughputHead = h('div', { class: 'panel-figure' });
    const failureHead = h('div', { class: 'panel-figure' });
    const failureLabel = h('p', { class: 'muted small' });
    const throughput = h('div', { class: 'chart-slot', id: 'chart-throughput' });
    const failures = h('div', { class: 'chart-slot', id: 'chart-failures' });
    const runTimeHead = h('div', { class: 'panel-figure' });
    const runTime = h('div', { class: 'chart-slot', id: 'chart-run-time' });
    const throughputLabel = h('p', { class: 'muted small' });
    const runTimeLabel = h('p', { class: 'muted small' });
    const picker = h('div', { id: 'overview-range' });
    const historyError = h('div', { class: 'slot-error' });
    const loader = statsLoader();
    let range = savedRange(RANGE_KEY, '1h', [LIVE]);
    const table = h('div', { id: 'queues-table' });
    const actionError = h('div', { class: 'slot-error' });
    const breakerTable = h('div', { id: 'breakers-table' });
    const breakerError = h('div', { class: 'slot-error' });
    const el = h('section', { id: 'view-overview' },
      h('div', { class: 'view-head' },
        h('div', {},
          h('h1', { text: 'Overview' }),
          h('p', { class: 'subtitle', text: 'Live counts of every queue, refreshed every second; history kept by the server.' })),
        picker),
      errors,
      cards,
      historyError,
      h('div', { class: 'charts' },
        h('div', { class: 'panel' },
          h('div', { class: 'panel-head' },
            h('div', {}, h('h2', { text: 'Throughput' }), throughputLabel),
            throughputHead),
          throughput),
        h('div', { class: 'panel' },
          h('div', { class: 'panel-head' },
            h('div', {}, h('h2', { text: 'Failures' }), failureLabel),
            failureHead),
          failures),
        h('div', { class: 'panel' },
          h('div', { class: 'panel-head' },
            h('div', {}, h('h2', { text: 'Run time' }), runTimeLabel),
            runTimeHead),
          runTime)),
      h('div', { class: 'panel' },
        h('div', { class: 'panel-head' }, h('h2', { text: 'Queues' })),
        actionError,
        table),
      h('div', { class: 'panel', id: 'breakers-panel' },
        h('div', { class: 'panel-head' },
          h('div', {},
            h('h2', { text: 'Circuit breakers' }),
            h('p', { class: 'muted small', text: 'While a breaker is open, no job of its queue or kind is handed out; the jobs stay queued and enqueues go on.' }))),
        breakerError,
        breakerTable));

    // The queue settings editor: opened from a row's "Settings", filled from
    // `GET /v1/queues/{name}`, saved as one partial `PUT` (an empty box clears the limit).
    const settingsPanel = h('div', { class: 'panel', id: 'queue-settings', hidden: true });
    el.insertBefore(settingsPanel, el.querySelector('#breakers-panel'));
    let editing = null;

    const NUMBER_FIELDS = [
      ['concurrency_limit', 'Concurrency limit', 'Jobs of this queue running at once, across all workers'],
      ['per_key_concurrency_limit', 'Per-key concurrency', 'Running at once per concurrency key'],
      ['max_depth', 'Max depth', 'Waiting jobs beyond which enqueues are refused'],
      ['max_depth_per_tenant', 'Max depth per tenant', 'The same, per tenant'],
      ['weight', 'Weight', 'Share of fetches when a worker serves several queues'],
      ['default_ttl_ms', 'Default TTL (ms)', 'Jobs without their own expiry expire this long after they could start'],
    ];
    const RATE_FIELDS = [
      ['rate_limit', 'Rate limit', 'Jobs started per period'],
      ['per_key_rate_limit', 'Per-key rate limit', 'Jobs started per period and rate key'],
    ];

    function numberInput(id, value, disabled) {
      return h('input', {
        id, name: id, type: 'number', min: '0', step: '1', inputmode: 'numeric', placeholder: 'no limit',
        value: value === null || value === undefined ? '' : String(value), disabled,
      });
    }

    /**
     * The named limits every job enqueued into the queue is subject to: shown here (each
     * linking to its limit's page) and left as they are by "Save settings", which does not send
     * them.
     */
    function limitsField(names) {
      return h('div', { class: 'field', id: 'qs-limits', dataset: { field: 'limits' } },
        h('span', { class: 'field-label', text: 'Named limits' }),
        names.length
          ? h('span', { class: 'tags' }, names.map((limit) => h('a', { class: 'tag mono', href: limitHref(limit), text: limit })))
          : h('span', { class: 'muted small', text: 'none' }),
        h('span', { class: 'muted small' }, 'Jobs enqueued into the queue start only while each of these has room. Set with ',
          h('code', { text: 'conveyor queue set NAME --limits A,B' }), '.'));
    }

    async function openSettings(name) {
      editing = name;
      settingsPanel.hidden = false;
      mount(settingsPanel, h('p', { class: 'muted', text: `Loading the settings of ${name}…` }));
      let settings;
      try {
        settings = await api.queues.get(name);
      } catch (error) {
        if (editing === name) mount(settingsPanel, ctx.problem(error, `Cannot read the settings of ${name}:`));
        return;
      }
      if (editing !== name) return;
      renderSettings(name, settings);
      settingsPanel.scrollIntoView({ block: 'nearest' });
    }

    function closeSettings() {
      editing = null;
      settingsPanel.hidden = true;
      settingsPanel.replaceChildren();
    }

    function renderSettings(name, settings) {
      const canOperate = ctx.canOperate;
      const disabled = !canOperate;
      const errorsByField = new Map();
      const inputs = new Map();
      const boxes = [];
      const fieldBox = (key, label, hint, ...controls) => {
        const error = h('div', { class: 'field-error', id: `qs-${key}-error`, role: 'alert' });
        errorsByField.set(key, error);
        const box = h('div', { class: 'field', dataset: { field: key } },
          h('label', { class: 'field-label', for: `qs-${key}`, text: label }),
          h('div', { class: 'field-controls' }, ...controls),
          h('span', { class: 'muted small', text: hint }),
          error);
        boxes.push(box);
        return box;
      };
      for (const [key, label, hint] of NUMBER_FIELDS) {
        const input = numberInput(`qs-${key}`, settings[key], disabled);
        inputs.set(key, input);
        fieldBox(key, label, hint, input);
      }
      for (const [key, label, hint] of RATE_FIELDS) {
        const limit = settings[key] || {};
        const count = numberInput(`qs-${key}`, limit.count, disabled);
        count.setAttribute('aria-label', `${label}: jobs`);
        const period = numberInput(`qs-${key}-period`, limit.period_ms, disabled);
        period.setAttribute('aria-label', `${label}: period in ms`);
        inputs.set(key, { count, period });
        fieldBox(key, label, `${hint} (jobs / period in ms)`, count, h('span', { class: 'muted', text: 'per' }), period, h('span', { class: 'muted', text: 'ms' }));
      }
      const paused = h('input', { id: 'qs-paused', name: 'paused', type: 'checkbox', checked: Boolean(settings.paused), disabled });
      const pausedError = h('div', { class: 'field-error', id: 'qs-paused-error', role: 'alert' });
      errorsByField.set('paused', pausedError);
      const formError = h('div', { class: 'slot-error' });
      const save = h('button', { class: 'btn btn-primary', id: 'qs-save', type: 'submit', text: 'Save settings', disabled, title: canOperate ? null : 'Needs the admin role' });

      const value = (input) => (input.value.trim() === '' ? null : Number(input.value));
      function clearErrors() {
        for (const error of errorsByField.values()) error.textContent = '';
        for (const input of settingsPanel.querySelectorAll('input')) input.removeAttribute('aria-invalid');
        formError.replaceChildren();
      }
      async function submit(event) {
        event.preventDefault();
        if (!ctx.canOperate) return;
        clearErrors();
        // Pausing is also a row button: only send it when changed here, so an older form does
        // not undo a pause made since it was opened.
        const body = {};
        if (paused.checked !== Boolean(settings.paused)) body.paused = paused.checked;
        for (const [key] of NUMBER_FIELDS) body[key] = value(inputs.get(key));
        for (const [key] of RATE_FIELDS) {
          const { count, period } = inputs.get(key);
          const c = value(count);
          const p = value(period);
          body[key] = c === null && p === null ? null : { count: c, period_ms: p };
        }
        save.disabled = true;
        try {
          const saved = await api.queues.update(name, body);
          ctx.notify(`Settings of queue ${name} saved.`);
          if (editing === name) renderSettings(name, saved && saved.name ? saved : await api.queues.get(name));
          await ctx.refreshNow();
        } catch (error) {
          if (error.status === 401) return;
          const key = error.field ? String(error.field).split(/[.[]/)[0] : null;
          if (error.status === 400 && key && errorsByField.has(key)) {
            errorsByField.get(key).textContent = error.message;
            const target = key === 'paused' ? paused : (inputs.get(key).count || inputs.get(key));
            target.setAttribute('aria-invalid', 'true');
            target.focus();
          } else {
            mount(formError, ctx.problem(error, `Cannot save the settings of ${name}:`));
          }
        } finally {
          save.disabled = !ctx.canOperate;
        }
      }

      mount(settingsPanel,
        h('div', { class: 'panel-head' },
          h('div', {},
            h('h2', {}, 'Settings of ', h('span', { class: 'mono', id: 'qs-queue', text: name })),
            h('p', { class: 'muted small', text: canOperate
              ? 'An empty box means no limit. Saved through PUT /v1/queues/{name}, which the audit log records.'
              : 'Read only: changing a queue needs the admin role.' })),
          h('button', { class: 'btn btn-small', id: 'qs-close', type: 'button', text: 'Close', onclick: closeSettings })),
        h('form', { class: 'settings-form', id: 'queue-settings-form', novalidate: true, onsubmit: submit },
          h('div', { class: 'settings-grid' }, boxes),
          limitsField(settings.limits || []),
          h('div', { class: 'field', dataset: { field: 'paused' } },
            h('label', { class: 'check-label', for: 'qs-paused' }, paused, ' Paused (workers get none of its jobs)'),
            pausedError),
          formError,
          h('div', { class: 'form-actions' }, save)));
    }

    async function setPaused(name, paused) {
      await ctx.guard(actionError, async () => {
        await api.queues.setPaused(name, paused);
        ctx.notify(paused ? `Queue ${name} paused: workers get no more of its jobs.` : `Queue ${name} resumed.`);
        await ctx.refreshNow();
      }, paused ? `Cannot pause ${name}:` : `Cannot resume ${name}:`);
    }

    async function setCircuit(breaker, open) {
      const what = `${breaker.scope} ${breaker.name}`;
      const asked = open
        ? await ctx.confirm({
          title: `Open the circuit of ${what}?`,
          text: `Workers get none of its jobs until it is closed again here (or with conveyor ${breaker.scope} circuit close). Its jobs stay queued.`,
          ok: 'Open circuit',
          danger: true,
        })
        : await ctx.confirm({
          title: `Close the circuit of ${what}?`,
          text: 'Its jobs are handed out to workers again at once, without probing first.',
          ok: 'Close circuit',
        });
      if (!asked) return;
      await ctx.guard(breakerError, async () => {
        if (open) await api.breakers.open(breaker.scope, breaker.name, { reason: 'opened from the dashboard' });
        else await api.breakers.close(breaker.scope, breaker.name);
        ctx.notify(open ? `Circuit of ${what} opened: its jobs are held back.` : `Circuit of ${what} closed.`);
        await ctx.refreshNow();
      }, open ? `Cannot open the circuit of ${what}:` : `Cannot close the circuit of ${what}:`);
    }

    function renderBreakers(breakers) {
      const canOperate = ctx.canOperate;
      const order = { open: 0, half_open: 1, closed: 2 };
      const sorted = [...breakers].sort((a, b) => (order[a.state] ?? 3) - (order[b.state] ?? 3)
        || a.scope.localeCompare(b.scope) || a.name.localeCompare(b.name));
      update(breakerTable, JSON.stringify([sorted, canOperate]), () => {
        if (!sorted.length) {
          return emptyState('No circuit breakers',
            h('span', {}, 'Give a queue or a job kind one with ',
              h('code', { text: 'conveyor queue set NAME --circuit-breaker \'{}\'' }), '.'));
        }
        return h('div', { class: 'table-wrap' }, h('table', { class: 'table' },
          h('thead', {}, h('tr', {},
            h('th', { text: 'Scope' }),
            h('th', { text: 'Name' }),
            h('th', { text: 'State' }),
            h('th', { class: 'num', text: 'Failed / attempts' }),
            h('th', { text: 'Open until' }),
            h('th', { text: 'Reason' }),
            h('th', { text: 'Changed' }),
            actionsHeader())),
          h('tbody', {}, sorted.map((breaker) => {
            const closed = breaker.state === 'closed';
            let until = h('span', { class: 'muted', text: '—' });
            if (breaker.state === 'open') until = breaker.open_until ? when(breaker.open_until) : h('span', { text: 'until closed' });
            return h('tr', { dataset: { breaker: `${breaker.scope}:${breaker.name}`, state: breaker.state } },
              h('td', { class: 'muted', text: breaker.scope }),
              h('td', {}, h('a', { class: 'strong', href: routeHref('/jobs', { [breaker.scope]: breaker.name }), text: breaker.name })),
              h('td', {}, breaker.state === 'closed'
                ? h('span', { class: 'badge badge-active', title: breakerDetail(breaker), text: 'closed' })
                : breakerBadge(breaker),
              breaker.manual && !closed ? h('span', { class: 'muted small', text: ' by hand' }) : null),
              h('td', { class: 'num', title: breakerRule(breaker.settings), text: `${num(breaker.failures)} / ${num(breaker.calls)}` }),
              h('td', {}, until),
              h('td', { class: 'cell-error' }, breaker.reason
                ? h('span', { class: 'last-error', title: breaker.reason, text: breaker.reason })
                : h('span', { class: 'muted', text: '—' })),
              h('td', {}, when(breaker.changed_at)),
              h('td', { class: 'actions' }, h('button', {
                class: closed ? 'btn btn-small btn-danger-outline' : 'btn btn-small', type: 'button',
                dataset: { action: closed ? 'circuit-open' : 'circuit-close' },
                disabled: !canOperate,
                title: canOperate ? null : 'Needs the admin role',
                text: closed ? 'Open' : 'Close',
                onclick: () => setCircuit(breaker, closed),
              })));
          }))));
      });
    }

    function renderCards(queues) {
      const totals = Object.fromEntries(TABLE_STATES.map((s) => [s, 0]));
      let oldest = { ms: 0, queue: null };
      for (const queue of queues) {
        for (const s of TABLE_STATES) totals[s] += queue[s] || 0;
        if ((queue.oldest_available_age_ms || 0) > oldest.ms) oldest = { ms: queue.oldest_available_age_ms, queue: queue.name };
      }
      update(cards, JSON.stringify([totals, oldest]), () => [
        ...CARD_STATES.map(([state, label, hint]) => h('a', {
          class: `card card-${state}`,
          href: state === 'dead' ? '#/dead' : routeHref('/jobs', { state }),
          dataset: { state },
        },
        h('span', { class: 'card-label', text: label }),
        h('span', { class: 'card-value', text: num(totals[state]) }),
        h('span', { class: 'card-hint', text: hint }))),
        h('div', { class: `card card-age${oldest.ms > 60000 ? ' card-warn' : ''}`, dataset: { state: 'oldest' } },
          h('span', { class: 'card-label', text: 'Oldest waiting' }),
          h('span', { class: 'card-value', text: oldest.ms ? duration(oldest.ms) : '—' }),
          h('span', { class: 'card-hint', text: oldest.queue ? `in ${oldest.queue}` : 'nothing waits' })),
      ]);
    }

    function pickRange(id) {
      range = id;
      saveRange(RANGE_KEY, id);
      renderPicker();
      renderCharts();
    }

    function renderPicker() {
      update(picker, range, () => rangePicker(range, pickRange, [LIVE]));
    }

    function renderCharts() {
      if (range === LIVE.id) {
        update(historyError, 'live', () => []);
        renderLiveCharts();
        return;
      }
      loader.load(range).then((changed) => {
        if (changed && range !== LIVE.id) renderHistoryCharts();
      });
      renderHistoryCharts();
    }

    /** The charts from the store's history over the chosen span. */
    function renderHistoryCharts() {
      const chosen = rangeOf(range);
      const report = loader.report;
      if (loader.error) {
        update(historyError, `e:${loader.error.status}:${loader.error.message}`, () => ctx.problem(loader.error, 'Cannot read the history:'));
      } else {
        update(historyError, 'ok', () => []);
      }
      const stepMin = report ? report.step_s / 60 : 1;
      throughputLabel.textContent = `Jobs completed per minute, last ${chosen.label}`;
      failureLabel.textContent = `Failed attempts per minute (retries included), last ${chosen.label}`;
      runTimeLabel.textContent = `95th percentile of attempts' run time, last ${chosen.label}`;
      const series = report ? report.series : [];
      const until = report ? Date.parse(report.to) : Date.now();
      const end = (p) => Math.min(Date.parse(p.at) + report.step_s * 1000, until);
      // The last step may be the one in progress: its rate is over the minutes it covers.
      const minutesOf = (p) => Math.max(1, (end(p) - Date.parse(p.at)) / 60000) || stepMin;
      const done = series.map((p) => ({ t: end(p), v: p.completed / minutesOf(p) }));
      const failed = series.map((p) => ({ t: end(p), v: p.failed / minutesOf(p) }));
      const slow = series.filter((p) => p.run_time).map((p) => ({ t: end(p), v: p.run_time.p95_ms }));
      const totals = report ? report.totals : null;
      const spanMin = report ? (Date.parse(report.to) - Date.parse(report.from)) / 60000 : 60;
      const ended = totals ? totals.completed + totals.failed : 0;
      mount(throughputHead,
        h('span', { class: 'figure', id: 'throughput-now', text: totals ? perMinuteText(totals.completed / spanMin) : '—' }),
        h('span', { class: 'muted small', text: totals ? `${num(totals.completed)} completed, ${num(totals.enqueued)} enqueued` : 'loading…' }));
      mount(failureHead,
        h('span', { class: `figure${totals && totals.failed ? ' figure-bad' : ''}`, id: 'failure-rate', text: totals ? rateText(totals.failure_rate) : '—' }),
        h('span', { class: 'muted small', text: !totals ? 'loading…' : ended ? `of ${num(ended)} attempts failed (${num(totals.failed)}; ${num(totals.dead)} died)` : `nothing finished in the last ${chosen.label}` }));
      mount(runTimeHead,
        h('span', { class: 'figure', id: 'run-time-p95', text: totals && totals.run_time ? latencyText(totals.run_time.p95_ms) : '—' }),
        h('span', { class: 'muted small', text: totals && totals.run_time
          ? `p50 ${latencyText(totals.run_time.p50_ms)} · wait p95 ${totals.queue_wait ? latencyText(totals.queue_wait.p95_ms) : '—'}`
          : 'no attempt ended' }));
      const now = report ? Date.parse(report.to) : Date.now();
      const windowMs = report ? now - Date.parse(report.from) : chosen.spanMs;
      const common = { windowMs, now, startLabel: chosen.ago, emptyText: report ? 'Nothing in this span' : 'Loading…', minPoints: 1 };
      const perMin = (v) => perMinuteText(v).replace('/min', '');
      mount(throughput, lineChart({ ...common, points: done, format: perMin, tone: 'ok', label: throughputLabel.textContent }));
      mount(failures, lineChart({ ...common, points: failed, format: perMin, tone: 'bad', label: failureLabel.textContent }));
      mount(runTime, lineChart({ ...common, points: slow, format: latencyText, tone: 'ok', label: runTimeLabel.textContent, emptyText: report ? 'No attempt ended in this span' : 'Loading…' }));
    }

    /** Per-second rates from this page's successive `/v1/queues` answers. */
    function renderLiveCharts() {
      const history = ctx.history;
      const now = history.length ? history[history.length - 1].t : Date.now();
      const done = rates(history, (s) => s.totals.completed);
      // Failed attempts (retries included) come from /metrics when the server has it; without
      // it, the store-wide counts only show jobs that died.
      const counted = history.filter((s) => s.attempts);
      const fromMetrics = counted.length >= 2 && Boolean(history[history.length - 1].attempts);
      const failed = (s) => (s.attempts.failed || 0) + (s.attempts.dead || 0);
      const died = fromMetrics ? rates(counted, failed) : rates(history, (s) => s.totals.dead);
      const recent = (points) => {
        const window = points.filter((p) => p.t >= now - 10000);
        return window.length ? window.reduce((a, p) => a + p.v, 0) / window.length : 0;
      };
      const completedMinute = growth(history, (s) => s.totals.completed, RATE_WINDOW_MS, now);
      const badMinute = fromMetrics
        ? growth(counted, failed, RATE_WINDOW_MS, now)
        : growth(history, (s) => s.totals.dead, RATE_WINDOW_MS, now);
      const goodMinute = fromMetrics
        ? growth(counted, (s) => s.attempts.completed || 0, RATE_WINDOW_MS, now)
        : completedMinute;
      const ratio = goodMinute + badMinute > 0 ? (100 * badMinute) / (goodMinute + badMinute) : null;
      failureLabel.textContent = fromMetrics
        ? 'Failed attempts per second, retries included'
        : 'Jobs moved to the dead-letter queue per second';
      const ratioText = fromMetrics
        ? `of attempts failed in the last minute (${num(badMinute)})`
        : `of jobs finished in the last minute died (${num(badMinute)})`;

      mount(throughputHead,
        h('span', { class: 'figure', id: 'throughput-now', text: perSecond(recent(done)) }),
        h('span', { class: 'muted small', text: `${num(completedMinute)} in the last minute` }));
      mount(failureHead,
        h('span', { class: `figure${ratio ? ' figure-bad' : ''}`, id: 'failure-rate', text: ratio === null ? '—' : `${ratio.toFixed(ratio < 10 ? 1 : 0)} %` }),
        h('span', { class: 'muted small', text: ratio === null ? 'nothing finished in the last minute' : ratioText }));
      // The x axis spans what has been seen, from one minute up to the whole history kept, so
      // a freshly opened page does not squeeze its first points against the right edge.
      const span = history.length ? now - history[0].t : 0;
      const windowMs = Math.min(ctx.historyMs, Math.max(RATE_WINDOW_MS, span));
      throughputLabel.textContent = 'Jobs completed per second';
      mount(throughput, lineChart({ points: done, windowMs, now, format: perSecond, tone: 'ok', label: 'Completed jobs per second' }));
      mount(failures, lineChart({ points: died, windowMs, now, format: perSecond, tone: 'bad', label: failureLabel.textContent }));
      runTimeLabel.textContent = 'Kept by the server: pick 1 h, 24 h or 7 d';
      mount(runTimeHead, h('span', { class: 'figure', id: 'run-time-p95', text: '—' }));
      mount(runTime, h('div', { class: 'chart-empty-panel muted', text: 'Run times are shown from the history.' }));
    }

    function renderTable(queues, breakers) {
      const byQueue = new Map(breakers.filter((b) => b.scope === 'queue').map((b) => [b.name, b]));
      const history = ctx.history;
      const now = history.length ? history[history.length - 1].t : Date.now();
      const perMinute = Object.fromEntries(queues.map((q) => [q.name,
        growth(history, (s) => (s.perQueue[q.name] ? s.perQueue[q.name].completed : 0), RATE_WINDOW_MS, now)]));
      const canOperate = ctx.canOperate;
      // Only what the row shows of a breaker: its live attempt counts change all the time.
      const shown = [...byQueue.values()].map((b) => [b.name, b.state, b.open_until, b.reason, b.manual, b.probe_successes, b.settings]);
      update(table, JSON.stringify([queues, perMinute, canOperate, shown]), () => {
        if (!queues.length) {
          return emptyState('No queues yet',
            h('span', {}, 'A queue appears as soon as a job is enqueued into it, e.g. ',
              h('code', { text: 'conveyor enqueue hello --queue default' }), '.'));
        }
        return h('div', { class: 'table-wrap' }, h('table', { class: 'table' },
          h('thead', {}, h('tr', {},
            h('th', { text: 'Queue' }),
            h('th', { text: 'Status' }),
            TABLE_STATES.map((s) => h('th', { class: 'num', text: s[0].toUpperCase() + s.slice(1) })),
            h('th', { class: 'num', text: 'Oldest waiting' }),
            h('th', { class: 'num', text: 'Done / min' }),
            actionsHeader())),
          h('tbody', {}, queues.map((queue) => h('tr', { dataset: { queue: queue.name } },
            h('td', {}, h('a', { class: 'strong', href: routeHref('/jobs', { queue: queue.name }), text: queue.name })),
            h('td', {}, queue.paused
              ? h('span', { class: 'badge badge-paused', text: 'paused' })
              : h('span', { class: 'badge badge-active', text: 'active' }),
            byQueue.has(queue.name) ? breakerBadge(byQueue.get(queue.name)) : null,
            byQueue.has(queue.name) ? breakerNote(byQueue.get(queue.name)) : null),
            TABLE_STATES.map((s) => h('td', { class: `num${queue[s] ? '' : ' zero'}`, dataset: { state: s } },
              h('a', {
                href: s === 'dead' ? routeHref('/dead', { queue: queue.name }) : routeHref('/jobs', { queue: queue.name, state: s }),
                text: num(queue[s] || 0),
              }))),
            h('td', { class: `num${queue.oldest_available_age_ms > 60000 ? ' warn' : ''}`, text: queue.oldest_available_age_ms ? duration(queue.oldest_available_age_ms) : '—' }),
            h('td', { class: 'num', text: num(perMinute[queue.name]) }),
            h('td', { class: 'actions' }, h('button', {
              class: 'btn btn-small', type: 'button',
              dataset: { action: 'settings' },
              title: canOperate ? 'Edit the limits of this queue' : 'See the limits of this queue',
              text: canOperate ? 'Edit settings' : 'Settings',
              onclick: () => openSettings(queue.name),
            }), h('button', {
              class: 'btn btn-small', type: 'button',
              dataset: { action: queue.paused ? 'resume' : 'pause' },
              disabled: !canOperate,
              title: canOperate ? null : 'Needs the admin role',
              text: queue.paused ? 'Resume' : 'Pause',
              onclick: () => setPaused(queue.name, !queue.paused),
            })))))));
      });
    }

    return {
      el,
      render() {
        if (ctx.queuesError) {
          update(errors, `e:${ctx.queuesError.message}`, () => ctx.problem(ctx.queuesError, 'Cannot read the queues:'));
        } else {
          update(errors, 'ok', () => []);
        }
        renderPicker();
        if (!ctx.queues) return;
        renderCards(ctx.queues);
        renderCharts();
        renderTable(ctx.queues, ctx.breakers || []);
        renderBreakers(ctx.breakers || []);
      },
    };
  },
};
