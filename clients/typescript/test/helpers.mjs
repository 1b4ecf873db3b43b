// Test harness: a real `conveyor serve` per test file, on a fresh SQLite store in a temp dir.
import { spawn, execFile } from 'node:child_process';
import { mkdtempSync, rmSync, createWriteStream, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createInterface } from 'node:readline';

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
    this.dir = mkdtempSync(path.join(tmpdir(), 'conveyor-ts-'));
    dirs.add(this.dir);
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

export function uniqueQueue(prefix = 'q') {
  return `${prefix}-${Math.random().toString(36).slice(2, 10)}`;
}
