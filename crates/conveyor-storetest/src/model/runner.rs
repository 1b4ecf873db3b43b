//! The runner: one case, the store and the model side by side.

use super::*;

pub(super) struct Runner<'b, B: ModelBackend> {
    pub(super) backend: &'b B,
    pub(super) clock: Arc<ManualClock>,
    pub(super) store: Option<B::Store>,
    pub(super) model: Model,
    /// Lease number → the lease the store handed out.
    pub(super) leases: Vec<Option<LeaseRef>>,
    pub(super) tokens: HashMap<Uuid, usize>,
    /// Lease numbers the worker side was given since its last crash.
    pub(super) known: Vec<usize>,
    /// Those it believes it still holds: not yet settled, and not reported lost to it.
    pub(super) held: Vec<usize>,
    /// The lease numbers the current operation picked.
    pub(super) last_picked: Option<Vec<usize>>,
    pub(super) ids: HashMap<Uuid, usize>,
    pub(super) log: Vec<String>,
}

/// Runs one sequence on a fresh database; `Err` describes the first divergence.
pub(super) async fn run_case<B: ModelBackend>(
    backend: &B,
    ops: &[Op],
    tally: &std::sync::Mutex<Tally>,
) -> Result<(), String> {
    let db = backend.create().await;
    let clock = Arc::new(ManualClock::default());
    let store = open_with_retry(backend, &db, clock.clone()).await?;
    let mut runner = Runner {
        backend,
        model: Model::new(clock.now()),
        clock,
        store: Some(store),
        leases: Vec::new(),
        tokens: HashMap::new(),
        known: Vec::new(),
        held: Vec::new(),
        last_picked: None,
        ids: HashMap::new(),
        log: Vec::new(),
    };
    let mut outcome = Ok(());
    let mut seen = Tally::default();
    for (step, op) in ops.iter().enumerate() {
        if let Err(divergence) = runner.step(&db, op, &mut seen).await {
            outcome = Err(format!(
                "step {step} ({op:?}) diverged:\n{divergence}\n\nthe steps up to it:\n{}",
                runner.log.join("\n")
            ));
            break;
        }
    }
    if let Some(store) = runner.store.take() {
        backend.close(store).await;
    }
    drop(db);
    if outcome.is_ok() {
        if let Ok(mut total) = tally.lock() {
            for (what, n) in seen.0 {
                total.add(what, n);
            }
        }
    }
    outcome
}

pub(super) async fn open_with_retry<B: ModelBackend>(
    backend: &B,
    db: &B::Db,
    clock: Arc<ManualClock>,
) -> Result<B::Store, String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match backend.open(db, clock.clone()).await {
            Ok(store) => return Ok(store),
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(format!("cannot open the store: {e}")),
        }
    }
}

pub(super) async fn timed<T>(what: &str, work: impl Future<Output = T>) -> Result<T, String> {
    tokio::time::timeout(STEP_TIMEOUT, work)
        .await
        .map_err(|_| format!("{what} did not answer within {STEP_TIMEOUT:?}"))
}

pub(super) fn compare<T: PartialEq + fmt::Debug>(
    what: &str,
    expected: &T,
    actual: &T,
) -> Result<(), String> {
    if expected == actual {
        Ok(())
    } else {
        Err(format!(
            "{what}:\n  model expected: {expected:?}\n  store answered: {actual:?}"
        ))
    }
}

