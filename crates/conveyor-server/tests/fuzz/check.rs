//! Checking answers.

use super::*;

pub(super) struct Run {
    pub(super) seed: u64,
    pub(super) failures: BTreeMap<String, String>,
    pub(super) failure_count: usize,
    pub(super) slow: Vec<String>,
    pub(super) statuses: BTreeMap<(String, u16), usize>,
}

impl Run {
    pub(super) fn fail(&mut self, index: usize, req: &Req, kind: &str, detail: String) {
        self.failure_count += 1;
        // One example per route and kind of failure.
        let signature = format!("{} | {kind}", req.route);
        self.failures.entry(signature).or_insert_with(|| {
            format!(
                "request #{index} (seed {}): {kind}\n{}  answer: {detail}\n",
                self.seed,
                req.describe()
            )
        });
    }
}

pub(super) fn check_shape(run: &mut Run, index: usize, req: &Req, answer: &Answer) {
    let status = answer.status;
    if status >= 500 {
        run.fail(
            index,
            req,
            &format!("server error {status}"),
            answer.describe(),
        );
        return;
    }
    if !(400..500).contains(&status) || req.method == "HEAD" {
        return;
    }
    let content_type = answer.header("content-type").unwrap_or("");
    let body = answer.json();
    let error = body.as_ref().and_then(|b| b.get("error"));
    let well_formed = content_type.starts_with("application/json")
        && error.is_some_and(|e| {
            e["code"].as_str().is_some_and(|c| !c.is_empty())
                && e["message"].as_str().is_some_and(|m| !m.is_empty())
                && (e["field"].is_null() || e["field"].is_string())
                && e.get("field").is_some()
        });
    if !well_formed {
        run.fail(
            index,
            req,
            &format!("{status} without a JSON error body"),
            answer.describe(),
        );
    }
}

/// Sends a GET to read back what a 2xx claimed; admin credentials on the auth server.
pub(super) async fn read_back(server: &Server, path: &str) -> Option<Value> {
    let mut req = Req::new("read back", "GET", path.to_string());
    if let Some(admin) = &server.admin {
        req.headers
            .push(("authorization".into(), format!("Bearer {admin}")));
    }
    let answer = send(server.addr, &req).await.ok()?;
    if answer.status != 200 {
        return None;
    }
    answer.json()
}

pub(super) fn without(value: &Value, keys: &[&str]) -> Value {
    let mut value = value.clone();
    if let Some(map) = value.as_object_mut() {
        for key in keys {
            map.remove(*key);
        }
    }
    value
}

