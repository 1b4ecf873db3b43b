/** `[traceId, spanId, flags]` of a version-00 traceparent, or null (also for all-zero ids). */
export declare function parseTraceparent(traceparent: string | null | undefined): [string, string, string] | null;
/** A new span's traceparent in the same trace (same flags), or null. */
export declare function childTraceparent(traceparent: string | null | undefined): string | null;
/** The active OpenTelemetry span's traceparent/tracestate (empty without OpenTelemetry or span). */
export declare function currentTraceContext(): {
    traceparent?: string;
    tracestate?: string;
};
/**
 * Runs `fn` inside a CONSUMER span `conveyor <kind>` whose parent is the producer's span (when
 * the job has a context), if OpenTelemetry is installed; else just runs it.
 */
export declare function withHandlerSpan<T>(kind: string, jobId: string, traceparent: string | null, tracestate: string | null, fn: () => T): T;
/**
 * Runs a batch handler's `fn` inside one CONSUMER span `conveyor <kind>` (a batch has many
 * producers: the span links to each job's producer span instead of having one as its parent),
 * if OpenTelemetry is installed; else just runs it.
 */
export declare function withBatchSpan<T>(kind: string, jobs: ReadonlyArray<{
    id: string;
    traceparent: string | null;
    tracestate: string | null;
}>, fn: () => T): T;
