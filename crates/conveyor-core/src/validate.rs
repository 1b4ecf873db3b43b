//! Input validation shared by the Rust API, the HTTP API and the CLI, so all three reject the
//! same things with the same field names.

use crate::error::ValidationError;
pub use crate::fields::*;
use crate::job::NewJob;
pub use crate::valid::Valid;

/// Most distinct queues one fetch may name. A fetch looks at each queue in turn on the
/// claim path (SQLite's single writer), so an unbounded list would stall every other write.
pub const MAX_FETCH_QUEUES: usize = 256;

/// Checks a fetch and drops repeated queue names (keeping the first of each, in linear time)
/// before it reaches a store.
pub fn fetch(params: &mut crate::lease::FetchParams) -> Result<(), ValidationError> {
    crate::workers::text("worker_id", &params.worker_id, true)?;
    let mut seen = std::collections::HashSet::with_capacity(params.queues.len());
    let mut distinct = Vec::with_capacity(params.queues.len().min(MAX_FETCH_QUEUES));
    for (index, queue) in params.queues.iter().enumerate() {
        if seen.contains(queue.as_str()) {
            continue;
        }
        if distinct.len() == MAX_FETCH_QUEUES {
            return Err(ValidationError::new(
                "queues",
                format!("at most {MAX_FETCH_QUEUES} distinct queues per fetch"),
            ));
        }
        name(&format!("queues[{index}]"), queue)?;
        seen.insert(queue.as_str());
        distinct.push(queue.clone());
    }
    drop(seen);
    params.queues = distinct;
    if let Some(kinds) = &mut params.kinds {
        if kinds.len() > MAX_FETCH_QUEUES {
            return Err(ValidationError::new(
                "kinds",
                format!("at most {MAX_FETCH_QUEUES} kinds per fetch"),
            ));
        }
        for (index, kind) in kinds.iter().enumerate() {
            name(&format!("kinds[{index}]"), kind)?;
        }
        kinds.sort_unstable();
        kinds.dedup();
    }
    for (index, kind) in params.excluded_kinds.iter().enumerate() {
        name(&format!("excluded_kinds[{index}]"), kind)?;
    }
    fold_excluded_kinds(params);
    Ok(())
}

/// A fetch that names its kinds claims none of the excluded ones: they leave `kinds`, and
/// `excluded_kinds` is kept only for a fetch of any kind (stores read it only then).
fn fold_excluded_kinds(params: &mut crate::lease::FetchParams) {
    if let Some(kinds) = &mut params.kinds {
        kinds.retain(|kind| !params.excluded_kinds.contains(kind));
        params.excluded_kinds.clear();
    }
}

/// Checks completions' results before they reach a store (see [`json_without_nul`]).
pub fn completions(params: &[crate::lease::CompleteParams]) -> Result<(), ValidationError> {
    for completion in params {
        if let Some(result) = &completion.result {
            json_without_nul("result", result)?;
        }
    }
    Ok(())
}

/// A [`NewJob`] that passed [`new_job`]: the only form stores insert
/// ([`crate::JobStore::jobs_insert_valid`]), so a job is checked once however many layers it
/// passes through (HTTP handler, decorators, store).
#[derive(Debug, Clone, PartialEq)]
pub struct ValidJob(NewJob);

impl ValidJob {
    /// Checks every field of `job`.
    pub fn new(job: NewJob) -> Result<Self, ValidationError> {
        new_job(&job)?;
        Ok(Self(job))
    }

    pub fn job(&self) -> &NewJob {
        &self.0
    }

    pub fn into_job(self) -> NewJob {
        self.0
    }

    /// The job stamped with the limit keys it holds (computed from the job and the limits, not
    /// given by a producer, so nothing to check).
    pub fn with_limit_keys(mut self, keys: Vec<String>) -> Self {
        self.0.limit_keys = keys;
        self
    }

    /// The job stamped with the sequence it enters (computed like the limit keys).
    pub fn with_sequence_key(mut self, key: Option<crate::sequence::SequenceKey>) -> Self {
        self.0.sequence_key = key;
        self
    }

    /// The job stamped with the fold it enters (debounce, throttle).
    pub fn with_fold_key(mut self, key: Option<crate::debounce::FoldKey>) -> Self {
        self.0.fold_key = key;
        self
    }

    /// The same job with `payload` and `unique` replaced by a decorator that transforms what is
    /// stored (encryption at rest). The caller vouches for them: they are derived from the
    /// validated ones, so they are not checked again.
    pub fn with_stored_payload(
        mut self,
        payload: serde_json::Value,
        unique: Option<crate::UniqueSpec>,
    ) -> Self {
        self.0.payload = payload;
        self.0.unique = unique;
        self
    }
}

impl TryFrom<NewJob> for ValidJob {
    type Error = ValidationError;

