// Cron schedules (`GET /v1/schedules`): each with its expression, time zone, the job it
// enqueues, the next tick and the last run with its job's current state; pause, resume, run
// now and delete per row, and a form that creates (or replaces) one with `PUT`.

import { h, mount, update, when, localTime, stateBadge, emptyState, jobLink, routeHref, actionsHeader } from '../dom.js';
import * as api from '../api.js';

const RUN_STATUS = {
  enqueued: 'badge-active',
  skipped_overlap: 'badge-paused',
  refused: 'state-dead',
};

function lastRun(run) {
  if (!run) return h('span', { class: 'muted', text: 'never ran' });
  return h('div', { class: 'run' },
    h('div', {},
      h('span', { class: `badge ${RUN_STATUS[run.status] || ''}`, text: run.status.replace('_', ' ') }),
      run.catch_up ? h('span', { class: 'badge badge-none', title: 'Run by the catch-up policy after missed ticks', text: 'catch-up' }) : null,
      ' ', when(run.tick)),
    run.job_id
      ? h('div', { class: 'small' }, jobLink(run.job_id), ' ', stateBadge(run.job_state))
      : null,
    run.detail ? h('div', { class: 'muted small', text: run.detail }) : null);
}

export default {
  title: 'Schedules',
  create(ctx) {
    const errors = h('div', { class: 'slot-error' });
    const list = h('div', { id: 'schedules-table' });
    const formPanel = h('div', { class: 'panel', id: 'schedule-form-panel', hidden: true });
    const newButton = h('button', {
      class: 'btn btn-primary', type: 'button', id: 'schedule-new', text: 'New schedule',
      onclick: () => openForm(),
    });
    const el = h('section', { id: 'view-schedules' },
      h('div', { class: 'view-head' },
        h('div', {},
          h('h1', { text: 'Schedules' }),
          h('p', { class: 'subtitle', text: 'Cron schedules enqueue a job on every tick, once across all servers.' })),
        newButton),
      errors,
      formPanel,
      h('div', { class: 'panel panel-flush' }, list));

    // The form: one box per field of the ScheduleSpec that matters day to day; a 400 from
    // the server is shown under the box of the field it names.
    const FIELDS = [
      ['name', 'Name', 'Letters, digits, . _ - :', 'nightly-report'],
      ['cron', 'Cron', '5 fields, or 6 with seconds first; or leave empty and give an interval', '0 3 * * *'],
      ['every', 'Every', 'An interval instead of cron: 30s, 5m, 1h30m', ''],
      ['timezone', 'Time zone', 'IANA name, for cron', 'UTC'],
      ['job.kind', 'Job kind', 'What the job is', 'report.generate'],
      ['job.queue', 'Queue', '', 'default'],
      ['job.payload', 'Payload (JSON)', 'Given to every run', '{}'],
    ];
    function openForm() {
      formPanel.hidden = false;
      const inputs = new Map();
      const fieldErrors = new Map();
      const formError = h('div', { class: 'slot-error' });
      const boxes = FIELDS.map(([key, label, hint, placeholder]) => {
        const id = `sf-${key.replace('.', '-')}`;
        const input = key === 'job.payload'
          ? h('textarea', { id, name: key, rows: 3, class: 'input-full mono', placeholder })
          : h('input', { id, name: key, type: 'text', class: 'input-full', placeholder, value: key === 'timezone' ? 'UTC' : key === 'job.queue' ? 'default' : '' });
        const error = h('div', { class: 'field-error', id: `${id}-error`, role: 'alert' });
        inputs.set(key, input);
        fieldErrors.set(key, error);
        return h('div', { class: 'field', dataset: { field: key } },
          h('label', { for: id, text: label }), input,
          hint ? h('div', { class: 'muted small', text: hint }) : null, error);
      });
      const save = h('button', { class: 'btn btn-primary', type: 'submit', id: 'sf-save', text: 'Save schedule' });
      async function submit(event) {
        event.preventDefault();
        for (const [key, error] of fieldErrors) {
          error.textContent = '';
          inputs.get(key).removeAttribute('aria-invalid');
        }
        formError.replaceChildren();
        const value = (key) => inputs.get(key).value.trim();
        const fail = (key, message) => {
          fieldErrors.get(key).textContent = message;
          inputs.get(key).setAttribute('aria-invalid', 'true');
          inputs.get(key).focus();
        };
        const name = value('name');
        if (!name) return fail('name', 'A schedule needs a name.');
        let payload = {};
        if (value('job.payload')) {
          try { payload = JSON.parse(value('job.payload')); } catch (error) { return fail('job.payload', `Not JSON: ${error.message}`); }
        }
        const spec = { job: { kind: value('job.kind'), queue: value('job.queue') || 'default', payload } };
        if (value('cron')) spec.cron = value('cron');
        if (value('every')) spec.every = value('every');
        if (value('timezone')) spec.timezone = value('timezone');
        save.disabled = true;
        try {
          await api.schedules.put(name, spec);
          ctx.notify(`Schedule ${name} saved.`);
          formPanel.hidden = true;
          formPanel.replaceChildren();
          await ctx.refreshNow();
        } catch (error) {
          if (error.status === 401) return;
          // A field the form has gets the message under its box; anything else above the button.
          const field = FIELDS.some(([key]) => key === error.field) ? error.field : null;
          if (error.status === 400 && field) fail(field, error.message);
          else mount(formError, ctx.problem(error, `Cannot save the schedule ${name}:`));
        } finally {
          save.disabled = false;
        }
      }
      mount(formPanel,
        h('div', { class: 'panel-head' },
          h('div', {},
            h('h2', { text: 'New schedule' }),
            h('p', { class: 'muted small', text: 'Saved through PUT /v1/schedules/{name} (a schedule of the same name is replaced), which the audit log records.' })),
          h('button', { class: 'btn btn-small', type: 'button', text: 'Close', onclick: () => { formPanel.hidden = true; } })),
        h('form', { class: 'settings-form', id: 'schedule-form', novalidate: true, onsubmit: submit },
          h('div', { class: 'settings-grid' }, boxes),
          formError,
          h('div', { class: 'form-actions' }, save)));
      inputs.get('name').focus();
    }

    async function act(name, action) {
      const done = {
        pause: `Schedule ${name} paused: it fires nothing until resumed.`,
        resume: `Schedule ${name} resumed.`,
      };
      await ctx.guard(errors, async () => {
        if (action === 'trigger') {
          const run = await api.schedules.trigger(name);
          ctx.notify(`Schedule ${name} run now: job ${run.id} enqueued into ${run.queue}.`);
        } else {
          await api.schedules[action](name);
          ctx.notify(done[action]);
        }
        await ctx.refreshNow();
      }, `Cannot ${action === 'trigger' ? 'run' : action} the schedule ${name}:`);
    }

    async function remove(name) {
      const asked = await ctx.confirm({
        title: `Delete the schedule ${name}?`,
        text: 'It enqueues no more jobs. Jobs it already enqueued stay as they are.',
        ok: 'Delete schedule',
        danger: true,
      });
      if (!asked) return;
      await ctx.guard(errors, async () => {
        await api.schedules.remove(name);
        ctx.notify(`Schedule ${name} deleted.`);
        await ctx.refreshNow();
      }, `Cannot delete the schedule ${name}:`);
    }

    return {
      el,
      async refresh() {
        await ctx.guard(errors, async () => {
          const answer = await api.schedules.list();
          const schedules = answer.schedules || [];
          const canOperate = ctx.canOperate;
          newButton.disabled = !canOperate;
          newButton.title = canOperate ? '' : 'Needs the admin role';
          update(list, JSON.stringify([schedules, canOperate]), () => {
            if (!schedules.length) {
              return emptyState('No schedules',
                h('span', {}, 'Create one with ', h('code', { text: "conveyor schedule set NAME --cron '*/5 * * * *' --kind KIND" }),
                  ' or from a file with ', h('code', { text: 'conveyor serve --schedules FILE' }), '.'));
            }
            return h('div', { class: 'table-wrap' }, h('table', { class: 'table' },
              h('thead', {}, h('tr', {},
                ['Schedule', 'When', 'Job', 'Next run', 'Last run', 'Policies'].map((t) => h('th', { text: t })),
                actionsHeader())),
              h('tbody', {}, schedules.map((s) => h('tr', { dataset: { schedule: s.name, paused: s.paused ? 'true' : 'false' } },
                h('td', {}, h('span', { class: 'strong', text: s.name }),
                  s.paused ? h('div', {}, h('span', { class: 'badge badge-paused', text: 'paused' })) : null),
                h('td', {},
                  h('code', { text: s.every ? `every ${s.every}` : s.cron }),
                  h('div', { class: 'muted small', text: s.every ? 'interval' : (s.timezone || 'UTC') })),
                h('td', {},
                  h('div', { class: 'strong', text: s.job ? s.job.kind : '—' }),
                  h('div', { class: 'small' }, 'into ', h('a', { href: routeHref('/jobs', { queue: (s.job && s.job.queue) || 'default' }), text: (s.job && s.job.queue) || 'default' }))),
                h('td', {},
                  s.next_run_at ? when(s.next_run_at) : h('span', { class: 'muted', text: s.paused ? 'paused' : 'none' }),
                  s.next_run_at ? h('div', { class: 'muted small', text: localTime(s.next_run_at) }) : null),
                h('td', {}, lastRun(s.last_run)),
                h('td', { class: 'small' },
                  h('div', { text: `overlap: ${s.overlap || 'skip'}` }),
                  h('div', { text: `missed: ${s.missed || 'skip'}${s.missed === 'catch_up' && s.max_catch_up ? ` (≤ ${s.max_catch_up})` : ''}` })),
                h('td', { class: 'actions' }, h('button', {
                  class: 'btn btn-small', type: 'button',
                  dataset: { action: 'trigger-schedule' },
                  disabled: !canOperate,
                  title: canOperate ? 'Enqueue its job now, outside its ticks' : 'Needs the admin role',
                  text: 'Run now',
                  onclick: () => act(s.name, 'trigger'),
                }), h('button', {
                  class: 'btn btn-small', type: 'button',
                  dataset: { action: s.paused ? 'resume-schedule' : 'pause-schedule' },
                  disabled: !canOperate,
                  title: canOperate ? null : 'Needs the admin role',
                  text: s.paused ? 'Resume' : 'Pause',
                  onclick: () => act(s.name, s.paused ? 'resume' : 'pause'),
                }), h('button', {
                  class: 'btn btn-small btn-danger-outline', type: 'button',
                  dataset: { action: 'delete-schedule' },
                  disabled: !canOperate,
                  title: canOperate ? null : 'Needs the admin role',
                  text: 'Delete',
                  onclick: () => remove(s.name),
                })))))));
          });
        }, 'Cannot list schedules:');
      },
    };
  },
};
