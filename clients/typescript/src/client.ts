// The producer side: enqueue, enqueue many, read and cancel jobs; create, watch, signal and
// cancel workflows; operators' calls for payload schemas, circuit breakers and named limits.

import type http from 'node:http';
import { Transport, seg } from './http.js';
import { NotFound } from './errors.js';
import { flowBody } from './flows.js';
import type { FlowFailurePolicy, FlowOptions, FlowSpec, FlowState, FlowStep, ParentFailurePolicy, StepState, Steps } from './flows.js';
import { aliased, enqueueBody } from './jobs.js';
import type { EnqueueOptions, JobSpec, JobState, SequenceOnDead, SequenceSettings } from './jobs.js';
export type {
  DebounceMode,
  DebounceOptions,
  EnqueueOptions,
  JobSpec,
  JobState,
  SequenceOnDead,
  SequenceOptions,
  SequenceSettings,
  ThrottleOptions,
  UniqueOptions,
} from './jobs.js';

/** One failed attempt in a job's history. */
export interface ErrorRecord {
  attempt: number;
  at: string;
  class: string;
  message: string;
  /** The worker that ran the attempt. */
  worker_id?: string;
  /** When the attempt started. */
  started_at?: string;
  /** The stack the worker reported (or a Rust panic's backtrace). */
  backtrace?: string;
}

/** A job in one of these states never runs again unless replayed. */
const FINISHED_STATES: ReadonlySet<string> = new Set(['completed', 'dead', 'cancelled']);
/** The longest one long-poll asks the server for (it caps it at its --max-fetch-wait-ms). */
const MAX_WAIT_MS = 30_000;

/** A job as `GET /v1/jobs/{id}` answers it (field names as in docs/openapi.yaml). */
export interface JobView {
  id: string;
  kind: string;
  queue: string;
  payload: unknown;
  priority: number;
  run_at: string;
  attempt: number;
  max_attempts: number;
  timeout_ms: number | null;
  idempotency_key: string | null;
  tags: string[];
  tenant: string | null;
  state: JobState;
  errors: ErrorRecord[];
  lease: { worker_id: string; expires_at: string } | null;
  result: unknown;
  created_at: string;
  started_at: string | null;
  finished_at: string | null;
  unique_key?: string;
  /** Present when the job expires if not started by then (state `expired`). */
  expires_at?: string;
  /** Present when the producer gave a W3C trace context. */
  trace?: { traceparent: string; tracestate?: string };
  /**
   * Present only on jobs subject to named limits: the key the job holds under each, as
   * `LIMIT:VALUE` (`LIMIT:` for a limit without `key`), stamped at enqueue.
   */
  limit_keys?: string[];
  /**
   * Only from `get`/`wait`: for an available job a named limit holds back now, each of its limit
   * keys with no room left and what uses it (`BlockedBy`); for a `blocked` job, the sequence it
   * waits in and the job in front (`SequenceBlockedBy`).
   */
  blocked_by?: Array<BlockedBy | SequenceBlockedBy>;
  /** Present only on a job of a sequence: its place in it, stamped at enqueue. */
  sequence?: JobSequence;
  [field: string]: unknown;
}

/** A job's place in its sequence (`JobView.sequence`). */
export interface JobSequence {
  /** The sequence: the key expression and the job's value there (`payload.account=acme`). */
  key: string;
  /** Its number: 1 for the first job of the key, each later one more than the last still stored; the order they run in. */
  no: number;
  on_dead: SequenceOnDead;
}

/** What a `blocked` job waits for (`JobView.blocked_by`). */
export interface SequenceBlockedBy {
  /** The sequence (`payload.account=acme`). */
  sequence: string;
  /** The blocked job's own number in it. */
  no: number;
  /** The job in front that holds the sequence; absent when none is found (the blocked job is being released). */
  job?: string;
  state?: JobState;
  /** The number of the job in front. */
  holder_no?: number;
}

