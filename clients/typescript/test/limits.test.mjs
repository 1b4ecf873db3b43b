// Named limits (admin calls) against a real server: defining one, enqueueing with `limits`
// (alone and in a batch), the job's `limit_keys` and `blocked_by`, the list/get/delete round
// trip, and the server's errors.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Conflict, InvalidRequest, NotFound } from '../dist/index.js';
import { server, client, useServer, uniqueName, uniqueQueue } from './helpers.mjs';

useServer();

const names = async () => (await client.listLimits()).map((l) => l.name);

test('a job naming a limit holds its key and waits for room', async () => {
  const queue = uniqueQueue('lim');
  const name = uniqueName('per-tenant');
  const stored = await client.putLimit(name, { concurrency: 1, key: 'tenant' });
  assert.equal(stored.name, name);
  assert.equal(stored.concurrency, 1);
  assert.equal(stored.key, 'tenant');
  assert.equal(stored.rate, undefined);
  assert.ok(stored.updated_at);

  const first = await client.enqueue('sync', { n: 1 }, { queue, tenant: 'acme', limits: [name] });
  const second = await client.enqueue('sync', { n: 2 }, { queue, tenant: 'acme', limits: [name] });
  const other = await client.enqueue('sync', { n: 3 }, { queue, tenant: 'globex', limits: [name] });
  const plain = await client.enqueue('sync', { n: 4 }, { queue });
  const job = await client.get(first);
  assert.deepEqual(job.limit_keys, [`${name}:acme`]);
  assert.equal(job.blocked_by, undefined);
  assert.equal((await client.get(plain)).limit_keys, undefined);

  // One acme job at a time: the second waits, and says why; globex has room of its own.
  const claimed = (await server.fetchJobs(queue)).map((j) => j.id);
  assert.equal(claimed.length, 3);
  assert.ok(claimed.includes(other) && claimed.includes(plain));
  const held = [first, second].filter((id) => !claimed.includes(id));
  assert.equal(held.length, 1, `one of the two acme jobs is claimed: ${claimed}`);
  const waiting = await client.get(held[0]);
  assert.equal(waiting.state, 'available');
  assert.deepEqual(waiting.blocked_by, [{ limit: name, key: 'acme', running: 1, recent_starts: 0, concurrency: 1 }]);

  const view = await client.getLimit(name);
  assert.equal(view.in_use, 2);
  assert.deepEqual(view.usage, [
    { key: 'acme', running: 1, recent_starts: 0 },
    { key: 'globex', running: 1, recent_starts: 0 },
  ]);
});

test('enqueueMany passes the limits of each job', async () => {
  const queue = uniqueQueue('batch');
  const name = uniqueName('vendor');
  await client.putLimit(name, { concurrency: 100, rate: { count: 600, period_ms: 60_000 } });
  const ids = await client.enqueueMany([
    { kind: 'call', queue, limits: [name] },
    { kind: 'call', queue },
  ]);
  // A limit without `key`: every job shares one budget, keyed by the empty value.
  assert.deepEqual((await client.get(ids[0])).limit_keys, [`${name}:`]);
  assert.equal((await client.get(ids[1])).limit_keys, undefined);
});

test('an undefined limit rejects with InvalidRequest naming its place', async () => {
  const queue = uniqueQueue('bad');
  const name = uniqueName('known');
  await client.putLimit(name, { concurrency: 5 });
  await assert.rejects(client.enqueue('sync', {}, { queue, limits: [uniqueName('missing'), name] }), (e) => {
    assert.ok(e instanceof InvalidRequest, String(e));
    assert.equal(e.status, 400);
    assert.equal(e.field, 'limits[0]');
    return true;
  });
  await assert.rejects(
    client.enqueue('sync', {}, { queue, limits: [name, uniqueName('missing')] }),
    (e) => e instanceof InvalidRequest && e.field === 'limits[1]',
  );
  await assert.rejects(client.enqueueMany([{ kind: 'sync', queue }, { kind: 'sync', queue, limits: ['no-such-limit'] }]), (e) => {
    assert.ok(e instanceof InvalidRequest, String(e));
    // The place within the job; the server may or may not prefix the batch index.
    assert.ok(['jobs[1].limits[0]', 'limits[0]'].includes(e.field), e.field);
    return true;
  });
  assert.deepEqual(await server.fetchJobs(queue), []); // nothing of the refused batch was stored
  await assert.rejects(client.enqueue('sync', {}, { queue, limits: name }), TypeError);
});

test('list, get and delete round trip', async () => {
  const queue = uniqueQueue('round');
  const name = uniqueName('round');
  const created = await client.putLimit(name, { concurrency: 3, key: 'payload.customer.id', weights: { acme: 3 } });
  assert.deepEqual(created.weights, { acme: 3 });
  const replaced = await client.putLimit(name, { rate: { count: 10, period_ms: 1000 } });
  assert.deepEqual(replaced.rate, { count: 10, period_ms: 1000 });
  assert.equal(replaced.concurrency, undefined); // replaced whole
  assert.equal(replaced.key, undefined);

  const listed = (await client.listLimits()).find((l) => l.name === name);
  assert.deepEqual(listed.rate, { count: 10, period_ms: 1000 });
  const view = await client.getLimit(name);
  assert.deepEqual([view.name, view.in_use, view.usage], [name, 0, []]);

  // Named by a queue's settings, it cannot be deleted.
  await server.api('PUT', `/v1/queues/${queue}`, { limits: [name] });
  await assert.rejects(client.deleteLimit(name), (e) => {
    assert.ok(e instanceof Conflict, String(e));
    assert.equal(e.status, 409);
    assert.equal(e.code, 'limit_in_use');
    return true;
  });
  assert.ok((await names()).includes(name));

  await server.api('PUT', `/v1/queues/${queue}`, { limits: null });
  assert.equal(await client.deleteLimit(name), undefined);
  assert.ok(!(await names()).includes(name));
  await assert.rejects(client.getLimit(name), NotFound);
  await assert.rejects(client.deleteLimit(name), NotFound);
});

test('bad limits reject with InvalidRequest naming the field', async () => {
  const name = uniqueName('bad');
  await assert.rejects(
    client.putLimit(name, { rate: { count: 1, period_ms: 0 } }),
    (e) => e instanceof InvalidRequest && e.field === 'rate.period_ms',
  );
  await assert.rejects(client.putLimit(name, { concurrency: 1, key: 'payload' }), (e) => e instanceof InvalidRequest && e.field === 'key');
  await assert.rejects(client.putLimit('a:b', { concurrency: 1 }), (e) => e instanceof InvalidRequest && e.field === 'name');
  assert.ok(!(await names()).includes(name));
  await assert.rejects(client.putLimit(name), TypeError);
  await assert.rejects(client.putLimit(name, null), TypeError);
  await assert.rejects(client.getLimit(''), TypeError);
});
