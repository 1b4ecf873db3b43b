// The worker: fetch under a lease (long-poll), run handlers, heartbeat, acknowledge in batches,
// drain on SIGTERM/SIGINT or close().

import os from 'node:os';
import { randomBytes } from 'node:crypto';
import type http from 'node:http';
import { Transport, VERSION, seg } from './http.js';
import {
  ConveyorError,
  Forbidden,
  InvalidRequest,
  LeaseLost,
  NotFound,
  Permanent,
  Retry,
  RetryAfter,
  Unauthorized,
} from './errors.js';
import { childTraceparent, parseTraceparent, withBatchSpan, withHandlerSpan } from './trace.js';

/** A fetched job, as a handler sees it. */
export interface Job<P = any> {
  readonly id: string;
  readonly kind: string;
  readonly queue: string;
  readonly payload: P;
  /** This attempt's number, 1 on the first run. */
  readonly attempt: number;
  readonly maxAttempts: number;
  /** The job's per-attempt timeout (the worker enforces it), or null. */
  readonly timeoutMs: number | null;
  readonly tenant: string | null;
  readonly tags: string[];
  readonly leaseToken: string;
  /** When the lease ends unless renewed (the worker renews it while the handler runs). */
  leaseExpiresAt: Date;
  /**
   * Aborted when the handler should stop: the lease was lost (the job was cancelled or
   * rescued: its result will be dropped), the job's timeout passed, or the worker's
   * shutdown grace period ended. `signal.reason` says which (`LeaseLostError`,
   * `JobTimeoutError`, `ShutdownError`).
   */
  readonly signal: AbortSignal;
  readonly workerId: string;
  /** For a workflow's step: its flow's id; null for a plain job. */
  readonly flowId: string | null;
  /** For a workflow's step: its name (for a compensation job, the step it compensates); null for a plain job. */
  readonly step: string | null;
  /** For a workflow's step: its completed parent steps' results by step name; `{}` for a plain job. */
  readonly parents: Record<string, unknown>;
  /** When the job would have expired had it not started; null without an expiry. */
  readonly expiresAt: Date | null;
  /** The producer's W3C trace context; null when it gave none. */
  readonly traceparent: string | null;
  readonly tracestate: string | null;
  /** The producer's trace id (32 hex digits), for logs; null without a trace context. */
  readonly traceId: string | null;
  /** A child context for the handler's own span, to pass on to what it calls; null without one. */
  readonly handlerTraceparent: string | null;
  /**
   * Reports how far the handler has come (`POST /v1/jobs/{id}/progress` under this job's
   * lease): `percent` from 0 to 100 (rounded), an optional `message` (at most 1,024
   * characters). Shown in the job's and its flow step's views. Rejects with `LeaseLost` when
   * the job no longer runs here (and aborts `signal`); a report nobody awaits never causes an
   * unhandled rejection.
   */
  progress(percent: number, message?: string): Promise<void>;
}

export type Handler<P = any, R = unknown> = (job: Job<P>) => R | Promise<R>;

/**
 * What a batch handler answers for one job of its batch: an `Error` (any instance, including
 * `Retry`, `RetryAfter` and `Permanent`) fails that job as the same error thrown from a plain
 * handler would; anything else is the job's result and completes it.
 */
export type BatchOutcome<R = unknown> = R | Error;

/**
 * What a batch handler resolves with: one outcome per job, in the order of the jobs it was
 * given (an item may be a promise of one, e.g. from `jobs.map(async (job) => ...)`: it is
 * awaited, and its rejection fails that job); or `undefined`/`null` to complete every job
 * without a result.
 */
export type BatchResult<R = unknown> = ReadonlyArray<BatchOutcome<R> | PromiseLike<BatchOutcome<R>>> | null | undefined | void;

/**
 * A handler for the jobs of a batch kind (`worker.handleBatch`): it gets the jobs of one batch
 * (one kind, one queue, one batch key; each the same `Job` a plain handler gets) and answers one
 * outcome per job. Throwing fails every job of the batch with that error.
 */
export type BatchHandler<P = any, R = unknown> = (jobs: Job<P>[]) => BatchResult<R> | Promise<BatchResult<R>>;

/** Where the worker writes what it does; `console` fits. */
export interface Logger {
  info(message: string): void;
  warn(message: string): void;
  error(message: string): void;
}

export interface WorkerOptions {
  /** The server, e.g. `http://127.0.0.1:7700`. */
  url: string;
  /** A worker (or admin) API token; needed with access control on. */
  token?: string | null;
  /** Queues to take jobs from (default `["default"]`). */
  queues?: string[];
  /**
   * Handlers running at once (default 10). Batch handlers (`handleBatch`) have as many slots
   * again of their own: up to this many batches run at once besides the plain jobs, each
   * batch one slot whatever its size.
   */
  concurrency?: number;
  /** Lease asked for each job, in ms (default 30 000); leases are renewed every leaseMs/3. */
  leaseMs?: number;
  /** On shutdown, how long running handlers may take to finish before they are released (default 25 000 ms). */
  graceMs?: number;
  /**
   * Jobs claimed ahead of free slots, so that one round trip brings enough work for the next:
   * they are held (leases renewed) until a slot frees, and released at shutdown. `'auto'`
   * (default) holds about two round trips' worth of work at the handlers' measured pace (none
   * for handlers much slower than a round trip; up to 1000 for no-op handlers); a number fixes
   * it; 0 claims only for free slots.
   */
  prefetch?: number | 'auto';
  /** Long-poll wait of a fetch, in ms (default 20 000; the server caps it, at 30 s by default). */
  waitMs?: number;
  /** This worker's id in `/v1/workers` (default `HOST-PID-RANDOM`). */
  workerId?: string;
  /** Drain on SIGTERM and SIGINT while `run()` runs (default true). A second signal skips the rest of the grace period. */
  handleSignals?: boolean;
  /** Where to log (default: lines on stderr); null for silence. */
  logger?: Logger | null;
  /** First retry delay after a network error or 5xx, in ms (default 100); doubles up to `backoffMaxMs`. */
  backoffMinMs?: number;
  /** Longest retry delay, in ms (default 5 000). */
  backoffMaxMs?: number;
  /** Your own http(s).Agent. */
  agent?: http.Agent;
}

/** `signal.reason` when a job's lease was lost. */
export class LeaseLostError extends Error {
  override get name(): string {
    return 'LeaseLostError';
  }
}
/** `signal.reason` when a job ran past its `timeoutMs`. */
export class JobTimeoutError extends Error {
  override get name(): string {
    return 'JobTimeoutError';
  }
}
/** `signal.reason` when the worker's shutdown grace period ended with the handler still running. */
export class ShutdownError extends Error {
  override get name(): string {
    return 'ShutdownError';
  }
}

interface FetchedJob {
  id: string;
  kind: string;
  queue: string;
  payload: unknown;
  attempt: number;
  max_attempts: number;
  timeout_ms: number | null;
  lease_token: string;
  lease_expires_at: string;
  tenant: string | null;
  tags: string[];
  flow_id?: string;
  step?: string;
  parents?: Record<string, unknown>;
  expires_at?: string;
  traceparent?: string;
  tracestate?: string;
}

interface CompleteItem {
  id: string;
  lease_token: string;
  result?: unknown;
}

interface FailItem {
  id: string;
  lease_token: string;
  error: { class?: string; message: string; backtrace?: string };
  retry: 'auto' | 'never' | 'after';
  retry_after_ms?: number;
}

type Failure = Omit<FailItem, 'id' | 'lease_token'>;

interface AckResult {
  id: string;
  status: string;
  lease_expires_at?: string;
}

interface Acks {
  complete: CompleteItem[];
  fail: FailItem[];
}

type HeldState = 'buffered' | 'running' | 'acking' | 'done';