impl<B: ModelBackend> Runner<'_, B> {
    pub(super) fn store(&self) -> &B::Store {
        // Only `restart` takes the store out, and it always puts one back or fails the case.
        self.store.as_ref().expect("the runner holds an open store")
    }

    pub(super) fn job_ref(&self, id: Uuid) -> JobRef {
        self.ids
            .get(&id)
            .map_or(JobRef::Unknown(id), |&i| JobRef::Job(i))
    }

    pub(super) fn refusal(&self, error: StoreError) -> Refusal {
        match error {
            StoreError::NotFound(id) => Refusal::NotFound(self.job_ref(id)),
            StoreError::Conflict { id, state, .. } => Refusal::Conflict(self.job_ref(id), state),
            StoreError::LeaseLost(id) => Refusal::LeaseLost(self.job_ref(id)),
            other => Refusal::Other(other.to_string()),
        }
    }

    pub(super) fn snap(&self, job: &Job) -> Snap {
        Snap {
            job: self.job_ref(job.id),
            state: job.state,
            attempt: job.attempt,
            run_at: job.run_at,
        }
    }

    /// Resolves lease picks against the worker's lists; `None` when it was given no lease.
    /// A worker side without leases (none fetched since its last crash) tries made-up tokens
    /// on existing jobs instead; `None` when there are no jobs either.
    pub(super) fn pick(&mut self, picks: &[LeasePick]) -> Option<Vec<(PickedLease, LeaseRef)>> {
        if self.known.is_empty() {
            self.last_picked = None;
            return picks
                .iter()
                .map(|pick| {
                    let job = self.pick_job(pick.index)?;
                    let picked = PickedLease {
                        no: NO_LEASE,
                        job,
                        bogus: true,
                    };
                    let lease = LeaseRef {
                        id: self.model.jobs[job].id,
                        lease_token: Uuid::new_v4(),
                    };
                    Some((picked, lease))
                })
                .collect();
        }
        picks
            .iter()
            .map(|pick| {
                let list = if pick.stale || self.held.is_empty() {
                    &self.known
                } else {
                    &self.held
                };
                let no = list[pick.index % list.len()];
                let lease = self.leases[no]?;
                let lease = if pick.bogus {
                    LeaseRef {
                        id: lease.id,
                        lease_token: Uuid::new_v4(),
                    }
                } else {
                    lease
                };
                let picked = PickedLease {
                    no,
                    job: self.model.lease_jobs[no],
                    bogus: pick.bogus,
                };
                Some((picked, lease))
            })
            .collect::<Option<Vec<_>>>()
            .inspect(|picked| {
                self.last_picked = Some(picked.iter().map(|(p, _)| p.no).collect());
            })
    }

    /// The worker side stops counting on the leases it settled or was told it lost.
    pub(super) fn forget_settled(&mut self, outcome: &Outcome) {
        let Some(picked) = self.last_picked.take() else {
            return;
        };
        let forget: Vec<usize> = match outcome {
            Outcome::Heartbeats(beats) => picked
                .iter()
                .zip(beats)
                .filter(|(_, beat)| beat.is_none())
                .map(|(no, _)| *no)
                .collect(),
            Outcome::Completed(_)
            | Outcome::Failed(_)
            | Outcome::Snoozed(_)
            | Outcome::Released(_) => picked,
            _ => Vec::new(),
        };
        self.held.retain(|no| !forget.contains(no));
    }

    /// The dead job at position `index` (modulo their number) among the dead.
    pub(super) fn pick_dead(&self, index: usize) -> Option<usize> {
        let dead: Vec<usize> = (0..self.model.jobs.len())
            .filter(|&i| {
                let job = &self.model.jobs[i];
                !job.deleted && job.state == JobState::Dead
            })
            .collect();
        (!dead.is_empty()).then(|| dead[index % dead.len()])
    }

    pub(super) fn pick_job(&self, index: usize) -> Option<usize> {
        (!self.model.jobs.is_empty()).then(|| index % self.model.jobs.len())
    }

    pub(super) async fn step(
        &mut self,
        db: &B::Db,
        op: &Op,
        seen: &mut Tally,
    ) -> Result<(), String> {
        let (expected, actual, described) = self.apply(db, op).await?;
        self.log.push(format!(
            "  {:>2}: {described} -> {actual:?}",
            self.log.len()
        ));
        compare("the operation's answer", &expected, &actual)?;
        seen.record(op, &expected);
        self.forget_settled(&expected);
        self.check_state().await
    }

    /// Applies `op` to the model and the store: (expected, actual, the op as resolved).
    pub(super) async fn apply(
        &mut self,
        db: &B::Db,
        op: &Op,
    ) -> Result<(Outcome, Outcome, String), String> {
        let described = format!("{op:?}");
        match op {
            Op::Enqueue(specs) => {
                let expected = self.model.enqueue(specs);
                let jobs: Vec<NewJob> = specs.iter().map(|s| new_job(s, self.model.now)).collect();
                let answer = timed("enqueue", self.store().jobs_insert_many(jobs)).await?;
                let actual = match answer {
                    Ok(inserted) => {
                        // New jobs take their ids from the store, position by position.
                        for (want, got) in expected.iter().zip(&inserted) {
                            if let (JobRef::Job(index), false, false) =
                                (want.job, want.duplicate, got.duplicate)
                            {
                                if self.model.jobs[index].id.is_nil() {
                                    self.model.jobs[index].id = got.job.id;
                                    self.ids.insert(got.job.id, index);
                                }
                            }
                        }
                        Outcome::Enqueued(
                            inserted
                                .iter()
                                .map(|i| Inserted {
                                    job: self.job_ref(i.job.id),
                                    duplicate: i.duplicate,
                                    state: i.job.state,
                                })
                                .collect(),
                        )
                    }
                    Err(e) => Outcome::Error(e.to_string()),
                };
                Ok((Outcome::Enqueued(expected), actual, described))
            }
            Op::Fetch { queues, max } => {
                let queue_ids: Vec<usize> = match queues {
                    QueueSet::One(q) => vec![*q],
                    QueueSet::Both => (0..QUEUES.len()).collect(),
                };
                let claims = self.model.fetch(&queue_ids, *max);
                // A slot per lease number the model gave out, filled from the store's answer.
                self.leases.resize(self.model.lease_jobs.len(), None);
                let params = FetchParams {
                    worker_id: WORKER.to_string(),
                    queues: queue_ids.iter().map(|&q| QUEUES[q].to_string()).collect(),
                    max: *max,
                    lease: Duration::from_millis(LEASE_MS as u64),
                    kinds: None,
                    excluded_kinds: Vec::new(),
                };
                let answer = timed("fetch", self.store().jobs_fetch(params)).await?;
                let actual = match answer {
                    Ok(jobs) => {
                        for job in &jobs {
                            let Some(lease) = &job.lease else { continue };
                            // The lease number the model gave this job's claim, if it claimed it.
                            let claimed =
                                claims.iter().find(|(c, _)| c.job == self.job_ref(job.id));
                            if let Some((_, no)) = claimed {
                                let lease_ref = LeaseRef {
                                    id: job.id,
                                    lease_token: lease.token,
                                };
                                self.leases[*no] = Some(lease_ref);
                                self.tokens.insert(lease.token, *no);
                                self.known.push(*no);
                                self.held.push(*no);
                            }
                        }
                        Outcome::Fetched(
                            jobs.iter()
                                .map(|job| Claimed {
                                    job: self.job_ref(job.id),
                                    attempt: job.attempt,
                                    expires_at: job.lease.as_ref().map(|l| l.expires_at),
                                })
                                .collect(),
                        )
                    }
                    Err(e) => Outcome::Error(e.to_string()),
                };
                let expected = Outcome::Fetched(claims.into_iter().map(|(c, _)| c).collect());
                Ok((expected, actual, described))
            }
            Op::Heartbeat { leases, extend_ms } => {
                let Some(picked) = self.pick(leases) else {
                    return Ok((Outcome::Skipped, Outcome::Skipped, described));
                };
                let described = format!("{described} on {}", describe_leases(&picked));
                let model_leases: Vec<PickedLease> = picked.iter().map(|(p, _)| *p).collect();
                let expected = Outcome::Heartbeats(self.model.heartbeat(&model_leases, *extend_ms));
                let params = picked
                    .iter()
                    .map(|(_, lease)| HeartbeatParams {
                        lease: *lease,
                        extend_by: Duration::from_millis(*extend_ms),
                    })
                    .collect();
                let actual =
                    match timed("heartbeat", self.store().jobs_heartbeat_many(params)).await? {
                        Ok(beats) => Outcome::Heartbeats(beats),
                        Err(e) => Outcome::Error(e.to_string()),
                    };
                Ok((expected, actual, described))
            }
            Op::Complete(leases) => {
                let Some(picked) = self.pick(leases) else {
                    return Ok((Outcome::Skipped, Outcome::Skipped, described));
                };
                let described = format!("{described} on {}", describe_leases(&picked));
                let model_leases: Vec<PickedLease> = picked.iter().map(|(p, _)| *p).collect();
                let expected = Outcome::Completed(self.model.complete(&model_leases));
                let params = picked
                    .iter()
                    .map(|(_, lease)| CompleteParams {
                        lease: *lease,
                        result: None,
                    })
                    .collect();
                let actual =
                    match timed("complete", self.store().jobs_complete_many(params)).await? {
                        Ok(outcomes) => Outcome::Completed(
                            outcomes
                                .iter()
                                .map(|o| *o == LeaseOutcome::Applied)
                                .collect(),
                        ),
                        Err(e) => Outcome::Error(e.to_string()),
                    };
                Ok((expected, actual, described))
            }
            Op::Fail { lease, plan } => {
                let Some(picked) = self.pick(std::slice::from_ref(lease)) else {
                    return Ok((Outcome::Skipped, Outcome::Skipped, described));
                };
                let described = format!("{described} on {}", describe_leases(&picked));
                let (model_lease, lease_ref) = picked[0];
                let now = self.model.now;
                let expected = Outcome::Failed(self.model.fail(model_lease, *plan));
                let retry = match plan {
                    Plan::Backoff => RetryPlan::Backoff(RetryPolicy::fixed_exponential(
                        Duration::from_millis(FAIL_BACKOFF_MS),
                        Duration::from_millis(BACKOFF_MAX_MS),
                    )),
                    Plan::At(offset) => RetryPlan::At(now + ms(*offset)),
                    Plan::Never => RetryPlan::Never,
                };
                let params = FailParams {
                    lease: lease_ref,
                    class: conveyor_core::error_class::ERROR.to_string(),
                    message: "model failure".to_string(),
                    retry,
                    backtrace: None,
                };
                let answer = timed("fail", self.store().job_fail(params)).await?;
                let actual = Outcome::Failed(match answer {
                    Ok(job) => Ok(self.snap(&job)),
                    Err(e) => Err(self.refusal(e)),
                });
                Ok((expected, actual, described))
            }
            Op::Snooze { lease, until_ms } => {
                let Some(picked) = self.pick(std::slice::from_ref(lease)) else {
                    return Ok((Outcome::Skipped, Outcome::Skipped, described));
                };
                let described = format!("{described} on {}", describe_leases(&picked));
                let (model_lease, lease_ref) = picked[0];
                let until = self.model.now + ms(*until_ms);
                let expected = Outcome::Snoozed(self.model.snooze(model_lease, *until_ms));
                let params = SnoozeParams {
                    lease: lease_ref,
                    until,
                };
                let answer = timed("snooze", self.store().job_snooze(params)).await?;
                let actual = Outcome::Snoozed(match answer {
                    Ok(job) => Ok(self.snap(&job)),
                    Err(e) => Err(self.refusal(e)),
                });
                Ok((expected, actual, described))
            }
            Op::Release(leases) => {
                let Some(picked) = self.pick(leases) else {
                    return Ok((Outcome::Skipped, Outcome::Skipped, described));
                };
                let described = format!("{described} on {}", describe_leases(&picked));
                let model_leases: Vec<PickedLease> = picked.iter().map(|(p, _)| *p).collect();
                let expected = Outcome::Released(self.model.release(&model_leases));
                let refs = picked.iter().map(|(_, lease)| *lease).collect();
                let actual = match timed("release", self.store().jobs_release_many(refs)).await? {
                    Ok(n) => Outcome::Released(n),
                    Err(e) => Outcome::Error(e.to_string()),
                };
                Ok((expected, actual, described))
            }
            Op::Cancel { job } => {
                let Some(index) = self.pick_job(*job) else {
                    return Ok((Outcome::Skipped, Outcome::Skipped, described));
                };
                let described = format!("Cancel #{index}");
                let expected = Outcome::Cancelled(self.model.cancel(index));
                let id = self.model.jobs[index].id;
                let answer = timed("cancel", self.store().job_cancel(id)).await?;
                let actual = Outcome::Cancelled(match answer {
                    Ok(job) => Ok(self.snap(&job)),
                    Err(e) => Err(self.refusal(e)),
                });
                Ok((expected, actual, described))
            }
            Op::CancelUnknown => {
                let id = Uuid::now_v7();
                let expected = Outcome::Cancelled(Err(Refusal::NotFound(JobRef::Unknown(id))));
                let answer = timed("cancel", self.store().job_cancel(id)).await?;
                let actual = Outcome::Cancelled(match answer {
                    Ok(job) => Ok(self.snap(&job)),
                    Err(e) => Err(self.refusal(e)),
                });
                Ok((expected, actual, described))
            }
            Op::Replay(replay) => {
                let (selector, expected, described) = match replay {
                    Replay::Ids { dead, other } => {
                        let indices: Vec<usize> = dead
                            .iter()
                            .filter_map(|p| self.pick_dead(*p))
                            .chain(other.and_then(|p| self.pick_job(p)))
                            .collect();
                        if indices.is_empty() {
                            return Ok((Outcome::Skipped, Outcome::Skipped, described));
                        }
                        let selector = ReplaySelector {
                            ids: Some(indices.iter().map(|&i| self.model.jobs[i].id).collect()),
                            ..Default::default()
                        };
                        let expected = self.model.replay(|i, _| indices.contains(&i));
                        (
                            selector,
                            expected,
                            format!("Replay ids {}", describe_jobs(&indices)),
                        )
                    }
                    Replay::Queue(q) => {
                        let selector = ReplaySelector {
                            queue: Some(QUEUES[*q].to_string()),
                            ..Default::default()
                        };
                        (selector, self.model.replay(|_, j| j.queue == *q), described)
                    }
                    Replay::Kind(k) => {
                        let selector = ReplaySelector {
                            kind: Some(KINDS[*k].to_string()),
                            ..Default::default()
                        };
                        (selector, self.model.replay(|_, j| j.kind == *k), described)
                    }
                    Replay::All => (
                        ReplaySelector::default(),
                        self.model.replay(|_, _| true),
                        described,
                    ),
                };
                let actual = match timed("replay", self.store().dead_replay(selector)).await? {
                    Ok(n) => Outcome::Replayed(n),
                    Err(e) => Outcome::Error(e.to_string()),
                };
                Ok((Outcome::Replayed(expected), actual, described))
            }
            Op::Discard { job, dead } => {
                let picked = if *dead {
                    self.pick_dead(*job).or_else(|| self.pick_job(*job))
                } else {
                    self.pick_job(*job)
                };
                let Some(index) = picked else {
                    return Ok((Outcome::Skipped, Outcome::Skipped, described));
                };
                let described = format!("Discard #{index}");
                let expected = Outcome::Discarded(self.model.discard(index));
                let id = self.model.jobs[index].id;
                let actual = match timed("discard", self.store().dead_discard(id)).await? {
                    Ok(gone) => Outcome::Discarded(gone),
                    Err(e) => Outcome::Error(e.to_string()),
                };
                Ok((expected, actual, described))
            }
            Op::Advance { ms: by } => {
                self.clock.advance(Duration::from_millis(*by));
                self.model.now += ms(*by as i64);
                Ok((Outcome::Done, Outcome::Done, described))
            }
            Op::Rescue => {
                let (mut retried, mut dead) = self.model.rescue();
                retried.sort();
                dead.sort();
                let expected = Outcome::Rescued { retried, dead };
                let params = RescueParams {
                    limit: 10_000,
                    retry: RetryPolicy::fixed_exponential(
                        Duration::from_millis(RESCUE_BACKOFF_MS),
                        Duration::from_millis(BACKOFF_MAX_MS),
                    ),
                };
                let actual = match timed("rescue", self.store().jobs_rescue_expired(params)).await?
                {
                    Ok(report) => {
                        let mut retried: Vec<JobRef> =
                            report.retried.iter().map(|id| self.job_ref(*id)).collect();
                        let mut dead: Vec<JobRef> =
                            report.dead.iter().map(|id| self.job_ref(*id)).collect();
                        retried.sort();
                        dead.sort();
                        Outcome::Rescued { retried, dead }
                    }
                    Err(e) => Outcome::Error(e.to_string()),
                };
                Ok((expected, actual, described))
            }
            Op::Promote => {
                let expected = Outcome::Promoted(self.model.promote());
                let actual = match timed("promote", self.store().jobs_promote_due()).await? {
                    Ok(n) => Outcome::Promoted(n),
                    Err(e) => Outcome::Error(e.to_string()),
                };
                Ok((expected, actual, described))
            }
            Op::Restart { worker_survives } => {
                if let Some(store) = self.store.take() {
                    timed("closing the store", self.backend.close(store)).await?;
                }
                let store = timed(
                    "reopening the store",
                    open_with_retry(self.backend, db, self.clock.clone()),
                )
                .await??;
                self.store = Some(store);
                if !worker_survives {
                    // A crashed worker's leases are gone with it.
                    self.known.clear();
                    self.held.clear();
                }
                Ok((Outcome::Done, Outcome::Done, described))
            }
        }
    }

    /// Compares every job, the queue counts and the next due time with the model.
    pub(super) async fn check_state(&self) -> Result<(), String> {
        let listed = timed(
            "jobs_list",
            self.store().jobs_list({
                let mut params = JobListParams::default();
                params.limit = 100_000;
                params
            }),
        )
        .await?
        .map_err(|e| format!("jobs_list failed: {e}"))?;
        let mut actual: Vec<View> = listed.iter().map(|job| self.view(job)).collect();
        actual.sort_by_key(|v| v.job);
        let expected = self.model.views();
        if expected != actual {
            let mut lines = Vec::new();
            let by_job = |views: &[View]| -> BTreeMap<JobRef, View> {
                views.iter().map(|v| (v.job, v.clone())).collect()
            };
            let (want, got) = (by_job(&expected), by_job(&actual));
            for job in want
                .keys()
                .chain(got.keys())
                .collect::<std::collections::BTreeSet<_>>()
            {
                match (want.get(job), got.get(job)) {
                    (Some(w), Some(g)) if w == g => {}
                    (Some(w), Some(g)) => lines.push(format!(
                        "  job {job} ({} in the model): {}",
                        w.state,
                        view_diff(w, g).join("; ")
                    )),
                    (w, g) => lines.push(format!(
                        "  job {job}:\n    model expected: {w:?}\n    store has:      {g:?}"
                    )),
                }
            }
            return Err(format!(
                "the stored jobs differ (now = {}):\n{}",
                self.model.now,
                lines.join("\n")
            ));
        }

        let stats = timed("queues_stats", self.store().queues_stats())
            .await?
            .map_err(|e| format!("queues_stats failed: {e}"))?;
        compare("queue stats", &self.model.stats(), &stats_of(&stats))?;

        let queues: Vec<String> = QUEUES.iter().map(|q| q.to_string()).collect();
        let next_due = timed("jobs_next_due", self.store().jobs_next_due(&queues))
            .await?
            .map_err(|e| format!("jobs_next_due failed: {e}"))?;
        compare("next due run_at", &self.model.next_due(), &next_due)
    }

    pub(super) fn view(&self, job: &Job) -> View {
        View {
            job: self.job_ref(job.id),
            kind: job.kind.clone(),
            queue: job.queue.clone(),
            key: job.idempotency_key.clone(),
            priority: job.priority,
            max_attempts: job.max_attempts,
            state: job.state,
            attempt: job.attempt,
            run_at: job.run_at,
            created_at: job.created_at,
            started_at: job.started_at,
            finished_at: job.finished_at,
            lease: job.lease.as_ref().map(|l| {
                let id = self
                    .tokens
                    .get(&l.token)
                    .map_or(LeaseId::Foreign(l.token), |&no| LeaseId::No(no));
                (id, l.expires_at)
            }),
            errors: job.errors.iter().map(error_view).collect(),
        }
    }
}

