//! Event sources for `conveyor serve`: brokers read by a consumer, each message a durable job
//! before it is acknowledged at the broker (see `conveyor_core::sources` for the configuration
//! and the mapping, and [`ingest`] for the rule every broker follows).
//!
//! - [`ingest`]: the loop (read a batch, one commit, then acknowledge) and a source's status.
//! - [`supervisor`]: the sources a server runs, as the cluster's stored configuration says.
//! - one module per broker, each behind its cargo feature (all on by default): `redis_stream`
//!   (Redis Streams), `amqp` (RabbitMQ), `nats` (NATS JetStream), `mqtt`, `sqs`, `kafka`.

#[cfg(feature = "amqp")]
mod amqp;
pub mod ingest;
#[cfg(feature = "kafka")]
mod kafka;
#[cfg(feature = "mqtt")]
mod mqtt;
#[cfg(feature = "nats")]
mod nats;
pub mod publish;
#[cfg(feature = "redis_stream")]
mod redis_stream;
#[cfg(feature = "sqs")]
mod sqs;
pub mod supervisor;

pub use ingest::{Broker, BrokerError, SourceState, SourceStatus};
pub use supervisor::Sources;

use conveyor_core::sources::{BrokerSpec, SourceSpec};
use conveyor_core::Store;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Runs `status`'s source until `shutdown`, reconnecting to its broker with backoff.
pub async fn run(status: Arc<SourceStatus>, store: Arc<dyn Store>, shutdown: CancellationToken) {
    let spec = status.spec.clone();
    ingest::run(status, store, || connect(spec.clone()), shutdown).await;
}

/// Connects to `spec`'s broker, ready to read (making the consumer group, durable consumer or
/// session where the broker needs one).
pub async fn connect(spec: SourceSpec) -> Result<Box<dyn Broker>, BrokerError> {
    match &spec.broker {
        #[cfg(feature = "redis_stream")]
        BrokerSpec::RedisStream { .. } => Ok(Box::new(redis_stream::connect(&spec).await?)),
        #[cfg(feature = "amqp")]
        BrokerSpec::Amqp { .. } => amqp::connect(&spec).await,
        #[cfg(feature = "nats")]
        BrokerSpec::Nats { .. } => nats::connect(&spec).await,
        #[cfg(feature = "mqtt")]
        BrokerSpec::Mqtt { .. } => mqtt::connect(&spec).await,
        #[cfg(feature = "sqs")]
        BrokerSpec::Sqs { .. } => sqs::connect(&spec).await,
        #[cfg(feature = "kafka")]
        BrokerSpec::Kafka { .. } => kafka::connect(&spec).await,
        #[allow(unreachable_patterns)]
        other => Err(BrokerError(format!(
            "this build has no {0} sources (cargo feature {0})",
            other.type_name()
        ))),
    }
}
