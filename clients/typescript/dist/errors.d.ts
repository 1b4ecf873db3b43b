/** What the server said in its `{"error": {code, field, message}}` body. */
export interface ErrorBody {
    code?: string;
    field?: string | null;
    message?: string;
}
/**
 * An error answered by the server (`status` is the HTTP status), or a failure to reach it
 * (`ConnectionError`, `status` 0). `code` and `field` are the server's `error.code` and
 * `error.field` (the input at fault, e.g. `jobs[3].kind`, or null).
 */
export declare class ConveyorError extends Error {
    readonly status: number;
    readonly code: string;
    readonly field: string | null;
    constructor(message: string, status: number, code: string, field?: string | null, options?: {
        cause?: unknown;
    });
    get name(): string;
}
/** 401 `unauthorized`: the token is missing, unknown, revoked or expired. */
export declare class Unauthorized extends ConveyorError {
}
/** 403 `forbidden`: the token's role may not make this call. */
export declare class Forbidden extends ConveyorError {
}
/** 404 `not_found`: no such job (or route). */
export declare class NotFound extends ConveyorError {
}
/** 400 `invalid_request` or 413 `payload_too_large`: `field` names the input at fault. */
export declare class InvalidRequest extends ConveyorError {
}
/** 409 `conflict`: e.g. cancelling a job that already finished. */
export declare class Conflict extends ConveyorError {
}
/** 409 `lease_lost`: the lease no longer holds (the job was rescued, cancelled or finished). */
export declare class LeaseLost extends ConveyorError {
}
/** 5xx or 408: the server failed or timed out; retrying later may succeed. */
export declare class ServerError extends ConveyorError {
}
/** The server could not be reached, or the connection broke (status 0, code `connection`). */
export declare class ConnectionError extends ConveyorError {
}
/**
 * 429 `queue_full` (the queue or the tenant's share is at its `max_depth`) or `rate_limited`
 * (the token's enqueue rate is spent). Nothing was stored. `retryAfter` is the server's
 * `Retry-After`, in seconds.
 */
export declare class QueueFull extends ConveyorError {
    readonly retryAfter: number;
    constructor(message: string, status: number, code: string, field: string | null, retryAfter: number);
}
/** Builds the error for a non-2xx answer. */
export declare function errorFromResponse(method: string, path: string, status: number, body: unknown, retryAfterHeader: string | undefined): ConveyorError;
/** Options of the handler outcomes. */
export interface OutcomeOptions {
    cause?: unknown;
    /**
     * The failure's `error.class` (1-128 characters of `[A-Za-z0-9_.:-]`; others become `_`).
     * Default: the server's `error`, `retry_after` or `permanent`.
     */
    errorClass?: string;
}
/** Fail this attempt and retry with the server's backoff (dead once attempts are exhausted). */
export declare class Retry extends Error {
    readonly errorClass: string | undefined;
    constructor(message?: string, options?: OutcomeOptions);
    get name(): string;
}
/**
 * Fail this attempt and retry after `seconds` (a number of seconds, fractions allowed:
 * `new RetryAfter(0.5)` is 500 ms; the same unit as HTTP's `Retry-After` and the Python
 * client's `RetryAfter`). `RetryAfter.ms(500)` takes milliseconds. Counted as an attempt:
 * dead once attempts are exhausted.
 */
export declare class RetryAfter extends Error {
    /** The delay in milliseconds (rounded up, at least 0). */
    readonly delayMs: number;
    readonly errorClass: string | undefined;
    constructor(seconds: number, message?: string, options?: OutcomeOptions);
    /** The delay in seconds. */
    get seconds(): number;
    /** A `RetryAfter` of `ms` milliseconds. */
    static ms(ms: number, message?: string, options?: OutcomeOptions): RetryAfter;
    get name(): string;
}
/** Fail this job for good: straight to the dead-letter queue, no further attempts. */
export declare class Permanent extends Error {
    readonly errorClass: string | undefined;
    constructor(message?: string, options?: OutcomeOptions);
    get name(): string;
}
