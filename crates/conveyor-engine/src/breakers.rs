//! The circuit breakers a fetching process runs (see [`conveyor_core::breaker`] for the rules):
//! gates its fetches on the cluster's breakers as last read, and counts the attempts it sees
//! finish, writing the counts in the background.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};

use conveyor_core::access::{Actor, AuditAction, NewAuditEntry};
use conveyor_core::breaker::*;
use conveyor_core::clock::Clock;
use conveyor_core::error::StoreResult;
use conveyor_core::job::Job;
use conveyor_core::store::{FetchParams, Store};
use conveyor_core::validate::Valid;

type Key = (BreakerScope, String);

/// Settings and records as last read.
#[derive(Default)]
struct Snapshot {
    settings: HashMap<Key, BreakerSettings>,
    breakers: HashMap<Key, StoredBreaker>,
}

impl Snapshot {
    /// Nothing to gate or count: no breaker configured and none away from closed.
    fn quiet(&self) -> bool {
        self.settings.is_empty()
            && self
                .breakers
                .values()
                .all(|b| b.record.state == BreakerState::Closed)
    }

    /// Whether attempts of this scope are counted.
    fn watches(&self, key: &Key) -> bool {
        self.settings.contains_key(key)
            || self
                .breakers
                .get(key)
                .is_some_and(|b| b.record.state != BreakerState::Closed)
    }
}

/// Outcomes of one scope not yet written.
#[derive(Debug, Default, Clone, Copy)]
struct Pending {
    successes: u64,
    failures: u64,
    pause_until: Option<DateTime<Utc>>,
}

/// A finished attempt, as the breakers count it.
#[derive(Debug, Clone, Copy)]
pub struct Outcome<'a> {
    pub queue: &'a str,
    pub kind: &'a str,
    pub succeeded: bool,
    /// For a failure that asked to be retried at a given time (a dependency's 429).
    pub retry_at: Option<DateTime<Utc>>,
}

/// A process's view of the cluster's breakers: gates its fetches, counts its attempts.
pub struct CircuitBreakers {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    current: crate::refreshed::Refreshed<Snapshot>,
    pending: Mutex<HashMap<Key, Pending>>,
    flush: Arc<tokio::sync::Notify>,
    flusher: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for CircuitBreakers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CircuitBreakers")
    }
}

impl Drop for CircuitBreakers {
    fn drop(&mut self) {
        if let Ok(mut flusher) = self.flusher.lock() {
            if let Some(task) = flusher.take() {
                task.abort();
            }
        }
    }
}

/// Least time between two writes of counted outcomes.
const FLUSH_SPACING: Duration = Duration::from_millis(50);

/// Tries of a conditional write before giving up for now (many nodes writing one breaker).
const WRITE_TRIES: usize = 16;

