//! The audit log: recording what handlers did, and `GET /v1/audit`.
//!
//! Handlers record an entry after their action succeeded, with the caller from
//! [`crate::auth::Caller`]. Entries name jobs by id and queues, schedules and tokens by name;
//! they never hold payloads or secrets. A failure to record is logged (with the entry) rather
//! than turned into an error: the action has already happened, and answering with an error
//! would make clients retry it (enqueue twice, say).

use axum::extract::State;
use axum::Json;
use conveyor_core::{AuditAction, AuditListParams, Inserted, NewAuditEntry, ReplaySelector};

use crate::api::AuditPage;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::extract::QueryPairs;
use crate::AppState;

const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;

/// Appends `entry` to the audit log; logs it when the store cannot take it.
pub(crate) async fn record(state: &AppState, entry: NewAuditEntry) {
    if let Err(error) = state.store.audit_append(entry.clone()).await {
        tracing::error!(
            %error,
            actor = %entry.actor.name,
            action = %entry.action,
            target = ?entry.target,
            jobs = ?entry.job_ids,
            "could not record an audit entry"
        );
    }
}

/// The entry of an enqueue (one entry per request, however many jobs): the jobs' ids (the
/// store keeps the first 100, and the count), their queue when they share one, and how many
/// were idempotent duplicates.
pub(crate) fn enqueued(caller: &Caller, inserted: &[Inserted]) -> NewAuditEntry {
    let mut entry = caller
        .audit(AuditAction::JobEnqueue)
        .jobs(inserted.iter().map(|i| i.job.id).collect());
    if let Some(first) = inserted.first() {
        if inserted.iter().all(|i| i.job.queue == first.job.queue) {
            entry = entry.target(first.job.queue.clone());
        }
    }
    let duplicates = inserted.iter().filter(|i| i.duplicate).count();
    if duplicates > 0 {
        entry = entry.detail(format!("duplicates={duplicates}"));
    }
    entry
}

/// The entry of a dead-letter replay: the ids when given, else the filter, and the count.
pub(crate) fn replayed(caller: &Caller, selector: &ReplaySelector, count: u64) -> NewAuditEntry {
    let mut entry = caller.audit(AuditAction::DeadReplay);
    if let Some(ids) = &selector.ids {
        entry = entry.jobs(ids.clone());
    }
    if let Some(queue) = &selector.queue {
        entry = entry.target(queue.clone());
    }
    let filter = match (&selector.ids, &selector.queue, &selector.kind) {
        (Some(_), _, _) => "ids".to_string(),
        (None, None, None) => "all".to_string(),
        (None, queue, kind) => [("queue", queue), ("kind", kind)]
            .iter()
            .filter_map(|(name, value)| value.as_ref().map(|v| format!("{name}={v}")))
            .collect::<Vec<_>>()
            .join(" "),
    };
    entry
        .job_count(count)
        .detail(format!("{filter} replayed={count}"))
}

/// `GET /v1/audit?limit=&before=&action=`: entries newest first.
pub(crate) async fn list(
    State(state): State<AppState>,
    QueryPairs(pairs): QueryPairs,
) -> ApiResult<Json<AuditPage>> {
    let mut params = {
        let mut params = AuditListParams::default();
        params.limit = DEFAULT_LIMIT;
        params
    };
    for (key, value) in pairs {
        match key.as_str() {
            "limit" => {
                params.limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|limit| (1..=MAX_LIMIT).contains(limit))
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "limit",
                            format!("must be an integer from 1 to {MAX_LIMIT}"),
                        )
                    })?;
            }
            "before" => {
                params.before = Some(value.parse::<i64>().map_err(|_| {
                    ApiError::invalid("before", "must be an entry id (an integer)")
                })?);
            }
            "action" => params.action = Some(value.parse::<AuditAction>()?),
            other => {
                return Err(ApiError::invalid(
                    other,
                    "unknown query parameter; expected limit, before or action",
                ))
            }
        }
    }
    let entries = state.store.audit_list(params.clone()).await?;
    let next = if entries.len() >= params.limit {
        entries.last().map(|entry| entry.id)
    } else {
        None
    };
    Ok(Json(AuditPage { entries, next }))
}
