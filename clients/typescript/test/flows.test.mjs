// Workflows against a real server: building steps, a chain run by the Worker (results handed on
// in `parents`, progress reported), durable waits completed by `signal`, waitFlow, cancel,
// list, and refused flows.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  Steps,
  chain,
  group,
  step,
  waitStep,
  flowBody,
  flowFinished,
  InvalidRequest,
  NotFound,
  Conflict,
} from '../dist/index.js';
import { client, useServer, newWorker, waitState, eventually, uniqueName, uniqueQueue } from './helpers.mjs';

useServer();

const flowName = () => uniqueName('flow');
const byName = (flow, name) => flow.steps.find((s) => s.name === name);

test('chain and group fill in after; flowBody maps names to the wire', () => {
  const steps = chain([
    step('fetch', 'fetch_page', { url: 'u' }, { queue: 'web', timeoutMs: 5000 }),
    group([step('thumbs', 'thumbnails'), step('text', 'extract_text', undefined, { onParentFailure: 'skip' })]),
    waitStep('review', 'approved', { timeoutMs: 60_000 }),
    step('publish', 'publish_page', undefined, { compensate: 'unpublish' }),
  ]);
  assert.ok(steps instanceof Steps);
  assert.deepEqual([steps.heads, steps.tails], [['fetch'], ['publish']]);
  const body = flowBody(steps, { name: 'n', onFailure: 'compensate', idempotencyKey: 'key', tags: ['t'] });
  assert.deepEqual(body, {
    name: 'n',
    on_failure: 'compensate',
    idempotency_key: 'key',
    tags: ['t'],
    steps: [
      { name: 'fetch', job: { kind: 'fetch_page', payload: { url: 'u' }, queue: 'web', timeout_ms: 5000 } },
      { name: 'thumbs', job: { kind: 'thumbnails' }, after: ['fetch'] },
      { name: 'text', job: { kind: 'extract_text' }, on_parent_failure: 'skip', after: ['fetch'] },
      { name: 'review', wait: { signal: 'approved', timeout_ms: 60_000 }, after: ['thumbs', 'text'] },
      { name: 'publish', job: { kind: 'publish_page' }, compensate: { kind: 'unpublish' }, after: ['review'] },
    ],
  });

  const fanIn = group([step('a', 'k'), [step('b', 'k'), step('c', 'k')]]).then(step('d', 'k', undefined, { after: ['x'] }));
  assert.deepEqual([...fanIn].map((s) => s.name), ['a', 'b', 'c', 'd']);
  assert.deepEqual(fanIn.steps[3].after, ['x', 'a', 'b', 'c']);
  assert.equal(fanIn.steps[0].after, undefined);

  // A whole body in wire names passes through.
  assert.deepEqual(
    flowBody({ steps: [{ name: 'a', job: { kind: 'k', delay_ms: 5 } }], on_failure: 'stop' }),
    { steps: [{ name: 'a', job: { kind: 'k', delay_ms: 5 } }], on_failure: 'stop' },
  );
  assert.throws(() => chain([]), RangeError);
  assert.throws(() => flowBody({ name: 'a', job: { kind: 'k' } }), TypeError);
  assert.equal(flowFinished({ state: 'compensating' }), false);
  assert.equal(flowFinished({ state: 'compensated' }), true);
});

