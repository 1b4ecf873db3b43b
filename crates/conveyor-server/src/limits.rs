//! Named limits: `/v1/limits` (admin) defines rules on how many jobs sharing a key may run at
//! once and start per period, kept in the cluster's configuration (collection
//! [`LIMITS`]); queues, kinds and jobs name the limits they are subject to (see
//! `conveyor_core::limits::named`; jobs are stamped by the engine, claims are held back by the
//! stores). This module also checks the limit names given in queue and kind settings.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use conveyor_core::config::LIMITS;
use conveyor_core::limits::named::{limit_name, limit_names, KeyUsage, LimitSpec};
use conveyor_core::sequence::SequenceSpec;
use conveyor_core::{wire, AuditAction, StoreError};
use serde_json::{json, Value};
use std::collections::BTreeSet;

use crate::audit;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::extract::ApiJson;
use crate::AppState;

/// A stored limit read back. Documents are checked before they are stored, so one that no
/// longer passes is the store's fault (or a newer server's format): a 503, not the caller's.
fn spec_of(name: &str, document: Value) -> ApiResult<LimitSpec> {
    LimitSpec::from_json(name, document).map_err(|error| {
        ApiError::from(StoreError::backend(format!(
            "the stored limit {name} is not valid: {error}"
        )))
    })
}

/// A limit as answered: its name, its fields as stored (unset ones left out) and when it was
/// last put.
fn view(spec: &LimitSpec, updated_at: DateTime<Utc>) -> Value {
    let mut view = serde_json::to_value(spec).unwrap_or_else(|_| json!({}));
    view["name"] = json!(spec.name);
    view["updated_at"] = json!(updated_at);
    view
}

/// Every stored limit, by name, with when it was last put.
async fn all(state: &AppState) -> ApiResult<Vec<(LimitSpec, DateTime<Utc>)>> {
    let mut specs = Vec::new();
    for entry in state.store.config_list(LIMITS).await? {
        specs.push((spec_of(&entry.name, entry.document)?, entry.updated_at));
    }
    Ok(specs)
}

/// What each key of `spec` uses now, counted as the stores count it for a claim.
async fn usage(state: &AppState, spec: &LimitSpec) -> ApiResult<Vec<KeyUsage>> {
    let rate_period_ms = spec.rate.map(|rate| rate.period_ms);
    Ok(state.store.limit_usage(&spec.name, rate_period_ms).await?)
}

/// Running jobs under `spec`, over all its keys.
pub(crate) fn in_use(usage: &[KeyUsage]) -> u64 {
    usage
        .iter()
        .fold(0u64, |sum, key| sum.saturating_add(key.running))
}

pub(crate) async fn list(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    let limits: Vec<Value> = all(&state)
        .await?
        .iter()
        .map(|(spec, at)| view(spec, *at))
        .collect();
    Ok(Json(json!({ "limits": limits })))
}

/// `GET /v1/limits/{name}`: the limit, what each of its keys uses now (`usage`) and its
/// running jobs over every key (`in_use`).
pub(crate) async fn get(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    limit_name("name", &name)?;
    let entry = state
        .store
        .config_get(LIMITS, &name)
        .await?
        .ok_or_else(|| ApiError::LimitNotFound(name.clone()))?;
    let spec = spec_of(&name, entry.document)?;
    let usage = usage(&state, &spec).await?;
    let mut answer = view(&spec, entry.updated_at);
    answer["in_use"] = json!(in_use(&usage));
    answer["usage"] = serde_json::to_value(&usage)
        .map_err(|e| ApiError::Internal(format!("cannot serialize a limit's usage: {e}")))?;
    Ok(Json(answer))
}

/// `PUT /v1/limits/{name}`: creates (201) or replaces (200) a limit. Every server applies it
/// to the claims and enqueues that follow within about a second.
pub(crate) async fn put(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    ApiJson(mut body): ApiJson<Value>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    limit_name("name", &name)?;
    check_shape(&body)?;
    whole_numbers(&mut body);
    let spec = LimitSpec::from_json(&name, body)?;
    let existed = state.store.config_get(LIMITS, &name).await?.is_some();
    let document = serde_json::to_value(&spec)
        .map_err(|e| ApiError::Internal(format!("cannot serialize a limit: {e}")))?;
    let entry = state.store.config_put(LIMITS, &name, document).await?;
    // The limit as stored: its fields hold no payloads or secrets.
    let detail = serde_json::to_string(&spec).unwrap_or_default();
    let audit_entry = caller.audit(AuditAction::LimitPut).target(name);
    audit::record(&state, audit_entry.detail(detail)).await;
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(view(&spec, entry.updated_at))))
}