/** One limit key with no room left that holds an available job back (`JobView.blocked_by`). */
export interface BlockedBy {
  /** The limit's name. */
  limit: string;
  /** The key value (`''` for a limit without `key`). */
  key: string;
  running: number;
  recent_starts: number;
  /** The limit's, when it sets one. */
  concurrency?: number;
  rate?: LimitRate;
}

/** A running job's last progress report. */
export interface Progress {
  percent: number;
  message?: string;
  at: string;
}

/** One step of a flow as `GET /v1/flows/{id}` answers it (field names as in docs/openapi.yaml). */
export interface StepView {
  name: string;
  state: StepState;
  after: string[];
  on_parent_failure: ParentFailurePolicy;
  /** The step's job id (wait steps have none). */
  job_id?: string;
  kind?: string;
  wait?: { signal: string; timeout_ms?: number };
  job_state?: JobState;
  attempts: number;
  /** The step's result (a wait step's signal payload). */
  result?: unknown;
  error?: { class: string; message: string };
  progress?: Progress;
  wait_deadline?: string;
  compensation?: 'running' | 'completed' | 'failed';
  compensation_job_id?: string;
  finished_at?: string;
  [field: string]: unknown;
}

/** A flow as `GET /v1/flows/{id}` answers it. `steps` is empty in `listFlows`. */
export interface FlowView {
  id: string;
  name?: string;
  state: FlowState;
  on_failure: FlowFailurePolicy;
  /** The step the flow failed at (or whose compensation died). */
  failed_step?: string;
  tags: string[];
  created_at: string;
  finished_at?: string;
  steps: StepView[];
  /** How many steps are in each state. */
  step_counts: Partial<Record<StepState, number>>;
  [field: string]: unknown;
}

/** What `createFlow` resolves with: each job step's job id by step name (wait steps have none). */
export interface CreatedFlow {
  id: string;
  steps: Record<string, string>;
  /** The idempotency key matched a stored flow, which is answered instead. */
  duplicate: boolean;
}

/** A page of `listFlows`, newest first; `next` is the `after` of the next page (null on the last). */
export interface FlowPage {
  flows: FlowView[];
  next: string | null;
}

export interface ListFlowsOptions {
  state?: FlowState;
  name?: string;
  limit?: number;
  after?: string;
}

export type SignalOutcome = 'delivered' | 'stored';

/** A flow in one of these states has ended (only `running` and `compensating` have not). */
const FLOW_FINISHED_STATES: ReadonlySet<string> = new Set(['completed', 'failed', 'compensated', 'cancelled']);

/** A kind's settings: its payload schema (JSON Schema 2020-12) and your version of it. */
export interface KindSettings {
  kind: string;
  schema: unknown;
  version: number | null;
  /** The kind's circuit breaker (see `setCircuitBreaker`); absent when it has none. */
  circuit_breaker?: BreakerSettings;
  /** The kind's sequence (set with `PUT /v1/kinds/{kind}` `{ sequence }`); absent when it has none. */
  sequence?: SequenceSettings;
  /** How the kind's jobs are batched (see `setBatch`); absent when it is not a batch kind. */
  batch?: BatchSettings;
  updated_at: string;
}

/**
 * A batch kind's settings as the server answers them (`KindSettings.batch`): its jobs go out
 * only to batch fetches (`worker.handleBatch`), up to `max_size` at once, all of one queue and
 * one value of `key`, once that many wait or the oldest has waited `max_wait_ms`.
 */
export interface BatchSettings {
  /** Most jobs in one batch: 1 to 1,000. */
  max_size: number;
  /** How long the oldest waiting job may wait for its batch to fill, in ms (0 to an hour; 0: at once). */
  max_wait_ms: number;
  /** The key expression batches are split by; absent when batches hold any jobs of the kind. */
  key?: string;
}

