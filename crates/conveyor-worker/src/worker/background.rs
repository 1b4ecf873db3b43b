//! The worker's background tasks: the completer, the worker registry and the heartbeats.

use super::*;

/// Writes completions in batches: one store call (one commit) for everything finished
/// meanwhile, with up to `COMPLETION_WRITES_IN_FLIGHT` such calls at once. Ends when every
/// sender is gone and every write has ended.
pub(super) async fn run_completer(
    shared: Arc<Shared>,
    mut rx: mpsc::UnboundedReceiver<Completion>,
) {
    let mut writes = tokio::task::JoinSet::new();
    let mut batch = Vec::with_capacity(64);
    loop {
        // While the writes in flight are busy, completions gather into the next batch.
        while writes.len() >= COMPLETION_WRITES_IN_FLIGHT {
            writes.join_next().await;
        }
        if rx.recv_many(&mut batch, MAX_COMPLETION_BATCH).await == 0 {
            break;
        }
        writes.spawn(write_completions(
            shared.clone(),
            std::mem::take(&mut batch),
        ));
    }
    while writes.join_next().await.is_some() {}
}

/// One batch of completions written, retrying store errors a few times; a completion that never
/// lands is rescued and rerun.
async fn write_completions(shared: Arc<Shared>, batch: Vec<Completion>) {
    {
        let (params, jobs): (Vec<CompleteParams>, Vec<JobMeta>) = batch
            .into_iter()
            .map(|completion| (completion.params, completion.job))
            .unzip();
        let mut delay = Duration::from_millis(50);
        for _ in 0..5 {
            let written = contained(async {
                conveyor_core::faults::inject("worker_complete")?;
                shared.store.jobs_complete_many(params.clone()).await
            })
            .await;
            match written {
                Ok(outcomes) => {
                    for (job, outcome) in jobs.iter().zip(outcomes) {
                        if outcome == LeaseOutcome::LeaseLost {
                            tracing::warn!(target: JOB_LOG_TARGET, job_id = %job.id, trace_id = %job.trace_id,
                                queue = %job.queue, kind = %job.kind, attempt = job.attempt,
                                outcome = "lease_lost",
                                "completion rejected: lease was lost (job rescued or cancelled)");
                            continue;
                        }
                        tracing::info!(target: JOB_LOG_TARGET, job_id = %job.id, trace_id = %job.trace_id,
                            queue = %job.queue, kind = %job.kind, attempt = job.attempt,
                            duration_ms = job.duration.as_millis() as u64,
                            outcome = "completed", "job completed");
                        shared.observe(job, AttemptStatus::Completed, None);
                    }
                    break;
                }
                Err(error) => {
                    tracing::error!(%error, jobs = jobs.len(), "completion batch failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
            }
        }
    }
}

/// What the registry's answers may ask of the worker (an operator's quiet or stop).
pub(super) struct Obey {
    /// True on `quiet` or `stop`: the fetch loops end (jobs in hand run on); false again when
    /// the command is cleared (`resume`), and fetching starts again.
    pub quiet: tokio::sync::watch::Sender<bool>,
    /// Cancelled on `stop`: the worker shuts down as if its shutdown signal had come.
    pub stop: CancellationToken,
}

/// Reports the worker to the store's registry every `interval`, and once more at shutdown as
/// `stopping`, so a graceful stop is never mistaken for a crash. An operator's command in the
/// answer is obeyed (see [`Obey`]).
pub(super) async fn run_registry(
    shared: Arc<Shared>,
    queues: Vec<(String, usize)>,
    interval: Duration,
    stop: CancellationToken,
    obey: Obey,
) {
    let concurrency = queues.iter().map(|(_, slots)| *slots).sum::<usize>();
    let mut beat = WorkerHeartbeat {
        id: shared.id.clone(),
        host: crate::hostname(),
        pid: Some(std::process::id()),
        queues: queues.into_iter().map(|(queue, _)| queue).collect(),
        concurrency: u32::try_from(concurrency).unwrap_or(u32::MAX),
        busy: 0,
        version: env!("CARGO_PKG_VERSION").to_string(),
        started_at: Utc::now(),
        stopping: false,
    };
    loop {
        beat.busy = u32::try_from(shared.running().len()).unwrap_or(u32::MAX);
        match shared.store.workers_heartbeat(beat.clone()).await {
            Ok(info) => match info.command {
                Some(conveyor_core::WorkerCommand::Quiet) if !*obey.quiet.borrow() => {
                    tracing::info!(worker_id = %shared.id, "told to quiet: no more fetching");
                    obey.quiet.send_replace(true);
                }
                Some(conveyor_core::WorkerCommand::Stop) if !obey.stop.is_cancelled() => {
                    tracing::info!(worker_id = %shared.id, "told to stop: draining, then exiting");
                    obey.quiet.send_replace(true);
                    obey.stop.cancel();
                }
                None if *obey.quiet.borrow() && !obey.stop.is_cancelled() => {
                    tracing::info!(worker_id = %shared.id, "told to resume");
                    obey.quiet.send_replace(false);
                }
                _ => {}
            },
            Err(error) => tracing::warn!(%error, "worker registry heartbeat failed; will retry"),
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(interval) => {}
        }
    }
    beat.busy = 0;
    beat.stopping = true;
    if let Err(error) = shared.store.workers_heartbeat(beat).await {
        tracing::warn!(%error, "could not record the worker's stop in the registry");
    }
}

/// Renews the leases of running jobs every third of the lease; cancels jobs whose lease is gone.
pub(super) async fn run_heartbeats(shared: Arc<Shared>, stop: CancellationToken) {
    let period = shared.lease / 3;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        let beats: Vec<(Uuid, Uuid)> = shared
            .running()
            .iter()
            .map(|(id, job)| (*id, job.lease_token))
            .collect();
        if beats.is_empty() {
            continue;
        }
        let params = beats
            .iter()
            .map(|(id, token)| HeartbeatParams {
                lease: LeaseRef {
                    id: *id,
                    lease_token: *token,
                },
                extend_by: shared.lease,
            })
            .collect();
        let renewed = contained(async {
            conveyor_core::faults::inject("worker_heartbeat")?;
            shared.store.jobs_heartbeat_many(params).await
        })
        .await;
        match renewed {
            Ok(results) => {
                let running = shared.running();
                for ((id, _), extended) in beats.iter().zip(results) {
                    if extended.is_none() {
                        if let Some(job) = running.get(id) {
                            tracing::warn!(job_id = %id, "lease lost (cancelled or rescued); stopping the handler");
                            job.cancel.cancel();
                        }
                    }
                }
            }
            Err(error) => tracing::error!(%error, "heartbeat failed; will retry"),
        }
    }
}
