export { Client } from './client.js';
export type { ClientOptions, EnqueueOptions, ErrorRecord, JobSpec, JobState, JobView, UniqueOptions } from './client.js';
export { Worker, errorClass, LeaseLostError, JobTimeoutError, ShutdownError } from './worker.js';
export type { Handler, Job, Logger, WorkerOptions } from './worker.js';
export { ConveyorError, Unauthorized, Forbidden, NotFound, InvalidRequest, Conflict, LeaseLost, QueueFull, ServerError, ConnectionError, Retry, RetryAfter, Permanent, } from './errors.js';
export type { ErrorBody, OutcomeOptions } from './errors.js';
export { VERSION } from './http.js';
