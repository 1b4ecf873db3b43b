// Batch kinds against a real server: `client.setBatch` and `worker.handleBatch`. A batch's jobs
// each keep their own outcome, attempts and history; plain fetches never get a batch kind's
// jobs; a keyed batch holds one key value; leases of a running batch are renewed; a drain
// waits for running batches and releases them once the grace period is over.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { context, trace, SpanKind } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { InvalidRequest, Permanent, RetryAfter, ShutdownError } from '../dist/index.js';
import { batchBody } from '../dist/client.js';
import { client, useServer, newWorker, eventually, uniqueName, uniqueQueue } from './helpers.mjs';

useServer();

/** The job once it has finished (the server holds the request until then; no polling). */
async function finished(id, state) {
  const job = await client.wait(id, { timeoutMs: 15_000 });
  assert.equal(job.state, state, `job ${id}: ${JSON.stringify(job)}`);
  return job;
}

/** A promise and the function that resolves it; `wait()` rejects if it has not resolved within 15 s. */
function signal(what = 'the handler') {
  let resolve;
  const promise = new Promise((r) => (resolve = r));
  const wait = () => {
    let timer;
    const late = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what}: not within 15 s`)), 15_000);
    });
    return Promise.race([promise, late]).finally(() => clearTimeout(timer));
  };
  return { promise, resolve, wait };
}

test('a batch with failures: each job settles alone, the failed ones come back as a batch of their own', async () => {
  const queue = uniqueQueue('rows');
  const kind = 'rows.insert';
  assert.deepEqual(await client.setBatch(kind, { maxSize: 5, maxWaitMs: 300 }), { max_size: 5, max_wait_ms: 300 });
  // Enqueued all at once, before any worker runs: the first batch can only be all five.
  const ids = await client.enqueueMany([1, 2, 3, 4, 5].map((n) => ({ kind, queue, payload: { n } })));
  const byN = Object.fromEntries(ids.map((id, i) => [i + 1, id]));

  const batches = [];
  const { worker } = newWorker({ queues: [queue] });
  worker.handleBatch(kind, async (jobs) => {
    batches.push(jobs.map((job) => job.payload.n));
    for (const job of jobs) {
      assert.equal(job.kind, kind);
      assert.equal(job.queue, queue);
    }
    // #2 and #4 fail on their first attempt. A retry-after of the same delay makes both
    // available again at the same moment: the server's own backoff has ±20 % jitter, which
    // could split them into two batches of one (300 ms of max_wait covers less than that).
    return jobs.map((job) =>
      job.payload.n % 2 === 0 && job.attempt === 1 ? RetryAfter.ms(100, `row ${job.payload.n} rejected`) : { inserted: job.payload.n },
    );
  });
  assert.deepEqual(worker.batchKinds, [kind]);
  assert.deepEqual(worker.kinds, []);
  const running = worker.run();
  try {
    for (const n of [1, 3, 5]) {
      const job = await finished(byN[n], 'completed');
      assert.equal(job.attempt, 1, `#${n}`);
      assert.deepEqual(job.errors, [], `#${n}`);
      assert.deepEqual(job.result, { inserted: n }, `#${n}: the outcome of its own place in the batch`);
    }
    for (const n of [2, 4]) {
      const job = await finished(byN[n], 'completed');
      assert.equal(job.attempt, 2, `#${n}`);
      assert.equal(job.errors.length, 1, `#${n}: ${JSON.stringify(job.errors)}`);
      assert.equal(job.errors[0].attempt, 1);
      assert.equal(job.errors[0].message, `row ${n} rejected`);
      assert.equal(job.errors[0].class, 'retry_after');
      assert.deepEqual(job.result, { inserted: n });
    }
  } finally {
    await worker.close();
    await running;
  }
  assert.equal(batches.length, 2, JSON.stringify(batches));
  assert.deepEqual([...batches[0]].sort(), [1, 2, 3, 4, 5]);
  assert.deepEqual([...batches[1]].sort(), [2, 4]);
});

