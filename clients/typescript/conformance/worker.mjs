#!/usr/bin/env node
// The TypeScript client's worker for the shared protocol conformance suite
// (crates/conveyor/tests/client_conformance.rs). Environment:
//   CONVEYOR_URL (required), CONVEYOR_TOKEN, CONVEYOR_QUEUES (comma-separated, default
//   "default"), CONVEYOR_CONCURRENCY (default 10), CONVEYOR_GRACE_SECS (default 25),
//   CONVEYOR_LEASE_MS (default 30000).
// Prints `ready` once running; exits 0 after a SIGTERM/SIGINT drain; exits 1 with a message
// naming the status when the server refuses the token (401, 403).

import { Worker, Retry, RetryAfter, Permanent } from '../dist/index.js';

function env(name, fallback) {
  const value = process.env[name];
  return value === undefined || value === '' ? fallback : value;
}

function number(name, fallback) {
  const raw = env(name, undefined);
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (!Number.isFinite(value) || value < 0) {
    process.stderr.write(`conformance worker: ${name}=${raw} is not a number\n`);
    process.exit(2);
  }
  return value;
}

const url = env('CONVEYOR_URL', undefined);
if (!url) {
  process.stderr.write('conformance worker: CONVEYOR_URL is required\n');
  process.exit(2);
}

const worker = new Worker({
  url,
  token: env('CONVEYOR_TOKEN', null),
  queues: env('CONVEYOR_QUEUES', 'default').split(',').map((q) => q.trim()).filter(Boolean),
  concurrency: Math.max(1, Math.floor(number('CONVEYOR_CONCURRENCY', 10))),
  graceMs: Math.round(number('CONVEYOR_GRACE_SECS', 25) * 1000),
  leaseMs: Math.round(number('CONVEYOR_LEASE_MS', 30_000)),
});

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal.addEventListener('abort', onAbort, { once: true });
  });
}

worker
  .handle('ok', async (job) => ({ echo: job.payload }))
  .handle('retry_twice', async (job) => {
    if (job.attempt < 3) throw new Retry(`attempt ${job.attempt}: not yet`);
    return { attempt: job.attempt };
  })
  .handle('retry_after', async (job) => {
    if (job.attempt === 1) throw new RetryAfter(0.5, 'come back in half a second');
    return { attempt: job.attempt };
  })
  .handle('permanent', async (job) => {
    throw new Permanent(job.payload?.message ?? 'nope');
  })
  .handle('crash', async (job) => {
    throw new Error(job.payload?.message ?? 'boom');
  })
  .handle('slow', async (job) => {
    const ms = Number(job.payload?.ms ?? 0);
    await sleep(ms, job.signal);
    return { slept: ms };
  })
  // Returns the wall-clock instant it returned: the suite compares it with the job's finish
  // time at the server, which is when the acknowledgement was applied.
  .handle('stamp', async () => ({ returned_at_ms: Date.now() }));

const running = worker.run();
process.stdout.write('ready\n');
try {
  await running;
  process.exit(0);
} catch (err) {
  process.stderr.write(`conformance worker: ${err?.message ?? err}\n`);
  process.exit(1);
}
