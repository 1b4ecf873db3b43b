//! The reference model: the rules, held in memory.

use super::*;

#[derive(Debug, Clone)]
pub(super) struct MLease {
    pub(super) no: usize,
    pub(super) expires_at: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub(super) struct MJob {
    /// The store's id, learned from the enqueue's answer.
    pub(super) id: Uuid,
    pub(super) kind: usize,
    pub(super) queue: usize,
    pub(super) key: Option<usize>,
    pub(super) priority: i32,
    pub(super) max_attempts: u32,
    pub(super) state: JobState,
    pub(super) attempt: u32,
    pub(super) run_at: DateTime<Utc>,
    pub(super) created_at: DateTime<Utc>,
    pub(super) started_at: Option<DateTime<Utc>>,
    pub(super) finished_at: Option<DateTime<Utc>>,
    pub(super) lease: Option<MLease>,
    pub(super) errors: Vec<ErrorView>,
    /// Discarded from the dead-letter queue: gone from the store.
    pub(super) deleted: bool,
}

impl MJob {
    pub(super) fn is_due(&self, now: DateTime<Utc>) -> bool {
        matches!(self.state, JobState::Scheduled | JobState::Retryable) && self.run_at <= now
    }

    /// Whether the job's idempotency key makes a new enqueue with it a duplicate: unfinished
    /// jobs always, completed ones within the window, dead and cancelled ones never.
    pub(super) fn holds_key(&self, now: DateTime<Utc>) -> bool {
        match self.state {
            JobState::Completed => self
                .finished_at
                .is_some_and(|at| at + ms(IDEMPOTENCY_WINDOW_MS) > now),
            JobState::Dead | JobState::Cancelled => false,
            _ => true,
        }
    }

    pub(super) fn holds(&self, lease_no: usize) -> bool {
        self.state == JobState::Running && self.lease.as_ref().is_some_and(|l| l.no == lease_no)
    }
}

/// The lease number of a made-up token that no fetch handed out.
pub(super) const NO_LEASE: usize = usize::MAX;

/// A lease as the model sees a pick: its number, its job, and whether the token is bogus.
#[derive(Debug, Clone, Copy)]
pub(super) struct PickedLease {
    pub(super) no: usize,
    pub(super) job: usize,
    pub(super) bogus: bool,
}

#[derive(Debug)]
pub(super) struct Model {
    pub(super) now: DateTime<Utc>,
    pub(super) jobs: Vec<MJob>,
    /// Lease number → job index.
    pub(super) lease_jobs: Vec<usize>,
}

pub(super) fn ms(n: i64) -> chrono::Duration {
    chrono::Duration::milliseconds(n)
}

/// `fixed_exponential(base, 1 h)` without jitter: base, 2 base, 4 base, ... capped.
pub(super) fn backoff_ms(base: u64, attempt: u32) -> i64 {
    let doubling = attempt.saturating_sub(1).min(40);
    let delay = base.saturating_mul(1u64 << doubling).min(BACKOFF_MAX_MS);
    delay as i64
}

pub(super) fn state_index(state: JobState) -> usize {
    JobState::ALL
        .iter()
        .position(|s| *s == state)
        .unwrap_or_default()
}

impl Model {
    pub(super) fn new(now: DateTime<Utc>) -> Self {
        Self {
            now,
            jobs: Vec::new(),
            lease_jobs: Vec::new(),
        }
    }

    pub(super) fn job_ref(&self, index: usize) -> JobRef {
        JobRef::Job(index)
    }

    /// Inserts the batch as if one by one; new jobs get the next indices (ids come later).
    pub(super) fn enqueue(&mut self, specs: &[JobSpec]) -> Vec<Inserted> {
        let now = self.now;
        let mut out = Vec::with_capacity(specs.len());
        for spec in specs {
            if let Some(key) = spec.key {
                // The documented rule: a key held by a job (the latest that holds it) returns
                // that job.
                let holder =
                    self.jobs.iter().enumerate().rev().find(|(_, job)| {
                        !job.deleted && job.key == Some(key) && job.holds_key(now)
                    });
                if let Some((index, job)) = holder {
                    out.push(Inserted {
                        job: JobRef::Job(index),
                        duplicate: true,
                        state: job.state,
                    });
                    continue;
                }
            }
            let run_at = spec.run_at_ms.map_or(now, |offset| now + ms(offset));
            let state = if run_at > now {
                JobState::Scheduled
            } else {
                JobState::Available
            };
            self.jobs.push(MJob {
                id: Uuid::nil(),
                kind: spec.kind,
                queue: spec.queue,
                key: spec.key,
                priority: spec.priority,
                max_attempts: spec.max_attempts,
                state,
                attempt: 0,
                run_at,
                created_at: now,
                started_at: None,
                finished_at: None,
                lease: None,
                errors: Vec::new(),
                deleted: false,
            });
            out.push(Inserted {
                job: JobRef::Job(self.jobs.len() - 1),
                duplicate: false,
                state,
            });
        }
        out
    }