test('outcomes: an Error retries with backoff, Permanent dies, null is a result, promises are awaited; a throw or a missing outcome fails', async () => {
  const queue = uniqueQueue('outcomes');
  const mixed = uniqueName('mixed');
  const thrown = uniqueName('thrown');
  const short = uniqueName('short');
  const empty = uniqueName('empty');
  const promised = uniqueName('promised');
  await client.setBatch(mixed, { maxSize: 4 });
  await client.setBatch(promised, { maxSize: 2 });
  await client.setBatch(thrown, { maxSize: 2 });
  await client.setBatch(short, { maxSize: 3 });
  await client.setBatch(empty, { maxSize: 2 });
  const ids = await client.enqueueMany([
    { kind: mixed, queue, payload: { case: 'error' }, maxAttempts: 3 },
    { kind: mixed, queue, payload: { case: 'permanent' }, maxAttempts: 3 },
    { kind: mixed, queue, payload: { case: 'null' } },
    { kind: mixed, queue, payload: { case: 'ok' } },
    { kind: thrown, queue, maxAttempts: 1 },
    { kind: thrown, queue, maxAttempts: 1 },
    { kind: short, queue, maxAttempts: 1 },
    { kind: short, queue, maxAttempts: 1 },
    { kind: short, queue, maxAttempts: 1 },
    { kind: empty, queue },
    { kind: empty, queue },
    { kind: promised, queue, payload: 1, maxAttempts: 1 },
    { kind: promised, queue, payload: 2, maxAttempts: 1 },
  ]);
  const [error, permanent, nullResult, ok, thrown1, thrown2, , , , empty1, empty2, promised1, promised2] = ids;
  let shortFirst;
  const { worker } = newWorker({ queues: [queue] });
  worker
    .handleBatch(mixed, (jobs) =>
      jobs.map((job) => {
        switch (job.payload.case) {
          case 'error':
            return job.attempt === 1 ? new Error('boom') : 'recovered';
          case 'permanent':
            return new Permanent('bad row', { errorClass: 'rows.Invalid' });
          case 'null':
            return null;
          default:
            return { ok: true };
        }
      }),
    )
    .handleBatch(thrown, async () => {
      throw new TypeError('bulk insert failed');
    })
    .handleBatch(short, (jobs) => {
      shortFirst = jobs[0].id;
      return ['only the first'];
    })
    .handleBatch(empty, async () => undefined)
    .handleBatch(promised, (jobs) =>
      jobs.map(async (job) => {
        await new Promise((r) => setImmediate(r));
        if (job.payload === 1) return 'one';
        throw new RangeError('two');
      }),
    );
  const running = worker.run();
  try {
    const retried = await finished(error, 'completed');
    assert.equal(retried.attempt, 2);
    assert.equal(retried.result, 'recovered');
    assert.equal(retried.errors.length, 1);
    assert.equal(retried.errors[0].class, 'Error');
    assert.equal(retried.errors[0].message, 'Error: boom');
    assert.match(retried.errors[0].backtrace, /boom/);

    const dead = await finished(permanent, 'dead');
    assert.equal(dead.attempt, 1, 'Permanent: no further attempt though max_attempts is 3');
    assert.equal(dead.errors[0].class, 'rows.Invalid');
    assert.equal(dead.errors[0].message, 'bad row');

    assert.equal((await finished(nullResult, 'completed')).result, null);
    assert.deepEqual((await finished(ok, 'completed')).result, { ok: true });

    for (const id of [thrown1, thrown2]) {
      const job = await finished(id, 'dead');
      assert.equal(job.errors[0].class, 'TypeError');
      assert.equal(job.errors[0].message, 'TypeError: bulk insert failed');
    }

    const shortIds = ids.slice(6, 9);
    for (const id of shortIds) await client.wait(id, { timeoutMs: 15_000 });
    assert.ok(shortIds.includes(shortFirst));
    for (const id of shortIds) {
      const job = await client.get(id);
      if (id === shortFirst) {
        assert.equal(job.state, 'completed');
        assert.equal(job.result, 'only the first');
      } else {
        assert.equal(job.state, 'dead', JSON.stringify(job));
        assert.equal(job.errors[0].message, 'the batch handler returned 1 outcome(s) for a batch of 3');
        assert.equal(job.errors[0].class, 'missing_outcome');
      }
    }

    for (const id of [empty1, empty2]) {
      const job = await finished(id, 'completed');
      assert.equal(job.result, null);
      assert.deepEqual(job.errors, []);
    }

    assert.equal((await finished(promised1, 'completed')).result, 'one');
    const rejected = await finished(promised2, 'dead');
    assert.equal(rejected.errors[0].class, 'RangeError');
    assert.equal(rejected.errors[0].message, 'RangeError: two');
  } finally {
    await worker.close();
    await running;
  }
});

