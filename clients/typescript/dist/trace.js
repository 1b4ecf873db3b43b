// W3C trace context for jobs: what a producer sends with a job, and how a worker runs the
// handler as a child span of it. Without OpenTelemetry this is string work: the producer sends
// the `traceparent` it is given and the handler gets the job's context plus a child context of
// its own (`job.handlerTraceparent`) to pass on. With `@opentelemetry/api` installed, an
// enqueue inside an active span sends that span's context, and each handler runs inside a
// CONSUMER span whose parent is the producer's.
import { randomBytes } from 'node:crypto';
const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;
/** `[traceId, spanId, flags]` of a version-00 traceparent, or null (also for all-zero ids). */
export function parseTraceparent(traceparent) {
    if (!traceparent)
        return null;
    const m = TRACEPARENT.exec(traceparent);
    if (!m)
        return null;
    const [, traceId, spanId, flags] = m;
    if (/^0+$/.test(traceId) || /^0+$/.test(spanId))
        return null;
    return [traceId, spanId, flags];
}
/** A new span's traceparent in the same trace (same flags), or null. */
export function childTraceparent(traceparent) {
    const parsed = parseTraceparent(traceparent);
    if (!parsed)
        return null;
    let spanId = '0000000000000000';
    while (/^0+$/.test(spanId))
        spanId = randomBytes(8).toString('hex');
    return `00-${parsed[0]}-${spanId}-${parsed[2]}`;
}
let otel = null;
try {
    otel = await import('@opentelemetry/api');
}
catch {
    otel = null;
}
/** The active OpenTelemetry span's traceparent/tracestate (empty without OpenTelemetry or span). */
export function currentTraceContext() {
    if (!otel)
        return {};
    // Read from the span context directly, so no global propagator needs registering.
    const ctx = otel.trace.getSpanContext(otel.context.active());
    if (!ctx || !otel.isSpanContextValid(ctx))
        return {};
    const flags = (ctx.traceFlags & 0xff).toString(16).padStart(2, '0');
    const out = {
        traceparent: `00-${ctx.traceId}-${ctx.spanId}-${flags}`,
    };
    const state = ctx.traceState?.serialize();
    if (state)
        out.tracestate = state;
    return out;
}
/**
 * Runs `fn` inside a CONSUMER span `conveyor <kind>` whose parent is the producer's span (when
 * the job has a context), if OpenTelemetry is installed; else just runs it.
 */
export function withHandlerSpan(kind, jobId, traceparent, tracestate, fn) {
    if (!otel)
        return fn();
    const api = otel;
    const parsed = parseTraceparent(traceparent);
    // The producer's span as a remote parent, built directly (no global propagator needed).
    const parent = parsed
        ? api.trace.setSpanContext(api.ROOT_CONTEXT, {
            traceId: parsed[0],
            spanId: parsed[1],
            traceFlags: parseInt(parsed[2], 16),
            isRemote: true,
            ...(tracestate ? { traceState: api.createTraceState(tracestate) } : {}),
        })
        : api.context.active();
    const tracer = api.trace.getTracer('conveyor-client');
    return tracer.startActiveSpan(`conveyor ${kind}`, { kind: api.SpanKind.CONSUMER, attributes: { 'messaging.system': 'conveyor', 'messaging.message.id': jobId } }, parent, (span) => endWith(api, span, fn));
}
/**
 * Runs a batch handler's `fn` inside one CONSUMER span `conveyor <kind>` (a batch has many
 * producers: the span links to each job's producer span instead of having one as its parent),
 * if OpenTelemetry is installed; else just runs it.
 */
export function withBatchSpan(kind, jobs, fn) {
    if (!otel)
        return fn();
    const api = otel;
    const links = [];
    for (const job of jobs) {
        const parsed = parseTraceparent(job.traceparent);
        if (!parsed)
            continue;
        links.push({
            context: {
                traceId: parsed[0],
                spanId: parsed[1],
                traceFlags: parseInt(parsed[2], 16),
                isRemote: true,
                ...(job.tracestate ? { traceState: api.createTraceState(job.tracestate) } : {}),
            },
            attributes: { 'messaging.message.id': job.id },
        });
    }
    const tracer = api.trace.getTracer('conveyor-client');
    return tracer.startActiveSpan(`conveyor ${kind}`, {
        kind: api.SpanKind.CONSUMER,
        attributes: { 'messaging.system': 'conveyor', 'messaging.batch.message_count': jobs.length },
        links,
    }, (span) => endWith(api, span, fn));
}
/** Runs `fn` in `span` and ends the span when `fn` (or the promise it returns) settles. */
function endWith(api, span, fn) {
    let result;
    try {
        result = fn();
    }
    catch (e) {
        span.setStatus({ code: api.SpanStatusCode.ERROR });
        span.end();
        throw e;
    }
    if (result && typeof result.then === 'function') {
        result.then(() => span.end(), () => {
            span.setStatus({ code: api.SpanStatusCode.ERROR });
            span.end();
        });
    }
    else {
        span.end();
    }
    return result;
}
