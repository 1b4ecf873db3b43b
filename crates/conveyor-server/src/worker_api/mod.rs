//! The worker API: two protocols over the same rules. `lease` serves a job at a time
//! (`/v1/jobs/{id}/heartbeat`, `complete`, `fail`, ...) and the fetch long-poll; `acks` the
//! batched reports (`/v1/ack`, `/v1/heartbeat`, and those a fetch carries); `reports` holds
//! what both check. The arrows point one way: `lease` -> `acks` -> `reports`.

pub(crate) mod acks;
pub(crate) mod lease;
mod reports;