test("a worker with only handle() never receives a batch kind's job", async () => {
  const queue = uniqueQueue('plain');
  const kind = uniqueName('bulk');
  await client.setBatch(kind, { maxSize: 10 });
  // The batch kind's job is first in line: a plain fetch that did not skip it would take it.
  const batched = await client.enqueue(kind, { n: 1 }, { queue });
  const plain = await client.enqueue('plain', null, { queue });
  let calls = 0;
  const { worker } = newWorker({ queues: [queue] });
  worker.handle(kind, () => calls++).handle('plain', () => 'ran');
  const running = worker.run();
  try {
    assert.equal((await finished(plain, 'completed')).result, 'ran');
  } finally {
    await worker.close();
    await running;
  }
  assert.equal(calls, 0);
  const untouched = await client.get(batched);
  assert.equal(untouched.state, 'available');
  assert.equal(untouched.attempt, 0);
  assert.deepEqual(untouched.errors, []);

  // It was there to be taken: a batch handler takes it.
  const { worker: batcher } = newWorker({ queues: [queue] });
  batcher.handleBatch(kind, (jobs) => jobs.map((job) => job.payload.n * 10));
  const batching = batcher.run();
  try {
    const done = await finished(batched, 'completed');
    assert.equal(done.result, 10);
    assert.equal(done.attempt, 1);
  } finally {
    await batcher.close();
    await batching;
  }
});

test('a worker with both: plain fetches ask for the plain kinds only; a kind that is not a batch kind comes in batches of what waits', async () => {
  const queue = uniqueQueue('both');
  const hold = uniqueName('hold');
  const loose = uniqueName('loose'); // neither has a batch setting on the server
  // concurrency 1: one plain slot and one batch slot. The batch slot is taken first, so that
  // only plain fetches go out while the loose jobs wait.
  const { worker } = newWorker({ queues: [queue], concurrency: 1 });
  const holding = signal('the holding batch');
  const release = signal();
  const batches = [];
  // A kind given to handle() and then to handleBatch() is handled in batches (and the other way round).
  worker.handle(loose, () => 'plain handler').handleBatch(loose, (jobs) => {
    batches.push(jobs.map((job) => job.payload));
    return jobs.map((job) => `batched ${job.payload}`);
  });
  worker.handleBatch(hold, async () => {
    holding.resolve();
    await release.promise;
  });
  worker.handleBatch('plain', () => null).handle('plain', (job) => `plain ${job.payload}`);
  assert.deepEqual(worker.kinds, ['plain']);
  assert.deepEqual(worker.batchKinds.sort(), [hold, loose].sort());
  const held = await client.enqueue(hold, null, { queue });
  const running = worker.run();
  try {
    await holding.wait();
    assert.equal(worker.activeBatches, 1);
    // The loose jobs are first in line: a plain fetch that asked for their kind would take them.
    const ids = await client.enqueueMany([
      { kind: loose, queue, payload: 1 },
      { kind: loose, queue, payload: 2 },
      { kind: loose, queue, payload: 3 },
      { kind: 'plain', queue, payload: 4 },
    ]);
    assert.equal((await finished(ids[3], 'completed')).result, 'plain 4');
    for (const id of ids.slice(0, 3)) {
      const waiting = await client.get(id);
      assert.equal(waiting.state, 'available', JSON.stringify(waiting));
      assert.equal(waiting.attempt, 0);
    }
    release.resolve();
    await finished(held, 'completed');
    for (const [i, id] of ids.slice(0, 3).entries()) {
      const job = await finished(id, 'completed');
      assert.equal(job.result, `batched ${i + 1}`);
      assert.equal(job.attempt, 1);
    }
  } finally {
    release.resolve();
    await worker.close();
    await running;
  }
  // Not a batch kind: whatever of it waited came as one batch.
  assert.deepEqual(batches, [[1, 2, 3]]);
});