/// What [`LimitSpec`] reads more leniently than the API document states: fields of `rate`
/// besides `count` and `period_ms` (its `RateLimit` is shared with queue settings).
fn check_shape(body: &Value) -> ApiResult<()> {
    let rate_fields = body.get("rate").and_then(Value::as_object);
    if let Some(unknown) = rate_fields
        .into_iter()
        .flat_map(|rate| rate.keys())
        .find(|key| *key != "count" && *key != "period_ms")
    {
        return Err(ApiError::invalid(
            format!("rate.{unknown}"),
            "unknown field; expected count and period_ms",
        ));
    }
    Ok(())
}

/// Integers may be written in any notation with a whole value (`5`, `5.0`, `5e0`), as
/// everywhere in the API; [`LimitSpec`] reads plain integers, so such numbers are rewritten as
/// those first. Anything else is left for it to refuse, naming the field.
fn whole_numbers(body: &mut Value) {
    let whole = |slot: &mut Value| {
        if let Some(whole) = wire::whole_number(slot).and_then(|n| u64::try_from(n).ok()) {
            *slot = json!(whole);
        }
    };
    for pointer in ["/concurrency", "/rate/count", "/rate/period_ms"] {
        if let Some(slot) = body.pointer_mut(pointer) {
            whole(slot);
        }
    }
    if let Some(weights) = body.get_mut("weights").and_then(Value::as_object_mut) {
        weights.values_mut().for_each(whole);
    }
}

/// `DELETE /v1/limits/{name}`: refused (409 `limit_in_use`) while a queue's or a kind's
/// settings name the limit, so that no setting silently loses its effect. Jobs that name it
/// themselves, or were stamped with its keys, are not looked for: a deleted limit holds
/// nothing back, and their stamps are ignored.
pub(crate) async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    limit_name("name", &name)?;
    if state.store.config_get(LIMITS, &name).await?.is_none() {
        return Err(ApiError::LimitNotFound(name));
    }
    let users = named_by(&state, &name).await?;
    if !users.is_empty() {
        return Err(ApiError::LimitInUse(format!(
            "limit {name:?} is still named by {}: remove it from their limits first",
            users.join(", ")
        )));
    }
    // A queue or kind may name the limit between the check above and this delete (each
    // setting checks that its limits exist, but not under one lock with this). Such a name
    // then holds nothing, as for a job naming a deleted limit, and the limit can be put again.
    if !state.store.config_delete(LIMITS, &name).await? {
        return Err(ApiError::LimitNotFound(name));
    }
    audit::record(&state, caller.audit(AuditAction::LimitDelete).target(name)).await;
    Ok(StatusCode::NO_CONTENT)
}

/// The queues and kinds whose settings name the limit `name`, as `queue NAME` / `kind NAME`.
async fn named_by(state: &AppState, name: &str) -> ApiResult<Vec<String>> {
    let mut users = Vec::new();
    for queue in state.store.queue_settings_list().await? {
        if queue.settings.limits.iter().any(|limit| limit == name) {
            users.push(format!("queue {:?}", queue.name));
        }
    }
    for kind in state.store.kinds_list().await? {
        if kind.limits.iter().any(|limit| limit == name) {
            users.push(format!("kind {:?}", kind.kind));
        }
    }
    Ok(users)
}

/// Reads the `limits` of queue or kind settings (`field`): a list of names of defined limits,
/// each at most once. Errors name the place, `limits` or `limits[i]`.
pub(crate) async fn defined_names(
    state: &AppState,
    field: &str,
    value: &Value,
) -> ApiResult<Vec<String>> {
    let Some(items) = value.as_array() else {
        return Err(ApiError::invalid(
            field,
            "must be a list of limit names (or null for none)",
        ));
    };
    let mut names = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let Some(name) = item.as_str() else {
            return Err(ApiError::invalid(
                format!("{field}[{index}]"),
                "must be a limit's name (a string)",
            ));
        };
        names.push(name.to_string());
    }
    limit_names(field, &names)?;
    check_names_defined(state, [(field.to_string(), names.as_slice())]).await?;
    Ok(names)
}

/// Refuses lists of limit names (a job's, a queue's or a kind's) naming a limit that is not
/// defined, naming the place (`jobs[1].limits[0]`, `steps[2].job.limits[0]`): the stamp refuses
/// such jobs too, but does not know where in the request a job was. `jobs` are (the list's
/// field, names); the limits are read only if some list names one.
pub(crate) async fn check_names_defined<'a>(
    state: &AppState,
    jobs: impl IntoIterator<Item = (String, &'a [String])>,
) -> ApiResult<()> {
    let naming: Vec<(String, &[String])> = jobs
        .into_iter()
        .filter(|(_, names)| !names.is_empty())
        .collect();
    if naming.is_empty() {
        return Ok(());
    }
    let defined: BTreeSet<String> = state
        .store
        .config_list(LIMITS)
        .await?
        .into_iter()
        .map(|entry| entry.name)
        .collect();
    for (place, names) in naming {
        if let Some((index, name)) = names
            .iter()
            .enumerate()
            .find(|(_, name)| !defined.contains(name.as_str()))
        {
            let field = format!("{place}[{index}]");
            return Err(ApiError::invalid(
                field,
                format!("no limit named {name:?} is defined (PUT /v1/limits/{name} first)"),
            ));
        }
    }
    Ok(())
}

