//! Producer endpoints: enqueue (one or a batch), get, list, cancel.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use chrono::{DateTime, Utc};
use conveyor_core::job::DEFAULT_MAX_ATTEMPTS;
use conveyor_core::wire;
use conveyor_core::{
    unique, validate, AuditAction, Job, JobListParams, JobState, NewJob, Role, UniqueSpec, ValidJob,
};
use serde::Deserialize;
use serde_json::Value;
use std::time::Duration;

use crate::api::{BatchResponse, EnqueuedJob, JobPage};
use crate::audit;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::extract::{after_ms, check_json_size, parse_uuid, ApiJson, JobId, QueryPairs};
use crate::AppState;

pub(crate) const DEFAULT_LIST_LIMIT: usize = 50;
pub(crate) const MAX_LIST_LIMIT: usize = 500;

/// Body of `POST /v1/jobs`, and each element of a batch.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EnqueueRequest {
    kind: String,
    #[serde(default)]
    payload: Option<Value>,
    #[serde(default, deserialize_with = "wire::non_null")]
    queue: Option<String>,
    #[serde(default, deserialize_with = "wire::opt_int")]
    priority: Option<i32>,
    #[serde(default, deserialize_with = "wire::non_null")]
    run_at: Option<String>,
    #[serde(default, deserialize_with = "wire::opt_int")]
    delay_ms: Option<i64>,
    #[serde(default, deserialize_with = "wire::opt_int")]
    max_attempts: Option<u32>,
    #[serde(default, deserialize_with = "wire::opt_int")]
    timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "wire::non_null")]
    idempotency_key: Option<String>,
    #[serde(default, deserialize_with = "wire::non_null")]
    tags: Option<Vec<String>>,
    #[serde(default, deserialize_with = "wire::non_null")]
    tenant: Option<String>,
    #[serde(default, deserialize_with = "wire::non_null")]
    unique: Option<UniqueRequest>,
    /// Not started by then, the job expires (RFC 3339); or `ttl_ms` after the enqueue.
    #[serde(default, deserialize_with = "wire::non_null")]
    expires_at: Option<String>,
    #[serde(default, deserialize_with = "wire::opt_int")]
    ttl_ms: Option<i64>,
    /// W3C trace context; the `traceparent`/`tracestate` headers of `POST /v1/jobs` give it
    /// too (the body wins).
    #[serde(default, deserialize_with = "wire::non_null")]
    traceparent: Option<String>,
    #[serde(default, deserialize_with = "wire::non_null")]
    tracestate: Option<String>,
    /// Named limits the job is subject to besides its queue's and kind's (whether they exist
    /// is checked where the job is stamped with their keys, in the engine).
    #[serde(default, deserialize_with = "wire::non_null")]
    limits: Option<Vec<String>>,
    /// Runs after every earlier job with the same key (`"<key expression>"` or `{"key",
    /// "on_dead"}`); overrides the kind's and queue's sequence.
    #[serde(default, deserialize_with = "wire::non_null")]
    sequence: Option<Value>,
    /// `{"key", "delay_ms", "max_wait_ms"?, "mode": "trailing"|"leading"}`: a burst of
    /// enqueues with the same key becomes one job.
    #[serde(default, deserialize_with = "wire::non_null")]
    debounce: Option<Value>,
    /// `{"key", "period_ms"}`: at most one job with the same key per period.
    #[serde(default, deserialize_with = "wire::non_null")]
    throttle: Option<Value>,
}

/// `unique` of an enqueue request: a [`UniqueSpec`] whose unset fields take its defaults. States
/// arrive as names and are parsed here, so an unknown one is a 400 naming `unique.states`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UniqueRequest {
    #[serde(default, deserialize_with = "wire::non_null")]
    args: Option<Vec<String>>,
    #[serde(default, deserialize_with = "wire::non_null")]
    by_queue: Option<bool>,
    #[serde(default, deserialize_with = "wire::opt_int")]
    period_ms: Option<u64>,
    #[serde(default, deserialize_with = "wire::non_null")]
    states: Option<Vec<String>>,
}

