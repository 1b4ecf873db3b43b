//! What both protocols of the worker API check the same way: the lease a worker asks for, and
//! a failure report turned into the store's parameters.

use conveyor_core::{error_class, validate, wire, FailParams, LeaseRef, RetryPlan};
use serde::Deserialize;
use std::time::Duration;

use crate::error::{ApiError, ApiResult};
use crate::extract::after_ms;
use crate::AppState;

/// Shortest lease a worker may ask for.
pub(crate) const MIN_LEASE_MS: u64 = 100;
/// Longest lease a worker may ask for (one day): heartbeat to hold a job longer.
pub(crate) const MAX_LEASE_MS: u64 = 24 * 3600 * 1000;

pub(crate) fn lease_duration(
    field: &str,
    ms: Option<u64>,
    default: Duration,
) -> ApiResult<Duration> {
    match ms {
        None => Ok(default),
        Some(ms) if (MIN_LEASE_MS..=MAX_LEASE_MS).contains(&ms) => Ok(Duration::from_millis(ms)),
        Some(_) => Err(ApiError::invalid(
            field,
            format!("must be from {MIN_LEASE_MS} to {MAX_LEASE_MS} milliseconds"),
        )),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RetryMode {
    #[default]
    Auto,
    Never,
    After,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FailError {
    #[serde(default, deserialize_with = "wire::non_null")]
    class: Option<String>,
    message: String,
    /// The handler's traceback (a Python traceback, a JavaScript stack), shown with the
    /// attempt; kept up to 32 KiB.
    #[serde(default, deserialize_with = "wire::non_null")]
    backtrace: Option<String>,
}

/// A failure report checked and turned into the store's parameters; errors name the field
/// (`retry_after_ms`, `error.class`, `error.message`) for callers to prefix.
pub(crate) fn fail_params(
    state: &AppState,
    lease: LeaseRef,
    error: FailError,
    retry: Option<RetryMode>,
    retry_after_ms: Option<i64>,
) -> ApiResult<FailParams> {
    let mode = retry.unwrap_or_default();
    let retry = match (mode, retry_after_ms) {
        (RetryMode::After, Some(ms)) => {
            RetryPlan::At(after_ms("retry_after_ms", state.clock.now(), ms)?)
        }
        (RetryMode::After, None) => {
            return Err(ApiError::invalid(
                "retry_after_ms",
                "required when retry is \"after\"",
            ))
        }
        (_, Some(_)) => {
            return Err(ApiError::invalid(
                "retry_after_ms",
                "only allowed when retry is \"after\"",
            ))
        }
        (RetryMode::Auto, None) => RetryPlan::Backoff(state.config.default_retry),
        (RetryMode::Never, None) => RetryPlan::Never,
    };
    let class = match error.class {
        Some(class) => {
            validate::name("error.class", &class)?;
            class
        }
        None => match mode {
            RetryMode::Auto => error_class::ERROR,
            RetryMode::Never => error_class::PERMANENT,
            RetryMode::After => error_class::RETRY_AFTER,
        }
        .to_string(),
    };
    let message = error.message;
    let limit = state.config.max_payload_bytes;
    if message.len() > limit {
        return Err(ApiError::too_large(
            "error.message",
            format!("must be at most {limit} bytes"),
        ));
    }
    Ok(FailParams {
        lease,
        class,
        message,
        retry,
        backtrace: error.backtrace,
    })
}
