// A Conveyor worker in Node: `node worker.mjs` (Ctrl-C or SIGTERM drains and exits).
// CONVEYOR_URL (default http://127.0.0.1:7700) and, with access control on, CONVEYOR_TOKEN
// (`conveyor token create --role worker`).
import { setTimeout as sleep } from 'node:timers/promises';
import { Worker, Retry, RetryAfter, Permanent } from 'conveyor-client';

const worker = new Worker({
  url: process.env.CONVEYOR_URL ?? 'http://127.0.0.1:7700',
  token: process.env.CONVEYOR_TOKEN,
  queues: ['mail', 'default'],
  concurrency: 10,
});

// The return value is stored as the job's result.
worker.handle('send_welcome_email', async (job) => {
  const { user_id: userId } = job.payload;
  if (userId === undefined) throw new Permanent('payload has no user_id'); // dead, no retries
  if (userId === 7 && job.attempt === 1) throw new RetryAfter(2, 'mail server busy'); // again in 2 s
  await sleep(50, undefined, { signal: job.signal }); // job.signal aborts on shutdown/lease loss
  console.log(`sent welcome email to user ${userId} (attempt ${job.attempt})`);
  return { sent: true, user_id: userId };
});

worker.handle('flaky', async (job) => {
  if (job.attempt < 2) throw new Retry(`attempt ${job.attempt} failed, trying again`); // backoff
  return { ok: true };
});

// Any other thrown error retries with its class (here TypeError) and stack recorded.
worker.handle('broken', async () => null.boom);

await worker.run(); // until Ctrl-C / SIGTERM: stops fetching, finishes running jobs, releases the rest
console.log('worker stopped');
