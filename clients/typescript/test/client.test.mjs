import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Client, ConveyorError, InvalidRequest, NotFound, QueueFull, Conflict, ConnectionError } from '../dist/index.js';
import { server, client, useServer, uniqueQueue } from './helpers.mjs';

useServer();

test('enqueue returns the id; get shows every option as sent', async () => {
  const queue = uniqueQueue();
  const runAt = new Date(Date.now() + 3_600_000);
  const id = await client.enqueue('email.send', { to: 'a@example.com', n: [1, 2] }, {
    queue,
    priority: 5,
    runAt,
    maxAttempts: 3,
    idempotencyKey: `key-${queue}`,
    tenant: 'acme',
    timeoutMs: 1500,
    tags: ['onboarding', 'x'],
  });
  assert.match(id, /^[0-9a-f-]{36}$/);
  const job = await client.get(id);
  assert.equal(job.id, id);
  assert.equal(job.kind, 'email.send');
  assert.deepEqual(job.payload, { to: 'a@example.com', n: [1, 2] });
  assert.equal(job.queue, queue);
  assert.equal(job.priority, 5);
  assert.equal(job.run_at, runAt.toISOString());
  assert.equal(job.state, 'scheduled');
  assert.equal(job.max_attempts, 3);
  assert.equal(job.idempotency_key, `key-${queue}`);
  assert.equal(job.tenant, 'acme');
  assert.equal(job.timeout_ms, 1500);
  assert.deepEqual(job.tags, ['onboarding', 'x']);

  // The same idempotency key answers the existing job's id.
  assert.equal(await client.enqueue('email.send', {}, { queue, idempotencyKey: `key-${queue}` }), id);
});

test('defaults: no payload is null, queue default, available now', async () => {
  const id = await client.enqueue('noop');
  const job = await client.get(id);
  assert.equal(job.payload, null);
  assert.equal(job.queue, 'default');
  assert.equal(job.state, 'available');
});

test('delayMs and delay (seconds) schedule the job later', async () => {
  const before = Date.now();
  const a = await client.get(await client.enqueue('later', 1, { queue: uniqueQueue(), delayMs: 60_000 }));
  const b = await client.get(await client.enqueue('later', 2, { queue: uniqueQueue(), delay: 120 }));
  assert.equal(a.state, 'scheduled');
  assert.equal(b.state, 'scheduled');
  const da = Date.parse(a.run_at) - before;
  const db = Date.parse(b.run_at) - before;
  assert.ok(da >= 59_000 && da <= 61_000, `delayMs: run_at ${da} ms ahead`);
  assert.ok(db >= 119_000 && db <= 121_000, `delay: run_at ${db} ms ahead`);
  await assert.rejects(client.enqueue('x', null, { delayMs: 1, delay: 1 }), TypeError);
  await assert.rejects(client.enqueue('x', null, { delayMs: 1, runAt: new Date() }), TypeError);
});

test('unique: true deduplicates by payload; options are mapped', async () => {
  const queue = uniqueQueue();
  const a = await client.enqueue('report', { customer: 7, at: 1 }, { queue, unique: true });
  const b = await client.enqueue('report', { customer: 7, at: 1 }, { queue, unique: true });
  assert.equal(a, b);
  const c = await client.enqueue('report', { customer: 7, at: 2 }, { queue, unique: { args: ['customer'], periodMs: 60_000, byQueue: false, states: ['available'] } });
  const d = await client.enqueue('report', { customer: 7, at: 3 }, { queue: uniqueQueue(), unique: { args: ['customer'], byQueue: false, states: ['available'] } });
  assert.notEqual(c, a);
  assert.equal(d, c);
  assert.ok((await client.get(c)).unique_key);
});

test('enqueueMany returns ids in order', async () => {
  const queue = uniqueQueue();
  const ids = await client.enqueueMany([
    { kind: 'a', payload: { n: 1 }, queue },
    { kind: 'b', payload: { n: 2 }, queue, priority: 3, delayMs: 60_000 },
    { kind: 'c', queue, idempotencyKey: `k-${queue}` },
  ]);
  assert.equal(ids.length, 3);
  const jobs = await Promise.all(ids.map((id) => client.get(id)));
  assert.deepEqual(jobs.map((j) => j.kind), ['a', 'b', 'c']);
  assert.deepEqual(jobs[0].payload, { n: 1 });
  assert.equal(jobs[1].priority, 3);
  assert.equal(jobs[1].state, 'scheduled');
  assert.deepEqual(await client.enqueueMany([]), []);
});

test('invalid input: InvalidRequest naming the field', async () => {
  await assert.rejects(client.enqueue('ok', null, { queue: 'bad name!' }), (e) => {
    assert.ok(e instanceof InvalidRequest && e instanceof ConveyorError);
    assert.equal(e.status, 400);
    assert.equal(e.code, 'invalid_request');
    assert.equal(e.field, 'queue');
    assert.match(e.message, /400 invalid_request \(field queue\)/);
    return true;
  });
  await assert.rejects(
    client.enqueueMany([{ kind: 'ok' }, { kind: 'ok', maxAttempts: 0 }]),
    (e) => e instanceof InvalidRequest && e.field === 'jobs[1].max_attempts',
  );
  await assert.rejects(client.enqueue('x', 'y'.repeat(300_000)), (e) => e instanceof InvalidRequest && e.status === 413);
});

