// Workflows: step builders (`step`, `waitStep`, `chain`, `group`) and the body of
// `POST /v1/flows`.

import { enqueueBody } from './jobs.js';
import type { EnqueueOptions, JobSpec } from './jobs.js';

export type FlowState = 'running' | 'completed' | 'failed' | 'compensating' | 'compensated' | 'cancelled';
export type StepState = 'pending' | 'active' | 'waiting' | 'completed' | 'failed' | 'skipped' | 'cancelled';
/** When a parent failed: fail the flow (default), skip this step and its dependents, or run anyway. */
export type ParentFailurePolicy = 'fail' | 'skip' | 'continue';
/** `stop` (default): nothing new starts; `compensate`: completed steps' `compensate` jobs run, latest first. */
export type FlowFailurePolicy = 'stop' | 'compensate';

/** A job step: its `job` runs once every step in `after` has finished. */
export interface JobStep {
  name: string;
  /** The job, as `enqueueMany` takes one (`{kind, payload, queue, delayMs, ...}`; wire names such as `delay_ms` pass through). No `idempotencyKey` or `unique`: give the flow an `idempotencyKey`. */
  job: JobSpec;
  after?: string[];
  onParentFailure?: ParentFailurePolicy;
  /** The job to run if the flow compensates after this step completed (a kind, or a job spec); it gets this step's payload unless it has its own, and this step's result in `parents`. */
  compensate?: string | JobSpec;
}

/** A durable wait: completes when `client.signal(flowId, signal, payload)` delivers its signal (its result is the payload), fails after `timeoutMs`. */
export interface WaitStep {
  name: string;
  wait: { signal: string; timeoutMs?: number };
  after?: string[];
}

export type FlowStep = JobStep | WaitStep;

/** A step, a `Steps` from `chain`/`group`, or an array (a group). */
export type StepLike = FlowStep | Steps | StepLike[];

/** The flow-level fields of `createFlow`. */
export interface FlowOptions {
  name?: string;
  onFailure?: FlowFailurePolicy;
  /** Creating a flow again with the same key answers the stored flow (`duplicate: true`). */
  idempotencyKey?: string;
  tags?: string[];
}

/** A whole `createFlow` body. */
export interface FlowSpec extends FlowOptions {
  steps: Array<FlowStep | Steps> | Steps;
}

/** Options of `step()`: the job's enqueue options and the step's own. */
export interface StepOptions extends EnqueueOptions {
  after?: string[];
  onParentFailure?: ParentFailurePolicy;
  compensate?: string | JobSpec;
}

/** A job step running `kind` with `payload` (see `JobStep`). */
export function step(name: string, kind: string, payload?: unknown, options: StepOptions = {}): JobStep {
  checkName(name);
  const { after, onParentFailure, compensate, ...enqueue } = options;
  const result: JobStep = { name, job: { kind, ...(payload === undefined ? {} : { payload }), ...enqueue } };
  if (after !== undefined) result.after = [...after];
  if (onParentFailure !== undefined) result.onParentFailure = onParentFailure;
  if (compensate !== undefined) result.compensate = compensate;
  return result;
}

/** A wait step (see `WaitStep`). */
export function waitStep(name: string, signal: string, options: { timeoutMs?: number; after?: string[] } = {}): WaitStep {
  checkName(name);
  const result: WaitStep = { name, wait: { signal } };
  if (options.timeoutMs !== undefined) result.wait.timeoutMs = options.timeoutMs;
  if (options.after !== undefined) result.after = [...options.after];
  return result;
}

/**
 * Steps with the dependencies `chain` and `group` gave them: `heads` start it (nothing inside
 * comes before them), `tails` end it (nothing inside comes after them). `createFlow` takes it.
 */
export class Steps implements Iterable<FlowStep> {
  readonly #steps: FlowStep[];
  readonly heads: readonly string[];
  readonly tails: readonly string[];

  constructor(steps: FlowStep[], heads: string[], tails: string[]) {
    this.#steps = steps;
    this.heads = heads;
    this.tails = tails;
  }

  /** The steps (copies), as `createFlow` takes them. */
  get steps(): FlowStep[] {
    return this.#steps.map((s) => ({ ...s }));
  }

  get length(): number {
    return this.#steps.length;
  }

  /** These steps, then `next` (a step, `Steps`, or an array: a group) once every tail has finished. */
  then(next: StepLike): Steps {
    return chain([this, next]);
  }

  [Symbol.iterator](): Iterator<FlowStep> {
    return this.steps[Symbol.iterator]();
  }

  toJSON(): FlowStep[] {
    return this.steps;
  }
}

