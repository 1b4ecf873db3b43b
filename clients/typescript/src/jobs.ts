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
