// Errors the server answers, and the outcomes a handler throws.

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
export class ConveyorError extends Error {
  readonly status: number;
  readonly code: string;
  readonly field: string | null;

  constructor(message: string, status: number, code: string, field: string | null = null, options?: { cause?: unknown }) {
    super(message, options);
    this.status = status;
    this.code = code;
    this.field = field;
  }

  override get name(): string {
    return this.constructor.name;
  }
}

/** 401 `unauthorized`: the token is missing, unknown, revoked or expired. */
export class Unauthorized extends ConveyorError {}
/** 403 `forbidden`: the token's role may not make this call. */
export class Forbidden extends ConveyorError {}
/** 404 `not_found`: no such job (or route). */
export class NotFound extends ConveyorError {}
/** 400 `invalid_request` or 413 `payload_too_large`: `field` names the input at fault. */
export class InvalidRequest extends ConveyorError {}
/** 409 `conflict`: e.g. cancelling a job that already finished. */
export class Conflict extends ConveyorError {}
/** 409 `lease_lost`: the lease no longer holds (the job was rescued, cancelled or finished). */
export class LeaseLost extends ConveyorError {}
/** 5xx or 408: the server failed or timed out; retrying later may succeed. */
export class ServerError extends ConveyorError {}
/** The server could not be reached, or the connection broke (status 0, code `connection`). */
export class ConnectionError extends ConveyorError {}

/**
 * 429 `queue_full` (the queue or the tenant's share is at its `max_depth`) or `rate_limited`
 * (the token's enqueue rate is spent). Nothing was stored. `retryAfter` is the server's
 * `Retry-After`, in seconds.
 */
export class QueueFull extends ConveyorError {
  readonly retryAfter: number;

  constructor(message: string, status: number, code: string, field: string | null, retryAfter: number) {
    super(message, status, code, field);
    this.retryAfter = retryAfter;
  }
}

/** Builds the error for a non-2xx answer. */
export function errorFromResponse(
  method: string,
  path: string,
  status: number,
  body: unknown,
  retryAfterHeader: string | undefined,
): ConveyorError {
  const err = (body && typeof body === 'object' && 'error' in body ? (body as { error: ErrorBody }).error : undefined) ?? {};
  const code = typeof err.code === 'string' ? err.code : `http_${status}`;
  const field = typeof err.field === 'string' ? err.field : null;
  const detail = typeof err.message === 'string' ? err.message : typeof body === 'string' ? body : '';
  const message = `${method} ${path} answered ${status} ${code}${field ? ` (field ${field})` : ''}${detail ? `: ${detail}` : ''}`;
  switch (status) {
    case 400:
    case 413:
      return new InvalidRequest(message, status, code, field);
    case 401:
      return new Unauthorized(message, status, code, field);
    case 403:
      return new Forbidden(message, status, code, field);
    case 404:
      return new NotFound(message, status, code, field);
    case 409:
      return code === 'lease_lost' ? new LeaseLost(message, status, code, field) : new Conflict(message, status, code, field);
    case 429: {
      const seconds = Number(retryAfterHeader);
      return new QueueFull(message, status, code, field, Number.isFinite(seconds) && seconds >= 0 ? seconds : 1);
    }
    default:
      if (status >= 500 || status === 408) return new ServerError(message, status, code, field);
      return new ConveyorError(message, status, code, field);
  }
}

// ---------------------------------------------------------------------------------------------
// Handler outcomes: throw one of these from a handler.

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
export class Retry extends Error {
  readonly errorClass: string | undefined;

  constructor(message = 'retry requested', options: OutcomeOptions = {}) {
    super(message, { cause: options.cause });
    this.errorClass = options.errorClass;
  }

  override get name(): string {
    return 'Retry';
  }
}

/**
 * Fail this attempt and retry after `seconds` (a number of seconds, fractions allowed:
 * `new RetryAfter(0.5)` is 500 ms; the same unit as HTTP's `Retry-After` and the Python
 * client's `RetryAfter`). `RetryAfter.ms(500)` takes milliseconds. Counted as an attempt:
 * dead once attempts are exhausted.
 */
export class RetryAfter extends Error {
  /** The delay in milliseconds (rounded up, at least 0). */
  readonly delayMs: number;
  readonly errorClass: string | undefined;

  constructor(seconds: number, message?: string, options: OutcomeOptions = {}) {
    if (typeof seconds !== 'number' || !Number.isFinite(seconds) || seconds < 0) {
      throw new TypeError(`RetryAfter: seconds must be a finite number >= 0, got ${String(seconds)}`);
    }
    super(message ?? `retry after ${seconds} s`, { cause: options.cause });
    this.delayMs = Math.ceil(seconds * 1000);
    this.errorClass = options.errorClass;
  }

  /** The delay in seconds. */
  get seconds(): number {
    return this.delayMs / 1000;
  }

  /** A `RetryAfter` of `ms` milliseconds. */
  static ms(ms: number, message?: string, options: OutcomeOptions = {}): RetryAfter {
    return new RetryAfter(ms / 1000, message ?? `retry after ${ms} ms`, options);
  }

  override get name(): string {
    return 'RetryAfter';
  }
}

/** Fail this job for good: straight to the dead-letter queue, no further attempts. */
export class Permanent extends Error {
  readonly errorClass: string | undefined;

  constructor(message = 'permanent failure', options: OutcomeOptions = {}) {
    super(message, { cause: options.cause });
    this.errorClass = options.errorClass;
  }

  override get name(): string {
    return 'Permanent';
  }
}
