//! Access control: who is calling, and whether their role may call this route.
//!
//! [`guard`] runs in front of every route. With access control off it lets everything through
//! as the anonymous admin (the audit log then says "anonymous"). With it on, it:
//! 1. lets through the public routes ([`RULES`]: `/healthz`, login, the dashboard's static
//!    files) without looking at credentials;
//! 2. authenticates the caller from `Authorization: Bearer <token>`, or else the
//!    `conveyor_session` cookie; missing, malformed, unknown, revoked or expired credentials
//!    answer 401 with `WWW-Authenticate: Bearer`;
//! 3. requires the `X-Conveyor-Csrf` header on state-changing requests authenticated by the
//!    cookie (a cross-site form cannot set a custom header; bearer tokens are never sent by a
//!    browser on its own, so they need no such check);
//! 4. checks the route's rule against the caller's role (403 when it does not allow it);
//! 5. applies the per-token enqueue rate limit (429 with `Retry-After`).
//!
//! The handlers then read the caller with the [`Caller`] extractor, for the audit log.
//!
//! A route without a rule in [`RULES`] is for admins only, so a route added without thinking
//! about access control is closed rather than open (and `tests/auth.rs` fails until it has one).

use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use conveyor_core::access::{
    parse_credential, secret_matches, Actor, NewAuditEntry, NewSession, TokenSecret,
    SESSION_PREFIX, TOKEN_PREFIX,
};
use conveyor_core::{ApiToken, AuditAction, Role};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use uuid::Uuid;

use crate::error::{ApiError, ApiResult};
use crate::extract::ApiJson;
use crate::AppState;

/// The browser session cookie set by `POST /v1/session`.
pub const SESSION_COOKIE: &str = "conveyor_session";
/// The header a cookie-authenticated request that changes state must carry (any value).
pub const CSRF_HEADER: &str = "x-conveyor-csrf";

/// Access control settings of the router.
#[derive(Debug, Clone)]
pub struct AuthOptions {
    /// Require credentials (see the module docs). Off: everyone acts as the anonymous admin.
    pub enabled: bool,
    /// Enqueue requests (`POST /v1/jobs` or `/v1/jobs/batch`; a batch counts once) each token
    /// may make per second, with bursts of up to one second's worth. `None`: no limit.
    pub enqueue_rate_per_token: Option<f64>,
    /// How long a browser session lasts after login.
    pub session_ttl: Duration,
}

impl Default for AuthOptions {
    fn default() -> Self {
        Self {
            enabled: false,
            enqueue_rate_per_token: None,
            session_ttl: Duration::from_secs(12 * 3600),
        }
    }
}

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, without credentials.
    Public,
    /// Any valid credentials, whatever the role.
    Authenticated,
    /// These roles (and admin, who may do everything).
    Roles(&'static [Role]),
}

const PRODUCER: Access = Access::Roles(&[Role::Producer]);
const WORKER: Access = Access::Roles(&[Role::Worker]);
const ADMIN: Access = Access::Roles(&[]);

