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
