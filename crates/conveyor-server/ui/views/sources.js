// Event sources (`GET /v1/sources`): each broker the cluster reads, with its state on this
// server, what became of its messages and its lag at the broker; pause, resume and delete per
// row (admin only, as the API is).

import { h, update, num, emptyState, routeHref, actionsHeader } from '../dom.js';
import * as api from '../api.js';

const STATE_BADGE = {
  running: 'badge-active',
  starting: 'badge-none',
  paused: 'badge-paused',
  backing_off: 'badge-paused',
  error: 'state-dead',
  stopped: 'badge-none',
};

/** What the source reads, in the broker's own words. */
function reads(s) {
  switch (s.type) {
    case 'redis_stream': return `stream ${s.stream}, group ${s.group}`;
    case 'amqp': return `queue ${s.queue}`;
    case 'nats': return `stream ${s.stream}${s.subject ? ` (${s.subject})` : ''}, consumer ${s.consumer}`;
    case 'mqtt': return `topic ${s.topic}, client ${s.client_id}`;
    case 'sqs': return s.queue_url;
    default: return '';
  }
}

/** A mapped field: its fixed value, or where it comes from. */
function field(value) {
  if (value == null) return null;
  return typeof value === 'string' ? value : `from ${value.from}`;
}

export default {
  title: 'Sources',
  create(ctx) {
    const errors = h('div', { class: 'slot-error' });
    const list = h('div', { id: 'sources-table' });
    const el = h('section', { id: 'view-sources' },
      h('div', { class: 'view-head' },
        h('div', {},
          h('h1', { text: 'Sources' }),
          h('p', { class: 'subtitle', text: 'Brokers whose messages become jobs, each acknowledged once its job is stored.' }))),
      errors,
      h('div', { class: 'panel panel-flush' }, list));

    async function act(name, action) {
      const done = {
        pause: `Source ${name} paused: no server reads it until resumed; messages wait at the broker.`,
        resume: `Source ${name} resumed.`,
      };
      await ctx.guard(errors, async () => {
        await api.sources[action](name);
        ctx.notify(done[action]);
        await ctx.refreshNow();
      }, `Cannot ${action} the source ${name}:`);
    }

    async function remove(name) {
      const asked = await ctx.confirm({
        title: `Delete the source ${name}?`,
        text: 'No server reads it any more. Its jobs stay; the broker keeps its consumer group.',
        ok: 'Delete source',
        danger: true,
      });
      if (!asked) return;
      await ctx.guard(errors, async () => {
        await api.sources.remove(name);
        ctx.notify(`Source ${name} deleted.`);
        await ctx.refreshNow();
      }, `Cannot delete the source ${name}:`);
    }

    return {
      el,
      async refresh() {
        await ctx.guard(errors, async () => {
          const answer = await api.sources.list();
          const sources = answer.sources || [];
          const canOperate = ctx.canOperate;
          update(list, JSON.stringify([sources, canOperate]), () => {
            if (!sources.length) {
              return emptyState('No sources',
                h('span', {}, 'Add one with ', h('code', { text: 'conveyor source set NAME --file source.json' }),
                  ' or from a file with ', h('code', { text: 'conveyor serve --sources FILE' }), '.'));
            }
            return h('div', { class: 'table-wrap' }, h('table', { class: 'table sources-table' },
              h('thead', {}, h('tr', {},
                h('th', { text: 'Source' }),
                h('th', { text: 'Reads' }),
                h('th', { text: 'Becomes' }),
                h('th', { text: 'State' }),
                h('th', { class: 'num', text: 'Received' }),
                h('th', { class: 'num', text: 'Enqueued' }),
                h('th', { class: 'num', text: 'Duplicates' }),
                h('th', { class: 'num', text: 'Invalid' }),
                h('th', { class: 'num', text: 'Lag' }),
                actionsHeader())),
              h('tbody', {}, sources.map((s) => h('tr', { dataset: { source: s.name, state: s.state } },
                h('td', {}, h('span', { class: 'strong', text: s.name }),
                  h('div', { class: 'muted small', text: s.type })),
                h('td', { class: 'small', text: reads(s) }),
                h('td', { class: 'small' },
                  h('div', { text: field(s.job && s.job.kind) || '—' }),
                  h('div', {}, 'into ', s.job && typeof s.job.queue === 'string'
                    ? h('a', { href: routeHref('/jobs', { queue: s.job.queue }), text: s.job.queue })
                    : h('span', { text: field(s.job && s.job.queue) || 'default' }))),
                h('td', {},
                  h('span', { class: `badge ${STATE_BADGE[s.state] || ''}`, dataset: { col: 'state' }, text: (s.state || '').replace('_', ' ') }),
                  s.last_error ? h('div', { class: 'muted small', title: s.last_error, text: s.last_error.slice(0, 120) }) : null),
                h('td', { class: 'num', dataset: { col: 'received' }, text: num(s.received || 0) }),
                h('td', { class: 'num', dataset: { col: 'enqueued' }, text: num(s.enqueued || 0) }),
                h('td', { class: 'num', text: num(s.duplicates || 0) }),
                h('td', { class: `num${s.invalid ? ' warn' : ''}`, text: num(s.invalid || 0) }),
                h('td', { class: 'num', dataset: { col: 'lag' }, text: s.lag == null ? '—' : num(s.lag) }),
                h('td', { class: 'actions' }, h('button', {
                  class: 'btn btn-small', type: 'button',
                  dataset: { action: s.paused ? 'resume-source' : 'pause-source' },
                  disabled: !canOperate,
                  title: canOperate ? null : 'Needs the admin role',
                  text: s.paused ? 'Resume' : 'Pause',
                  onclick: () => act(s.name, s.paused ? 'resume' : 'pause'),
                }), h('button', {
                  class: 'btn btn-small btn-danger-outline', type: 'button',
                  dataset: { action: 'delete-source' },
                  disabled: !canOperate,
                  title: canOperate ? null : 'Needs the admin role',
                  text: 'Delete',
                  onclick: () => remove(s.name),
                })))))));
          });
        }, 'Cannot list sources:');
      },
    };
  },
};
