// Trace context and expiry through the TypeScript client and worker, against a real server.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { context, trace, SpanKind } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { InvalidRequest } from '../dist/index.js';
import { client, useServer, newWorker, waitState, uniqueQueue } from './helpers.mjs';

const PARENT = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';

useServer();

test('a given trace context and expiry reach the handler, with a child context', async () => {
  const queue = uniqueQueue();
  const { worker } = newWorker({ queues: [queue] });
  let seen;
  worker.handle('traced', async (job) => {
    seen = job;
  });
  const id = await client.enqueue('traced', null, { queue, traceparent: PARENT, tracestate: 'v=1', ttlMs: 60_000 });
  const stored = await client.get(id);
  assert.deepEqual(stored.trace, { traceparent: PARENT, tracestate: 'v=1' });
  assert.ok(stored.expires_at);
  const running = worker.run();
  await waitState(id, 'completed');
  await worker.close();
  await running;
  assert.equal(seen.traceparent, PARENT);
  assert.equal(seen.tracestate, 'v=1');
  assert.equal(seen.traceId, '4bf92f3577b34da6a3ce929d0e0e4736');
  assert.ok(seen.expiresAt instanceof Date);
  const child = seen.handlerTraceparent.split('-');
  assert.equal(child[1], '4bf92f3577b34da6a3ce929d0e0e4736');
  assert.notEqual(child[2], '00f067aa0ba902b7', 'the handler span is a new span');
});

test('bad expiry and trace input is refused naming the field', async () => {
  await assert.rejects(client.enqueue('k', null, { ttlMs: 5, expiresAt: new Date() }), TypeError);
  await assert.rejects(client.enqueue('k', null, { traceparent: '00-nope' }), (e) => {
    assert.ok(e instanceof InvalidRequest);
    assert.equal(e.field, 'traceparent');
    return true;
  });
});

test('with OpenTelemetry the handler span is a child of the producer span', async () => {
  const exporter = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  trace.setGlobalTracerProvider(provider);
  const tracer = trace.getTracer('test');
  const queue = uniqueQueue();
  const { worker } = newWorker({ queues: [queue] });
  worker.handle('otel', async () => 'done');
  let producer;
  const id = await tracer.startActiveSpan('request', async (span) => {
    producer = span.spanContext();
    try {
      return await client.enqueue('otel', null, { queue });
    } finally {
      span.end();
    }
  });
  const stored = await client.get(id);
  assert.equal(stored.trace.traceparent.split('-')[1], producer.traceId);
  const running = worker.run();
  await waitState(id, 'completed');
  await worker.close();
  await running;
  const spans = exporter.getFinishedSpans().filter((s) => s.name === 'conveyor otel');
  assert.equal(spans.length, 1);
  const span = spans[0];
  assert.equal(span.spanContext().traceId, producer.traceId);
  assert.equal(span.parentSpanContext?.spanId ?? span.parentSpanId, producer.spanId);
  assert.equal(span.kind, SpanKind.CONSUMER);
});
