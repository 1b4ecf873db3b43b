//! One queue's lane: its fetch loop, its prefetch buffer and the demand that sizes it.

use super::*;

/// A job claimed ahead of a free slot, waiting in its lane's buffer.
pub(super) struct Prefetched {
    job: Job,
    claimed: Instant,
}

/// One queue's part of a running worker: its slots, the jobs its fetch loop claimed ahead of
/// free slots (prefetched), and what an executor needs to start the next of them itself.
///
/// Why prefetch: a fetch is one round of the store's writer, and on SQLite that round usually
/// also holds completions, so it waits for their fsync. A loop that fetches only for slots
/// already free leaves them idle for that whole round trip; with short jobs, a worker of
/// concurrency 10 then spends most of its time waiting. Keeping about as many jobs claimed as
/// the slots take during a few fetches (Little's law: departure rate × fetch latency, times
/// `PREFETCH_HEADROOM`, bounded by `prefetch`) hides the round trip: a slot that frees up
/// starts the next buffered job at once, from the executor that freed it, while the loop
/// refills the buffer.
pub(super) struct Lane {
    pub(super) shared: Arc<Shared>,
    pub(super) queue: String,
    pub(super) slots: Arc<Semaphore>,
    /// The slots batches run on (see `run_batch_fetcher`).
    pub(super) batch_slots: Arc<Semaphore>,
    pub(super) concurrency: usize,
    /// Most jobs `buffer` may hold.
    pub(super) prefetch: usize,
    /// A buffered job not started within this goes back to the queue. At most a third of the
    /// lease: a buffered job is not heartbeated, yet its lease cannot run out while it waits,
    /// and once started the heartbeat (every third of the lease) renews it in time.
    pub(super) max_wait: Duration,
    /// Claimed jobs waiting for a slot, in claim order. Nothing leaves it for an executor once
    /// `stop` is cancelled (checked under its lock), so whoever takes it after that hands back
    /// everything it held.
    pub(super) buffer: Mutex<VecDeque<Prefetched>>,
    /// Signalled when a buffered job starts, so the fetch loop tops the buffer up.
    pub(super) drained: tokio::sync::Notify,
    /// Jobs that gave their slot back, for the departure rate.
    pub(super) finished: AtomicU64,
    pub(super) stop: CancellationToken,
    pub(super) executors: Arc<Mutex<JoinSet<()>>>,
    pub(super) completions: mpsc::UnboundedSender<Completion>,
}

impl Lane {
    pub(super) fn buffer(&self) -> std::sync::MutexGuard<'_, VecDeque<Prefetched>> {
        // Plain data; a panic elsewhere while holding it leaves it usable.
        self.buffer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts buffered jobs, on `permits` first, then on whatever slots are free. The fetch
    /// loop calls it after filling the buffer and every executor after giving its slot back:
    /// whichever of the two comes second sees both the job and the free slot, so a buffered job
    /// never waits beside an idle slot.
    pub(super) fn start_buffered(self: &Arc<Self>, permits: &mut Vec<OwnedSemaphorePermit>) {
        let mut started = false;
        {
            let mut buffer = self.buffer();
            if self.stop.is_cancelled() {
                return;
            }
            let mut executors = None;
            while !buffer.is_empty() {
                let permit = match permits.pop() {
                    Some(permit) => permit,
                    None => match self.slots.clone().try_acquire_owned() {
                        Ok(permit) => permit,
                        Err(_) => break,
                    },
                };
                let Some(next) = buffer.pop_front() else {
                    break;
                };
                // Lock order: the buffer, then the executors (nowhere the other way round).
                let executors = executors.get_or_insert_with(|| {
                    self.executors
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                });
                executors.spawn(execute(self.clone(), next.job, Some(permit)));
                started = true;
            }
        }
        if started {
            self.drained.notify_one();
        }
    }

