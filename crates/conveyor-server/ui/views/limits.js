// Named limits (`GET /v1/limits`): each rule on how many jobs sharing a key may run at once
// and start per period, across the cluster, with its running jobs over every key and the keys
// that are full (from `GET /v1/limits/{name}`); delete per row (admin only, as the API is,
// and refused while a queue or kind names the limit). One limit's page shows what each of its
// keys uses now against the limit, refreshed every second like the other live views.

import { h, mount, update, num, duration, when, localTime, emptyState, actionsHeader } from '../dom.js';
import * as api from '../api.js';

/** Limits whose usage the list asks for on each refresh (one call each); more show "—". */
const USAGE_MAX = 50;
/** Keys one limit's page lists, fullest first; a note counts the rest. */
const KEYS_MAX = 200;

export function limitHref(name) {
  return `#/limits/${encodeURIComponent(name)}`;
}

/** "600 per 1 m". */
export function rateRule(rate) {
  if (!rate) return null;
  return `${num(rate.count)} per ${duration(rate.period_ms)}`;
}

/** Where a limit's key comes from, or that all its jobs share one budget. */
function keyText(spec) {
  return spec.key ? spec.key : null;
}

/** The limit in words: "at most 3 running and 600 started per 1 m, per payload.customer.id". */
function ruleText(spec) {
  const parts = [];
  if (spec.concurrency != null) parts.push(`at most ${num(spec.concurrency)} running at once`);
  if (spec.rate) parts.push(`at most ${num(spec.rate.count)} started per ${duration(spec.rate.period_ms)}`);
  const rule = parts.join(' and ') || 'no bound set';
  return spec.key ? `${rule}, per ${spec.key}` : `${rule}, shared by every job under it`;
}

/** Whether a key has no room left: its running jobs or its recent starts are at the limit. */
function fullness(spec, used) {
  const running = spec.concurrency != null && used.running >= spec.concurrency;
  const rate = Boolean(spec.rate) && used.recent_starts >= spec.rate.count;
  return { running, rate, full: running || rate };
}

/** "acme", or for a limit without a key the one budget every job shares. */
function keyLabel(key) {
  return key === '' ? h('span', { class: 'muted', text: 'every job (no key)' }) : h('span', { class: 'mono', text: key });
}

/** `used` of `cap` as a bar (decorative: the figures beside it say the same) and "1 / 3". */
export function usageBar(used, cap) {
  if (cap == null) return h('span', { class: 'usage-text', text: num(used) });
  const share = cap > 0 ? Math.min(1, used / cap) : 1;
  return h('span', { class: `usage${used >= cap ? ' usage-full' : ''}` },
    h('span', { class: 'usage-bar', 'aria-hidden': 'true' },
      h('span', { class: 'usage-fill', style: { width: `${Math.round(share * 100)}%` } })),
    h('span', { class: 'usage-text', text: `${num(used)} / ${num(cap)}` }));
}

