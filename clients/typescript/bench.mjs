#!/usr/bin/env node
// Benchmarks the TypeScript client against `conveyor serve`, printing one JSON line per workload
// (fields as `conveyor bench --json`, plus `client`, `transport` and `prefetch`).
//
//   node bench.mjs [--url URL [--token T]] [--jobs 20000] [--concurrency 10]
//                  [--workload enqueue,drain,latency] [--batch 1000] [--prefetch N]
//                  [--bin PATH] [--durability durable|relaxed]
//
// Without --url it starts `conveyor serve` itself (--bin, else $CONVEYOR_BIN, else the repo's
// target/release/conveyor, else target/debug/conveyor) on a fresh SQLite store in a temp dir,
// deleted afterwards.
//   enqueue: `enqueueMany` batches of --batch from 4 concurrent producers.
//   drain:   --jobs no-op jobs enqueued first, then drained by a Worker at --concurrency; timed
//            until every completion is acknowledged (the worker's close() flushed).
//   latency: enqueue -> handler start on an idle queue, one job at a time (at most 2,000).

import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { Client, Worker } from './dist/index.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '../..');

function parseArgs(argv) {
  const args = { jobs: 20_000, concurrency: 10, workload: 'enqueue,drain', batch: 1000, durability: 'durable' };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--json') continue; // always JSON lines
    if (arg === '-h' || arg === '--help') {
      process.stdout.write(
        'node bench.mjs [--url URL [--token T]] [--jobs N] [--concurrency N] [--workload enqueue,drain,latency]\n' +
          '               [--batch N] [--prefetch N] [--bin PATH] [--durability durable|relaxed]\n',
      );
      process.exit(0);
    }
    const m = /^--([a-z-]+)(?:=(.*))?$/.exec(arg);
    if (!m) throw new Error(`unexpected argument ${arg}`);
    const value = m[2] ?? argv[++i];
    if (value === undefined) throw new Error(`${arg} needs a value`);
    args[m[1]] = value;
  }
  for (const key of ['jobs', 'concurrency', 'batch']) {
    args[key] = Number(args[key]);
    if (!Number.isInteger(args[key]) || args[key] < 1) throw new Error(`--${key} must be an integer >= 1`);
  }
  if (args.prefetch !== undefined && args.prefetch !== 'auto') args.prefetch = Number(args.prefetch);
  args.workload = String(args.workload).split(',').map((w) => w.trim()).filter(Boolean);
  for (const w of args.workload) if (!['enqueue', 'drain', 'latency'].includes(w)) throw new Error(`unknown workload ${w}`);
  return args;
}

async function startServer(args) {
  const bin =
    args.bin ??
    process.env.CONVEYOR_BIN ??
    [path.join(repo, 'target/release/conveyor'), path.join(repo, 'target/debug/conveyor')].find((p) => existsSync(p));
  if (!bin || !existsSync(bin)) throw new Error('no conveyor binary: pass --url, --bin or set CONVEYOR_BIN');
  const dir = mkdtempSync(path.join(tmpdir(), 'conveyor-ts-bench-'));
  const store = `sqlite://${path.join(dir, 'bench.db')}`;
  const child = spawn(bin, ['serve', '--listen', '127.0.0.1:0', '--store', store, '--durability', args.durability], {
    stdio: ['ignore', 'pipe', 'ignore'],
    env: { ...process.env, CONVEYOR_LOG: 'warn' },
  });
  const exited = new Promise((resolve) => child.on('exit', resolve));
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      await exited;
    }
    rmSync(dir, { recursive: true, force: true });
  };
  process.on('exit', () => child.exitCode === null && child.kill('SIGKILL'));
  const url = await new Promise((resolve, reject) => {
    const rl = createInterface({ input: child.stdout });
    rl.on('line', (line) => {
      const m = /listening on (http:\/\/\S+)/.exec(line);
      if (m) resolve(m[1]);
    });
    child.on('exit', (code) => reject(new Error(`conveyor serve exited ${code} before listening`)));
  });
  return { url, stop, bin };
}

const queueName = (workload) => `bench-${workload}-${Math.random().toString(36).slice(2, 12)}`;
const jobsOf = (queue, from, to) => Array.from({ length: to - from }, (_, i) => ({ kind: 'bench.noop', payload: { n: from + i }, queue }));

async function enqueueAll(client, queue, jobs, batch) {
  const producers = Math.min(4, Math.ceil(jobs / batch));
  await Promise.all(
    Array.from({ length: producers }, async (_, p) => {
      for (let n = p * batch; n < jobs; n += producers * batch) {
        await client.enqueueMany(jobsOf(queue, n, Math.min(n + batch, jobs)));
      }
    }),
  );
}

