export type JobState = 'scheduled' | 'available' | 'running' | 'retryable' | 'completed' | 'dead' | 'cancelled' | 'expired';
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
}
/** One job for `enqueueMany`. */
export interface JobSpec extends EnqueueOptions {
    kind: string;
    payload?: unknown;
}
/** The request body of one job (`POST /v1/jobs`), from `kind`, `payload` and options. */
export declare function enqueueBody(kind: string, payload: unknown, opts?: EnqueueOptions, where?: string): Record<string, unknown>;