export const limitView = {
  title: 'Limit',
  create(ctx, _params, name) {
    const errors = h('div', { class: 'slot-error' });
    const header = h('div', { class: 'view-head' });
    const body = h('div', { id: 'limit-body', class: 'stack' });
    const el = h('section', { id: 'view-limit', dataset: { limit: name } }, header, errors, body);
    let missing = false;

    function render(limit) {
      const usage = [...(limit.usage || [])].sort((a, b) => b.running - a.running
        || b.recent_starts - a.recent_starts || a.key.localeCompare(b.key));
      const shown = usage.slice(0, KEYS_MAX);
      const weights = limit.weights || {};
      const weighted = Object.keys(weights).length > 0;
      const full = usage.filter((used) => fullness(limit, used).full).length;
      update(header, JSON.stringify([limit.name, limit.concurrency, limit.rate, limit.key]), () => h('div', {},
        h('p', { class: 'crumbs' },
          h('a', { href: '#/limits', text: 'Limits' }), ' / ',
          h('a', { href: limitHref(limit.name), 'aria-current': 'page', text: limit.name })),
        h('h1', { text: limit.name }),
        h('p', { class: 'subtitle', id: 'limit-rule', text: ruleText(limit) })));
      update(body, JSON.stringify(limit), () => [
        h('div', { class: 'panel' },
          h('h2', { text: 'Rule' }),
          h('dl', { class: 'details', id: 'limit-details' },
            h('dt', { text: 'Key' }), h('dd', {}, limit.key
              ? h('span', { class: 'mono', text: limit.key })
              : h('span', { class: 'muted', text: 'none: every job under it shares one budget' })),
            h('dt', { text: 'Running at once' }), h('dd', { text: limit.concurrency != null ? `at most ${num(limit.concurrency)}${limit.key ? ' per key' : ''}` : 'no bound' }),
            h('dt', { text: 'Starts' }), h('dd', { text: limit.rate ? `at most ${rateRule(limit.rate)}${limit.key ? ' per key' : ''}` : 'no bound' }),
            weighted ? [h('dt', { text: 'Weights' }), h('dd', { class: 'mono small', text: Object.entries(weights).map(([k, w]) => `${k}: ${w}`).join(', ') })] : null,
            h('dt', { text: 'Running now' }), h('dd', { id: 'limit-in-use', text: `${num(limit.in_use || 0)} over ${num(usage.length)} key${usage.length === 1 ? '' : 's'}${full ? ` · ${num(full)} full` : ''}` }),
            h('dt', { text: 'Updated' }), h('dd', {}, when(limit.updated_at), h('span', { class: 'muted small', text: ` · ${localTime(limit.updated_at)}` })))),
        h('div', { class: 'panel panel-flush' },
          h('div', { class: 'panel-head panel-note' },
            h('div', {},
              h('h2', { text: 'Keys in use' }),
              h('p', { class: 'muted small', text: limit.rate
                ? `Each key's running jobs, and its starts within the last ${duration(limit.rate.period_ms)}. A full key's next jobs wait.`
                : 'Each key\'s running jobs. A full key\'s next jobs wait.' }))),
          h('div', { id: 'limit-keys' }, usage.length
            ? [h('div', { class: 'table-wrap' }, h('table', { class: 'table limit-keys-table' },
              h('thead', {}, h('tr', {},
                h('th', { text: 'Key' }),
                h('th', { class: 'num', text: 'Running' }),
                // Starts are counted only against a rate (0 without one).
                limit.rate ? h('th', { class: 'num', text: `Started in ${duration(limit.rate.period_ms)}` }) : null,
                weighted ? h('th', { class: 'num', text: 'Weight' }) : null,
                h('th', { text: 'Room' }))),
              h('tbody', {}, shown.map((used) => {
                const state = fullness(limit, used);
                return h('tr', { dataset: { key: used.key, full: String(state.full) } },
                  h('td', {}, keyLabel(used.key)),
                  h('td', { class: 'num', dataset: { col: 'running' } }, usageBar(used.running, limit.concurrency)),
                  limit.rate ? h('td', { class: 'num', dataset: { col: 'recent-starts' } }, usageBar(used.recent_starts, limit.rate.count)) : null,
                  weighted ? h('td', { class: 'num', text: num(weights[used.key] || 1) }) : null,
                  h('td', {}, state.full
                    ? h('span', { class: 'badge badge-paused', title: 'Its next jobs wait until a running one ends or the period moves on', text: state.running ? 'full' : 'rate reached' })
                    : h('span', { class: 'badge badge-active', text: 'room' })));
              })))),
            usage.length > shown.length
              ? h('p', { class: 'muted small panel-note', text: `And ${num(usage.length - shown.length)} more keys with fewer jobs.` })
              : null]
            : emptyState('No key in use', limit.rate
              ? `No job under this limit runs now or started in the last ${duration(limit.rate.period_ms)}.`
              : 'No job under this limit runs now.'))),
      ]);
    }

    return {
      el,
      get title() { return `Limit ${name}`; },
      async refresh() {
        if (missing) return;
        await ctx.guard(errors, async () => {
          let limit;
          try {
            limit = await api.limits.get(name);
          } catch (error) {
            if (error.status === 404 || (error.status === 400 && error.field === 'name')) {
              missing = true;
              mount(header, h('div', {}, h('h1', { text: 'Limit not found' })));
              mount(body, emptyState(
                error.status === 404 ? 'No limit has this name' : 'This is not a limit name',
                h('span', {}, 'It may have been deleted. ', h('a', { href: '#/limits', text: 'Back to the limits' }))));
              return;
            }
            throw error;
          }
          render(limit);
        }, 'Cannot read the limit:');
      },
    };
  },
};

