// What a job is on the wire: its options, its states, and the request body an enqueue sends.
// Shared by the client and the flows (a flow's steps are jobs), so neither imports the other.

import { currentTraceContext } from './trace.js';

/** `blocked`: waits behind an earlier job of its sequence (never fetched until that one finishes). */
export type JobState = 'blocked' | 'scheduled' | 'available' | 'running' | 'retryable' | 'completed' | 'dead' | 'cancelled' | 'expired';

/**
 * What a dead job of a sequence does to the jobs behind it: `block` holds them back until it is
 * replayed, discarded or cancelled; `skip` lets the next one run.
 */
export type SequenceOnDead = 'block' | 'skip';

/** A sequence as a queue's or a kind's settings answer it (in the server's field names). */
export interface SequenceSettings {
  /** The key expression: `tenant`, `kind`, `queue` or a payload path (`payload.account`). */
  key: string;
  on_dead: SequenceOnDead;
}

/** The `sequence` enqueue option's object form. */
export interface SequenceOptions {
  /** The key expression: `tenant`, `kind`, `queue` or a payload path (`payload.account`). */
  key: string;
  /** Default `block`. */
  onDead?: SequenceOnDead;
  /** The server's name for `onDead` (so `SequenceSettings` can be passed as they are). */
  on_dead?: SequenceOnDead;
}

/**
 * How a debounce folds a burst: `trailing` (the job runs `delayMs` after the last enqueue, with
 * its payload) or `leading` (the first runs at once, the next are dropped).
 */
export type DebounceMode = 'trailing' | 'leading';

/** The `debounce` enqueue option. */
export interface DebounceOptions {
  /** The key expression: `tenant`, `kind`, `queue` or a payload path (`payload.account`). */
  key: string;
  /** Trailing: run this long after the last enqueue of the burst; leading: drop enqueues less than this apart. */
  delayMs?: number;
  /** Trailing: never run later than this long after the first enqueue of the burst. */
  maxWaitMs?: number;
  /** Default `trailing`. */
  mode?: DebounceMode;
  /** The server's name for `delayMs`. */
  delay_ms?: number;
  /** The server's name for `maxWaitMs`. */
  max_wait_ms?: number;
}

/** The `throttle` enqueue option. */
export interface ThrottleOptions {
  /** The key expression: `tenant`, `kind`, `queue` or a payload path (`payload.account`). */
  key: string;
  /** At most one job of a key per this many milliseconds; the rest are dropped. */
  periodMs?: number;
  /** The server's name for `periodMs`. */
  period_ms?: number;
}

/** Makes an enqueue unique (see `unique` in docs/openapi.yaml). `true` is `{}`: by the whole payload. */
export interface UniqueOptions {
  /** Top-level payload fields that make up the identity (default: the whole payload). */
  args?: string[];
  /** Whether the queue is part of the identity (default true). */
  byQueue?: boolean;
  /** Only jobs created less than this long ago count. */
  periodMs?: number;
  /** States in which an existing job blocks the new one. */
  states?: JobState[];
}