    fn try_from(job: NewJob) -> Result<Self, Self::Error> {
        Self::new(job)
    }
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
    if let Some(timeout) = job.timeout_ms {
        stored_integer("timeout_ms", timeout)?;
    }
    if let Some(key) = &job.idempotency_key {
        // Characters, as the API document's `maxLength` counts them.
        if key.is_empty() || key.chars().count() > MAX_IDEMPOTENCY_KEY_LEN {
            return Err(ValidationError::new(
                "idempotency_key",
                format!("must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} characters"),
            ));
        }
        text_without_nul("idempotency_key", key)?;
    }
    json_without_nul("payload", &job.payload)?;
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
    if let (Some(expires_at), Some(run_at)) = (job.expires_at, job.run_at) {
        if expires_at <= run_at {
            return Err(ValidationError::new(
                "expires_at",
                "must be after run_at: the job would expire before it could start",
            ));
        }
    }
    if let Some(trace) = &job.trace {
        trace.validate()?;
    }
    crate::limits::named::limit_names("limits", &job.limits)?;
    if let Some(sequence) = &job.sequence {
        crate::limits::named::sequence("sequence", sequence)?;
    }
    folds(job)?;
    Ok(())
}

/// Checks a job's `debounce` or `throttle`: not both, not with `unique`, a trailing debounce
/// without `run_at` (it decides when the job runs), a key expression, and periods from 1 ms to
/// 100 years.
fn folds(job: &NewJob) -> Result<(), ValidationError> {
    let (field, key) = match (&job.debounce, &job.throttle) {
        (Some(_), Some(_)) => {
            return Err(ValidationError::new(
                "throttle",
                "give debounce or throttle, not both",
            ))
        }
        (Some(spec), None) => ("debounce", &spec.key),
        (None, Some(spec)) => ("throttle", &spec.key),
        (None, None) => return Ok(()),
    };
    if job.unique.is_some() {
        return Err(ValidationError::new(
            field,
            "not with unique: a debounced or throttled job is already one per key",
        ));
    }
    key.parse::<crate::limits::KeyExpr>()
        .map_err(|message| ValidationError::new(format!("{field}.key"), message))?;
    let period = |name: &str, ms: u64| {
        if ms == 0 || ms > MAX_DELAY_MS as u64 {
            return Err(ValidationError::new(
                format!("{field}.{name}"),
                format!("must be 1 to {} (100 years)", MAX_DELAY_MS),
            ));
        }
        Ok(())
    };
    if let Some(spec) = &job.debounce {
        period("delay_ms", spec.delay_ms)?;
        if let Some(max_wait) = spec.max_wait_ms {
            period("max_wait_ms", max_wait)?;
        }
        if spec.mode == crate::debounce::DebounceMode::Trailing && job.run_at.is_some() {
            return Err(ValidationError::new(
                "run_at",
                "not with a trailing debounce, which decides when the job runs",
            ));
        }
    }
    if let Some(spec) = &job.throttle {
        period("period_ms", spec.period_ms)?;
    }
    Ok(())
}

/// Longest delay accepted (`delay_ms`, `retry_after_ms`, a snooze): 100 years, like
/// [`MAX_RETENTION_SECS`], so that "now + delay" is a time every store can keep.
pub const MAX_DELAY_MS: i64 = 100 * 365 * 24 * 3600 * 1000;

pub use crate::limits::MAX_RATE_PERIOD_MS;
/// Longest retention accepted for finished jobs: 100 years (keeps time arithmetic in range).
pub const MAX_RETENTION_SECS: u64 = 100 * 365 * 24 * 3600;
/// Most starts a rate limit may allow per period (each start is recorded while it counts).
pub const MAX_RATE_COUNT: u64 = 1_000_000;