/// Every route's rule, by method and the route's path as registered in the router. HEAD is
/// checked as GET.
pub const RULES: &[(Method, &str, Access)] = &[
    (Method::GET, "/healthz", Access::Public),
    (Method::GET, "/readyz", Access::Public),
    (Method::GET, "/livez", Access::Public),
    // What the server is and how to call it: nothing of the data.
    (Method::GET, "/version", Access::Public),
    (Method::GET, "/openapi.json", Access::Public),
    (Method::GET, "/docs", Access::Public),
    (Method::GET, "/", Access::Public),
    (Method::GET, "/ui/{*path}", Access::Public),
    (Method::POST, "/v1/session", Access::Public),
    (Method::GET, "/v1/session", Access::Authenticated),
    (Method::DELETE, "/v1/session", Access::Authenticated),
    // Producers enqueue jobs and read their own by id (jobs carry their enqueuing token's
    // owner tag; another producer's job answers 404). Listing every job is for operators.
    (Method::POST, "/v1/jobs", PRODUCER),
    (Method::POST, "/v1/jobs/batch", PRODUCER),
    // Producers list their own jobs (the server adds their owner tag to the search).
    (Method::GET, "/v1/jobs", PRODUCER),
    (Method::POST, "/v1/jobs/bulk", ADMIN),
    (Method::GET, "/v1/jobs/{id}", PRODUCER),
    (Method::POST, "/v1/jobs/{id}/cancel", ADMIN),
    // Producers create workflows and read, cancel and signal their own (flows carry their
    // creating token's owner tag; another producer's flow answers 404).
    (Method::POST, "/v1/flows", PRODUCER),
    (Method::GET, "/v1/flows", ADMIN),
    (Method::GET, "/v1/flows/{id}", PRODUCER),
    (Method::POST, "/v1/flows/{id}/cancel", PRODUCER),
    (Method::POST, "/v1/flows/{id}/signal", PRODUCER),
    // Workers take jobs and report on them.
    (Method::POST, "/v1/fetch", WORKER),
    (Method::POST, "/v1/ack", WORKER),
    (Method::POST, "/v1/heartbeat", WORKER),
    (Method::POST, "/v1/jobs/{id}/heartbeat", WORKER),
    (Method::POST, "/v1/jobs/{id}/complete", WORKER),
    (Method::POST, "/v1/jobs/{id}/fail", WORKER),
    (Method::POST, "/v1/jobs/{id}/release", WORKER),
    (Method::POST, "/v1/jobs/{id}/snooze", WORKER),
    (Method::POST, "/v1/jobs/{id}/progress", WORKER),
    (Method::POST, "/v1/workers/heartbeat", WORKER),
    // Counters and gauges hold no payloads: any token may read them (give a scraper the
    // least powerful one).
    (Method::GET, "/metrics", Access::Authenticated),
    // The scaling signal holds counts only: any token (give the autoscaler the least one).
    (
        Method::GET,
        "/v1/queues/{name}/scale",
        Access::Authenticated,
    ),
    // Operators.
    (Method::GET, "/v1/dead", ADMIN),
    (Method::POST, "/v1/dead/replay", ADMIN),
    (Method::DELETE, "/v1/dead/{id}", ADMIN),
    (Method::GET, "/v1/queues", ADMIN),
    (Method::GET, "/v1/jobs/stuck", ADMIN),
    (Method::GET, "/v1/workers", ADMIN),
    (Method::POST, "/v1/workers/{id}/quiet", ADMIN),
    (Method::POST, "/v1/workers/{id}/stop", ADMIN),
    (Method::POST, "/v1/workers/{id}/resume", ADMIN),
    (Method::GET, "/v1/queues/{name}", ADMIN),
    (Method::PUT, "/v1/queues/{name}", ADMIN),
    (Method::POST, "/v1/queues/{name}/circuit/open", ADMIN),
    (Method::POST, "/v1/queues/{name}/circuit/close", ADMIN),
    (Method::POST, "/v1/kinds/{kind}/circuit/open", ADMIN),
    (Method::POST, "/v1/kinds/{kind}/circuit/close", ADMIN),
    (Method::GET, "/v1/breakers", ADMIN),
    // History holds counts only, but of every queue and kind: operators (and viewers).
    (Method::GET, "/v1/stats", ADMIN),
    // Payload schemas: producers may read them (to check before sending); operators set them.
    (Method::GET, "/v1/kinds", PRODUCER),
    (Method::GET, "/v1/kinds/{kind}", PRODUCER),
    (Method::PUT, "/v1/kinds/{kind}", ADMIN),
    (Method::DELETE, "/v1/kinds/{kind}", ADMIN),
    (Method::GET, "/v1/sources", ADMIN),
    (Method::GET, "/v1/sources/{name}", ADMIN),
    (Method::PUT, "/v1/sources/{name}", ADMIN),
    (Method::DELETE, "/v1/sources/{name}", ADMIN),
    (Method::POST, "/v1/sources/{name}/pause", ADMIN),
    (Method::POST, "/v1/sources/{name}/resume", ADMIN),
    (Method::GET, "/v1/hooks", ADMIN),
    (Method::GET, "/v1/hooks/{name}", ADMIN),
    (Method::PUT, "/v1/hooks/{name}", ADMIN),
    (Method::DELETE, "/v1/hooks/{name}", ADMIN),
    (Method::POST, "/v1/events", PRODUCER),
    (Method::GET, "/v1/subscriptions", ADMIN),
    (Method::GET, "/v1/subscriptions/{name}", ADMIN),
    (Method::PUT, "/v1/subscriptions/{name}", ADMIN),
    (Method::DELETE, "/v1/subscriptions/{name}", ADMIN),
    // Named limits: operators set them (and viewers read them, with their usage).
    (Method::GET, "/v1/limits", ADMIN),
    (Method::GET, "/v1/limits/{name}", ADMIN),
    (Method::PUT, "/v1/limits/{name}", ADMIN),
    (Method::DELETE, "/v1/limits/{name}", ADMIN),
    // A provider's request: its signature, not a token, is its credential.
    (Method::POST, "/hooks/{name}", Access::Public),
    (Method::GET, "/v1/schedules", ADMIN),
    (Method::GET, "/v1/schedules/{name}", ADMIN),
    (Method::PUT, "/v1/schedules/{name}", ADMIN),
    (Method::DELETE, "/v1/schedules/{name}", ADMIN),
    (Method::GET, "/v1/schedules/{name}/runs", ADMIN),
    (Method::POST, "/v1/schedules/{name}/pause", ADMIN),
    (Method::POST, "/v1/schedules/{name}/resume", ADMIN),
    (Method::POST, "/v1/schedules/{name}/trigger", ADMIN),
    (Method::GET, "/v1/tokens", ADMIN),
    (Method::POST, "/v1/tokens", ADMIN),
    (Method::DELETE, "/v1/tokens/{token}", ADMIN),
    (Method::GET, "/v1/audit", ADMIN),
];