/// The fields in which two views of one job differ.
pub(super) fn view_diff(model: &View, store: &View) -> Vec<String> {
    let mut out = Vec::new();
    macro_rules! fields {
        ($($field:ident),*) => {$(
            if model.$field != store.$field {
                out.push(format!(
                    "{}: model {:?}, store {:?}",
                    stringify!($field),
                    model.$field,
                    store.$field
                ));
            }
        )*};
    }
    fields!(
        kind,
        queue,
        key,
        priority,
        max_attempts,
        state,
        attempt,
        run_at,
        created_at,
        started_at,
        finished_at,
        lease,
        errors
    );
    out
}

/// What the model checks of a history entry: attempt, time, class, and replay mark.
pub(super) type ErrorView = (u32, DateTime<Utc>, String, Option<DateTime<Utc>>);

pub(super) fn error_view(e: &ErrorRecord) -> ErrorView {
    (e.attempt, e.at, e.class.clone(), e.replayed_at)
}

pub(super) fn stats_of(stats: &[QueueStats]) -> Stats {
    stats
        .iter()
        .map(|s| {
            let counts = [
                s.scheduled,
                s.available,
                s.running,
                s.retryable,
                s.completed,
                s.dead,
                s.cancelled,
            ];
            (s.name.clone(), (counts, s.oldest_available_age_ms))
        })
        .filter(|(_, (counts, _))| counts.iter().any(|n| *n > 0))
        .collect()
}

pub(super) fn new_job(spec: &JobSpec, now: DateTime<Utc>) -> NewJob {
    let mut job = NewJob::new(KINDS[spec.kind], serde_json::json!({}));
    job.queue = QUEUES[spec.queue].to_string();
    job.idempotency_key = spec.key.map(key_name);
    job.run_at = spec.run_at_ms.map(|offset| now + ms(offset));
    job.priority = spec.priority;
    job.max_attempts = spec.max_attempts;
    job
}

pub(super) fn describe_leases(picked: &[(PickedLease, LeaseRef)]) -> String {
    picked
        .iter()
        .map(|(p, _)| {
            if p.no == NO_LEASE {
                format!("a made-up token on #{}", p.job)
            } else {
                format!(
                    "lease {} of #{}{}",
                    p.no,
                    p.job,
                    if p.bogus { " (bogus token)" } else { "" }
                )
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn describe_jobs(indices: &[usize]) -> String {
    indices
        .iter()
        .map(|i| format!("#{i}"))
        .collect::<Vec<_>>()
        .join(", ")
}
