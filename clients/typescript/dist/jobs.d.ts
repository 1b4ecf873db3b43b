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
export declare function enqueueBody(kind: string, payload: unknown, opts?: EnqueueOptions, where?: string): Record<string, unknown>;
/** Sets `body[wire]` from an option given by its camelCase name or the server's (the same value if both). */
export declare function aliased(body: Record<string, unknown>, wire: string, camel: unknown, snake: unknown, conflict: string): void;