/// Checks a queue's settings: every limit at least 1, rate periods from 1 ms to a day.
pub fn queue_settings(settings: &crate::job::QueueSettings) -> Result<(), ValidationError> {
    crate::limits::named::limit_names("limits", &settings.limits)?;
    if let Some(sequence) = &settings.sequence {
        crate::limits::named::sequence("sequence", sequence)?;
    }
    if let Some(breaker) = &settings.circuit_breaker {
        breaker.validate("circuit_breaker")?;
    }
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
        if let Some(value) = value {
            stored_integer(field, value)?;
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
    if let Some(ttl) = settings.default_ttl_ms {
        if ttl == 0 || ttl > MAX_DELAY_MS as u64 {
            return Err(ValidationError::new(
                "default_ttl_ms",
                format!("must be from 1 to {MAX_DELAY_MS} (100 years), or null"),
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

impl Valid<crate::lease::FetchParams> {
    /// A fetch, as [`fetch`] checks and normalises it.
    pub fn fetch(mut params: crate::lease::FetchParams) -> Result<Self, ValidationError> {
        fetch(&mut params)?;
        Ok(Self(params))
    }

    /// The same fetch narrowed by `narrow` (the circuit breakers: fewer queues, a smaller
    /// `max`, kinds of its own or of stored breakers named or excluded), its excluded kinds
    /// folded into its kinds again. Narrowing keeps a checked fetch valid, so it is not
    /// checked again.
    pub fn narrowed(self, narrow: impl FnOnce(&mut crate::lease::FetchParams)) -> Self {
        let mut params = self.0;
        narrow(&mut params);
        fold_excluded_kinds(&mut params);
        Self(params)
    }

    /// Whether the fetch cannot claim anything (no slots, no queues, or an empty kind filter),
    /// so no store need be asked.
    pub fn claims_nothing(&self) -> bool {
        let no_kinds = self.0.kinds.as_ref().is_some_and(Vec::is_empty);
        self.0.max == 0 || self.0.queues.is_empty() || no_kinds
    }
}

impl Valid<Vec<crate::lease::CompleteParams>> {
    /// A batch of completions, as [`completions`] checks it.
    pub fn completions(params: Vec<crate::lease::CompleteParams>) -> Result<Self, ValidationError> {
        completions(&params)?;
        Ok(Self(params))
    }
}

impl Valid<crate::lease::FailParams> {
    /// A failure report, its message made storable ([`storable_message`]): a report is never
    /// refused for its message.
    pub fn failure(mut params: crate::lease::FailParams) -> Self {
        params.message = storable_message(&params.message).into_owned();
        Self(params)
    }
}

impl Valid<serde_json::Value> {
    /// A JSON value a store keeps as given (a signal's payload): no NUL anywhere in it.
    pub fn payload(value: serde_json::Value) -> Result<Self, ValidationError> {
        json_without_nul("payload", &value)?;
        Ok(Self(value))
    }
}

impl Valid<crate::job::NamedQueueSettings> {
    /// A queue's settings under its name.
    pub fn queue_settings(
        queue: &str,
        settings: crate::job::QueueSettings,
    ) -> Result<Self, ValidationError> {
        name("queue", queue)?;
        queue_settings(&settings)?;
        Ok(Self(crate::job::NamedQueueSettings {
            name: queue.to_string(),
            settings,
        }))
    }
}

impl Valid<crate::breaker::StoredBreaker> {
    /// A breaker's record under its (queue or kind) name.
    pub fn breaker(breaker: crate::breaker::StoredBreaker) -> Result<Self, ValidationError> {
        name("name", &breaker.name)?;
        Ok(Self(breaker))
    }
}

impl Valid<crate::access::NewToken> {
    /// A new API token, under its name.
    pub fn token(token: crate::access::NewToken) -> Result<Self, ValidationError> {
        name("name", &token.name)?;
        Ok(Self(token))
    }
}

#[cfg(test)]
mod fold_tests {
    use super::*;
    use crate::debounce::{DebounceMode, DebounceSpec, ThrottleSpec};

    fn debounced(mode: DebounceMode) -> NewJob {
        let mut job = NewJob::new("k", serde_json::json!({"user": 1}));
        job.debounce = Some(DebounceSpec {
            key: "payload.user".into(),
            delay_ms: 1000,
            max_wait_ms: None,
            mode,
        });
        job
    }

    fn field(job: &NewJob) -> String {
        new_job(job).expect_err("refused").field
    }

    #[test]
    fn debounce_and_throttle_are_checked_naming_the_field() {
        assert!(new_job(&debounced(DebounceMode::Trailing)).is_ok());
        let mut both = debounced(DebounceMode::Leading);
        both.throttle = Some(ThrottleSpec {
            key: "tenant".into(),
            period_ms: 1,
        });
        assert_eq!(field(&both), "throttle");
        let mut unique = debounced(DebounceMode::Leading);
        unique.unique = Some(crate::UniqueSpec::default());
        assert_eq!(field(&unique), "debounce");
        let mut bad_key = debounced(DebounceMode::Leading);
        if let Some(spec) = bad_key.debounce.as_mut() {
            spec.key = "payload.".into();
        }
        assert_eq!(field(&bad_key), "debounce.key");
        let mut zero = debounced(DebounceMode::Leading);
        if let Some(spec) = zero.debounce.as_mut() {
            spec.delay_ms = 0;
        }
        assert_eq!(field(&zero), "debounce.delay_ms");
        let mut timed = debounced(DebounceMode::Trailing);
        timed.run_at = Some(chrono::Utc::now());
        assert_eq!(field(&timed), "run_at");
        let mut leading_timed = debounced(DebounceMode::Leading);
        leading_timed.run_at = Some(chrono::Utc::now());
        assert!(new_job(&leading_timed).is_ok());
    }
}
