// Access control (`serve --auth`): tokens by role, 401 and 403 from the client and the worker.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { Client, Unauthorized, Forbidden, ConveyorError } from '../dist/index.js';
import { server, useServer, newWorker, waitState, uniqueQueue, UNKNOWN_TOKEN } from './helpers.mjs';

const ready = useServer({ auth: true });
const tokens = {};
before(async () => {
  await ready;
  for (const role of ['producer', 'worker', 'admin']) tokens[role] = await server.token(role);
});

test('no token or an unknown one: Unauthorized (401)', async () => {
  for (const token of [undefined, UNKNOWN_TOKEN]) {
    const client = new Client({ url: server.url, token });
    await assert.rejects(client.enqueue('x'), (e) => {
      assert.ok(e instanceof Unauthorized && e instanceof ConveyorError);
      assert.equal(e.status, 401);
      assert.equal(e.code, 'unauthorized');
      assert.match(e.message, /401/);
      return true;
    });
    client.close();
  }
});

test('a producer enqueues and reads its jobs; cancel needs an admin: Forbidden (403)', async () => {
  const producer = new Client({ url: server.url, token: tokens.producer });
  const admin = new Client({ url: server.url, token: tokens.admin });
  const id = await producer.enqueue('x', { a: 1 }, { queue: uniqueQueue() });
  assert.equal((await producer.get(id)).id, id);
  await assert.rejects(producer.cancel(id), (e) => e instanceof Forbidden && e.status === 403 && e.code === 'forbidden');
  assert.equal((await admin.cancel(id)).state, 'cancelled');
  const workerToken = new Client({ url: server.url, token: tokens.worker });
  await assert.rejects(workerToken.enqueue('x'), Forbidden);
  for (const c of [producer, admin, workerToken]) c.close();
});

test('worker.run() rejects naming 401 for an unknown token, 403 for a producer token', async () => {
  for (const [token, Class, status] of [[UNKNOWN_TOKEN, Unauthorized, '401'], [tokens.producer, Forbidden, '403']]) {
    const { worker, logger } = newWorker({ token, queues: [uniqueQueue()] });
    worker.handle('x', () => null);
    await assert.rejects(worker.run(), (e) => {
      assert.ok(e instanceof Class, `${e}`);
      assert.match(e.message, new RegExp(`answered ${status}`));
      return true;
    });
    assert.ok(logger.lines.some((l) => l.startsWith('error:') && l.includes(status)));
  }
});

test('a worker token runs jobs', async () => {
  const queue = uniqueQueue();
  const admin = new Client({ url: server.url, token: tokens.admin });
  const { worker } = newWorker({ token: tokens.worker, queues: [queue], logger: null });
  worker.handle('ok', (job) => ({ echo: job.payload }));
  const running = worker.run();
  const id = await admin.enqueue('ok', { auth: true }, { queue });
  const done = await waitState(id, 'completed', { client: admin });
  assert.deepEqual(done.result, { echo: { auth: true } });
  await worker.close();
  await running;
  admin.close();
});