/// The top-level keys whose values differ, e.g. `run_at, timeout_ms`.
pub(super) fn differing_fields(a: &Value, b: &Value) -> String {
    let empty = Map::new();
    let (a, b) = (
        a.as_object().unwrap_or(&empty),
        b.as_object().unwrap_or(&empty),
    );
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.retain(|k| a.get(*k) != b.get(*k));
    keys.iter()
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Fields of an accepted job request that must be stored exactly as sent.
pub(super) const EXACT_JOB_FIELDS: &[&str] = &[
    "kind",
    "queue",
    "priority",
    "max_attempts",
    "timeout_ms",
    "idempotency_key",
    "tenant",
];

pub(super) fn compare_job_request(sent: &Value, stored: &Value) -> Option<String> {
    for field in EXACT_JOB_FIELDS {
        if let Some(value) = sent.get(*field).filter(|v| !v.is_null()) {
            if stored.get(*field) != Some(value) {
                return Some(format!(
                    "{field}: sent as {value} but stored as {}",
                    stored.get(*field).unwrap_or(&Value::Null)
                ));
            }
        }
    }
    None
}

/// Learns ids and tokens from a successful answer, and checks that it is true.
pub(super) async fn learn_and_verify(
    run: &mut Run,
    world: &mut World,
    index: usize,
    server: &Server,
    req: &Req,
    answer: &Answer,
) {
    if !(200..300).contains(&answer.status) || req.method == "HEAD" {
        return;
    }
    let Some(body) = answer.json() else {
        if answer.too_deep_for_serde() {
            // E.g. a job payload nested 126 levels is accepted (the enqueue body is 127 deep),
            // but the fetch answer wraps it in three more: `conveyor work` cannot read the
            // answer, and every job that fetch claimed stays leased to nobody.
            run.fail(
                index,
                req,
                "2xx answer nested deeper than serde_json's default limit of 128",
                answer.describe(),
            );
        } else if answer.status != 204 && req.route != "GET /metrics" {
            run.fail(index, req, "2xx without a JSON body", answer.describe());
        }
        return;
    };
    match req.route {
        "POST /v1/jobs" => {
            let Some(id) = body["id"].as_str().and_then(|s| s.parse::<Uuid>().ok()) else {
                return;
            };
            keep(&mut world.jobs, id);
            if body["duplicate"] == true {
                return;
            }
            let Some(stored) = read_back(server, &format!("/v1/jobs/{id}")).await else {
                run.fail(index, req, "accepted job cannot be read", answer.describe());
                return;
            };
            // Maintenance may promote a scheduled job in between; everything else must match.
            let answered = without(&body, &["duplicate", "state"]);
            let stored = without(&stored, &["state"]);
            if answered != stored {
                let fields = differing_fields(&answered, &stored);
                run.fail(
                    index,
                    req,
                    &format!("enqueue answer differs from the stored job in {fields}"),
                    format!("answered {answered}\n  stored {stored}"),
                );
            } else if let Some(problem) = req
                .sent
                .as_ref()
                .and_then(|s| compare_job_request(s, &stored))
            {
                let field = problem.split(':').next().unwrap_or("").to_string();
                run.fail(
                    index,
                    req,
                    &format!("accepted job stored with another {field}"),
                    problem,
                );
            }
        }
        "POST /v1/jobs/batch" => {
            let ids: Vec<Uuid> = body["ids"]
                .as_array()
                .map(|ids| {
                    ids.iter()
                        .filter_map(|i| i.as_str()?.parse().ok())
                        .collect()
                })
                .unwrap_or_default();
            let duplicates = body["duplicates"].as_array().cloned().unwrap_or_default();
            for (i, id) in ids.iter().enumerate() {
                keep(&mut world.jobs, *id);
                if duplicates.get(i) == Some(&Value::Bool(true)) {
                    continue;
                }
                let sent = req.sent.as_ref().and_then(|s| s["jobs"].get(i));
                let Some(sent) = sent else { continue };
                match read_back(server, &format!("/v1/jobs/{id}")).await {
                    None => run.fail(
                        index,
                        req,
                        "accepted batch job cannot be read",
                        id.to_string(),
                    ),
                    Some(stored) => {
                        if let Some(problem) = compare_job_request(sent, &stored) {
                            let field = problem.split(':').next().unwrap_or("").to_string();
                            run.fail(
                                index,
                                req,
                                &format!("accepted batch job stored with another {field}"),
                                problem,
                            );
                        }
                    }
                }
            }
        }
        "POST /v1/fetch" => {
            for job in body["jobs"].as_array().into_iter().flatten() {
                let id = job["id"].as_str().and_then(|s| s.parse().ok());
                let token = job["lease_token"].as_str().and_then(|s| s.parse().ok());
                if let (Some(id), Some(token)) = (id, token) {
                    keep(&mut world.leases, (id, token));
                }
            }
        }
        "POST /v1/jobs/{id}/fail" if body["state"] == "dead" => {
            if let Some(id) = body["id"].as_str().and_then(|s| s.parse().ok()) {
                keep(&mut world.dead, id);
            }
        }
        "PUT /v1/queues/{name}" => {
            let name = body["name"].as_str().unwrap_or_default().to_string();
            match read_back(server, &format!("/v1/queues/{}", encode(&name))).await {
                Some(stored) if stored == body => {}
                stored => {
                    let fields = differing_fields(&body, stored.as_ref().unwrap_or(&Value::Null));
                    run.fail(
                        index,
                        req,
                        &format!("queue settings answer differs from what is stored in {fields}"),
                        format!("answered {body}\n  stored {stored:?}"),
                    )
                }
            }
        }
        "PUT /v1/schedules/{name}" => {
            let name = body["name"].as_str().unwrap_or_default().to_string();
            keep(&mut world.schedules, name.clone());
            // The definition must read back as answered (its run state may move on).
            let moving = [
                "revision",
                "due_after",
                "last_tick",
                "next_run_at",
                "last_run",
                "recent_runs",
                "updated_at",
                "created_at",
            ];
            match read_back(server, &format!("/v1/schedules/{}", encode(&name))).await {
                Some(stored) if without(&stored, &moving) == without(&body, &moving) => {}
                stored => run.fail(
                    index,
                    req,
                    "schedule answer differs from what is stored",
                    format!("answered {body}\n  stored {stored:?}"),
                ),
            }
        }
        "POST /v1/workers/heartbeat" => {
            let listed = read_back(server, "/v1/workers").await;
            let found = listed.as_ref().and_then(|l| {
                l["workers"]
                    .as_array()?
                    .iter()
                    .find(|w| w["id"] == body["id"])
                    .cloned()
            });
            if found.as_ref() != Some(&body) {
                run.fail(
                    index,
                    req,
                    "worker heartbeat answer differs from the registry",
                    format!("answered {body}\n  listed {found:?}"),
                );
            }
        }
        "POST /v1/tokens" => {
            if let Some(secret) = body["secret"].as_str() {
                keep(&mut world.secrets, secret.to_string());
            }
            for key in ["id", "name"] {
                if let Some(value) = body[key].as_str() {
                    keep(&mut world.tokens, value.to_string());
                }
            }
        }
        "POST /v1/session" => {
            if let Some(cookie) = answer.header("set-cookie") {
                if let Some(value) = cookie
                    .strip_prefix("conveyor_session=")
                    .and_then(|rest| rest.split(';').next())
                {
                    keep(&mut world.sessions, value.to_string());
                }
            }
        }
        _ => {}
    }
}