impl UniqueRequest {
    fn into_spec(self) -> ApiResult<UniqueSpec> {
        let mut spec = UniqueSpec::whole_payload();
        spec.args = self.args;
        if let Some(by_queue) = self.by_queue {
            spec.by_queue = by_queue;
        }
        spec.period_ms = self.period_ms;
        if let Some(states) = self.states {
            spec.states = states
                .iter()
                .map(|name| unique::parse_state(name))
                .collect::<Result<_, _>>()?;
        }
        Ok(spec)
    }
}

impl EnqueueRequest {
    /// Takes the request's `traceparent`/`tracestate` headers as the job's trace context
    /// when the body gives none (a producer's HTTP instrumentation sets the headers). Headers
    /// that are not a valid context are ignored, as the W3C specification has receivers do
    /// (only the body's fields are the caller's explicit input, refused when malformed).
    pub(crate) fn adopt_trace_headers(&mut self, headers: &HeaderMap) {
        if self.traceparent.is_some() {
            return;
        }
        let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
        let Some(parent) = header("traceparent") else {
            return;
        };
        if let Ok(context) =
            conveyor_core::trace::TraceContext::parse(parent, header("tracestate"), "")
        {
            self.traceparent = Some(context.traceparent);
            self.tracestate = context.tracestate;
        }
    }

    /// Checks every field and builds the job the caller may enqueue (its owner recorded),
    /// validated once for the store; errors name the field (without any batch prefix).
    fn into_valid_job(
        self,
        state: &AppState,
        caller: &Caller,
        now: DateTime<Utc>,
    ) -> ApiResult<ValidJob> {
        Ok(ValidJob::new(self.into_new_job(state, caller, now)?)?)
    }

    /// The job as requested, its owner recorded, checked for what only the request knows
    /// (payload size, run_at or delay_ms); the rest is checked with the whole (job or flow).
    pub(crate) fn into_new_job(
        self,
        state: &AppState,
        caller: &Caller,
        now: DateTime<Utc>,
    ) -> ApiResult<NewJob> {
        let payload = self.payload.unwrap_or(Value::Null);
        check_json_size("payload", &payload, state.config.max_payload_bytes)?;
        let run_at = match (self.run_at, self.delay_ms) {
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid(
                    "delay_ms",
                    "give either run_at or delay_ms, not both",
                ))
            }
            (Some(raw), None) => Some(rfc3339("run_at", &raw)?),
            (None, Some(ms)) => Some(after_ms("delay_ms", now, ms)?),
            (None, None) => None,
        };
        let expires_at = match (self.expires_at, self.ttl_ms) {
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid(
                    "ttl_ms",
                    "give either expires_at or ttl_ms, not both",
                ))
            }
            (Some(raw), None) => {
                let at = rfc3339("expires_at", &raw)?;
                if at <= now {
                    return Err(ApiError::invalid(
                        "expires_at",
                        "is not in the future: the job would expire before it could start",
                    ));
                }
                Some(at)
            }
            (None, Some(ms)) => {
                if ms < 1 {
                    return Err(ApiError::invalid("ttl_ms", "must be at least 1"));
                }
                Some(after_ms("ttl_ms", now, ms)?)
            }
            (None, None) => None,
        };
        // A tracestate without a traceparent qualifies nothing and is dropped, as the W3C
        // specification has receivers do (once checked: bad input is refused all the same).
        if let (None, Some(state)) = (&self.traceparent, &self.tracestate) {
            conveyor_core::trace::check_tracestate(state, "")?;
        }
        let trace = self
            .traceparent
            .map(|parent| {
                conveyor_core::trace::TraceContext::parse(&parent, self.tracestate.as_deref(), "")
            })
            .transpose()?;
        let mut job = {
            let mut job = NewJob::new(self.kind, payload);
            job.queue = self
                .queue
                .unwrap_or_else(|| conveyor_core::DEFAULT_QUEUE.to_string());
            job.priority = self.priority.unwrap_or(0);
            job.run_at = run_at;
            job.max_attempts = self.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS);
            job.timeout_ms = self.timeout_ms;
            job.idempotency_key = self.idempotency_key;
            job.tags = self.tags.unwrap_or_default();
            job.tenant = self.tenant;
            job.unique = self.unique.map(UniqueRequest::into_spec).transpose()?;
            job.expires_at = expires_at;
            job.limits = self.limits.unwrap_or_default();
            job.sequence = self
                .sequence
                .map(|value| crate::limits::sequence_of("sequence", &value))
                .transpose()?;
            job.debounce = self
                .debounce
                .map(|value| crate::limits::spec_from("debounce", value))
                .transpose()?;
            job.throttle = self
                .throttle
                .map(|value| crate::limits::spec_from("throttle", value))
                .transpose()?;
            // Spans are on the wall clock, whatever clock the store runs on.
            job.trace = conveyor_core::trace::begin_enqueue(trace, chrono::Utc::now());
            job
        };
        claim_ownership(caller, &mut job.tags)?;
        Ok(job)
    }
}

