import http from 'node:http';
export declare const VERSION = "0.1.0";
export interface TransportOptions {
    url: string;
    token?: string | null | undefined;
    /** Per-request timeout in milliseconds (default 60 000). */
    timeoutMs?: number | undefined;
    /** An http(s).Agent of your own; by default one keep-alive agent per Client/Worker. */
    agent?: http.Agent | undefined;
}
export interface RequestOptions {
    timeoutMs?: number;
    signal?: AbortSignal;
}
export interface Response<T> {
    status: number;
    body: T;
}
export declare class Transport {
    readonly baseUrl: URL;
    private readonly basePath;
    private readonly token;
    private readonly timeoutMs;
    private readonly agent;
    private readonly ownAgent;
    private readonly mod;
    constructor(options: TransportOptions);
    /** Closes idle keep-alive connections (only those of an agent this transport created). */
    close(): void;
    /** Sends one request; resolves with a 2xx answer's JSON, rejects with a ConveyorError. */
    request<T>(method: string, path: string, body?: unknown, options?: RequestOptions): Promise<Response<T>>;
    private once;
}
/** `encodeURIComponent` for a path segment. */
export declare function seg(value: string): string;