    /// Gives a finished job's slot back and starts the next buffered job on it, if any.
    pub(super) fn slot_freed(self: &Arc<Self>, permit: Option<OwnedSemaphorePermit>) {
        self.finished.fetch_add(1, Ordering::Relaxed);
        // Given back first, then taken again: see `start_buffered`.
        drop(permit);
        self.start_buffered(&mut Vec::new());
    }

    /// When the oldest buffered job is due to go back, if any.
    pub(super) fn next_due(&self) -> Option<tokio::time::Instant> {
        self.buffer()
            .front()
            .map(|oldest| tokio::time::Instant::from_std(oldest.claimed + self.max_wait))
    }

    /// Takes buffered jobs out: those that waited longer than `max_wait`, or all of them.
    pub(super) fn take_buffered(&self, all: bool) -> Vec<LeaseRef> {
        let mut buffer = self.buffer();
        let mut taken = Vec::new();
        while let Some(front) = buffer.front() {
            if !all && front.claimed.elapsed() < self.max_wait {
                break;
            }
            if let Some(stale) = buffer.pop_front() {
                if let Some(lease) = &stale.job.lease {
                    taken.push(LeaseRef {
                        id: stale.job.id,
                        lease_token: lease.token,
                    });
                }
            }
        }
        taken
    }

    /// One long-poll of this lane (a batch fetch with `batch`), until jobs come, `wait` passes
    /// or the lane stops; a panic in it is contained and reported as an error.
    pub(super) async fn fetch(
        &self,
        params: FetchParams,
        batch: bool,
        wait: Duration,
        poll: Duration,
    ) -> conveyor_core::StoreResult<Vec<Job>> {
        contained(async {
            conveyor_core::faults::inject("worker_fetch")?;
            fetch_waiting_with(
                self.shared.store.as_ref(),
                self.shared.gates(batch),
                conveyor_core::Valid::fetch(params)?,
                wait,
                poll,
                None,
                self.stop.cancelled(),
            )
            .await
        })
        .await
    }

    /// Hands claimed jobs that never started back to the queue (available at once, the
    /// attempt not counted).
    pub(super) async fn hand_back(&self, leases: Vec<LeaseRef>, why: &str) {
        if leases.is_empty() {
            return;
        }
        let count = leases.len();
        match contained(self.shared.store.jobs_release_many(leases)).await {
            Ok(released) => tracing::debug!(queue = %self.queue, released, why,
                "handed prefetched jobs back"),
            Err(error) => tracing::warn!(%error, queue = %self.queue, jobs = count, why,
                "could not hand prefetched jobs back; their leases will expire and they will be rescued"),
        }
    }
}

/// How many jobs a lane should keep prefetched: what its slots take during one fetch.
struct Demand {
    /// Jobs per second giving their slot back (moving average).
    rate: f64,
    /// Seconds one fetch takes (moving average).
    latency: f64,
    rate_known: bool,
    latency_known: bool,
    sampled_at: Instant,
    finished_then: u64,
}

impl Demand {
    fn new() -> Self {
        Self {
            rate: 0.0,
            latency: 0.0,
            rate_known: false,
            latency_known: false,
            sampled_at: Instant::now(),
            finished_then: 0,
        }
    }

    fn sample_rate(&mut self, finished: u64) {
        let elapsed = self.sampled_at.elapsed();
        if elapsed < RATE_SAMPLE {
            return;
        }
        let rate = finished.saturating_sub(self.finished_then) as f64 / elapsed.as_secs_f64();
        // The first sample is taken as it is: averaging it with "nothing known" would hold
        // the buffer back for several samples while a burst starts.
        self.rate = if self.rate_known {
            0.5 * self.rate + 0.5 * rate
        } else {
            rate
        };
        self.rate_known = true;
        self.sampled_at = Instant::now();
        self.finished_then = finished;
    }

    fn sample_latency(&mut self, took: Duration) {
        if took <= LATENCY_SAMPLE_MAX {
            let took = took.as_secs_f64();
            self.latency = if self.latency_known {
                0.7 * self.latency + 0.3 * took
            } else {
                took
            };
            self.latency_known = true;
        }
    }

