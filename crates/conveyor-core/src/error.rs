//! Typed errors shared by every store and the layers above them.

use crate::state::JobState;
use uuid::Uuid;

/// A rejected input, naming the field at fault so HTTP and CLI users can fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {message}")]
pub struct ValidationError {
    pub field: String,
    pub message: String,
}

impl ValidationError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The same error with its field named within `prefix` (`kind` in `jobs[3]` is
    /// `jobs[3].kind`), as a request names a part of itself.
    pub fn within(self, prefix: &str) -> Self {
        Self {
            field: join_field(prefix, &self.field),
            message: self.message,
        }
    }
}

/// `field` named within `prefix`: `prefix.field`, `prefix[0]` for an index, `prefix` alone
/// for the whole (an empty field or `.`).
pub fn join_field(prefix: &str, field: &str) -> String {
    if prefix.is_empty() {
        field.to_string()
    } else if field.is_empty() || field == "." {
        prefix.to_string()
    } else if field.starts_with('[') {
        format!("{prefix}{field}")
    } else {
        format!("{prefix}.{field}")
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("job {0} not found")]
    NotFound(Uuid),
    /// The caller's lease token no longer matches: the job was rescued, cancelled or finished.
    #[error("lease lost for job {0}: it was rescued, cancelled or already finished")]
    LeaseLost(Uuid),
    #[error("flow {0} not found")]
    FlowNotFound(Uuid),
    /// The flow (or the step named in the message) is in a state where the change does not apply.
    #[error("flow {id}: {message}")]
    FlowConflict { id: Uuid, message: String },
    /// The job is in a state where the requested change does not apply.
    #[error("job {id} is {state}; cannot {action}")]
    Conflict {
        id: Uuid,
        state: JobState,
        action: &'static str,
    },
    /// Back-pressure: the queue (or the tenant's share of it) is at its configured maximum
    /// depth. Nothing was stored; retry after `retry_after`.
    #[error("queue {queue} is full: {depth} unfinished jobs{} at a maximum of {limit}; retry later", tenant.as_ref().map(|t| format!(" for tenant {t}")).unwrap_or_default())]
    QueueFull {
        queue: String,
        tenant: Option<String>,
        depth: u64,
        limit: u64,
        retry_after: std::time::Duration,
    },
    /// The database could not be opened or used (I/O, corruption, permissions, lost connection).
    /// `message` says what was being attempted; `source` is the database driver's own error
    /// when there is one, for callers that inspect it (`std::error::Error::source`). The
    /// message shown includes the cause, so a log line or an HTTP answer stands on its own.
    #[error("storage error: {message}{}", caused_by(source))]
    Backend {
        message: String,
        #[source]
        source: Option<BoxError>,
    },
    #[error("the store is shut down")]
    Closed,
    /// A bug met in the store (an operation panicked): the operation was undone, and
    /// retrying it will most likely fail the same way.
    #[error("internal store error: {0}")]
    Internal(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// Any error a store's driver reports, kept as the source of a [`StoreError::Backend`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

impl StoreError {
    /// A backend error with no underlying error to keep (a broken invariant, a missing row).
    pub fn backend(message: impl Into<String>) -> Self {
        Self::Backend {
            message: message.into(),
            source: None,
        }
    }

    /// A backend error caused by `source` (a driver's or the operating system's error), kept
    /// in the chain.
    pub fn backend_caused(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Backend {
            message: message.into(),
            source: Some(source.into()),
        }
    }
}

fn caused_by(source: &Option<BoxError>) -> String {
    source
        .as_ref()
        .map(|source| format!(": {source}"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn a_backend_error_keeps_its_cause_in_the_chain_and_in_its_message() {
        let cause = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "read-only disk");
        let error = StoreError::backend_caused("sqlite: open jobs.db", cause);
        assert_eq!(
            error.to_string(),
            "storage error: sqlite: open jobs.db: read-only disk"
        );
        let source = error.source().expect("the cause is kept");
        let io = source
            .downcast_ref::<std::io::Error>()
            .expect("the cause keeps its type");
        assert_eq!(io.kind(), std::io::ErrorKind::PermissionDenied);
        assert!(StoreError::backend("no row").source().is_none());
        assert_eq!(
            StoreError::backend("no row").to_string(),
            "storage error: no row"
        );
    }
}
