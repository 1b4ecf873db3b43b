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
    if let Some(unique) = &job.unique {
        unique.validate()?;
    }
    Ok(())
}

/// Longest rate-limit period accepted: a day. Start records are kept this long at most.
pub const MAX_RATE_PERIOD_MS: u64 = 24 * 3600 * 1000;
/// Longest retention accepted for finished jobs: 100 years (keeps time arithmetic in range).
pub const MAX_RETENTION_SECS: u64 = 100 * 365 * 24 * 3600;
/// Most starts a rate limit may allow per period (each start is recorded while it counts).
pub const MAX_RATE_COUNT: u64 = 1_000_000;

/// Checks a queue's settings: every limit at least 1, rate periods from 1 ms to a day.
pub fn queue_settings(settings: &crate::job::QueueSettings) -> Result<(), ValidationError> {
    for (field, value) in [
        ("max_depth", settings.max_depth),
        ("max_depth_per_tenant", settings.max_depth_per_tenant),
        ("concurrency_limit", settings.concurrency_limit),
        (
            "per_key_concurrency_limit",
            settings.per_key_concurrency_limit,
        ),
        ("weight", settings.weight.map(u64::from)),
        (
            "completed_retention_secs",
            settings.completed_retention_secs,
        ),
        ("dead_retention_secs", settings.dead_retention_secs),
    ] {
        if value == Some(0) {
            return Err(ValidationError::new(
                field,
                "must be at least 1 (or null for no limit)",
            ));
        }
    }
    for (field, value) in [
        (
            "completed_retention_secs",
            settings.completed_retention_secs,
        ),
        ("dead_retention_secs", settings.dead_retention_secs),
    ] {
        if value.is_some_and(|secs| secs > MAX_RETENTION_SECS) {
            return Err(ValidationError::new(
                field,
                format!("must be at most {MAX_RETENTION_SECS} (100 years)"),
            ));
        }
    }
    for (field, rate) in [
        ("rate_limit", settings.rate_limit),
        ("per_key_rate_limit", settings.per_key_rate_limit),
    ] {
        let Some(rate) = rate else { continue };
        if rate.count == 0 || rate.count > MAX_RATE_COUNT {
            return Err(ValidationError::new(
                format!("{field}.count"),
                format!("must be from 1 to {MAX_RATE_COUNT}"),
            ));
        }
        if rate.period_ms == 0 || rate.period_ms > MAX_RATE_PERIOD_MS {
            return Err(ValidationError::new(
                format!("{field}.period_ms"),
                format!("must be from 1 to {MAX_RATE_PERIOD_MS} (a day)"),
            ));
        }
    }
    Ok(())
}