impl CircuitBreakers {
    /// How old settings and states may get before a fetch re-reads them. A transition made
    /// by this process is seen at once; one made by another within this.
    pub const REFRESH: Duration = Duration::from_secs(1);

    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>) -> Arc<Self> {
        Arc::new(Self {
            store,
            clock,
            current: crate::refreshed::Refreshed::new(Self::REFRESH),
            pending: Mutex::new(HashMap::new()),
            flush: Arc::new(tokio::sync::Notify::new()),
            flusher: Mutex::new(None),
        })
    }

    /// The settings and states as last read, however old.
    fn snapshot(&self) -> Arc<Snapshot> {
        self.current.last()
    }

    /// Whether any breaker is configured or away from closed (as last read): outcomes are
    /// worth looking up only then.
    pub fn watching(&self) -> bool {
        !self.snapshot().quiet()
    }

    /// Forgets what was read: the next fetch reads settings and states again (after this
    /// process changed a queue's or kind's settings).
    pub fn invalidate(&self) {
        self.current.invalidate();
    }

    async fn current(&self) -> StoreResult<Arc<Snapshot>> {
        self.current
            .get(|| async {
                let mut settings = HashMap::new();
                for queue in self.store.queue_settings_list().await? {
                    if let Some(breaker) = queue.settings.circuit_breaker {
                        settings.insert((BreakerScope::Queue, queue.name), breaker);
                    }
                }
                for kind in self.store.kinds_list().await? {
                    if let Some(breaker) = kind.circuit_breaker {
                        settings.insert((BreakerScope::Kind, kind.kind), breaker);
                    }
                }
                let breakers = self
                    .store
                    .breakers_list()
                    .await?
                    .into_iter()
                    .map(|b| ((b.scope, b.name.clone()), b))
                    .collect();
                Ok(Snapshot { settings, breakers })
            })
            .await
    }

    /// Keeps a breaker this process just wrote, so its own next fetch acts on it.
    fn remember(&self, breaker: StoredBreaker) {
        self.current.update(|old| {
            let mut breakers = old.breakers.clone();
            breakers.insert((breaker.scope, breaker.name.clone()), breaker);
            Snapshot {
                settings: old.settings.clone(),
                breakers,
            }
        });
    }

    /// Every breaker configured or stored, with its settings and state.
    pub async fn list(&self) -> StoreResult<Vec<BreakerView>> {
        self.invalidate();
        let snapshot = self.current().await?;
        let now = self.clock.now();
        let mut keys: Vec<&Key> = snapshot
            .settings
            .keys()
            .chain(snapshot.breakers.keys())
            .collect();
        keys.sort();
        keys.dedup();
        Ok(keys
            .into_iter()
            .map(|key| {
                BreakerView::of(
                    key.0,
                    &key.1,
                    snapshot.settings.get(key).copied(),
                    snapshot.breakers.get(key).map(|b| &b.record),
                    now,
                )
            })
            .collect())
    }

    /// One breaker's settings and state (closed and unconfigured when it has neither).
    pub async fn view(&self, scope: BreakerScope, name: &str) -> StoreResult<BreakerView> {
        let snapshot = self.current().await?;
        let key = (scope, name.to_string());
        let stored = self.store.breaker_get(scope, name).await?;
        if let Some(stored) = &stored {
            self.remember(stored.clone());
        }
        Ok(BreakerView::of(
            scope,
            name,
            snapshot.settings.get(&key).copied(),
            stored.as_ref().map(|b| &b.record),
            self.clock.now(),
        ))
    }

    /// Changes one breaker by `change` with a conditional write, re-reading and re-applying on
    /// a conflict. Transitions are written to the audit log (by `actor`) and logged.
    async fn update(
        &self,
        scope: BreakerScope,
        name: &str,
        actor: &Actor,
        mut change: impl FnMut(
            &mut BreakerRecord,
            Option<&BreakerSettings>,
            DateTime<Utc>,
        ) -> Option<Transition>,
    ) -> StoreResult<Option<StoredBreaker>> {
        let settings = self
            .current()
            .await?
            .settings
            .get(&(scope, name.to_string()))
            .copied();
        for _ in 0..WRITE_TRIES {
            let now = self.clock.now();
            let stored = self.store.breaker_get(scope, name).await?;
            let mut next = stored.clone().unwrap_or_else(|| StoredBreaker {
                scope,
                name: name.to_string(),
                version: 0,
                record: BreakerRecord::closed(now),
            });
            let transition = change(&mut next.record, settings.as_ref(), now);
            if let Some(unchanged) = stored.as_ref().filter(|s| s.record == next.record) {
                self.remember(unchanged.clone());
                return Ok(Some(unchanged.clone()));
            }
            // A breaker never stored that would stay closed with nothing counted needs no row.
            if stored.is_none() && transition.is_none() && next.record == BreakerRecord::closed(now)
            {
                return Ok(None);
            }
            if !self.store.breaker_write(&next).await? {
                continue;
            }
            next.version += 1;
            // Acted on by this process's next fetch before anyone can read of it in the
            // audit log.
            self.remember(next.clone());
            if let Some(transition) = transition {
                self.announce(&next, transition, actor).await;
            }
            return Ok(Some(next));
        }
        tracing::warn!(
            scope = scope.as_str(),
            name,
            "circuit breaker: too many concurrent writes; change dropped"
        );
        Ok(None)
    }

    async fn announce(&self, breaker: &StoredBreaker, transition: Transition, actor: &Actor) {
        let action = match transition.to {
            BreakerState::Open => AuditAction::BreakerOpen,
            BreakerState::HalfOpen => AuditAction::BreakerHalfOpen,
            BreakerState::Closed => AuditAction::BreakerClose,
        };
        let reason = breaker.record.reason.clone().unwrap_or_default();
        tracing::warn!(
            scope = breaker.scope.as_str(),
            name = %breaker.name,
            from = transition.from.as_str(),
            to = transition.to.as_str(),
            open_until = ?breaker.record.open_until,
            %reason,
            "circuit breaker {}", transition.to.as_str()
        );
        let detail = serde_json::json!({
            "scope": breaker.scope.as_str(),
            "from": transition.from.as_str(),
            "to": transition.to.as_str(),
            "reason": reason,
            "open_until": breaker.record.open_until,
        });
        let entry = NewAuditEntry::new(actor.clone(), action)
            .target(format!("{}:{}", breaker.scope.as_str(), breaker.name))
            .detail(detail.to_string());
        if let Err(error) = self.store.audit_append(entry).await {
            tracing::warn!(%error, "circuit breaker: transition not written to the audit log");
        }
    }

    /// Opens a breaker by hand, for `open_for` (then it probes) or until closed by hand.
    pub async fn open(
        &self,
        scope: BreakerScope,
        name: &str,
        open_for: Option<Duration>,
        reason: Option<String>,
        actor: &Actor,
    ) -> StoreResult<BreakerView> {
        let reason = reason.unwrap_or_else(|| format!("opened by {}", actor.name));
        let now = self.clock.now();
        let until = open_for.map(|d| {
            now + chrono::Duration::milliseconds(d.as_millis().min(i64::MAX as u128) as i64)
        });
        self.update(scope, name, actor, |record, _, now| {
            record.open_by_hand(now, until, reason.clone())
        })
        .await?;
        self.view(scope, name).await
    }

    /// Closes a breaker by hand; counting starts afresh.
    pub async fn close(
        &self,
        scope: BreakerScope,
        name: &str,
        reason: Option<String>,
        actor: &Actor,
    ) -> StoreResult<BreakerView> {
        let reason = reason.unwrap_or_else(|| format!("closed by {}", actor.name));
        self.update(scope, name, actor, |record, _, now| {
            record.close_by_hand(now, reason.clone())
        })
        .await?;
        self.view(scope, name).await
    }

    /// Claims up to `params.max` jobs, skipping queues and kinds whose breaker is open and
    /// handing out a half-open breaker's probes.
    pub async fn fetch(&self, params: Valid<FetchParams>) -> StoreResult<Vec<Job>> {
        let snapshot = self.current().await?;
        if snapshot.quiet() {
            return self.store.jobs_fetch_valid(params).await;
        }
        let system = Actor::system();
        let mut blocked_queues: Vec<String> = Vec::new();
        let mut blocked_kinds: Vec<String> = Vec::new();
        // Half-open breakers with the probe permits this fetch holds.
        let mut probes: Vec<(Key, u32)> = Vec::new();
        let now = self.clock.now();
        let want = u32::try_from(params.max).unwrap_or(u32::MAX);
        let mut keys: Vec<&Key> = snapshot.breakers.keys().collect();
        keys.sort();
        for key in keys {
            let stored = &snapshot.breakers[key];
            if stored.record.state == BreakerState::Closed {
                continue;
            }
            let relevant = match key.0 {
                BreakerScope::Queue => params.queues.contains(&key.1),
                // A kind the fetch excludes (a batch kind, for a plain fetch) gets no probe.
                BreakerScope::Kind => params.kinds.as_ref().map_or_else(
                    || !params.excluded_kinds.contains(&key.1),
                    |k| k.contains(&key.1),
                ),
            };
            if !relevant {
                continue;
            }
            let settings = snapshot.settings.get(key);
            let mut state = stored.record.state;
            if stored.record.due(settings, now) {
                let updated = self
                    .update(key.0, &key.1, &system, |record, settings, now| {
                        record.tick(settings, now)
                    })
                    .await?;
                state = updated.map_or(BreakerState::Closed, |b| b.record.state);
            }
            if state == BreakerState::HalfOpen {
                let mut granted = 0;
                let fresh = self
                    .update(key.0, &key.1, &system, |record, settings, _| {
                        granted = record.take_probes(settings, want);
                        None
                    })
                    .await?;
                // Read at the store: another process may have closed or reopened it.
                state = fresh.map_or(BreakerState::Closed, |b| b.record.state);
                if granted > 0 {
                    probes.push((key.clone(), granted));
                }
            }
            if state == BreakerState::Closed {
                continue;
            }
            match key.0 {
                BreakerScope::Queue => blocked_queues.push(key.1.clone()),
                BreakerScope::Kind => blocked_kinds.push(key.1.clone()),
            }
        }
        // The fetches below narrow the checked one (`Valid::narrowed`).
        let main = params.clone().narrowed(|main| {
            main.queues.retain(|q| !blocked_queues.contains(q));
            main.excluded_kinds.extend(blocked_kinds.iter().cloned());
        });
        let mut jobs = Vec::new();
        for (key, granted) in probes {
            let room = u32::try_from(params.max.saturating_sub(jobs.len())).unwrap_or(u32::MAX);
            let asked = granted.min(room);
            let probe = main.clone().narrowed(|probe| {
                match key.0 {
                    BreakerScope::Queue => probe.queues = vec![key.1.clone()],
                    BreakerScope::Kind => {
                        probe.kinds = Some(vec![key.1.clone()]);
                        probe.excluded_kinds.retain(|k| *k != key.1);
                    }
                }
                probe.max = asked as usize;
            });
            let got = if probe.claims_nothing() {
                Vec::new()
            } else {
                self.store.jobs_fetch_valid(probe).await?
            };
            let unused = granted.saturating_sub(got.len() as u32);
            if unused > 0 {
                self.update(key.0, &key.1, &system, |record, _, _| {
                    record.return_probes(unused);
                    None
                })
                .await?;
            }
            if !got.is_empty() {
                tracing::info!(scope = key.0.as_str(), name = %key.1, probes = got.len(),
                    "circuit breaker half-open: probe job(s) handed out");
            }
            jobs.extend(got);
        }
        let room = params.max.saturating_sub(jobs.len());
        let main = main.narrowed(|main| main.max = room);
        if !main.claims_nothing() {
            jobs.extend(self.store.jobs_fetch_valid(main).await?);
        }
        Ok(jobs)
    }

    /// Counts a finished attempt toward its queue's and kind's breakers (if they have one).
    /// Never waits: the count is written by a background task.
    pub fn record(self: &Arc<Self>, outcome: Outcome<'_>) {
        if self.add_pending(outcome) {
            self.start_flusher();
            self.flush.notify_one();
        }
    }

    /// Like [`CircuitBreakers::record`], but writes the count before returning (tests, and
    /// callers that want the breaker to act on this very outcome before they go on).
    pub async fn record_now(&self, outcome: Outcome<'_>) -> StoreResult<()> {
        self.current().await?;
        if self.add_pending(outcome) {
            self.write_pending().await?;
        }
        Ok(())
    }

    /// Adds an outcome to the counts not yet written; false when no breaker watches it.
    fn add_pending(&self, outcome: Outcome<'_>) -> bool {
        let snapshot = self.snapshot();
        if snapshot.quiet() {
            return false;
        }
        let mut any = false;
        let Ok(mut pending) = self.pending.lock() else {
            return false;
        };
        for (scope, name) in [
            (BreakerScope::Queue, outcome.queue),
            (BreakerScope::Kind, outcome.kind),
        ] {
            let key = (scope, name.to_string());
            if !snapshot.watches(&key) {
                continue;
            }
            let pause = outcome.retry_at.filter(|_| {
                snapshot
                    .settings
                    .get(&key)
                    .is_some_and(|s| s.pause_on_retry_after)
            });
            let entry = pending.entry(key).or_default();
            if outcome.succeeded {
                entry.successes += 1;
            } else {
                entry.failures += 1;
            }
            if let Some(until) = pause {
                entry.pause_until = Some(entry.pause_until.map_or(until, |u| u.max(until)));
            }
            any = true;
        }
        any
    }

    fn start_flusher(self: &Arc<Self>) {
        let Ok(mut flusher) = self.flusher.lock() else {
            return;
        };
        if flusher.as_ref().is_some_and(|task| !task.is_finished()) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak: Weak<Self> = Arc::downgrade(self);
        let signal = self.flush.clone();
        *flusher = Some(runtime.spawn(async move {
            loop {
                signal.notified().await;
                let Some(breakers) = weak.upgrade() else {
                    return;
                };
                if let Err(error) = breakers.write_pending().await {
                    tracing::warn!(%error, "circuit breaker: counts not written; will retry");
                    breakers.flush.notify_one();
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                drop(breakers);
                // Under load, outcomes pile up meanwhile and go in the next write: a few
                // writes a second per breaker, whatever the job rate.
                tokio::time::sleep(FLUSH_SPACING).await;
            }
        }));
    }

    /// Writes every count that piled up: one conditional write per breaker.
    pub async fn write_pending(&self) -> StoreResult<()> {
        let pending: Vec<(Key, Pending)> = match self.pending.lock() {
            Ok(mut pending) => pending.drain().collect(),
            Err(_) => return Ok(()),
        };
        let system = Actor::system();
        for (key, counts) in pending {
            let result = self
                .update(key.0, &key.1, &system, |record, settings, now| {
                    let counted = record.record(settings, now, counts.successes, counts.failures);
                    let paused = counts.pause_until.and_then(|until| {
                        record.pause_until(
                            now,
                            until,
                            "a handler asked to retry after this (retry_after)".to_string(),
                        )
                    });
                    paused.or(counted)
                })
                .await;
            if let Err(error) = result {
                // Put the counts back for the next try.
                if let Ok(mut pending) = self.pending.lock() {
                    let entry = pending.entry(key).or_default();
                    entry.successes += counts.successes;
                    entry.failures += counts.failures;
                    entry.pause_until = entry.pause_until.max(counts.pause_until);
                }
                return Err(error);
            }
        }
        Ok(())
    }
}
