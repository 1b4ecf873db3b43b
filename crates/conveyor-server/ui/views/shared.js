// Pieces the job list and the dead-letter view share: filter controls, the cursor pager, the
// live/paused switch and the "last error" cell.

import { h, mount } from '../dom.js';

/**
 * A queue picker that lists the queues the shell last saw (plus the current choice, which may
 * be a queue without jobs yet). `onChange(value)` gets '' for "all queues".
 */
export function queueSelect(ctx, value, onChange) {
  const select = h('select', { id: 'filter-queue', name: 'queue', onchange: () => onChange(select.value) });
  let shown = '';
  function sync() {
    const names = (ctx.queues || []).map((q) => q.name);
    if (select.value && !names.includes(select.value)) names.push(select.value);
    if (value && !names.includes(value)) names.push(value);
    names.sort();
    const key = names.join('\n');
    if (key === shown) return;
    shown = key;
    const current = select.value || value;
    mount(select,
      h('option', { value: '', text: 'All queues' }),
      names.map((name) => h('option', { value: name, text: name })));
    select.value = current || '';
  }
  sync();
  return { el: select, sync };
}

/** A text filter applied on Enter or when the field loses focus (not on every keystroke). */
export function textFilter({ id, name, value, placeholder, onChange, type = 'search' }) {
  let applied = value || '';
  const input = h('input', {
    id, name, type, value: applied, placeholder, spellcheck: 'false', autocomplete: 'off',
  });
  const apply = () => {
    const next = input.value.trim();
    if (next === applied) return;
    applied = next;
    onChange(next);
  };
  input.addEventListener('change', apply);
  input.addEventListener('keydown', (event) => {
    if (event.key === 'Enter') apply();
  });
  /** Sets the shown and applied value without calling `onChange` (clearing the filters). */
  input.resetTo = (next = '') => {
    applied = next;
    input.value = next;
  };
  return input;
}

export function field(label, control) {
  return h('label', { class: 'field' }, h('span', { class: 'field-label', text: label }), control);
}

/**
 * Cursor paging over the API's `cursor`/`next`: the API only pages forward (newest first), so
 * the cursors of the pages already seen are kept to go back, or straight to the first page.
 */
export function pager(onMove) {
  const stack = [];
  let cursor = null;
  let next = null;
  const first = h('button', { class: 'btn btn-small', type: 'button', id: 'page-first', text: 'First page', onclick: () => {
    stack.length = 0;
    cursor = null;
    onMove();
  } });
  const newer = h('button', { class: 'btn btn-small', type: 'button', id: 'page-newer', text: '← Previous', onclick: () => {
    cursor = stack.pop() ?? null;
    onMove();
  } });
  const older = h('button', { class: 'btn btn-small', type: 'button', id: 'page-older', text: 'Next page →', onclick: () => {
    if (!next) return;
    stack.push(cursor);
    cursor = next;
    onMove();
  } });
  const label = h('span', { class: 'muted small pager-label' });
  const el = h('div', { class: 'pager' }, first, newer, label, older);
  return {
    el,
    get after() { return cursor; },
    reset() {
      stack.length = 0;
      cursor = null;
      next = null;
    },
    /** Called with each page answered for the current cursor. */
    show(page, count) {
      next = page.next || null;
      first.disabled = stack.length === 0;
      newer.disabled = stack.length === 0;
      older.disabled = !next;
      const number = stack.length + 1;
      label.textContent = count === 0 ? `Page ${number}` : `Page ${number} · ${count} job${count === 1 ? '' : 's'}`;
      el.hidden = stack.length === 0 && !next;
    },
  };
}

/**
 * The live/paused switch of a list that refreshes every second. A list is paused by hand (the
 * button) or by selecting rows, so nothing moves under the cursor while choosing what to act
 * on; clearing the selection resumes it unless it was paused by hand. Pressing "Paused" goes
 * live again even with rows selected (they stay selected by id). `onResume` is called when the
 * list goes live again, to refresh it at once.
 */
export function liveToggle(id, onResume) {
  let manual = false;
  let auto = false;
  const button = h('button', { class: 'btn btn-small live-toggle', type: 'button', id, onclick: () => {
    if (manual || auto) {
      manual = false;
      auto = false;
      sync();
      onResume();
    } else {
      manual = true;
      sync();
    }
  } });
  function sync() {
    const paused = manual || auto;
    button.textContent = paused ? 'Paused' : 'Live';
    button.dataset.state = paused ? 'paused' : 'live';
    button.setAttribute('aria-pressed', String(paused));
    button.title = paused
      ? `Not updating${auto && !manual ? ' while rows are selected' : ''}: press to go live`
      : 'Updating every second: press to pause';
  }
  sync();
  return {
    el: button,
    get paused() { return manual || auto; },
    /** The selection now holds `count` rows: any selection pauses, none resumes (unless paused by hand). */
    selection(count) {
      const was = manual || auto;
      auto = count > 0;
      sync();
      if (was && !(manual || auto)) onResume();
    },
  };
}

/** A labelled field with a slot for the server's complaint about its value. */
export function checkedField(label, control) {
  const error = h('span', { class: 'field-error', role: 'alert', id: control.id ? `${control.id}-error` : null });
  const el = h('label', { class: 'field' }, h('span', { class: 'field-label', text: label }), control, error);
  return {
    el,
    /** Shows `message` (or clears it with null) next to the field. */
    set(message) {
      if (message) {
        error.textContent = message;
        control.setAttribute('aria-invalid', 'true');
      } else {
        error.textContent = '';
        control.removeAttribute('aria-invalid');
      }
    },
  };
}

export function lastError(job) {
  const errors = job.errors || [];
  if (!errors.length) return h('span', { class: 'muted', text: '—' });
  const last = errors[errors.length - 1];
  return h('span', { class: 'last-error', title: last.message },
    h('span', { class: 'error-class', text: last.class }), ' ', last.message);
}

/** Makes every `tr[data-job]` under `el` open its job when clicked outside its controls. */
export function rowLinks(el) {
  el.addEventListener('click', (event) => {
    if (event.target.closest('a, button, input, label, select')) return;
    if (String(window.getSelection() || '')) return;
    const row = event.target.closest('tr[data-job]');
    if (row) location.hash = `#/jobs/${encodeURIComponent(row.dataset.job)}`;
  });
}
