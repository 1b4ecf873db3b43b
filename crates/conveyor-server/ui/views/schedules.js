// Cron schedules (`GET /v1/schedules`): each with its expression, time zone, the job it
// enqueues, the next tick and the last run with its job's current state.

import { h, update, when, localTime, stateBadge, emptyState, jobLink, routeHref } from '../dom.js';
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
    const el = h('section', { id: 'view-schedules' },
      h('div', { class: 'view-head' },
        h('div', {},
          h('h1', { text: 'Schedules' }),
          h('p', { class: 'subtitle', text: 'Cron schedules enqueue a job on every tick, once across all servers.' }))),
      errors,
      h('div', { class: 'panel panel-flush' }, list));

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
          update(list, JSON.stringify([schedules, canOperate]), () => {
            if (!schedules.length) {
              return emptyState('No schedules',
                h('span', {}, 'Create one with ', h('code', { text: "conveyor schedule set NAME --cron '*/5 * * * *' --kind KIND" }),
                  ' or from a file with ', h('code', { text: 'conveyor serve --schedules FILE' }), '.'));
            }
            return h('div', { class: 'table-wrap' }, h('table', { class: 'table' },
              h('thead', {}, h('tr', {},
                ['Schedule', 'When', 'Job', 'Next run', 'Last run', 'Policies'].map((t) => h('th', { text: t })),
                h('th', { class: 'actions', text: '' }))),
              h('tbody', {}, schedules.map((s) => h('tr', { dataset: { schedule: s.name } },
                h('td', { class: 'strong', text: s.name }),
                h('td', {},
                  h('code', { text: s.every ? `every ${s.every}` : s.cron }),
                  h('div', { class: 'muted small', text: s.every ? 'interval' : (s.timezone || 'UTC') })),
                h('td', {},
                  h('div', { class: 'strong', text: s.job ? s.job.kind : '—' }),
                  h('div', { class: 'small' }, 'into ', h('a', { href: routeHref('/jobs', { queue: (s.job && s.job.queue) || 'default' }), text: (s.job && s.job.queue) || 'default' }))),
                h('td', {},
                  s.next_run_at ? when(s.next_run_at) : h('span', { class: 'muted', text: 'none' }),
                  s.next_run_at ? h('div', { class: 'muted small', text: localTime(s.next_run_at) }) : null),
                h('td', {}, lastRun(s.last_run)),
                h('td', { class: 'small' },
                  h('div', { text: `overlap: ${s.overlap || 'skip'}` }),
                  h('div', { text: `missed: ${s.missed || 'skip'}${s.missed === 'catch_up' && s.max_catch_up ? ` (≤ ${s.max_catch_up})` : ''}` })),
                h('td', { class: 'actions' }, h('button', {
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