/// Routes whose calls count against the per-token enqueue rate.
const ENQUEUE_ROUTES: &[&str] = &["/v1/jobs", "/v1/jobs/batch"];

/// The rule for a request: its route's, or for an unmatched request (404) the dashboard's
/// static paths are public and anything else needs credentials. A route without a rule for
/// this method is admin-only, unless the route has rules for other methods (then the router
/// answers 405 to anyone authenticated).
pub fn rule_for(method: &Method, route: Option<&str>, path: &str) -> Access {
    let method = if method == Method::HEAD {
        &Method::GET
    } else {
        method
    };
    let Some(route) = route else {
        let dashboard = path == "/" || path == "/ui" || path.starts_with("/ui/");
        return if dashboard && method == Method::GET {
            Access::Public
        } else {
            Access::Authenticated
        };
    };
    let mut known_route = false;
    for (rule_method, rule_route, access) in RULES {
        if *rule_route == route {
            if rule_method == method {
                return *access;
            }
            known_route = true;
        }
    }
    if known_route {
        Access::Authenticated
    } else {
        ADMIN
    }
}

/// Per-router access control state.
pub(crate) struct AuthState {
    pub options: AuthOptions,
    buckets: Mutex<HashMap<Uuid, Bucket>>,
}

impl AuthState {
    pub fn new(options: AuthOptions) -> Self {
        Self {
            options,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one enqueue from `token`'s bucket; `Err(wait)` when it is empty.
    fn take_enqueue(&self, token: Uuid, now: Instant) -> Result<(), Duration> {
        let Some(rate) = self.options.enqueue_rate_per_token.filter(|r| *r > 0.0) else {
            return Ok(());
        };
        // One second's worth, and at least one request, so a rate below 1/s still works.
        let capacity = rate.max(1.0);
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let bucket = buckets.entry(token).or_insert(Bucket {
            tokens: capacity,
            at: now,
        });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(capacity);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.tokens) / rate))
        }
    }
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// How a request was authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Via {
    /// Access control is off.
    Anonymous,
    Bearer,
    Session(Uuid),
}

/// The authenticated caller, for handlers (the audit log) to read.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    pub actor: Actor,
    pub role: Role,
    pub via: Via,
}

impl Caller {
    fn anonymous() -> Self {
        Self {
            actor: Actor::anonymous(),
            role: Role::Admin,
            via: Via::Anonymous,
        }
    }

    fn of(token: &ApiToken, via: Via) -> Self {
        Self {
            actor: Actor::token(token),
            role: token.role,
            via,
        }
    }

    /// An audit entry of `action` by this caller.
    pub fn audit(&self, action: AuditAction) -> NewAuditEntry {
        NewAuditEntry::new(self.actor.clone(), action)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Infallible;

    /// Public routes run without a caller; they act as anonymous.
    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<Caller>()
            .cloned()
            .unwrap_or_else(Caller::anonymous))
    }
}

/// Why a request was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Denied {
    #[error("{0}")]
    Unauthorized(&'static str),
    #[error("{0}")]
    Forbidden(String),
    #[error("enqueue rate limit of this token exceeded; retry later")]
    RateLimited { retry_after: Duration },
}

impl IntoResponse for Denied {
    fn into_response(self) -> Response {
        let (status, code) = match &self {
            Denied::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Denied::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            Denied::RateLimited { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
        };
        let body = serde_json::json!({
            "error": {"code": code, "field": null, "message": self.to_string()}
        });
        let mut response = (status, Json(body)).into_response();
        let headers = response.headers_mut();
        match self {
            Denied::Unauthorized(_) => {
                headers.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"conveyor\""),
                );
            }
            Denied::RateLimited { retry_after } => {
                let secs = retry_after.as_secs_f64().ceil().max(1.0) as u64;
                headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
            }
            Denied::Forbidden(_) => {}
        }
        response
    }
}

