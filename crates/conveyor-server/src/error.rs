//! The API's error type and its JSON shape:
//! `{"error": {"code": "...", "field": "name-or-null", "message": "..."}}`.

use crate::api::{ErrorDetail, ErrorResponse};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use conveyor_core::{StoreError, ValidationError};
use uuid::Uuid;

/// Everything a handler can answer with instead of success.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: a request field is missing, malformed or out of range.
    #[error("invalid {field}: {message}")]
    Invalid { field: String, message: String },
    /// 413: the body, or one field of it (a payload), is larger than allowed.
    #[error("{field} too large: {message}")]
    TooLarge { field: String, message: String },
    /// 404: no such job (or no dead job, for discard).
    #[error("job {0} not found")]
    JobNotFound(Uuid),
    /// 404: no such workflow.
    #[error("flow {0} not found")]
    FlowNotFound(Uuid),
    /// 404: no such cron schedule.
    #[error("schedule {0:?} not found")]
    ScheduleNotFound(String),
    /// 404: no such registered worker.
    #[error("worker {0:?} is not registered")]
    WorkerNotFound(String),
    /// 404: no such kind settings.
    #[error("kind {0:?} has no settings")]
    KindNotFound(String),
    /// 409: a schema that queued jobs of its kind would not pass, set without `force`.
    #[error("{message}")]
    SchemaRejectsQueued { would_fail: u64, message: String },
    /// 404: no such event source on this server.
    #[error("source {0:?} not found")]
    SourceNotFound(String),
    /// 404: no such webhook.
    #[error("hook {0:?} not found")]
    HookNotFound(String),
    /// 404: no such subscription.
    #[error("subscription {0:?} not found")]
    SubscriptionNotFound(String),
    /// 404: no such named limit.
    #[error("limit {0:?} not found")]
    LimitNotFound(String),
    /// 409: a named limit that queue or kind settings still name, asked to be deleted.
    #[error("{0}")]
    LimitInUse(String),
    /// 401: a webhook request whose signature is missing, wrong or stale.
    #[error("{0}")]
    BadSignature(String),
    /// 503: a hook whose secret this server cannot read (its `secret_env` is not set here); the
    /// provider retries later. The variable's name is logged, not returned.
    #[error("hook {0:?} cannot verify signatures on this server")]
    HookUnavailable(String),
    /// 404: no such API token.
    #[error("token {0:?} not found")]
    TokenNotFound(String),
    /// 404: no such route.
    #[error("no route for {method} {path}")]
    RouteNotFound { method: String, path: String },
    /// 405: the route exists but not for this method.
    #[error("method {method} not allowed for {path}")]
    MethodNotAllowed { method: String, path: String },
    /// 409: the caller's lease no longer holds.
    #[error("lease lost for job {0}: it was rescued, cancelled or already finished")]
    LeaseLost(Uuid),
    /// 409: the job is in a state where the change does not apply.
    #[error("{0}")]
    Conflict(String),
    /// 429: back-pressure; the queue (or tenant) is at its maximum depth. Sent with
    /// `Retry-After` (whole seconds).
    #[error("{message}")]
    QueueFull {
        /// `queue`, or `tenant` when the tenant's share of the queue is what is full.
        field: &'static str,
        message: String,
        retry_after_secs: u64,
    },
    /// 503: the store failed (details are logged, not returned).
    #[error("store unavailable: {0}")]
    StoreUnavailable(String),
    /// 500: a broken invariant on the server side (details are logged).
    #[error("internal error: {0}")]
    Internal(String),
    /// 408: the request (its body upload included) took longer than the server allows.
    #[error("the request took longer than {} s", .0.as_secs())]
    RequestTimeout(std::time::Duration),
}

impl ApiError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }

    pub fn too_large(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::TooLarge {
            field: field.into(),
            message: message.into(),
        }
    }

    /// Prefixes the field name, e.g. `kind` → `jobs[3].kind`.
    pub(crate) fn within(self, prefix: &str) -> Self {
        match self {
            ApiError::Invalid { field, message } => ApiError::Invalid {
                field: join_field(prefix, &field),
                message,
            },
            ApiError::TooLarge { field, message } => ApiError::TooLarge {
                field: join_field(prefix, &field),
                message,
            },
            other => other,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Invalid { .. } => StatusCode::BAD_REQUEST,
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::JobNotFound(_)
            | ApiError::FlowNotFound(_)
            | ApiError::ScheduleNotFound(_)
            | ApiError::SourceNotFound(_)
            | ApiError::HookNotFound(_)
            | ApiError::SubscriptionNotFound(_)
            | ApiError::LimitNotFound(_)
            | ApiError::WorkerNotFound(_)
            | ApiError::TokenNotFound(_)
            | ApiError::KindNotFound(_)
            | ApiError::RouteNotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::BadSignature(_) => StatusCode::UNAUTHORIZED,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::LeaseLost(_)
            | ApiError::Conflict(_)
            | ApiError::SchemaRejectsQueued { .. }
            | ApiError::LimitInUse(_) => StatusCode::CONFLICT,
            ApiError::QueueFull { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::StoreUnavailable(_) | ApiError::HookUnavailable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
        }
    }

    /// The stable, machine-readable `error.code`.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Invalid { .. } => "invalid_request",
            ApiError::TooLarge { .. } => "payload_too_large",
            ApiError::JobNotFound(_)
            | ApiError::FlowNotFound(_)
            | ApiError::ScheduleNotFound(_)
            | ApiError::SourceNotFound(_)
            | ApiError::HookNotFound(_)
            | ApiError::SubscriptionNotFound(_)
            | ApiError::LimitNotFound(_)
            | ApiError::WorkerNotFound(_)
            | ApiError::TokenNotFound(_)
            | ApiError::KindNotFound(_)
            | ApiError::RouteNotFound { .. } => "not_found",
            ApiError::BadSignature(_) => "bad_signature",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::LeaseLost(_) => "lease_lost",
            ApiError::Conflict(_) => "conflict",
            ApiError::SchemaRejectsQueued { .. } => "schema_rejects_queued_jobs",
            ApiError::LimitInUse(_) => "limit_in_use",
            ApiError::QueueFull { .. } => "queue_full",
            ApiError::StoreUnavailable(_) => "store_unavailable",
            ApiError::HookUnavailable(_) => "hook_unavailable",
            ApiError::Internal(_) => "internal",
            ApiError::RequestTimeout(_) => "request_timeout",
        }
    }

    /// The field at fault, if any.
    pub fn field(&self) -> Option<&str> {
        match self {
            ApiError::Invalid { field, .. } | ApiError::TooLarge { field, .. } => Some(field),
            ApiError::QueueFull { field, .. } => Some(field),
            ApiError::SchemaRejectsQueued { .. } => Some("schema"),
            _ => None,
        }
    }

    fn public_message(&self) -> String {
        match self {
            ApiError::Invalid { message, .. } | ApiError::TooLarge { message, .. } => {
                message.clone()
            }
            ApiError::StoreUnavailable(_) => {
                "the job store is unavailable; retry later".to_string()
            }
            ApiError::Internal(_) => "internal server error".to_string(),
            other => other.to_string(),
        }
    }
}