    /// Little's law with `PREFETCH_HEADROOM`, within `cap`. Jobs that run longer than a few
    /// fetch latencies give less than one: nothing is prefetched for them.
    fn target(&self, cap: usize) -> usize {
        let want = PREFETCH_HEADROOM * self.rate * self.latency;
        if want.is_finite() && want >= 1.0 {
            (want as usize).min(cap)
        } else {
            0
        }
    }
}

fn take_free_permits(slots: &Arc<Semaphore>, permits: &mut Vec<OwnedSemaphorePermit>) {
    while permits.len() < MAX_FETCH_BATCH {
        match slots.clone().try_acquire_owned() {
            Ok(permit) => permits.push(permit),
            Err(_) => break,
        }
    }
}

/// One queue's fetch loop; when it stops, it hands back every job still prefetched.
pub(super) async fn run_fetcher(lane: Arc<Lane>, poll: Duration) {
    fetch_loop(&lane, poll).await;
    // `stop` is cancelled, so no executor takes from the buffer any more.
    let leftover = lane.take_buffered(true);
    lane.hand_back(leftover, "shutdown").await;
}

async fn fetch_loop(lane: &Arc<Lane>, poll: Duration) {
    let mut error_backoff = Duration::from_millis(100);
    let mut busy = false;
    // Whether the last fetch got all it asked for: only then is it worth fetching ahead.
    let mut more_waiting = false;
    let mut demand = Demand::new();
    loop {
        if lane.stop.is_cancelled() {
            return;
        }
        let stale = lane.take_buffered(false);
        lane.hand_back(stale, "not started in time").await;
        demand.sample_rate(lane.finished.load(Ordering::Relaxed));
        let target = if more_waiting {
            demand.target(lane.prefetch)
        } else {
            0
        };
        let buffered = lane.buffer().len();
        // Refill once the buffer is down to half the target, so each fetch brings a batch
        // rather than one job per job started.
        if let Some(due) = lane.next_due().filter(|_| buffered > target / 2) {
            // Enough prefetched: executors start it as slots free up. Look again when one
            // starts, or when the oldest is due to go back.
            tokio::select! {
                _ = lane.stop.cancelled() => return,
                _ = lane.drained.notified() => {}
                _ = tokio::time::sleep_until(due) => {}
            }
            continue;
        }
        // Slots free up only while the buffer is empty (executors start buffered jobs on the
        // slots they free), so permits are for the buffer-empty case.
        let mut permits: Vec<OwnedSemaphorePermit> = Vec::new();
        if buffered == 0 && target > 0 {
            take_free_permits(&lane.slots, &mut permits);
        } else if buffered == 0 {
            let first = tokio::select! {
                _ = lane.stop.cancelled() => return,
                permit = lane.slots.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return,
                },
            };
            permits.push(first);
            take_free_permits(&lane.slots, &mut permits);
            // Under load slots free up one by one; fetching for each alone would cost a commit
            // per job. When the last fetch found work, wait a moment for a quarter of the slots
            // so each fetch claims a batch. An idle worker (all slots free) fetches at once.
            let batch_target = (lane.concurrency / 4).clamp(1, MAX_FETCH_BATCH);
            if busy && permits.len() < batch_target {
                let gather = async {
                    while permits.len() < batch_target {
                        match lane.slots.clone().acquire_owned().await {
                            Ok(permit) => permits.push(permit),
                            Err(_) => break,
                        }
                    }
                };
                let _ = tokio::time::timeout(FETCH_GATHER_WAIT, gather).await;
                take_free_permits(&lane.slots, &mut permits);
            }
        }
        let room = target.saturating_sub(buffered);
        let max = (permits.len() + room).clamp(1, MAX_FETCH_BATCH);
        let params = FetchParams {
            worker_id: lane.shared.id.clone(),
            queues: vec![lane.queue.clone()],
            max,
            lease: lane.shared.lease,
            // Any kind: one without a handler fails as `unknown_kind`, visibly, rather than
            // waiting unclaimed.
            kinds: None,
            excluded_kinds: Vec::new(),
        };
        // Long-poll only for free slots; fetching ahead asks once and moves on.
        let wait = if permits.is_empty() {
            Duration::ZERO
        } else {
            Duration::from_secs(30)
        };
        let asked = Instant::now();
        let fetched = lane.fetch(params, false, wait, poll).await;
        let jobs = match fetched {
            Ok(jobs) => {
                error_backoff = Duration::from_millis(100);
                busy = !jobs.is_empty();
                more_waiting = jobs.len() >= max;
                if !jobs.is_empty() {
                    demand.sample_latency(asked.elapsed());
                }
                if let Some(observer) = &lane.shared.observer {
                    jobs.iter().for_each(|job| observer.attempt_started(job));
                }
                jobs
            }
            Err(error) => {
                tracing::error!(%error, queue = %lane.queue, retry_in = ?error_backoff, "fetch failed");
                more_waiting = false;
                drop(permits);
                // Back off, but still hand back buffered jobs on time (their leases run).
                let until = tokio::time::Instant::now() + error_backoff;
                loop {
                    let wake = lane.next_due().map_or(until, |due| due.min(until));
                    tokio::select! {
                        _ = lane.stop.cancelled() => return,
                        _ = tokio::time::sleep_until(wake) => {}
                    }
                    let stale = lane.take_buffered(false);
                    lane.hand_back(stale, "not started in time").await;
                    if tokio::time::Instant::now() >= until {
                        break;
                    }
                }
                error_backoff = (error_backoff * 2).min(Duration::from_secs(10));
                continue;
            }
        };
        if lane.stop.is_cancelled() && !jobs.is_empty() {
            // Claimed by a fetch that was in flight when shutdown began: hand them straight
            // back rather than start new work while draining.
            let leases: Vec<LeaseRef> = jobs.iter().filter_map(Job::lease_ref).collect();
            if let Err(error) = lane.shared.store.jobs_release_many(leases).await {
                tracing::warn!(%error, "could not release jobs fetched during shutdown; they will be rescued");
            }
            return;
        }
        let mut ahead = Vec::new();
        {
            let mut executors = lane.executors.lock().unwrap_or_else(|p| p.into_inner());
            for job in jobs {
                match permits.pop() {
                    Some(permit) => {
                        executors.spawn(execute(lane.clone(), job, Some(permit)));
                    }
                    // Fetched ahead (or more than asked for): it waits for a slot.
                    None => ahead.push(job),
                }
            }
            // Reap finished executors so the set does not grow without bound.
            while executors.try_join_next().is_some() {}
        }
        drop(permits);
        if !ahead.is_empty() {
            let claimed = Instant::now();
            lane.buffer()
                .extend(ahead.into_iter().map(|job| Prefetched { job, claimed }));
        }
        // Slots may have freed up while the fetch was out.
        lane.start_buffered(&mut Vec::new());
    }
}