export default {
  title: 'Limits',
  create(ctx) {
    const errors = h('div', { class: 'slot-error' });
    // A refused delete stays shown (the list's refresh clears only its own errors).
    const actionError = h('div', { class: 'slot-error', id: 'limits-action-error' });
    const list = h('div', { id: 'limits-table' });
    const el = h('section', { id: 'view-limits' },
      h('div', { class: 'view-head' },
        h('div', {},
          h('h1', { text: 'Limits' }),
          h('p', { class: 'subtitle', text: 'Named limits: how many jobs sharing a key may run at once and start per period, across every worker.' }))),
      errors,
      actionError,
      h('div', { class: 'panel panel-flush' }, list));

    async function remove(name) {
      const asked = await ctx.confirm({
        title: `Delete the limit ${name}?`,
        text: 'Jobs stamped with its keys no longer wait for it. A queue or kind that still names it has to drop it first.',
        ok: 'Delete limit',
        danger: true,
      });
      if (!asked) return;
      await ctx.guard(actionError, async () => {
        await api.limits.remove(name);
        ctx.notify(`Limit ${name} deleted.`);
        await ctx.refreshNow();
      }, `Cannot delete the limit ${name}:`);
    }

    return {
      el,
      async refresh() {
        await ctx.guard(errors, async () => {
          const answer = await api.limits.list();
          const limits = answer.limits || [];
          // What each limit uses now: one call per limit (a limit deleted meanwhile shows "—").
          const usage = await Promise.all(limits.slice(0, USAGE_MAX).map((limit) => api.limits.get(limit.name)
            .then((detail) => ({ inUse: detail.in_use || 0, keys: (detail.usage || []).length, full: (detail.usage || []).filter((used) => fullness(detail, used).full).length }))
            .catch((error) => {
              if (error.status === 401 || error.status === 403) throw error;
              return null;
            })));
          const canOperate = ctx.canOperate;
          update(list, JSON.stringify([limits, usage, canOperate]), () => {
            if (!limits.length) {
              return emptyState('No limits',
                h('span', {}, 'Define one with ', h('code', { text: 'conveyor limit set NAME --concurrency 3 --key tenant' }),
                  ' or ', h('code', { text: 'PUT /v1/limits/{name}' }), ', then name it in a queue\'s or kind\'s settings.'));
            }
            return h('div', { class: 'table-wrap' }, h('table', { class: 'table limits-table' },
              h('thead', {}, h('tr', {},
                h('th', { text: 'Limit' }),
                h('th', { text: 'Key' }),
                h('th', { class: 'num', text: 'Concurrency' }),
                h('th', { class: 'num', text: 'Rate' }),
                h('th', { class: 'num', text: 'In use' }),
                h('th', { class: 'num', text: 'Full keys' }),
                h('th', { text: 'Updated' }),
                actionsHeader())),
              h('tbody', {}, limits.map((limit, i) => {
                const used = usage[i];
                // Without a key the limit has one budget: its running jobs against the bound.
                const inUse = !used ? h('span', { class: 'muted', text: '—' })
                  : limit.key ? h('span', {}, num(used.inUse), h('span', { class: 'muted small', text: ` over ${num(used.keys)} key${used.keys === 1 ? '' : 's'}` }))
                    : usageBar(used.inUse, limit.concurrency);
                return h('tr', { dataset: { limit: limit.name } },
                  h('td', {}, h('a', { class: 'strong', href: limitHref(limit.name), text: limit.name })),
                  h('td', { dataset: { col: 'key' } }, keyText(limit)
                    ? h('span', { class: 'mono small', text: keyText(limit) })
                    : h('span', { class: 'muted small', text: 'none (one budget)' })),
                  h('td', { class: 'num', dataset: { col: 'concurrency' }, text: limit.concurrency != null ? num(limit.concurrency) : '—' }),
                  h('td', { class: 'num', dataset: { col: 'rate' }, text: rateRule(limit.rate) || '—' }),
                  h('td', { class: 'num', dataset: { col: 'in-use' } }, inUse),
                  h('td', { class: `num${used && used.full ? ' warn' : ''}`, dataset: { col: 'full' }, text: used ? num(used.full) : '—' }),
                  h('td', {}, when(limit.updated_at)),
                  h('td', { class: 'actions' }, h('button', {
                    class: 'btn btn-small btn-danger-outline', type: 'button',
                    dataset: { action: 'delete-limit' },
                    disabled: !canOperate,
                    title: canOperate ? null : 'Needs the admin role',
                    text: 'Delete',
                    onclick: () => remove(limit.name),
                  })));
              }))));
          });
        }, 'Cannot list limits:');
      },
    };
  },
};
