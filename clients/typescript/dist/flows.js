// Workflows: step builders (`step`, `waitStep`, `chain`, `group`) and the body of
// `POST /v1/flows`.
import { enqueueBody } from './jobs.js';
/** A job step running `kind` with `payload` (see `JobStep`). */
export function step(name, kind, payload, options = {}) {
    checkName(name);
    const { after, onParentFailure, compensate, ...enqueue } = options;
    const result = { name, job: { kind, ...(payload === undefined ? {} : { payload }), ...enqueue } };
    if (after !== undefined)
        result.after = [...after];
    if (onParentFailure !== undefined)
        result.onParentFailure = onParentFailure;
    if (compensate !== undefined)
        result.compensate = compensate;
    return result;
}
/** A wait step (see `WaitStep`). */
export function waitStep(name, signal, options = {}) {
    checkName(name);
    const result = { name, wait: { signal } };
    if (options.timeoutMs !== undefined)
        result.wait.timeoutMs = options.timeoutMs;
    if (options.after !== undefined)
        result.after = [...options.after];
    return result;
}
/**
 * Steps with the dependencies `chain` and `group` gave them: `heads` start it (nothing inside
 * comes before them), `tails` end it (nothing inside comes after them). `createFlow` takes it.
 */
export class Steps {
    #steps;
    heads;
    tails;
    constructor(steps, heads, tails) {
        this.#steps = steps;
        this.heads = heads;
        this.tails = tails;
    }
    /** The steps (copies), as `createFlow` takes them. */
    get steps() {
        return this.#steps.map((s) => ({ ...s }));
    }
    get length() {
        return this.#steps.length;
    }
    /** These steps, then `next` (a step, `Steps`, or an array: a group) once every tail has finished. */
    then(next) {
        return chain([this, next]);
    }
    [Symbol.iterator]() {
        return this.steps[Symbol.iterator]();
    }
    toJSON() {
        return this.steps;
    }
}
/** Runs `items` one after another: each starts once the one before (all of it, for a group) has finished. */
export function chain(items) {
    if (!Array.isArray(items))
        throw new TypeError('conveyor: chain takes an array: chain([a, b, ...])');
    const steps = [];
    let heads = null;
    let tails = [];
    for (const item of items) {
        const part = fragment(item);
        if (heads === null) {
            heads = [...part.heads];
            steps.push(...part.steps);
        }
        else {
            const first = new Set(part.heads);
            for (const s of part.steps)
                steps.push(first.has(s.name) ? withAfter(s, tails) : s);
        }
        tails = [...part.tails];
    }
    if (heads === null)
        throw new RangeError('conveyor: chain needs at least one step');
    return new Steps(steps, heads, tails);
}
/** Runs `items` side by side; `group([...]).then(x)` runs `x` once all have finished. */
export function group(items) {
    if (!Array.isArray(items))
        throw new TypeError('conveyor: group takes an array: group([a, b, ...])');
    const steps = [];
    const heads = [];
    const tails = [];
    for (const item of items) {
        const part = fragment(item);
        steps.push(...part.steps);
        heads.push(...part.heads);
        tails.push(...part.tails);
    }
    if (steps.length === 0)
        throw new RangeError('conveyor: group needs at least one step');
    return new Steps(steps, heads, tails);
}
function checkName(name) {
    if (typeof name !== 'string' || name === '')
        throw new TypeError('conveyor: a step name must be a non-empty string');
}
function fragment(item) {
    if (item instanceof Steps)
        return item;
    if (Array.isArray(item))
        return group(item);
    if (item && typeof item === 'object' && typeof item.name === 'string' && item.name !== '') {
        const s = { ...item };
        return new Steps([s], [s.name], [s.name]);
    }
    throw new TypeError(`conveyor: expected a step with a name, chain()/group() or an array, got ${JSON.stringify(item)}`);
}
function withAfter(s, names) {
    const after = [...(s.after ?? [])];
    for (const n of names)
        if (!after.includes(n))
            after.push(n);
    return { ...s, after };
}
// ---- the request body --------------------------------------------------------------------------
const ENQUEUE_KEYS = new Set([
    'kind',
    'payload',
    'queue',
    'priority',
    'delayMs',
    'delay',
    'runAt',
    'maxAttempts',
    'idempotencyKey',
    'tenant',
    'unique',
    'timeoutMs',
    'tags',
]);
/** A job's body from a JobSpec; keys it does not know (wire names such as `delay_ms`) pass through. */
export function jobBody(spec, where) {
    if (typeof spec === 'string')
        return { kind: spec };
    if (!spec || typeof spec !== 'object')
        throw new TypeError(`conveyor: ${where} must be a job ({kind, payload, ...})`);
    const body = enqueueBody(spec.kind, spec.payload, spec, `${where}.`);
    for (const [key, value] of Object.entries(spec)) {
        if (!ENQUEUE_KEYS.has(key) && value !== undefined)
            body[key] = value;
    }
    return body;
}
function stepBody(s, i) {
    const where = `steps[${i}]`;
    if (!s || typeof s !== 'object')
        throw new TypeError(`conveyor: ${where} must be a step object`);
    if (typeof s.name !== 'string')
        throw new TypeError(`conveyor: ${where} needs a name`);
    const body = {};
    for (const [key, value] of Object.entries(s)) {
        if (value === undefined)
            continue;
        switch (key) {
            case 'job':
                body.job = jobBody(value, `${where}.job`);
                break;
            case 'compensate':
                body.compensate = jobBody(value, `${where}.compensate`);
                break;
            case 'onParentFailure':
                body.on_parent_failure = value;
                break;
            case 'wait': {
                const { timeoutMs, ...rest } = value;
                body.wait = timeoutMs === undefined ? rest : { ...rest, timeout_ms: timeoutMs };
                break;
            }
            case 'after':
                if (!Array.isArray(value))
                    throw new TypeError(`conveyor: ${where}.after must be an array of step names`);
                body.after = [...value];
                break;
            default:
                body[key] = value; // wire names (on_parent_failure) and newer fields pass through
        }
    }
    return body;
}
/**
 * The JSON of `POST /v1/flows`: `flow` is an array of steps (plain objects, or built with
 * `step`/`waitStep`; a `Steps` in it adds its steps), a `Steps` from `chain`/`group`, or a
 * whole body (`{steps, name, onFailure, idempotencyKey, tags}`; snake_case wire names work
 * too). `options` set the flow's fields.
 */
export function flowBody(flow, options = {}) {
    let steps;
    const body = {};
    let fields = {};
    if (flow instanceof Steps || Array.isArray(flow)) {
        steps = flow;
    }
    else if (flow && typeof flow === 'object' && 'steps' in flow) {
        const { steps: given, ...rest } = flow;
        steps = given;
        fields = rest;
    }
    else {
        throw new TypeError('conveyor: createFlow takes an array of steps, chain()/group(), or {steps, ...}');
    }
    const list = [];
    for (const item of steps instanceof Steps ? steps.steps : steps) {
        if (item instanceof Steps)
            list.push(...item.steps);
        else
            list.push(item);
    }
    body.steps = list.map(stepBody);
    for (const [key, value] of Object.entries({ ...fields, ...definedOnly(options) })) {
        if (value === undefined)
            continue;
        if (key === 'onFailure')
            body.on_failure = value;
        else if (key === 'idempotencyKey')
            body.idempotency_key = value;
        else
            body[key] = value;
    }
    return body;
}
function definedOnly(options) {
    return Object.fromEntries(Object.entries(options).filter(([, v]) => v !== undefined));
}
