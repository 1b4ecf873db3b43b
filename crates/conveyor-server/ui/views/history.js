// History from the store (`GET /v1/stats`): the spans the overview and the Kinds view offer,
// a picker for them, and a loader that asks again only when the span changes or the last
// answer is older than REFRESH_MS (the server keeps minutes; asking every second gains nothing).

import { h, duration } from '../dom.js';
import * as api from '../api.js';

export const RANGES = [
  { id: '1h', label: '1 h', spanMs: 3600 * 1000, step: '1m', ago: '1 h ago' },
  { id: '24h', label: '24 h', spanMs: 24 * 3600 * 1000, step: '15m', ago: '24 h ago' },
  { id: '7d', label: '7 d', spanMs: 7 * 24 * 3600 * 1000, step: '2h', ago: '7 d ago' },
];

const REFRESH_MS = 15 * 1000;

export function rangeOf(id) {
  return RANGES.find((r) => r.id === id) || RANGES[0];
}

/** The span last picked on this page (kept in localStorage under `key`), else `fallback`. */
export function savedRange(key, fallback, extra = []) {
  let id = fallback;
  try { id = localStorage.getItem(key) || fallback; } catch { /* private mode */ }
  return [...extra, ...RANGES].some((r) => r.id === id) ? id : fallback;
}

/** Keeps the span picked on this page for the next visit. */
export function saveRange(key, id) {
  try { localStorage.setItem(key, id); } catch { /* private mode: not kept */ }
}

/**
 * Buttons for the spans (and `extra` ones before them, like the overview's "Live"); the
 * current one is pressed. `onPick(id)` is called with the chosen id.
 */
export function rangePicker(current, onPick, extra = []) {
  const choices = [...extra, ...RANGES];
  return h('div', { class: 'range-picker', role: 'group', 'aria-label': 'Time span' },
    choices.map((range) => h('button', {
      type: 'button',
      class: `btn btn-small${range.id === current ? ' btn-pressed' : ''}`,
      dataset: { range: range.id },
      'aria-pressed': range.id === current ? 'true' : 'false',
      text: range.label,
      onclick: () => onPick(range.id),
    })));
}

/** Keeps the last answer for one span; `load()` asks again when due. */
export function statsLoader(filters = {}) {
  let key = null;
  let at = 0;
  let inFlight = null;
  const loader = {
    report: null,
    error: null,
    /** Loads `rangeId` when it changed or the answer is stale; resolves to whether it did. */
    async load(rangeId, { force = false } = {}) {
      const wanted = JSON.stringify([rangeId, filters]);
      if (!force && wanted === key && Date.now() - at < REFRESH_MS) return false;
      if (inFlight) return inFlight;
      const range = rangeOf(rangeId);
      const to = new Date();
      const from = new Date(to.getTime() - range.spanMs);
      inFlight = (async () => {
        try {
          const report = await api.stats.get({ from: from.toISOString(), to: to.toISOString(), step: range.step, ...filters });
          loader.report = report;
          loader.error = null;
        } catch (error) {
          loader.error = error;
        }
        key = wanted;
        at = Date.now();
        inFlight = null;
        return true;
      })();
      return inFlight;
    },
  };
  return loader;
}

/** A duration estimated from the history, in milliseconds: "12 ms", "1.4 s", "3 m". */
export function latencyText(ms) {
  if (typeof ms !== 'number' || !Number.isFinite(ms)) return '—';
  if (ms < 1) return '<1 ms';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 1 : 0)} s`;
  return duration(ms);
}

/** A failure rate (0..1) as "4.2 %", "—" when nothing ended. */
export function rateText(rate) {
  if (typeof rate !== 'number') return '—';
  const percent = rate * 100;
  return `${percent.toFixed(percent > 0 && percent < 10 ? 1 : 0)} %`;
}

/** "12/min", "0.4/min", "1,250/min". */
export function perMinuteText(value) {
  if (!(value > 0)) return '0/min';
  if (value >= 100) return `${Math.round(value).toLocaleString()}/min`;
  if (value >= 10) return `${value.toFixed(1)}/min`;
  return `${value.toFixed(2)}/min`;
}
