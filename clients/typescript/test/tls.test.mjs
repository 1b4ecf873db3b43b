// HTTPS: `conveyor serve --tls-cert --tls-key --tls-client-ca` with certificates the test makes
// (the `openssl` command). The client and the worker trust the server's CA and present a client
// certificate through an https.Agent of their own (`agent`); without an accepted certificate,
// or over plain HTTP, they are refused.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import https from 'node:https';
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Client, ConnectionError } from '../dist/index.js';
import { server, useServer, newWorker, waitState, tempDir, uniqueQueue } from './helpers.mjs';

// Where there is no openssl command, the tests are skipped (the Rust TLS tests still run).
let skip = false;
try {
  execFileSync('openssl', ['version'], { stdio: 'ignore' });
} catch {
  skip = 'no openssl command to make test certificates';
}

const dir = tempDir('conveyor-ts-tls-');
const file = (name) => path.join(dir, name);

function makeCerts() {
  const openssl = (...args) => execFileSync('openssl', args, { stdio: ['ignore', 'ignore', 'pipe'] });
  const key = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];
  const ca = (name) =>
    openssl('req', '-x509', ...key, '-keyout', file(`${name}.key`), '-out', file(`${name}.crt`), '-days', '2',
      '-subj', `/CN=${name}`, '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign');
  const leaf = (name, issuer, extensions) => {
    writeFileSync(file(`${name}.ext`), extensions);
    openssl('req', ...key, '-keyout', file(`${name}.key`), '-out', file(`${name}.csr`), '-subj', `/CN=${name}`);
    openssl('x509', '-req', '-in', file(`${name}.csr`), '-CA', file(`${issuer}.crt`), '-CAkey', file(`${issuer}.key`),
      '-CAcreateserial', '-days', '2', '-out', file(`${name}.crt`), '-extfile', file(`${name}.ext`));
  };
  ca('server-ca');
  ca('clients-ca');
  ca('other-ca');
  leaf('server', 'server-ca', 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n');
  leaf('client', 'clients-ca', 'extendedKeyUsage=clientAuth\n');
  leaf('intruder', 'other-ca', 'extendedKeyUsage=clientAuth\n');
}

/** A keep-alive https.Agent trusting the server's CA, presenting `identity`'s certificate. */
function agent(identity = 'client') {
  const options = { keepAlive: true, ca: readFileSync(file('server-ca.crt')) };
  if (identity) {
    options.cert = readFileSync(file(`${identity}.crt`));
    options.key = readFileSync(file(`${identity}.key`));
  }
  return new https.Agent(options);
}

// Made now rather than in a `before` hook: node:test does not wait for one `before` hook before
// starting the next, and the server's must find them.
if (!skip) makeCerts();
useServer({
  skip,
  extraArgs: ['--tls-cert', file('server.crt'), '--tls-key', file('server.key'), '--tls-client-ca', file('clients-ca.crt')],
});

test('a client with an accepted certificate enqueues and reads over https', { skip }, async () => {
  assert.match(server.url, /^https:\/\//);
  const client = new Client({ url: server.url, agent: agent() });
  const id = await client.enqueue('tls.ping', { n: 1 }, { queue: uniqueQueue() });
  const job = await client.get(id);
  assert.equal(job.id, id);
  assert.deepEqual(job.payload, { n: 1 });
  client.close();
});

test('no client certificate, one from another CA, an untrusted server or plain HTTP: refused', { skip }, async () => {
  const cases = [
    ['no client certificate', { url: server.url, agent: agent(null) }],
    ['a certificate from another CA', { url: server.url, agent: agent('intruder') }],
    ['the server CA not trusted', { url: server.url }],
    ['plain HTTP', { url: server.url.replace('https://', 'http://') }],
  ];
  for (const [what, options] of cases) {
    const client = new Client(options);
    await assert.rejects(client.enqueue('tls.ping', {}, { queue: uniqueQueue() }), (e) => e instanceof ConnectionError, what);
    client.close();
  }
});

test('a worker runs jobs over https with a client certificate', { skip }, async () => {
  const queue = uniqueQueue();
  const client = new Client({ url: server.url, agent: agent() });
  const { worker } = newWorker({ agent: agent(), queues: [queue] });
  worker.handle('tls.work', async (job) => ({ doubled: job.payload.n * 2 }));
  const id = await client.enqueue('tls.work', { n: 21 }, { queue });
  const running = worker.run();
  const job = await waitState(id, 'completed', { client });
  assert.deepEqual(job.result, { doubled: 42 });
  await worker.close();
  await running;
  client.close();
});