export interface EnqueueOptions {
  /** Queue name (default `default`). */
  queue?: string;
  /** Higher runs first within a queue (default 0). */
  priority?: number;
  /** Run this many milliseconds from now. */
  delayMs?: number;
  /** Run this many seconds from now (fractions allowed); the same as `delayMs` × 1000. */
  delay?: number;
  /** Run at this time (a Date, or an RFC 3339 string). Not with `delayMs`/`delay`. */
  runAt?: Date | string;
  /** Attempts before the job is dead (server default 25). */
  maxAttempts?: number;
  /** Enqueueing again with the same key returns the existing job's id. */
  idempotencyKey?: string;
  tenant?: string;
  unique?: boolean | UniqueOptions;
  /** Per-attempt timeout the worker enforces, in milliseconds. */
  timeoutMs?: number;
  tags?: string[];
  /** Not started within this many milliseconds of the enqueue, the job expires instead of running. */
  ttlMs?: number;
  /** Not started by then (a Date, or an RFC 3339 string), the job expires. Not with `ttlMs`. */
  expiresAt?: Date | string;
  /**
   * W3C trace context sent with the job; the worker runs the handler as a child span. By
   * default the active OpenTelemetry span's, when `@opentelemetry/api` is installed.
   */
  traceparent?: string;
  tracestate?: string;
  /**
   * Named limits (`client.putLimit`) the job is subject to besides its queue's and its kind's;
   * a name no limit is defined for rejects with `InvalidRequest` naming `limits[i]`.
   */
  limits?: string[];
  /**
   * Puts the job in a sequence: jobs with the same value at its key run strictly one after
   * another, in enqueue order. A key expression (`tenant`, `kind`, `queue` or
   * `payload.account`) or `{ key, onDead }`; overrides the queue's and the kind's sequence. A
   * job enqueued behind an unfinished one of its key is stored `blocked` until that one
   * finishes; an invalid expression rejects with `InvalidRequest` naming `sequence`.
   */
  sequence?: string | SequenceOptions;
  /**
   * Folds a burst of enqueues with the same value at `key` (same kind and queue) into one job.
   * Trailing (the default): the job runs `delayMs` after the last enqueue of the burst, with
   * its payload, but never later than `maxWaitMs` after the first (not with a delay or
   * `runAt`). Leading: the first runs at once and the next are dropped while they come less
   * than `delayMs` apart. A folded enqueue resolves with the id of the job that stands; a job
   * without a value at the key is enqueued as usual. Not with `throttle` or `unique`.
   */
  debounce?: DebounceOptions;
  /**
   * At most one job with the same value at `key` (same kind and queue) per `periodMs`; the
   * rest are dropped, resolving with the id of the job that stands.
   */
  throttle?: ThrottleOptions;
}

/** One job for `enqueueMany`. */
export interface JobSpec extends EnqueueOptions {
  kind: string;
  payload?: unknown;
}

/** The request body of one job (`POST /v1/jobs`), from `kind`, `payload` and options. */
export function enqueueBody(kind: string, payload: unknown, opts: EnqueueOptions = {}, where = ''): Record<string, unknown> {
  if (typeof kind !== 'string' || kind === '') throw new TypeError(`conveyor: ${where}kind must be a non-empty string`);
  const body: Record<string, unknown> = { kind };
  if (payload !== undefined) body.payload = payload;
  if (opts.queue !== undefined) body.queue = opts.queue;
  if (opts.priority !== undefined) body.priority = opts.priority;
  if (opts.delayMs !== undefined && opts.delay !== undefined) {
    throw new TypeError(`conveyor: ${where}give delayMs or delay, not both`);
  }
  const delayMs = opts.delayMs ?? (opts.delay !== undefined ? Math.round(opts.delay * 1000) : undefined);
  if (delayMs !== undefined) {
    if (opts.runAt !== undefined) throw new TypeError(`conveyor: ${where}give runAt or a delay, not both`);
    body.delay_ms = delayMs;
  }
  if (opts.runAt !== undefined) {
    const at = opts.runAt instanceof Date ? opts.runAt : new Date(opts.runAt);
    if (Number.isNaN(at.getTime())) throw new TypeError(`conveyor: ${where}runAt is not a valid date`);
    body.run_at = at.toISOString();
  }
  if (opts.maxAttempts !== undefined) body.max_attempts = opts.maxAttempts;
  if (opts.idempotencyKey !== undefined) body.idempotency_key = opts.idempotencyKey;
  if (opts.tenant !== undefined) body.tenant = opts.tenant;
  if (opts.timeoutMs !== undefined) body.timeout_ms = opts.timeoutMs;
  if (opts.tags !== undefined) body.tags = opts.tags;
  if (opts.limits !== undefined) {
    if (!Array.isArray(opts.limits)) throw new TypeError(`conveyor: ${where}limits must be an array of limit names`);
    body.limits = opts.limits;
  }
  if (opts.sequence !== undefined) body.sequence = sequenceBody(opts.sequence, where);
  if (opts.debounce !== undefined) body.debounce = debounceBody(opts.debounce, where);
  if (opts.throttle !== undefined) body.throttle = throttleBody(opts.throttle, where);
  if (opts.ttlMs !== undefined && opts.expiresAt !== undefined) {
    throw new TypeError(`conveyor: ${where}give ttlMs or expiresAt, not both`);
  }
  if (opts.ttlMs !== undefined) body.ttl_ms = opts.ttlMs;
  if (opts.expiresAt !== undefined) {
    const at = opts.expiresAt instanceof Date ? opts.expiresAt : new Date(opts.expiresAt);
    if (Number.isNaN(at.getTime())) throw new TypeError(`conveyor: ${where}expiresAt is not a valid date`);
    body.expires_at = at.toISOString();
  }
  if (opts.traceparent !== undefined) {
    body.traceparent = opts.traceparent;
    if (opts.tracestate !== undefined) body.tracestate = opts.tracestate;
  } else {
    Object.assign(body, currentTraceContext());
  }
  if (opts.unique !== undefined && opts.unique !== false) {
    const u = opts.unique === true ? {} : opts.unique;
    const unique: Record<string, unknown> = {};
    if (u.args !== undefined) unique.args = u.args;
    if (u.byQueue !== undefined) unique.by_queue = u.byQueue;
    if (u.periodMs !== undefined) unique.period_ms = u.periodMs;
    if (u.states !== undefined) unique.states = u.states;
    body.unique = unique;
  }
  return body;
}

