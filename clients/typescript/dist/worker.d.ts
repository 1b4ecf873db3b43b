import type http from 'node:http';
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
export declare class LeaseLostError extends Error {
    get name(): string;
}
/** `signal.reason` when a job ran past its `timeoutMs`. */
export declare class JobTimeoutError extends Error {
    get name(): string;
}
/** `signal.reason` when the worker's shutdown grace period ended with the handler still running. */
export declare class ShutdownError extends Error {
    get name(): string;
}
/** A class name for `error.class`: 1-128 characters of `[A-Za-z0-9_.:-]`. */
export declare function errorClass(err: unknown): string;
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
export declare class Worker {
    readonly workerId: string;
    readonly queues: string[];
    readonly concurrency: number;
    readonly leaseMs: number;
    readonly graceMs: number;
    /** The fixed prefetch, or `'auto'`. */
    readonly prefetch: number | 'auto';
    readonly waitMs: number;
    private readonly transport;
    private readonly handlers;
    private readonly batchHandlers;
    private readonly log;
    private readonly handleSignals;
    private readonly backoffMinMs;
    private readonly backoffMaxMs;
    private readonly held;
    private readonly buffer;
    private running;
    /** Batches whose handlers run now (each holds one batch slot). */
    private runningBatches;
    private pending;
    private phase;
    private stopping;
    private fatalError;
    private closeRequested;
    private forceDrain;
    /** Fetches in flight, and the jobs they asked for in all. */
    private fetchesInFlight;
    private requested;
    /** The last fetch brought all it asked for: the queue is busy, a second fetcher helps. */
    private saturated;
    private lastFetchAt;
    private readonly startedAt;
    private readonly fetchAborts;
    /** The fetches in flight that carry no acknowledgements: the drain may cut these off. */
    private readonly longPolls;
    /**
     * Acknowledgements put back after a request that failed or was cut off: the server may have
     * applied them, so `lease_lost` for one of these is its own first answer coming back late.
     */
    private readonly resent;
    private fetchDone;
    /** Moving averages for the automatic prefetch: handler run time and fetch round trip (ms). */
    private avgHandlerMs;
    private avgRoundTripMs;
    private ackInFlight;
    private ackRetryTimer;
    private ackFailures;
    private flushScheduled;
    private heartbeatTimer;
    private heartbeatInFlight;
    private heartbeatFailures;
    private readonly loopWaiters;
    private wakeBackoff;
    private wakeBatchBackoff;
    private fetchBackingOff;
    private wakeDrain;
    private stopRequested;
    private runPromise;
    private signalListeners;
    constructor(options: WorkerOptions);
    /**
     * Registers the handler for a kind. Its return value is the job's result (JSON). Replaces a
     * batch handler of the kind.
     */
    handle<P = any, R = unknown>(kind: string, handler: Handler<P, R>): this;
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
    handleBatch<P = any, R = unknown>(kind: string, handler: BatchHandler<P, R>): this;
    /** The kinds this worker has plain handlers for (sent as `kinds` on its plain fetches). */
    get kinds(): string[];
    /** The kinds this worker has batch handlers for (sent as `kinds` on its batch fetches). */
    get batchKinds(): string[];
    /** Jobs whose (plain) handlers run now. */
    get active(): number;
    /** Batches whose handlers run now. */
    get activeBatches(): number;
    /**
     * Fetches and runs jobs until `close()` or SIGTERM/SIGINT, then drains: stops fetching,
     * lets running handlers finish for up to `graceMs`, acknowledges them, releases the rest,
     * and resolves. Rejects with `Unauthorized` (401) or `Forbidden` (403) when the server
     * refuses the token: retrying cannot help then. Network errors and 5xx are retried.
     */
    run(): Promise<void>;
    /** Starts the drain (as SIGTERM does); resolves when `run()` has finished. */
    close(): Promise<void>;
    private runInner;
    private requestStop;
    private fail;
    private installSignals;
    private removeSignals;
    private backoff;
    /** The fetch loop's backoff: sleeps `ms`, or less if the worker stops. */
    private pause;
    /** Jobs held ahead of free slots at most, now. */
    private prefetchLimit;
    /** How many more jobs may be claimed now. */
    private capacity;
    private canFetch;
    private wakeLoops;
    /**
     * One fetcher. Fetcher 0 always runs (long-polling when the queue is idle); fetcher 1 only
     * while fetches come back full, so two fetches share the server's commits.
     */
    private fetchLoop;
    /** A fetched job, held from now on (its lease renewed by the heartbeats). */
    private hold;
    private dispatch;
    /** Starts buffered jobs while slots are free. */
    private pump;
    private start;
    private timeout;
    private failureOf;
    /** A handler settled (or could not start). */
    private settle;
    /** Acknowledges how a running job's attempt ended (its result dropped if the lease was lost). */
    private finish;
    private afterSlotFreed;
    /** Whether the batch loop may fetch another batch now: a batch slot is free. */
    private canFetchBatch;
    /** Slots as the registry shows them: the plain ones, and as many again for batches. */
    private slots;
    /** Slots busy now: jobs running in plain slots, and batches running. */
    private busySlots;
    /**
     * The batch fetcher (while the worker has batch handlers): whenever a batch slot is free,
     * one long-poll `POST /v1/fetch` with `batch: true` and the batch handlers' kinds, which
     * answers one batch (one kind, one queue, one batch key) once one is ready; the batch starts
     * at once on that slot. Batches are never claimed ahead of a free slot. Acknowledgements go
     * out with the plain fetches or `/v1/ack`, never with a batch fetch (it waits for a batch).
     */
    private batchLoop;
    /** The batch loop's backoff: sleeps `ms`, or less if the worker stops. */
    private pauseBatches;
    private startBatch;
    private batchTimeout;
    /** A batch handler settled (or could not start): one acknowledgement per job. */
    private settleBatch;
    /** `job.progress()`: one `POST /v1/jobs/{id}/progress` under the job's lease. */
    private readonly reportProgress;
    private queueAck;
    private takeAcks;
    /** Puts back acknowledgements whose request failed; the server may have applied them. */
    private restoreAcks;
    private hasPending;
    /** The server answered an ack batch: forget the jobs, log the lost ones. */
    private ackResults;
    /**
     * A 400/413 naming one item of an ack batch (`complete[3].result`, `fail[0].error.message`):
     * that item is replaced by a failure saying why (or dropped if it was one), and the rest is
     * sent again. Returns false when the error names no ack item.
     */
    private dropBadAck;
    /** Flushes pending acks with /v1/ack unless a fetch is about to carry them. */
    private scheduleFlush;
    private maybeFlush;
    private flushAcks;
    private scheduleHeartbeat;
    private heartbeat;
    /**
     * Handlers got slower than when these jobs were prefetched: hand back what the slots will
     * not reach soon, so other workers can run it.
     */
    private trimPrefetched;
    private leaseLost;
    private drain;
    /** Tells the registry this worker stopped (best effort), so it shows `stopped`, not `dead` later. */
    private sayStopped;
    private waitDrain;
    private releaseAll;
    private abortAll;
}
