// Debounce and throttle against a real server: a trailing burst folded into one job (its payload
// the last), `debounced_into` in the answers of an enqueue and of a batch, leading mode,
// throttle, the options as sent (camelCase and the server's names), and the server's errors.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { InvalidRequest } from '../dist/index.js';
import { enqueueBody } from '../dist/jobs.js';
import { server, client, useServer, uniqueName, uniqueQueue } from './helpers.mjs';

useServer();

/** The whole answer of `POST /v1/jobs` for what `client.enqueue` would send (it resolves with the id only). */
async function enqueueAnswer(kind, payload, opts) {
  const res = await server.api('POST', '/v1/jobs', enqueueBody(kind, payload, opts));
  assert.ok(res.status === 200 || res.status === 201, JSON.stringify(res.body));
  return res;
}

test('a trailing burst of one key is one job with the last payload', async () => {
  const queue = uniqueQueue('trail');
  const acme = uniqueName('acme');
  const debounce = { key: 'payload.account', delayMs: 60_000 };
  const first = await enqueueAnswer('sync', { account: acme, n: 1 }, { queue, debounce });
  assert.equal(first.status, 201);
  assert.equal(first.body.duplicate, false);
  assert.equal(first.body.debounced_into, undefined);
  assert.equal(first.body.state, 'scheduled');
  const second = await enqueueAnswer('sync', { account: acme, n: 2 }, { queue, debounce });
  const third = await enqueueAnswer('sync', { account: acme, n: 3 }, { queue, debounce: { key: 'payload.account', delay_ms: 60_000 } });
  for (const later of [second, third]) {
    assert.equal(later.status, 200);
    assert.equal(later.body.debounced_into, first.body.id);
    assert.equal(later.body.duplicate, true);
    assert.equal(later.body.id, first.body.id);
  }
  // The answer is the job that stands: the last payload, its run moved.
  assert.deepEqual(third.body.payload, { account: acme, n: 3 });
  assert.ok(Date.parse(third.body.run_at) >= Date.parse(first.body.run_at));

  const job = await client.get(first.body.id);
  assert.deepEqual(job.payload, { account: acme, n: 3 });
  assert.equal(job.state, 'scheduled');
  assert.equal(job.debounced_into, undefined); // only in an enqueue's answer
  const { body: listed } = await server.api('GET', `/v1/jobs?queue=${queue}`);
  assert.deepEqual(listed.jobs.map((j) => j.id), [first.body.id]);

  // enqueue resolves with the id of the job that stands.
  assert.equal(await client.enqueue('sync', { account: acme, n: 4 }, { queue, debounce }), first.body.id);
  // Another key, or no value at the key, is a job of its own.
  const other = await client.enqueue('sync', { account: uniqueName('globex') }, { queue, debounce });
  const plain = await client.enqueue('sync', { n: 6 }, { queue, debounce });
  assert.equal(new Set([first.body.id, other, plain]).size, 3);
  assert.equal((await client.get(plain)).state, 'available');
});

test('maxWaitMs caps how far the run moves', async () => {
  const queue = uniqueQueue('maxwait');
  const acme = uniqueName('acme');
  const debounce = { key: 'payload.account', delayMs: 60_000, maxWaitMs: 5_000 };
  const first = await enqueueAnswer('sync', { account: acme }, { queue, debounce });
  const second = await enqueueAnswer('sync', { account: acme }, { queue, debounce });
  assert.equal(second.body.debounced_into, first.body.id);
  assert.ok(Date.parse(second.body.run_at) <= Date.parse(first.body.created_at) + 5_050, second.body.run_at);
});

