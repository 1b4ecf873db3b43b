// The conformance worker as a process: `ready`, SIGTERM drain with exit 0, 401/403 exit 1.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { PACKAGE_DIR, server, client, useServer, runNode, waitState, waitForLine, uniqueQueue, UNKNOWN_TOKEN } from './helpers.mjs';

const SCRIPT = path.join(PACKAGE_DIR, 'conformance/worker.mjs');
useServer({ auth: true, token: 'admin' });

function spawnWorker(env) {
  return runNode(SCRIPT, { env: { CONVEYOR_URL: server.url, CONVEYOR_CONCURRENCY: '2', CONVEYOR_GRACE_SECS: '1', ...env } });
}

test('the conformance worker runs jobs and exits 0 after a SIGTERM drain', async () => {
  const queue = uniqueQueue();
  const w = spawnWorker({ CONVEYOR_TOKEN: await server.token('worker'), CONVEYOR_QUEUES: `${queue},other`, CONVEYOR_LEASE_MS: '1000' });
  await waitForLine(w.child.stdout, /^ready$/, 10_000, 'conformance worker');
  const ok = await client.enqueue('ok', { n: 1 }, { queue });
  assert.deepEqual((await waitState(ok, 'completed')).result, { echo: { n: 1 } });
  const crash = await client.enqueue('crash', { message: 'kaboom' }, { queue, maxAttempts: 1 });
  const dead = await waitState(crash, 'dead');
  assert.equal(dead.errors[0].class, 'Error');
  assert.match(dead.errors[0].message, /kaboom/);
  const short = await client.enqueue('slow', { ms: 300 }, { queue });
  const long = await client.enqueue('slow', { ms: 30_000 }, { queue });
  await waitState(short, 'running');
  await waitState(long, 'running');
  const began = Date.now();
  w.child.kill('SIGTERM');
  const { code, signal } = await w.exited;
  assert.equal(code, 0, `exit ${code} ${signal}; stderr:\n${w.stderr()}`);
  assert.ok(Date.now() - began < 5_000);
  assert.equal((await client.get(short)).state, 'completed');
  const released = await client.get(long);
  assert.equal(released.state, 'available');
  assert.equal(released.attempt, 0);
});

test('the conformance worker exits 1 naming 401 or 403 when its token is refused', async () => {
  for (const [token, status] of [[UNKNOWN_TOKEN, '401'], [await server.token('producer'), '403']]) {
    const w = spawnWorker({ CONVEYOR_TOKEN: token, CONVEYOR_QUEUES: uniqueQueue() });
    const { code } = await w.exited;
    assert.equal(code, 1, w.stderr());
    assert.match(w.stderr(), new RegExp(status));
  }
});
