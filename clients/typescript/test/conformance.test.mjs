// The conformance worker as a process: `ready`, SIGTERM drain with exit 0, 401/403 exit 1.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { Client } from '../dist/index.js';
import { PACKAGE_DIR, startServer, eventually, waitForLine, uniqueQueue } from './helpers.mjs';

const SCRIPT = path.join(PACKAGE_DIR, 'conformance/worker.mjs');
let server;
let client;
before(async () => {
  server = await startServer({ auth: true });
  client = new Client({ url: server.url, token: await server.token('admin') });
});
after(async () => {
  client?.close();
  await server?.stop();
});

function spawnWorker(env) {
  const child = spawn(process.execPath, [SCRIPT], {
    env: { ...process.env, CONVEYOR_URL: server.url, CONVEYOR_CONCURRENCY: '2', CONVEYOR_GRACE_SECS: '1', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr.on('data', (d) => (stderr += d));
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal, stderr })));
  after(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  });
  return { child, exited, stderr: () => stderr };
}

async function waitState(id, state) {
  return eventually(async () => {
    const job = await client.get(id);
    return job.state === state ? job : null;
  }, { what: `job ${id} ${state}` });
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
  const { code, signal, stderr } = await w.exited;
  assert.equal(code, 0, `exit ${code} ${signal}; stderr:\n${stderr}`);
  assert.ok(Date.now() - began < 5_000);
  assert.equal((await client.get(short)).state, 'completed');
  const released = await client.get(long);
  assert.equal(released.state, 'available');
  assert.equal(released.attempt, 0);
});

test('the conformance worker exits 1 naming 401 or 403 when its token is refused', async () => {
  const bad = `cv_${'0'.repeat(32)}_${'0'.repeat(64)}`;
  for (const [token, status] of [[bad, '401'], [await server.token('producer'), '403']]) {
    const w = spawnWorker({ CONVEYOR_TOKEN: token, CONVEYOR_QUEUES: uniqueQueue() });
    const { code, stderr } = await w.exited;
    assert.equal(code, 1, stderr);
    assert.match(stderr, new RegExp(status));
  }
});
