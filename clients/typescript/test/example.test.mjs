// examples/node-worker runs as its README says: `npm install`, `node worker.mjs`, `node enqueue.mjs`.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { REPO, startServer, waitForLine } from './helpers.mjs';

const EXAMPLE = path.join(REPO, 'examples/node-worker');
let server;
before(async () => {
  server = await startServer();
  if (!existsSync(path.join(EXAMPLE, 'node_modules/conveyor-client'))) {
    // Only links the local package: nothing is downloaded.
    execFileSync('npm', ['install', '--offline', '--no-audit', '--no-fund', '--loglevel=error'], { cwd: EXAMPLE, stdio: 'ignore' });
  }
});
after(async () => {
  await server?.stop();
});

function run(script) {
  const child = spawn(process.execPath, [script], {
    cwd: EXAMPLE,
    env: { ...process.env, CONVEYOR_URL: server.url },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (d) => (output += d));
  child.stderr.on('data', (d) => (output += d));
  const exited = new Promise((resolve) => child.on('exit', (code) => resolve(code)));
  after(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  });
  return { child, exited, output: () => output };
}

test('the example worker runs what the example producer enqueues, and stops on SIGTERM', async () => {
  const worker = run('worker.mjs');
  await waitForLine(worker.child.stderr, /running kinds/, 10_000, 'example worker');
  const producer = run('enqueue.mjs');
  assert.equal(await producer.exited, 0, producer.output());
  assert.match(producer.output(), /: completed \{ sent: true, user_id: 42 \}/);
  worker.child.kill('SIGTERM');
  assert.equal(await worker.exited, 0, worker.output());
  assert.match(worker.output(), /sent welcome email to user 42/);
  assert.match(worker.output(), /worker stopped/);
});
