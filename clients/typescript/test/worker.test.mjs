// Worker behaviours against a real server: outcomes, kinds, heartbeats, lease loss, timeouts.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Worker, Retry, RetryAfter, Permanent, LeaseLostError, JobTimeoutError } from '../dist/index.js';
import { server, client, useServer, newWorker, waitState, eventually, uniqueQueue } from './helpers.mjs';

useServer();

class PaymentDeclined extends Error {}

test('handler outcomes: result, Retry, RetryAfter, Permanent, thrown errors', async () => {
  const queue = uniqueQueue();
  const { worker } = newWorker({ queues: [queue], concurrency: 4 });
  const seen = [];
  worker
    .handle('ok', async (job) => {
      seen.push(job);
      return { echo: job.payload, attempt: job.attempt };
    })
    .handle('sync', (job) => job.payload.n * 2)
    .handle('nothing', async () => undefined)
    .handle('retry', async (job) => {
      if (job.attempt === 1) throw new Retry('not yet');
      return 'second';
    })
    .handle('retry_after', async (job) => {
      if (job.attempt === 1) throw new RetryAfter(0.3, 'in 300 ms');
      return 'later';
    })
    .handle('retry_after_ms', async (job) => {
      if (job.attempt === 1) throw RetryAfter.ms(200);
      return 'later-ms';
    })
    .handle('permanent', async () => {
      throw new Permanent('no such customer');
    })
    .handle('classed', async (job) => {
      if (job.attempt === 1) throw new Retry('busy', { errorClass: 'upstream.Busy' });
      throw new Permanent('expired', { errorClass: 'billing/CardExpired' });
    })
    .handle('declined', async () => {
      throw new PaymentDeclined('card declined');
    })
    .handle('renamed', async () => {
      const err = new TypeError('bad');
      err.name = 'Bad Name/Ü';
      throw err;
    })
    .handle('string', async () => {
      throw 'a string';
    });
  const running = worker.run();
  const ids = {};
  for (const [kind, payload, opts] of [
    ['ok', { hello: 'wörld ✓' }, {}],
    ['sync', { n: 21 }, {}],
    ['nothing', null, {}],
    ['retry', null, {}],
    ['retry_after', null, {}],
    ['retry_after_ms', null, {}],
    ['permanent', null, { maxAttempts: 5 }],
    ['classed', null, {}],
    ['declined', null, { maxAttempts: 1 }],
    ['renamed', null, { maxAttempts: 1 }],
    ['string', null, { maxAttempts: 1 }],
  ]) {
    ids[kind] = await client.enqueue(kind, payload, { queue, ...opts });
  }

  const ok = await waitState(ids.ok, 'completed');
  assert.deepEqual(ok.result, { echo: { hello: 'wörld ✓' }, attempt: 1 });
  const job = seen[0];
  assert.equal(job.id, ids.ok);
  assert.equal(job.kind, 'ok');
  assert.equal(job.queue, queue);
  assert.equal(job.attempt, 1);
  assert.equal(job.maxAttempts, 25);
  assert.equal(job.timeoutMs, null);
  assert.deepEqual(job.tags, []);
  assert.ok(job.leaseExpiresAt instanceof Date);
  assert.ok(job.signal instanceof AbortSignal && !job.signal.aborted);
  assert.equal(job.workerId, worker.workerId);

  assert.equal((await waitState(ids.sync, 'completed')).result, 42);
  assert.equal((await waitState(ids.nothing, 'completed')).result, null);

  const retried = await waitState(ids.retry, 'completed');
  assert.equal(retried.attempt, 2);
  assert.equal(retried.result, 'second');
  assert.equal(retried.errors[0].class, 'error');
  assert.equal(retried.errors[0].message, 'not yet');

  const after = await waitState(ids.retry_after, 'completed');
  assert.equal(after.attempt, 2);
  assert.equal(after.errors[0].class, 'retry_after');
  const gap = Date.parse(after.finished_at) - Date.parse(after.errors[0].at);
  assert.ok(gap >= 250, `retried ${gap} ms after RetryAfter(0.3)`);
  const afterMs = await waitState(ids.retry_after_ms, 'completed');
  assert.ok(Date.parse(afterMs.finished_at) - Date.parse(afterMs.errors[0].at) >= 150);

  const dead = await waitState(ids.permanent, 'dead');
  assert.equal(dead.attempt, 1);
  assert.equal(dead.errors[0].class, 'permanent');
  assert.equal(dead.errors[0].message, 'no such customer');

  const classed = await waitState(ids.classed, 'dead');
  assert.deepEqual(classed.errors.map((e) => [e.class, e.message]), [['upstream.Busy', 'busy'], ['billing_CardExpired', 'expired']]);

  const declined = await waitState(ids.declined, 'dead');
  assert.equal(declined.errors[0].class, 'PaymentDeclined');
  assert.match(declined.errors[0].message, /card declined/);
  assert.match(declined.errors[0].backtrace, /worker\.test\.mjs/, 'the stack is recorded beside the message');
  assert.ok(declined.errors[0].worker_id && declined.errors[0].started_at, 'who ran it and since when');

  const renamed = await waitState(ids.renamed, 'dead');
  assert.equal(renamed.errors[0].class, 'Bad_Name__');
  const string = await waitState(ids.string, 'dead');
  assert.equal(string.errors[0].class, 'Error');
  assert.equal(string.errors[0].message, 'a string');

  await worker.close();
  await running;
});

