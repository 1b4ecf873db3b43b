//! Access control and the audit log over HTTP: a real SQLite store, the router with access
//! control on, and reqwest as the client.

mod common;

use common::{auth_with, TestServer};
use conveyor_core::Role;
use conveyor_server::{AuthOptions, ServerConfig};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// The test server with a token of each role.
struct Api {
    server: TestServer,
    producer: String,
    worker: String,
    admin: String,
    viewer: String,
}

impl std::ops::Deref for Api {
    type Target = TestServer;
    fn deref(&self) -> &TestServer {
        &self.server
    }
}

async fn start(auth: AuthOptions) -> Api {
    start_with(auth, ServerConfig::default()).await
}

async fn start_with(auth: AuthOptions, config: ServerConfig) -> Api {
    let server = TestServer::start_with_options(config, auth_with(auth)).await;
    Api {
        producer: server.token(Role::Producer, "producer-token").await,
        worker: server.token(Role::Worker, "worker-token").await,
        admin: server.token(Role::Admin, "admin-token").await,
        viewer: server.token(Role::Viewer, "viewer-token").await,
        server,
    }
}

fn enabled() -> AuthOptions {
    AuthOptions {
        enabled: true,
        ..AuthOptions::default()
    }
}

/// How a request authenticates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    Nobody,
    Producer,
    Worker,
    Admin,
    Viewer,
}

impl Api {
    fn secret(&self, who: Who) -> Option<&str> {
        match who {
            Who::Nobody => None,
            Who::Producer => Some(&self.producer),
            Who::Worker => Some(&self.worker),
            Who::Admin => Some(&self.admin),
            Who::Viewer => Some(&self.viewer),
        }
    }

    fn request(&self, method: Method, path: &str, who: Who) -> reqwest::RequestBuilder {
        let mut request = self.http.request(method, self.url(path));
        if let Some(secret) = self.secret(who) {
            request = request.bearer_auth(secret);
        }
        request
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        who: Who,
        body: Option<Value>,
    ) -> (StatusCode, Value, reqwest::header::HeaderMap) {
        let mut request = self.request(method, path, who);
        if let Some(body) = body {
            request = request.json(&body);
        }
        read(request.send().await.expect("send")).await
    }
}

async fn read(response: reqwest::Response) -> (StatusCode, Value, reqwest::header::HeaderMap) {
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.expect("body");
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value, headers)
}

