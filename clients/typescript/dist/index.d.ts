export { Client, flowFinished } from './client.js';
export type { BatchOptions, BatchSettings, BlockedBy, BreakerScope, BreakerSettings, BreakerState, BreakerTarget, BreakerView, ClientOptions, CloseCircuitOptions, CreatedFlow, DebounceMode, DebounceOptions, EnqueueOptions, ErrorRecord, FlowPage, FlowView, JobSpec, JobSequence, JobState, JobView, KeyUsage, KindSettings, KindStats, Latency, Limit, LimitRate, LimitSettings, LimitView, ListFlowsOptions, OpenCircuitOptions, Progress, SequenceBlockedBy, SequenceOnDead, SequenceOptions, SequenceSettings, SignalOutcome, StatsOptions, StatsPoint, StatsReport, SentEvent, StepView, ThrottleOptions, UniqueOptions, } from './client.js';
export { Steps, chain, group, step, waitStep, flowBody } from './flows.js';
export type { FlowFailurePolicy, FlowOptions, FlowSpec, FlowState, FlowStep, JobStep, ParentFailurePolicy, StepLike, StepOptions, StepState, WaitStep, } from './flows.js';
export { Worker, errorClass, LeaseLostError, JobTimeoutError, ShutdownError } from './worker.js';
export type { BatchHandler, BatchOutcome, BatchResult, Handler, Job, Logger, WorkerOptions } from './worker.js';
export { ConveyorError, Unauthorized, Forbidden, NotFound, InvalidRequest, Conflict, LeaseLost, QueueFull, ServerError, ConnectionError, Retry, RetryAfter, Permanent, } from './errors.js';
export type { ErrorBody, OutcomeOptions } from './errors.js';
export { VERSION } from './http.js';
