//! Debounce and throttle: enqueues of one kind and queue that share a key, folded into one job.
//!
//! - **Trailing debounce** (`mode: trailing`, the default): the first enqueue stores a job due
//!   `delay_ms` later; each later enqueue while that job has not started replaces its payload
//!   and moves it to `delay_ms` after itself, but never past `max_wait_ms` after the first.
//!   The last event wins, and a burst runs once.
//! - **Leading debounce** (`mode: leading`): the first enqueue runs at once; later ones are
//!   dropped while they come less than `delay_ms` apart (each pushes the window on, never past
//!   `max_wait_ms` after the first).
//! - **Throttle**: the first enqueue runs; later ones within `period_ms` of it are dropped.
//!
//! A folded or dropped enqueue answers with the job that stands (`debounced_into`). The stores
//! find the key's latest job under the key's lock (PostgreSQL) or on their writer (SQLite) and
//! apply [`verdict`]. A leaf: it imports only the job states.

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use crate::state::JobState;

/// Which edge of a burst runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DebounceMode {
    /// The last event of a burst runs, once the burst is quiet for `delay_ms`.
    #[default]
    Trailing,
    /// The first event runs at once; the rest of the burst is dropped.
    Leading,
}

/// `"debounce"` on an enqueue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DebounceSpec {
    /// A key expression (`tenant`, `payload.user.id`, ...), as a limit's.
    pub key: String,
    pub delay_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait_ms: Option<u64>,
    #[serde(default)]
    pub mode: DebounceMode,
}

/// `"throttle"` on an enqueue: the key at most once per `period_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThrottleSpec {
    pub key: String,
    pub period_ms: u64,
}

/// How enqueues of one key fold, as stamped on a job at enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "rule", rename_all = "snake_case")]
pub enum FoldRule {
    Trailing {
        delay_ms: u64,
        max_wait_ms: Option<u64>,
    },
    Leading {
        delay_ms: u64,
        max_wait_ms: Option<u64>,
    },
    Throttle {
        period_ms: u64,
    },
}

impl FoldRule {
    pub fn of_debounce(spec: &DebounceSpec) -> Self {
        match spec.mode {
            DebounceMode::Trailing => FoldRule::Trailing {
                delay_ms: spec.delay_ms,
                max_wait_ms: spec.max_wait_ms,
            },
            DebounceMode::Leading => FoldRule::Leading {
                delay_ms: spec.delay_ms,
                max_wait_ms: spec.max_wait_ms,
            },
        }
    }

    pub fn of_throttle(spec: &ThrottleSpec) -> Self {
        FoldRule::Throttle {
            period_ms: spec.period_ms,
        }
    }
}

/// The fold a job enters, as stamped at enqueue: its key (kind, queue, expression and value)
/// and its rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FoldKey {
    pub key: String,
    pub rule: FoldRule,
}

/// The stamped key of a job of `kind` in `queue` whose `expression` has `value`.
pub fn fold_key(kind: &str, queue: &str, expression: &str, value: &str) -> String {
    format!("{kind}/{queue}/{expression}={value}")
}

/// The latest job stored with the key, as the verdict needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    pub id: uuid::Uuid,
    pub state: JobState,
    pub created_at: DateTime<Utc>,
    /// Until when later enqueues are dropped (leading debounce, throttle).
    pub until: Option<DateTime<Utc>>,
}

/// What an enqueue does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A new job, due at `run_at` (`None`: as the job asks), dropping what follows until
    /// `until` (`None`: nothing).
    Insert {
        run_at: Option<DateTime<Utc>>,
        until: Option<DateTime<Utc>>,
    },
    /// The standing job takes this enqueue's payload and `run_at` (trailing debounce).
    Replace {
        id: uuid::Uuid,
        run_at: DateTime<Utc>,
    },
    /// The enqueue is dropped in favour of the standing job, whose window moves to `until`
    /// when given (leading debounce).
    Drop {
        id: uuid::Uuid,
        until: Option<DateTime<Utc>>,
    },
}