test('a keyed batch holds jobs of one key value only', async () => {
  const queue = uniqueQueue('keyed');
  const kind = uniqueName('sync');
  // Only full batches go out within the test's time: 3 jobs of one account.
  await client.setBatch(kind, { maxSize: 3, maxWaitMs: 60_000, key: 'payload.account' });
  const acme = uniqueName('acme');
  const globex = uniqueName('globex');
  const accounts = [acme, globex, acme, globex, acme, globex]; // interleaved
  const ids = await client.enqueueMany(accounts.map((account, n) => ({ kind, queue, payload: { account, n } })));
  const batches = [];
  const { worker } = newWorker({ queues: [queue] });
  worker.handleBatch(kind, (jobs) => {
    batches.push(jobs.map((job) => job.payload));
    return jobs.map((job) => job.payload.account);
  });
  const running = worker.run();
  try {
    for (const [n, id] of ids.entries()) {
      const job = await finished(id, 'completed');
      assert.equal(job.result, accounts[n]);
      // Jobs of the other key claimed along the way and handed back do not count an attempt.
      assert.equal(job.attempt, 1);
      assert.deepEqual(job.errors, []);
    }
  } finally {
    await worker.close();
    await running;
  }
  assert.equal(batches.length, 2, JSON.stringify(batches));
  for (const batch of batches) {
    assert.equal(batch.length, 3, JSON.stringify(batches));
    assert.equal(new Set(batch.map((p) => p.account)).size, 1, `one account per batch: ${JSON.stringify(batch)}`);
  }
  assert.deepEqual(batches.map((b) => b[0].account).sort(), [acme, globex].sort());
});

