// Workflows: the list (`GET /v1/flows`) and one flow drawn as its graph (`GET /v1/flows/{id}`):
// steps in columns by depth (a step sits one column right of its deepest parent), edges from
// parents to children, each step coloured by its state and linked to its job's page.

import { h, update, when, emptyState, routeHref, jobLink, prettyJson } from '../dom.js';
import * as api from '../api.js';

const FLOW_STATES = ['running', 'completed', 'failed', 'compensating', 'compensated', 'cancelled'];
const NODE_W = 168;
const NODE_H = 52;
const GAP_X = 56;
const GAP_Y = 16;

/** Badge class of a flow or step state: reuses the job-state colours where they mean the same. */
function stateClass(state) {
  const map = {
    running: 'state-running', active: 'state-running', waiting: 'state-scheduled',
    pending: 'state-available', completed: 'state-completed', compensated: 'state-completed',
    failed: 'state-dead', compensating: 'state-retryable', skipped: 'state-cancelled',
    cancelled: 'state-cancelled',
  };
  return map[state] || 'badge-none';
}

function flowBadge(state) {
  return h('span', { class: `badge ${stateClass(state)}`, text: state });
}

/** Each step's column: the length of the longest path from a root to it. */
function layers(steps) {
  const byName = new Map(steps.map((s) => [s.name, s]));
  const depth = new Map();
  const visit = (step, seen) => {
    if (depth.has(step.name)) return depth.get(step.name);
    if (seen.has(step.name)) return 0;
    seen.add(step.name);
    let d = 0;
    for (const parent of step.after || []) {
      const p = byName.get(parent);
      if (p) d = Math.max(d, visit(p, seen) + 1);
    }
    depth.set(step.name, d);
    return d;
  };
  for (const step of steps) visit(step, new Set());
  return depth;
}