/** The `sequence` of a job's body: the key expression as it is, or `{ key, on_dead }`. */
function sequenceBody(sequence: string | SequenceOptions, where: string): string | Record<string, unknown> {
  if (typeof sequence === 'string') return sequence;
  if (sequence === null || typeof sequence !== 'object' || Array.isArray(sequence)) {
    throw new TypeError(`conveyor: ${where}sequence must be a key expression ('payload.account') or { key, onDead }`);
  }
  const { onDead, on_dead: onDeadWire, ...rest } = sequence;
  if (onDead !== undefined && onDeadWire !== undefined && onDead !== onDeadWire) {
    throw new TypeError(`conveyor: ${where}sequence: give onDead or on_dead, not both`);
  }
  // Fields the server does not know go as they are: it names them in a 400.
  const body: Record<string, unknown> = { ...rest };
  const policy = onDead ?? onDeadWire;
  if (policy !== undefined) body.on_dead = policy;
  return body;
}

/** The `debounce` of a job's body: `{ key, delay_ms, max_wait_ms?, mode? }`. */
function debounceBody(debounce: DebounceOptions, where: string): Record<string, unknown> {
  if (debounce === null || typeof debounce !== 'object' || Array.isArray(debounce)) {
    throw new TypeError(`conveyor: ${where}debounce must be { key, delayMs, maxWaitMs?, mode? }`);
  }
  const { delayMs, delay_ms: delayWire, maxWaitMs, max_wait_ms: maxWaitWire, ...rest } = debounce;
  // Fields the server does not know go as they are: it names them in a 400.
  const body: Record<string, unknown> = { ...rest };
  aliased(body, 'delay_ms', delayMs, delayWire, `${where}debounce: give delayMs or delay_ms, not both`);
  aliased(body, 'max_wait_ms', maxWaitMs, maxWaitWire, `${where}debounce: give maxWaitMs or max_wait_ms, not both`);
  return body;
}

/** The `throttle` of a job's body: `{ key, period_ms }`. */
function throttleBody(throttle: ThrottleOptions, where: string): Record<string, unknown> {
  if (throttle === null || typeof throttle !== 'object' || Array.isArray(throttle)) {
    throw new TypeError(`conveyor: ${where}throttle must be { key, periodMs }`);
  }
  const { periodMs, period_ms: periodWire, ...rest } = throttle;
  const body: Record<string, unknown> = { ...rest };
  aliased(body, 'period_ms', periodMs, periodWire, `${where}throttle: give periodMs or period_ms, not both`);
  return body;
}

/** Sets `body[wire]` from an option given by its camelCase name or the server's (the same value if both). */
export function aliased(body: Record<string, unknown>, wire: string, camel: unknown, snake: unknown, conflict: string): void {
  if (camel !== undefined && snake !== undefined && camel !== snake) throw new TypeError(`conveyor: ${conflict}`);
  const value = camel ?? snake;
  if (value !== undefined) body[wire] = value;
}