interface Held {
  job: RunningJob;
  state: HeldState;
  /** The lease is gone (heartbeat said so): the result is dropped. */
  lost: boolean;
  /** Released at shutdown while the handler still ran: the result is dropped. */
  released: boolean;
  /** The slot was given back before the handler settled (timeout). */
  slotFreed: boolean;
  timer: NodeJS.Timeout | undefined;
  /** performance.now() when the handler started. */
  startedAt: number;
  /** Created when the handler first reads `job.signal` (most never do). */
  controller?: AbortController;
  abortReason?: Error;
  /** The batch the job runs in (batch kinds only). */
  batch?: RunningBatch;
}

/** A batch whose handler runs: one batch slot, however many jobs. */
interface RunningBatch {
  kind: string;
  jobs: Held[];
  /** The batch slot was given back before the handler settled (timeout). */
  slotFreed: boolean;
  timer: NodeJS.Timeout | undefined;
}

/** A first-in first-out queue with O(1) shift. */
class Fifo<T> {
  private items: T[] = [];
  private head = 0;

  get length(): number {
    return this.items.length - this.head;
  }

  push(item: T): void {
    this.items.push(item);
  }

  shift(): T | undefined {
    if (this.head >= this.items.length) return undefined;
    const item = this.items[this.head];
    this.items[this.head++] = undefined as T;
    if (this.head > 1024 && this.head * 2 > this.items.length) {
      this.items = this.items.slice(this.head);
      this.head = 0;
    }
    return item;
  }

  remove(item: T): void {
    const i = this.items.indexOf(item, this.head);
    if (i >= 0) this.items.splice(i, 1);
  }

  /** Removes and returns up to `n` items from the end (the newest). */
  popTail(n: number): T[] {
    const count = Math.max(0, Math.min(n, this.length));
    return this.items.splice(this.items.length - count, count);
  }

  takeAll(): T[] {
    const all = this.items.slice(this.head);
    this.items = [];
    this.head = 0;
    return all;
  }
}

/** Aborts the job's signal (now, or when the handler first reads it). */
function abortHeld(h: Held, reason: Error): void {
  if (h.abortReason) return;
  h.abortReason = reason;
  h.controller?.abort(reason);
}

function ewma(avg: number | null, sample: number): number {
  return avg === null ? sample : avg + 0.2 * (sample - avg);
}

type ProgressReporter = (h: Held, percent: number, message: string | undefined) => Promise<void>;

/** The job object handed to handlers. */
class RunningJob implements Job {
  readonly id: string;
  readonly kind: string;
  readonly queue: string;
  readonly payload: any;
  readonly attempt: number;
  readonly maxAttempts: number;
  readonly timeoutMs: number | null;
  readonly tenant: string | null;
  readonly tags: string[];
  readonly leaseToken: string;
  leaseExpiresAt: Date;
  readonly workerId: string;
  readonly flowId: string | null;
  readonly step: string | null;
  readonly parents: Record<string, unknown>;
  readonly expiresAt: Date | null;
  readonly traceparent: string | null;
  readonly tracestate: string | null;
  readonly traceId: string | null;
  readonly handlerTraceparent: string | null;
  readonly #held: Held;
  readonly #report: ProgressReporter;

  constructor(raw: FetchedJob, workerId: string, held: Held, report: ProgressReporter) {
    this.id = raw.id;
    this.kind = raw.kind;
    this.queue = raw.queue;
    this.payload = raw.payload;
    this.attempt = raw.attempt;
    this.maxAttempts = raw.max_attempts;
    this.timeoutMs = raw.timeout_ms ?? null;
    this.tenant = raw.tenant ?? null;
    this.tags = raw.tags ?? [];
    this.leaseToken = raw.lease_token;
    this.leaseExpiresAt = new Date(raw.lease_expires_at);
    this.workerId = workerId;
    this.flowId = raw.flow_id ?? null;
    this.step = raw.step ?? null;
    this.parents = raw.parents && typeof raw.parents === 'object' ? raw.parents : {};
    this.expiresAt = raw.expires_at ? new Date(raw.expires_at) : null;
    this.traceparent = raw.traceparent ?? null;
    this.tracestate = raw.tracestate ?? null;
    this.traceId = parseTraceparent(this.traceparent)?.[0] ?? null;
    this.handlerTraceparent = childTraceparent(this.traceparent);
    this.#held = held;
    this.#report = report;
  }

  progress(percent: number, message?: string): Promise<void> {
    if (typeof percent !== 'number' || !(percent >= 0 && percent <= 100)) {
      return Promise.reject(new RangeError(`conveyor: progress percent must be a number from 0 to 100, got ${String(percent)}`));
    }
    if (message !== undefined && typeof message !== 'string') {
      return Promise.reject(new TypeError('conveyor: progress message must be a string'));
    }
    const sent = this.#report(this.#held, Math.round(percent), message);
    // Handled here so that a report nobody awaits is no unhandled rejection; awaiting `sent`
    // still rejects.
    sent.catch(() => {});
    return sent;
  }

  get signal(): AbortSignal {
    const h = this.#held;
    if (!h.controller) {
      h.controller = new AbortController();
      if (h.abortReason) h.controller.abort(h.abortReason);
    }
    return h.controller.signal;
  }
}

const MAX_ACKS_PER_CALL = 500;
const MAX_FETCH = 1000;
const MAX_AUTO_PREFETCH = 1000;
const HOST = os.hostname();
/** Past this long without a fetch, heartbeats refresh the worker's registration. */
const REGISTRATION_REFRESH_MS = 30_000;
const MAX_LEASES_PER_CALL = 1000;
const MAX_ERROR_MESSAGE = 65_536;
/** The server keeps the first 32 KiB of a stack; send no more. */
const MAX_BACKTRACE = 32 * 1024;
/** How long acknowledgements and releases are retried at the end of a drain. */
const FINAL_FLUSH_MS = 10_000;

const defaultLogger: Logger = {
  info: (m) => process.stderr.write(`conveyor worker: ${m}\n`),
  warn: (m) => process.stderr.write(`conveyor worker: warning: ${m}\n`),
  error: (m) => process.stderr.write(`conveyor worker: error: ${m}\n`),
};

/** A class name for `error.class`: 1-128 characters of `[A-Za-z0-9_.:-]`. */
export function errorClass(err: unknown): string {
  let name = '';
  if (err instanceof Error || (err && typeof err === 'object')) {
    const e = err as { name?: unknown; constructor?: { name?: unknown } };
    const own = typeof e.name === 'string' ? e.name : '';
    const ctor = typeof e.constructor?.name === 'string' ? e.constructor.name : '';
    name = own && own !== 'Error' ? own : ctor && ctor !== 'Object' ? ctor : own;
  }
  return sanitizeClass(name) || 'Error';
}

function sanitizeClass(name: string): string {
  return name.replace(/[^A-Za-z0-9_.:-]/g, '_').slice(0, 128);
}

function errorMessage(err: unknown, withStack: boolean): string {
  let text: string;
  if (err instanceof Error) {
    text = withStack && typeof err.stack === 'string' && err.stack ? err.stack : withStack ? `${err.name}: ${err.message}` : err.message;
  } else {
    try {
      text = typeof err === 'string' ? err : JSON.stringify(err) ?? String(err);
    } catch {
      text = String(err);
    }
  }
  if (!text) text = 'error';
  return text.length > MAX_ERROR_MESSAGE ? `${text.slice(0, MAX_ERROR_MESSAGE - 20)}\n... (truncated)` : text;
}

/** Fatal for run(): retrying cannot help. */
function isFatal(err: unknown): boolean {
  return err instanceof Unauthorized || err instanceof Forbidden;
}

/** Worth retrying with backoff: a connection error, 5xx, 408, 429. */
function isTransient(err: unknown): boolean {
  if (!(err instanceof ConveyorError)) return false;
  return err.status === 0 || err.status >= 500 || err.status === 408 || err.status === 429;
}