test('a chain run by the Worker: step 2 reads step 1 from parents and reports progress; waitFlow answers it completed', async () => {
  const queue = uniqueQueue();
  const { worker } = newWorker({ queues: [queue], concurrency: 2, waitMs: 1_000 });
  const seen = {};
  worker
    .handle('extract', async (job) => {
      seen.extract = job;
      await job.progress(30, 'reading');
      return { rows: job.payload.rows };
    })
    .handle('load', async (job) => {
      seen.load = job;
      const rows = job.parents.extract.rows;
      await job.progress(50, 'halfway');
      seen.during = byName(await client.getFlow(job.flowId), 'load');
      return { loaded: rows };
    })
    .handle('plain', async (job) => {
      seen.plain = job;
      await job.progress(100);
      return 'ok';
    });
  const name = flowName();
  const created = await client.createFlow(
    chain([step('extract', 'extract', { rows: 3 }, { queue }), step('load', 'load', undefined, { queue })]),
    { name, tags: ['etl'] },
  );
  assert.equal(created.duplicate, false);
  assert.deepEqual(Object.keys(created.steps).sort(), ['extract', 'load']);
  const plainId = await client.enqueue('plain', null, { queue });

  const running = worker.run();
  try {
    const flow = await client.waitFlow(created.id, { timeoutMs: 30_000 });
    await waitState(plainId, 'completed');

    assert.equal(flow.id, created.id);
    assert.equal(flow.name, name);
    assert.equal(flow.state, 'completed');
    assert.ok(flowFinished(flow));
    assert.ok(flow.tags.includes('etl'));
    assert.ok(flow.finished_at);
    assert.deepEqual(flow.steps.map((s) => s.name), ['extract', 'load']);
    const extract = byName(flow, 'extract');
    const load = byName(flow, 'load');
    assert.deepEqual(extract.result, { rows: 3 });
    assert.deepEqual(load.result, { loaded: 3 });
    assert.deepEqual(load.after, ['extract']);
    assert.equal(load.job_id, created.steps.load);
    assert.equal(load.kind, 'load');
    assert.equal(flow.step_counts.completed, 2);
    assert.equal(extract.progress.percent, 30);

    const job = seen.load;
    assert.equal(job.id, created.steps.load);
    assert.equal(job.flowId, created.id);
    assert.equal(job.step, 'load');
    assert.deepEqual(job.parents, { extract: { rows: 3 } });
    assert.deepEqual(seen.extract.parents, {});
    assert.equal(seen.extract.step, 'extract');
    assert.equal(seen.during.state, 'active');
    assert.equal(seen.during.progress.percent, 50);
    assert.equal(seen.during.progress.message, 'halfway');
    assert.ok(seen.during.progress.at);

    assert.equal(seen.plain.flowId, null);
    assert.equal(seen.plain.step, null);
    assert.deepEqual(seen.plain.parents, {});
    await assert.rejects(seen.plain.progress(101), RangeError);
  } finally {
    await worker.close();
    await running;
  }
});

test('a wait step completes with a signal', async () => {
  const queue = uniqueQueue();
  const { worker } = newWorker({ queues: [queue], waitMs: 1_000 });
  worker.handle('publish', async (job) => ({ approvedBy: job.parents.approval.by }));
  const created = await client.createFlow(
    [waitStep('approval', 'approved', { timeoutMs: 60_000 }), step('publish', 'publish', undefined, { queue, after: ['approval'] })],
    { name: flowName() },
  );
  assert.deepEqual(Object.keys(created.steps), ['publish'], 'a wait has no job');
  const waiting = await eventually(async () => {
    const flow = await client.getFlow(created.id);
    return byName(flow, 'approval').state === 'waiting' ? flow : null;
  }, { what: 'the wait step waiting' });
  assert.equal(waiting.state, 'running');
  assert.deepEqual(byName(waiting, 'approval').wait, { signal: 'approved', timeout_ms: 60_000 });
  assert.ok(byName(waiting, 'approval').wait_deadline);

  await assert.rejects(client.signal(created.id, 'rejected'), (e) => e instanceof InvalidRequest && e.field === 'signal');

  const running = worker.run();
  try {
    assert.equal(await client.signal(created.id, 'approved', { by: 'ana' }), 'delivered');
    const flow = await client.waitFlow(created.id, { timeoutMs: 30_000 });
    assert.equal(flow.state, 'completed');
    assert.deepEqual(byName(flow, 'approval').result, { by: 'ana' });
    assert.deepEqual(byName(flow, 'publish').result, { approvedBy: 'ana' });
  } finally {
    await worker.close();
    await running;
  }
  await assert.rejects(client.signal(created.id, 'approved', { by: 'bob' }), (e) => e instanceof Conflict && e.status === 409);
});

