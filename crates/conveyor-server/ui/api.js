// The dashboard's only way to the server: the documented JSON API (docs/openapi.yaml), with
// the session cookie the browser holds after `POST /v1/session`.

export class ApiError extends Error {
  constructor(status, code, field, message) {
    super(message);
    this.status = status;
    this.code = code;
    this.field = field;
  }
}

let onUnauthorized = () => {};

/** Called with the error when any call (other than the session's own) answers 401. */
export function setUnauthorizedHandler(handler) {
  onUnauthorized = handler;
}

/**
 * One API call. Bodies and answers are JSON; a non-2xx answer throws an ApiError carrying
 * the server's `{"error": {"code", "field", "message"}}`.
 */
export async function api(method, path, body, { quiet401 = false } = {}) {
  const headers = { Accept: 'application/json' };
  // The session cookie is SameSite=Strict, and the server also wants this header on every
  // cookie-authenticated state change: a cross-site form cannot send a custom header.
  if (method !== 'GET' && method !== 'HEAD') headers['X-Conveyor-Csrf'] = '1';
  const init = { method, headers, credentials: 'same-origin', cache: 'no-store' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch {
    throw new ApiError(0, 'network', null, 'cannot reach the Conveyor server');
  }
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!response.ok) {
    const detail = data && data.error ? data.error : {};
    const error = new ApiError(
      response.status,
      detail.code || `http_${response.status}`,
      detail.field || null,
      detail.message || `${response.status} ${response.statusText || 'error'}`,
    );
    if (response.status === 401 && !quiet401) onUnauthorized(error);
    throw error;
  }
  return data;
}

/**
 * Whether an error means "this server has no such endpoint" rather than "the call failed":
 * the dashboard then shows the feature as not available instead of as broken. `/v1/jobs/stuck`
 * on a server without it falls into `/v1/jobs/{id}` and is refused as a bad id (400, `id`).
 */
export function notAvailable(error) {
  return error instanceof ApiError
    && (error.status === 404 || error.status === 405 || error.status === 501
      || (error.status === 400 && error.field === 'id'));
}

/**
 * The signed-in identity: `{name, role, auth, expiresAt}`, or null when a token is needed. A
 * server without access control answers the anonymous admin with `auth_enabled: false` (or,
 * if older, has no `/v1/session` at all); both mean "no login step".
 */
export async function getSession() {
  try {
    const session = await api('GET', '/v1/session', undefined, { quiet401: true });
    return {
      name: (session && session.name) || 'anonymous',
      role: (session && session.role) || 'admin',
      auth: Boolean(session && session.auth_enabled),
      expiresAt: (session && session.expires_at) || null,
    };
  } catch (error) {
    if (error.status === 401) return null;
    if (notAvailable(error)) return { name: 'anonymous', role: 'admin', auth: false, expiresAt: null };
    throw error;
  }
}

export async function login(token) {
  await api('POST', '/v1/session', { token }, { quiet401: true });
  return getSession();
}

export async function logout() {
  await api('DELETE', '/v1/session', undefined, { quiet401: true });
}

export const jobs = {
  list: (params) => api('GET', `/v1/jobs${query(params)}`),
  get: (id) => api('GET', `/v1/jobs/${encodeURIComponent(id)}`),
  cancel: (id) => api('POST', `/v1/jobs/${encodeURIComponent(id)}/cancel`, {}),
  /**
   * One action on every job a filter matches or on listed ids:
   * `{filter: {...} | ids: [...], action: 'cancel'|'retry'|'discard', dry_run?}` answers
   * `{action, dry_run, matched, eligible, applied, truncated}`.
   */
  bulk: (body) => api('POST', '/v1/jobs/bulk', body),
};

export const dead = {
  list: (params) => api('GET', `/v1/dead${query(params)}`),
  replay: (selector) => api('POST', '/v1/dead/replay', selector),
  discard: (id) => api('DELETE', `/v1/dead/${encodeURIComponent(id)}`),
};

export const queues = {
  stats: () => api('GET', '/v1/queues'),
  setPaused: (name, paused) => api('PUT', `/v1/queues/${encodeURIComponent(name)}`, { paused }),
  /** One queue's settings (limits, pause, depth, rate limits, weight, TTL). */
  get: (name) => api('GET', `/v1/queues/${encodeURIComponent(name)}`),
  /** A partial update: an absent key keeps its value, `null` clears it. */
  update: (name, body) => api('PUT', `/v1/queues/${encodeURIComponent(name)}`, body),
};

