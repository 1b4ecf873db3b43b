// The dashboard's shell: session check and login, the hash router (`#/jobs?queue=mail`), the
// polling loop that keeps every view live, and the shared confirm dialog and notices.

import * as api from './api.js';
import { h, mount, currentRoute, num, errorBox, refreshTimes } from './dom.js';
import { loginView } from './views/login.js';
import overview from './views/overview.js';
import jobsView from './views/jobs.js';
import jobView from './views/job.js';
import deadView from './views/dead.js';
import workersView from './views/workers.js';
import schedulesView from './views/schedules.js';
import kindsView from './views/kinds.js';
import sourcesView from './views/sources.js';
import limitsView, { limitView } from './views/limits.js';
import flowsView, { flowView } from './views/flows.js';

// A CSP violation means some part of the page silently did not work; make it visible in the
// console and countable (the end-to-end test asserts there are none).
let cspViolations = 0;
document.addEventListener('securitypolicyviolation', (event) => {
  cspViolations += 1;
  document.documentElement.dataset.cspViolations = String(cspViolations);
  console.error('CSP violation', event.violatedDirective, event.blockedURI);
});

const POLL_MS = 1000;
const HIDDEN_POLL_MS = 5000;
const HISTORY_MS = 5 * 60 * 1000;

const NAV = [
  { id: 'overview', label: 'Overview', href: '#/' },
  { id: 'jobs', label: 'Jobs', href: '#/jobs' },
  { id: 'kinds', label: 'Kinds', href: '#/kinds' },
  { id: 'limits', label: 'Limits', href: '#/limits' },
  { id: 'dead', label: 'Dead letters', href: '#/dead' },
  { id: 'workers', label: 'Workers', href: '#/workers' },
  { id: 'schedules', label: 'Schedules', href: '#/schedules' },
  { id: 'flows', label: 'Flows', href: '#/flows' },
  { id: 'sources', label: 'Sources', href: '#/sources' },
];

const root = document.getElementById('root');
const state = {
  session: null,
  view: null,
  viewKey: null,
  timer: null,
  ticking: null,
  again: false,
  history: [],
  queues: null,
  // Circuit breakers from the same `/v1/queues` answer (empty on a server without them).
  breakers: [],
  queuesError: null,
  // Attempt counters from /metrics: null until read, false once the server turned out not to
  // serve them (or not to this role), so they are not asked for again.
  attempts: null,
  lastUpdate: 0,
  shell: null,
};

/** Successive `/v1/queues` answers, from which the overview computes rates client-side. */
function recordSample(queues) {
  const now = Date.now();
  const totals = { available: 0, scheduled: 0, running: 0, retryable: 0, dead: 0, completed: 0, cancelled: 0, expired: 0, blocked: 0 };
  const perQueue = {};
  for (const queue of queues) {
    for (const key of Object.keys(totals)) totals[key] += queue[key] || 0;
    perQueue[queue.name] = { completed: queue.completed || 0, dead: queue.dead || 0 };
  }
  state.history.push({ t: now, totals, perQueue, attempts: state.attempts || null });
  while (state.history.length && state.history[0].t < now - HISTORY_MS - 5000) state.history.shift();
}

async function sampleMetrics() {
  if (state.attempts === false) return;
  try {
    state.attempts = await api.attemptCounters();
  } catch (error) {
    if (api.notAvailable(error) || error.status === 401 || error.status === 403) state.attempts = false;
  }
}

async function sampleQueues() {
  const metrics = sampleMetrics();
  try {
    const answer = await api.queues.stats();
    await metrics;
    state.queues = answer.queues || [];
    state.breakers = answer.breakers || [];
    state.queuesError = null;
    recordSample(state.queues);
    state.lastUpdate = Date.now();
  } catch (error) {
    state.queuesError = error;
  }
}

const ctx = {
  get session() { return state.session; },
  get queues() { return state.queues; },
  get breakers() { return state.breakers; },
  get queuesError() { return state.queuesError; },
  get history() { return state.history; },
  historyMs: HISTORY_MS,
  /** Whether the signed-in role may change things (replay, discard, pause, circuits, cancel). */
  get canOperate() { return !state.session || state.session.role === 'admin'; },
  refreshNow,
  /** Changes the address without leaving the view (filters), keeping it bookmarkable. */
  replaceRoute(hash) {
    history.replaceState(null, '', hash);
    state.viewKey = location.hash || '#/';
  },
  confirm,
  notify,
  /** How a failed call is shown: a refusal by role is explained, anything else is an error. */
  problem(error, prefix) {
    if (error.status === 403) {
      const role = state.session ? state.session.role : 'this';
      return h('div', { class: 'alert alert-info', role: 'status' },
        `The ${role} role may not see or do this. Sign in with an admin token to use it.`);
    }
    return errorBox(error, prefix);
  },
  /** Runs `fn`; shows its error (or clears the previous one) in `slot`. */
  async guard(slot, fn, prefix) {
    try {
      const result = await fn();
      if (slot.dataset.error) {
        delete slot.dataset.error;
        slot.replaceChildren();
      }
      return result;
    } catch (error) {
      if (error.status === 401) return undefined;
      const key = `${error.status}:${error.message}`;
      if (slot.dataset.error !== key) {
        slot.dataset.error = key;
        mount(slot, ctx.problem(error, prefix));
      }
      return undefined;
    }
  },
};

