// What a job is on the wire: its options, its states, and the request body an enqueue sends.
// Shared by the client and the flows (a flow's steps are jobs), so neither imports the other.
import { currentTraceContext } from './trace.js';
/** The request body of one job (`POST /v1/jobs`), from `kind`, `payload` and options. */
export function enqueueBody(kind, payload, opts = {}, where = '') {
    if (typeof kind !== 'string' || kind === '')
        throw new TypeError(`conveyor: ${where}kind must be a non-empty string`);
    const body = { kind };
    if (payload !== undefined)
        body.payload = payload;
    if (opts.queue !== undefined)
        body.queue = opts.queue;
    if (opts.priority !== undefined)
        body.priority = opts.priority;
    if (opts.delayMs !== undefined && opts.delay !== undefined) {
        throw new TypeError(`conveyor: ${where}give delayMs or delay, not both`);
    }
    const delayMs = opts.delayMs ?? (opts.delay !== undefined ? Math.round(opts.delay * 1000) : undefined);
    if (delayMs !== undefined) {
        if (opts.runAt !== undefined)
            throw new TypeError(`conveyor: ${where}give runAt or a delay, not both`);
        body.delay_ms = delayMs;
    }
    if (opts.runAt !== undefined) {
        const at = opts.runAt instanceof Date ? opts.runAt : new Date(opts.runAt);
        if (Number.isNaN(at.getTime()))
            throw new TypeError(`conveyor: ${where}runAt is not a valid date`);
        body.run_at = at.toISOString();
    }
    if (opts.maxAttempts !== undefined)
        body.max_attempts = opts.maxAttempts;
    if (opts.idempotencyKey !== undefined)
        body.idempotency_key = opts.idempotencyKey;
    if (opts.tenant !== undefined)
        body.tenant = opts.tenant;
    if (opts.timeoutMs !== undefined)
        body.timeout_ms = opts.timeoutMs;
    if (opts.tags !== undefined)
        body.tags = opts.tags;
    if (opts.limits !== undefined) {
        if (!Array.isArray(opts.limits))
            throw new TypeError(`conveyor: ${where}limits must be an array of limit names`);
        body.limits = opts.limits;
    }
    if (opts.sequence !== undefined)
        body.sequence = sequenceBody(opts.sequence, where);
    if (opts.debounce !== undefined)
        body.debounce = debounceBody(opts.debounce, where);
    if (opts.throttle !== undefined)
        body.throttle = throttleBody(opts.throttle, where);
    if (opts.ttlMs !== undefined && opts.expiresAt !== undefined) {
        throw new TypeError(`conveyor: ${where}give ttlMs or expiresAt, not both`);
    }
    if (opts.ttlMs !== undefined)
        body.ttl_ms = opts.ttlMs;
    if (opts.expiresAt !== undefined) {
        const at = opts.expiresAt instanceof Date ? opts.expiresAt : new Date(opts.expiresAt);
        if (Number.isNaN(at.getTime()))
            throw new TypeError(`conveyor: ${where}expiresAt is not a valid date`);
        body.expires_at = at.toISOString();
    }
    if (opts.traceparent !== undefined) {
        body.traceparent = opts.traceparent;
        if (opts.tracestate !== undefined)
            body.tracestate = opts.tracestate;
    }
    else {
        Object.assign(body, currentTraceContext());
    }
    if (opts.unique !== undefined && opts.unique !== false) {
        const u = opts.unique === true ? {} : opts.unique;
        const unique = {};
        if (u.args !== undefined)
            unique.args = u.args;
        if (u.byQueue !== undefined)
            unique.by_queue = u.byQueue;
        if (u.periodMs !== undefined)
            unique.period_ms = u.periodMs;
        if (u.states !== undefined)
            unique.states = u.states;
        body.unique = unique;
    }
    return body;
}
/** The `sequence` of a job's body: the key expression as it is, or `{ key, on_dead }`. */
function sequenceBody(sequence, where) {
    if (typeof sequence === 'string')
        return sequence;
    if (sequence === null || typeof sequence !== 'object' || Array.isArray(sequence)) {
        throw new TypeError(`conveyor: ${where}sequence must be a key expression ('payload.account') or { key, onDead }`);
    }
    const { onDead, on_dead: onDeadWire, ...rest } = sequence;
    if (onDead !== undefined && onDeadWire !== undefined && onDead !== onDeadWire) {
        throw new TypeError(`conveyor: ${where}sequence: give onDead or on_dead, not both`);
    }
    // Fields the server does not know go as they are: it names them in a 400.
    const body = { ...rest };
    const policy = onDead ?? onDeadWire;
    if (policy !== undefined)
        body.on_dead = policy;
    return body;
}
/** The `debounce` of a job's body: `{ key, delay_ms, max_wait_ms?, mode? }`. */
function debounceBody(debounce, where) {
    if (debounce === null || typeof debounce !== 'object' || Array.isArray(debounce)) {
        throw new TypeError(`conveyor: ${where}debounce must be { key, delayMs, maxWaitMs?, mode? }`);
    }
    const { delayMs, delay_ms: delayWire, maxWaitMs, max_wait_ms: maxWaitWire, ...rest } = debounce;
    // Fields the server does not know go as they are: it names them in a 400.
    const body = { ...rest };
    aliased(body, 'delay_ms', delayMs, delayWire, `${where}debounce: give delayMs or delay_ms, not both`);
    aliased(body, 'max_wait_ms', maxWaitMs, maxWaitWire, `${where}debounce: give maxWaitMs or max_wait_ms, not both`);
    return body;
}
/** The `throttle` of a job's body: `{ key, period_ms }`. */
function throttleBody(throttle, where) {
    if (throttle === null || typeof throttle !== 'object' || Array.isArray(throttle)) {
        throw new TypeError(`conveyor: ${where}throttle must be { key, periodMs }`);
    }
    const { periodMs, period_ms: periodWire, ...rest } = throttle;
    const body = { ...rest };
    aliased(body, 'period_ms', periodMs, periodWire, `${where}throttle: give periodMs or period_ms, not both`);
    return body;
}
/** Sets `body[wire]` from an option given by its camelCase name or the server's (the same value if both). */
export function aliased(body, wire, camel, snake, conflict) {
    if (camel !== undefined && snake !== undefined && camel !== snake)
        throw new TypeError(`conveyor: ${conflict}`);
    const value = camel ?? snake;
    if (value !== undefined)
        body[wire] = value;
}
