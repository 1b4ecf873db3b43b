//! Typed errors shared by every store and the layers above them.

use crate::job::JobState;
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
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("job {0} not found")]
    NotFound(Uuid),
    /// The caller's lease token no longer matches: the job was rescued, cancelled or finished.
    #[error("lease lost for job {0}: it was rescued, cancelled or already finished")]
    LeaseLost(Uuid),
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
    #[error("storage error: {0}")]
    Backend(String),
    #[error("the store is shut down")]
    Closed,
    /// A bug met in the store (an operation panicked): the operation was undone, and
    /// retrying it will most likely fail the same way.
    #[error("internal store error: {0}")]
    Internal(String),
}

pub type StoreResult<T> = Result<T, StoreError>;