async function completedIn(client, queue) {
  const { body } = await client.transport.request('GET', '/v1/queues');
  return body.queues.filter((q) => q.name === queue).reduce((sum, q) => sum + q.completed, 0);
}

function workerFor(args, url, queue, handler) {
  const options = { url, token: args.token, queues: [queue], concurrency: args.concurrency, handleSignals: false, logger: null };
  if (args.prefetch !== undefined) options.prefetch = args.prefetch;
  return new Worker(options).handle('bench.noop', handler);
}

async function drain(args, url, client, queue) {
  await enqueueAll(client, queue, args.jobs, args.batch);
  let handled = 0;
  let allHandled;
  const done = new Promise((resolve) => (allHandled = resolve));
  const worker = workerFor(args, url, queue, () => {
    if (++handled === args.jobs) allHandled();
    return null;
  });
  const started = performance.now();
  const running = worker.run();
  await done;
  await worker.close();
  await running;
  const seconds = (performance.now() - started) / 1000;
  const completed = await completedIn(client, queue);
  if (completed !== args.jobs) throw new Error(`drain finished with ${completed} of ${args.jobs} jobs completed`);
  return { seconds, worker };
}

async function latency(args, url, client, queue) {
  const samples = Math.min(args.jobs, 2000);
  let onStart;
  const worker = workerFor(args, url, queue, () => {
    onStart?.(performance.now());
    return null;
  });
  const running = worker.run();
  await new Promise((r) => setTimeout(r, 300)); // let the worker reach its idle long-poll
  const latencies = [];
  const begin = performance.now();
  for (let n = 0; n < samples; n++) {
    const started = new Promise((resolve) => (onStart = resolve));
    const sent = performance.now();
    const id = await client.enqueue('bench.noop', { n }, { queue });
    const began = await started;
    latencies.push(began - sent);
    // Idle means idle: this job's completion commits before the next enqueue.
    while ((await client.get(id)).state !== 'completed') await new Promise((r) => setImmediate(r));
  }
  const seconds = (performance.now() - begin) / 1000;
  await worker.close();
  await running;
  latencies.sort((a, b) => a - b);
  const pick = (q) => latencies[Math.round((latencies.length - 1) * q)];
  return { samples, seconds, p50: pick(0.5), p99: pick(0.99), worker };
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const server = args.url ? null : await startServer(args);
  const url = args.url ?? server.url;
  const client = new Client({ url, token: args.token });
  try {
    for (const workload of args.workload) {
      const queue = queueName(workload);
      const line = {
        workload,
        client: 'typescript',
        transport: 'http: node:http keep-alive, batched acks on fetch',
        store: server ? 'sqlite://(temp file)' : url,
        durable: server ? args.durability === 'durable' : null,
        durability: server
          ? args.durability === 'durable'
            ? 'sqlite: fsync before every acknowledgement'
            : 'sqlite relaxed: no fsync per commit'
          : `the server at ${url}`,
        jobs: args.jobs,
        concurrency: args.concurrency,
        tenants: 0,
        concurrency_limit: null,
        per_key_concurrency_limit: null,
        rate_limit: null,
      };
      if (workload === 'enqueue') {
        const started = performance.now();
        await enqueueAll(client, queue, args.jobs, args.batch);
        const seconds = (performance.now() - started) / 1000;
        Object.assign(line, { batch: args.batch, seconds: round(seconds), jobs_per_s: Math.round(args.jobs / seconds) });
      } else if (workload === 'drain') {
        const { seconds, worker } = await drain(args, url, client, queue);
        Object.assign(line, { prefetch: worker.prefetch, seconds: round(seconds), jobs_per_s: Math.round(args.jobs / seconds) });
      } else {
        const { samples, seconds, p50, p99, worker } = await latency(args, url, client, queue);
        Object.assign(line, {
          jobs: samples,
          prefetch: worker.prefetch,
          seconds: round(seconds),
          jobs_per_s: Math.round(samples / seconds),
          p50_ms: round(p50),
          p99_ms: round(p99),
        });
      }
      process.stdout.write(`${JSON.stringify(line)}\n`);
    }
  } finally {
    client.close();
    await server?.stop();
  }
}

function round(x) {
  return Math.round(x * 1000) / 1000;
}

main().catch((err) => {
  process.stderr.write(`bench: ${err?.stack ?? err}\n`);
  process.exit(1);
});