/// The credentials a request carries, before they are checked.
enum Presented<'a> {
    Bearer(&'a str),
    Cookie(&'a str),
    None,
}

fn presented(headers: &HeaderMap) -> Result<Presented<'_>, Denied> {
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(Denied::Unauthorized(
                "the Authorization header must be \"Bearer <token>\"",
            ))?;
        return Ok(Presented::Bearer(token));
    }
    Ok(session_cookie(headers).map_or(Presented::None, Presented::Cookie))
}

/// The `conveyor_session` cookie's value, if the request has one.
fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value)
        .filter(|value| !value.is_empty())
}

const BAD_CREDENTIALS: &str = "missing, invalid, expired or revoked credentials";

/// The active token a bearer credential belongs to; `None` when there is none.
async fn token_of(state: &AppState, credential: &str) -> ApiResult<Option<ApiToken>> {
    let Some((id, secret)) = parse_credential(TOKEN_PREFIX, credential) else {
        return Ok(None);
    };
    Ok(state.store.token_get(id).await?.and_then(|stored| {
        (secret_matches(secret, &stored.secret_hash) && stored.token.is_active())
            .then_some(stored.token)
    }))
}

/// The active token behind a session cookie, with the session's id; `None` when there is none.
async fn session_of(state: &AppState, credential: &str) -> ApiResult<Option<(ApiToken, Uuid)>> {
    let Some((id, secret)) = parse_credential(SESSION_PREFIX, credential) else {
        return Ok(None);
    };
    Ok(state.store.session_get(id).await?.and_then(|session| {
        (secret_matches(secret, &session.secret_hash) && session.token.is_active())
            .then_some((session.token, session.id))
    }))
}

/// The middleware (see the module docs).
pub(crate) async fn guard(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    if !state.auth.options.enabled {
        request.extensions_mut().insert(Caller::anonymous());
        return next.run(request).await;
    }
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|matched| matched.as_str().to_string());
    let method = request.method().clone();
    let access = rule_for(&method, route.as_deref(), request.uri().path());
    if access == Access::Public {
        return next.run(request).await;
    }
    let caller = match authenticate(&state, request.headers()).await {
        Ok(caller) => caller,
        Err(response) => return response,
    };
    let safe = matches!(method, Method::GET | Method::HEAD | Method::OPTIONS);
    if matches!(caller.via, Via::Session(_))
        && !safe
        && !request.headers().contains_key(CSRF_HEADER)
    {
        return Denied::Forbidden(format!(
            "requests authenticated by the session cookie that change state must carry the \
             {CSRF_HEADER} header"
        ))
        .into_response();
    }
    if let Access::Roles(roles) = access {
        // A viewer reads whatever any role may read, and changes nothing.
        let viewer_reads = caller.role == Role::Viewer && safe;
        if caller.role != Role::Admin && !viewer_reads && !roles.contains(&caller.role) {
            let wanted: Vec<&str> = roles.iter().map(|r| r.as_str()).chain(["admin"]).collect();
            return Denied::Forbidden(format!(
                "token {:?} has role {}; {method} {} needs {}",
                caller.actor.name,
                caller.role,
                route.as_deref().unwrap_or(""),
                wanted.join(" or ")
            ))
            .into_response();
        }
    }
    if method == Method::POST
        && route
            .as_deref()
            .is_some_and(|r| ENQUEUE_ROUTES.contains(&r))
    {
        if let Some(token_id) = caller.actor.token_id {
            if let Err(retry_after) = state.auth.take_enqueue(token_id, Instant::now()) {
                return Denied::RateLimited { retry_after }.into_response();
            }
        }
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

async fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<Caller, Response> {
    let found = match presented(headers).map_err(IntoResponse::into_response)? {
        Presented::Bearer(token) => token_of(state, token)
            .await
            .map(|token| token.map(|token| Caller::of(&token, Via::Bearer))),
        Presented::Cookie(cookie) => session_of(state, cookie)
            .await
            .map(|session| session.map(|(token, id)| Caller::of(&token, Via::Session(id)))),
        Presented::None => Ok(None),
    };
    match found {
        Ok(Some(caller)) => Ok(caller),
        Ok(None) => Err(Denied::Unauthorized(BAD_CREDENTIALS).into_response()),
        // The store failed: 503, not 401, so a client does not drop a good token.
        Err(error) => Err(error.into_response()),
    }
}

// ----------------------------------------------------------------------------------------------
// Sessions: `POST/GET/DELETE /v1/session`.
// ----------------------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LoginRequest {
    token: String,
}