test("a kind's batch setting round-trips; bad input is refused naming the field", async () => {
  const kind = uniqueName('bulk');
  const full = { max_size: 50, max_wait_ms: 2_000, key: 'payload.account' };
  assert.deepEqual(await client.setBatch(kind, { maxSize: 50, maxWaitMs: 2_000, key: 'payload.account' }), full);
  assert.deepEqual((await client.getSchema(kind)).batch, full);
  // What the server answers can be sent back as it is.
  assert.deepEqual(await client.setBatch(kind, (await client.getSchema(kind)).batch), full);
  assert.ok((await client.listSchemas()).some((k) => k.kind === kind && k.batch?.max_size === 50));

  // The kind's other settings are kept: a schema and its version by setBatch, the batch by setSchema.
  await client.setSchema(kind, { type: 'object' }, { version: 3 });
  assert.deepEqual((await client.getSchema(kind)).batch, full);
  assert.deepEqual(await client.setBatch(kind, { maxSize: 10 }), { max_size: 10, max_wait_ms: 0 });
  const kept = await client.getSchema(kind);
  assert.deepEqual(kept.schema, { type: 'object' });
  assert.equal(kept.version, 3);

  const cases = [
    [{ maxSize: 0 }, 'batch.max_size'],
    [{ maxSize: 1001 }, 'batch.max_size'],
    [{ maxSize: 2.5 }, 'batch.max_size'],
    [{ maxWaitMs: 100 }, 'batch.max_size'], // max_size is required
    [{ maxSize: 5, maxWaitMs: 3_600_001 }, 'batch.max_wait_ms'],
    [{ maxSize: 5, key: 'nope' }, 'batch.key'],
    [{ maxSize: 5, later: true }, 'batch.later'],
  ];
  for (const [settings, field] of cases) {
    await assert.rejects(client.setBatch(kind, settings), (e) => {
      assert.ok(e instanceof InvalidRequest, `${JSON.stringify(settings)}: ${e}`);
      assert.equal(e.status, 400);
      assert.equal(e.field, field, JSON.stringify(settings));
      return true;
    });
  }
  assert.deepEqual((await client.getSchema(kind)).batch, { max_size: 10, max_wait_ms: 0 }, 'nothing refused was stored');

  // Refused before sending.
  for (const bad of [undefined, 5, 'payload.account', [10]]) {
    await assert.rejects(client.setBatch(kind, bad), TypeError, JSON.stringify(bad));
  }
  await assert.rejects(client.setBatch(kind, { maxSize: 5, max_size: 6 }), TypeError);
  await assert.rejects(client.setBatch('', { maxSize: 5 }), TypeError);

  assert.equal(await client.setBatch(kind, null), null);
  const removed = await client.getSchema(kind);
  assert.equal(removed.batch, undefined);
  assert.deepEqual(removed.schema, { type: 'object' });
});

test('the batch setting as sent', () => {
  assert.deepEqual(batchBody({ maxSize: 5, maxWaitMs: 300, key: 'tenant' }), { key: 'tenant', max_size: 5, max_wait_ms: 300 });
  assert.deepEqual(batchBody({ maxSize: 5 }), { max_size: 5 });
  assert.deepEqual(batchBody({ max_size: 5, max_wait_ms: 0, maxSize: 5 }), { max_size: 5, max_wait_ms: 0 });
  assert.equal(batchBody(null), null);
  assert.throws(() => batchBody({ maxWaitMs: 1, max_wait_ms: 2 }), TypeError);
});

test('heartbeats renew the lease of every job of a running batch', async () => {
  const queue = uniqueQueue('beats');
  const kind = uniqueName('slow');
  await client.setBatch(kind, { maxSize: 3 });
  const ids = await client.enqueueMany([1, 2, 3].map((n) => ({ kind, queue, payload: n })));
  const started = signal('the batch');
  const finish = signal();
  const { worker } = newWorker({ queues: [queue], leaseMs: 300 });
  worker.handleBatch(kind, async (jobs) => {
    started.resolve(jobs);
    await finish.promise;
    return jobs.map((job) => (job.signal.aborted ? new Error('aborted') : 'held'));
  });
  const running = worker.run();
  try {
    const jobs = await started.wait();
    assert.equal(jobs.length, 3);
    const first = Math.max(...jobs.map((job) => job.leaseExpiresAt.getTime()));
    // Well past the first lease (300 ms; the server rescues expired leases every 200 ms here),
    // every job's lease has been renewed, on the server too.
    await eventually(() => jobs.every((job) => job.leaseExpiresAt.getTime() >= first + 900), { what: 'leases renewed past 3 lease periods' });
    for (const id of ids) {
      const job = await client.get(id);
      assert.equal(job.state, 'running');
      assert.ok(Date.parse(job.lease.expires_at) >= first + 900, `${id}: ${job.lease.expires_at}`);
    }
    finish.resolve();
    for (const id of ids) {
      const job = await finished(id, 'completed');
      assert.equal(job.result, 'held');
      assert.equal(job.attempt, 1);
      assert.deepEqual(job.errors, []);
    }
  } finally {
    finish.resolve();
    await worker.close();
    await running;
  }
});

