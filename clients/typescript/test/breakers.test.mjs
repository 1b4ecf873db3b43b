// Circuit breakers (admin calls) against a real server: settings per queue and per kind,
// opening and closing by hand, the list, and the server's errors.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { InvalidRequest } from '../dist/index.js';
import { server, client, useServer, uniqueName, uniqueQueue } from './helpers.mjs';

const DEFAULTS = {
  failure_ratio: 0.5,
  min_calls: 10,
  window_ms: 60_000,
  open_ms: 30_000,
  half_open_calls: 1,
  pause_on_retry_after: false,
};

useServer();

async function listed(scope, name) {
  const found = (await client.listBreakers()).filter((b) => b.scope === scope && b.name === name);
  assert.equal(found.length, 1, JSON.stringify(found));
  return found[0];
}

test('a queue breaker opened by hand hands out nothing until closed', async () => {
  const queue = uniqueQueue('pay');
  const stored = await client.setCircuitBreaker({ queue }, { failure_ratio: 0.25, min_calls: 5 });
  assert.deepEqual(stored, { ...DEFAULTS, failure_ratio: 0.25, min_calls: 5 });
  const ids = [];
  for (let n = 0; n < 3; n++) ids.push(await client.enqueue('charge', { n }, { queue }));

  const opened = await client.openCircuit({ queue }, { reason: 'payments provider down' });
  assert.equal(opened.scope, 'queue');
  assert.equal(opened.name, queue);
  assert.equal(opened.state, 'open');
  assert.equal(opened.manual, true);
  assert.equal(opened.reason, 'payments provider down');
  assert.equal(opened.open_until, null); // until closed by hand
  assert.deepEqual(opened.settings, stored);

  // Nothing is handed out from the queue, even to a fetch that waits; the jobs stay queued.
  assert.deepEqual(await server.fetchJobs(queue, { waitMs: 300 }), []);
  for (const id of ids) assert.equal((await client.get(id)).state, 'available');

  const view = await listed('queue', queue);
  assert.equal(view.state, 'open');
  assert.equal(view.manual, true);
  assert.equal(view.reason, 'payments provider down');
  assert.deepEqual(view.settings, stored);

  const closed = await client.closeCircuit({ queue }, { reason: 'provider back' });
  assert.equal(closed.state, 'closed');
  assert.equal(closed.reason, 'provider back');
  assert.equal((await listed('queue', queue)).state, 'closed');
  assert.deepEqual((await server.fetchJobs(queue)).map((j) => j.id).sort(), [...ids].sort());

  // null removes the breaker; the queue's other settings stay.
  await server.api('PUT', `/v1/queues/${queue}`, { max_depth: 50 });
  assert.equal(await client.setCircuitBreaker({ queue }, null), null);
  const { body } = await server.api('GET', `/v1/queues/${queue}`);
  assert.equal(body.circuit_breaker, null);
  assert.equal(body.max_depth, 50);
});

test('bad settings reject with InvalidRequest naming the field', async () => {
  const queue = uniqueQueue('bad');
  const kind = uniqueName('charge');
  for (const target of [{ queue }, { kind }]) {
    await assert.rejects(client.setCircuitBreaker(target, { failure_ratio: 2 }), (e) => {
      assert.ok(e instanceof InvalidRequest, String(e));
      assert.equal(e.status, 400);
      assert.equal(e.field, 'circuit_breaker.failure_ratio');
      return true;
    });
  }
  await assert.rejects(
    client.setCircuitBreaker({ queue }, { ratio: 0.5 }),
    (e) => e instanceof InvalidRequest && e.field === 'circuit_breaker.ratio',
  );
  await assert.rejects(client.openCircuit({ queue }, { openMs: 0 }), (e) => e instanceof InvalidRequest && e.field === 'open_ms');
});

test('exactly one of queue and kind; settings an object or null', async () => {
  await assert.rejects(client.openCircuit({}), /exactly one/);
  await assert.rejects(client.closeCircuit({ queue: 'a', kind: 'b' }), /exactly one/);
  await assert.rejects(client.setCircuitBreaker(undefined, {}), /exactly one/);
  await assert.rejects(client.setCircuitBreaker({ queue: '' }, {}), TypeError);
  await assert.rejects(client.setCircuitBreaker({ queue: 'a' }), TypeError);
  await assert.rejects(client.setCircuitBreaker({ queue: 'a' }, 0.5), TypeError);
  await assert.rejects(client.openCircuit({ queue: 'a' }, { openMs: '1000' }), TypeError);
});

test("a kind breaker keeps the kind's schema and version, and opens for a while", async () => {
  const queue = uniqueQueue('kind');
  const kind = uniqueName('charge');
  const schema = { type: 'object' };
  await client.setSchema(kind, schema, { version: 3 });
  const stored = await client.setCircuitBreaker({ kind }, { pause_on_retry_after: true });
  assert.deepEqual(stored, { ...DEFAULTS, pause_on_retry_after: true });
  let kept = await client.getSchema(kind);
  assert.deepEqual([kept.schema, kept.version, kept.circuit_breaker], [schema, 3, stored]);

  const id = await client.enqueue(kind, { amount: 5 }, { queue });
  const opened = await client.openCircuit({ kind }, { openMs: 60_000, reason: 'rate limited' });
  assert.deepEqual([opened.scope, opened.state, opened.reason], ['kind', 'open', 'rate limited']);
  assert.ok(opened.open_until, 'open_until is set');
  assert.deepEqual(await server.fetchJobs(queue), []);
  assert.equal((await listed('kind', kind)).state, 'open');
  assert.equal((await client.closeCircuit({ kind })).state, 'closed');
  assert.deepEqual((await server.fetchJobs(queue)).map((j) => j.id), [id]);

  // Removing the breaker keeps the schema too.
  assert.equal(await client.setCircuitBreaker({ kind }, null), null);
  kept = await client.getSchema(kind);
  assert.deepEqual([kept.schema, kept.version, kept.circuit_breaker], [schema, 3, undefined]);

  // A kind without settings: removing its (absent) breaker stores nothing.
  const other = uniqueName('nothing');
  assert.equal(await client.setCircuitBreaker({ kind: other }, null), null);
  assert.ok(!(await client.listSchemas()).some((k) => k.kind === other));
});