/// Who may call a route, as this test expects it (written independently of the server's
/// `RULES`, so a wrong rule there fails here).
#[derive(Clone, Copy, Debug)]
enum Expect {
    Public,
    AnyToken,
    /// These roles and admin.
    Roles(&'static [Role]),
}

const PRODUCER: Expect = Expect::Roles(&[Role::Producer]);
const WORKER: Expect = Expect::Roles(&[Role::Worker]);
const ADMIN: Expect = Expect::Roles(&[]);

fn expected(method: &Method, route: &str) -> Option<Expect> {
    let m = method.as_str();
    Some(match (m, route) {
        ("GET", "/healthz")
        | ("GET", "/readyz")
        | ("GET", "/livez")
        | ("GET", "/version")
        | ("GET", "/openapi.json")
        | ("GET", "/docs")
        | ("GET", "/")
        | ("GET", "/ui/{*path}") => Expect::Public,
        ("POST", "/v1/session") => Expect::Public,
        // Its signature is its credential (a request with none is a 401 of its own).
        ("POST", "/hooks/{name}") => Expect::Public,
        ("GET", "/v1/session") | ("DELETE", "/v1/session") => Expect::AnyToken,
        ("GET", "/metrics") => Expect::AnyToken,
        ("GET", "/v1/queues/{name}/scale") => Expect::AnyToken,
        ("POST", "/v1/jobs") | ("POST", "/v1/jobs/batch") | ("POST", "/v1/events") => PRODUCER,
        ("GET", "/v1/subscriptions" | "/v1/subscriptions/{name}") => ADMIN,
        ("PUT" | "DELETE", "/v1/subscriptions/{name}") => ADMIN,
        ("GET", "/v1/limits" | "/v1/limits/{name}") => ADMIN,
        ("PUT" | "DELETE", "/v1/limits/{name}") => ADMIN,
        ("GET", "/v1/jobs/{id}") => PRODUCER,
        ("GET", "/v1/jobs") => PRODUCER,
        ("POST", "/v1/fetch")
        | ("POST", "/v1/ack")
        | ("POST", "/v1/heartbeat")
        | ("POST", "/v1/workers/heartbeat") => WORKER,
        (
            "POST",
            "/v1/jobs/{id}/heartbeat"
            | "/v1/jobs/{id}/complete"
            | "/v1/jobs/{id}/fail"
            | "/v1/jobs/{id}/release"
            | "/v1/jobs/{id}/snooze"
            | "/v1/jobs/{id}/progress",
        ) => WORKER,
        ("POST", "/v1/flows" | "/v1/flows/{id}/cancel" | "/v1/flows/{id}/signal") => PRODUCER,
        ("GET", "/v1/flows/{id}") => PRODUCER,
        ("GET", "/v1/flows") => ADMIN,
        ("POST", "/v1/jobs/{id}/cancel") => ADMIN,
        ("GET", "/v1/jobs/stuck" | "/v1/workers" | "/v1/dead" | "/v1/queues") => ADMIN,
        (
            "POST",
            "/v1/workers/{id}/quiet" | "/v1/workers/{id}/stop" | "/v1/workers/{id}/resume",
        ) => ADMIN,
        ("POST", "/v1/dead/replay") | ("DELETE", "/v1/dead/{id}") => ADMIN,
        ("GET" | "PUT", "/v1/queues/{name}") => ADMIN,
        ("POST", "/v1/queues/{name}/circuit/open" | "/v1/queues/{name}/circuit/close") => ADMIN,
        ("POST", "/v1/kinds/{kind}/circuit/open" | "/v1/kinds/{kind}/circuit/close") => ADMIN,
        ("GET", "/v1/breakers") => ADMIN,
        ("GET", "/v1/stats") => ADMIN,
        ("POST", "/v1/jobs/bulk") => ADMIN,
        ("GET", "/v1/kinds" | "/v1/kinds/{kind}") => PRODUCER,
        ("PUT" | "DELETE", "/v1/kinds/{kind}") => ADMIN,
        ("GET", "/v1/schedules" | "/v1/schedules/{name}/runs") => ADMIN,
        ("GET", "/v1/sources" | "/v1/sources/{name}") => ADMIN,
        ("PUT" | "DELETE", "/v1/sources/{name}") => ADMIN,
        ("POST", "/v1/sources/{name}/pause" | "/v1/sources/{name}/resume") => ADMIN,
        ("GET", "/v1/hooks" | "/v1/hooks/{name}") => ADMIN,
        ("PUT" | "DELETE", "/v1/hooks/{name}") => ADMIN,
        (
            "POST",
            "/v1/schedules/{name}/pause"
            | "/v1/schedules/{name}/resume"
            | "/v1/schedules/{name}/trigger",
        ) => ADMIN,
        ("GET" | "PUT" | "DELETE", "/v1/schedules/{name}") => ADMIN,
        ("GET" | "POST", "/v1/tokens") | ("DELETE", "/v1/tokens/{token}") => ADMIN,
        ("GET", "/v1/audit") => ADMIN,
        _ => return None,
    })
}

/// Every route path registered anywhere in the server's source (`.route("PATH", ...)`), so
/// a route added later is probed too.
fn routes_in_source() -> BTreeSet<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut routes = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.extension().is_none_or(|ext| ext != "rs") {
            continue;
        }
        let source = std::fs::read_to_string(&path).expect("read source");
        for (at, _) in source.match_indices(".route(") {
            let rest = source[at + ".route(".len()..].trim_start();
            if let Some(literal) = rest.strip_prefix('"') {
                if let Some(end) = literal.find('"') {
                    routes.insert(literal[..end].to_string());
                }
            }
        }
    }
    assert!(routes.contains("/v1/jobs"), "found routes: {routes:?}");
    routes
}