    pub(super) fn promote(&mut self) -> u64 {
        let now = self.now;
        let mut promoted = 0;
        for job in self.jobs.iter_mut().filter(|j| !j.deleted && j.is_due(now)) {
            job.state = JobState::Available;
            promoted += 1;
        }
        promoted
    }

    /// Promotes due jobs, then claims up to `max` available jobs of `queues` by priority
    /// (higher first), run_at, then age. Returns the claims with their new lease numbers.
    pub(super) fn fetch(&mut self, queues: &[usize], max: usize) -> Vec<(Claimed, usize)> {
        self.promote();
        let mut candidates: Vec<usize> = (0..self.jobs.len())
            .filter(|&i| {
                let job = &self.jobs[i];
                !job.deleted && job.state == JobState::Available && queues.contains(&job.queue)
            })
            .collect();
        candidates.sort_by(|&a, &b| {
            let (ja, jb) = (&self.jobs[a], &self.jobs[b]);
            jb.priority
                .cmp(&ja.priority)
                .then(ja.run_at.cmp(&jb.run_at))
                .then(a.cmp(&b))
        });
        candidates.truncate(max);
        let now = self.now;
        let mut out = Vec::with_capacity(candidates.len());
        for index in candidates {
            let no = self.lease_jobs.len();
            self.lease_jobs.push(index);
            let job = &mut self.jobs[index];
            job.state = JobState::Running;
            job.attempt += 1;
            job.started_at = Some(now);
            let expires_at = now + ms(LEASE_MS);
            job.lease = Some(MLease { no, expires_at });
            out.push((
                Claimed {
                    job: JobRef::Job(index),
                    attempt: job.attempt,
                    expires_at: Some(expires_at),
                },
                no,
            ));
        }
        out
    }

    /// The job held under `lease`, unless the lease is bogus or lost.
    pub(super) fn held(&mut self, lease: PickedLease) -> Option<&mut MJob> {
        let job = &mut self.jobs[lease.job];
        (!lease.bogus && !job.deleted && job.holds(lease.no)).then_some(job)
    }

    pub(super) fn heartbeat(
        &mut self,
        leases: &[PickedLease],
        extend_ms: u64,
    ) -> Vec<Option<DateTime<Utc>>> {
        let expires_at = self.now + ms(extend_ms as i64);
        leases
            .iter()
            .map(|&lease| {
                let job = self.held(lease)?;
                if let Some(held) = job.lease.as_mut() {
                    held.expires_at = expires_at;
                }
                Some(expires_at)
            })
            .collect()
    }

    pub(super) fn complete(&mut self, leases: &[PickedLease]) -> Vec<bool> {
        let now = self.now;
        leases
            .iter()
            .map(|&lease| match self.held(lease) {
                Some(job) => {
                    job.state = JobState::Completed;
                    job.finished_at = Some(now);
                    job.lease = None;
                    true
                }
                None => false,
            })
            .collect()
    }

    /// Records a failed attempt: `retryable` at `retry_at` while attempts remain, else `dead`.
    pub(super) fn record_failure(
        job: &mut MJob,
        now: DateTime<Utc>,
        class: &str,
        retry_at: Option<DateTime<Utc>>,
    ) {
        job.errors.push((job.attempt, now, class.to_string(), None));
        job.lease = None;
        match retry_at {
            Some(at) if job.attempt < job.max_attempts => {
                job.state = JobState::Retryable;
                job.run_at = at;
            }
            _ => {
                job.state = JobState::Dead;
                job.finished_at = Some(now);
            }
        }
    }

    pub(super) fn snap(&self, index: usize) -> Snap {
        let job = &self.jobs[index];
        Snap {
            job: JobRef::Job(index),
            state: job.state,
            attempt: job.attempt,
            run_at: job.run_at,
        }
    }

    pub(super) fn fail(&mut self, lease: PickedLease, plan: Plan) -> Result<Snap, Refusal> {
        let now = self.now;
        let Some(job) = self.held(lease) else {
            return Err(Refusal::LeaseLost(JobRef::Job(lease.job)));
        };
        let retry_at = match plan {
            Plan::Backoff => Some(now + ms(backoff_ms(FAIL_BACKOFF_MS, job.attempt))),
            Plan::At(offset) => Some((now + ms(offset)).max(now)),
            Plan::Never => None,
        };
        Self::record_failure(job, now, conveyor_core::error_class::ERROR, retry_at);
        Ok(self.snap(lease.job))
    }

