//! The long-poll: fetches that wait for work without holding a connection or a slot busy.

use std::time::Duration;

use chrono::{DateTime, Utc};

use conveyor_core::job::Job;
use conveyor_core::store::{FetchParams, Store, StoreResult};
use conveyor_core::validate::Valid;

use crate::batches::Look;
use crate::breakers::CircuitBreakers;
use crate::kinds::KindRegistry;

/// What a fetch claims through besides the store.
#[derive(Clone, Copy, Default)]
pub struct Gates<'a> {
    /// Skips what open circuit breakers hold back (see [`conveyor_core::breaker`]).
    pub breakers: Option<&'a CircuitBreakers>,
    /// The kinds' settings: a plain fetch skips batch kinds, a batch fetch reads how each is
    /// batched (see [`conveyor_core::batch`]). Without it, no kind is a batch kind.
    pub kinds: Option<&'a KindRegistry>,
    /// A batch fetch: one batch of one kind (see [`crate::batches::claim_batch`]).
    pub batch: bool,
}

impl<'a> Gates<'a> {
    /// Through `breakers` only (no kind is a batch kind).
    pub fn breakers(breakers: Option<&'a CircuitBreakers>) -> Self {
        Self {
            breakers,
            ..Self::default()
        }
    }

    /// One look: the jobs claimed, and for a batch fetch, when a batch waiting to fill
    /// becomes ready and how many jobs it gave back.
    async fn look(&self, store: &dyn Store, params: &Valid<FetchParams>) -> StoreResult<Look> {
        if params.claims_nothing() {
            return Ok(Look::default());
        }
        let batches = match self.kinds {
            Some(kinds) => kinds.batches().await?,
            None => Default::default(),
        };
        if self.batch {
            return crate::batches::claim_batch(store, self.breakers, &batches, params).await;
        }
        let params = crate::batches::without_batch_kinds(params.clone(), &batches);
        let jobs = match self.breakers {
            // It named batch kinds only.
            _ if params.claims_nothing() => Vec::new(),
            Some(breakers) => breakers.fetch(params).await?,
            None => store.jobs_fetch_valid(params).await?,
        };
        Ok(Look {
            jobs,
            ..Look::default()
        })
    }
}

/// How far an idle long-poll's safety-net interval grows (see [`fetch_waiting`]).
pub const IDLE_POLL_GROWTH: u32 = 16;

/// Fetches, waiting (asynchronously) until jobs are claimed, `wait` passes, or `stop` resolves:
/// the long-poll behind `POST /v1/fetch` and the worker's fetch loop. Wake-ups come from
/// [`conveyor_core::LeaseStore::wakeup`]; the `poll` interval bounds how late a job made available by another
/// process is seen, and the next due run_at shortens it for scheduled jobs. `stop` only
/// interrupts the waiting, never a fetch in flight, so no claimed job is dropped on the floor.
/// With `breakers`, fetches skip what their circuit breakers hold back (see
/// [`conveyor_core::breaker`]). Without the kinds' settings no kind is a batch kind: servers
/// and workers call [`fetch_waiting_with`] with [`Gates::kinds`].
pub async fn fetch_waiting(
    store: &dyn Store,
    breakers: Option<&CircuitBreakers>,
    params: Valid<FetchParams>,
    wait: Duration,
    poll: Duration,
    stop: impl std::future::Future<Output = ()>,
) -> StoreResult<Vec<Job>> {
    let gates = Gates::breakers(breakers);
    fetch_waiting_with(store, gates, params, wait, poll, None, stop).await
}

/// The looks of every fetch waiting in this process, by what they fetch (queues and kinds): a
/// waiting fetch whose safety-net poll comes due skips its look when another waiting the same
/// looked less than a poll ago and found nothing (or is still looking). So a thousand idle long-polls on one queue
/// cost about one look per poll interval, not a thousand; wake-ups still make every one look.
#[derive(Debug, Default)]
pub struct IdleLooks {
    last_empty: std::sync::Mutex<std::collections::HashMap<String, tokio::time::Instant>>,
    /// Safety-net polls that looked at the store, and those skipped for another's empty look.
    looked: std::sync::atomic::AtomicU64,
    skipped: std::sync::atomic::AtomicU64,
}

/// Distinct fetch shapes remembered at most; past it the memory starts afresh.
const MAX_IDLE_SHAPES: usize = 10_000;

impl IdleLooks {
    pub fn new() -> Self {
        Self::default()
    }

