//! Building a [`Worker`]: queues, handlers, limits and hooks.

use super::*;

pub struct WorkerBuilder {
    pub(super) store: Arc<dyn Store>,
    pub(super) id: String,
    pub(super) queues: Vec<(String, usize)>,
    pub(super) handlers: HashMap<String, Registered>,
    pub(super) batch_handlers: HashMap<String, RegisteredBatch>,
    pub(super) lease: Duration,
    pub(super) drain_timeout: Duration,
    pub(super) poll: Duration,
    pub(super) prefetch: usize,
    pub(super) default_retry: RetryPolicy,
    pub(super) maintenance: Option<Maintenance>,
    pub(super) observer: Option<Arc<dyn JobObserver>>,
    pub(super) registry_interval: Option<Duration>,
    pub(super) clock: Arc<dyn Clock>,
}

impl WorkerBuilder {
    /// Serve `queue` with at most `concurrency` jobs running at once.
    pub fn queue(mut self, queue: impl Into<String>, concurrency: usize) -> Self {
        self.queues.push((queue.into(), concurrency));
        self
    }

    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    /// Registers the handler for a typed job. The payload is decoded into `J`; one that does not
    /// decode fails permanently (class `invalid_payload`).
    pub fn handle<J, F, Fut>(self, handler: F) -> Self
    where
        J: TypedJob,
        F: Fn(JobContext, J) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Outcome> + Send + 'static,
    {
        let erased: ErasedHandler = Arc::new(move |ctx: JobContext, payload: Value| {
            match serde_json::from_value::<J>(payload) {
                Ok(job) => handler(ctx, job).map(Ok).boxed(),
                Err(e) => {
                    futures::future::ready(Err(RuntimeFailure::invalid_payload(J::KIND, e))).boxed()
                }
            }
        });
        self.register(J::KIND, erased, J::retry_policy(), None)
    }