test('close() lets a running batch finish within the grace period and acknowledges it', async () => {
  const queue = uniqueQueue('drain');
  const kind = uniqueName('drain');
  await client.setBatch(kind, { maxSize: 2 });
  const ids = await client.enqueueMany([1, 2].map((n) => ({ kind, queue, payload: n })));
  const started = signal('the batch');
  const { worker } = newWorker({ queues: [queue], graceMs: 5_000 });
  worker.handleBatch(kind, async (jobs) => {
    started.resolve();
    await new Promise((r) => setTimeout(r, 400)); // the batch's work
    return jobs.map((job) => job.payload * 2);
  });
  const running = worker.run();
  await started.wait();
  const began = Date.now();
  await worker.close();
  const took = Date.now() - began;
  await running;
  assert.ok(took >= 300, `close() returned after ${took} ms, before the batch finished`);
  for (const [i, id] of ids.entries()) {
    const job = await client.get(id);
    assert.equal(job.state, 'completed', JSON.stringify(job));
    assert.equal(job.result, (i + 1) * 2);
  }
});

test('a batch still running when the grace period ends is released, its jobs signalled', async () => {
  const queue = uniqueQueue('grace');
  const kind = uniqueName('stuck');
  await client.setBatch(kind, { maxSize: 2 });
  const ids = await client.enqueueMany([1, 2].map((n) => ({ kind, queue, payload: n })));
  const started = signal('the batch');
  const reasons = [];
  const { worker, logger } = newWorker({ queues: [queue], graceMs: 300 });
  worker.handleBatch(kind, async (jobs) => {
    started.resolve();
    await Promise.all(
      jobs.map((job) => new Promise((resolve) => job.signal.addEventListener('abort', () => resolve(reasons.push(job.signal.reason)), { once: true }))),
    );
    return jobs.map(() => 'too late'); // dropped: released at shutdown
  });
  const running = worker.run();
  await started.wait();
  const began = Date.now();
  await worker.close();
  const took = Date.now() - began;
  await running;
  assert.ok(took >= 250, `close() returned after ${took} ms with graceMs 300`);
  assert.equal(reasons.length, 2);
  for (const reason of reasons) assert.ok(reason instanceof ShutdownError, String(reason));
  for (const id of ids) {
    const job = await client.get(id);
    assert.equal(job.state, 'available', JSON.stringify(job));
    assert.equal(job.attempt, 0);
    assert.deepEqual(job.errors, []);
    assert.equal(job.result, null);
  }
  await eventually(() => logger.lines.some((l) => l.includes('released at shutdown')), { what: 'the dropped outcomes logged' });
});

test('with OpenTelemetry a batch runs in one span linked to its producers', async () => {
  const exporter = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  trace.setGlobalTracerProvider(provider);
  const queue = uniqueQueue('otel');
  const kind = uniqueName('traced');
  await client.setBatch(kind, { maxSize: 2 });
  const parent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
  const ids = await client.enqueueMany([
    { kind, queue, traceparent: parent },
    { kind, queue }, // no trace context: no link
  ]);
  const { worker } = newWorker({ queues: [queue] });
  worker.handleBatch(kind, () => null);
  const running = worker.run();
  try {
    for (const id of ids) await finished(id, 'completed');
  } finally {
    await worker.close();
    await running;
  }
  const spans = exporter.getFinishedSpans().filter((s) => s.name === `conveyor ${kind}`);
  assert.equal(spans.length, 1);
  const [span] = spans;
  assert.equal(span.kind, SpanKind.CONSUMER);
  assert.equal(span.attributes['messaging.batch.message_count'], 2);
  assert.equal(span.links.length, 1);
  assert.equal(span.links[0].context.traceId, '4bf92f3577b34da6a3ce929d0e0e4736');
  assert.equal(span.links[0].context.spanId, '00f067aa0ba902b7');
  assert.equal(span.links[0].attributes['messaging.message.id'], ids[0]);
});