test('a batch answers debounced_into per job', async () => {
  const queue = uniqueQueue('batch');
  const acme = uniqueName('acme');
  const jobs = [
    { kind: 'sync', queue, payload: { account: acme, n: 1 }, debounce: { key: 'payload.account', delayMs: 60_000 } },
    { kind: 'sync', queue, payload: { account: acme, n: 2 }, debounce: { key: 'payload.account', delay_ms: 60_000 } },
    { kind: 'sync', queue, payload: { n: 3 } },
  ];
  const res = await server.api('POST', '/v1/jobs/batch', { jobs: jobs.map((j) => enqueueBody(j.kind, j.payload, j)) });
  assert.equal(res.status, 201, JSON.stringify(res.body));
  const [first, , plain] = res.body.ids;
  assert.deepEqual(res.body.ids, [first, first, plain]);
  assert.deepEqual(res.body.duplicates, [false, true, false]);
  assert.deepEqual(res.body.debounced_into, [null, first, null]);
  assert.deepEqual((await client.get(first)).payload, { account: acme, n: 2 });

  // enqueueMany resolves with the ids as answered: a folded one is the job that stands.
  const ids = await client.enqueueMany([
    { kind: 'sync', queue, payload: { account: acme, n: 4 }, debounce: { key: 'payload.account', delayMs: 60_000 } },
    { kind: 'sync', queue, payload: { account: acme, n: 5 }, debounce: { key: 'payload.account', delayMs: 60_000 } },
  ]);
  assert.deepEqual(ids, [first, first]);
  assert.deepEqual((await client.get(first)).payload, { account: acme, n: 5 });

  // Without a folded enqueue, the answer has no debounced_into.
  const none = await server.api('POST', '/v1/jobs/batch', { jobs: [enqueueBody('sync', undefined, { queue })] });
  assert.equal(none.status, 201);
  assert.equal(none.body.debounced_into, undefined);
});

test('leading runs the first and drops the next into it', async () => {
  const queue = uniqueQueue('lead');
  const acme = uniqueName('acme');
  const debounce = { key: 'payload.account', delayMs: 60_000, mode: 'leading' };
  const first = await enqueueAnswer('sync', { account: acme, n: 1 }, { queue, debounce });
  assert.equal(first.body.state, 'available');
  assert.equal(first.body.debounced_into, undefined);
  const second = await enqueueAnswer('sync', { account: acme, n: 2 }, { queue, debounce });
  assert.equal(second.body.debounced_into, first.body.id);
  assert.equal(second.body.duplicate, true);
  assert.deepEqual(second.body.payload, { account: acme, n: 1 }); // dropped: the first stands as it was
  const leased = await server.fetchJobs(queue);
  assert.deepEqual(leased.map((j) => [j.id, j.payload]), [[first.body.id, { account: acme, n: 1 }]]);
});

test('throttle drops a second job within the period', async () => {
  const queue = uniqueQueue('throttle');
  const acme = uniqueName('acme');
  const first = await enqueueAnswer('sync', { account: acme, n: 1 }, { queue, throttle: { key: 'payload.account', periodMs: 60_000 } });
  assert.equal(first.body.state, 'available');
  assert.equal(first.body.debounced_into, undefined);
  const second = await enqueueAnswer('sync', { account: acme, n: 2 }, { queue, throttle: { key: 'payload.account', period_ms: 60_000 } });
  assert.equal(second.body.debounced_into, first.body.id);
  assert.equal(second.body.duplicate, true);
  assert.deepEqual(second.body.payload, { account: acme, n: 1 });
  const throttle = { key: 'payload.account', periodMs: 60_000 };
  assert.equal(await client.enqueue('sync', { account: acme, n: 3 }, { queue, throttle }), first.body.id);
  const other = await client.enqueue('sync', { account: uniqueName('globex') }, { queue, throttle });
  assert.notEqual(other, first.body.id);
  assert.deepEqual((await server.fetchJobs(queue)).map((j) => j.id).sort(), [first.body.id, other].sort());
});