/// One queue's batch loop (when the worker has batch handlers): takes a batch slot, fetches
/// one batch of the batch-handled kinds (waiting for one to fill), and runs it on that slot.
/// A queue runs up to its concurrency in jobs and, besides, as many batches.
pub(super) async fn run_batch_fetcher(lane: Arc<Lane>, poll: Duration) {
    let mut kinds: Vec<String> = lane.shared.batch_handlers.keys().cloned().collect();
    kinds.sort();
    let mut error_backoff = Duration::from_millis(100);
    loop {
        let permit = tokio::select! {
            _ = lane.stop.cancelled() => return,
            permit = lane.batch_slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        let params = FetchParams {
            worker_id: lane.shared.id.clone(),
            queues: vec![lane.queue.clone()],
            max: conveyor_core::batch::MAX_BATCH_SIZE as usize,
            lease: lane.shared.lease,
            kinds: Some(kinds.clone()),
            excluded_kinds: Vec::new(),
        };
        let fetched = lane
            .fetch(params, true, Duration::from_secs(30), poll)
            .await;
        let jobs = match fetched {
            Ok(jobs) => {
                error_backoff = Duration::from_millis(100);
                jobs
            }
            Err(error) => {
                tracing::error!(%error, queue = %lane.queue, retry_in = ?error_backoff, "batch fetch failed");
                drop(permit);
                tokio::select! {
                    _ = lane.stop.cancelled() => return,
                    _ = tokio::time::sleep(error_backoff) => {}
                }
                error_backoff = (error_backoff * 2).min(Duration::from_secs(10));
                continue;
            }
        };
        if jobs.is_empty() {
            continue;
        }
        if lane.stop.is_cancelled() {
            let leases = jobs.iter().filter_map(Job::lease_ref).collect();
            lane.hand_back(leases, "shutdown").await;
            return;
        }
        if let Some(observer) = &lane.shared.observer {
            jobs.iter().for_each(|job| observer.attempt_started(job));
        }
        let mut executors = lane.executors.lock().unwrap_or_else(|p| p.into_inner());
        executors.spawn(execute_batch(lane.clone(), jobs, Some(permit)));
        while executors.try_join_next().is_some() {}
    }
}

#[cfg(test)]
mod prefetch_tests {
    use super::*;
    use conveyor_core::{JobState, NewJob};
    use conveyor_sqlite::{SqliteOptions, SqliteStore};
    use std::sync::atomic::AtomicUsize;

    fn store(dir: &tempfile::TempDir) -> Arc<dyn Store> {
        Arc::new(
            SqliteStore::open(dir.path().join("jobs.db"), SqliteOptions::default())
                .expect("open store"),
        )
    }

    /// A lane of `worker`'s queue "default" with one slot, not yet fetching.
    fn lane(worker: &Worker, completions: mpsc::UnboundedSender<Completion>) -> Lane {
        Lane {
            shared: worker.shared.clone(),
            queue: "default".to_string(),
            slots: Arc::new(Semaphore::new(1)),
            batch_slots: Arc::new(Semaphore::new(1)),
            concurrency: 1,
            prefetch: 10,
            max_wait: Duration::from_millis(50),
            buffer: Mutex::new(VecDeque::new()),
            drained: tokio::sync::Notify::new(),
            finished: AtomicU64::new(0),
            stop: CancellationToken::new(),
            executors: Arc::new(Mutex::new(JoinSet::new())),
            completions,
        }
    }

    async fn insert(store: &Arc<dyn Store>, count: usize) -> Vec<Uuid> {
        let jobs = (0..count)
            .map(|n| NewJob::new("quick", serde_json::json!({ "n": n })))
            .collect();
        store
            .jobs_insert_many(jobs)
            .await
            .expect("insert")
            .into_iter()
            .map(|inserted| inserted.job.id)
            .collect()
    }

    #[test]
    fn the_buffer_covers_a_few_fetches_of_short_jobs_and_nothing_of_long_ones() {
        let mut demand = Demand::new();
        // 20,000 jobs/s leaving, 0.5 ms per fetch: 10 jobs per fetch, four fetches' worth.
        demand.rate = 20_000.0;
        demand.latency = 0.0005;
        assert_eq!(demand.target(100), 40);
        assert_eq!(demand.target(25), 25, "never above the bound");
        assert_eq!(demand.target(0), 0, "prefetch 0 turns it off");
        // 100 jobs/s (10 ms jobs on one slot): a fifth of a job per four fetches.
        demand.rate = 100.0;
        assert_eq!(demand.target(100), 0);
        demand.rate = f64::NAN;
        assert_eq!(demand.target(100), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn short_jobs_never_exceed_the_concurrency_and_shutdown_hands_prefetched_ones_back() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = store(&dir);
        let ids = insert(&store, 3000).await;
        let (running, peak, handled) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        let halfway = Arc::new(tokio::sync::Notify::new());
        let (r, p, h, half) = (
            running.clone(),
            peak.clone(),
            handled.clone(),
            halfway.clone(),
        );
        let worker = Worker::builder(store.clone())
            .queue("default", 3)
            .handle_json("quick", move |_, _| {
                let (r, p, h, half) = (r.clone(), p.clone(), h.clone(), half.clone());
                async move {
                    let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                    p.fetch_max(now, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    r.fetch_sub(1, Ordering::SeqCst);
                    if h.fetch_add(1, Ordering::SeqCst) + 1 == 1500 {
                        half.notify_one();
                    }
                    Outcome::ok()
                }
            })
            .build()
            .expect("worker");
        let report = worker.run(async move { halfway.notified().await }).await;
        assert_eq!(report.released, 0);
        assert!(peak.load(Ordering::SeqCst) <= 3, "ran more than 3 at once");
        let (mut completed, mut available) = (0, 0);
        for id in ids {
            let job = store.job_get(id).await.expect("get").expect("job");
            match job.state {
                JobState::Completed => completed += 1,
                JobState::Available => {
                    assert_eq!(job.attempt, 0, "a handed-back job's attempt is not counted");
                    available += 1;
                }
                other => panic!("job {id} left {other:?} after shutdown"),
            }
        }
        assert_eq!(completed + available, 3000);
        assert!(completed >= 1500);
        assert_eq!(completed, handled.load(Ordering::SeqCst));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn prefetched_jobs_not_started_in_time_go_back_to_the_queue() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = store(&dir);
        insert(&store, 3).await;
        let worker = Worker::builder(store.clone())
            .queue("default", 1)
            .build()
            .expect("worker");
        let (completions, _rx) = mpsc::unbounded_channel();
        let lane = lane(&worker, completions);
        let fetch = |max| FetchParams {
            worker_id: "test".to_string(),
            queues: vec!["default".to_string()],
            max,
            lease: Duration::from_secs(30),
            kinds: None,
            excluded_kinds: Vec::new(),
        };
        let old = store.jobs_fetch(fetch(2)).await.expect("fetch");
        let claimed = Instant::now();
        lane.buffer()
            .extend(old.iter().cloned().map(|job| Prefetched { job, claimed }));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let fresh = store.jobs_fetch(fetch(1)).await.expect("fetch");
        lane.buffer()
            .extend(fresh.iter().cloned().map(|job| Prefetched {
                job,
                claimed: Instant::now(),
            }));
        let stale = lane.take_buffered(false);
        assert_eq!(stale.len(), 2, "only the two that waited past max_wait");
        lane.hand_back(stale, "test").await;
        for job in &old {
            let back = store.job_get(job.id).await.expect("get").expect("job");
            assert_eq!(back.state, JobState::Available);
            assert_eq!(back.attempt, 0);
        }
        let kept = store.job_get(fresh[0].id).await.expect("get").expect("job");
        assert_eq!(kept.state, JobState::Running);
        assert_eq!(lane.take_buffered(true).len(), 1);
    }

    /// A job's future is copied when it is spawned and again when its end is joined, for
    /// every job: one that held a batch's state machine inline (a plain fetch's batch of one)
    /// was 5.2 KB in a debug build (3.3 KB with it boxed), and the drain paid for the copies.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_jobs_future_stays_small() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = store(&dir);
        insert(&store, 1).await;
        let worker = Worker::builder(store.clone())
            .queue("default", 1)
            .build()
            .expect("worker");
        let (completions, _rx) = mpsc::unbounded_channel();
        let lane = Arc::new(lane(&worker, completions));
        let job = store
            .jobs_fetch(FetchParams {
                worker_id: "test".to_string(),
                queues: vec!["default".to_string()],
                max: 1,
                lease: Duration::from_secs(30),
                kinds: None,
                excluded_kinds: Vec::new(),
            })
            .await
            .expect("fetch")
            .pop()
            .expect("a job");
        let future = super::super::execute(lane, job, None);
        let size = std::mem::size_of_val(&future);
        assert!(size <= 4096, "a job's future is {size} bytes");
    }
}
