// Enqueues a few jobs and waits for the first to finish: `node enqueue.mjs`.
import { Client, QueueFull } from 'conveyor-client';

const client = new Client({
  url: process.env.CONVEYOR_URL ?? 'http://127.0.0.1:7700',
  token: process.env.CONVEYOR_TOKEN, // `conveyor token create --role producer` with access control on
});

const first = await client.enqueue('send_welcome_email', { user_id: 42 }, {
  queue: 'mail',
  maxAttempts: 5,
  idempotencyKey: `welcome-42-${new Date().toISOString().slice(0, 10)}`, // once a day at most
});
const later = await client.enqueue('send_welcome_email', { user_id: 7 }, { queue: 'mail', delay: 5 }); // in 5 s
const batch = await client.enqueueMany([
  { kind: 'flaky', payload: {} },
  { kind: 'broken', payload: {}, maxAttempts: 2 },
  { kind: 'send_welcome_email', payload: {}, queue: 'mail' }, // no user_id: Permanent, dead at once
]);
console.log('enqueued', [first, later, ...batch]);

try {
  await client.enqueue('send_welcome_email', { user_id: 1 }, { queue: 'mail' });
} catch (err) {
  if (err instanceof QueueFull) console.log(`queue full, retry in ${err.retryAfter} s`);
  else throw err;
}

for (;;) {
  const job = await client.get(first);
  if (['completed', 'dead', 'cancelled'].includes(job.state)) {
    console.log(`job ${first}: ${job.state}`, job.result);
    break;
  }
  await new Promise((resolve) => setTimeout(resolve, 200));
}
client.close();