/** What `setBatch` takes (camelCase; the server's names are taken too, so `BatchSettings` can be sent back as they are). */
export interface BatchOptions {
  /** Most jobs in one batch: 1 to 1,000. */
  maxSize?: number;
  /** How long the oldest waiting job may wait for its batch to fill, in ms: 0 (default: a batch goes out as soon as any job waits) to 3,600,000. */
  maxWaitMs?: number;
  /**
   * A key expression (`tenant`, `kind`, `queue` or a payload path such as `payload.account`):
   * a batch holds jobs of one value there only (jobs without one are batched together).
   */
  key?: string;
  /** The server's name for `maxSize`. */
  max_size?: number;
  /** The server's name for `maxWaitMs`. */
  max_wait_ms?: number;
}

/**
 * A circuit breaker's settings, in the server's field names (as `BreakerView.settings` shows
 * them, so a view's settings can be sent back as they are). `setCircuitBreaker` takes any of
 * them (the server's default in brackets); answers have every one. It opens when, over the
 * last `window_ms`, at least `min_calls` attempts finished and at least `failure_ratio` of them
 * failed; stays open `open_ms`; then hands out `half_open_calls` probe jobs, which must all
 * succeed to close it.
 */
export interface BreakerSettings {
  /** Share of failed attempts that opens it: above 0, at most 1 [0.5]. */
  failure_ratio: number;
  /** Fewest attempts in the window before it may open: 1 to 1,000,000 [10]. */
  min_calls: number;
  /** The sliding window attempts are counted over, in ms: 100 ms to a week [60 000]. */
  window_ms: number;
  /** How long it stays open before probing, in ms: 100 ms to a week [30 000]. */
  open_ms: number;
  /** Probe jobs handed out while half-open; that many successes close it: 1 to 1,000 [1]. */
  half_open_calls: number;
  /** A failure with a retry-after (a dependency's 429) opens it until then; meant for a kind's breaker [false]. */
  pause_on_retry_after: boolean;
}

export type BreakerScope = 'queue' | 'kind';

/** `closed`: jobs are handed out and attempts counted; `open`: none are; `half_open`: a few probe jobs are. */
export type BreakerState = 'closed' | 'open' | 'half_open';

/** A queue's or a kind's circuit breaker and its state, as the server answers it. */
/** A duration distribution in milliseconds, estimated from the server's histograms. */
export interface Latency {
  count: number;
  mean_ms: number;
  p50_ms: number;
  p95_ms: number;
  p99_ms: number;
}

/** Counts of one step of the history (with `at`), or of the whole span. */
export interface StatsPoint {
  at?: string;
  enqueued: number;
  started: number;
  completed: number;
  /** Every failed attempt; of those `retried` were scheduled again and `dead` died. */
  failed: number;
  retried: number;
  dead: number;
  /** `failed / (completed + failed)`; null when nothing ended. */
  failure_rate: number | null;
  run_time: Latency | null;
  queue_wait: Latency | null;
}

/** One queue's jobs of one kind over the span. */
export interface KindStats extends StatsPoint {
  queue: string;
  kind: string;
  throughput_per_min: number;
}

/** The answer of `GET /v1/stats`. */
export interface StatsReport {
  from: string;
  to: string;
  step_s: number;
  queue: string | null;
  kind: string | null;
  series: StatsPoint[];
  totals: StatsPoint;
  kinds: KindStats[];
}

/** What `stats()` asks for: times as Dates or RFC 3339 strings, `step` as seconds or `'5m'`. */
export interface StatsOptions {
  from?: Date | string;
  to?: Date | string;
  step?: number | string;
  queue?: string;
  kind?: string;
}

export interface BreakerView {
  scope: BreakerScope;
  /** The queue or the kind. */
  name: string;
  state: BreakerState;
  /** Absent when none are configured (it may still be open, by hand). */
  settings?: BreakerSettings;
  /** Attempts finished in the current sliding window (estimated; 0 without settings). */
  calls: number;
  /** Of those, the failed ones. */
  failures: number;
  /** When it last opened. */
  opened_at: string | null;
  /** While open, when it starts probing; null when open until closed by hand (or not open). */
  open_until: string | null;
  probes_started: number;
  probe_successes: number;
  /** Why it last changed state. */
  reason: string | null;
  /** Opened by an operator or a retry-after, not by its failure ratio. */
  manual: boolean;
  /** When it last changed state; null when it never has. */
  changed_at: string | null;
  [field: string]: unknown;
}

