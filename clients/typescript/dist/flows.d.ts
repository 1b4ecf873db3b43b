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
    wait: {
        signal: string;
        timeoutMs?: number;
    };
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
export declare function step(name: string, kind: string, payload?: unknown, options?: StepOptions): JobStep;
/** A wait step (see `WaitStep`). */
export declare function waitStep(name: string, signal: string, options?: {
    timeoutMs?: number;
    after?: string[];
}): WaitStep;
/**
 * Steps with the dependencies `chain` and `group` gave them: `heads` start it (nothing inside
 * comes before them), `tails` end it (nothing inside comes after them). `createFlow` takes it.
 */
export declare class Steps implements Iterable<FlowStep> {
    #private;
    readonly heads: readonly string[];
    readonly tails: readonly string[];
    constructor(steps: FlowStep[], heads: string[], tails: string[]);
    /** The steps (copies), as `createFlow` takes them. */
    get steps(): FlowStep[];
    get length(): number;
    /** These steps, then `next` (a step, `Steps`, or an array: a group) once every tail has finished. */
    then(next: StepLike): Steps;
    [Symbol.iterator](): Iterator<FlowStep>;
    toJSON(): FlowStep[];
}
/** Runs `items` one after another: each starts once the one before (all of it, for a group) has finished. */
export declare function chain(items: StepLike[]): Steps;
/** Runs `items` side by side; `group([...]).then(x)` runs `x` once all have finished. */
export declare function group(items: StepLike[]): Steps;
/** A job's body from a JobSpec; keys it does not know (wire names such as `delay_ms`) pass through. */
export declare function jobBody(spec: JobSpec | string, where: string): Record<string, unknown>;
/**
 * The JSON of `POST /v1/flows`: `flow` is an array of steps (plain objects, or built with
 * `step`/`waitStep`; a `Steps` in it adds its steps), a `Steps` from `chain`/`group`, or a
 * whole body (`{steps, name, onFailure, idempotencyKey, tags}`; snake_case wire names work
 * too). `options` set the flow's fields.
 */
export declare function flowBody(flow: Array<FlowStep | Steps> | Steps | FlowSpec, options?: FlowOptions): Record<string, unknown>;
