//! Input validation shared by the Rust API, the HTTP API and the CLI, so all three reject the
//! same things with the same field names.

use crate::error::ValidationError;
use crate::job::NewJob;

pub const MAX_NAME_LEN: usize = 128;
pub const MAX_TAGS: usize = 32;
pub const MAX_ATTEMPTS_LIMIT: u32 = 1000;
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 512;

/// Kind, queue, tenant and tag names: 1-128 characters from `[A-Za-z0-9_.:-]`.
pub fn name(field: &str, value: &str) -> Result<(), ValidationError> {
    if value.is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    if value.len() > MAX_NAME_LEN {
        return Err(ValidationError::new(
            field,
            format!("must be at most {MAX_NAME_LEN} characters"),
        ));
    }
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')))
    {
        return Err(ValidationError::new(
            field,
            format!("contains illegal character {bad:?}; allowed are letters, digits, '_', '-', '.', ':'"),
        ));
    }
    Ok(())
}

/// Checks every field of a new job; the first problem found is returned.
pub fn new_job(job: &NewJob) -> Result<(), ValidationError> {
    name("kind", &job.kind)?;
    name("queue", &job.queue)?;
    if job.max_attempts == 0 || job.max_attempts > MAX_ATTEMPTS_LIMIT {
        return Err(ValidationError::new(
            "max_attempts",
            format!("must be between 1 and {MAX_ATTEMPTS_LIMIT}"),
        ));
    }
    if job.timeout_ms == Some(0) {
        return Err(ValidationError::new("timeout_ms", "must be positive"));
    }
    if let Some(key) = &job.idempotency_key {
        if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_LEN {
            return Err(ValidationError::new(
                "idempotency_key",
                format!("must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} bytes"),
            ));
        }
    }
    if job.tags.len() > MAX_TAGS {
        return Err(ValidationError::new(
            "tags",
            format!("at most {MAX_TAGS} tags"),
        ));
    }
    for tag in &job.tags {
        name("tags", tag)?;
    }
    if let Some(tenant) = &job.tenant {
        name("tenant", tenant)?;
    }
    Ok(())
}