/// Why a job waits, when a named limit holds it back: for an available job, each limit key it
/// holds with no room left now (its running jobs and recent starts against the limit), as
/// `GET /v1/jobs/{id}` shows it in `blocked_by`. Empty for any other job.
pub(crate) async fn blocked_by(
    state: &AppState,
    job: &conveyor_core::Job,
) -> ApiResult<Vec<Value>> {
    let mut blocked = Vec::new();
    if job.state == conveyor_core::JobState::Blocked {
        if let Some(entry) = sequence_holder(state, job).await? {
            blocked.push(entry);
        }
        return Ok(blocked);
    }
    if job.state != conveyor_core::JobState::Available {
        return Ok(blocked);
    }
    for key in &job.limit_keys {
        let (name, value) = conveyor_core::limits::named::split_limit_key(key);
        let Some(entry) = state.store.config_get(LIMITS, name).await? else {
            // Deleted since the job was stamped: it holds nothing.
            continue;
        };
        let spec = spec_of(name, entry.document)?;
        let usage = state
            .store
            .limit_usage(name, spec.rate.map(|rate| rate.period_ms))
            .await?;
        let (running, recent_starts) = usage
            .iter()
            .find(|used| used.key == value)
            .map_or((0, 0), |used| (used.running, used.recent_starts));
        if spec.room(running, recent_starts) == 0 {
            let mut entry = json!({
                "limit": name, "key": value, "running": running, "recent_starts": recent_starts,
            });
            if let Some(concurrency) = spec.concurrency {
                entry["concurrency"] = json!(concurrency);
            }
            if let Some(rate) = spec.rate {
                entry["rate"] = json!(rate);
            }
            blocked.push(entry);
        }
    }
    Ok(blocked)
}

/// A part of a request (an object at `field`, such as `debounce`) read as `T`; an error names
/// the field at fault within it, as `wire::read_body` finds it (`debounce.delay_ms`).
pub(crate) fn spec_from<T: serde::de::DeserializeOwned>(field: &str, value: Value) -> ApiResult<T> {
    if !value.is_object() {
        return Err(ApiError::invalid(field, "must be a JSON object"));
    }
    wire::read_body(value, "mode").map_err(|e| ApiError::from(e.within(field)))
}

/// A sequence as a request gives it (`"<key expression>"` or `{"key", "on_dead"}`), refused
/// naming `field` when it is not one.
pub(crate) fn sequence_of(field: &str, value: &Value) -> ApiResult<SequenceSpec> {
    let spec: SequenceSpec = serde_json::from_value(value.clone())
        .map_err(|e| ApiError::invalid(field, e.to_string()))?;
    conveyor_core::limits::named::sequence(field, &spec)?;
    Ok(spec)
}

/// What a blocked job waits for: the earliest job of its sequence that holds it (its id and
/// state), or the sequence alone when none is found (it is being released).
async fn sequence_holder(state: &AppState, job: &conveyor_core::Job) -> ApiResult<Option<Value>> {
    let Some(place) = &job.sequence else {
        return Ok(None);
    };
    let mut holder: Option<conveyor_core::Job> = None;
    for held in conveyor_core::sequence::OPEN_STATES {
        let mut params = conveyor_core::JobListParams::default();
        params.sequence = Some(place.key.clone());
        params.state = Some(held);
        params.limit = 1;
        // Newest first: a state holds at most a few jobs of one sequence (one, unless dead
        // jobs set aside with on_dead skip were replayed).
        for found in state.store.jobs_list(params).await? {
            let place_of = |j: &conveyor_core::Job| j.sequence.as_ref().map_or(u64::MAX, |s| s.no);
            let holds = found
                .sequence
                .as_ref()
                .is_some_and(|s| conveyor_core::sequence::holds(found.state, s.on_dead));
            if holds
                && holder
                    .as_ref()
                    .is_none_or(|h| place_of(&found) < place_of(h))
            {
                holder = Some(found);
            }
        }
    }
    let mut entry = json!({"sequence": place.key, "no": place.no});
    if let Some(holder) = holder {
        entry["job"] = json!(holder.id);
        entry["state"] = json!(holder.state);
        entry["holder_no"] = json!(holder.sequence.map(|s| s.no));
    }
    Ok(Some(entry))
}
