//! The typed producer's vocabulary: a job type ([`TypedJob`]) and the options of one enqueue
//! ([`JobOptions`]). The client that enqueues them is `conveyor_engine::Client`.

use chrono::{DateTime, Utc};
use serde::{de::DeserializeOwned, Serialize};
use std::time::Duration;

use crate::error::ValidationError;
use crate::job::NewJob;
use crate::retry::RetryPolicy;
use crate::unique::UniqueSpec;
use crate::validate::ValidJob;

/// A job type: its kind name and its payload (the type itself, as JSON).
///
/// ```
/// use conveyor_core::TypedJob;
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct SendWelcomeEmail { user_id: u64 }
/// impl TypedJob for SendWelcomeEmail { const KIND: &'static str = "send_welcome_email"; }
/// ```
pub trait TypedJob: Serialize + DeserializeOwned + Send + 'static {
    const KIND: &'static str;

    /// Backoff between attempts of this kind.
    fn retry_policy() -> RetryPolicy {
        RetryPolicy::default()
    }

    /// Options applied when the producer gives none.
    fn default_options() -> JobOptions {
        JobOptions::default()
    }

    /// The JSON Schema (2020-12) of this kind's payload, for `conveyor_engine::Client::publish_schema`; for
    /// instance `serde_json::to_value(schemars::schema_for!(Self)).ok()` with the `schemars`
    /// crate. `None` (the default): nothing to publish.
    fn schema() -> Option<serde_json::Value> {
        None
    }
}

/// Per-enqueue options. Unset fields take the defaults of [`NewJob::new`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobOptions {
    pub queue: Option<String>,
    pub priority: Option<i32>,
    pub run_at: Option<DateTime<Utc>>,
    pub delay: Option<Duration>,
    pub max_attempts: Option<u32>,
    pub timeout: Option<Duration>,
    pub idempotency_key: Option<String>,
    pub tags: Vec<String>,
    pub tenant: Option<String>,
    pub unique: Option<UniqueSpec>,
    /// Not started by then, the job expires instead of running.
    pub expires_at: Option<DateTime<Utc>>,
    /// Not started within this long of the enqueue, the job expires (not with `expires_at`).
    pub ttl: Option<Duration>,
    /// The producer's W3C trace context.
    pub trace: Option<crate::trace_context::TraceContext>,
}

impl JobOptions {
    /// Not started by `at`, the job expires instead of running.
    pub fn expires_at(mut self, at: DateTime<Utc>) -> Self {
        self.expires_at = Some(at);
        self
    }
    /// Not started within `ttl` of the enqueue, the job expires instead of running.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }
    /// Sends the producer's W3C trace context with the job; the worker runs the handler as a
    /// child span of it (see `JobContext::trace`).
    pub fn trace(mut self, trace: crate::trace_context::TraceContext) -> Self {
        self.trace = Some(trace);
        self
    }
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = Some(priority);
        self
    }
    pub fn run_at(mut self, at: DateTime<Utc>) -> Self {
        self.run_at = Some(at);
        self
    }
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }
    pub fn tag(mut self, tag: impl Into<String>) -> Self {
        self.tags.push(tag.into());
        self
    }
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }
    /// Makes the enqueue unique (see [`UniqueSpec`]): a job with the same identity in one of
    /// the spec's states is returned with `duplicate: true` instead of a new one.
    pub fn unique(mut self, spec: UniqueSpec) -> Self {
        self.unique = Some(spec);
        self
    }

    /// Applies these options to a job of `kind` with `payload`, checked.
    pub fn into_new_job(
        self,
        kind: impl Into<String>,
        payload: serde_json::Value,
    ) -> Result<NewJob, ValidationError> {
        self.into_valid_job(kind, payload).map(ValidJob::into_job)
    }

    /// Applies these options to a job of `kind` with `payload`, checked once for any store.
    pub fn into_valid_job(
        self,
        kind: impl Into<String>,
        payload: serde_json::Value,
    ) -> Result<ValidJob, ValidationError> {
        let mut job = NewJob::new(kind, payload);
        if let Some(queue) = self.queue {
            job.queue = queue;
        }
        if let Some(priority) = self.priority {
            job.priority = priority;
        }
        let now = Utc::now();
        job.run_at = instant_or_after(now, self.run_at, self.delay, ("run_at", "delay"))?;
        if let Some(attempts) = self.max_attempts {
            job.max_attempts = attempts;
        }
        job.timeout_ms = self.timeout.map(|t| t.as_millis() as u64);
        job.idempotency_key = self.idempotency_key;
        job.tags = self.tags;
        job.tenant = self.tenant;
        job.unique = self.unique;
        job.expires_at = instant_or_after(now, self.expires_at, self.ttl, ("expires_at", "ttl"))?;
        job.trace = crate::trace::begin_enqueue(self.trace, chrono::Utc::now());
        ValidJob::new(job)
    }
}

/// An instant given either as itself or as a span after `now` (`run_at`/`delay`,
/// `expires_at`/`ttl`): both given is an error naming the span's field.
fn instant_or_after(
    now: DateTime<Utc>,
    at: Option<DateTime<Utc>>,
    after: Option<Duration>,
    (at_field, after_field): (&str, &str),
) -> Result<Option<DateTime<Utc>>, ValidationError> {
    match (at, after) {
        (Some(_), Some(_)) => Err(ValidationError::new(
            after_field,
            format!("give either {at_field} or {after_field}, not both"),
        )),
        (Some(at), None) => Ok(Some(at)),
        (None, Some(after)) => chrono::Duration::from_std(after)
            .ok()
            .and_then(|after| now.checked_add_signed(after))
            .map(Some)
            .ok_or_else(|| ValidationError::new(after_field, "too large")),
        (None, None) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_give_a_job_its_expiry_and_trace_context() {
        let before = Utc::now();
        let trace = crate::trace_context::TraceContext::parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            None,
            "",
        )
        .expect("valid");
        let job = JobOptions::default()
            .ttl(Duration::from_secs(60))
            .trace(trace.clone())
            .into_new_job("k", serde_json::Value::Null)
            .expect("valid");
        let expires = job.expires_at.expect("an expiry");
        assert!(expires >= before + chrono::Duration::seconds(60));
        assert!(expires <= Utc::now() + chrono::Duration::seconds(60));
        assert_eq!(job.trace, Some(trace));
        let both = JobOptions::default()
            .ttl(Duration::from_secs(1))
            .expires_at(Utc::now())
            .into_new_job("k", serde_json::Value::Null)
            .expect_err("both");
        assert_eq!(both.field, "ttl");
        let before_run = JobOptions::default()
            .delay(Duration::from_secs(60))
            .ttl(Duration::from_secs(1))
            .into_new_job("k", serde_json::Value::Null)
            .expect_err("expires before it can start");
        assert_eq!(before_run.field, "expires_at");
    }
}
