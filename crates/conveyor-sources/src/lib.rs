//! Event sources for `conveyor serve`: brokers read by a consumer, each message a durable job
//! before it is acknowledged at the broker (see `conveyor_core::sources` for the configuration
//! and the mapping, and [`ingest`] for the rule every broker follows).
//!
//! - [`ingest`]: the loop (read a batch, one commit, then acknowledge) and a source's status.
//! - `redis_stream`: Redis Streams (feature `redis_stream`).

pub mod ingest;
#[cfg(feature = "redis_stream")]
mod redis_stream;

pub use ingest::{Broker, BrokerError, SourceState, SourceStatus};

use conveyor_core::sources::{BrokerSpec, SourceSpec};
use conveyor_core::Store;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Runs `status`'s source until `shutdown`, reconnecting to its broker with backoff.
pub async fn run(status: Arc<SourceStatus>, store: Arc<dyn Store>, shutdown: CancellationToken) {
    let spec = status.spec.clone();
    ingest::run(status, store, || connect(spec.clone()), shutdown).await;
}

async fn connect(spec: SourceSpec) -> Result<Box<dyn Broker>, BrokerError> {
    match &spec.broker {
        #[cfg(feature = "redis_stream")]
        BrokerSpec::RedisStream { .. } => Ok(Box::new(redis_stream::connect(&spec).await?)),
        #[cfg(not(feature = "redis_stream"))]
        other => Err(BrokerError(format!(
            "this build has no {} sources (feature {0})",
            other.type_name()
        ))),
    }
}
