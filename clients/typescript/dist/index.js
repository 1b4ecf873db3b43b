export { Client, flowFinished } from './client.js';
export { Steps, chain, group, step, waitStep, flowBody } from './flows.js';
export { Worker, errorClass, LeaseLostError, JobTimeoutError, ShutdownError } from './worker.js';
export { ConveyorError, Unauthorized, Forbidden, NotFound, InvalidRequest, Conflict, LeaseLost, QueueFull, ServerError, ConnectionError, Retry, RetryAfter, Permanent, } from './errors.js';
export { VERSION } from './http.js';