/// What `GET /v1/session` (and a login) answers: who the credentials are.
#[derive(Debug, Serialize)]
pub(crate) struct SessionView {
    name: String,
    role: Role,
    /// Whether the server requires credentials at all (false: everyone is the anonymous admin).
    auth_enabled: bool,
    /// When the session cookie expires (absent for bearer tokens and with access control off).
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// Checks a token and starts a browser session for it: sets the `conveyor_session` cookie.
pub(crate) async fn login(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<LoginRequest>,
) -> Result<Response, Response> {
    let token = match token_of(&state, request.token.trim()).await {
        Ok(Some(token)) => token,
        Ok(None) => return Err(Denied::Unauthorized("invalid or revoked token").into_response()),
        Err(error) => return Err(error.into_response()),
    };
    let secret = TokenSecret::generate(SESSION_PREFIX)
        .map_err(|e| ApiError::Internal(e.to_string()).into_response())?;
    let ttl = state.auth.options.session_ttl;
    let expires_at = state.clock.now()
        + chrono::Duration::from_std(ttl).unwrap_or_else(|_| chrono::Duration::hours(12));
    state
        .store
        .session_insert(NewSession {
            id: secret.id,
            secret_hash: secret.secret_hash.clone(),
            token_id: token.id,
            expires_at,
        })
        .await
        .map_err(|e| ApiError::from(e).into_response())?;
    let cookie = format!(
        "{SESSION_COOKIE}={}; HttpOnly; SameSite=Strict; Secure; Path=/; Max-Age={}",
        secret.plaintext,
        ttl.as_secs()
    );
    let view = SessionView {
        name: token.name,
        role: token.role,
        auth_enabled: state.auth.options.enabled,
        expires_at: Some(expires_at),
    };
    let mut response = (StatusCode::OK, Json(view)).into_response();
    let value = HeaderValue::from_str(&cookie)
        .map_err(|e| ApiError::Internal(e.to_string()).into_response())?;
    response.headers_mut().insert(header::SET_COOKIE, value);
    Ok(response)
}

pub(crate) async fn whoami(
    State(state): State<AppState>,
    caller: Caller,
) -> ApiResult<Json<SessionView>> {
    let expires_at = match caller.via {
        Via::Session(id) => state.store.session_get(id).await?.map(|s| s.expires_at),
        Via::Bearer | Via::Anonymous => None,
    };
    Ok(Json(SessionView {
        name: caller.actor.name,
        role: caller.role,
        auth_enabled: state.auth.options.enabled,
        expires_at,
    }))
}

/// Ends the session of the cookie (if the request came with one) and clears the cookie.
pub(crate) async fn logout(State(state): State<AppState>, caller: Caller) -> ApiResult<Response> {
    if let Via::Session(id) = caller.via {
        state.store.session_delete(id).await?;
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "conveyor_session=; HttpOnly; SameSite=Strict; Secure; Path=/; Max-Age=0",
        ),
    );
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_cover_public_paths_and_default_to_admin() {
        assert_eq!(
            rule_for(&Method::GET, Some("/healthz"), "/healthz"),
            Access::Public
        );
        assert_eq!(rule_for(&Method::HEAD, Some("/"), "/"), Access::Public);
        assert_eq!(rule_for(&Method::GET, None, "/ui/app.js"), Access::Public);
        assert_eq!(
            rule_for(&Method::POST, None, "/ui/app.js"),
            Access::Authenticated
        );
        assert_eq!(
            rule_for(&Method::GET, None, "/v1/nope"),
            Access::Authenticated
        );
        assert_eq!(
            rule_for(&Method::GET, Some("/v1/new-thing"), "/v1/new-thing"),
            ADMIN
        );
        assert_eq!(
            rule_for(&Method::PATCH, Some("/v1/jobs"), "/v1/jobs"),
            Access::Authenticated
        );
        assert_eq!(
            rule_for(&Method::POST, Some("/v1/jobs"), "/v1/jobs"),
            PRODUCER
        );
    }

    #[test]
    fn enqueue_bucket_refills_at_the_rate() {
        let auth = AuthState::new(AuthOptions {
            enqueue_rate_per_token: Some(2.0),
            ..AuthOptions::default()
        });
        let (token, start) = (Uuid::new_v4(), Instant::now());
        assert!(auth.take_enqueue(token, start).is_ok());
        assert!(auth.take_enqueue(token, start).is_ok());
        let wait = auth.take_enqueue(token, start).expect_err("burst spent");
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(500),
            "{wait:?}"
        );
        assert!(
            auth.take_enqueue(Uuid::new_v4(), start).is_ok(),
            "per token"
        );
        assert!(auth
            .take_enqueue(token, start + Duration::from_millis(500))
            .is_ok());
    }
}
