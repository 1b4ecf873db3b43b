//! `POST /v1/jobs/bulk`: one action on every job a filter matches (or on a list of ids), with a
//! dry run that only counts. Operators' tool for "cancel everything of tenant X", "retry all
//! dead jobs of kind Y since 10:00", "discard these 40".

use axum::extract::State;
use axum::Json;
use conveyor_core::{wire, AuditAction, JobListParams, JobState, ReplaySelector, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::audit;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::extract::ApiJson;
use crate::AppState;

/// Most jobs one bulk request acts on; more matching is reported as `truncated`.
pub(crate) const MAX_BULK: usize = 100_000;
/// Most ids one request may list.
const MAX_IDS: usize = 10_000;
/// Jobs read per page while collecting what a filter matches.
const PAGE: usize = 1_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum BulkAction {
    /// Unfinished jobs (scheduled, available, running, retryable) are cancelled.
    Cancel,
    /// Dead and expired jobs run again (as a replay from the dead-letter queue).
    Retry,
    /// Dead and expired jobs are deleted.
    Discard,
}

impl BulkAction {
    fn applies_to(self, state: JobState) -> bool {
        match self {
            BulkAction::Cancel => !state.is_finished(),
            BulkAction::Retry | BulkAction::Discard => {
                matches!(state, JobState::Dead | JobState::Expired)
            }
        }
    }
}

/// The filter of a bulk request: the search parameters of `GET /v1/jobs`, as JSON.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BulkFilter {
    #[serde(default, deserialize_with = "wire::non_null")]
    queue: Option<String>,
    #[serde(default, deserialize_with = "wire::non_null")]
    state: Option<String>,
    #[serde(default, deserialize_with = "wire::non_null")]
    kind: Option<String>,
    #[serde(default, deserialize_with = "wire::non_null")]
    tag: Option<String>,
    #[serde(default, deserialize_with = "wire::non_null")]
    tenant: Option<String>,
    #[serde(default, deserialize_with = "wire::non_null")]
    id_prefix: Option<String>,
    #[serde(default, deserialize_with = "wire::non_null")]
    created_after: Option<String>,
    #[serde(default, deserialize_with = "wire::non_null")]
    created_before: Option<String>,
    #[serde(default, deserialize_with = "wire::non_null")]
    payload: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BulkRequest {
    #[serde(default)]
    filter: Option<BulkFilter>,
    #[serde(default, deserialize_with = "wire::non_null")]
    ids: Option<Vec<Uuid>>,
    action: BulkAction,
    /// Count only: nothing changes.
    #[serde(default, deserialize_with = "wire::non_null")]
    dry_run: Option<bool>,
}

/// The answer of `POST /v1/jobs/bulk`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkResponse {
    pub action: String,
    pub dry_run: bool,
    /// Jobs the filter (or the ids) matched, up to the bulk limit.
    pub matched: u64,
    /// Of those, the ones the action applies to (unfinished for cancel; dead or expired for
    /// retry and discard).
    pub eligible: u64,
    /// Jobs the action changed (0 on a dry run; below `eligible` when some changed state
    /// meanwhile).
    pub applied: u64,
    /// More jobs matched than one request acts on (100,000): repeat it for the rest.
    pub truncated: bool,
}

fn filter_params(filter: BulkFilter) -> ApiResult<JobListParams> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for (key, value) in [
        ("queue", filter.queue),
        ("state", filter.state),
        ("kind", filter.kind),
        ("tag", filter.tag),
        ("tenant", filter.tenant),
        ("id_prefix", filter.id_prefix),
        ("created_after", filter.created_after),
        ("created_before", filter.created_before),
    ] {
        if let Some(value) = value {
            pairs.push((key.to_string(), value));
        }
    }
    if let Some(payload) = filter.payload {
        pairs.push(("payload".to_string(), payload.to_string()));
    }
    if pairs.is_empty() {
        return Err(ApiError::invalid(
            "filter",
            "give at least one criterion (queue, state, kind, tag, tenant, id_prefix, \
             created_after, created_before, payload); every job at once is not a filter",
        ));
    }
    // The same checks, and the same error fields, as the query parameters of GET /v1/jobs.
    crate::jobs::list_params(crate::extract::QueryPairs(pairs), None).map_err(|error| match error {
        ApiError::Invalid { field, message } => ApiError::Invalid {
            field: format!("filter.{field}"),
            message,
        },
        other => other,
    })
}