/** At most `count` jobs of one key start within any `period_ms` (up to a day). */
export interface LimitRate {
  count: number;
  period_ms: number;
}

/**
 * What `putLimit` sends, in the server's field names (`PUT /v1/limits/{name}`): `concurrency`,
 * `rate` or both.
 */
export interface LimitSettings {
  /** At most this many jobs of one key run at once, across every worker and server. */
  concurrency?: number;
  /** At most `count` jobs of one key start within any `period_ms`. */
  rate?: LimitRate;
  /**
   * Where a job's key is taken from: `tenant`, `kind`, `queue` or a payload path
   * (`payload.customer.id`). Without it, every job subject to the limit shares one budget.
   */
  key?: string;
  /** Starts per round-robin turn by key value (`{ acme: 3 }`; other keys get one). */
  weights?: Record<string, number>;
}

/** A named limit as the server answers it; fields it does not set are absent. */
export interface Limit extends LimitSettings {
  name: string;
  updated_at: string;
  [field: string]: unknown;
}

/** What one key of a limit uses now. */
export interface KeyUsage {
  /** The key value (`''` for a limit without `key`). */
  key: string;
  running: number;
  /** Starts within the limit's rate period (0 without a rate). */
  recent_starts: number;
}

/** A named limit with what its keys use now (`getLimit`). */
export interface LimitView extends Limit {
  /** Running jobs under the limit, over all its keys. */
  in_use: number;
  /** Each key with running jobs or recent starts, by key. */
  usage: KeyUsage[];
}

/** Whose circuit breaker: `{ queue: 'payments' }` or `{ kind: 'charge' }` (the kind in every queue). */
export type BreakerTarget = { queue: string; kind?: undefined } | { kind: string; queue?: undefined };

export interface OpenCircuitOptions {
  /** Stay open this many milliseconds, then probe (or close, without settings); by default until `closeCircuit`. */
  openMs?: number;
  /** Why, for the audit log and the dashboard (at most 500 characters). */
  reason?: string;
}

export interface CloseCircuitOptions {
  /** Why, for the audit log and the dashboard (at most 500 characters). */
  reason?: string;
}

/** Whether a flow has ended (any state but `running` and `compensating`). */
export function flowFinished(flow: Pick<FlowView, 'state'>): boolean {
  return FLOW_FINISHED_STATES.has(flow.state);
}

export interface ClientOptions {
  /** The server, e.g. `http://127.0.0.1:7700`. */
  url: string;
  /** An API token (`cv_...`), sent as `Authorization: Bearer`; needed with access control on. */
  token?: string | null;
  /** Per-request timeout in milliseconds (default 60 000). */
  timeoutMs?: number;
  /** Your own http(s).Agent; by default the client keeps its own keep-alive agent. */
  agent?: http.Agent;
}

/**
 * Enqueues, reads and cancels jobs. Every method rejects with a `ConveyorError` subclass:
 * `InvalidRequest` (400/413, `field` names the input), `Unauthorized` (401), `Forbidden`
 * (403), `NotFound` (404), `Conflict` (409), `QueueFull` (429, `retryAfter` in seconds),
 * `ServerError` (5xx) or `ConnectionError` (the server could not be reached).
 */
/** What `sendEvent` made: the event's id and one job per matching subscription. */
export interface SentEvent {
  id: string;
  name: string;
  jobs: { subscription: string; job_id: string; duplicate: boolean }[];
}

export class Client {
  /** @internal */
  readonly transport: Transport;

  constructor(options: ClientOptions) {
    this.transport = new Transport(options);
  }

