// Test harness: a real `conveyor serve` per test file, on a fresh SQLite store in a temp dir.
// A test file calls `useServer()` once, then uses `server` and `client` from here.
import { before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFile } from 'node:child_process';
import { mkdtempSync, rmSync, createWriteStream, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createInterface } from 'node:readline';
import { Client, Worker } from '../dist/index.js';

const here = path.dirname(fileURLToPath(import.meta.url));
export const PACKAGE_DIR = path.resolve(here, '..');
export const REPO = path.resolve(here, '../../..');
export const BIN = process.env.CONVEYOR_BIN || path.join(REPO, 'target/debug/conveyor');

// Servers still running when this test process ends (a failed start, a killed test run) are
// killed with it.
const children = new Set();
const dirs = new Set();
function killChildren() {
  for (const child of children) {
    try {
      process.kill(child.pid, 'SIGKILL');
    } catch {}
  }
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
}
process.on('exit', killChildren);
for (const signal of ['SIGTERM', 'SIGINT', 'SIGHUP']) {
  process.once(signal, () => {
    killChildren();
    process.kill(process.pid, signal);
  });
}

/** A new temporary directory, removed when this test process ends (if not before). */
export function tempDir(prefix = 'conveyor-ts-') {
  const dir = mkdtempSync(path.join(tmpdir(), prefix));
  dirs.add(dir);
  return dir;
}

/**
 * Resolves with the first line of `stream` matching `re` (its match), or rejects after `ms`.
 * The stream keeps flowing afterwards (other 'data' listeners still see everything).
 */
export function waitForLine(stream, re, ms, what) {
  return new Promise((resolve, reject) => {
    const rl = createInterface({ input: stream });
    let done = false;
    const finish = (fn, value) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      fn(value);
      rl.close();
      stream.resume(); // keep the pipe flowing (closing the reader paused it)
    };
    const timer = setTimeout(() => finish(reject, new Error(`${what}: no line matching ${re} within ${ms} ms`)), ms);
    rl.on('line', (line) => {
      const m = re.exec(line);
      if (m) finish(resolve, m);
    });
    rl.on('close', () => finish(reject, new Error(`${what}: output ended before a line matching ${re}`)));
  });
}

export class Server {
  constructor({ auth = false, extraArgs = [] } = {}) {
    if (!existsSync(BIN)) throw new Error(`conveyor binary not found at ${BIN}: build it (cargo build -p conveyor) or set CONVEYOR_BIN`);
    this.auth = auth;
    this.extraArgs = extraArgs;
    this.dir = tempDir();
    this.storeUrl = `sqlite://${path.join(this.dir, 'jobs.db')}`;
    this.listen = '127.0.0.1:0';
    this.proc = null;
    this.url = null;
  }

