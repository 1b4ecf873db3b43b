//! Batches: a kind whose jobs are handed out several at a time, to a handler that does in one
//! call what would otherwise take one call per job (one `INSERT` of 500 rows, one request to a
//! vendor's bulk endpoint).
//!
//! The rule (`PUT /v1/kinds/{kind}` `{"batch": {"max_size", "max_wait_ms", "key"?}}`):
//! - Jobs of a batch kind are never handed out by a plain fetch; only a fetch that asks for
//!   batches (`batch: true`) claims them, up to `max_size` at once, all of one kind, one queue
//!   and (with a `key`) one key value.
//! - A group of waiting jobs is *ready* when it holds `max_size` jobs, or when its oldest has
//!   waited `max_wait_ms` since it became available ([`readiness`]). Until then a batch fetch
//!   waits, so a trickle of jobs still goes out in batches and a burst goes out full.
//! - Each job of a batch is still its own job: its own lease, attempts, outcome, history and
//!   dead-letter path. A handler reports an outcome per job; a failed one retries alone.
//!
//! Pure: the engine peeks at the waiting jobs through the store, asks [`readiness`] which group
//! to claim, and claims it through the ordinary fetch (so limits and breakers still hold).

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use crate::error::ValidationError;
use crate::job::Job;
use crate::limits::named::KeyExpr;

/// Most jobs one batch may hold (a fetch claims at most as many).
pub const MAX_BATCH_SIZE: u32 = 1000;

/// Longest a batch may wait to fill: one hour.
pub const MAX_BATCH_WAIT_MS: u64 = 3_600_000;

/// How a kind's jobs are batched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSpec {
    /// Most jobs in one batch (1 to [`MAX_BATCH_SIZE`]).
    pub max_size: u32,
    /// How long the oldest waiting job may wait for the batch to fill before a smaller batch
    /// goes out (0: at once).
    #[serde(default)]
    pub max_wait_ms: u64,
    /// A key expression (`tenant`, `queue`, `payload.account`, as a limit's): a batch holds jobs
    /// of one key value only. Jobs without a value there are batched together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl BatchSpec {
    /// Batches of up to `max_size` jobs, sent as soon as any job waits.
    pub fn of(max_size: u32) -> Self {
        Self {
            max_size,
            max_wait_ms: 0,
            key: None,
        }
    }

    /// The same batches, waiting up to `max_wait_ms` to fill.
    pub fn max_wait_ms(mut self, max_wait_ms: u64) -> Self {
        self.max_wait_ms = max_wait_ms;
        self
    }

    /// The same batches, one per value of `key`.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Checks the spec; errors name `<field>.max_size`, `<field>.max_wait_ms`, `<field>.key`.
    pub fn validate(&self, field: &str) -> Result<(), ValidationError> {
        if self.max_size == 0 || self.max_size > MAX_BATCH_SIZE {
            return Err(ValidationError::new(
                format!("{field}.max_size"),
                format!("must be from 1 to {MAX_BATCH_SIZE}"),
            ));
        }
        if self.max_wait_ms > MAX_BATCH_WAIT_MS {
            return Err(ValidationError::new(
                format!("{field}.max_wait_ms"),
                format!("at most {MAX_BATCH_WAIT_MS} (one hour)"),
            ));
        }
        if let Some(key) = &self.key {
            key.parse::<KeyExpr>()
                .map_err(|message| ValidationError::new(format!("{field}.key"), message))?;
        }
        Ok(())
    }

    /// How many waiting jobs a batch fetch looks at to judge readiness: the batch itself
    /// without a key; with one, enough to find a full group among interleaved keys.
    pub fn peek(&self) -> usize {
        let size = self.max_size as usize;
        match self.key {
            None => size,
            Some(_) => (size * 4).max(100),
        }
    }

    /// The spec's key, parsed (`None` without one). A job's batch key is its value there
    /// ([`KeyExpr::value_of_stored`]; `None` when the job has no value).
    pub fn key_expr(&self) -> Option<KeyExpr> {
        self.key.as_deref().and_then(|key| key.parse().ok())
    }
}

/// A group of waiting jobs ready to go out as one batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pick {
    /// The group's key value (`None`: jobs without one, or a spec without a key).
    pub key: Option<String>,
    /// How many jobs, in claim order, to claim so that the batch's jobs are among them (jobs
    /// of other keys ahead of them are claimed too and given back).
    pub claim: usize,
    /// When the group's oldest job became available (orders ready groups across kinds).
    pub oldest: DateTime<Utc>,
}

/// What a batch fetch finds among the waiting jobs of one kind in one queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Readiness {
    /// The groups that may go out now, in claim order of their first job.
    pub ready: Vec<Pick>,
    /// When the first of the others becomes ready (none when no other group waits).
    pub not_before: Option<DateTime<Utc>>,
}