/// A concrete path for a route pattern: a fresh UUID for `{id}`, a plain name elsewhere.
fn concrete(route: &str) -> String {
    route
        .split('/')
        .map(|segment| match segment {
            "{id}" => uuid::Uuid::new_v4().to_string(),
            s if s.starts_with("{*") => "app.js".to_string(),
            s if s.starts_with('{') => "probe".to_string(),
            s => s.to_string(),
        })
        .collect::<Vec<_>>()
        .join("/")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_each_role_as_its_rule_says() {
    let api = start(enabled()).await;
    let methods = [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
    ];
    let mut missing = Vec::new();
    let mut checked = 0;
    for route in routes_in_source() {
        for method in &methods {
            let path = concrete(&route);
            // An admin passes every rule, so 405 means the route has no such method.
            let (status, _, _) = api
                .send(method.clone(), &path, Who::Admin, Some(json!({})))
                .await;
            if status == StatusCode::METHOD_NOT_ALLOWED {
                continue;
            }
            let Some(expect) = expected(method, &route) else {
                missing.push(format!("{method} {route}"));
                continue;
            };
            for who in [
                Who::Nobody,
                Who::Producer,
                Who::Worker,
                Who::Admin,
                Who::Viewer,
            ] {
                let (status, body, headers) =
                    api.send(method.clone(), &path, who, Some(json!({}))).await;
                let what = format!("{method} {path} as {who:?}: {status} {body}");
                let allowed = match (expect, who) {
                    (Expect::Public, _) => true,
                    (_, Who::Nobody) => {
                        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}");
                        assert_eq!(body["error"]["code"], "unauthorized", "{what}");
                        let challenge = headers
                            .get("www-authenticate")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default();
                        assert!(challenge.starts_with("Bearer"), "{what}: {challenge:?}");
                        continue;
                    }
                    (Expect::AnyToken, _) | (_, Who::Admin) => true,
                    (Expect::Roles(roles), Who::Producer) => roles.contains(&Role::Producer),
                    (Expect::Roles(roles), Who::Worker) => roles.contains(&Role::Worker),
                    // A viewer reads whatever any role may read and changes nothing.
                    (Expect::Roles(_), Who::Viewer) => *method == Method::GET,
                };
                if allowed {
                    assert!(
                        status != StatusCode::UNAUTHORIZED
                            && status != StatusCode::FORBIDDEN
                            && !status.is_server_error(),
                        "{what}"
                    );
                } else {
                    assert_eq!(status, StatusCode::FORBIDDEN, "{what}");
                    assert_eq!(body["error"]["code"], "forbidden", "{what}");
                }
                checked += 1;
            }
        }
    }
    assert!(
        missing.is_empty(),
        "routes without an expectation in this test (add one, and a rule in auth::RULES): \
         {missing:?}"
    );
    assert!(checked >= 100, "only {checked} checks ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_calls_succeed_end_to_end() {
    let api = start(enabled()).await;
    let (status, job, _) = api
        .send(
            Method::POST,
            "/v1/jobs",
            Who::Producer,
            Some(json!({"kind": "mail", "queue": "q"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    let id = job["id"].as_str().expect("id").to_string();
    let (status, _, _) = api
        .send(Method::GET, &format!("/v1/jobs/{id}"), Who::Producer, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, fetched, _) = api
        .send(
            Method::POST,
            "/v1/fetch",
            Who::Worker,
            Some(json!({"worker_id": "w", "queues": ["q"]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{fetched}");
    let lease = fetched["jobs"][0]["lease_token"].as_str().expect("lease");
    let (status, _, _) = api
        .send(
            Method::POST,
            &format!("/v1/jobs/{id}/complete"),
            Who::Worker,
            Some(json!({"lease_token": lease})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, queues, _) = api.send(Method::GET, "/v1/queues", Who::Admin, None).await;
    assert_eq!(status, StatusCode::OK, "{queues}");
    let (status, _, _) = api.send(Method::GET, "/healthz", Who::Nobody, None).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_unknown_and_revoked_tokens_are_unauthorized() {
    let api = start(enabled()).await;
    let forged = format!("cv_{}_{}", uuid::Uuid::new_v4().simple(), "0".repeat(64));
    // The producer token's id with a wrong secret.
    let tampered = format!("{}0", &api.producer[..api.producer.len() - 1]);
    let tampered = if tampered == api.producer {
        format!("{}1", &api.producer[..api.producer.len() - 1])
    } else {
        tampered
    };
    for bad in ["nonsense", forged.as_str(), tampered.as_str()] {
        let response = api
            .http
            .get(api.url("/v1/jobs"))
            .bearer_auth(bad)
            .send()
            .await
            .expect("send");
        let (status, body, _) = read(response).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{bad}: {body}");
    }
    let response = api
        .http
        .get(api.url("/v1/jobs"))
        .header("authorization", "Basic YWRtaW46YWRtaW4=")
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);

    let (status, _, _) = api
        .send(Method::GET, "/v1/session", Who::Producer, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, revoked, _) = api
        .send(
            Method::DELETE,
            "/v1/tokens/producer-token",
            Who::Admin,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{revoked}");
    assert!(revoked["revoked_at"].is_string(), "{revoked}");
    let (status, body, _) = api
        .send(Method::GET, "/v1/session", Who::Producer, None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, _, _) = api
        .send(
            Method::DELETE,
            "/v1/tokens/producer-token",
            Who::Admin,
            None,
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "no active token of that name"
    );
}

/// The `conveyor_session` cookie of a login response.
fn session_cookie(headers: &reqwest::header::HeaderMap) -> String {
    let set = headers
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .expect("set-cookie");
    for attribute in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/"] {
        assert!(set.contains(attribute), "{attribute} missing in {set}");
    }
    let pair = set.split(';').next().expect("cookie pair");
    assert!(pair.starts_with("conveyor_session=cvs_"), "{set}");
    pair.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_cookie_login_whoami_csrf_and_logout() {
    let api = start(enabled()).await;
    let login = |token: String| {
        api.http
            .post(api.url("/v1/session"))
            .json(&json!({"token": token}))
            .send()
    };
    let (status, body, _) = read(login("cv_wrong".into()).await.expect("send")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");

    let (status, body, headers) = read(login(api.admin.clone()).await.expect("send")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["name"], "admin-token");
    assert_eq!(body["role"], "admin");
    let cookie = session_cookie(&headers);
    assert!(!cookie.contains(&api.admin), "the cookie is not the token");

    let with_cookie = |method: Method, path: &str| {
        api.http
            .request(method, api.url(path))
            .header("cookie", cookie.clone())
    };
    let (status, me, _) = read(
        with_cookie(Method::GET, "/v1/session")
            .send()
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(me["name"], "admin-token");
    assert_eq!(me["auth_enabled"], true);
    assert!(me["expires_at"].is_string(), "{me}");
    let (status, _, _) = read(
        with_cookie(Method::GET, "/v1/queues")
            .send()
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "reads need no CSRF header");

    // A state change by cookie needs the CSRF header; the same with the header passes.
    let pause = json!({"paused": true});
    let (status, body, _) = read(
        with_cookie(Method::PUT, "/v1/queues/mail")
            .json(&pause)
            .send()
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("x-conveyor-csrf")),
        "{body}"
    );
    let settings = api
        .store
        .queue_settings_get("mail")
        .await
        .expect("settings");
    assert!(!settings.paused, "the refused request changed nothing");
    let (status, body, _) = read(
        with_cookie(Method::PUT, "/v1/queues/mail")
            .header("x-conveyor-csrf", "1")
            .json(&pause)
            .send()
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Bearer tokens need no CSRF header.
    let (status, _, _) = api
        .send(
            Method::PUT,
            "/v1/queues/mail",
            Who::Admin,
            Some(json!({"paused": false})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let audit = api
        .store
        .audit_list(Default::default())
        .await
        .expect("audit");
    assert_eq!(audit[0].actor, "admin-token", "{audit:?}");
    assert_eq!(
        audit[1].actor, "admin-token",
        "cookie calls act as the token"
    );

    // Logout needs the header too, then the cookie stops working.
    let (status, _, _) = read(
        with_cookie(Method::DELETE, "/v1/session")
            .send()
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let response = with_cookie(Method::DELETE, "/v1/session")
        .header("x-conveyor-csrf", "1")
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let cleared = response
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(cleared.contains("Max-Age=0"), "{cleared}");
    let (status, _, _) = read(
        with_cookie(Method::GET, "/v1/session")
            .send()
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_a_token_ends_its_sessions() {
    let api = start(enabled()).await;
    let response = api
        .http
        .post(api.url("/v1/session"))
        .json(&json!({"token": api.producer}))
        .send()
        .await
        .expect("send");
    let cookie = session_cookie(response.headers());
    let whoami = || {
        api.http
            .get(api.url("/v1/session"))
            .header("cookie", cookie.clone())
            .send()
    };
    assert_eq!(whoami().await.expect("send").status(), StatusCode::OK);
    let (status, _, _) = api
        .send(
            Method::DELETE,
            "/v1/tokens/producer-token",
            Who::Admin,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        whoami().await.expect("send").status(),
        StatusCode::UNAUTHORIZED
    );
}

/// Fetches from queue `q` and fails what comes back for good until `dead_id` is dead.
async fn kill(api: &Api, dead_id: &str) {
    loop {
        let (_, fetched, _) = api
            .send(
                Method::POST,
                "/v1/fetch",
                Who::Worker,
                Some(json!({"worker_id": "w", "queues": ["q"], "max": 10})),
            )
            .await;
        let jobs = fetched["jobs"].as_array().cloned().unwrap_or_default();
        assert!(!jobs.is_empty(), "the job to kill is available");
        for job in jobs {
            let id = job["id"].as_str().expect("id");
            let lease = job["lease_token"].as_str().expect("lease");
            let failure =
                json!({"lease_token": lease, "error": {"message": "boom"}, "retry": "never"});
            let (status, _, _) = api
                .send(
                    Method::POST,
                    &format!("/v1/jobs/{id}/fail"),
                    Who::Worker,
                    Some(failure),
                )
                .await;
            assert_eq!(status, StatusCode::OK);
            if id == dead_id {
                return;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_action_is_audited_without_payloads() {
    let api = start(enabled()).await;
    let secret_payload = "s3cr3t-payload-value-7f1c";
    let (status, job, _) = api
        .send(
            Method::POST,
            "/v1/jobs",
            Who::Producer,
            Some(json!({"kind": "mail", "queue": "q", "payload": {"card": secret_payload}})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let first = job["id"].as_str().expect("id").to_string();
    let (status, batch, _) = api
        .send(
            Method::POST,
            "/v1/jobs/batch",
            Who::Producer,
            Some(json!({"jobs": [
                {"kind": "mail", "queue": "q", "payload": {"card": secret_payload}},
                {"kind": "mail", "queue": "q", "max_attempts": 1}
            ]})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{batch}");
    let (status, _, _) = api
        .send(
            Method::POST,
            &format!("/v1/jobs/{first}/cancel"),
            Who::Admin,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    // Send the single-attempt job to the dead-letter queue, replay it, kill it, discard it.
    let dead_id = batch["ids"][1].as_str().expect("id").to_string();
    kill(&api, &dead_id).await;
    let (status, _, _) = api
        .send(
            Method::POST,
            "/v1/dead/replay",
            Who::Admin,
            Some(json!({"ids": [dead_id]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    kill(&api, &dead_id).await;
    let (status, _, _) = api
        .send(
            Method::DELETE,
            &format!("/v1/dead/{dead_id}"),
            Who::Admin,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    for body in [
        json!({"paused": true}),
        json!({"paused": false, "max_depth": 10}),
    ] {
        let (status, _, _) = api
            .send(Method::PUT, "/v1/queues/q", Who::Admin, Some(body))
            .await;
        assert_eq!(status, StatusCode::OK);
    }
    let (status, view, _) = api
        .send(
            Method::PUT,
            "/v1/schedules/nightly",
            Who::Admin,
            Some(json!({"cron": "0 3 * * *", "job": {"kind": "report", "payload": {"card": secret_payload}}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{view}");
    let (status, _, _) = api
        .send(Method::DELETE, "/v1/schedules/nightly", Who::Admin, None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, created, _) = api
        .send(
            Method::POST,
            "/v1/tokens",
            Who::Admin,
            Some(json!({"role": "worker", "name": "ci"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let new_secret = created["secret"].as_str().expect("secret").to_string();
    let (status, _, _) = api
        .send(Method::DELETE, "/v1/tokens/ci", Who::Admin, None)
        .await;
    assert_eq!(status, StatusCode::OK);

    let (status, page, _) = api
        .send(Method::GET, "/v1/audit?limit=100", Who::Admin, None)
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let entries = page["entries"].as_array().expect("entries");
    let actions: Vec<&str> = entries
        .iter()
        .rev()
        .map(|e| e["action"].as_str().expect("action"))
        .collect();
    assert_eq!(
        actions,
        [
            // The four tokens made by the test's setup.
            "token.create",
            "token.create",
            "token.create",
            "token.create",
            "job.enqueue",
            "job.enqueue",
            "job.cancel",
            "dead.replay",
            "dead.discard",
            "queue.settings",
            "queue.settings",
            "schedule.put",
            "schedule.delete",
            "token.create",
            "token.revoke",
        ]
    );
    let by_action = |action: &str| -> Vec<Value> {
        entries
            .iter()
            .filter(|e| e["action"] == action)
            .cloned()
            .collect()
    };
    let enqueues = by_action("job.enqueue");
    assert_eq!(enqueues[1]["actor"], "producer-token");
    assert_eq!(enqueues[1]["job_ids"], json!([first]));
    assert_eq!(enqueues[1]["target"], "q");
    assert_eq!(enqueues[0]["job_ids"], batch["ids"], "one entry per batch");
    assert_eq!(enqueues[0]["job_count"], 2);
    assert_eq!(by_action("job.cancel")[0]["actor"], "admin-token");
    assert_eq!(by_action("dead.replay")[0]["job_ids"], json!([dead_id]));
    assert_eq!(by_action("dead.discard")[0]["job_ids"], json!([dead_id]));
    let paused = by_action("queue.settings")[1]["detail"]
        .as_str()
        .expect("detail")
        .to_string();
    assert!(paused.contains("\"paused\":true"), "{paused}");
    assert_eq!(by_action("schedule.delete")[0]["target"], "nightly");
    assert_eq!(by_action("token.revoke")[0]["target"], "ci");

    let text = serde_json::to_string(&page).expect("json");
    assert!(
        !text.contains(secret_payload),
        "a payload leaked into the audit log: {text}"
    );
    assert!(
        !text.contains(&new_secret[3..]),
        "a token secret leaked into the audit log"
    );
    for secret in [&api.producer, &api.worker, &api.admin] {
        let raw = secret.rsplit('_').next().expect("secret part");
        assert!(
            !text.contains(raw),
            "a token secret leaked into the audit log"
        );
    }

    // Filters and paging.
    let (_, filtered, _) = api
        .send(
            Method::GET,
            "/v1/audit?action=job.enqueue",
            Who::Admin,
            None,
        )
        .await;
    assert_eq!(filtered["entries"].as_array().expect("entries").len(), 2);
    let (_, first_page, _) = api
        .send(Method::GET, "/v1/audit?limit=2", Who::Admin, None)
        .await;
    let next = first_page["next"]
        .as_i64()
        .expect("a full page has a cursor");
    let (_, second_page, _) = api
        .send(
            Method::GET,
            &format!("/v1/audit?limit=2&before={next}"),
            Who::Admin,
            None,
        )
        .await;
    assert_eq!(second_page["entries"][0]["action"], "schedule.delete");
    let (status, body, _) = api
        .send(Method::GET, "/v1/audit?action=bogus", Who::Admin, None)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["field"], "action");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_rate_is_limited_per_token() {
    let api = start(AuthOptions {
        enabled: true,
        // One request, refilled after 20 minutes: the test never sees a refill.
        enqueue_rate_per_token: Some(1.0 / 1200.0),
        ..AuthOptions::default()
    })
    .await;
    let job = json!({"kind": "mail"});
    let (status, _, _) = api
        .send(Method::POST, "/v1/jobs", Who::Producer, Some(job.clone()))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body, headers) = api
        .send(Method::POST, "/v1/jobs", Who::Producer, Some(job.clone()))
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["code"], "rate_limited");
    let retry_after: u64 = headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("Retry-After in seconds");
    assert!(retry_after >= 1, "{retry_after}");
    // Batches count too; other tokens have buckets of their own; reads are not limited.
    let (status, _, _) = api
        .send(
            Method::POST,
            "/v1/jobs/batch",
            Who::Producer,
            Some(json!({"jobs": [job.clone()]})),
        )
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let (status, _, _) = api
        .send(Method::POST, "/v1/jobs", Who::Admin, Some(job.clone()))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _, _) = api
        .send(Method::GET, "/v1/session", Who::Producer, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let stored = api.store.jobs_list({
        let mut params = conveyor_core::JobListParams::default();
        params.limit = 10;
        params
    });
    assert_eq!(
        stored.await.expect("list").len(),
        2,
        "refused enqueues stored nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_access_control_off_everything_is_open_and_audited_as_anonymous() {
    let api = start(AuthOptions::default()).await;
    let (status, job, _) = api
        .send(
            Method::POST,
            "/v1/jobs",
            Who::Nobody,
            Some(json!({"kind": "mail"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let id = job["id"].as_str().expect("id");
    let (status, _, _) = api
        .send(
            Method::POST,
            &format!("/v1/jobs/{id}/cancel"),
            Who::Nobody,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, me, _) = api
        .send(Method::GET, "/v1/session", Who::Nobody, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        me,
        json!({"name": "anonymous", "role": "admin", "auth_enabled": false})
    );
    let (status, page, _) = api.send(Method::GET, "/v1/audit", Who::Nobody, None).await;
    assert_eq!(status, StatusCode::OK);
    let latest = &page["entries"][0];
    assert_eq!(latest["action"], "job.cancel");
    assert_eq!(latest["actor"], "anonymous");
    assert_eq!(latest["actor_token_id"], Value::Null);
}

/// A producer reads the jobs it enqueued and no one else's (another's answers 404, as if it
/// did not exist); admins read all; callers cannot forge the owner tag.
#[tokio::test]
async fn producers_read_only_their_own_jobs() {
    let api = start(enabled()).await;
    // A second producer token.
    let other = api.token(Role::Producer, "other-producer").await;
    let (status, mine, _) = api
        .send(
            Method::POST,
            "/v1/jobs",
            Who::Producer,
            Some(json!({"kind": "report"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{mine}");
    let id = mine["id"].as_str().expect("id").to_string();
    let path = format!("/v1/jobs/{id}");
    let (status, read, _) = api.send(Method::GET, &path, Who::Producer, None).await;
    assert_eq!(
        (status, read["id"].as_str()),
        (StatusCode::OK, Some(id.as_str()))
    );
    let response = api
        .http
        .get(api.url(&path))
        .bearer_auth(&other)
        .send()
        .await
        .expect("send");
    assert_eq!(
        response.status(),
        StatusCode::NOT_FOUND,
        "not another producer's"
    );
    let (status, _, _) = api.send(Method::GET, &path, Who::Admin, None).await;
    assert_eq!(status, StatusCode::OK);
    // Listing: a producer sees its own jobs only; the other producer none of them.
    let (_, admins, _) = api
        .send(
            Method::POST,
            "/v1/jobs",
            Who::Admin,
            Some(json!({"kind": "report"})),
        )
        .await;
    let (status, listed, _) = api.send(Method::GET, "/v1/jobs", Who::Producer, None).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let listed_ids: Vec<&str> = listed["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .filter_map(|j| j["id"].as_str())
        .collect();
    assert_eq!(listed_ids, vec![id.as_str()], "not the admin's {admins}");
    let theirs: Value = api
        .http
        .get(api.url("/v1/jobs"))
        .bearer_auth(&other)
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("JSON");
    assert_eq!(theirs["jobs"], json!([]), "nothing of another producer's");
    let (status, refused, _) = api
        .send(Method::GET, "/v1/jobs?tag=x", Who::Producer, None)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert_eq!(refused["error"]["field"], "tag");
    // Owner tags cannot be supplied, in a single enqueue or a batch.
    let forged = json!({"kind": "report", "tags": ["conveyor:owner:someone"]});
    let (status, error, _) = api
        .send(
            Method::POST,
            "/v1/jobs",
            Who::Producer,
            Some(forged.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error["error"]["field"], "tags");
    let (status, error, _) = api
        .send(
            Method::POST,
            "/v1/jobs/batch",
            Who::Producer,
            Some(json!({"jobs": [{"kind": "ok"}, forged]})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error["error"]["field"], "jobs[1].tags");
}

/// A duplicate found through another producer's idempotency key or unique spec answers only
/// the id and `duplicate: true`: never that producer's payload, kind or tags. A producer's own
/// enqueue answer is redacted like its `GET`.
#[tokio::test]
async fn a_duplicate_never_reveals_another_producers_job() {
    let config = ServerConfig {
        sensitive_fields: vec!["secret".to_string()],
        ..ServerConfig::default()
    };
    let api = start_with(enabled(), config).await;
    let other = api.token(Role::Producer, "producer-b").await;
    let as_other = |body: Value| {
        let request = api
            .http
            .post(api.url("/v1/jobs"))
            .bearer_auth(&other)
            .json(&body);
        async move { read(request.send().await.expect("send")).await }
    };
    let charge = json!({"kind": "charge", "idempotency_key": "order-1001",
        "payload": {"user": 7, "secret": "hunter2"}});
    let (status, mine, _) = api
        .send(
            Method::POST,
            "/v1/jobs",
            Who::Producer,
            Some(charge.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{mine}");
    assert_eq!(mine["payload"]["secret"], "[redacted]", "{mine}");
    let id = mine["id"].clone();

    // The owner enqueuing again sees its own (redacted) job.
    let (status, again, _) = api
        .send(Method::POST, "/v1/jobs", Who::Producer, Some(charge))
        .await;
    assert_eq!((status, &again["id"]), (StatusCode::OK, &id));
    assert_eq!(again["duplicate"], true);
    assert_eq!(again["payload"]["secret"], "[redacted]", "{again}");

    // Producer B through the same key: the id and `duplicate`, nothing else.
    let (status, foreign, _) =
        as_other(json!({"kind": "other", "idempotency_key": "order-1001"})).await;
    assert_eq!(status, StatusCode::OK, "{foreign}");
    assert_eq!(foreign, json!({"id": id, "duplicate": true}));
    assert!(!foreign.to_string().contains("hunter2"));

    // The same through a unique spec on the `user` field.
    let unique = json!({"kind": "profile", "payload": {"user": 9, "secret": "swordfish"},
        "unique": {"args": ["user"]}});
    let (status, first, _) = api
        .send(Method::POST, "/v1/jobs", Who::Producer, Some(unique))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let (status, foreign, _) = as_other(json!({"kind": "profile",
        "payload": {"user": 9}, "unique": {"args": ["user"]}}))
    .await;
    assert_eq!(status, StatusCode::OK, "{foreign}");
    assert_eq!(foreign, json!({"id": first["id"], "duplicate": true}));
    assert!(!foreign.to_string().contains("swordfish"));

    // An admin still sees the whole job (redacted) when it hits a duplicate.
    let (status, admin_view, _) = api
        .send(
            Method::POST,
            "/v1/jobs",
            Who::Admin,
            Some(json!({"kind": "other", "idempotency_key": "order-1001"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(admin_view["kind"], "charge");
    assert_eq!(admin_view["payload"]["secret"], "[redacted]");
}
