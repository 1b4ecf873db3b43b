// Small time-series charts drawn as inline SVG: the plot is a stretched SVG (lines keep their
// width through `vector-effect: non-scaling-stroke` in the stylesheet), the labels are HTML
// around it so text is never distorted. No chart library, no canvas: it scales with the layout
// and prints crisply in screenshots.

import { h } from './dom.js';

const W = 1000;
const H = 200;

/** A round upper bound for the y axis: 1, 2, 5, 10, 20, 50, ... at least `value`. */
export function niceMax(value) {
  if (!(value > 0)) return 1;
  const exponent = Math.floor(Math.log10(value));
  const base = 10 ** exponent;
  for (const step of [1, 2, 5, 10]) {
    if (value <= step * base) return step * base;
  }
  return 10 * base;
}

/**
 * A line chart of `points` ([{t, v}], t in ms) over the last `windowMs` before `now`.
 * `format` renders a y value; `tone` picks the colour class (`ok`, `bad`).
 */
export function lineChart({ points, windowMs, now, format, tone = 'ok', label, startLabel, emptyText = 'Collecting data…', minPoints }) {
  const start = now - windowMs;
  const visible = points.filter((p) => p.t >= start);
  const max = niceMax(Math.max(0, ...visible.map((p) => p.v)));
  const x = (t) => ((t - start) / windowMs) * W;
  const y = (v) => H - (v / max) * (H - 4);

  const svg = h('svg:svg', {
    class: `chart-plot tone-${tone}`,
    viewBox: `0 0 ${W} ${H}`,
    preserveAspectRatio: 'none',
    role: 'img',
    'aria-label': label,
  });
  for (const fraction of [0.25, 0.5, 0.75]) {
    svg.appendChild(h('svg:line', { class: 'chart-grid', x1: 0, x2: W, y1: H * fraction, y2: H * fraction }));
  }
  if (visible.length === 1) {
    // One point: a short mark where it is (a circle would be stretched with the plot).
    const [p] = visible;
    const at = x(p.t);
    svg.appendChild(h('svg:polyline', { class: 'chart-line', points: `${(at - 8).toFixed(1)},${y(p.v).toFixed(1)} ${at.toFixed(1)},${y(p.v).toFixed(1)}` }));
  }
  if (visible.length >= 2) {
    const coords = visible.map((p) => `${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`);
    const first = x(visible[0].t).toFixed(1);
    const last = x(visible[visible.length - 1].t).toFixed(1);
    svg.appendChild(h('svg:path', { class: 'chart-area', d: `M${first},${H} L${coords.join(' L')} L${last},${H} Z` }));
    svg.appendChild(h('svg:polyline', { class: 'chart-line', points: coords.join(' ') }));
  }

  const minutes = Math.max(1, Math.round(windowMs / 60000));
  const sum = visible.reduce((total, p) => total + (Number.isFinite(p.v) ? p.v : 0), 0);
  return h('div', { class: 'chart', dataset: { points: String(visible.length), sum: String(sum) } },
    h('div', { class: 'chart-y' },
      h('span', { text: format(max) }),
      h('span', { text: format(max / 2) }),
      h('span', { text: '0' })),
    h('div', { class: 'chart-body' },
      svg,
      visible.length < (minPoints || 2) ? h('div', { class: 'chart-empty', text: emptyText }) : null,
      h('div', { class: 'chart-x' },
        h('span', { text: startLabel || `${minutes} min ago` }),
        h('span', { text: 'now' }))));
}
