// DOM building and formatting helpers. Every piece of data from the API reaches the page as a
// text node or an attribute value, never as HTML, so a job payload or error message cannot
// inject markup (and the CSP forbids inline script as a second line of defence).

/**
 * Creates an element. `attrs` keys: `class`, `text`, `on<event>` (listeners), `dataset`,
 * `style` (an object applied through the CSSOM, which the CSP allows, unlike style="...").
 * Everything else becomes an attribute; `false`/`null`/`undefined` values are skipped.
 */
export function h(tag, attrs = {}, ...children) {
  const el = tag.startsWith('svg:')
    ? document.createElementNS('http://www.w3.org/2000/svg', tag.slice(4))
    : document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === false || value === null || value === undefined) continue;
    if (key === 'class') el.setAttribute('class', value);
    else if (key === 'text') el.textContent = String(value);
    else if (key === 'dataset') Object.assign(el.dataset, value);
    else if (key === 'style') Object.assign(el.style, value);
    else if (key.startsWith('on') && typeof value === 'function') el.addEventListener(key.slice(2), value);
    else if (key === 'checked' || key === 'disabled' || key === 'selected' || key === 'value') el[key] = value;
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else if (child instanceof Node) el.appendChild(child);
    else el.appendChild(document.createTextNode(String(child)));
  }
}

/** Replaces the children of `el`. */
export function mount(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/**
 * Replaces the content of `slot` only when `key` (usually the JSON the content was built from)
 * differs from last time. Live views rebuild every second; skipping identical rebuilds keeps
 * focus, text selection and hover where the user left them.
 */
export function update(slot, key, build) {
  if (slot.dataset.key === key) return false;
  slot.dataset.key = key;
  mount(slot, build());
  return true;
}

const STATES = ['available', 'scheduled', 'running', 'retryable', 'dead', 'completed', 'cancelled', 'expired', 'blocked'];
export { STATES };

export function stateBadge(state) {
  if (!state) return h('span', { class: 'badge badge-none', text: '—' });
  return h('span', { class: `badge state-${state}`, text: state });
}

/** The header of a column of buttons: no visible text, but a name for screen readers. */
export function actionsHeader() {
  return h('th', { class: 'actions' }, h('span', { class: 'visually-hidden', text: 'Actions' }));
}

export function link(href, ...children) {
  return h('a', { href }, ...children);
}

export function shortId(id) {
  return id ? `${id.slice(0, 8)}…${id.slice(-4)}` : '—';
}

export function jobLink(id) {
  return h('a', { href: `#/jobs/${encodeURIComponent(id)}`, class: 'mono', title: id, text: shortId(id) });
}

const numberFormat = new Intl.NumberFormat('en');
export function num(n) {
  return typeof n === 'number' ? numberFormat.format(n) : '—';
}

/** "850 ms", "12 s", "3 m 20 s", "2 h 5 m", "3 d 4 h". */
export function duration(ms) {
  if (typeof ms !== 'number' || !Number.isFinite(ms)) return '—';
  const abs = Math.abs(ms);
  if (abs < 1000) return `${Math.round(abs)} ms`;
  const s = Math.floor(abs / 1000);
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return s % 60 ? `${m} m ${s % 60} s` : `${m} m`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return m % 60 ? `${hours} h ${m % 60} m` : `${hours} h`;
  const d = Math.floor(hours / 24);
  return hours % 24 ? `${d} d ${hours % 24} h` : `${d} d`;
}

/** "5 s ago" / "in 2 m"; the exact UTC time goes into the element's title. */
export function when(iso, now = Date.now()) {
  if (!iso) return h('span', { class: 'muted', text: '—' });
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return h('span', { text: iso });
  const delta = t - now;
  const text = Math.abs(delta) < 1000 ? 'now' : delta < 0 ? `${duration(-delta)} ago` : `in ${duration(delta)}`;
  return h('time', { datetime: iso, title: localTime(iso), text });
}

export function localTime(iso) {
  const t = new Date(iso);
  if (Number.isNaN(t.getTime())) return String(iso);
  return t.toLocaleString(undefined, {
    year: 'numeric', month: 'short', day: 'numeric',
    hour: '2-digit', minute: '2-digit', second: '2-digit',
  });
}

export function prettyJson(value) {
  return JSON.stringify(value, null, 2);
}

/** An inline error box for a failed API call (or any Error). */
export function errorBox(error, prefix = '') {
  const message = error && error.message ? error.message : String(error);
  return h('div', { class: 'alert alert-error', role: 'alert' },
    h('strong', { text: prefix || 'Something went wrong' }), ' ', message);
}

export function emptyState(title, detail) {
  return h('div', { class: 'empty' },
    h('p', { class: 'empty-title', text: title }),
    detail ? h('p', { class: 'empty-detail' }, detail) : null);
}

/** The `#/path?query` part of the location, parsed. */
export function currentRoute() {
  const raw = location.hash.replace(/^#/, '') || '/';
  const [path, query = ''] = raw.split('?');
  return { path: path || '/', params: new URLSearchParams(query) };
}

export function routeHref(path, params = {}) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== '') query.set(key, value);
  }
  const qs = query.toString();
  return `#${path}${qs ? `?${qs}` : ''}`;
}

/** Re-renders every relative time under `root` (they are built once, but age every second). */
export function refreshTimes(root, now = Date.now()) {
  for (const el of root.querySelectorAll('time[datetime]')) {
    const fresh = when(el.dateTime, now);
    if (el.textContent !== fresh.textContent) el.textContent = fresh.textContent;
  }
}