test('kinds: a worker never claims a kind it has no handler for; it shows in /v1/workers', async () => {
  const queue = uniqueQueue();
  const { worker } = newWorker({ queues: [queue], concurrency: 3, workerId: `kinds-${queue}` });
  worker.handle('mine', async () => 'done');
  const running = worker.run();
  const other = await client.enqueue('not_mine', null, { queue });
  const mine = await client.enqueue('mine', null, { queue });
  await waitState(mine, 'completed');
  const untouched = await client.get(other);
  assert.equal(untouched.state, 'available');
  assert.equal(untouched.attempt, 0);
  const listed = await eventually(async () => {
    const { body } = await server.api('GET', '/v1/workers');
    return body.workers.find((w) => w.id === `kinds-${queue}`);
  }, { what: 'the worker in /v1/workers' });
  assert.equal(listed.concurrency, 3);
  assert.equal(listed.state, 'alive');
  assert.deepEqual(listed.queues, [queue]);
  await worker.close();
  await running;
  const { body } = await server.api('GET', '/v1/workers');
  assert.equal(body.workers.find((w) => w.id === `kinds-${queue}`).state, 'stopped');
});

test('heartbeats keep a job running past its lease', async () => {
  const queue = uniqueQueue();
  const { worker } = newWorker({ queues: [queue], leaseMs: 500 });
  let expiries = new Set();
  worker.handle('long', async (job) => {
    const end = Date.now() + 1500;
    while (Date.now() < end) {
      expiries.add(job.leaseExpiresAt.getTime());
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.equal(job.signal.aborted, false);
    return 'held';
  });
  const running = worker.run();
  const id = await client.enqueue('long', null, { queue });
  const done = await waitState(id, 'completed');
  assert.equal(done.attempt, 1);
  assert.deepEqual(done.errors, []);
  assert.equal(done.result, 'held');
  assert.ok(expiries.size >= 2, 'job.leaseExpiresAt follows the renewals');
  await worker.close();
  await running;
});

test('a lost lease aborts job.signal, drops the result and logs it; the worker carries on', async () => {
  const queue = uniqueQueue();
  const { worker, logger } = newWorker({ queues: [queue], concurrency: 1, leaseMs: 600 });
  let reason;
  worker
    .handle('slow', (job) => new Promise((resolve) => {
      job.signal.addEventListener('abort', () => {
        reason = job.signal.reason;
        resolve('too late'); // a result after the loss is dropped
      });
    }))
    .handle('ok', async () => 'next');
  const running = worker.run();
  const id = await client.enqueue('slow', null, { queue });
  await waitState(id, 'running');
  await client.cancel(id);
  const next = await client.enqueue('ok', null, { queue });
  await waitState(next, 'completed');
  assert.ok(reason instanceof LeaseLostError, `signal.reason is ${reason}`);
  await eventually(() => logger.lines.some((l) => l.includes(id) && l.includes('result dropped')), { what: 'the drop logged' });
  const lost = await client.get(id);
  assert.equal(lost.state, 'cancelled');
  assert.equal(lost.result, null);
  assert.deepEqual(lost.errors, []);
  await worker.close();
  await running;
});

test('timeoutMs: the signal aborts and the attempt fails with class timeout', async () => {
  const queue = uniqueQueue();
  const { worker } = newWorker({ queues: [queue] });
  let reason;
  worker.handle('stuck', (job) => new Promise((_, reject) => {
    job.signal.addEventListener('abort', () => {
      reason = job.signal.reason;
      reject(reason);
    });
  }));
  const running = worker.run();
  const id = await client.enqueue('stuck', null, { queue, timeoutMs: 200, maxAttempts: 1 });
  const dead = await waitState(id, 'dead');
  assert.equal(dead.errors[0].class, 'timeout');
  assert.ok(reason instanceof JobTimeoutError);
  await worker.close();
  await running;
});

test('a result the server refuses (too large) becomes a failure, the others go through', async () => {
  const queue = uniqueQueue();
  const { worker, logger } = newWorker({ queues: [queue], concurrency: 4 });
  let release;
  const gate = new Promise((r) => (release = r));
  worker.handle('big', async (job) => {
    await gate; // all three finish together, so their acks share a batch
    return job.payload.big ? 'x'.repeat(300_000) : 'small';
  });
  const running = worker.run();
  const ids = await client.enqueueMany([
    { kind: 'big', payload: { big: false }, queue },
    { kind: 'big', payload: { big: true }, queue, maxAttempts: 1 },
    { kind: 'big', payload: { big: false }, queue },
  ]);
  await eventually(async () => (await Promise.all(ids.map((id) => client.get(id)))).every((j) => j.state === 'running'), { what: 'all running' });
  release();
  assert.equal((await waitState(ids[0], 'completed')).result, 'small');
  assert.equal((await waitState(ids[2], 'completed')).result, 'small');
  const refused = await waitState(ids[1], 'dead');
  assert.equal(refused.errors[0].class, 'invalid_result');
  assert.ok(logger.lines.some((l) => l.includes(ids[1])));
  await worker.close();
  await running;
});

test('many jobs at concurrency 10: every job runs once', async () => {
  const queue = uniqueQueue();
  const { worker } = newWorker({ queues: [queue], concurrency: 10 });
  const runs = new Map();
  let active = 0;
  let peak = 0;
  worker.handle('n', async (job) => {
    active++;
    peak = Math.max(peak, active);
    runs.set(job.payload.n, (runs.get(job.payload.n) ?? 0) + 1);
    await new Promise((r) => setImmediate(r));
    active--;
    return job.payload.n;
  });
  const n = 600;
  await client.enqueueMany(Array.from({ length: n }, (_, i) => ({ kind: 'n', payload: { n: i }, queue })));
  const running = worker.run();
  await eventually(async () => {
    const { body } = await server.api('GET', '/v1/queues');
    return body.queues.find((q) => q.name === queue)?.completed === n;
  }, { ms: 30_000, what: `${n} completed` });
  assert.equal(runs.size, n);
  assert.ok([...runs.values()].every((c) => c === 1));
  assert.ok(peak <= 10, `peak concurrency ${peak}`);
  await worker.close();
  await running;
});

test('usage errors', async () => {
  await assert.rejects(new Worker({ url: server.url, handleSignals: false, logger: null }).run(), /no handlers/);
  assert.throws(() => new Worker({ url: server.url, concurrency: 0 }), RangeError);
  assert.throws(() => new Worker({}), TypeError);
  assert.throws(() => new Worker({ url: server.url }).handle('', () => {}), TypeError);
  assert.throws(() => new RetryAfter(-1), TypeError);
  const { worker } = newWorker({ queues: [uniqueQueue()] });
  worker.handle('x', () => null);
  await worker.close(); // before run: nothing to do, and run() then returns at once
  await worker.run();
  await assert.rejects(worker.run(), /already running/);
});