/// Jobs enqueued with a token carry the tag `conveyor:owner:<token id>`, so that a producer
/// can read its own jobs and no one else's. Callers may not set `conveyor:` tags themselves.
const RESERVED_TAG_PREFIX: &str = "conveyor:";
const OWNER_TAG_PREFIX: &str = "conveyor:owner:";

pub(crate) fn owner_tag(caller: &Caller) -> Option<String> {
    caller
        .actor
        .token_id
        .map(|id| format!("{OWNER_TAG_PREFIX}{id}"))
}

/// Whether `caller` may see `job`: producers see only jobs carrying their own owner tag;
/// every other role that reaches a job route may see any job.
fn may_read(caller: &Caller, job: &Job) -> bool {
    caller.role != Role::Producer || owner_tag(caller).is_some_and(|tag| job.tags.contains(&tag))
}

/// Refuses reserved tags, then tags the job (or flow) with its owner (when a token made it).
pub(crate) fn claim_ownership(caller: &Caller, tags: &mut Vec<String>) -> ApiResult<()> {
    if tags.iter().any(|tag| tag.starts_with(RESERVED_TAG_PREFIX)) {
        return Err(ApiError::invalid(
            "tags",
            format!("tags starting with {RESERVED_TAG_PREFIX:?} are reserved for Conveyor"),
        ));
    }
    // One place is kept for the owner tag even with access control off, so that a request
    // valid without it stays valid with it (and the API document states one limit).
    if tags.len() >= validate::MAX_TAGS {
        return Err(ApiError::invalid(
            "tags",
            format!(
                "at most {} tags (one place is kept for the tag recording the enqueuing token)",
                validate::MAX_TAGS - 1
            ),
        ));
    }
    if let Some(tag) = owner_tag(caller) {
        tags.push(tag);
    }
    Ok(())
}