/** Circuit breakers: `scope` is `queue` or `kind`; opening without `open_ms` lasts until closed. */
export const breakers = {
  list: () => api('GET', '/v1/breakers'),
  open: (scope, name, body = {}) => api('POST', `${breakerPath(scope, name)}/open`, body),
  close: (scope, name, body = {}) => api('POST', `${breakerPath(scope, name)}/close`, body),
};

function breakerPath(scope, name) {
  return `/v1/${scope === 'kind' ? 'kinds' : 'queues'}/${encodeURIComponent(name)}/circuit`;
}

export const flows = {
  list: (params) => api('GET', `/v1/flows${query(params)}`),
  get: (id) => api('GET', `/v1/flows/${encodeURIComponent(id)}`),
};

export const schedules = {
  list: () => api('GET', '/v1/schedules'),
  /** Creates or replaces the schedule `name` with a ScheduleSpec. */
  put: (name, spec) => api('PUT', `/v1/schedules/${encodeURIComponent(name)}`, spec),
  remove: (name) => api('DELETE', `/v1/schedules/${encodeURIComponent(name)}`),
  pause: (name) => api('POST', `/v1/schedules/${encodeURIComponent(name)}/pause`, {}),
  resume: (name) => api('POST', `/v1/schedules/${encodeURIComponent(name)}/resume`, {}),
  /** Enqueues the schedule's job now, outside its ticks; `{id, job, queue}`. */
  trigger: (name) => api('POST', `/v1/schedules/${encodeURIComponent(name)}/trigger`, {}),
};

/**
 * Named limits: `list` answers `{limits: [{name, concurrency?, rate?, key?, weights?, updated_at}]}`;
 * `get` adds what each key uses now (`usage: [{key, running, recent_starts}]`) and `in_use`.
 */
export const limits = {
  list: () => api('GET', '/v1/limits'),
  get: (name) => api('GET', `/v1/limits/${encodeURIComponent(name)}`),
  /** Refused (409 `limit_in_use`) while a queue's or a kind's settings name it. */
  remove: (name) => api('DELETE', `/v1/limits/${encodeURIComponent(name)}`),
};

/** Every kind's settings (`{kinds: [{kind, schema, version, batch?, sequence?, limits?, ...}]}`). */
export const kinds = {
  list: () => api('GET', '/v1/kinds'),
};

export const sources = {
  list: () => api('GET', '/v1/sources'),
  remove: (name) => api('DELETE', `/v1/sources/${encodeURIComponent(name)}`),
  pause: (name) => api('POST', `/v1/sources/${encodeURIComponent(name)}/pause`, {}),
  resume: (name) => api('POST', `/v1/sources/${encodeURIComponent(name)}/resume`, {}),
};

/**
 * Attempt outcomes from the Prometheus text at `/metrics`: the sums of
 * `jobs_processed_total` by `status` (completed, failed, dead, snoozed). These count what this
 * server recorded, which is what lets the dashboard chart failed attempts, retries included.
 */
export async function attemptCounters() {
  let response;
  try {
    response = await fetch('/metrics', { credentials: 'same-origin', cache: 'no-store' });
  } catch {
    throw new ApiError(0, 'network', null, 'cannot reach the Conveyor server');
  }
  if (!response.ok) throw new ApiError(response.status, `http_${response.status}`, null, `/metrics answered ${response.status}`);
  const totals = {};
  let seen = false;
  for (const line of (await response.text()).split('\n')) {
    const match = line.match(/^conveyor_jobs_processed_total\{([^}]*)\}\s+(\S+)/);
    if (!match) continue;
    const status = (match[1].match(/status="([^"]*)"/) || [])[1];
    const value = Number(match[2]);
    if (!status || !Number.isFinite(value)) continue;
    totals[status] = (totals[status] || 0) + value;
    seen = true;
  }
  return seen ? totals : {};
}

/** The per-minute history (`GET /v1/stats`): `{from, to, step, queue, kind}`. */
export const stats = {
  get: (params) => api('GET', `/v1/stats${query(params)}`),
};

export const workers = {
  list: () => api('GET', '/v1/workers'),
  /** `action`: quiet, stop or resume. */
  command: (id, action) => api('POST', `/v1/workers/${encodeURIComponent(id)}/${action}`, {}),
  stuck: () => api('GET', '/v1/jobs/stuck'),
};

/** `?a=1&b=2` from an object, leaving out empty values (the API rejects unknown or empty ones). */
export function query(params = {}) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== '') search.set(key, value);
  }
  const text = search.toString();
  return text ? `?${text}` : '';
}