  async start() {
    const args = ['serve', '--listen', this.listen, '--store', this.storeUrl, '--maintenance-interval-ms', '200'];
    if (this.auth) args.push('--auth');
    args.push(...this.extraArgs);
    const log = createWriteStream(path.join(this.dir, 'server.log'), { flags: 'a' });
    const proc = spawn(BIN, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    children.add(proc);
    proc.on('exit', () => children.delete(proc));
    proc.stderr.pipe(log);
    this.proc = proc;
    this.exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
    let url;
    try {
      [, url] = await waitForLine(proc.stdout, /conveyor listening on (https?:\/\/\S+)/, 20_000, 'conveyor serve');
    } catch (e) {
      proc.kill('SIGKILL');
      throw e;
    }
    this.url = url;
    this.listen = new URL(url).host; // a restart listens on the same port
    return this;
  }

  /** Stops the server (SIGTERM, then SIGKILL after 5 s). */
  async kill(signal = 'SIGTERM') {
    const proc = this.proc;
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    proc.kill(signal);
    const timer = setTimeout(() => proc.kill('SIGKILL'), 5_000);
    await this.exited;
    clearTimeout(timer);
  }

  async restart() {
    await this.kill();
    for (let i = 0; ; i++) {
      try {
        return await this.start();
      } catch (e) {
        if (i >= 20) throw e; // the port may take a moment to be free again
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  }

  async stop() {
    await this.kill();
    rmSync(this.dir, { recursive: true, force: true });
    dirs.delete(this.dir);
  }

  /** A new API token's secret (`conveyor token create --role ROLE`). */
  token(role) {
    return new Promise((resolve, reject) => {
      execFile(BIN, ['token', 'create', '--role', role, '--store', this.storeUrl], (err, stdout, stderr) => {
        if (err) return reject(new Error(`token create: ${err.message}\n${stderr}`));
        const secret = stdout.trim().split('\n').pop();
        if (!secret?.startsWith('cv_')) return reject(new Error(`token create printed ${stdout}`));
        resolve(secret);
      });
    });
  }

  /** Raw JSON request (for checks the client has no method for). */
  async api(method, pathName, body, token) {
    const headers = { 'content-type': 'application/json' };
    if (token) headers.authorization = `Bearer ${token}`;
    const res = await fetch(this.url + pathName, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const text = await res.text();
    return { status: res.status, body: text ? JSON.parse(text) : null };
  }

  /** Claims up to `max` jobs of `queue` as a worker would (`POST /v1/fetch`): their leases. */
  async fetchJobs(queue, { max = 10, waitMs = 0 } = {}) {
    const res = await this.api('POST', '/v1/fetch', { worker_id: 'ts-test', queues: [queue], max, wait_ms: waitMs });
    assert.equal(res.status, 200, JSON.stringify(res.body));
    return res.body.jobs;
  }
}

export async function startServer(options) {
  const server = new Server(options);
  try {
    return await server.start();
  } catch (e) {
    await server.stop();
    throw e;
  }
}

/** The test file's server and a `Client` of it: set by `useServer()` before the file's tests. */
export let server;
export let client;

/**
 * Starts the test file's server before its tests (`startServer(options)`) and stops it after
 * them. `token` is a role: the client then sends a new token of it. With `skip` set, nothing
 * starts (the file's tests are skipped). Returns a promise of the moment both are set: node:test
 * starts the file's `before` hooks as they are declared, without waiting for one another, so a
 * hook of the file's that needs `server` awaits it first.
 */
export function useServer({ token, skip = false, ...options } = {}) {
  let started;
  const ready = new Promise((resolve, reject) => (started = { resolve, reject }));
  ready.catch(() => {}); // the hook reports the failure
  before(async () => {
    try {
      if (!skip) {
        server = await startServer(options);
        client = new Client({ url: server.url, token: token ? await server.token(token) : undefined });
      }
      started.resolve();
    } catch (e) {
      started.reject(e);
      throw e;
    }
  });
  after(async () => {
    client?.close();
    await server?.stop();
  });
  return ready;
}

/** A Worker of `server` with no signal handlers, logging to a `memoryLogger()` unless given one. */
export function newWorker({ logger = memoryLogger(), ...options } = {}) {
  const worker = new Worker({ url: server.url, handleSignals: false, logger, ...options });
  return { worker, logger };
}

/** Polls the job (through `client`, or the one given) until it is in `state`; the job then. */
export function waitState(id, state, { ms = 15_000, client: through = client } = {}) {
  return eventually(async () => {
    const job = await through.get(id);
    return job.state === state ? job : null;
  }, { ms, what: `job ${id} ${state}` });
}

/**
 * `node script` as a child process, SIGKILLed at the end of the current test if still running.
 * Its output is kept (`output()` both streams, `stderr()` the one); `exited` resolves with
 * `{ code, signal }` once it has ended and its output is all read.
 */
export function runNode(script, { cwd, env = {} } = {}) {
  const child = spawn(process.execPath, [script], { cwd, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  children.add(child);
  let output = '';
  let stderr = '';
  child.stdout.on('data', (d) => (output += d));
  child.stderr.on('data', (d) => {
    output += d;
    stderr += d;
  });
  const exited = new Promise((resolve) => child.on('close', (code, signal) => resolve({ code, signal })));
  child.on('exit', () => children.delete(child));
  after(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  });
  return { child, exited, output: () => output, stderr: () => stderr };
}

/** Polls `check` (async, returns truthy when done) every 20 ms until it passes or `ms` is over. */
export async function eventually(check, { ms = 10_000, what = 'condition' } = {}) {
  const end = Date.now() + ms;
  let last;
  for (;;) {
    try {
      const v = await check();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > end) throw new Error(`${what} did not happen within ${ms} ms${last ? `: ${last.message}` : ''}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** A logger that keeps lines, for assertions. */
export function memoryLogger() {
  const lines = [];
  const push = (level) => (m) => lines.push(`${level}: ${m}`);
  return { lines, info: push('info'), warn: push('warn'), error: push('error') };
}

/** A name no other test uses (for a queue, a kind, a flow). */
export function uniqueName(prefix) {
  return `${prefix}-${Math.random().toString(36).slice(2, 10)}`;
}

export function uniqueQueue(prefix = 'q') {
  return uniqueName(prefix);
}

/** A well-formed API token no server knows. */
export const UNKNOWN_TOKEN = `cv_${'0'.repeat(32)}_${'0'.repeat(64)}`;