  /**
   * Enqueues one job; resolves with its id (the existing job's id for a duplicate, or the job a
   * `debounce` or `throttle` folded the enqueue into).
   */
  async enqueue(kind: string, payload?: unknown, opts: EnqueueOptions = {}): Promise<string> {
    const res = await this.transport.request<{ id: string }>('POST', '/v1/jobs', enqueueBody(kind, payload, opts));
    return res.body.id;
  }

  /**
   * Enqueues many jobs in one all-or-nothing request; resolves with their ids in order (for an
   * enqueue a `debounce` or `throttle` folded, the id of the job that stands).
   */
  async enqueueMany(jobs: JobSpec[]): Promise<string[]> {
    if (!Array.isArray(jobs)) throw new TypeError('conveyor: enqueueMany takes an array of jobs');
    if (jobs.length === 0) return [];
    const body = { jobs: jobs.map((job, i) => enqueueBody(job.kind, job.payload, job, `jobs[${i}].`)) };
    const res = await this.transport.request<{ ids: string[] }>('POST', '/v1/jobs/batch', body);
    return res.body.ids;
  }

  /**
   * Sends an event: every subscription to `name` (`PUT /v1/subscriptions/{name}`) makes a job
   * of it, all in one transaction. Sent again with the same `id`, it makes nothing new.
   */
  async sendEvent(name: string, payload?: unknown, opts: { id?: string } = {}): Promise<SentEvent> {
    const body: Record<string, unknown> = { name, payload: payload ?? {} };
    if (opts.id !== undefined) body.id = opts.id;
    const res = await this.transport.request<SentEvent>('POST', '/v1/events', body);
    return res.body;
  }

  /** The job with its error history; rejects with `NotFound` when there is none. */
  async get(id: string): Promise<JobView> {
    const res = await this.transport.request<JobView>('GET', `/v1/jobs/${seg(id)}`);
    return res.body;
  }

  /**
   * Resolves with the job once it has finished (`completed`, `dead` or `cancelled`), or as it
   * is when `timeoutMs` (default 30 000) passes first. The server holds the request until then
   * (`GET /v1/jobs/{id}?wait_ms=`), so waiting costs no polling.
   */
  async wait(id: string, options: { timeoutMs?: number } = {}): Promise<JobView> {
    const deadline = Date.now() + checkTimeout(options.timeoutMs ?? 30_000, 'wait');
    for (;;) {
      const waitMs = Math.min(Math.max(0, Math.floor(deadline - Date.now())), MAX_WAIT_MS);
      const res = await this.transport.request<JobView>(
        'GET',
        `/v1/jobs/${seg(id)}?wait_ms=${waitMs}`,
        undefined,
        { timeoutMs: waitMs + 30_000 },
      );
      if (FINISHED_STATES.has(res.body.state) || Date.now() >= deadline) return res.body;
    }
  }

