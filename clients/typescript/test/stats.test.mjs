// History (`stats()`) against a real server: jobs enqueued, taken and finished through it show
// up per kind, filters narrow it, bad input is a clear error naming the field.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { InvalidRequest } from '../dist/index.js';
import { server, client, useServer, uniqueQueue } from './helpers.mjs';

useServer();

async function work(queue, fail) {
  const jobs = await server.fetchJobs(queue);
  assert.ok(jobs.length > 0, 'a job to take');
  for (const job of jobs) {
    const answer = fail
      ? await server.api('POST', `/v1/jobs/${job.id}/fail`, { lease_token: job.lease_token, error: { message: 'no' }, retry: 'never' })
      : await server.api('POST', `/v1/jobs/${job.id}/complete`, { lease_token: job.lease_token });
    assert.equal(answer.status, 200);
  }
}

test('finished jobs show in the history per kind', async () => {
  const queue = uniqueQueue();
  for (let i = 0; i < 3; i += 1) await client.enqueue('ts.ok', {}, { queue });
  await work(queue, false);
  await client.enqueue('ts.bad', {}, { queue });
  await work(queue, true);

  const report = await client.stats({ from: new Date(Date.now() - 10 * 60_000), step: '1m', queue });
  assert.equal(report.step_s, 60);
  assert.equal(report.totals.completed, 3);
  assert.equal(report.totals.dead, 1);
  const kinds = Object.fromEntries(report.kinds.map((k) => [k.kind, k]));
  assert.deepEqual(Object.keys(kinds).sort(), ['ts.bad', 'ts.ok']);
  assert.equal(kinds['ts.bad'].failure_rate, 1);
  assert.equal(kinds['ts.ok'].run_time.count, 3, 'one run time per completed attempt');
  assert.equal(kinds['ts.ok'].queue_wait.count, 3, 'one wait per attempt handed out');
  const only = await client.stats({ queue, kind: 'ts.ok', step: 300 });
  assert.equal(only.totals.completed, 3);
  assert.equal(only.totals.failed, 0);

  await assert.rejects(client.stats({ step: 90 }), (error) => error instanceof InvalidRequest && error.field === 'step');
});
