//! Request extraction that names the field at fault: JSON bodies (via `serde_path_to_error`),
//! job ids in the path, and query strings.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::io;
use uuid::Uuid;

use crate::error::{join_field, ApiError, ApiResult};
use crate::AppState;

/// A JSON body. Any content type is accepted; the bytes must be one JSON value of the expected
/// shape. Errors name the offending field (`priority`, `jobs[3].kind`, or `body` when the JSON
/// itself is malformed).
pub(crate) struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large(
                    "body",
                    format!(
                        "request body exceeds the limit of {} bytes",
                        state.body_limit
                    ),
                )
            } else {
                ApiError::invalid("body", rejection.body_text())
            }
        })?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// Deserializes `bytes` as `T`, turning serde errors into `ApiError::Invalid` naming the field.
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> ApiResult<T> {
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        None => {
            return Err(ApiError::invalid(
                "body",
                "request body is empty; expected a JSON object",
            ))
        }
        // Serde would also accept a struct written as an array; only objects are meant.
        Some(b'{') => {}
        Some(_) => {
            return Err(ApiError::invalid(
                "body",
                "request body must be a JSON object",
            ))
        }
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(path_error)?;
    de.end()
        .map_err(|e| ApiError::invalid("body", format!("malformed JSON: {e}")))?;
    Ok(value)
}

fn path_error(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    use serde_json::error::Category;
    let path = e.path().to_string();
    let inner = e.into_inner();
    match inner.classify() {
        Category::Syntax | Category::Eof | Category::Io => {
            ApiError::invalid("body", format!("malformed JSON: {inner}"))
        }
        Category::Data => {
            let message = inner.to_string();
            let path = if path == "." { String::new() } else { path };
            let named = ["missing field `", "unknown field `", "duplicate field `"]
                .iter()
                .find_map(|prefix| backticked_after(&message, prefix));
            let field = match named {
                // serde_path_to_error already ends the path with an unknown field's name.
                Some(name) if !path_ends_with(&path, name) => join_field(&path, name),
                _ => path,
            };
            if field.is_empty() {
                ApiError::invalid("body", message)
            } else {
                ApiError::invalid(field, message)
            }
        }
    }
}

fn backticked_after<'a>(message: &'a str, prefix: &str) -> Option<&'a str> {
    let start = message.find(prefix)? + prefix.len();
    let rest = &message[start..];
    let end = rest.find('`')?;
    Some(&rest[..end])
}

fn path_ends_with(path: &str, name: &str) -> bool {
    path == name || path.ends_with(&format!(".{name}"))
}

/// A job id from the path; a non-UUID is a 400 naming `id`.
pub(crate) struct JobId(pub Uuid);

impl<S: Send + Sync> FromRequestParts<S> for JobId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|rejection| ApiError::invalid("id", rejection.body_text()))?;
        parse_uuid("id", &raw).map(JobId)
    }
}

pub(crate) fn parse_uuid(field: &str, raw: &str) -> ApiResult<Uuid> {
    Uuid::parse_str(raw)
        .map_err(|e| ApiError::invalid(field, format!("{raw:?} is not a valid UUID: {e}")))
}

/// The query string as ordered key/value pairs.
pub(crate) struct QueryPairs(pub Vec<(String, String)>);

impl<S: Send + Sync> FromRequestParts<S> for QueryPairs {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Query(pairs) = Query::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|rejection| ApiError::invalid("query", rejection.body_text()))?;
        Ok(QueryPairs(pairs))
    }
}

/// Rejects `value` when its JSON encoding is longer than `limit` bytes (413 naming `field`).
pub(crate) fn check_json_size(field: &str, value: &Value, limit: usize) -> ApiResult<()> {
    struct Counter {
        written: usize,
        limit: usize,
    }
    impl io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.written = self.written.saturating_add(buf.len());
            if self.written > self.limit {
                return Err(io::Error::other("limit exceeded"));
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter { written: 0, limit };
    if serde_json::to_writer(&mut counter, value).is_err() || counter.written > limit {
        return Err(ApiError::too_large(
            field,
            format!("serialized {field} exceeds the limit of {limit} bytes"),
        ));
    }
    Ok(())
}

/// `now + ms` for a non-negative millisecond count, or a 400 naming `field`.
pub(crate) fn after_ms(field: &str, now: DateTime<Utc>, ms: i64) -> ApiResult<DateTime<Utc>> {
    if ms < 0 {
        return Err(ApiError::invalid(field, "must not be negative"));
    }
    // A stated bound rather than "whatever fits the calendar": the API document can say it.
    if ms > conveyor_core::validate::MAX_DELAY_MS {
        return Err(ApiError::invalid(
            field,
            format!(
                "must be at most {} (100 years)",
                conveyor_core::validate::MAX_DELAY_MS
            ),
        ));
    }
    chrono::Duration::try_milliseconds(ms)
        .and_then(|d| now.checked_add_signed(d))
        .ok_or_else(|| ApiError::invalid(field, "is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        kind: String,
        priority: Option<i32>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        jobs: Vec<Inner>,
    }

    fn field_of<T: DeserializeOwned + std::fmt::Debug>(body: &str) -> String {
        match parse_json::<T>(body.as_bytes()) {
            Err(ApiError::Invalid { field, .. }) => field,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn names_the_field_at_fault() {
        assert_eq!(field_of::<Inner>(r#"{"priority": 1}"#), "kind");
        assert_eq!(
            field_of::<Inner>(r#"{"kind": "a", "priority": "high"}"#),
            "priority"
        );
        assert_eq!(field_of::<Inner>(r#"{"kind": "a", "bogus": 1}"#), "bogus");
        assert_eq!(field_of::<Inner>(r#"{"kind": "a", "kind": "b"}"#), "kind");
        assert_eq!(field_of::<Inner>(r#"{"kind": "a""#), "body");
        assert_eq!(field_of::<Inner>(r#"{"kind": "a"} x"#), "body");
        assert_eq!(field_of::<Inner>(r#"not json"#), "body");
        assert_eq!(field_of::<Inner>(""), "body");
        assert_eq!(field_of::<Inner>("[1]"), "body");
        assert_eq!(
            field_of::<Outer>(r#"{"jobs": [{"kind": "a"}, {"priority": 1}]}"#),
            "jobs[1].kind"
        );
        assert_eq!(
            field_of::<Outer>(r#"{"jobs": [{"kind": "a"}, {"kind": "b", "x": 1}]}"#),
            "jobs[1].x"
        );
        assert_eq!(
            field_of::<Outer>(r#"{"jobs": [{"kind": 7}]}"#),
            "jobs[0].kind"
        );
        assert_eq!(field_of::<Outer>(r#"{}"#), "jobs");
    }

    #[test]
    fn json_size_limit() {
        let v = serde_json::json!({"a": "xxxx"});
        assert!(check_json_size("payload", &v, 12).is_ok());
        assert!(check_json_size("payload", &v, 11).is_err());
    }
}