/** Runs `items` one after another: each starts once the one before (all of it, for a group) has finished. */
export function chain(items: StepLike[]): Steps {
  if (!Array.isArray(items)) throw new TypeError('conveyor: chain takes an array: chain([a, b, ...])');
  const steps: FlowStep[] = [];
  let heads: string[] | null = null;
  let tails: string[] = [];
  for (const item of items) {
    const part = fragment(item);
    if (heads === null) {
      heads = [...part.heads];
      steps.push(...part.steps);
    } else {
      const first = new Set(part.heads);
      for (const s of part.steps) steps.push(first.has(s.name) ? withAfter(s, tails) : s);
    }
    tails = [...part.tails];
  }
  if (heads === null) throw new RangeError('conveyor: chain needs at least one step');
  return new Steps(steps, heads, tails);
}

/** Runs `items` side by side; `group([...]).then(x)` runs `x` once all have finished. */
export function group(items: StepLike[]): Steps {
  if (!Array.isArray(items)) throw new TypeError('conveyor: group takes an array: group([a, b, ...])');
  const steps: FlowStep[] = [];
  const heads: string[] = [];
  const tails: string[] = [];
  for (const item of items) {
    const part = fragment(item);
    steps.push(...part.steps);
    heads.push(...part.heads);
    tails.push(...part.tails);
  }
  if (steps.length === 0) throw new RangeError('conveyor: group needs at least one step');
  return new Steps(steps, heads, tails);
}

function checkName(name: string): void {
  if (typeof name !== 'string' || name === '') throw new TypeError('conveyor: a step name must be a non-empty string');
}

function fragment(item: StepLike): Steps {
  if (item instanceof Steps) return item;
  if (Array.isArray(item)) return group(item);
  if (item && typeof item === 'object' && typeof (item as FlowStep).name === 'string' && (item as FlowStep).name !== '') {
    const s = { ...(item as FlowStep) };
    return new Steps([s], [s.name], [s.name]);
  }
  throw new TypeError(`conveyor: expected a step with a name, chain()/group() or an array, got ${JSON.stringify(item)}`);
}

function withAfter(s: FlowStep, names: readonly string[]): FlowStep {
  const after = [...(s.after ?? [])];
  for (const n of names) if (!after.includes(n)) after.push(n);
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
export function jobBody(spec: JobSpec | string, where: string): Record<string, unknown> {
  if (typeof spec === 'string') return { kind: spec };
  if (!spec || typeof spec !== 'object') throw new TypeError(`conveyor: ${where} must be a job ({kind, payload, ...})`);
  const body = enqueueBody(spec.kind, spec.payload, spec, `${where}.`);
  for (const [key, value] of Object.entries(spec)) {
    if (!ENQUEUE_KEYS.has(key) && value !== undefined) body[key] = value;
  }
  return body;
}

function stepBody(s: FlowStep, i: number): Record<string, unknown> {
  const where = `steps[${i}]`;
  if (!s || typeof s !== 'object') throw new TypeError(`conveyor: ${where} must be a step object`);
  if (typeof s.name !== 'string') throw new TypeError(`conveyor: ${where} needs a name`);
  const body: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(s)) {
    if (value === undefined) continue;
    switch (key) {
      case 'job':
        body.job = jobBody(value as JobSpec, `${where}.job`);
        break;
      case 'compensate':
        body.compensate = jobBody(value as JobSpec | string, `${where}.compensate`);
        break;
      case 'onParentFailure':
        body.on_parent_failure = value;
        break;
      case 'wait': {
        const { timeoutMs, ...rest } = value as { signal: string; timeoutMs?: number };
        body.wait = timeoutMs === undefined ? rest : { ...rest, timeout_ms: timeoutMs };
        break;
      }
      case 'after':
        if (!Array.isArray(value)) throw new TypeError(`conveyor: ${where}.after must be an array of step names`);
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
export function flowBody(flow: Array<FlowStep | Steps> | Steps | FlowSpec, options: FlowOptions = {}): Record<string, unknown> {
  let steps: unknown;
  const body: Record<string, unknown> = {};
  let fields: FlowOptions & Record<string, unknown> = {};
  if (flow instanceof Steps || Array.isArray(flow)) {
    steps = flow;
  } else if (flow && typeof flow === 'object' && 'steps' in flow) {
    const { steps: given, ...rest } = flow;
    steps = given;
    fields = rest;
  } else {
    throw new TypeError('conveyor: createFlow takes an array of steps, chain()/group(), or {steps, ...}');
  }
  const list: FlowStep[] = [];
  for (const item of steps instanceof Steps ? steps.steps : (steps as Array<FlowStep | Steps>)) {
    if (item instanceof Steps) list.push(...item.steps);
    else list.push(item);
  }
  body.steps = list.map(stepBody);
  for (const [key, value] of Object.entries({ ...fields, ...definedOnly(options) })) {
    if (value === undefined) continue;
    if (key === 'onFailure') body.on_failure = value;
    else if (key === 'idempotencyKey') body.idempotency_key = value;
    else body[key] = value;
  }
  return body;
}

function definedOnly(options: FlowOptions): Record<string, unknown> {
  return Object.fromEntries(Object.entries(options).filter(([, v]) => v !== undefined));
}