    /// Registers a handler for `kind` that takes the raw JSON payload.
    pub fn handle_json<F, Fut>(self, kind: impl Into<String>, handler: F) -> Self
    where
        F: Fn(JobContext, Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Outcome> + Send + 'static,
    {
        let erased: ErasedHandler =
            Arc::new(move |ctx: JobContext, payload: Value| handler(ctx, payload).map(Ok).boxed());
        let retry = self.default_retry;
        self.register(kind, erased, retry, None)
    }

    /// Registers a handler that takes the jobs of `kind` in batches: up to the kind's
    /// `max_size` at once (`PUT /v1/kinds/{kind}` `{"batch": {...}}`, see
    /// `conveyor_core::batch`), all of one queue and one batch key. It answers one outcome per
    /// job, in the order given: each job completes, retries or dies by its own, with its own
    /// attempts and history; a job left without an outcome fails and retries. A queue runs up
    /// to its concurrency in batches besides its plain jobs (each batch one slot). A kind that
    /// is not a batch kind in the store comes here as batches of whatever is waiting.
    pub fn handle_batch<F, Fut>(mut self, kind: impl Into<String>, handler: F) -> Self
    where
        F: Fn(Vec<BatchJob>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Outcome>> + Send + 'static,
    {
        let handler: ErasedBatchHandler = Arc::new(move |jobs| handler(jobs).boxed());
        let kind = kind.into();
        self.handlers.remove(&kind);
        self.batch_handlers.insert(
            kind,
            RegisteredBatch {
                handler,
                retry: self.default_retry,
                timeout: None,
            },
        );
        self
    }

    fn register(
        mut self,
        kind: impl Into<String>,
        handler: ErasedHandler,
        retry: RetryPolicy,
        timeout: Option<Duration>,
    ) -> Self {
        let kind = kind.into();
        self.batch_handlers.remove(&kind);
        self.handlers.insert(
            kind,
            Registered {
                handler,
                retry,
                timeout,
            },
        );
        self
    }

    /// Backoff for `kind` (overrides the job type's own policy).
    pub fn retry_policy(mut self, kind: &str, retry: RetryPolicy) -> Self {
        if let Some(registered) = self.handlers.get_mut(kind) {
            registered.retry = retry;
        }
        if let Some(registered) = self.batch_handlers.get_mut(kind) {
            registered.retry = retry;
        }
        self
    }

    /// Default timeout for `kind` when a job sets none.
    pub fn kind_timeout(mut self, kind: &str, timeout: Duration) -> Self {
        if let Some(registered) = self.handlers.get_mut(kind) {
            registered.timeout = Some(timeout);
        }
        if let Some(registered) = self.batch_handlers.get_mut(kind) {
            registered.timeout = Some(timeout);
        }
        self
    }

    /// Backoff for jobs of unknown kind and for handlers registered without their own policy.
    pub fn default_retry(mut self, retry: RetryPolicy) -> Self {
        self.default_retry = retry;
        self
    }

    /// Lease length (default 30 s); heartbeats renew it every third of that.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long running jobs may finish after shutdown begins (default 30 s).
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Longest wait between fetch attempts when no wake-up arrives (default 1 s).
    pub fn poll_interval(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// At most how many jobs each queue's fetch loop may hold claimed but not yet started
    /// (default 200; 0 turns prefetching off). The loop keeps only as many as its slots free
    /// during a few fetches (departure rate × fetch latency × 4), so jobs that run longer
    /// than a few milliseconds are hardly ever prefetched; a prefetched job not started
    /// within a second (or a third of the lease) goes back to the queue, and shutdown hands
    /// every prefetched job back at once. See docs/guide/src/rust.md, "Prefetch".
    pub fn prefetch(mut self, max: usize) -> Self {
        self.prefetch = max;
        self
    }

    /// Also run lease rescue and due-job promotion in this worker (what an embedded,
    /// single-process setup wants). Off by default: the server runs it.
    pub fn with_maintenance(mut self, maintenance: Maintenance) -> Self {
        self.maintenance = Some(maintenance);
        self
    }

    /// Tells `observer` of every attempt outcome this worker writes (for metrics: give it the
    /// server's metrics when the worker runs in the server's process).
    pub fn observer(mut self, observer: Arc<dyn JobObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// How often the worker reports itself to the store's worker registry (default 10 s; keep
    /// it well under the maintenance's stale interval, 2 min by default).
    pub fn registry_interval(mut self, interval: Duration) -> Self {
        self.registry_interval = Some(interval);
        self
    }

    /// Does not report to the worker registry (the worker is then invisible to
    /// `GET /v1/workers`, and its jobs are rescued only when their leases expire).
    pub fn without_registry(mut self) -> Self {
        self.registry_interval = None;
        self
    }

    /// Where "now" comes from for the times the worker computes (when a snoozed job wakes,
    /// when a `retry_after` job runs again); the store's clock by default
    /// ([`conveyor_core::JobStore::clock`]), so both agree.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    pub fn build(self) -> Result<Worker, WorkerError> {
        if self.queues.is_empty() {
            return Err(WorkerError::Config(
                "no queues: call .queue(name, concurrency)".into(),
            ));
        }
        for (queue, concurrency) in &self.queues {
            conveyor_core::validate::name("queue", queue)
                .map_err(|e| WorkerError::Config(e.to_string()))?;
            if *concurrency == 0 {
                return Err(WorkerError::Config(format!(
                    "queue {queue}: concurrency must be at least 1"
                )));
            }
        }
        if self.lease < Duration::from_millis(100) {
            return Err(WorkerError::Config("lease must be at least 100 ms".into()));
        }
        if self
            .registry_interval
            .is_some_and(|interval| interval < Duration::from_millis(10))
        {
            return Err(WorkerError::Config(
                "registry interval must be at least 10 ms".into(),
            ));
        }
        Ok(Worker {
            shared: Arc::new(Shared {
                breakers: conveyor_engine::CircuitBreakers::new(
                    self.store.clone(),
                    self.clock.clone(),
                ),
                kinds: conveyor_engine::KindRegistry::new(self.store.clone()),
                store: self.store,
                id: self.id,
                handlers: self.handlers,
                batch_handlers: self.batch_handlers,
                lease: self.lease,
                default_retry: self.default_retry,
                running: Mutex::new(HashMap::new()),
                observer: self.observer,
                clock: self.clock,
            }),
            registry_interval: self.registry_interval,
            queues: self.queues,
            stop_fetching: CancellationToken::new(),
            quieted: CancellationToken::new(),
            drain_timeout: self.drain_timeout,
            poll: self.poll,
            prefetch: self.prefetch,
            maintenance: self.maintenance,
        })
    }
}
