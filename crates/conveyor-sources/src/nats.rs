//! Not built yet: connecting fails with a clear error.

use conveyor_core::sources::SourceSpec;

use crate::ingest::{Broker, BrokerError};

pub(crate) async fn connect(spec: &SourceSpec) -> Result<Box<dyn Broker>, BrokerError> {
    Err(BrokerError(format!(
        "{} sources are not built yet",
        spec.broker.type_name()
    )))
}
