// Sequences against a real server: enqueueing with `sequence` (a key expression or an object,
// alone and in a batch), the `blocked` state and each job's `sequence`, one job of a key handed
// out at a time in enqueue order, `blocked_by` naming the sequence, a queue's and a kind's
// `sequence` settings, and the server's errors.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { InvalidRequest } from '../dist/index.js';
import { server, client, useServer, uniqueName, uniqueQueue } from './helpers.mjs';

useServer();

async function complete(leased) {
  const res = await server.api('POST', `/v1/jobs/${leased.id}/complete`, { lease_token: leased.lease_token });
  assert.equal(res.status, 200, JSON.stringify(res.body));
}

test('jobs of one key run one after another in enqueue order', async () => {
  const queue = uniqueQueue('seq');
  const acme = uniqueName('acme');
  const globex = uniqueName('globex');
  const first = await client.enqueue('sync', { account: acme, n: 1 }, { queue, sequence: 'payload.account' });
  const second = await client.enqueue('sync', { account: acme, n: 2 }, { queue, sequence: 'payload.account' });
  // Priority does not reorder a sequence.
  const third = await client.enqueue('sync', { account: acme, n: 3 }, { queue, priority: 10, sequence: 'payload.account' });
  const other = await client.enqueue('sync', { account: globex }, { queue, sequence: 'payload.account' });
  const plain = await client.enqueue('sync', { n: 5 }, { queue });

  const key = `payload.account=${acme}`;
  const jobs = await Promise.all([first, second, third].map((id) => client.get(id)));
  assert.deepEqual(jobs.map((j) => j.state), ['available', 'blocked', 'blocked']);
  assert.deepEqual(jobs.map((j) => j.sequence), [1, 2, 3].map((no) => ({ key, no, on_dead: 'block' })));
  assert.equal(jobs[0].blocked_by, undefined);
  const otherJob = await client.get(other);
  assert.equal(otherJob.state, 'available');
  assert.deepEqual(otherJob.sequence, { key: `payload.account=${globex}`, no: 1, on_dead: 'block' });
  assert.equal((await client.get(plain)).sequence, undefined);

  // Only the first of the key is handed out; the other key runs alongside.
  const leased = Object.fromEntries((await server.fetchJobs(queue)).map((j) => [j.id, j]));
  assert.deepEqual(Object.keys(leased).sort(), [first, other, plain].sort());
  assert.deepEqual(await server.fetchJobs(queue), []);

  const waiting = await client.get(third);
  assert.equal(waiting.state, 'blocked');
  assert.deepEqual(waiting.blocked_by, [{ sequence: key, no: 3, job: first, state: 'running', holder_no: 1 }]);
  assert.deepEqual((await client.get(second)).blocked_by, [{ sequence: key, no: 2, job: first, state: 'running', holder_no: 1 }]);
  const { body: queues } = await server.api('GET', '/v1/queues');
  assert.equal(queues.queues.find((q) => q.name === queue).blocked, 2);

  // The sequence lists its jobs, and nothing else.
  const { body: listed } = await server.api('GET', `/v1/jobs?sequence=${encodeURIComponent(key)}`);
  assert.deepEqual(listed.jobs.map((j) => j.id).sort(), [first, second, third].sort());

  // Once the first finishes, the second (and only it) becomes fetchable.
  await complete(leased[first]);
  assert.equal((await client.get(second)).state, 'available');
  assert.equal((await client.get(third)).state, 'blocked');
  const next = await server.fetchJobs(queue);
  assert.deepEqual(next.map((j) => j.id), [second]);
  assert.deepEqual((await client.get(third)).blocked_by, [{ sequence: key, no: 3, job: second, state: 'running', holder_no: 2 }]);
  await complete(next[0]);
  const last = await server.fetchJobs(queue);
  assert.deepEqual(last.map((j) => j.id), [third]);
  await complete(last[0]);
  assert.equal((await client.get(third)).state, 'completed');
});

test('the object form (onDead or on_dead) and enqueueMany', async () => {
  const queue = uniqueQueue('obj');
  const tenant = uniqueName('tenant');
  const first = await client.enqueue('sync', {}, { queue, tenant, sequence: { key: 'tenant', onDead: 'skip' } });
  const job = await client.get(first);
  assert.equal(job.state, 'available');
  assert.deepEqual(job.sequence, { key: `tenant=${tenant}`, no: 1, on_dead: 'skip' });

  const ids = await client.enqueueMany([
    { kind: 'sync', queue, tenant, sequence: 'tenant' },
    { kind: 'sync', queue, tenant, sequence: { key: 'tenant', on_dead: 'skip' } },
    { kind: 'sync', queue, tenant: uniqueName('lone'), sequence: { key: 'tenant' } },
  ]);
  const jobs = await Promise.all(ids.map((id) => client.get(id)));
  assert.deepEqual(
    jobs.map((j) => [j.state, j.sequence?.no, j.sequence?.on_dead]),
    [
      ['blocked', 2, 'block'],
      ['blocked', 3, 'skip'],
      ['available', 1, 'block'],
    ],
  );

  // A job without a value at its key is in no sequence.
  const unkeyed = await client.get(await client.enqueue('sync', { other: 1 }, { queue, sequence: 'payload.account' }));
  assert.equal(unkeyed.sequence, undefined);
  assert.equal(unkeyed.state, 'available');
});