/// Judges the waiting jobs `waiting` (available, one kind, one queue, in claim order: the
/// first [`BatchSpec::peek`] of them) at `now`: a group that holds `max_size` jobs, or whose
/// oldest job became available `max_wait_ms` ago, may go out. The first ready group goes
/// first; the others are there for when a limit holds its jobs back.
pub fn readiness(spec: &BatchSpec, waiting: &[Job], now: DateTime<Utc>) -> Readiness {
    struct Group {
        key: Option<String>,
        /// Positions of the group's jobs in claim order.
        at: Vec<usize>,
        oldest: DateTime<Utc>,
    }
    let expression = spec.key_expr();
    let mut groups: Vec<Group> = Vec::new();
    // Where each key's group is in `groups` (kept in claim order of first jobs).
    let mut places: std::collections::HashMap<Option<String>, usize> = Default::default();
    for (position, job) in waiting.iter().enumerate() {
        let key = expression
            .as_ref()
            .and_then(|expression| expression.value_of_stored(job));
        match places.get(&key) {
            Some(&place) => {
                let group = &mut groups[place];
                group.at.push(position);
                group.oldest = group.oldest.min(job.run_at);
            }
            None => {
                places.insert(key.clone(), groups.len());
                groups.push(Group {
                    key,
                    at: vec![position],
                    oldest: job.run_at,
                });
            }
        }
    }
    let size = (spec.max_size as usize).max(1);
    let wait = Duration::milliseconds(i64::try_from(spec.max_wait_ms).unwrap_or(i64::MAX));
    let mut readiness = Readiness::default();
    for group in groups {
        let due = group
            .oldest
            .checked_add_signed(wait)
            .unwrap_or(group.oldest);
        if group.at.len() >= size || due <= now {
            let last = group.at[group.at.len().min(size) - 1];
            readiness.ready.push(Pick {
                key: group.key,
                claim: last + 1,
                oldest: group.oldest,
            });
        } else {
            readiness.not_before = Some(readiness.not_before.map_or(due, |at| at.min(due)));
        }
    }
    readiness
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::NewJob;
    use serde_json::json;

    fn waiting(payloads: &[(serde_json::Value, i64)], now: DateTime<Utc>) -> Vec<Job> {
        payloads
            .iter()
            .map(|(payload, age_ms)| {
                let mut job =
                    NewJob::new("import", payload.clone()).into_stored(uuid::Uuid::new_v4(), now);
                job.run_at = now - Duration::milliseconds(*age_ms);
                job
            })
            .collect()
    }

    #[test]
    fn a_full_group_goes_out_at_once() {
        let now = Utc::now();
        let spec = BatchSpec::of(3).max_wait_ms(60_000);
        let jobs = waiting(&[(json!({}), 0), (json!({}), 0), (json!({}), 0)], now);
        let found = readiness(&spec, &jobs, now);
        let [pick] = found.ready.as_slice() else {
            panic!("three of three is a full batch: {found:?}");
        };
        assert_eq!(pick.claim, 3);
        assert_eq!(pick.key, None);
    }

    #[test]
    fn a_short_group_waits_until_its_oldest_has_waited_max_wait() {
        let now = Utc::now();
        let spec = BatchSpec::of(10).max_wait_ms(1000);
        let jobs = waiting(&[(json!({}), 400), (json!({}), 100)], now);
        assert_eq!(
            readiness(&spec, &jobs, now),
            Readiness {
                ready: Vec::new(),
                not_before: Some(now + Duration::milliseconds(600))
            }
        );
        let later = now + Duration::milliseconds(600);
        let found = readiness(&spec, &jobs, later);
        let [pick] = found.ready.as_slice() else {
            panic!("the oldest has waited a second: {found:?}");
        };
        assert_eq!(pick.claim, 2);
        assert_eq!(readiness(&spec, &[], now), Readiness::default());
    }

    #[test]
    fn a_keyed_batch_takes_one_key_and_claims_through_its_last_job() {
        let now = Utc::now();
        let spec = BatchSpec::of(2).max_wait_ms(60_000).key("payload.account");
        let jobs = waiting(
            &[
                (json!({"account": "a"}), 0),
                (json!({"account": "b"}), 0),
                (json!({"account": "b"}), 0),
                (json!({"account": "a"}), 0),
            ],
            now,
        );
        let found = readiness(&spec, &jobs, now);
        let [first, second] = found.ready.as_slice() else {
            panic!("both keys are full: {found:?}");
        };
        assert_eq!(
            first.key.as_deref(),
            Some("a"),
            "the first in claim order first"
        );
        assert_eq!(first.claim, 4);
        assert_eq!(second.key.as_deref(), Some("b"));
        assert_eq!(second.claim, 3);
        assert_eq!(found.not_before, None);
    }

    #[test]
    fn specs_are_checked_field_by_field() {
        assert_eq!(
            BatchSpec::of(0).validate("batch").unwrap_err().field,
            "batch.max_size"
        );
        assert_eq!(
            BatchSpec::of(1001).validate("batch").unwrap_err().field,
            "batch.max_size"
        );
        let slow = BatchSpec::of(5).max_wait_ms(MAX_BATCH_WAIT_MS + 1);
        assert_eq!(
            slow.validate("batch").unwrap_err().field,
            "batch.max_wait_ms"
        );
        let bad_key = BatchSpec::of(5).key("customer");
        assert_eq!(bad_key.validate("batch").unwrap_err().field, "batch.key");
        assert!(BatchSpec::of(5)
            .key("payload.customer.id")
            .validate("batch")
            .is_ok());
    }
}