function routeView(path) {
  if (path === '/' || path === '') return { def: overview, nav: 'overview' };
  if (path === '/jobs') return { def: jobsView, nav: 'jobs' };
  const job = path.match(/^\/jobs\/([^/]+)$/);
  if (job) return { def: jobView, nav: 'jobs', arg: decodeURIComponent(job[1]) };
  if (path === '/dead') return { def: deadView, nav: 'dead' };
  if (path === '/workers') return { def: workersView, nav: 'workers' };
  if (path === '/schedules') return { def: schedulesView, nav: 'schedules' };
  if (path === '/kinds') return { def: kindsView, nav: 'kinds' };
  if (path === '/flows') return { def: flowsView, nav: 'flows' };
  if (path === '/sources') return { def: sourcesView, nav: 'sources' };
  if (path === '/limits') return { def: limitsView, nav: 'limits' };
  const limit = path.match(/^\/limits\/([^/]+)$/);
  if (limit) return { def: limitView, nav: 'limits', arg: decodeURIComponent(limit[1]) };
  const flow = path.match(/^\/flows\/([^/]+)$/);
  if (flow) return { def: flowView, nav: 'flows', arg: decodeURIComponent(flow[1]) };
  return null;
}

function showRoute() {
  if (!state.shell) return;
  const { path, params } = currentRoute();
  const key = location.hash || '#/';
  if (key === state.viewKey) return;
  state.viewKey = key;
  setMenu(false);
  if (state.view && state.view.destroy) state.view.destroy();
  const found = routeView(path);
  for (const link of state.shell.nav.querySelectorAll('a[data-nav]')) {
    link.classList.toggle('active', Boolean(found) && link.dataset.nav === found.nav);
    if (found && link.dataset.nav === found.nav) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  if (!found) {
    state.view = null;
    mount(state.shell.view, h('section', { class: 'view' },
      h('h1', { text: 'Page not found' }),
      h('p', {}, 'There is nothing at this address. ', h('a', { href: '#/', text: 'Go to the overview' }))));
    return;
  }
  state.view = found.def.create(ctx, params, found.arg);
  state.view.el.classList.add('view');
  mount(state.shell.view, state.view.el);
  document.title = `${state.view.title || found.def.title} · Conveyor`;
  state.shell.view.focus({ preventScroll: true });
  refreshNow();
}

function buildShell() {
  const nav = h('nav', { class: 'nav', 'aria-label': 'Sections' },
    NAV.map((item) => h('a', { href: item.href, dataset: { nav: item.id } },
      h('span', { class: 'nav-label', text: item.label }),
      item.id === 'dead' ? h('span', { class: 'nav-count', id: 'nav-dead-count', hidden: true }) : null)));
  const live = h('span', { class: 'live', id: 'live' }, h('span', { class: 'live-dot' }), h('span', { class: 'live-text', text: 'Connecting…' }));
  const user = h('div', { class: 'user' });
  const view = h('main', { class: 'content', id: 'view', tabindex: '-1' });
  // On narrow screens the sidebar hides behind this button (CSS shows it only there).
  const menu = h('button', {
    class: 'btn btn-small menu-toggle', id: 'menu-toggle', type: 'button',
    'aria-controls': 'sidebar', 'aria-expanded': 'false', text: 'Menu',
    onclick: () => setMenu(menu.getAttribute('aria-expanded') !== 'true'),
  });
  const shell = h('div', { class: 'app' },
    h('aside', { class: 'sidebar', id: 'sidebar' },
      h('a', { class: 'brand', href: '#/' },
        h('img', { src: '/ui/favicon.svg', alt: '', width: 24, height: 24 }),
        h('span', { text: 'Conveyor' })),
      nav,
      h('div', { class: 'sidebar-foot' }, live)),
    h('div', { class: 'main' },
      h('header', { class: 'topbar' }, menu, h('div', { class: 'topbar-spacer' }), user),
      view),
    h('div', { class: 'toasts', id: 'toasts', role: 'status', 'aria-live': 'polite' }));
  state.shell = { root: shell, nav, live, user, view, menu };
  renderUser();
  mount(root, shell);
}

/** Opens or closes the sidebar on narrow screens (wider ones always show it). */
function setMenu(open) {
  if (!state.shell) return;
  state.shell.menu.setAttribute('aria-expanded', open ? 'true' : 'false');
  state.shell.root.classList.toggle('nav-open', open);
}

function renderUser() {
  const session = state.session;
  const children = [
    h('span', { class: 'user-name', title: 'Signed in as', text: session.name }),
    h('span', { class: `role role-${session.role}`, text: session.role }),
  ];
  if (session.auth) {
    children.push(h('button', {
      class: 'btn btn-small', id: 'logout', type: 'button', text: 'Sign out',
      onclick: async () => {
        try {
          await api.logout();
        } catch (error) {
          notify(`Sign-out failed: ${error.message}`, 'error');
          return;
        }
        showLogin('You have signed out.');
      },
    }));
  } else {
    children.push(h('span', { class: 'muted small', title: 'This server runs without access control', text: 'no sign-in required' }));
  }
  mount(state.shell.user, children);
}

function renderLive() {
  if (!state.shell) return;
  const live = state.shell.live;
  const text = live.querySelector('.live-text');
  if (state.queuesError && state.queuesError.status !== 403) {
    live.className = 'live live-down';
    text.textContent = state.queuesError.status === 0 ? 'Server unreachable — retrying' : 'Update failed — retrying';
  } else if (state.queuesError && state.queuesError.status === 403) {
    // A producer's token reads its own jobs (the Jobs page), not the queues' counts.
    live.className = 'live live-up';
    text.textContent = 'Your own jobs only (see Jobs)';
  } else if (state.lastUpdate) {
    live.className = 'live live-up';
    text.textContent = `Live · updated ${new Date(state.lastUpdate).toLocaleTimeString()}`;
  }
  const badge = document.getElementById('nav-dead-count');
  const latest = state.history[state.history.length - 1];
  if (badge && latest) {
    badge.hidden = latest.totals.dead === 0;
    badge.textContent = num(latest.totals.dead);
  }
}

async function tick() {
  if (state.ticking) {
    state.again = true;
    return state.ticking;
  }
  clearTimeout(state.timer);
  const started = Date.now();
  const view = state.view;
  state.ticking = Promise.allSettled([sampleQueues(), view && view.refresh ? view.refresh() : null])
    .then(() => {
      if (view && view === state.view && view.render) view.render();
      if (state.shell) refreshTimes(state.shell.view);
      renderLive();
      state.ticking = null;
      if (!state.shell) return;
      if (state.again) {
        state.again = false;
        tick();
        return;
      }
      const interval = document.hidden ? HIDDEN_POLL_MS : POLL_MS;
      state.timer = setTimeout(tick, Math.max(100, interval - (Date.now() - started)));
    });
  return state.ticking;
}

/** Refreshes the current view (and the counts) at once, e.g. after a replay. */
function refreshNow() {
  return tick();
}

function stopPolling() {
  clearTimeout(state.timer);
  state.timer = null;
}

let confirmBusy = false;
/** The modal confirmation dialog; resolves true when the user confirms (`ok`), false on `dismiss`. */
function confirm({ title, text, ok = 'Confirm', dismiss = 'Cancel', danger = false }) {
  const dialog = document.getElementById('confirm');
  if (!dialog || confirmBusy) return Promise.resolve(false);
  confirmBusy = true;
  document.getElementById('confirm-title').textContent = title;
  document.getElementById('confirm-text').textContent = text;
  // "Cancel" as the way out reads badly when the action itself is cancelling jobs.
  document.getElementById('confirm-cancel').textContent = dismiss;
  const okButton = document.getElementById('confirm-ok');
  okButton.textContent = ok;
  okButton.className = danger ? 'btn btn-danger' : 'btn btn-primary';
  dialog.returnValue = '';
  return new Promise((resolve) => {
    dialog.addEventListener('close', () => {
      confirmBusy = false;
      resolve(dialog.returnValue === 'ok');
    }, { once: true });
    dialog.showModal();
    // The safe choice has the focus, so an accidental Enter does not discard anything.
    document.getElementById('confirm-cancel').focus();
  });
}

/** A short-lived notice in the corner: `kind` is `ok` or `error`. */
function notify(message, kind = 'ok') {
  const box = document.getElementById('toasts');
  if (!box) return;
  const toast = h('div', { class: `toast toast-${kind}`, text: message });
  box.appendChild(toast);
  setTimeout(() => toast.remove(), kind === 'error' ? 8000 : 4000);
}

function showLogin(message) {
  stopPolling();
  if (state.view && state.view.destroy) state.view.destroy();
  state.view = null;
  state.viewKey = null;
  state.shell = null;
  state.session = null;
  document.title = 'Sign in · Conveyor';
  mount(root, loginView({
    message,
    onLogin: (session) => startApp(session),
  }));
}

function startApp(session) {
  state.session = session;
  buildShell();
  showRoute();
}

api.setUnauthorizedHandler(() => {
  if (state.shell) showLogin('Your session has ended. Sign in again.');
});

window.addEventListener('hashchange', showRoute);
document.addEventListener('visibilitychange', () => {
  if (!document.hidden && state.shell) refreshNow();
});

async function boot() {
  try {
    const session = await api.getSession();
    if (session) startApp(session);
    else showLogin();
  } catch (error) {
    mount(root, h('div', { class: 'boot-error' },
      errorBox(error, 'Cannot load the dashboard:'),
      h('button', { class: 'btn', type: 'button', text: 'Try again', onclick: boot })));
  }
}

boot();