pub(crate) async fn enqueue(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiJson(mut request): ApiJson<EnqueueRequest>,
) -> ApiResult<(StatusCode, Json<EnqueuedJob>)> {
    request.adopt_trace_headers(&headers);
    let job = request.into_valid_job(&state, &caller, state.clock.now())?;
    state
        .kinds
        .check(&job.job().kind, &job.job().payload)
        .await?;
    let inserted = state
        .store
        .jobs_insert_valid(vec![job])
        .await?
        .pop()
        .ok_or_else(|| ApiError::Internal("store returned no row for an insert".to_string()))?;
    conveyor_core::trace::end_enqueue(&inserted.job, inserted.duplicate, chrono::Utc::now());
    crate::observe::count_enqueued(&state, std::slice::from_ref(&inserted));
    audit::record(
        &state,
        audit::enqueued(&caller, std::slice::from_ref(&inserted)),
    )
    .await;
    let status = if inserted.duplicate {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let answer = if may_read(&caller, &inserted.job) {
        EnqueuedJob::Readable {
            job: Box::new(state.config.redacted(inserted.job)),
            duplicate: inserted.duplicate,
            debounced_into: inserted.debounced_into,
        }
    } else {
        EnqueuedJob::Foreign {
            id: inserted.job.id,
            duplicate: inserted.duplicate,
            debounced_into: inserted.debounced_into,
        }
    };
    Ok((status, Json(answer)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BatchRequest {
    jobs: Vec<EnqueueRequest>,
}

pub(crate) async fn enqueue_batch(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiJson(request): ApiJson<BatchRequest>,
) -> ApiResult<(StatusCode, Json<BatchResponse>)> {
    if request.jobs.is_empty() {
        return Err(ApiError::invalid("jobs", "must contain at least one job"));
    }
    let max = state.config.max_batch_jobs;
    if request.jobs.len() > max {
        return Err(ApiError::invalid(
            "jobs",
            format!("at most {max} jobs per batch"),
        ));
    }
    let now = state.clock.now();
    let count = request.jobs.len();
    let mut jobs = Vec::with_capacity(count);
    for (index, mut job) in request.jobs.into_iter().enumerate() {
        job.adopt_trace_headers(&headers);
        let within = |e: ApiError| e.within(&format!("jobs[{index}]"));
        jobs.push(job.into_valid_job(&state, &caller, now).map_err(within)?);
    }
    state
        .kinds
        .check_all(
            jobs.iter()
                .map(|j| (j.job().kind.as_str(), &j.job().payload)),
            |index| format!("jobs[{index}]"),
        )
        .await?;
    crate::limits::check_names_defined(
        &state,
        jobs.iter()
            .enumerate()
            .map(|(index, job)| (format!("jobs[{index}].limits"), job.job().limits.as_slice())),
    )
    .await?;
    let inserted = state.store.jobs_insert_valid(jobs).await?;
    if inserted.len() != count {
        return Err(ApiError::Internal(format!(
            "store returned {} rows for {count} inserted jobs",
            inserted.len()
        )));
    }
    let now = chrono::Utc::now();
    for one in &inserted {
        conveyor_core::trace::end_enqueue(&one.job, one.duplicate, now);
    }
    crate::observe::count_enqueued(&state, &inserted);
    audit::record(&state, audit::enqueued(&caller, &inserted)).await;
    let debounced_into = if inserted.iter().any(|i| i.debounced_into.is_some()) {
        inserted.iter().map(|i| i.debounced_into).collect()
    } else {
        Vec::new()
    };
    let (ids, duplicates) = inserted
        .into_iter()
        .map(|i| (i.job.id, i.duplicate))
        .unzip();
    Ok((
        StatusCode::CREATED,
        Json(BatchResponse {
            ids,
            duplicates,
            debounced_into,
        }),
    ))
}

/// `GET /v1/jobs/{id}[?wait_ms=N]`: the job; with `wait_ms`, once it is finished (completed,
/// dead or cancelled) or `wait_ms` has passed (capped like a fetch's long-poll), whichever comes
/// first, so a producer can wait for a result without polling.
pub(crate) async fn get(
    State(state): State<AppState>,
    caller: Caller,
    JobId(id): JobId,
    QueryPairs(pairs): QueryPairs,
) -> ApiResult<Json<Value>> {
    let wait = wait_param(&state, pairs)?;
    let job = wait_until(&state, wait, || async {
        let job = state
            .store
            .job_get(id)
            .await?
            .ok_or(ApiError::JobNotFound(id))?;
        // A producer sees only its own jobs; another's answers as if it did not exist.
        if !may_read(&caller, &job) {
            return Err(ApiError::JobNotFound(id));
        }
        let finished = job.state.is_finished();
        Ok((job, finished))
    })
    .await?;
    let blocked_by = crate::limits::blocked_by(&state, &job).await?;
    let mut answer = serde_json::to_value(state.config.redacted(job))
        .map_err(|e| ApiError::from(conveyor_core::StoreError::backend(e.to_string())))?;
    if !blocked_by.is_empty() {
        answer["blocked_by"] = Value::Array(blocked_by);
    }
    Ok(Json(answer))
}

/// The `wait_ms` of a read that may long-poll (the only query parameter it takes), capped by
/// the server's longest long-poll.
pub(crate) fn wait_param(state: &AppState, pairs: Vec<(String, String)>) -> ApiResult<Duration> {
    let mut wait = Duration::ZERO;
    for (key, value) in pairs {
        match key.as_str() {
            "wait_ms" => {
                let ms = value
                    .parse::<u64>()
                    .ok()
                    .filter(|ms| *ms <= conveyor_core::validate::MAX_STORED_INTEGER)
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "wait_ms",
                            "must be a whole number of milliseconds from 0 to 2^63-1",
                        )
                    })?;
                wait = Duration::from_millis(ms).min(state.config.max_fetch_wait);
            }
            other => {
                return Err(ApiError::invalid(
                    other,
                    "unknown query parameter; expected wait_ms",
                ))
            }
        }
    }
    Ok(wait)
}

/// Reads with `read` (which answers the value and whether it is final) until it is final or
/// `wait` passes. Finished through this server: a notification. Through another process (an
/// embedded worker, another node): a look that grows from 50 ms to a second while nothing
/// changes.
pub(crate) async fn wait_until<T, F, Fut>(state: &AppState, wait: Duration, read: F) -> ApiResult<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ApiResult<(T, bool)>>,
{
    let deadline = tokio::time::Instant::now() + wait;
    let mut poll = Duration::from_millis(50);
    loop {
        let finished = state.finished.notified();
        tokio::pin!(finished);
        finished.as_mut().enable();
        let (value, done) = read().await?;
        let now = tokio::time::Instant::now();
        if done || now >= deadline || state.shutdown.is_cancelled() {
            return Ok(value);
        }
        tokio::select! {
            _ = &mut finished => {}
            _ = state.shutdown.cancelled() => {}
            _ = tokio::time::sleep_until(deadline.min(now + poll)) => {
                poll = (poll * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// A list's `limit`: 1 to [`MAX_LIST_LIMIT`].
pub(crate) fn list_limit(value: &str) -> ApiResult<usize> {
    value
        .parse::<usize>()
        .ok()
        .filter(|limit| (1..=MAX_LIST_LIMIT).contains(limit))
        .ok_or_else(|| {
            ApiError::invalid(
                "limit",
                format!("must be an integer from 1 to {MAX_LIST_LIMIT}"),
            )
        })
}

/// Parses `queue`, `kind`, `limit`, `after` and (when `state` is `None`) `state` from a query
/// string. `fixed_state` is used by the dead-letter listing, which takes no `state` parameter.
pub(crate) fn list_params(
    QueryPairs(pairs): QueryPairs,
    fixed_state: Option<JobState>,
) -> ApiResult<JobListParams> {
    let mut params = {
        let mut params = JobListParams::default();
        params.queue = None;
        params.state = fixed_state;
        params.kind = None;
        params.limit = DEFAULT_LIST_LIMIT;
        params.after = None;
        params
    };
    for (key, value) in pairs {
        match key.as_str() {
            "queue" => {
                validate::name("queue", &value)?;
                params.queue = Some(value);
            }
            "kind" => {
                validate::name("kind", &value)?;
                params.kind = Some(value);
            }
            "state" if fixed_state.is_none() => params.state = Some(value.parse::<JobState>()?),
            "limit" => params.limit = list_limit(&value)?,
            "after" | "cursor" => params.after = Some(parse_uuid(&key, &value)?),
            "id_prefix" => params.id_prefix = Some(id_prefix(&value)?),
            "tag" => params.tag = Some(search_text("tag", value)?),
            "tenant" => params.tenant = Some(search_text("tenant", value)?),
            "sequence" => params.sequence = Some(sequence_key(value)?),
            "created_after" => params.created_after = Some(rfc3339(&key, &value)?),
            "created_before" => params.created_before = Some(rfc3339(&key, &value)?),
            "payload" => params.payload = Some(payload_filter(&value)?),
            _ => {
                return Err(ApiError::invalid(
                    key.clone(),
                    format!("unknown query parameter {key:?}"),
                ))
            }
        }
    }
    Ok(params)
}

/// An id prefix to search by: 1 to 36 characters of a job id (hex digits, dashes where an id
/// has them), any case.
fn id_prefix(raw: &str) -> ApiResult<String> {
    const SHAPE: &[u8] = b"xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
    let prefix = raw.to_ascii_lowercase();
    let fits = !prefix.is_empty()
        && prefix.len() <= SHAPE.len()
        && prefix.bytes().zip(SHAPE).all(|(b, shape)| match shape {
            b'-' => b == b'-',
            _ => b.is_ascii_hexdigit(),
        });
    if fits {
        Ok(prefix)
    } else {
        Err(ApiError::invalid(
            "id_prefix",
            "must be the start of a job id: hex digits, with dashes where an id has them \
             (e.g. 0193a5f2 or 0193a5f2-7c1e)",
        ))
    }
}

/// A tag or tenant to search by.
/// A sequence key to list the jobs of (`expr=value`, as jobs carry it): 1 to 1,000 characters.
fn sequence_key(value: String) -> ApiResult<String> {
    if value.is_empty() || value.chars().count() > 1000 {
        return Err(ApiError::invalid(
            "sequence",
            "must be 1 to 1000 characters",
        ));
    }
    validate::text_without_nul("sequence", &value)?;
    Ok(value)
}

fn search_text(field: &str, value: String) -> ApiResult<String> {
    if value.is_empty() || value.chars().count() > 200 {
        return Err(ApiError::invalid(field, "must be 1 to 200 characters"));
    }
    validate::text_without_nul(field, &value)?;
    Ok(value)
}

/// A timestamp a request gives as text, refused naming `field` unless it is RFC 3339.
pub(crate) fn rfc3339(field: &str, raw: &str) -> ApiResult<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(raw)
        .map(|at| at.with_timezone(&Utc))
        .map_err(|e| ApiError::invalid(field, format!("{raw:?} is not an RFC 3339 timestamp: {e}")))
}

/// Most bytes of a payload filter.
const MAX_PAYLOAD_FILTER_BYTES: usize = 8 * 1024;

/// A payload filter: a JSON object the payload must contain (keys at any depth, values whole).
fn payload_filter(raw: &str) -> ApiResult<serde_json::Value> {
    if raw.len() > MAX_PAYLOAD_FILTER_BYTES {
        return Err(ApiError::invalid(
            "payload",
            format!("at most {MAX_PAYLOAD_FILTER_BYTES} bytes"),
        ));
    }
    let value: serde_json::Value = serde_json::from_str(raw).map_err(|e| {
        ApiError::invalid(
            "payload",
            format!("must be a JSON object such as {{\"user_id\": 7}}: {e}"),
        )
    })?;
    if !value.is_object() {
        return Err(ApiError::invalid(
            "payload",
            "must be a JSON object such as {\"user_id\": 7}",
        ));
    }
    validate::json_without_nul("payload", &value)?;
    Ok(value)
}

pub(crate) async fn page(state: &AppState, params: JobListParams) -> ApiResult<Json<JobPage>> {
    let limit = params.limit;
    let jobs: Vec<Job> = state
        .store
        .jobs_list(params)
        .await?
        .into_iter()
        .map(|job| state.config.redacted(job))
        .collect();
    let next = if jobs.len() >= limit {
        jobs.last().map(|job| job.id)
    } else {
        None
    };
    Ok(Json(JobPage { jobs, next }))
}

pub(crate) async fn list(
    State(state): State<AppState>,
    caller: Caller,
    query: QueryPairs,
) -> ApiResult<Json<JobPage>> {
    let mut params = list_params(query, None)?;
    if caller.role == Role::Producer {
        // A producer lists its own jobs: those carrying its owner tag (the search's tag).
        if params.tag.is_some() {
            return Err(ApiError::invalid(
                "tag",
                "a producer's list is its own jobs; searching by tag is for operators",
            ));
        }
        params.tag = Some(
            owner_tag(&caller)
                .ok_or_else(|| ApiError::Internal("a producer without a token".to_string()))?,
        );
    }
    page(&state, params).await
}

pub(crate) async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    JobId(id): JobId,
) -> ApiResult<Json<Job>> {
    let job = state.store.job_cancel(id).await?;
    state.finished.notify_waiters();
    let entry = caller
        .audit(AuditAction::JobCancel)
        .target(job.queue.clone());
    audit::record(&state, entry.jobs(vec![id])).await;
    Ok(Json(state.config.redacted(job)))
}