  /** Cancels an unfinished job (admin role); resolves with the cancelled job. */
  async cancel(id: string): Promise<JobView> {
    const res = await this.transport.request<JobView>('POST', `/v1/jobs/${seg(id)}/cancel`, {});
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
  async createFlow(flow: Array<FlowStep | Steps> | Steps | FlowSpec, options: FlowOptions = {}): Promise<CreatedFlow> {
    const res = await this.transport.request<CreatedFlow>('POST', '/v1/flows', flowBody(flow, options));
    return res.body;
  }

  /** The flow with every step; rejects with `NotFound` for an unknown id (or another producer's flow). */
  async getFlow(id: string): Promise<FlowView> {
    const res = await this.transport.request<FlowView>('GET', `/v1/flows/${seg(id)}`);
    return res.body;
  }

  /**
   * Resolves with the flow once it has finished (`completed`, `failed`, `compensated` or
   * `cancelled`), or as it is when `timeoutMs` (default 30 000) passes first; the server holds
   * each request (`GET /v1/flows/{id}?wait_ms=`), so waiting costs no polling.
   */
  async waitFlow(id: string, options: { timeoutMs?: number } = {}): Promise<FlowView> {
    const deadline = Date.now() + checkTimeout(options.timeoutMs ?? 30_000, 'waitFlow');
    for (;;) {
      const waitMs = Math.min(Math.max(0, Math.floor(deadline - Date.now())), MAX_WAIT_MS);
      const res = await this.transport.request<FlowView>('GET', `/v1/flows/${seg(id)}?wait_ms=${waitMs}`, undefined, {
        timeoutMs: waitMs + 30_000,
      });
      if (flowFinished(res.body) || Date.now() >= deadline) return res.body;
    }
  }

  /** Flows newest first, without their steps (admin role); pass `next` as `after` for the next page. */
  async listFlows(options: ListFlowsOptions = {}): Promise<FlowPage> {
    const query = new URLSearchParams();
    for (const key of ['state', 'name', 'limit', 'after'] as const) {
      const value = options[key];
      if (value !== undefined && value !== null) query.set(key, String(value));
    }
    const text = query.toString();
    const res = await this.transport.request<FlowPage>('GET', `/v1/flows${text ? `?${text}` : ''}`);
    return res.body;
  }

  /** Cancels every unfinished step of the flow; resolves with it. `Conflict` when it has already ended. */
  async cancelFlow(id: string): Promise<FlowView> {
    const res = await this.transport.request<FlowView>('POST', `/v1/flows/${seg(id)}/cancel`, {});
    return res.body;
  }

  /**
   * Delivers `signal` to the flow's step waiting for it, which completes with `payload` as its
   * result. Resolves with `'delivered'`, or `'stored'` when the step has not begun waiting yet
   * (it completes as soon as it does). `InvalidRequest` (field `signal`) when no step waits for
   * it; `Conflict` when that step has finished.
   */
  async signal(flowId: string, signal: string, payload?: unknown): Promise<SignalOutcome> {
    if (typeof signal !== 'string') throw new TypeError('conveyor: signal must be a string');
    const body: Record<string, unknown> = { signal };
    if (payload !== undefined) body.payload = payload;
    const res = await this.transport.request<{ outcome: SignalOutcome }>('POST', `/v1/flows/${seg(flowId)}/signal`, body);
    return res.body.outcome;
  }

  /**
   * Sets `kind`'s payload schema (JSON Schema 2020-12; admin role): from then on every enqueue
   * of the kind, from any language, is checked against it, and a payload that does not pass is
   * refused with `InvalidRequest` naming the place (`payload/user_id`). `Conflict` (with
   * `would_fail` in the answer) when queued jobs of the kind would not pass, unless `force`.
   */
  async setSchema(kind: string, schema: unknown, options: { version?: number; force?: boolean } = {}): Promise<KindSettings> {
    const body: Record<string, unknown> = { schema };
    if (options.version !== undefined) body.version = options.version;
    if (options.force) body.force = true;
    const res = await this.transport.request<KindSettings>('PUT', `/v1/kinds/${seg(kind)}`, body);
    return res.body;
  }

  /** `kind`'s settings; `NotFound` when it has none. */
  async getSchema(kind: string): Promise<KindSettings> {
    const res = await this.transport.request<KindSettings>('GET', `/v1/kinds/${seg(kind)}`);
    return res.body;
  }

  /** Every kind with settings, by name. */
  async listSchemas(): Promise<KindSettings[]> {
    const res = await this.transport.request<{ kinds: KindSettings[] }>('GET', '/v1/kinds');
    return res.body.kinds;
  }

  /** Removes `kind`'s schema (its jobs stay); `NotFound` when it had none. */
  async deleteSchema(kind: string): Promise<void> {
    await this.transport.request<unknown>('DELETE', `/v1/kinds/${seg(kind)}`);
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
  async setBatch(kind: string, settings: BatchOptions | null): Promise<BatchSettings | null> {
    if (typeof kind !== 'string' || kind === '') throw new TypeError('conveyor: setBatch kind must be a non-empty string');
    if (settings === undefined || (settings !== null && (typeof settings !== 'object' || Array.isArray(settings)))) {
      throw new TypeError('conveyor: setBatch settings must be { maxSize, maxWaitMs?, key? }, or null to remove them');
    }
    const res = await this.transport.request<KindSettings>('PUT', `/v1/kinds/${seg(kind)}`, { batch: batchBody(settings) });
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
  async setCircuitBreaker(target: BreakerTarget, settings: Partial<BreakerSettings> | null): Promise<BreakerSettings | null> {
    const { scope, name } = breakerTarget(target);
    if (settings === undefined || (settings !== null && (typeof settings !== 'object' || Array.isArray(settings)))) {
      throw new TypeError('conveyor: setCircuitBreaker settings must be an object of breaker settings, or null to remove it');
    }
    const body: Record<string, unknown> = { circuit_breaker: settings };
    if (scope === 'kind') {
      // The server keeps a schema left out of the request but resets a version left out.
      let existing: KindSettings | null = null;
      try {
        existing = (await this.transport.request<KindSettings>('GET', scopePath(scope, name))).body;
      } catch (e) {
        if (!(e instanceof NotFound)) throw e;
        if (settings === null) return null; // no settings, so no breaker to remove
      }
      if (existing?.version !== undefined && existing.version !== null) body.version = existing.version;
    }
    const res = await this.transport.request<{ circuit_breaker?: BreakerSettings | null }>('PUT', scopePath(scope, name), body);
    return res.body.circuit_breaker ?? null;
  }

  /**
   * Opens the circuit breaker of `{ queue }` or of `{ kind }` by hand (admin role), whether or
   * not one is configured: none of its jobs are handed out. With `openMs` it probes after that
   * long (or closes, without settings); without, it stays open until `closeCircuit`. `reason`
   * goes to the audit log and the dashboard. Resolves with the breaker now.
   */
  async openCircuit(target: BreakerTarget, options: OpenCircuitOptions = {}): Promise<BreakerView> {
    const { scope, name } = breakerTarget(target);
    const body: Record<string, unknown> = {};
    if (options.openMs !== undefined) {
      if (typeof options.openMs !== 'number' || !Number.isInteger(options.openMs)) {
        throw new TypeError('conveyor: openCircuit openMs must be a whole number of milliseconds');
      }
      body.open_ms = options.openMs;
    }
    if (options.reason !== undefined) body.reason = checkReason(options.reason, 'openCircuit');
    const res = await this.transport.request<BreakerView>('POST', scopePath(scope, name, 'open'), body);
    return res.body;
  }

  /** Closes the circuit breaker of `{ queue }` or of `{ kind }` by hand (admin role): its jobs are handed out again at once. Resolves with the breaker now. */
  async closeCircuit(target: BreakerTarget, options: CloseCircuitOptions = {}): Promise<BreakerView> {
    const { scope, name } = breakerTarget(target);
    const body: Record<string, unknown> = {};
    if (options.reason !== undefined) body.reason = checkReason(options.reason, 'closeCircuit');
    const res = await this.transport.request<BreakerView>('POST', scopePath(scope, name, 'close'), body);
    return res.body;
  }

  /** Every circuit breaker, queues' and kinds', that is configured or has a stored state. */
  async listBreakers(): Promise<BreakerView[]> {
    const res = await this.transport.request<{ breakers: BreakerView[] }>('GET', '/v1/breakers');
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
  async putLimit(name: string, settings: LimitSettings): Promise<Limit> {
    if (settings === null || typeof settings !== 'object' || Array.isArray(settings)) {
      throw new TypeError('conveyor: putLimit settings must be an object ({ concurrency, rate, key, weights })');
    }
    const res = await this.transport.request<Limit>('PUT', limitPath(name, 'putLimit'), settings);
    return res.body;
  }

  /** The limit with what each of its keys uses now (`in_use`, `usage`); `NotFound` when there is none. */
  async getLimit(name: string): Promise<LimitView> {
    const res = await this.transport.request<LimitView>('GET', limitPath(name, 'getLimit'));
    return res.body;
  }

  /** Every named limit, by name. */
  async listLimits(): Promise<Limit[]> {
    const res = await this.transport.request<{ limits: Limit[] }>('GET', '/v1/limits');
    return res.body.limits;
  }

  /**
   * Removes the limit; `NotFound` when there is none, `Conflict` (code `limit_in_use`) while a
   * queue's or a kind's settings still name it. Jobs naming it themselves do not hold it back;
   * from then on it limits nothing.
   */
  async deleteLimit(name: string): Promise<void> {
    await this.transport.request<unknown>('DELETE', limitPath(name, 'deleteLimit'));
  }

  /**
   * The server's history (admin or viewer role): per-step counts (`series`), `totals` and a
   * summary per queue and kind (`kinds`), with run time and queue wait p50/p95/p99. Defaults to
   * the last hour, about 120 points.
   */
  async stats(options: StatsOptions = {}): Promise<StatsReport> {
    const query = new URLSearchParams();
    for (const key of ['from', 'to', 'step', 'queue', 'kind'] as const) {
      const value = options[key];
      if (value === undefined || value === null) continue;
      query.set(key, value instanceof Date ? value.toISOString() : String(value));
    }
    const text = query.toString();
    const res = await this.transport.request<StatsReport>('GET', `/v1/stats${text ? `?${text}` : ''}`);
    return res.body;
  }

  /** Closes idle keep-alive connections. The client stays usable (a new request reconnects). */
  close(): void {
    this.transport.close();
  }
}

/** `{ queue }` or `{ kind }`, checked: exactly one, a non-empty string. */
function breakerTarget(target: BreakerTarget): { scope: BreakerScope; name: string } {
  const t = (target ?? {}) as { queue?: unknown; kind?: unknown };
  if (typeof target !== 'object' || (t.queue === undefined) === (t.kind === undefined)) {
    throw new TypeError('conveyor: give { queue } or { kind } (exactly one): whose circuit breaker');
  }
  const scope: BreakerScope = t.queue !== undefined ? 'queue' : 'kind';
  const name = t[scope];
  if (typeof name !== 'string' || name === '') throw new TypeError(`conveyor: ${scope} must be a non-empty string`);
  return { scope, name };
}

function scopePath(scope: BreakerScope, name: string, action?: 'open' | 'close'): string {
  const path = `/v1/${scope === 'queue' ? 'queues' : 'kinds'}/${seg(name)}`;
  return action ? `${path}/circuit/${action}` : path;
}

/** The `batch` of a kind's settings: `{ max_size, max_wait_ms?, key? }`, or null. */
export function batchBody(settings: BatchOptions | null): Record<string, unknown> | null {
  if (settings === null) return null;
  const { maxSize, max_size: maxSizeWire, maxWaitMs, max_wait_ms: maxWaitWire, ...rest } = settings;
  // Fields the server does not know go as they are: it names them in a 400.
  const body: Record<string, unknown> = { ...rest };
  aliased(body, 'max_size', maxSize, maxSizeWire, 'setBatch: give maxSize or max_size, not both');
  aliased(body, 'max_wait_ms', maxWaitMs, maxWaitWire, 'setBatch: give maxWaitMs or max_wait_ms, not both');
  return body;
}

function limitPath(name: string, what: string): string {
  if (typeof name !== 'string' || name === '') throw new TypeError(`conveyor: ${what} name must be a non-empty string`);
  return `/v1/limits/${seg(name)}`;
}

function checkReason(reason: unknown, what: string): string {
  if (typeof reason !== 'string') throw new TypeError(`conveyor: ${what} reason must be a string`);
  return reason;
}

function checkTimeout(timeoutMs: number, what: string): number {
  if (typeof timeoutMs !== 'number' || !Number.isFinite(timeoutMs) || timeoutMs < 0) {
    throw new TypeError(`conveyor: ${what} timeoutMs must be a non-negative number of milliseconds`);
  }
  return timeoutMs;
}