function describe(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** An outcome promise of a batch handler's that rejected: its job fails with `reason`. */
class Rejected {
  constructor(readonly reason: unknown) {}
}

function isThenable(value: unknown): value is PromiseLike<unknown> {
  return value !== null && (typeof value === 'object' || typeof value === 'function') && typeof (value as { then?: unknown }).then === 'function';
}

/** A batch handler's answer with the promises among its outcomes settled (a rejection as `Rejected`). */
async function settledOutcomes(outcomes: unknown): Promise<unknown> {
  if (!Array.isArray(outcomes) || !outcomes.some(isThenable)) return outcomes;
  const settled = await Promise.allSettled(outcomes);
  return settled.map((s) => (s.status === 'fulfilled' ? s.value : new Rejected(s.reason)));
}

/** A short description of a value that is not what was expected. */
function describeValue(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return typeof value === 'object' ? `an object (${Object.prototype.toString.call(value)})` : `a ${typeof value}`;
}

/** The failure of a job whose kind has no handler here. */
function unknownKind(kind: string, workerId: string): Failure {
  return {
    error: { class: 'unknown_kind', message: `no handler for kind ${JSON.stringify(kind)} in worker ${workerId}` },
    retry: 'auto',
  };
}

/**
 * Runs handlers for jobs fetched from Conveyor over HTTP.
 *
 * ```js
 * const worker = new Worker({ url, queues: ['mail'], concurrency: 10 });
 * worker.handle('send_email', async (job) => { await send(job.payload); return { sent: true }; });
 * worker.handleBatch('rows.insert', async (jobs) => insertRows(jobs.map((j) => j.payload)));
 * await worker.run(); // until SIGTERM/SIGINT or worker.close()
 * ```
 */
export class Worker {
  readonly workerId: string;
  readonly queues: string[];
  readonly concurrency: number;
  readonly leaseMs: number;
  readonly graceMs: number;
  /** The fixed prefetch, or `'auto'`. */
  readonly prefetch: number | 'auto';
  readonly waitMs: number;

  private readonly transport: Transport;
  private readonly handlers = new Map<string, Handler>();
  private readonly batchHandlers = new Map<string, BatchHandler>();
  private readonly log: Logger;
  private readonly handleSignals: boolean;
  private readonly backoffMinMs: number;
  private readonly backoffMaxMs: number;

  private readonly held = new Map<string, Held>();
  private readonly buffer = new Fifo<Held>();
  private running = 0;
  /** Batches whose handlers run now (each holds one batch slot). */
  private runningBatches = 0;
  private pending: Acks = { complete: [], fail: [] };

  private phase: 'idle' | 'running' | 'draining' | 'stopped' = 'idle';
  private stopping = false;
  private fatalError: unknown = null;
  private closeRequested = false;
  private forceDrain = false;

  /** Fetches in flight, and the jobs they asked for in all. */
  private fetchesInFlight = 0;
  private requested = 0;
  /** The last fetch brought all it asked for: the queue is busy, a second fetcher helps. */
  private saturated = false;
  private lastFetchAt = 0;
  private readonly startedAt = new Date();
  private readonly fetchAborts = new Set<AbortController>();
  /** The fetches in flight that carry no acknowledgements: the drain may cut these off. */
  private readonly longPolls = new Set<AbortController>();
  /**
   * Acknowledgements put back after a request that failed or was cut off: the server may have
   * applied them, so `lease_lost` for one of these is its own first answer coming back late.
   */
  private readonly resent = new WeakSet<CompleteItem | FailItem>();
  private fetchDone: Promise<unknown> = Promise.resolve();
  /** Moving averages for the automatic prefetch: handler run time and fetch round trip (ms). */
  private avgHandlerMs: number | null = null;
  private avgRoundTripMs: number | null = null;
  private ackInFlight = false;
  private ackRetryTimer: NodeJS.Timeout | undefined;
  private ackFailures = 0;
  private flushScheduled = false;
  private heartbeatTimer: NodeJS.Timeout | undefined;
  private heartbeatInFlight = false;
  private heartbeatFailures = 0;

  private readonly loopWaiters = new Set<() => void>();
  private wakeBackoff: (() => void) | null = null;
  private wakeBatchBackoff: (() => void) | null = null;
  private fetchBackingOff = false;
  private wakeDrain: (() => void) | null = null;
  private stopRequested: (() => void) | null = null;
  private runPromise: Promise<void> | null = null;
  private signalListeners: Array<[NodeJS.Signals, () => void]> = [];

  constructor(options: WorkerOptions) {
    if (!options || typeof options !== 'object') throw new TypeError('conveyor: new Worker({url, queues, ...})');
    this.transport = new Transport({ url: options.url, token: options.token, agent: options.agent });
    this.queues = options.queues && options.queues.length > 0 ? [...options.queues] : ['default'];
    this.concurrency = positiveInt('concurrency', options.concurrency ?? 10);
    this.leaseMs = positiveInt('leaseMs', options.leaseMs ?? 30_000);
    if (this.leaseMs < 100) throw new RangeError('conveyor: leaseMs must be at least 100');
    this.graceMs = nonNegative('graceMs', options.graceMs ?? 25_000);
    const prefetch = options.prefetch ?? 'auto';
    this.prefetch = prefetch === 'auto' ? 'auto' : Math.floor(nonNegative('prefetch', prefetch));
    this.waitMs = Math.floor(nonNegative('waitMs', options.waitMs ?? 20_000));
    this.workerId = options.workerId ?? `${os.hostname()}-${process.pid}-${randomBytes(3).toString('hex')}`;
    this.handleSignals = options.handleSignals ?? true;
    this.log = options.logger === null ? { info() {}, warn() {}, error() {} } : options.logger ?? defaultLogger;
    this.backoffMinMs = options.backoffMinMs ?? 100;
    this.backoffMaxMs = options.backoffMaxMs ?? 5_000;
  }

  /**
   * Registers the handler for a kind. Its return value is the job's result (JSON). Replaces a
   * batch handler of the kind.
   */
  handle<P = any, R = unknown>(kind: string, handler: Handler<P, R>): this {
    if (typeof kind !== 'string' || kind === '') throw new TypeError('conveyor: handle(kind, handler): kind must be a non-empty string');
    if (typeof handler !== 'function') throw new TypeError('conveyor: handle(kind, handler): handler must be a function');
    this.batchHandlers.delete(kind);
    this.handlers.set(kind, handler as Handler);
    this.wakeLoops();
    return this;
  }

  /**
   * Registers a batch handler for a kind (replacing a plain one): the kind's jobs are fetched
   * in batches (`POST /v1/fetch` with `batch: true`), up to the kind's `max_size` at once, all
   * of one queue and one batch key, once a batch is full or its oldest job has waited the
   * kind's `max_wait_ms` (set with `client.setBatch`). A kind that is not a batch kind on the
   * server comes as batches of whatever of it waits.
   *
   * The handler gets the batch's jobs and resolves with one outcome per job, in the same
   * order: an `Error` fails that job (retried with backoff; `Retry`, `RetryAfter` and
   * `Permanent` work as when thrown by a plain handler), anything else is its result. Resolving
   * with `undefined` or `null` completes every job without a result; throwing fails every job
   * with the error; jobs left without an outcome (a shorter array) fail. Each job keeps its
   * own attempts, history and dead-letter path. Up to `concurrency` batches run at once,
   * besides the plain jobs; the jobs' leases are renewed while the handler runs; the batch
   * fails as a whole (class `timeout`) once the shortest `timeoutMs` among its jobs passes.
   */
  handleBatch<P = any, R = unknown>(kind: string, handler: BatchHandler<P, R>): this {
    if (typeof kind !== 'string' || kind === '') throw new TypeError('conveyor: handleBatch(kind, handler): kind must be a non-empty string');
    if (typeof handler !== 'function') throw new TypeError('conveyor: handleBatch(kind, handler): handler must be a function');
    this.handlers.delete(kind);
    this.batchHandlers.set(kind, handler as BatchHandler);
    this.wakeLoops();
    return this;
  }

  /** The kinds this worker has plain handlers for (sent as `kinds` on its plain fetches). */
  get kinds(): string[] {
    return [...this.handlers.keys()];
  }

  /** The kinds this worker has batch handlers for (sent as `kinds` on its batch fetches). */
  get batchKinds(): string[] {
    return [...this.batchHandlers.keys()];
  }

  /** Jobs whose (plain) handlers run now. */
  get active(): number {
    return this.running;
  }

  /** Batches whose handlers run now. */
  get activeBatches(): number {
    return this.runningBatches;
  }

  /**
   * Fetches and runs jobs until `close()` or SIGTERM/SIGINT, then drains: stops fetching,
   * lets running handlers finish for up to `graceMs`, acknowledges them, releases the rest,
   * and resolves. Rejects with `Unauthorized` (401) or `Forbidden` (403) when the server
   * refuses the token: retrying cannot help then. Network errors and 5xx are retried.
   */
  run(): Promise<void> {
    if (this.runPromise) return Promise.reject(new Error('conveyor: this worker is already running (or has run)'));
    if (this.handlers.size === 0 && this.batchHandlers.size === 0) {
      return Promise.reject(new Error('conveyor: no handlers: call worker.handle(kind, fn) or worker.handleBatch(kind, fn) before run()'));
    }
    this.runPromise = this.runInner();
    return this.runPromise;
  }

  /** Starts the drain (as SIGTERM does); resolves when `run()` has finished. */
  async close(): Promise<void> {
    this.closeRequested = true;
    if (!this.runPromise) return;
    this.requestStop();
    try {
      await this.runPromise;
    } catch {
      // run()'s caller sees the error.
    }
  }

  // -------------------------------------------------------------------------------------------

  private async runInner(): Promise<void> {
    this.phase = 'running';
    const stopped = new Promise<void>((resolve) => {
      this.stopRequested = resolve;
    });
    if (this.closeRequested) this.requestStop();
    this.installSignals();
    const batches = this.batchHandlers.size > 0 ? `, batch kinds [${this.batchKinds.join(', ')}]` : '';
    this.log.info(
      `${this.workerId}: running kinds [${this.kinds.join(', ')}]${batches} from queues [${this.queues.join(', ')}] at ${this.transport.baseUrl.origin}, concurrency ${this.concurrency}`,
    );
    this.scheduleHeartbeat(Math.max(50, Math.floor(this.leaseMs / 3)));
    this.fetchDone = Promise.all([this.fetchLoop(0), this.fetchLoop(1), this.batchLoop()]);
    try {
      await stopped;
      if (this.fatalError) throw this.fatalError;
      await this.drain();
      if (this.fatalError) throw this.fatalError;
      this.log.info(`${this.workerId}: stopped`);
    } catch (e) {
      this.abortAll(new ShutdownError('the worker stopped on an error'));
      throw e;
    } finally {
      this.phase = 'stopped';
      this.stopping = true;
      for (const abort of this.fetchAborts) abort.abort();
      clearTimeout(this.heartbeatTimer);
      clearTimeout(this.ackRetryTimer);
      this.removeSignals();
      this.transport.close();
    }
  }

  private requestStop(): void {
    if (this.stopping) return;
    this.stopping = true;
    this.wakeLoops();
    this.wakeBackoff?.();
    this.wakeBatchBackoff?.();
    this.stopRequested?.();
  }

  private fail(err: unknown): void {
    if (this.fatalError) return;
    const status = err instanceof ConveyorError ? err.status : 0;
    const what = status === 401 ? '401 Unauthorized' : status === 403 ? '403 Forbidden' : `${status}`;
    this.fatalError = err instanceof ConveyorError && (status === 401 || status === 403)
      ? Object.assign(err, { message: `conveyor worker stopped: the server answered ${what}: ${err.message}` })
      : err;
    this.log.error(describe(this.fatalError));
    this.requestStop();
    this.wakeDrain?.();
  }

  private installSignals(): void {
    if (!this.handleSignals) return;
    for (const sig of ['SIGTERM', 'SIGINT'] as NodeJS.Signals[]) {
      const listener = () => {
        if (!this.stopping) {
          const batches = this.runningBatches > 0 ? ` and ${this.runningBatches} running batch(es)` : '';
          this.log.info(`${sig}: draining (up to ${this.graceMs} ms for ${this.running} running job(s)${batches})`);
          this.requestStop();
        } else if (!this.forceDrain) {
          this.log.info(`${sig} again: releasing running jobs now`);
          this.forceDrain = true;
          this.wakeDrain?.();
        }
      };
      process.on(sig, listener);
      this.signalListeners.push([sig, listener]);
    }
  }

  private removeSignals(): void {
    for (const [sig, listener] of this.signalListeners) process.removeListener(sig, listener);
    this.signalListeners = [];
  }

  private backoff(failures: number): number {
    const base = Math.min(this.backoffMaxMs, this.backoffMinMs * 2 ** Math.min(failures - 1, 30));
    return Math.round(base * (0.5 + Math.random() * 0.5));
  }

  /** The fetch loop's backoff: sleeps `ms`, or less if the worker stops. */
  private pause(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      const self = this;
      this.fetchBackingOff = true;
      function done() {
        clearTimeout(timer);
        if (self.wakeBackoff === done) self.wakeBackoff = null;
        self.fetchBackingOff = false;
        resolve();
      }
      this.wakeBackoff = done;
    });
  }

  // ---- fetching -------------------------------------------------------------------------------

  /** Jobs held ahead of free slots at most, now. */
  private prefetchLimit(): number {
    if (this.prefetch !== 'auto') return this.prefetch;
    if (this.avgHandlerMs === null || this.avgRoundTripMs === null) return 0;
    // Enough for each slot to run through two round trips without waiting for a fetch.
    const perSlot = (2 * this.avgRoundTripMs) / Math.max(this.avgHandlerMs, 0.001);
    return Math.min(MAX_AUTO_PREFETCH, Math.ceil(this.concurrency * perSlot));
  }

  /** How many more jobs may be claimed now. */
  private capacity(): number {
    return this.concurrency + this.prefetchLimit() - this.running - this.buffer.length - this.requested;
  }

  private canFetch(fetcher = 0): boolean {
    if (this.stopping || this.handlers.size === 0) return false;
    // The second fetcher only works while the queue keeps every fetch full.
    if (fetcher > 0 && !this.saturated) return false;
    const capacity = this.capacity();
    if (capacity <= 0) return false;
    if (this.running + this.requested < this.concurrency && this.buffer.length === 0) return true;
    // Only prefetching: wait until a worthwhile batch fits.
    return capacity >= Math.max(1, Math.ceil((this.concurrency + this.prefetchLimit()) / 2));
  }

  private wakeLoops(): void {
    for (const wake of [...this.loopWaiters]) wake();
  }

  /**
   * One fetcher. Fetcher 0 always runs (long-polling when the queue is idle); fetcher 1 only
   * while fetches come back full, so two fetches share the server's commits.
   */
  private async fetchLoop(fetcher: number): Promise<void> {
    let failures = 0;
    while (!this.stopping) {
      if (!this.canFetch(fetcher) || (fetcher > 0 && this.fetchBackingOff)) {
        await new Promise<void>((resolve) => {
          const wake = () => {
            this.loopWaiters.delete(wake);
            resolve();
          };
          this.loopWaiters.add(wake);
        });
        continue;
      }
      // Let handlers that finish in this turn of the event loop put their acks in this fetch.
      await new Promise<void>((resolve) => setImmediate(resolve));
      if (!this.canFetch(fetcher)) continue;
      const acks = this.takeAcks();
      const carriesAcks = acks.complete.length + acks.fail.length > 0;
      // More than one call's worth: the rest goes out with /v1/ack now, not with a later fetch.
      if (this.hasPending()) this.scheduleFlush();
      const max = Math.min(MAX_FETCH, this.capacity());
      const body: Record<string, unknown> = {
        worker_id: this.workerId,
        queues: this.queues,
        max,
        lease_ms: this.leaseMs,
        // A fetch that carries acknowledgements answers at once: their answers (and the jobs'
        // release from `held`) must not wait for a long-poll, and a long-poll cut off at
        // shutdown must carry nothing that would have to be sent again.
        wait_ms: fetcher === 0 && !carriesAcks ? this.waitMs : 0,
        kinds: this.kinds,
        concurrency: this.slots(),
        // Handlers running now (prefetched jobs are held but take no slot).
        busy: this.busySlots(),
        host: HOST,
        pid: process.pid,
        version: `conveyor-client-node/${VERSION}`,
      };
      if (acks.complete.length > 0) body.complete = acks.complete;
      if (acks.fail.length > 0) body.fail = acks.fail;
      const abort = new AbortController();
      if (!carriesAcks) this.longPolls.add(abort);
      this.fetchAborts.add(abort);
      this.fetchesInFlight++;
      this.requested += max;
      const sent = performance.now();
      this.lastFetchAt = Date.now();
      let answer: { jobs?: FetchedJob[]; acks?: AckResult[]; command?: string } | undefined;
      let delay: number | null = null;
      try {
        answer = (
          await this.transport.request<{ jobs?: FetchedJob[]; acks?: AckResult[]; command?: string }>('POST', '/v1/fetch', body, {
            timeoutMs: this.waitMs + 30_000,
            signal: abort.signal,
          })
        ).body;
      } catch (e) {
        this.restoreAcks(acks);
        if (isFatal(e)) {
          this.fail(e);
          return;
        }
        if (abort.signal.aborted || this.stopping) break;
        if (e instanceof InvalidRequest && this.dropBadAck(e)) continue;
        if (!isTransient(e)) {
          this.fail(e);
          return;
        }
        this.saturated = false;
        if (fetcher > 0) continue; // parks until fetches come back full again
        failures++;
        delay = this.backoff(failures);
        if (failures === 1 || failures % 20 === 0) {
          this.log.warn(`fetch failed (${failures} in a row), retrying in ${delay} ms: ${describe(e)}`);
        }
      } finally {
        this.fetchesInFlight--;
        this.requested -= max;
        this.fetchAborts.delete(abort);
        this.longPolls.delete(abort);
      }
      if (delay !== null) {
        const backoff = this.pause(delay);
        this.scheduleFlush(); // acknowledgements go out with /v1/ack meanwhile
        await backoff;
        continue;
      }
      if (answer) {
        if (failures > 0 && fetcher === 0) this.log.info(`fetch works again after ${failures} failure(s)`);
        failures = 0;
        if (answer.command === 'stop' && !this.stopping) {
          // An operator's `conveyor worker stop ID`; under `quiet` the server just hands out nothing.
          this.log.info(`${this.workerId}: told to stop by an operator: draining`);
          this.requestStop();
        }
        const jobs = answer.jobs ?? [];
        this.saturated = jobs.length >= max;
        // Only a full answer did not wait for jobs: its time is a round trip.
        if (jobs.length >= max) this.avgRoundTripMs = ewma(this.avgRoundTripMs, performance.now() - sent);
        this.ackResults(acks, answer.acks ?? []);
        this.dispatch(jobs);
      }
    }
  }

  /** A fetched job, held from now on (its lease renewed by the heartbeats). */
  private hold(raw: FetchedJob): Held {
    const h = {
      state: 'buffered',
      lost: false,
      released: false,
      slotFreed: false,
      timer: undefined,
      startedAt: 0,
    } as unknown as Held;
    h.job = new RunningJob(raw, this.workerId, h, this.reportProgress);
    this.held.set(raw.id, h);
    return h;
  }

  private dispatch(jobs: FetchedJob[]): void {
    for (const raw of jobs) this.buffer.push(this.hold(raw));
    this.pump();
  }

  /** Starts buffered jobs while slots are free. */
  private pump(): void {
    while (!this.stopping && this.running < this.concurrency && this.buffer.length > 0) {
      this.start(this.buffer.shift()!);
    }
    if (this.loopWaiters.size > 0 && (this.canFetch(0) || this.canFetch(1) || this.canFetchBatch())) this.wakeLoops();
  }

  private start(h: Held): void {
    const { job } = h;
    const handler = this.handlers.get(job.kind);
    h.state = 'running';
    h.startedAt = performance.now();
    this.running++;
    if (!handler) {
      // Only a server that ignores `kinds` hands out a kind without a handler.
      this.settle(h, 'fail', unknownKind(job.kind, this.workerId));
      return;
    }
    if (job.timeoutMs != null && job.timeoutMs > 0) {
      h.timer = setTimeout(() => this.timeout(h), job.timeoutMs);
    }
    let result: Promise<unknown>;
    try {
      result = Promise.resolve(withHandlerSpan(job.kind, job.id, job.traceparent, job.tracestate, () => handler(job)));
    } catch (e) {
      result = Promise.reject(e);
    }
    result.then(
      (value) => this.settle(h, 'complete', value),
      (err) => this.settle(h, 'fail', this.failureOf(err)),
    );
  }

  private timeout(h: Held): void {
    if (h.state !== 'running') return;
    abortHeld(h, new JobTimeoutError(`job ${h.job.id} ran past its timeout of ${h.job.timeoutMs} ms`));
    // The slot is given back now: a handler that ignores its signal cannot hold it forever.
    h.slotFreed = true;
    this.running--;
    this.queueAck(h, 'fail', {
      error: { class: 'timeout', message: `the handler ran past the job's timeout of ${h.job.timeoutMs} ms` },
      retry: 'auto',
    });
    this.pump();
  }

  private failureOf(err: unknown): Failure {
    if (err instanceof RetryAfter || err instanceof Retry || err instanceof Permanent) {
      const error: FailItem['error'] = { message: errorMessage(err, false) };
      const cls = err.errorClass === undefined ? '' : sanitizeClass(err.errorClass);
      if (cls) error.class = cls;
      if (err instanceof RetryAfter) return { error, retry: 'after', retry_after_ms: err.delayMs };
      return { error, retry: err instanceof Retry ? 'auto' : 'never' };
    }
    // The error's own line as the message, its stack beside it (kept with the attempt).
    const message = err instanceof Error ? errorMessage(`${err.name}: ${err.message}`, false) : errorMessage(err, false);
    const error: FailItem['error'] = { class: errorClass(err), message };
    if (err instanceof Error && typeof err.stack === 'string' && err.stack) {
      error.backtrace = err.stack.slice(0, MAX_BACKTRACE);
    }
    return { error, retry: 'auto' };
  }

  /** A handler settled (or could not start). */
  private settle(
    h: Held,
    outcome: 'complete' | 'fail',
    value: unknown,
  ): void {
    if (h.timer) clearTimeout(h.timer);
    if (h.startedAt > 0) this.avgHandlerMs = ewma(this.avgHandlerMs, performance.now() - h.startedAt);
    if (!h.slotFreed) {
      h.slotFreed = true;
      this.running--;
    }
    if (h.state !== 'running') {
      // Already failed by its timeout, or released at shutdown.
      if (h.released) this.log.warn(`job ${h.job.id} (${h.job.kind}) finished after it was released at shutdown: result dropped`);
    } else {
      this.finish(h, outcome, value);
    }
    this.afterSlotFreed();
  }

  /** Acknowledges how a running job's attempt ended (its result dropped if the lease was lost). */
  private finish(h: Held, outcome: 'complete' | 'fail', value: unknown): void {
    if (h.lost) {
      this.log.warn(`job ${h.job.id} (${h.job.kind}) attempt ${h.job.attempt}: lease lost while it ran, result dropped`);
      h.state = 'done';
      this.held.delete(h.job.id);
      return;
    }
    if (outcome === 'complete') {
      let json: string | undefined;
      try {
        json = value === undefined ? undefined : JSON.stringify(value);
      } catch (e) {
        this.queueAck(h, 'fail', {
          error: { class: 'invalid_result', message: `the handler's result is not JSON: ${describe(e)}` },
          retry: 'auto',
        });
        return;
      }
      this.queueAck(h, 'complete', json === undefined ? undefined : value);
    } else {
      this.queueAck(h, 'fail', value as Failure);
    }
  }

  private afterSlotFreed(): void {
    this.pump();
    if (this.stopping && this.running === 0 && this.runningBatches === 0) this.wakeDrain?.();
  }

  // ---- batches --------------------------------------------------------------------------------

  /** Whether the batch loop may fetch another batch now: a batch slot is free. */
  private canFetchBatch(): boolean {
    return !this.stopping && this.batchHandlers.size > 0 && this.runningBatches < this.concurrency;
  }

  /** Slots as the registry shows them: the plain ones, and as many again for batches. */
  private slots(): number {
    return this.batchHandlers.size > 0 ? this.concurrency * 2 : this.concurrency;
  }

  /** Slots busy now: jobs running in plain slots, and batches running. */
  private busySlots(): number {
    return this.running + this.runningBatches;
  }

  /**
   * The batch fetcher (while the worker has batch handlers): whenever a batch slot is free,
   * one long-poll `POST /v1/fetch` with `batch: true` and the batch handlers' kinds, which
   * answers one batch (one kind, one queue, one batch key) once one is ready; the batch starts
   * at once on that slot. Batches are never claimed ahead of a free slot. Acknowledgements go
   * out with the plain fetches or `/v1/ack`, never with a batch fetch (it waits for a batch).
   */
  private async batchLoop(): Promise<void> {
    let failures = 0;
    while (!this.stopping) {
      if (!this.canFetchBatch()) {
        await new Promise<void>((resolve) => {
          const wake = () => {
            this.loopWaiters.delete(wake);
            resolve();
          };
          this.loopWaiters.add(wake);
        });
        continue;
      }
      const body: Record<string, unknown> = {
        worker_id: this.workerId,
        queues: this.queues,
        batch: true,
        // No `max`: the server's largest, so the kind's `max_size` decides.
        lease_ms: this.leaseMs,
        wait_ms: this.waitMs,
        kinds: this.batchKinds,
        concurrency: this.slots(),
        busy: this.busySlots(),
        host: HOST,
        pid: process.pid,
        version: `conveyor-client-node/${VERSION}`,
      };
      const abort = new AbortController();
      this.longPolls.add(abort);
      this.fetchAborts.add(abort);
      this.lastFetchAt = Date.now();
      let answer: { jobs?: FetchedJob[]; command?: string } | undefined;
      let delay: number | null = null;
      try {
        answer = (
          await this.transport.request<{ jobs?: FetchedJob[]; command?: string }>('POST', '/v1/fetch', body, {
            timeoutMs: this.waitMs + 30_000,
            signal: abort.signal,
          })
        ).body;
      } catch (e) {
        if (isFatal(e)) {
          this.fail(e);
          return;
        }
        if (abort.signal.aborted || this.stopping) break;
        if (!isTransient(e)) {
          if (e instanceof InvalidRequest && e.field === 'batch') {
            e.message = `${e.message} (a batch fetch: does this server support batch kinds?)`;
          }
          this.fail(e);
          return;
        }
        failures++;
        delay = this.backoff(failures);
        if (failures === 1 || failures % 20 === 0) {
          this.log.warn(`batch fetch failed (${failures} in a row), retrying in ${delay} ms: ${describe(e)}`);
        }
      } finally {
        this.fetchAborts.delete(abort);
        this.longPolls.delete(abort);
      }
      if (delay !== null) {
        await this.pauseBatches(delay);
        continue;
      }
      if (!answer) continue;
      if (failures > 0) this.log.info(`batch fetch works again after ${failures} failure(s)`);
      failures = 0;
      if (answer.command === 'stop' && !this.stopping) {
        this.log.info(`${this.workerId}: told to stop by an operator: draining`);
        this.requestStop();
      }
      const jobs = answer.jobs ?? [];
      if (jobs.length === 0) continue;
      const held = jobs.map((raw) => this.hold(raw));
      if (this.stopping) {
        // Came back as the worker stopped: handed back at once, not started.
        await this.releaseAll(held);
        break;
      }
      // One answer is one batch of one kind; grouped all the same in case a server mixes kinds.
      const byKind = new Map<string, Held[]>();
      for (const h of held) {
        const group = byKind.get(h.job.kind);
        if (group) group.push(h);
        else byKind.set(h.job.kind, [h]);
      }
      for (const [kind, group] of byKind) this.startBatch(kind, group);
    }
  }

  /** The batch loop's backoff: sleeps `ms`, or less if the worker stops. */
  private pauseBatches(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      const self = this;
      function done() {
        clearTimeout(timer);
        if (self.wakeBatchBackoff === done) self.wakeBatchBackoff = null;
        resolve();
      }
      this.wakeBatchBackoff = done;
    });
  }

  private startBatch(kind: string, jobs: Held[]): void {
    const batch: RunningBatch = { kind, jobs, slotFreed: false, timer: undefined };
    for (const h of jobs) {
      h.state = 'running';
      h.batch = batch;
      // Batch jobs take no plain slot (and stay out of the plain handlers' measured pace).
      h.slotFreed = true;
    }
    this.runningBatches++;
    const handler = this.batchHandlers.get(kind);
    if (!handler) {
      // Only a server that ignores `kinds` hands out a kind without a batch handler.
      this.settleBatch(batch, { failure: unknownKind(kind, this.workerId) });
      return;
    }
    // The batch runs under the shortest timeout among its jobs.
    const timeouts = jobs.map((h) => h.job.timeoutMs).filter((t): t is number => t != null && t > 0);
    if (timeouts.length > 0) {
      const ms = Math.min(...timeouts);
      batch.timer = setTimeout(() => this.batchTimeout(batch, ms), ms);
    }
    const list = jobs.map((h) => h.job);
    let result: Promise<unknown>;
    try {
      result = Promise.resolve(withBatchSpan(kind, list, () => handler(list)));
    } catch (e) {
      result = Promise.reject(e);
    }
    result.then(settledOutcomes).then(
      (outcomes) => this.settleBatch(batch, { outcomes }),
      (err) => this.settleBatch(batch, { failure: this.failureOf(err) }),
    );
  }

  private batchTimeout(batch: RunningBatch, ms: number): void {
    if (batch.slotFreed) return;
    // The slot is given back now: a handler that ignores its jobs' signals cannot hold it forever.
    batch.slotFreed = true;
    this.runningBatches--;
    const failure: Failure = {
      error: { class: 'timeout', message: `the batch handler ran past the timeout of ${ms} ms (the shortest of its ${batch.jobs.length} job(s))` },
      retry: 'auto',
    };
    for (const h of batch.jobs) {
      abortHeld(h, new JobTimeoutError(`job ${h.job.id}: its batch ran past the timeout of ${ms} ms`));
      if (h.state === 'running') this.finish(h, 'fail', failure);
    }
    this.afterSlotFreed();
  }

  /** A batch handler settled (or could not start): one acknowledgement per job. */
  private settleBatch(batch: RunningBatch, settled: { outcomes: unknown } | { failure: Failure }): void {
    if (batch.timer) clearTimeout(batch.timer);
    if (!batch.slotFreed) {
      batch.slotFreed = true;
      this.runningBatches--;
    }
    const count = batch.jobs.length;
    let outcomes: unknown[] | null = null;
    let all: Failure | null = null;
    if ('failure' in settled) {
      all = settled.failure;
    } else if (settled.outcomes === undefined || settled.outcomes === null) {
      outcomes = new Array<unknown>(count).fill(undefined);
    } else if (Array.isArray(settled.outcomes)) {
      outcomes = settled.outcomes;
      if (outcomes.length > count) {
        this.log.warn(`batch of ${count} ${batch.kind} job(s): the handler returned ${outcomes.length} outcomes, the extra ones are ignored`);
      }
    } else if (settled.outcomes instanceof Error) {
      all = this.failureOf(settled.outcomes);
    } else {
      all = {
        error: {
          class: 'invalid_outcomes',
          message: `the batch handler must return an array of outcomes (one per job), or nothing; it returned ${describeValue(settled.outcomes)}`,
        },
        retry: 'auto',
      };
    }
    const short: Failure = {
      error: { class: 'missing_outcome', message: `the batch handler returned ${outcomes?.length ?? 0} outcome(s) for a batch of ${count}` },
      retry: 'auto',
    };
    let dropped = 0;
    batch.jobs.forEach((h, i) => {
      if (h.state !== 'running') {
        // Already failed by the batch's timeout, or released at shutdown.
        if (h.released) dropped++;
        return;
      }
      if (all) return this.finish(h, 'fail', all);
      if (i >= outcomes!.length) return this.finish(h, 'fail', short);
      const outcome = outcomes![i];
      if (outcome instanceof Error) this.finish(h, 'fail', this.failureOf(outcome));
      else if (outcome instanceof Rejected) this.finish(h, 'fail', this.failureOf(outcome.reason));
      else this.finish(h, 'complete', outcome);
    });
    if (dropped > 0) {
      this.log.warn(`a batch of ${count} ${batch.kind} job(s) finished after ${dropped} of them were released at shutdown: their outcomes were dropped`);
    }
    this.afterSlotFreed();
  }

  // ---- progress -------------------------------------------------------------------------------

  /** `job.progress()`: one `POST /v1/jobs/{id}/progress` under the job's lease. */
  private readonly reportProgress: ProgressReporter = async (h, percent, message) => {
    const body: Record<string, unknown> = { lease_token: h.job.leaseToken, progress: percent };
    if (message !== undefined) body.message = message;
    try {
      await this.transport.request('POST', `/v1/jobs/${seg(h.job.id)}/progress`, body);
    } catch (e) {
      // What the next heartbeat would find: the result would be dropped.
      if (e instanceof LeaseLost && h.state === 'running') this.leaseLost(h, 'lease_lost');
      throw e;
    }
  };

  // ---- acknowledgements -----------------------------------------------------------------------

  private queueAck(h: Held, kind: 'complete', result: unknown): void;
  private queueAck(h: Held, kind: 'fail', failure: Failure): void;
  private queueAck(h: Held, kind: 'complete' | 'fail', value: unknown): void {
    h.state = 'acking';
    const base = { id: h.job.id, lease_token: h.job.leaseToken };
    if (kind === 'complete') {
      this.pending.complete.push(value === undefined ? base : { ...base, result: value });
    } else {
      this.pending.fail.push({ ...base, ...(value as Failure) });
    }
    this.scheduleFlush();
  }

  private takeAcks(): Acks {
    let room = MAX_ACKS_PER_CALL;
    const complete = this.pending.complete.splice(0, room);
    room -= complete.length;
    const fail = this.pending.fail.splice(0, room);
    return { complete, fail };
  }

  /** Puts back acknowledgements whose request failed; the server may have applied them. */
  private restoreAcks(acks: Acks): void {
    for (const item of [...acks.complete, ...acks.fail]) this.resent.add(item);
    this.pending.complete.unshift(...acks.complete);
    this.pending.fail.unshift(...acks.fail);
  }

  private hasPending(): boolean {
    return this.pending.complete.length > 0 || this.pending.fail.length > 0;
  }

  /** The server answered an ack batch: forget the jobs, log the lost ones. */
  private ackResults(acks: Acks, results: AckResult[]): void {
    const items = [...acks.complete, ...acks.fail];
    items.forEach((item, i) => {
      const status = results[i]?.status ?? 'ok';
      const h = this.held.get(item.id);
      if (h && h.job.leaseToken === item.lease_token) {
        h.state = 'done';
        this.held.delete(item.id);
      }
      if (status === 'lease_lost' && this.resent.has(item)) {
        // Sent again after a broken request: most likely the first one was applied.
      } else if (status !== 'ok') {
        const what = 'result' in item || !('error' in item) ? 'result' : 'failure';
        this.log.warn(`job ${item.id}${h ? ` (${h.job.kind})` : ''}: ${status}, its ${what} was dropped (the job was cancelled, rescued or already finished)`);
      }
    });
    if (this.stopping) this.wakeDrain?.();
  }

  /**
   * A 400/413 naming one item of an ack batch (`complete[3].result`, `fail[0].error.message`):
   * that item is replaced by a failure saying why (or dropped if it was one), and the rest is
   * sent again. Returns false when the error names no ack item.
   */
  private dropBadAck(err: InvalidRequest): boolean {
    const m = /^(complete|fail)\[(\d+)\]/.exec(err.field ?? '');
    if (!m) return false;
    const list = m[1] === 'complete' ? this.pending.complete : this.pending.fail;
    const index = Number(m[2]);
    const [bad] = list.splice(index, 1);
    if (!bad) return false;
    this.log.warn(`job ${bad.id}: the server refused its ${m[1]} (${err.field}): ${err.message}`);
    if (m[1] === 'complete') {
      this.pending.fail.push({
        id: bad.id,
        lease_token: bad.lease_token,
        error: { class: 'invalid_result', message: `the server refused the result: ${err.message}` },
        retry: 'auto',
      });
    } else {
      const f = bad as FailItem;
      if (f.error.class !== 'invalid_failure') {
        this.pending.fail.push({
          id: f.id,
          lease_token: f.lease_token,
          error: { class: 'invalid_failure', message: `the server refused the failure report: ${err.message}` },
          retry: f.retry === 'after' ? 'auto' : f.retry,
        });
      }
    }
    return true;
  }

  /** Flushes pending acks with /v1/ack unless a fetch is about to carry them. */
  private scheduleFlush(): void {
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    setImmediate(() => {
      this.flushScheduled = false;
      this.maybeFlush();
    });
  }

  private maybeFlush(): void {
    if (!this.hasPending() || this.ackInFlight || this.ackRetryTimer) return;
    // The next fetch carries them (woken in case it parked before a slot came free).
    if (this.fetchesInFlight === 0 && !this.fetchBackingOff && this.canFetch() && this.phase === 'running') {
      this.wakeLoops();
      return;
    }
    void this.flushAcks();
  }

  private async flushAcks(): Promise<void> {
    if (this.ackInFlight || !this.hasPending()) return;
    this.ackInFlight = true;
    const acks = this.takeAcks();
    try {
      const body: Record<string, unknown> = {};
      if (acks.complete.length > 0) body.complete = acks.complete;
      if (acks.fail.length > 0) body.fail = acks.fail;
      const res = await this.transport.request<{ results: AckResult[] }>('POST', '/v1/ack', body);
      if (this.ackFailures > 0) this.log.info(`acknowledgements go through again after ${this.ackFailures} failure(s)`);
      this.ackFailures = 0;
      this.ackInFlight = false;
      this.ackResults(acks, res.body.results ?? []);
      this.maybeFlush();
    } catch (e) {
      this.ackInFlight = false;
      this.restoreAcks(acks);
      if (isFatal(e)) return this.fail(e);
      if (e instanceof InvalidRequest && this.dropBadAck(e)) {
        this.maybeFlush();
        return;
      }
      if (!isTransient(e)) return this.fail(e);
      this.ackFailures++;
      const delay = this.backoff(this.ackFailures);
      if (this.ackFailures === 1 || this.ackFailures % 20 === 0) {
        this.log.warn(`acknowledging ${acks.complete.length + acks.fail.length} job(s) failed (${this.ackFailures} in a row), retrying in ${delay} ms: ${describe(e)}`);
      }
      if (this.phase === 'stopped') return;
      this.ackRetryTimer = setTimeout(() => {
        this.ackRetryTimer = undefined;
        this.maybeFlush();
        if (this.stopping) this.wakeDrain?.();
      }, delay);
    }
  }

  // ---- heartbeats -----------------------------------------------------------------------------

  private scheduleHeartbeat(ms: number): void {
    clearTimeout(this.heartbeatTimer);
    if (this.phase === 'stopped' || this.fatalError) return;
    this.heartbeatTimer = setTimeout(() => void this.heartbeat(), ms);
  }

  private async heartbeat(): Promise<void> {
    const interval = Math.max(50, Math.floor(this.leaseMs / 3));
    if (this.heartbeatInFlight) return;
    this.trimPrefetched();
    const leases = [...this.held.values()].filter((h) => !h.lost && !h.released && h.state !== 'done');
    if (leases.length === 0) return this.scheduleHeartbeat(interval);
    this.heartbeatInFlight = true;
    let next = interval;
    try {
      for (let i = 0; i < leases.length; i += MAX_LEASES_PER_CALL) {
        const chunk = leases.slice(i, i + MAX_LEASES_PER_CALL);
        const body: Record<string, unknown> = {
          leases: chunk.map((h) => ({ id: h.job.id, lease_token: h.job.leaseToken })),
          lease_ms: this.leaseMs,
        };
        // Fetches keep this worker registered (a worker unheard of for 2 minutes is marked dead
        // and its jobs rescued); with every slot busy for long no fetch goes out, so the
        // heartbeat does it then. Not always: the server counts every lease as busy, and
        // prefetched leases would show more busy slots than the worker has.
        if (i === 0 && Date.now() - this.lastFetchAt > REGISTRATION_REFRESH_MS) body.worker_id = this.workerId;
        const res = await this.transport.request<{ results: AckResult[] }>('POST', '/v1/heartbeat', body);
        const results = res.body.results ?? [];
        chunk.forEach((h, j) => {
          const r = results[j];
          if (!r) return;
          if (r.status === 'ok') {
            if (r.lease_expires_at) h.job.leaseExpiresAt = new Date(r.lease_expires_at);
          } else {
            this.leaseLost(h, r.status);
          }
        });
      }
      if (this.heartbeatFailures > 0) this.log.info(`heartbeats go through again after ${this.heartbeatFailures} failure(s)`);
      this.heartbeatFailures = 0;
    } catch (e) {
      if (isFatal(e) || !isTransient(e)) {
        this.heartbeatInFlight = false;
        return this.fail(e);
      }
      this.heartbeatFailures++;
      next = Math.min(interval, this.backoff(this.heartbeatFailures));
      if (this.heartbeatFailures === 1 || this.heartbeatFailures % 20 === 0) {
        this.log.warn(`heartbeat failed (${this.heartbeatFailures} in a row), retrying in ${next} ms: ${describe(e)}`);
      }
    }
    this.heartbeatInFlight = false;
    this.scheduleHeartbeat(next);
  }

  /**
   * Handlers got slower than when these jobs were prefetched: hand back what the slots will
   * not reach soon, so other workers can run it.
   */
  private trimPrefetched(): void {
    if (this.stopping || this.prefetch !== 'auto') return;
    const keep = Math.max(this.concurrency, this.prefetchLimit());
    const excess = this.buffer.length - keep;
    if (excess <= 0) return;
    const extra = this.buffer.popTail(excess);
    void this.releaseAll(extra);
  }

  private leaseLost(h: Held, status: string): void {
    if (h.lost || h.state === 'done') return;
    if (h.state === 'acking') return; // its acknowledgement's own answer tells
    h.lost = true;
    abortHeld(h, new LeaseLostError(`job ${h.job.id}: lease lost (${status}): it was cancelled, rescued or finished elsewhere`));
    if (h.state === 'buffered') {
      this.buffer.remove(h);
      this.held.delete(h.job.id);
      h.state = 'done';
      this.log.warn(`job ${h.job.id} (${h.job.kind}): lease lost before it started (${status}), dropped`);
      this.pump();
    } else {
      this.log.warn(`job ${h.job.id} (${h.job.kind}): lease lost (${status}) while running: signal aborted, its result will be dropped`);
    }
  }

  // ---- shutdown -------------------------------------------------------------------------------

  private async drain(): Promise<void> {
    this.phase = 'draining';
    const started = Date.now();
    // Jobs that never started go back at once.
    const toRelease: Held[] = this.buffer.takeAll();
    const releases = this.releaseAll(toRelease);
    this.scheduleFlush();
    // Running handlers get the grace period.
    const graceEnd = started + this.graceMs;
    while ((this.running > 0 || this.runningBatches > 0) && !this.forceDrain && !this.fatalError && Date.now() < graceEnd) {
      await this.waitDrain(graceEnd - Date.now());
    }
    // A long-poll still waiting is cut off (jobs it brings back now are released); a fetch
    // that carries acknowledgements answers at once and is let finish.
    for (const abort of this.longPolls) abort.abort();
    await this.fetchDone;
    const late = [...this.held.values()].filter((h) => h.state === 'buffered');
    this.buffer.takeAll();
    // Jobs of a batch still running are among them (each job of a batch is held like any).
    const stillRunning = [...this.held.values()].filter((h) => h.state === 'running');
    if (stillRunning.length > 0) {
      this.log.warn(`grace period over: releasing ${stillRunning.length} running job(s)`);
      for (const h of stillRunning) {
        h.released = true;
        h.state = 'done';
        abortHeld(h, new ShutdownError(`the worker shut down before job ${h.job.id} finished`));
      }
    }
    const lateReleases = this.releaseAll([...late, ...stillRunning]);
    // Acknowledge what finished.
    const flushEnd = Date.now() + FINAL_FLUSH_MS;
    while ((this.hasPending() || this.ackInFlight) && !this.fatalError && Date.now() < flushEnd) {
      this.maybeFlush();
      await this.waitDrain(flushEnd - Date.now());
    }
    if (this.hasPending()) {
      const n = this.pending.complete.length + this.pending.fail.length;
      this.log.error(`${n} acknowledgement(s) could not be sent: those jobs run again once their leases expire`);
    }
    await Promise.all([releases, lateReleases]);
    if (!this.fatalError) await this.sayStopped();
  }

  /** Tells the registry this worker stopped (best effort), so it shows `stopped`, not `dead` later. */
  private async sayStopped(): Promise<void> {
    try {
      await this.transport.request(
        'POST',
        '/v1/workers/heartbeat',
        {
          worker_id: this.workerId,
          host: os.hostname(),
          pid: process.pid,
          queues: this.queues,
          concurrency: this.slots(),
          busy: 0,
          version: `conveyor-client-node/${VERSION}`,
          started_at: this.startedAt.toISOString(),
          stopping: true,
        },
        { timeoutMs: 2_000 },
      );
    } catch {
      // The registry marks it dead later; nothing is held any more.
    }
  }

  private waitDrain(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(done, Math.max(0, ms));
      const self = this;
      function done() {
        clearTimeout(timer);
        if (self.wakeDrain === done) self.wakeDrain = null;
        resolve();
      }
      this.wakeDrain = done;
    });
  }

  private async releaseAll(jobs: Held[]): Promise<void> {
    const deadline = Date.now() + FINAL_FLUSH_MS;
    await Promise.all(
      jobs.map(async (h) => {
        h.state = 'done';
        for (let failures = 0; ; ) {
          try {
            await this.transport.request('POST', `/v1/jobs/${seg(h.job.id)}/release`, { lease_token: h.job.leaseToken });
            break;
          } catch (e) {
            if (isFatal(e) || e instanceof NotFound || !isTransient(e) || Date.now() >= deadline) {
              this.log.warn(`job ${h.job.id}: release failed: ${describe(e)} (it runs again once its lease expires)`);
              break;
            }
            failures++;
            await new Promise((r) => setTimeout(r, Math.min(this.backoff(failures), Math.max(0, deadline - Date.now()))));
          }
        }
        this.held.delete(h.job.id);
      }),
    );
  }

  private abortAll(reason: Error): void {
    for (const h of this.held.values()) {
      abortHeld(h, reason);
    }
  }
}

function positiveInt(name: string, value: number): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 1) {
    throw new RangeError(`conveyor: ${name} must be an integer >= 1, got ${String(value)}`);
  }
  return value;
}

function nonNegative(name: string, value: number): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) {
    throw new RangeError(`conveyor: ${name} must be a number >= 0, got ${String(value)}`);
  }
  return value;
}
