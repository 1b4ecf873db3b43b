// examples/node-worker runs as its README says: `npm install`, `node worker.mjs`, `node enqueue.mjs`.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { REPO, server, useServer, runNode, waitForLine } from './helpers.mjs';

const EXAMPLE = path.join(REPO, 'examples/node-worker');
useServer();
before(() => {
  if (!existsSync(path.join(EXAMPLE, 'node_modules/conveyor-client'))) {
    // Only links the local package: nothing is downloaded.
    execFileSync('npm', ['install', '--offline', '--no-audit', '--no-fund', '--loglevel=error'], { cwd: EXAMPLE, stdio: 'ignore' });
  }
});

function run(script) {
  return runNode(script, { cwd: EXAMPLE, env: { CONVEYOR_URL: server.url } });
}

test('the example worker runs what the example producer enqueues, and stops on SIGTERM', async () => {
  const worker = run('worker.mjs');
  await waitForLine(worker.child.stderr, /running kinds/, 10_000, 'example worker');
  const producer = run('enqueue.mjs');
  assert.equal((await producer.exited).code, 0, producer.output());
  assert.match(producer.output(), /: completed \{ sent: true, user_id: 42 \}/);
  worker.child.kill('SIGTERM');
  assert.equal((await worker.exited).code, 0, worker.output());
  assert.match(worker.output(), /sent welcome email to user 42/);
  assert.match(worker.output(), /worker stopped/);
});