/// The jobs' ids and states a request selects, and whether there were more than it may take.
async fn selected(
    state: &AppState,
    request: &mut BulkRequest,
) -> ApiResult<(Vec<(Uuid, JobState)>, bool)> {
    match (request.filter.take(), request.ids.take()) {
        (Some(_), Some(_)) => Err(ApiError::invalid("ids", "give filter or ids, not both")),
        (None, None) => Err(ApiError::invalid("filter", "give filter or ids")),
        (None, Some(ids)) => {
            if ids.is_empty() || ids.len() > MAX_IDS {
                return Err(ApiError::invalid(
                    "ids",
                    format!("must list 1 to {MAX_IDS} job ids"),
                ));
            }
            let mut found = Vec::with_capacity(ids.len());
            let mut seen = std::collections::HashSet::with_capacity(ids.len());
            for id in ids {
                if seen.insert(id) {
                    if let Some(job) = state.store.job_get(id).await? {
                        found.push((job.id, job.state));
                    }
                }
            }
            Ok((found, false))
        }
        (Some(filter), None) => {
            let mut params = filter_params(filter)?;
            params.limit = PAGE;
            let mut found = Vec::new();
            loop {
                let page = state.store.jobs_list(params.clone()).await?;
                let done = page.len() < PAGE;
                params.after = page.last().map(|job| job.id);
                found.extend(page.into_iter().map(|job| (job.id, job.state)));
                if found.len() > MAX_BULK {
                    found.truncate(MAX_BULK);
                    return Ok((found, true));
                }
                if done {
                    return Ok((found, false));
                }
            }
        }
    }
}

pub(crate) async fn bulk(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(mut request): ApiJson<BulkRequest>,
) -> ApiResult<Json<BulkResponse>> {
    let action = request.action;
    let dry_run = request.dry_run.unwrap_or(false);
    let (matched, truncated) = selected(&state, &mut request).await?;
    let eligible: Vec<Uuid> = matched
        .iter()
        .filter(|(_, job_state)| action.applies_to(*job_state))
        .map(|(id, _)| *id)
        .collect();
    let mut applied = 0u64;
    if !dry_run && !eligible.is_empty() {
        applied = apply(&state, action, &eligible).await?;
        state.finished.notify_waiters();
        let audit_action = match action {
            BulkAction::Cancel => AuditAction::JobCancel,
            BulkAction::Retry => AuditAction::DeadReplay,
            BulkAction::Discard => AuditAction::DeadDiscard,
        };
        let shown: Vec<Uuid> = eligible.iter().take(100).copied().collect();
        let detail = serde_json::json!({"bulk": true, "applied": applied,
            "eligible": eligible.len(), "truncated": truncated});
        let entry = caller
            .audit(audit_action)
            .jobs(shown)
            .job_count(applied)
            .detail(detail.to_string());
        audit::record(&state, entry).await;
    }
    Ok(Json(BulkResponse {
        action: match action {
            BulkAction::Cancel => "cancel",
            BulkAction::Retry => "retry",
            BulkAction::Discard => "discard",
        }
        .to_string(),
        dry_run,
        matched: matched.len() as u64,
        eligible: eligible.len() as u64,
        applied,
        truncated,
    }))
}

/// Applies `action` to each job; a job that changed state meanwhile (finished before its
/// cancel, replayed by someone else) is left out of the count, not an error.
/// How many single-job changes of one bulk action are in flight at once: enough for the
/// SQLite writer to commit many in one round (one fsync) and for PostgreSQL to use several
/// connections, instead of one commit after another (10,000 cancels took over 10 s), yet few
/// enough to leave most of PostgreSQL's pool (10 by default) to workers and other requests.
const IN_FLIGHT: usize = 8;

async fn apply(state: &AppState, action: BulkAction, ids: &[Uuid]) -> ApiResult<u64> {
    use futures::stream::{self, StreamExt, TryStreamExt};
    let store = &state.store;
    let applied = match action {
        BulkAction::Cancel => {
            stream::iter(ids.iter().copied())
                .map(|id| async move {
                    match store.job_cancel(id).await {
                        Ok(job) => Ok(u64::from(job.state == JobState::Cancelled)),
                        Err(StoreError::NotFound(_)) | Err(StoreError::Conflict { .. }) => Ok(0),
                        Err(error) => Err(error),
                    }
                })
                .buffer_unordered(IN_FLIGHT)
                .try_fold(0u64, |sum, one| async move { Ok(sum + one) })
                .await?
        }
        BulkAction::Retry => {
            let mut applied = 0u64;
            for chunk in ids.chunks(1_000) {
                applied += store
                    .dead_replay(ReplaySelector {
                        ids: Some(chunk.to_vec()),
                        queue: None,
                        kind: None,
                    })
                    .await?;
            }
            applied
        }
        BulkAction::Discard => {
            stream::iter(ids.iter().copied())
                .map(|id| async move { store.dead_discard(id).await.map(u64::from) })
                .buffer_unordered(IN_FLIGHT)
                .try_fold(0u64, |sum, one| async move { Ok(sum + one) })
                .await?
        }
    };
    Ok(applied)
}