    pub(super) fn snooze(&mut self, lease: PickedLease, until_ms: i64) -> Result<Snap, Refusal> {
        let now = self.now;
        let Some(job) = self.held(lease) else {
            return Err(Refusal::LeaseLost(JobRef::Job(lease.job)));
        };
        let until = (now + ms(until_ms)).max(now);
        job.state = if until > now {
            JobState::Scheduled
        } else {
            JobState::Available
        };
        job.run_at = until;
        job.attempt = job.attempt.saturating_sub(1);
        job.lease = None;
        Ok(self.snap(lease.job))
    }

    pub(super) fn release(&mut self, leases: &[PickedLease]) -> u64 {
        let mut released = 0;
        for &lease in leases {
            if let Some(job) = self.held(lease) {
                job.state = JobState::Available;
                job.attempt = job.attempt.saturating_sub(1);
                job.lease = None;
                released += 1;
            }
        }
        released
    }

    pub(super) fn cancel(&mut self, index: usize) -> Result<Snap, Refusal> {
        let now = self.now;
        let job = &mut self.jobs[index];
        if job.deleted {
            return Err(Refusal::NotFound(JobRef::Job(index)));
        }
        if job.state.is_finished() {
            return Err(Refusal::Conflict(JobRef::Job(index), job.state));
        }
        job.state = JobState::Cancelled;
        job.finished_at = Some(now);
        job.lease = None;
        Ok(self.snap(index))
    }

    pub(super) fn replay(&mut self, selected: impl Fn(usize, &MJob) -> bool) -> u64 {
        let now = self.now;
        let mut replayed = 0;
        for (index, job) in self.jobs.iter_mut().enumerate() {
            if !job.deleted && job.state == JobState::Dead && selected(index, job) {
                // The failure that ended the run is marked with the replay's time.
                if let Some(last) = job.errors.last_mut() {
                    last.3 = Some(now);
                }
                job.state = JobState::Available;
                job.attempt = 0;
                job.run_at = now;
                job.finished_at = None;
                replayed += 1;
            }
        }
        replayed
    }

    pub(super) fn discard(&mut self, index: usize) -> bool {
        let job = &mut self.jobs[index];
        if job.deleted || job.state != JobState::Dead {
            return false;
        }
        job.deleted = true;
        true
    }

    pub(super) fn rescue(&mut self) -> (Vec<JobRef>, Vec<JobRef>) {
        let now = self.now;
        let (mut retried, mut dead) = (Vec::new(), Vec::new());
        for (index, job) in self.jobs.iter_mut().enumerate() {
            let expired = job.state == JobState::Running
                && job.lease.as_ref().is_some_and(|l| l.expires_at <= now);
            if job.deleted || !expired {
                continue;
            }
            let retry_at = now + ms(backoff_ms(RESCUE_BACKOFF_MS, job.attempt));
            Self::record_failure(
                job,
                now,
                conveyor_core::error_class::LEASE_EXPIRED,
                Some(retry_at),
            );
            if job.state == JobState::Dead {
                dead.push(JobRef::Job(index));
            } else {
                retried.push(JobRef::Job(index));
            }
        }
        (retried, dead)
    }

    pub(super) fn views(&self) -> Vec<View> {
        self.jobs
            .iter()
            .enumerate()
            .filter(|(_, job)| !job.deleted)
            .map(|(index, job)| View {
                job: self.job_ref(index),
                kind: KINDS[job.kind].to_string(),
                queue: QUEUES[job.queue].to_string(),
                key: job.key.map(key_name),
                priority: job.priority,
                max_attempts: job.max_attempts,
                state: job.state,
                attempt: job.attempt,
                run_at: job.run_at,
                created_at: job.created_at,
                started_at: job.started_at,
                finished_at: job.finished_at,
                lease: job
                    .lease
                    .as_ref()
                    .map(|l| (LeaseId::No(l.no), l.expires_at)),
                errors: job.errors.clone(),
            })
            .collect()
    }

    pub(super) fn stats(&self) -> Stats {
        let mut stats = Stats::new();
        for job in self.jobs.iter().filter(|j| !j.deleted) {
            let entry = stats
                .entry(QUEUES[job.queue].to_string())
                .or_insert(([0; 7], 0));
            entry.0[state_index(job.state)] += 1;
            if job.state == JobState::Available {
                let age = (self.now - job.run_at).num_milliseconds().max(0) as u64;
                entry.1 = entry.1.max(age);
            }
        }
        stats.retain(|_, (counts, _)| counts.iter().any(|n| *n > 0));
        stats
    }

    pub(super) fn next_due(&self) -> Option<DateTime<Utc>> {
        self.jobs
            .iter()
            .filter(|j| !j.deleted && matches!(j.state, JobState::Scheduled | JobState::Retryable))
            .map(|j| j.run_at)
            .min()
    }
}

pub(super) fn key_name(key: usize) -> String {
    format!("key-{key}")
}
