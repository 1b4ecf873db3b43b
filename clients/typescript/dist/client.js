// The producer side: enqueue, enqueue many, read and cancel jobs; create, watch, signal and
// cancel workflows; operators' calls for payload schemas, circuit breakers and named limits.
import { Transport, seg } from './http.js';
import { NotFound } from './errors.js';
import { flowBody } from './flows.js';
import { aliased, enqueueBody } from './jobs.js';
/** A job in one of these states never runs again unless replayed. */
const FINISHED_STATES = new Set(['completed', 'dead', 'cancelled']);
/** The longest one long-poll asks the server for (it caps it at its --max-fetch-wait-ms). */
const MAX_WAIT_MS = 30_000;
/** A flow in one of these states has ended (only `running` and `compensating` have not). */
const FLOW_FINISHED_STATES = new Set(['completed', 'failed', 'compensated', 'cancelled']);
/** Whether a flow has ended (any state but `running` and `compensating`). */
export function flowFinished(flow) {
    return FLOW_FINISHED_STATES.has(flow.state);
}
export class Client {
    /** @internal */
    transport;
    constructor(options) {
        this.transport = new Transport(options);
    }
    /**
     * Enqueues one job; resolves with its id (the existing job's id for a duplicate, or the job a
     * `debounce` or `throttle` folded the enqueue into).
     */
    async enqueue(kind, payload, opts = {}) {
        const res = await this.transport.request('POST', '/v1/jobs', enqueueBody(kind, payload, opts));
        return res.body.id;
    }
    /**
     * Enqueues many jobs in one all-or-nothing request; resolves with their ids in order (for an
     * enqueue a `debounce` or `throttle` folded, the id of the job that stands).
     */
    async enqueueMany(jobs) {
        if (!Array.isArray(jobs))
            throw new TypeError('conveyor: enqueueMany takes an array of jobs');
        if (jobs.length === 0)
            return [];
        const body = { jobs: jobs.map((job, i) => enqueueBody(job.kind, job.payload, job, `jobs[${i}].`)) };
        const res = await this.transport.request('POST', '/v1/jobs/batch', body);
        return res.body.ids;
    }
    /**
     * Sends an event: every subscription to `name` (`PUT /v1/subscriptions/{name}`) makes a job
     * of it, all in one transaction. Sent again with the same `id`, it makes nothing new.
     */
    async sendEvent(name, payload, opts = {}) {
        const body = { name, payload: payload ?? {} };
        if (opts.id !== undefined)
            body.id = opts.id;
        const res = await this.transport.request('POST', '/v1/events', body);
        return res.body;
    }
    /** The job with its error history; rejects with `NotFound` when there is none. */
    async get(id) {
        const res = await this.transport.request('GET', `/v1/jobs/${seg(id)}`);
        return res.body;
    }
    /**
     * Resolves with the job once it has finished (`completed`, `dead` or `cancelled`), or as it
     * is when `timeoutMs` (default 30 000) passes first. The server holds the request until then
     * (`GET /v1/jobs/{id}?wait_ms=`), so waiting costs no polling.
     */
    async wait(id, options = {}) {
        const deadline = Date.now() + checkTimeout(options.timeoutMs ?? 30_000, 'wait');
        for (;;) {
            const waitMs = Math.min(Math.max(0, Math.floor(deadline - Date.now())), MAX_WAIT_MS);
            const res = await this.transport.request('GET', `/v1/jobs/${seg(id)}?wait_ms=${waitMs}`, undefined, { timeoutMs: waitMs + 30_000 });
            if (FINISHED_STATES.has(res.body.state) || Date.now() >= deadline)
                return res.body;
        }
    }
    /** Cancels an unfinished job (admin role); resolves with the cancelled job. */
    async cancel(id) {
        const res = await this.transport.request('POST', `/v1/jobs/${seg(id)}/cancel`, {});
        return res.body;
    }
    // ---- workflows ------------------------------------------------------------------------------
    /**
     * Creates a workflow, all or nothing (`POST /v1/flows`). `flow` is an array of steps
     * (`step(...)`, `waitStep(...)` or plain objects), `chain([...])` / `group([...]).then(...)`,
     * or a whole body `{steps, name, onFailure, idempotencyKey, tags}`; `options` set the flow's
     * fields. Resolves with the flow's id and each job step's job id; a refused flow rejects with
     * `InvalidRequest` naming the field (`steps[1].after[0]`).
     */
    async createFlow(flow, options = {}) {
        const res = await this.transport.request('POST', '/v1/flows', flowBody(flow, options));
        return res.body;
    }
    /** The flow with every step; rejects with `NotFound` for an unknown id (or another producer's flow). */
    async getFlow(id) {
        const res = await this.transport.request('GET', `/v1/flows/${seg(id)}`);
        return res.body;
    }
    /**
     * Resolves with the flow once it has finished (`completed`, `failed`, `compensated` or
     * `cancelled`), or as it is when `timeoutMs` (default 30 000) passes first; the server holds
     * each request (`GET /v1/flows/{id}?wait_ms=`), so waiting costs no polling.
     */
    async waitFlow(id, options = {}) {
        const deadline = Date.now() + checkTimeout(options.timeoutMs ?? 30_000, 'waitFlow');
        for (;;) {
            const waitMs = Math.min(Math.max(0, Math.floor(deadline - Date.now())), MAX_WAIT_MS);
            const res = await this.transport.request('GET', `/v1/flows/${seg(id)}?wait_ms=${waitMs}`, undefined, {
                timeoutMs: waitMs + 30_000,
            });
            if (flowFinished(res.body) || Date.now() >= deadline)
                return res.body;
        }
    }
    /** Flows newest first, without their steps (admin role); pass `next` as `after` for the next page. */
    async listFlows(options = {}) {
        const query = new URLSearchParams();
        for (const key of ['state', 'name', 'limit', 'after']) {
            const value = options[key];
            if (value !== undefined && value !== null)
                query.set(key, String(value));
        }
        const text = query.toString();
        const res = await this.transport.request('GET', `/v1/flows${text ? `?${text}` : ''}`);
        return res.body;
    }
    /** Cancels every unfinished step of the flow; resolves with it. `Conflict` when it has already ended. */
    async cancelFlow(id) {
        const res = await this.transport.request('POST', `/v1/flows/${seg(id)}/cancel`, {});
        return res.body;
    }
    /**
     * Delivers `signal` to the flow's step waiting for it, which completes with `payload` as its
     * result. Resolves with `'delivered'`, or `'stored'` when the step has not begun waiting yet
     * (it completes as soon as it does). `InvalidRequest` (field `signal`) when no step waits for
     * it; `Conflict` when that step has finished.
     */
    async signal(flowId, signal, payload) {
        if (typeof signal !== 'string')
            throw new TypeError('conveyor: signal must be a string');
        const body = { signal };
        if (payload !== undefined)
            body.payload = payload;
        const res = await this.transport.request('POST', `/v1/flows/${seg(flowId)}/signal`, body);
        return res.body.outcome;
    }
    /**
     * Sets `kind`'s payload schema (JSON Schema 2020-12; admin role): from then on every enqueue
     * of the kind, from any language, is checked against it, and a payload that does not pass is
     * refused with `InvalidRequest` naming the place (`payload/user_id`). `Conflict` (with
     * `would_fail` in the answer) when queued jobs of the kind would not pass, unless `force`.
     */
    async setSchema(kind, schema, options = {}) {
        const body = { schema };
        if (options.version !== undefined)
            body.version = options.version;
        if (options.force)
            body.force = true;
        const res = await this.transport.request('PUT', `/v1/kinds/${seg(kind)}`, body);
        return res.body;
    }
    /** `kind`'s settings; `NotFound` when it has none. */
    async getSchema(kind) {
        const res = await this.transport.request('GET', `/v1/kinds/${seg(kind)}`);
        return res.body;
    }
    /** Every kind with settings, by name. */
    async listSchemas() {
        const res = await this.transport.request('GET', '/v1/kinds');
        return res.body.kinds;
    }
    /** Removes `kind`'s schema (its jobs stay); `NotFound` when it had none. */
    async deleteSchema(kind) {
        await this.transport.request('DELETE', `/v1/kinds/${seg(kind)}`);
    }
    /**
     * Makes `kind` a batch kind (`PUT /v1/kinds/{kind}` `{ batch }`; admin role), or with `null`
     * an ordinary kind again: its jobs are then handed out only to batch fetches (a worker's
     * `handleBatch`), up to `maxSize` at once, all of one queue and one value of `key`, once
     * `maxSize` of them wait or the oldest has waited `maxWaitMs`. A worker with only
     * `handle(kind)` never receives them. The kind's other settings (schema and version, circuit
     * breaker, limits, sequence) stay as they are. Resolves with the batch settings as stored
     * (`null` once removed). Bad values reject with `InvalidRequest` naming the field
     * (`batch.max_size`, `batch.max_wait_ms`, `batch.key`).
     */
    async setBatch(kind, settings) {
        if (typeof kind !== 'string' || kind === '')
            throw new TypeError('conveyor: setBatch kind must be a non-empty string');
        if (settings === undefined || (settings !== null && (typeof settings !== 'object' || Array.isArray(settings)))) {
            throw new TypeError('conveyor: setBatch settings must be { maxSize, maxWaitMs?, key? }, or null to remove them');
        }
        const res = await this.transport.request('PUT', `/v1/kinds/${seg(kind)}`, { batch: batchBody(settings) });
        return res.body.batch ?? null;
    }
    // ---- circuit breakers -----------------------------------------------------------------------
    /**
     * Sets the circuit breaker of `{ queue }` or of `{ kind }` (in every queue; admin role):
     * `settings` holds any of `BreakerSettings`' fields (the rest take the server's defaults), or
     * is `null` to remove the breaker. The queue's or kind's other settings stay as they are (a
     * kind's schema and its version too). Resolves with the settings as stored, every field
     * filled in (`null` once removed). Bad values reject with `InvalidRequest` naming the field
     * (`circuit_breaker.failure_ratio`).
     */
    async setCircuitBreaker(target, settings) {
        const { scope, name } = breakerTarget(target);
        if (settings === undefined || (settings !== null && (typeof settings !== 'object' || Array.isArray(settings)))) {
            throw new TypeError('conveyor: setCircuitBreaker settings must be an object of breaker settings, or null to remove it');
        }
        const body = { circuit_breaker: settings };
        if (scope === 'kind') {
            // The server keeps a schema left out of the request but resets a version left out.
            let existing = null;
            try {
                existing = (await this.transport.request('GET', scopePath(scope, name))).body;
            }
            catch (e) {
                if (!(e instanceof NotFound))
                    throw e;
                if (settings === null)
                    return null; // no settings, so no breaker to remove
            }
            if (existing?.version !== undefined && existing.version !== null)
                body.version = existing.version;
        }
        const res = await this.transport.request('PUT', scopePath(scope, name), body);
        return res.body.circuit_breaker ?? null;
    }
    /**
     * Opens the circuit breaker of `{ queue }` or of `{ kind }` by hand (admin role), whether or
     * not one is configured: none of its jobs are handed out. With `openMs` it probes after that
     * long (or closes, without settings); without, it stays open until `closeCircuit`. `reason`
     * goes to the audit log and the dashboard. Resolves with the breaker now.
     */
    async openCircuit(target, options = {}) {
        const { scope, name } = breakerTarget(target);
        const body = {};
        if (options.openMs !== undefined) {
            if (typeof options.openMs !== 'number' || !Number.isInteger(options.openMs)) {
                throw new TypeError('conveyor: openCircuit openMs must be a whole number of milliseconds');
            }
            body.open_ms = options.openMs;
        }
        if (options.reason !== undefined)
            body.reason = checkReason(options.reason, 'openCircuit');
        const res = await this.transport.request('POST', scopePath(scope, name, 'open'), body);
        return res.body;
    }
    /** Closes the circuit breaker of `{ queue }` or of `{ kind }` by hand (admin role): its jobs are handed out again at once. Resolves with the breaker now. */
    async closeCircuit(target, options = {}) {
        const { scope, name } = breakerTarget(target);
        const body = {};
        if (options.reason !== undefined)
            body.reason = checkReason(options.reason, 'closeCircuit');
        const res = await this.transport.request('POST', scopePath(scope, name, 'close'), body);
        return res.body;
    }
    /** Every circuit breaker, queues' and kinds', that is configured or has a stored state. */
    async listBreakers() {
        const res = await this.transport.request('GET', '/v1/breakers');
        return res.body.breakers;
    }
    // ---- named limits ---------------------------------------------------------------------------
    /**
     * Creates or replaces the named limit `name` (`PUT /v1/limits/{name}`; admin role): at most
     * `concurrency` jobs of one key running at once, at most `rate.count` of them started within
     * any `rate.period_ms`, or both, across every worker and server. `key` is where a job's key
     * is taken from (`tenant`, `kind`, `queue` or `payload.customer.id`); without it, every job
     * subject to the limit shares one budget. Jobs are subject to it when they name it
     * (`enqueue(kind, payload, { limits: [name] })`) or their queue's or kind's settings do.
     * Resolves with the limit as stored. Bad values reject with `InvalidRequest` naming the
     * field (`rate.period_ms`, `key`, `name`).
     */
    async putLimit(name, settings) {
        if (settings === null || typeof settings !== 'object' || Array.isArray(settings)) {
            throw new TypeError('conveyor: putLimit settings must be an object ({ concurrency, rate, key, weights })');
        }
        const res = await this.transport.request('PUT', limitPath(name, 'putLimit'), settings);
        return res.body;
    }
    /** The limit with what each of its keys uses now (`in_use`, `usage`); `NotFound` when there is none. */
    async getLimit(name) {
        const res = await this.transport.request('GET', limitPath(name, 'getLimit'));
        return res.body;
    }
    /** Every named limit, by name. */
    async listLimits() {
        const res = await this.transport.request('GET', '/v1/limits');
        return res.body.limits;
    }
    /**
     * Removes the limit; `NotFound` when there is none, `Conflict` (code `limit_in_use`) while a
     * queue's or a kind's settings still name it. Jobs naming it themselves do not hold it back;
     * from then on it limits nothing.
     */
    async deleteLimit(name) {
        await this.transport.request('DELETE', limitPath(name, 'deleteLimit'));
    }
    /**
     * The server's history (admin or viewer role): per-step counts (`series`), `totals` and a
     * summary per queue and kind (`kinds`), with run time and queue wait p50/p95/p99. Defaults to
     * the last hour, about 120 points.
     */
    async stats(options = {}) {
        const query = new URLSearchParams();
        for (const key of ['from', 'to', 'step', 'queue', 'kind']) {
            const value = options[key];
            if (value === undefined || value === null)
                continue;
            query.set(key, value instanceof Date ? value.toISOString() : String(value));
        }
        const text = query.toString();
        const res = await this.transport.request('GET', `/v1/stats${text ? `?${text}` : ''}`);
        return res.body;
    }
    /** Closes idle keep-alive connections. The client stays usable (a new request reconnects). */
    close() {
        this.transport.close();
    }
}
/** `{ queue }` or `{ kind }`, checked: exactly one, a non-empty string. */
function breakerTarget(target) {
    const t = (target ?? {});
    if (typeof target !== 'object' || (t.queue === undefined) === (t.kind === undefined)) {
        throw new TypeError('conveyor: give { queue } or { kind } (exactly one): whose circuit breaker');
    }
    const scope = t.queue !== undefined ? 'queue' : 'kind';
    const name = t[scope];
    if (typeof name !== 'string' || name === '')
        throw new TypeError(`conveyor: ${scope} must be a non-empty string`);
    return { scope, name };
}
function scopePath(scope, name, action) {
    const path = `/v1/${scope === 'queue' ? 'queues' : 'kinds'}/${seg(name)}`;
    return action ? `${path}/circuit/${action}` : path;
}
/** The `batch` of a kind's settings: `{ max_size, max_wait_ms?, key? }`, or null. */
export function batchBody(settings) {
    if (settings === null)
        return null;
    const { maxSize, max_size: maxSizeWire, maxWaitMs, max_wait_ms: maxWaitWire, ...rest } = settings;
    // Fields the server does not know go as they are: it names them in a 400.
    const body = { ...rest };
    aliased(body, 'max_size', maxSize, maxSizeWire, 'setBatch: give maxSize or max_size, not both');
    aliased(body, 'max_wait_ms', maxWaitMs, maxWaitWire, 'setBatch: give maxWaitMs or max_wait_ms, not both');
    return body;
}
function limitPath(name, what) {
    if (typeof name !== 'string' || name === '')
        throw new TypeError(`conveyor: ${what} name must be a non-empty string`);
    return `/v1/limits/${seg(name)}`;
}
function checkReason(reason, what) {
    if (typeof reason !== 'string')
        throw new TypeError(`conveyor: ${what} reason must be a string`);
    return reason;
}
function checkTimeout(timeoutMs, what) {
    if (typeof timeoutMs !== 'number' || !Number.isFinite(timeoutMs) || timeoutMs < 0) {
        throw new TypeError(`conveyor: ${what} timeoutMs must be a non-negative number of milliseconds`);
    }
    return timeoutMs;
}