test('an invalid sequence rejects with InvalidRequest naming it', async () => {
  const queue = uniqueQueue('bad');
  for (const bad of ['payload.', 'nope', { key: 'tenant', onDead: 'later' }, { onDead: 'skip' }]) {
    await assert.rejects(client.enqueue('sync', { account: 'a' }, { queue, sequence: bad }), (e) => {
      assert.ok(e instanceof InvalidRequest, `${JSON.stringify(bad)}: ${e}`);
      assert.equal(e.status, 400);
      assert.equal(e.field, 'sequence', JSON.stringify(bad));
      return true;
    });
  }
  await assert.rejects(client.enqueueMany([{ kind: 'sync', queue }, { kind: 'sync', queue, sequence: 'payload.' }]), (e) => {
    assert.ok(e instanceof InvalidRequest, String(e));
    // The place within the job; the server may or may not prefix the batch index.
    assert.ok(['jobs[1].sequence', 'sequence'].includes(e.field), e.field);
    return true;
  });
  assert.deepEqual(await server.fetchJobs(queue), []); // nothing refused was stored
  // Neither a key expression nor an object, or two different on_dead.
  await assert.rejects(client.enqueue('sync', {}, { queue, sequence: ['tenant'] }), TypeError);
  await assert.rejects(client.enqueue('sync', {}, { queue, sequence: null }), TypeError);
  await assert.rejects(client.enqueue('sync', {}, { queue, sequence: { key: 'tenant', onDead: 'skip', on_dead: 'block' } }), TypeError);
});

test("a queue's sequence setting round-trips and applies", async () => {
  const queue = uniqueQueue('setting');
  let res = await server.api('PUT', `/v1/queues/${queue}`, { sequence: 'payload.account' });
  assert.equal(res.status, 200, JSON.stringify(res.body));
  assert.deepEqual(res.body.sequence, { key: 'payload.account', on_dead: 'block' });
  assert.deepEqual((await server.api('GET', `/v1/queues/${queue}`)).body.sequence, { key: 'payload.account', on_dead: 'block' });

  const acme = uniqueName('acme');
  const first = await client.enqueue('sync', { account: acme }, { queue });
  const second = await client.enqueue('sync', { account: acme }, { queue });
  assert.deepEqual((await client.get(first)).sequence, { key: `payload.account=${acme}`, no: 1, on_dead: 'block' });
  assert.equal((await client.get(second)).state, 'blocked');
  // The job's own sequence overrides the queue's.
  const own = await client.enqueue('sync', { account: acme }, { queue, sequence: 'queue' });
  assert.deepEqual((await client.get(own)).sequence, { key: `queue=${queue}`, no: 1, on_dead: 'block' });

  res = await server.api('PUT', `/v1/queues/${queue}`, { sequence: { key: 'tenant', on_dead: 'skip' } });
  assert.deepEqual(res.body.sequence, { key: 'tenant', on_dead: 'skip' });
  res = await server.api('PUT', `/v1/queues/${queue}`, { sequence: 'nope' });
  assert.equal(res.status, 400);
  assert.equal(res.body.error.field, 'sequence');
  res = await server.api('PUT', `/v1/queues/${queue}`, { sequence: null });
  assert.equal(res.status, 200);
  assert.equal(res.body.sequence ?? null, null);
  assert.equal((await server.api('GET', `/v1/queues/${queue}`)).body.sequence ?? null, null);
});

test("a kind's sequence setting is kept by setSchema", async () => {
  const queue = uniqueQueue('kind');
  const kind = uniqueName('seq-kind');
  const res = await server.api('PUT', `/v1/kinds/${kind}`, { sequence: 'payload.account' });
  assert.equal(res.status, 200, JSON.stringify(res.body));
  assert.deepEqual(res.body.sequence, { key: 'payload.account', on_dead: 'block' });
  // A schema set afterwards leaves the kind's sequence as it is.
  const stored = await client.setSchema(kind, { type: 'object' });
  assert.deepEqual(stored.sequence, { key: 'payload.account', on_dead: 'block' });
  assert.deepEqual((await client.getSchema(kind)).sequence, { key: 'payload.account', on_dead: 'block' });

  const acme = uniqueName('acme');
  await client.enqueue(kind, { account: acme }, { queue });
  const blocked = await client.enqueue(kind, { account: acme }, { queue });
  assert.equal((await client.get(blocked)).state, 'blocked');

  await server.api('PUT', `/v1/kinds/${kind}`, { sequence: null });
  assert.equal((await client.getSchema(kind)).sequence, undefined);
  await client.deleteSchema(kind);
});
