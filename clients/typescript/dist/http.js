// The HTTP transport: node:http(s) with a keep-alive agent, JSON in and out.
//
// Why node:http and not the global fetch(): on Node 20, fetch (undici behind WHATWG streams)
// measured about half the request rate of node:http with a keep-alive Agent against
// `conveyor serve` (one connection: ~1,400-2,400 vs ~3,100-3,700 requests/s; ten in
// parallel: ~4,500-5,600 vs ~7,400-10,000), and a worker's throughput is bounded by its
// round trips.
import http from 'node:http';
import https from 'node:https';
import { ConnectionError, ConveyorError, errorFromResponse } from './errors.js';
export const VERSION = '0.1.0';
const USER_AGENT = `conveyor-client-node/${VERSION}`;
const RETRYABLE_SOCKET_CODES = new Set(['ECONNRESET', 'EPIPE', 'ECONNABORTED']);
export class Transport {
    baseUrl;
    basePath;
    token;
    timeoutMs;
    agent;
    ownAgent;
    mod;
    constructor(options) {
        if (!options || typeof options.url !== 'string' || options.url === '') {
            throw new TypeError('conveyor: `url` is required, e.g. http://127.0.0.1:7700');
        }
        this.baseUrl = new URL(options.url);
        if (this.baseUrl.protocol !== 'http:' && this.baseUrl.protocol !== 'https:') {
            throw new TypeError(`conveyor: url must be http:// or https://, got ${options.url}`);
        }
        this.basePath = this.baseUrl.pathname.replace(/\/+$/, '');
        this.token = options.token ?? null;
        this.timeoutMs = options.timeoutMs ?? 60_000;
        this.mod = this.baseUrl.protocol === 'https:' ? https : http;
        this.ownAgent = !options.agent;
        this.agent = options.agent ?? new this.mod.Agent({ keepAlive: true, keepAliveMsecs: 10_000, maxSockets: 256, scheduling: 'lifo' });
    }
    /** Closes idle keep-alive connections (only those of an agent this transport created). */
    close() {
        if (this.ownAgent)
            this.agent.destroy();
    }
    /** Sends one request; resolves with a 2xx answer's JSON, rejects with a ConveyorError. */
    async request(method, path, body, options = {}) {
        const data = body === undefined ? undefined : Buffer.from(JSON.stringify(body), 'utf8');
        // A keep-alive connection the server closed just as we reused it fails before the server
        // read anything: that one case is safe to send again, even for a non-idempotent call.
        for (let attempt = 0;; attempt++) {
            try {
                return await this.once(method, path, data, options);
            }
            catch (e) {
                if (attempt === 0 && e instanceof StaleSocket)
                    continue;
                if (e instanceof StaleSocket)
                    throw e.error;
                throw e;
            }
        }
    }
    once(method, path, data, options) {
        return new Promise((resolve, reject) => {
            const headers = { accept: 'application/json', 'user-agent': USER_AGENT };
            if (data) {
                headers['content-type'] = 'application/json';
                headers['content-length'] = data.length;
            }
            if (this.token)
                headers.authorization = `Bearer ${this.token}`;
            let settled = false;
            let gotResponse = false;
            const fullPath = this.basePath + path;
            const req = this.mod.request({
                protocol: this.baseUrl.protocol,
                hostname: this.baseUrl.hostname.replace(/^\[|\]$/g, ''),
                port: this.baseUrl.port || undefined,
                path: fullPath,
                method,
                headers,
                agent: this.agent,
            }, (res) => {
                gotResponse = true;
                const chunks = [];
                res.on('data', (chunk) => chunks.push(chunk));
                res.on('error', (err) => fail(err));
                res.on('end', () => {
                    if (settled)
                        return;
                    settled = true;
                    cleanup();
                    const status = res.statusCode ?? 0;
                    const text = Buffer.concat(chunks).toString('utf8');
                    let parsed = undefined;
                    if (text.length > 0) {
                        try {
                            parsed = JSON.parse(text);
                        }
                        catch {
                            parsed = text;
                        }
                    }
                    if (status >= 200 && status < 300) {
                        if (typeof parsed === 'string') {
                            reject(new ConveyorError(`${method} ${path} answered ${status} with a body that is not JSON`, status, 'invalid_response'));
                        }
                        else {
                            resolve({ status, body: parsed });
                        }
                    }
                    else {
                        const retryAfter = res.headers['retry-after'];
                        reject(errorFromResponse(method, path, status, parsed, Array.isArray(retryAfter) ? retryAfter[0] : retryAfter));
                    }
                });
            });
            const timeoutMs = options.timeoutMs ?? this.timeoutMs;
            const timer = setTimeout(() => {
                req.destroy(new Error(`no answer within ${timeoutMs} ms`));
            }, timeoutMs);
            const onAbort = () => req.destroy(new Error('aborted'));
            options.signal?.addEventListener('abort', onAbort, { once: true });
            const cleanup = () => {
                clearTimeout(timer);
                options.signal?.removeEventListener('abort', onAbort);
            };
            const fail = (err) => {
                if (settled)
                    return;
                settled = true;
                cleanup();
                const message = `${method} ${path}: cannot reach ${this.baseUrl.origin}: ${err.message}`;
                const wrapped = new ConnectionError(message, 0, 'connection', null, { cause: err });
                if (!gotResponse && req.reusedSocket && err.code && RETRYABLE_SOCKET_CODES.has(err.code)) {
                    reject(new StaleSocket(wrapped));
                }
                else {
                    reject(wrapped);
                }
            };
            req.on('error', fail);
            if (options.signal?.aborted) {
                req.destroy(new Error('aborted'));
                return;
            }
            req.end(data);
        });
    }
}
class StaleSocket extends Error {
    error;
    constructor(error) {
        super(error.message);
        this.error = error;
    }
}
/** `encodeURIComponent` for a path segment. */
export function seg(value) {
    return encodeURIComponent(value);
}