pub(crate) use conveyor_core::error::join_field;

impl From<ValidationError> for ApiError {
    fn from(e: ValidationError) -> Self {
        ApiError::Invalid {
            field: e.field,
            message: e.message,
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Invalid(v) => v.into(),
            StoreError::NotFound(id) => ApiError::JobNotFound(id),
            StoreError::LeaseLost(id) => ApiError::LeaseLost(id),
            conflict @ StoreError::Conflict { .. } => ApiError::Conflict(conflict.to_string()),
            StoreError::FlowNotFound(id) => ApiError::FlowNotFound(id),
            conflict @ StoreError::FlowConflict { .. } => ApiError::Conflict(conflict.to_string()),
            full @ StoreError::QueueFull { retry_after, .. } => ApiError::QueueFull {
                field: match &full {
                    StoreError::QueueFull {
                        tenant: Some(_), ..
                    } => "tenant",
                    _ => "queue",
                },
                message: full.to_string(),
                retry_after_secs: retry_after.as_secs_f64().ceil().max(1.0) as u64,
            },
            StoreError::Backend { message, source } => ApiError::StoreUnavailable(match source {
                Some(source) => format!("{message}: {source}"),
                None => message,
            }),
            closed @ StoreError::Closed => ApiError::StoreUnavailable(closed.to_string()),
            StoreError::Internal(message) => ApiError::Internal(message),
            // A kind of failure added to the store after this server: report it, as a bug.
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            ApiError::StoreUnavailable(detail) => {
                tracing::error!(error = %detail, "store error while handling a request");
            }
            ApiError::Internal(detail) => {
                tracing::error!(error = %detail, "internal error while handling a request");
            }
            _ => {}
        }
        let body = ErrorResponse {
            error: ErrorDetail {
                code: self.code().to_string(),
                field: self.field().map(str::to_string),
                message: self.public_message(),
                would_fail: match &self {
                    ApiError::SchemaRejectsQueued { would_fail, .. } => Some(*would_fail),
                    _ => None,
                },
            },
        };
        let retry_after = match &self {
            ApiError::QueueFull {
                retry_after_secs, ..
            } => Some(*retry_after_secs),
            _ => None,
        };
        let mut response = (self.status(), Json(body)).into_response();
        if let Some(secs) = retry_after {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(secs),
            );
        }
        response
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// Longest framework rejection text kept when it is turned into a JSON error.
const MAX_REJECTION_TEXT: usize = 1024;

/// Middleware: every 4xx answers a JSON error body, even those produced before a handler runs
/// (axum's rejections of a path segment that is not UTF-8, say, are plain text). The text
/// becomes the message; the field is `path` for a 400 (the only input read before a handler).
pub(crate) async fn json_client_errors(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/json"));
    if !status.is_client_error() || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, MAX_REJECTION_TEXT)
        .await
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_default();
    let message = if text.trim().is_empty() {
        status
            .canonical_reason()
            .unwrap_or("client error")
            .to_string()
    } else {
        text
    };
    let body = ErrorResponse {
        error: ErrorDetail {
            code: match status {
                StatusCode::NOT_FOUND => "not_found",
                StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
                StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
                StatusCode::REQUEST_TIMEOUT => "request_timeout",
                _ => "invalid_request",
            }
            .to_string(),
            field: (status == StatusCode::BAD_REQUEST).then(|| "path".to_string()),
            message,
            would_fail: None,
        },
    };
    let mut converted = (status, Json(body)).into_response();
    // Keep what the original answer said beyond its body (Retry-After, WWW-Authenticate).
    for (name, value) in parts.headers.iter() {
        if name != axum::http::header::CONTENT_TYPE && name != axum::http::header::CONTENT_LENGTH {
            converted.headers_mut().insert(name.clone(), value.clone());
        }
    }
    converted
}