fn after(at: DateTime<Utc>, ms: u64) -> DateTime<Utc> {
    at.checked_add_signed(Duration::milliseconds(
        i64::try_from(ms).unwrap_or(i64::MAX),
    ))
    .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// `now + delay`, never past `max_wait` after `first`.
fn capped(
    now: DateTime<Utc>,
    delay_ms: u64,
    first: DateTime<Utc>,
    max_wait_ms: Option<u64>,
) -> DateTime<Utc> {
    let wanted = after(now, delay_ms);
    match max_wait_ms {
        Some(max_wait) => wanted.min(after(first, max_wait)).max(now),
        None => wanted,
    }
}

/// What an enqueue at `now` under `rule` does, given the key's latest stored job.
pub fn verdict(rule: FoldRule, standing: Option<Standing>, now: DateTime<Utc>) -> Verdict {
    match rule {
        FoldRule::Trailing {
            delay_ms,
            max_wait_ms,
        } => match standing {
            // Not started yet: this enqueue's payload replaces its own.
            Some(job) if job.state == JobState::Scheduled => Verdict::Replace {
                id: job.id,
                run_at: capped(now, delay_ms, job.created_at, max_wait_ms),
            },
            _ => Verdict::Insert {
                run_at: Some(capped(now, delay_ms, now, max_wait_ms)),
                until: None,
            },
        },
        FoldRule::Leading {
            delay_ms,
            max_wait_ms,
        } => match standing {
            Some(job) if job.until.is_some_and(|until| until > now) => Verdict::Drop {
                id: job.id,
                until: Some(capped(now, delay_ms, job.created_at, max_wait_ms)),
            },
            _ => Verdict::Insert {
                run_at: None,
                until: Some(after(now, delay_ms)),
            },
        },
        FoldRule::Throttle { period_ms } => match standing {
            Some(job) if job.until.is_some_and(|until| until > now) => Verdict::Drop {
                id: job.id,
                until: None,
            },
            _ => Verdict::Insert {
                run_at: None,
                until: Some(after(now, period_ms)),
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::<Utc>::UNIX_EPOCH + Duration::milliseconds(ms)
    }

    fn standing(state: JobState, created: i64, until: Option<i64>) -> Standing {
        Standing {
            id: uuid::Uuid::nil(),
            state,
            created_at: at(created),
            until: until.map(at),
        }
    }

    #[test]
    fn trailing_moves_the_run_later_but_not_past_max_wait() {
        let rule = FoldRule::Trailing {
            delay_ms: 1000,
            max_wait_ms: Some(2500),
        };
        assert_eq!(
            verdict(rule, None, at(0)),
            Verdict::Insert {
                run_at: Some(at(1000)),
                until: None
            }
        );
        let first = standing(JobState::Scheduled, 0, None);
        assert_eq!(
            verdict(rule, Some(first), at(900)),
            Verdict::Replace {
                id: first.id,
                run_at: at(1900)
            }
        );
        // 2,000 ms in, a delay of 1,000 would pass 2,500 after the first.
        assert_eq!(
            verdict(rule, Some(first), at(2000)),
            Verdict::Replace {
                id: first.id,
                run_at: at(2500)
            }
        );
        // Once it started, a new enqueue is a new job.
        let running = standing(JobState::Running, 0, None);
        assert!(matches!(
            verdict(rule, Some(running), at(2600)),
            Verdict::Insert { .. }
        ));
    }

    #[test]
    fn leading_drops_the_rest_of_a_burst_and_throttle_a_period() {
        let leading = FoldRule::Leading {
            delay_ms: 1000,
            max_wait_ms: Some(1500),
        };
        assert_eq!(
            verdict(leading, None, at(0)),
            Verdict::Insert {
                run_at: None,
                until: Some(at(1000))
            }
        );
        let first = standing(JobState::Completed, 0, Some(1000));
        assert_eq!(
            verdict(leading, Some(first), at(800)),
            Verdict::Drop {
                id: first.id,
                until: Some(at(1500))
            }
        );
        assert!(matches!(
            verdict(leading, Some(first), at(1000)),
            Verdict::Insert { .. }
        ));
        let throttle = FoldRule::Throttle { period_ms: 60_000 };
        let last = standing(JobState::Running, 0, Some(60_000));
        assert_eq!(
            verdict(throttle, Some(last), at(59_999)),
            Verdict::Drop {
                id: last.id,
                until: None
            }
        );
        assert!(matches!(
            verdict(throttle, Some(last), at(60_000)),
            Verdict::Insert { .. }
        ));
    }
}