    /// Safety-net polls that looked at the store (first looks and wake-ups always look and
    /// are not counted).
    pub fn looked(&self) -> u64 {
        self.looked.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Safety-net polls skipped because another fetch waiting the same had just found nothing.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn shape(params: &FetchParams, batch: bool) -> String {
        format!(
            "{:?}|{:?}|{:?}|{batch}",
            params.queues, params.kinds, params.excluded_kinds
        )
    }

    /// Whether a safety-net poll for `shape` due at `at` should look: not when another fetch
    /// waiting the same looked less than `poll` ago (found nothing, or is still looking). A
    /// poll that looks is recorded at once, so fetches whose polls come due together (they
    /// started together) send one look to the store, not one each.
    fn claim(&self, shape: &str, at: tokio::time::Instant, poll: Duration) -> bool {
        let Ok(mut looks) = self.last_empty.lock() else {
            return true;
        };
        let since = at.checked_sub(poll).unwrap_or(at);
        if looks.get(shape).is_some_and(|last| *last >= since) {
            self.skipped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return false;
        }
        self.looked
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self::remember(&mut looks, shape, at);
        true
    }

    /// A look that found jobs: the others' next polls look again.
    fn found_some(&self, shape: &str, at: tokio::time::Instant) {
        if let Ok(mut looks) = self.last_empty.lock() {
            if looks.get(shape) == Some(&at) {
                looks.remove(shape);
            }
        }
    }

    fn found_nothing(&self, shape: &str, at: tokio::time::Instant) {
        if let Ok(mut looks) = self.last_empty.lock() {
            Self::remember(&mut looks, shape, at);
        }
    }

    fn remember(
        looks: &mut std::collections::HashMap<String, tokio::time::Instant>,
        shape: &str,
        at: tokio::time::Instant,
    ) {
        if looks.len() >= MAX_IDLE_SHAPES && !looks.contains_key(shape) {
            looks.clear();
        }
        let last = looks.entry(shape.to_string()).or_insert(at);
        *last = (*last).max(at);
    }
}

/// [`fetch_waiting`] through `gates` (breakers, batch kinds, a batch fetch), sharing empty
/// looks with the other fetches waiting in this process through `idle` (see [`IdleLooks`]).
pub async fn fetch_waiting_with(
    store: &dyn Store,
    gates: Gates<'_>,
    params: Valid<FetchParams>,
    wait: Duration,
    poll: Duration,
    idle: Option<&IdleLooks>,
    stop: impl std::future::Future<Output = ()>,
) -> StoreResult<Vec<Job>> {
    let deadline = tokio::time::Instant::now() + wait;
    let shape = idle.map(|_| IdleLooks::shape(&params, gates.batch));
    // A wake-up (or the first look) always looks; a safety-net poll may be skipped.
    let mut woken = true;
    let mut next_due: Option<DateTime<Utc>> = None;
    // When a batch waiting to fill is next ready (batch fetches only).
    let mut ready_at: Option<DateTime<Utc>> = None;
    let wakeup = store.wakeup();
    tokio::pin!(stop);
    // Wake-ups bring new work at once; the poll is only a safety net (another process's jobs
    // on a store without notifications, a lost notification, a rate limit's window moving).
    // While nothing comes, each idle look waits twice as long as the last, up to
    // IDLE_POLL_GROWTH times `poll`, so a thousand idle long-polls do not keep the store busy.
    let mut idle_poll = poll;
    loop {
        // Register interest before fetching, so a wake-up between fetch and wait is not missed.
        let notified = wakeup.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let looked_at = tokio::time::Instant::now();
        let shared_empty = match (idle, &shape) {
            (Some(idle), Some(shape)) if !woken => !idle.claim(shape, looked_at, poll),
            _ => false,
        };
        // A look that gave jobs back (a keyed batch's others) and found nothing woke this
        // fetch itself: it waits for the poll or the next due time, not for that wake-up.
        let mut gave_back = false;
        if !shared_empty {
            let look = gates.look(store, &params).await?;
            ready_at = look.ready_at;
            gave_back = look.gave_back > 0;
            if gave_back {
                // Its own giving back notified the wake-up: listen afresh from here.
                notified.set(wakeup.notified());
                notified.as_mut().enable();
            }
            let jobs = look.jobs;
            if let (Some(idle), Some(shape)) = (idle, &shape) {
                if jobs.is_empty() {
                    idle.found_nothing(shape, looked_at);
                } else {
                    idle.found_some(shape, looked_at);
                }
            }
            if !jobs.is_empty() {
                return Ok(jobs);
            }
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Ok(Vec::new());
        }
        let mut until = deadline.min(now + idle_poll);
        if !gave_back {
            idle_poll = (idle_poll * 2).min(poll.saturating_mul(IDLE_POLL_GROWTH));
        }
        if !shared_empty {
            next_due = store.jobs_next_due(&params.queues).await?;
            // Due already, yet not made available: only a claim promotes, and this look may
            // not have claimed (a batch not ready yet, a plain fetch left with no kind to
            // take). Promoted here, or its due time would wake this loop at once, again and
            // again, until someone else's claim or the maintenance promoted it.
            if next_due.is_some_and(|due| due <= store.clock().now())
                && store.jobs_promote_due().await? > 0
            {
                woken = true;
                continue;
            }
        }
        // A due job's time coming is a wake-up of its own: no other fetch's look counts for it.
        let mut due_wakes = false;
        let due = match (next_due, ready_at) {
            (Some(due), Some(ready)) => Some(due.min(ready)),
            (due, ready) => due.or(ready),
        };
        if let Some(due) = due {
            let in_ms = (due - store.clock().now()).num_milliseconds().max(0) as u64;
            let at = now + Duration::from_millis(in_ms);
            if at <= until {
                until = at;
                due_wakes = true;
            }
        }
        // Biased: once `stop` has resolved, no further fetch starts, even if a wake-up is ready.
        tokio::select! {
            biased;
            _ = &mut stop => return Ok(Vec::new()),
            _ = &mut notified => {
                idle_poll = poll;
                woken = true;
            }
            _ = tokio::time::sleep_until(until) => woken = due_wakes,
        }
    }
}