test('get and cancel of an unknown job: NotFound', async () => {
  const missing = '00000000-0000-0000-0000-000000000000';
  await assert.rejects(client.get(missing), (e) => e instanceof NotFound && e.status === 404 && e.code === 'not_found');
  await assert.rejects(client.cancel(missing), NotFound);
});

test('cancel: the job is cancelled; cancelling again is a Conflict', async () => {
  const id = await client.enqueue('to.cancel', null, { queue: uniqueQueue() });
  const job = await client.cancel(id);
  assert.equal(job.state, 'cancelled');
  assert.equal((await client.get(id)).state, 'cancelled');
  await assert.rejects(client.cancel(id), (e) => e instanceof Conflict && e.status === 409);
});

test('a full queue: QueueFull with retryAfter in seconds', async () => {
  const queue = uniqueQueue('full');
  const res = await server.api('PUT', `/v1/queues/${queue}`, { max_depth: 1 });
  assert.equal(res.status, 200);
  await client.enqueue('x', null, { queue });
  await assert.rejects(client.enqueue('x', null, { queue }), (e) => {
    assert.ok(e instanceof QueueFull);
    assert.equal(e.status, 429);
    assert.equal(e.code, 'queue_full');
    assert.equal(typeof e.retryAfter, 'number');
    assert.ok(e.retryAfter >= 1);
    return true;
  });
});

test('no server: ConnectionError (status 0)', async () => {
  const nowhere = new Client({ url: 'http://127.0.0.1:9', timeoutMs: 2000 });
  await assert.rejects(nowhere.enqueue('x'), (e) => e instanceof ConnectionError && e.status === 0 && e.code === 'connection');
  nowhere.close();
});

test('many concurrent enqueues over keep-alive connections', async () => {
  const queue = uniqueQueue();
  const ids = await Promise.all(Array.from({ length: 200 }, (_, n) => client.enqueue('c', { n }, { queue })));
  assert.equal(new Set(ids).size, 200);
});

test('wait resolves once the job finishes, or as it is when the timeout passes', async () => {
  const queue = uniqueQueue();
  const id = await client.enqueue('report', { n: 1 }, { queue });
  const other = new Client({ url: server.url });
  try {
    const waiting = other.wait(id, { timeoutMs: 30_000 });
    const jobs = await server.fetchJobs(queue, { max: 1 });
    assert.equal(jobs[0].id, id);
    const completed = await server.api('POST', `/v1/jobs/${id}/complete`, { lease_token: jobs[0].lease_token, result: { rows: 3 } });
    assert.equal(completed.status, 200);
    const done = await waiting;
    assert.equal(done.state, 'completed');
    assert.deepEqual(done.result, { rows: 3 });
  } finally {
    other.close();
  }

  const idle = await client.enqueue('report', { n: 2 }, { queue: uniqueQueue() });
  const started = Date.now();
  const job = await client.wait(idle, { timeoutMs: 300 });
  assert.equal(job.state, 'available');
  assert.ok(Date.now() - started >= 300, `gave up after ${Date.now() - started} ms`);
  await assert.rejects(client.wait(idle, { timeoutMs: -1 }), TypeError);
});

test('sendEvent makes one job per matching subscription, once per id', async () => {
  const queue = uniqueQueue();
  const put = async (name, body) => {
    const res = await fetch(`${server.url}/v1/subscriptions/${name}`, {
      method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
    });
    assert.ok(res.ok, `PUT subscription: ${res.status}`);
  };
  await put(`${queue}-a`, { event: `${queue}.happened`, job: { kind: 'a.run', queue } });
  await put(`${queue}-b`, { event: `${queue}.happened`, job: { kind: 'b.run', queue }, filter: { vip: true } });
  const sent = await client.sendEvent(`${queue}.happened`, { vip: true }, { id: 'evt-1' });
  assert.equal(sent.id, 'evt-1');
  assert.deepEqual(sent.jobs.map((j) => j.subscription).sort(), [`${queue}-a`, `${queue}-b`]);
  const b = sent.jobs.find((j) => j.subscription === `${queue}-b`);
  assert.equal((await client.get(b.job_id)).kind, 'b.run');
  const again = await client.sendEvent(`${queue}.happened`, { vip: true }, { id: 'evt-1' });
  assert.ok(again.jobs.every((j) => j.duplicate));
  assert.equal((await client.sendEvent(`${queue}.happened`, { vip: false })).jobs.length, 1);
  await assert.rejects(client.sendEvent('bad name!'), (error) => error instanceof InvalidRequest && error.field === 'name');
});