test('the options as sent', () => {
  const body = enqueueBody('k', undefined, {
    debounce: { key: 'tenant', delayMs: 1500, maxWaitMs: 120_000, mode: 'leading' },
    throttle: { key: 'kind', periodMs: 3000 },
  });
  assert.deepEqual(body.debounce, { key: 'tenant', delay_ms: 1500, max_wait_ms: 120_000, mode: 'leading' });
  assert.deepEqual(body.throttle, { key: 'kind', period_ms: 3000 });
  // The server's names go as they are (the same value twice is fine); so do unknown fields.
  assert.deepEqual(enqueueBody('k', undefined, { debounce: { key: 'queue', delay_ms: 7, delayMs: 7, extra: 1 } }).debounce, {
    key: 'queue',
    extra: 1,
    delay_ms: 7,
  });
  assert.throws(() => enqueueBody('k', undefined, { debounce: { key: 'queue', delayMs: 1, delay_ms: 2 } }), TypeError);
  assert.throws(() => enqueueBody('k', undefined, { debounce: { key: 'queue', maxWaitMs: 1, max_wait_ms: 2 } }), TypeError);
  assert.throws(() => enqueueBody('k', undefined, { throttle: { key: 'queue', periodMs: 1, period_ms: 2 } }), TypeError);
  assert.throws(() => enqueueBody('k', undefined, { debounce: 'payload.account' }), TypeError);
  assert.throws(() => enqueueBody('k', undefined, { debounce: null }), TypeError);
  assert.throws(() => enqueueBody('k', undefined, { throttle: [60_000] }), TypeError);
});

test('the server errors name the field', async () => {
  const queue = uniqueQueue('bad');
  const payload = { account: 'a' };
  const inAnHour = new Date(Date.now() + 3_600_000);
  const cases = [
    [{ debounce: { key: 'payload.account', delayMs: 1000 }, throttle: { key: 'payload.account', periodMs: 1000 } }, 'throttle'],
    [{ debounce: { key: 'payload.account', delayMs: 1000 }, unique: true }, 'debounce'],
    [{ throttle: { key: 'payload.account', periodMs: 1000 }, unique: true }, 'throttle'],
    [{ debounce: { key: 'nope', delayMs: 1000 } }, 'debounce.key'],
    [{ throttle: { key: 'payload.', periodMs: 1000 } }, 'throttle.key'],
    [{ debounce: { key: 'payload.account', delayMs: 0 } }, 'debounce.delay_ms'],
    [{ debounce: { key: 'payload.account', delayMs: 10, maxWaitMs: 0 } }, 'debounce.max_wait_ms'],
    [{ throttle: { key: 'payload.account', periodMs: 0 } }, 'throttle.period_ms'],
    [{ debounce: { key: 'payload.account', delayMs: 1000 }, delayMs: 5 }, 'run_at'],
    [{ debounce: { key: 'payload.account', delayMs: 1000 }, runAt: inAnHour }, 'run_at'],
  ];
  for (const [opts, field] of cases) {
    await assert.rejects(client.enqueue('sync', payload, { queue, ...opts }), (e) => {
      assert.ok(e instanceof InvalidRequest, `${JSON.stringify(opts)}: ${e}`);
      assert.equal(e.status, 400);
      assert.equal(e.field, field, JSON.stringify(opts));
      return true;
    });
  }
  await assert.rejects(client.enqueue('sync', payload, { queue, debounce: { key: 'payload.account', delayMs: 1000, later: true } }), (e) => {
    assert.ok(e instanceof InvalidRequest, String(e));
    assert.ok(String(e.field).startsWith('debounce'), e.field);
    return true;
  });
  await assert.rejects(client.enqueueMany([{ kind: 'sync', queue }, { kind: 'sync', queue, debounce: { key: 'nope', delayMs: 1000 } }]), (e) => {
    assert.ok(e instanceof InvalidRequest, String(e));
    assert.ok(['jobs[1].debounce.key', 'debounce.key'].includes(e.field), e.field);
    return true;
  });
  assert.deepEqual(await server.fetchJobs(queue), []); // nothing refused was stored
});