function graph(flow) {
  const steps = flow.steps || [];
  const depth = layers(steps);
  const columns = [];
  for (const step of steps) {
    const d = depth.get(step.name) || 0;
    (columns[d] = columns[d] || []).push(step);
  }
  const pos = new Map();
  columns.forEach((column, x) => column.forEach((step, y) => {
    pos.set(step.name, { x: 8 + x * (NODE_W + GAP_X), y: 8 + y * (NODE_H + GAP_Y) });
  }));
  const width = 16 + columns.length * (NODE_W + GAP_X) - GAP_X;
  const height = 16 + Math.max(1, ...columns.map((c) => c.length)) * (NODE_H + GAP_Y) - GAP_Y;
  const edges = [];
  for (const step of steps) {
    const to = pos.get(step.name);
    for (const parent of step.after || []) {
      const from = pos.get(parent);
      if (!from || !to) continue;
      const x1 = from.x + NODE_W; const y1 = from.y + NODE_H / 2;
      const x2 = to.x; const y2 = to.y + NODE_H / 2;
      const mid = (x1 + x2) / 2;
      edges.push(h('svg:path', { class: 'flow-edge', d: `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2},${y2}` }));
    }
  }
  const nodes = steps.map((step) => {
    const { x, y } = pos.get(step.name);
    const label = step.kind ? step.kind : (step.wait ? `wait: ${step.wait.signal}` : '');
    const box = h('svg:g', { class: `flow-node ${stateClass(step.state)}`, dataset: { step: step.name, state: step.state } },
      h('svg:title', { text: `${step.name} — ${step.state}${step.error ? `: ${step.error.class}: ${step.error.message}` : ''}` }),
      h('svg:rect', { x, y, width: NODE_W, height: NODE_H, rx: 8 }),
      h('svg:text', { x: x + 10, y: y + 20, class: 'flow-node-name', text: step.name.length > 22 ? `${step.name.slice(0, 21)}…` : step.name }),
      h('svg:text', { x: x + 10, y: y + 38, class: 'flow-node-detail', text: `${step.state}${step.progress && step.state === 'active' ? ` ${step.progress.percent}%` : ''} · ${label}`.slice(0, 30) }));
    // A step's job exists once the step has started; before that its page would be empty.
    return step.job_id && step.job_state
      ? h('svg:a', { href: `#/jobs/${encodeURIComponent(step.job_id)}`, 'aria-label': `step ${step.name}: job` }, box)
      : box;
  });
  return h('div', { class: 'flow-graph-wrap' },
    h('svg:svg', { class: 'flow-graph', id: 'flow-graph', width, height, viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': 'The flow as a graph of its steps' },
      edges, nodes));
}

function stepTable(flow) {
  return h('div', { class: 'table-wrap' }, h('table', { class: 'table', id: 'flow-steps' },
    h('thead', {}, h('tr', {}, ['Step', 'State', 'Runs', 'After', 'Tries', 'Result or error'].map((t) => h('th', { text: t })))),
    h('tbody', {}, (flow.steps || []).map((s) => h('tr', { dataset: { step: s.name } },
      h('td', { class: 'strong', text: s.name }),
      h('td', {}, flowBadge(s.state), s.compensation ? h('div', { class: 'small muted', text: `compensation ${s.compensation}` }) : null),
      h('td', {}, s.job_id && s.job_state ? jobLink(s.job_id) : null, ' ', s.kind || (s.wait ? `wait for “${s.wait.signal}”` : '')),
      h('td', { class: 'small', text: (s.after || []).join(', ') || '—' }),
      h('td', { text: String(s.attempts || 0) }),
      h('td', { class: 'small' },
        s.error ? h('span', { class: 'error-class', text: `${s.error.class}: ${s.error.message}` }) : null,
        s.result !== undefined && s.result !== null ? h('code', { text: prettyJson(s.result).slice(0, 120) }) : null,
        s.progress && s.state === 'active' ? h('span', { text: `${s.progress.percent}% ${s.progress.message || ''}` }) : null))))));
}

export const flowView = {
  title: 'Flow',
  create(ctx, _params, id) {
    const errors = h('div', { class: 'slot-error' });
    const body = h('div', { id: 'flow-body' });
    const el = h('section', { id: 'view-flow', dataset: { flow: id } }, errors, body);
    return {
      el,
      async refresh() {
        await ctx.guard(errors, async () => {
          const flow = await api.flows.get(id);
          update(body, JSON.stringify(flow), () => [
            h('div', { class: 'view-head' },
              h('div', {},
                h('h1', {}, flow.name || 'Flow', ' ', flowBadge(flow.state)),
                h('p', { class: 'subtitle mono', text: flow.id }),
                h('p', { class: 'small' }, 'created ', when(flow.created_at),
                  flow.finished_at ? [' · finished ', when(flow.finished_at)] : null,
                  flow.failed_step ? ` · failed at ${flow.failed_step}` : '',
                  ` · on failure: ${flow.on_failure}`))),
            h('div', { class: 'panel' }, graph(flow)),
            h('div', { class: 'panel panel-flush' }, stepTable(flow)),
          ]);
        }, 'Cannot read the flow:');
      },
    };
  },
};

export default {
  title: 'Flows',
  create(ctx, params) {
    const errors = h('div', { class: 'slot-error' });
    const list = h('div', { id: 'flows-table' });
    const filter = h('select', {
      id: 'flow-state-filter',
      'aria-label': 'Flow state',
      onchange: () => {
        ctx.replaceRoute(routeHref('/flows', filter.value ? { state: filter.value } : {}));
        ctx.refreshNow();
      },
    }, h('option', { value: '', text: 'Every state' }),
    FLOW_STATES.map((s) => h('option', { value: s, text: s, selected: params.state === s })));
    const el = h('section', { id: 'view-flows' },
      h('div', { class: 'view-head' },
        h('div', {},
          h('h1', { text: 'Flows' }),
          h('p', { class: 'subtitle', text: 'Workflows: steps that start as their parents finish.' })),
        h('div', { class: 'toolbar' }, filter)),
      errors,
      h('div', { class: 'panel panel-flush' }, list));
    return {
      el,
      async refresh() {
        await ctx.guard(errors, async () => {
          const answer = await api.flows.list(filter.value ? { state: filter.value, limit: 100 } : { limit: 100 });
          const flows = answer.flows || [];
          update(list, JSON.stringify(flows), () => {
            if (!flows.length) {
              return emptyState('No flows', h('span', {}, 'Create one with ', h('code', { text: 'POST /v1/flows' }), ' or ', h('code', { text: 'conveyor flow create FILE' }), '.'));
            }
            return h('div', { class: 'table-wrap' }, h('table', { class: 'table' },
              h('thead', {}, h('tr', {}, ['Flow', 'State', 'Steps', 'Created'].map((t) => h('th', { text: t })))),
              h('tbody', {}, flows.map((f) => h('tr', { dataset: { flow: f.id } },
                h('td', {}, h('a', { href: `#/flows/${encodeURIComponent(f.id)}`, class: 'strong', text: f.name || f.id.slice(0, 8) }),
                  h('div', { class: 'muted small mono', text: f.id })),
                h('td', {}, flowBadge(f.state), f.failed_step ? h('div', { class: 'small muted', text: `at ${f.failed_step}` }) : null),
                h('td', { class: 'small', text: Object.entries(f.step_counts || {}).map(([k, v]) => `${v} ${k}`).join(' · ') }),
                h('td', {}, when(f.created_at)))))));
          });
        }, 'Cannot list flows:');
      },
    };
  },
};