test('a signal before the wait begins is stored; cancelFlow cancels once', async () => {
  const queue = uniqueQueue();
  const created = await client.createFlow(chain([step('first', 'nobody_runs_this', undefined, { queue }), waitStep('w', 'later')]));
  assert.equal(await client.signal(created.id, 'later', 1), 'stored');
  const cancelled = await client.cancelFlow(created.id);
  assert.equal(cancelled.state, 'cancelled');
  assert.deepEqual([...new Set(cancelled.steps.map((s) => s.state))], ['cancelled']);
  await assert.rejects(client.cancelFlow(created.id), (e) => e instanceof Conflict && e.status === 409);
  const started = Date.now();
  assert.equal((await client.waitFlow(created.id, { timeoutMs: 30_000 })).state, 'cancelled');
  assert.ok(Date.now() - started < 5_000);
});

test('waitFlow answers a running flow as it is when the timeout passes', async () => {
  const created = await client.createFlow([step('idle', 'nobody_runs_this', undefined, { queue: uniqueQueue() })]);
  const started = Date.now();
  const flow = await client.waitFlow(created.id, { timeoutMs: 300 });
  assert.equal(flow.state, 'running');
  assert.ok(Date.now() - started >= 300, `gave up after ${Date.now() - started} ms`);
  await assert.rejects(client.waitFlow(created.id, { timeoutMs: -1 }), TypeError);
  await client.cancelFlow(created.id);
});

test('refused flows name the field; an unknown flow is NotFound', async () => {
  await assert.rejects(
    client.createFlow([step('a', 'k'), step('b', 'k', undefined, { after: ['ghost'] })]),
    (e) => e instanceof InvalidRequest && e.status === 400 && e.field === 'steps[1].after[0]',
  );
  await assert.rejects(
    client.createFlow([step('a', 'k'), step('a', 'k')]),
    (e) => e instanceof InvalidRequest && e.field === 'steps[1].name',
  );
  await assert.rejects(client.getFlow('00000000-0000-0000-0000-000000000000'), NotFound);
});

test('idempotency key and listFlows', async () => {
  const queue = uniqueQueue();
  const name = flowName();
  const idempotencyKey = `key-${queue}`;
  const first = await client.createFlow([step('a', 'nobody_runs_this', undefined, { queue })], { name, idempotencyKey });
  const again = await client.createFlow({ steps: [step('a', 'nobody_runs_this', undefined, { queue })], name, idempotencyKey });
  assert.equal(again.duplicate, true);
  assert.equal(again.id, first.id);
  assert.deepEqual(again.steps, first.steps);
  const page = await client.listFlows({ name, state: 'running', limit: 10 });
  assert.deepEqual(page.flows.map((f) => f.id), [first.id]);
  assert.equal(page.next, null);
  assert.deepEqual(page.flows[0].steps, []);
  await client.cancelFlow(first.id);
  assert.deepEqual((await client.listFlows({ name, state: 'running' })).flows, []);
  assert.deepEqual((await client.listFlows({ name, state: 'cancelled' })).flows.map((f) => f.id), [first.id]);
  await assert.rejects(client.listFlows({ state: 'sleeping' }), (e) => e instanceof InvalidRequest && e.field === 'state');
});

test('a kind schema refuses payloads naming the place, and is refused over queued jobs unless forced', async () => {
  const kind = uniqueName('signup');
  const schema = { type: 'object', required: ['user_id'], properties: { user_id: { type: 'integer' } } };
  const stored = await client.setSchema(kind, schema, { version: 3 });
  assert.deepEqual(stored.schema, schema);
  assert.equal(stored.version, 3);
  assert.equal((await client.getSchema(kind)).kind, kind);
  assert.ok((await client.listSchemas()).some((k) => k.kind === kind));
  await assert.rejects(client.enqueue(kind, { user_id: 'seven' }), (e) => e instanceof InvalidRequest && e.field === 'payload/user_id');
  await client.enqueue(kind, { user_id: 7 });
  const stricter = { type: 'object', properties: { user_id: { type: 'integer', minimum: 100 } } };
  await assert.rejects(client.setSchema(kind, stricter), (e) => e instanceof Conflict);
  await client.setSchema(kind, stricter, { force: true });
  await client.deleteSchema(kind);
  await assert.rejects(client.getSchema(kind), (e) => e instanceof NotFound);
});
