// Draining: close() and SIGTERM; surviving a server restart.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ShutdownError } from '../dist/index.js';
import { server, client, useServer, newWorker, waitState, eventually, uniqueQueue } from './helpers.mjs';

useServer();

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => {
      clearTimeout(timer);
      reject(signal.reason);
    }, { once: true });
  });
}

test('close(): running handlers finish within the grace period and are acknowledged; the rest are released', async () => {
  const queue = uniqueQueue();
  const { worker } = newWorker({ queues: [queue], concurrency: 2, prefetch: 2, graceMs: 700 });
  let reason;
  worker.handle('sleep', async (job) => {
    try {
      await sleep(job.payload.ms, job.signal);
    } catch (e) {
      reason = e;
      throw e;
    }
    return job.payload.ms;
  });
  const [short, long, queued1, queued2] = await client.enqueueMany([
    { kind: 'sleep', payload: { ms: 300 }, queue, priority: 9 },
    { kind: 'sleep', payload: { ms: 20_000 }, queue, priority: 8 },
    { kind: 'sleep', payload: { ms: 10 }, queue, priority: 1 },
    { kind: 'sleep', payload: { ms: 10 }, queue, priority: 1 },
  ]);
  const running = worker.run();
  await waitState(short, 'running');
  await waitState(long, 'running');
  // The two others are prefetched (held, not started).
  await eventually(async () => (await client.get(queued1)).state === 'running' && (await client.get(queued2)).state === 'running', { what: 'prefetch' });
  const began = Date.now();
  await worker.close();
  const took = Date.now() - began;
  await running;
  assert.ok(took >= 600 && took < 3_000, `close() took ${took} ms with graceMs 700`);
  const finished = await client.get(short);
  assert.equal(finished.state, 'completed');
  assert.equal(finished.result, 300);
  for (const id of [long, queued1, queued2]) {
    const released = await client.get(id);
    assert.equal(released.state, 'available', `${id}: ${JSON.stringify(released)}`);
    assert.equal(released.attempt, 0);
    assert.deepEqual(released.errors, []);
  }
  assert.ok(reason instanceof ShutdownError, `the long job's signal said ${reason}`);
});

test('close() with nothing running returns promptly, even while a fetch long-polls', async () => {
  const { worker } = newWorker({ queues: [uniqueQueue()], waitMs: 20_000 });
  worker.handle('x', () => null);
  const running = worker.run();
  await new Promise((r) => setTimeout(r, 200)); // let the long-poll start
  const began = Date.now();
  await worker.close();
  await running;
  assert.ok(Date.now() - began < 1_000, `close() took ${Date.now() - began} ms`);
});

test('the worker survives a server restart: acknowledgements wait, fetching resumes', async () => {
  const queue = uniqueQueue();
  const { worker, logger } = newWorker({ queues: [queue], leaseMs: 15_000, backoffMaxMs: 500 });
  worker.handle('sleep', async (job) => {
    await sleep(job.payload.ms);
    return 'slept';
  });
  const running = worker.run();
  const slow = await client.enqueue('sleep', { ms: 600 }, { queue });
  await waitState(slow, 'running');
  await server.kill('SIGKILL');
  // The job finishes while the server is down: its acknowledgement must wait for it.
  await eventually(() => logger.lines.some((l) => /failed/.test(l)), { what: 'the outage noticed' });
  await sleep(700);
  await server.restart();
  const done = await waitState(slow, 'completed');
  assert.equal(done.attempt, 1);
  assert.equal(done.result, 'slept');
  const after = await client.enqueue('sleep', { ms: 1 }, { queue });
  assert.equal((await waitState(after, 'completed')).result, 'slept');
  await worker.close();
  await running;
});

test('a worker told to stop by an operator drains and run() resolves; later jobs stay queued', async () => {
  const queue = uniqueQueue();
  const { worker } = newWorker({ queues: [queue], waitMs: 1000, workerId: `ts-told-${queue}` });
  worker.handle('noop', async () => null);
  const first = await client.enqueue('noop', {}, { queue });
  const running = worker.run();
  await waitState(first, 'completed');
  const told = await server.api('POST', `/v1/workers/${worker.workerId}/stop`, {});
  assert.equal(told.status, 200);
  assert.equal(told.body.command, 'stop');
  const later = await client.enqueue('noop', {}, { queue });
  await running;
  assert.equal((await client.get(later)).state, 'available');
});
