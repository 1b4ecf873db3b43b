//! `conveyor bench --http URL`: the enqueue, drain and latency workloads against a running
//! `conveyor serve`, driven over HTTP the way a client library in another language drives it
//! (`clients/PROTOCOL.md`).
//!
//! The worker side is a small client of the batched protocol:
//! - `concurrency` handler tasks take jobs from a buffer of fetched jobs (no-op handlers);
//! - `fetchers` fetch loops keep up to `concurrency + prefetch` jobs claimed (running, buffered
//!   or being fetched), each `POST /v1/fetch` carrying the completions gathered since the last
//!   one; a fetch long-polls only when it carries none (so acknowledgements are answered at
//!   once);
//! - a flusher sends completions no fetch picked up within `ACK_LINGER` with `POST /v1/ack`.
//!
//! Every request goes over a keep-alive connection pool. A run counts a job done when the
//! server has answered its completion `ok`, i.e. after it is durable.

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify};
use uuid::Uuid;

use super::Workload;

const KIND: &str = "bench.noop";
/// How long completions may wait for a fetch to carry them before the flusher sends them.
const ACK_LINGER: Duration = Duration::from_millis(1);
/// Long-poll of a fetch that carries no acknowledgements.
const LONG_POLL_MS: u64 = 500;
/// The most a fetch may ask for (the server's default `max` limit).
const MAX_FETCH: usize = 1000;
/// Latency samples taken before measuring (connections, caches).
const LATENCY_WARMUP: usize = 10;

pub(super) struct Options {
    pub url: String,
    pub token: Option<String>,
    pub jobs: usize,
    pub concurrency: usize,
    pub prefetch: usize,
    pub fetchers: usize,
    pub batch: usize,
}

pub(super) async fn run(
    options: &Options,
    workloads: &[Workload],
    print: impl Fn(&Value),
) -> anyhow::Result<()> {
    let api = Api::new(&options.url, options.token.as_deref())?;
    for workload in workloads {
        let name = format!("{workload:?}").to_lowercase();
        // Each workload gets its own queue so leftovers of one never feed another.
        let queue = format!("bench-http-{name}-{}", Uuid::new_v4().simple());
        let mut line = json!({
            "workload": name,
            "mode": "http",
            "server": api.base,
            "durability": "over HTTP: as the server's store and --durability",
            "jobs": options.jobs,
            "concurrency": options.concurrency,
            "prefetch": options.prefetch,
            "fetchers": options.fetchers,
        });
        match workload {
            Workload::Flow => {
                anyhow::bail!("--workload flow runs in process (`--store`), not over --http")
            }
            Workload::Enqueue => {
                let seconds = enqueue(&api, &queue, options.jobs, options.batch).await?;
                line["batch"] = json!(options.batch);
                line["seconds"] = json!(seconds);
                line["jobs_per_s"] = json!((options.jobs as f64 / seconds).round());
            }
            Workload::Drain => {
                enqueue(&api, &queue, options.jobs, options.batch).await?;
                let seconds = drain(&api, &queue, options).await?;
                line["seconds"] = json!(seconds);
                line["jobs_per_s"] = json!((options.jobs as f64 / seconds).round());
                line["completed_on_server"] = json!(completed_on_server(&api, &queue).await?);
            }
            Workload::Latency => {
                let samples = options.jobs.min(2000);
                let (latencies, seconds) = latency(&api, &queue, samples, options).await?;
                line["jobs"] = json!(samples);
                line["seconds"] = json!(seconds);
                line["jobs_per_s"] = json!((samples as f64 / seconds).round());
                for (key, q) in [("p50_ms", 0.50), ("p95_ms", 0.95), ("p99_ms", 0.99)] {
                    line[key] = json!((super::percentile(&latencies, q) * 1000.0).round() / 1000.0);
                }
                line["completed_on_server"] = json!(completed_on_server(&api, &queue).await?);
            }
        }
        print(&line);
    }
    Ok(())
}

/// The server's API over one keep-alive connection pool.
#[derive(Clone)]
struct Api {
    base: String,
    http: reqwest::Client,
    token: Option<String>,
}

impl Api {
    fn new(base: &str, token: Option<&str>) -> anyhow::Result<Self> {
        let base = base.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            bail!("--http wants the server's base URL, like http://127.0.0.1:7700 (got {base:?})");
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60))
            .tcp_nodelay(true)
            .pool_max_idle_per_host(64)
            .build()
            .context("building the HTTP client")?;
        Ok(Self {
            base,
            http,
            token: token.map(str::to_string).filter(|t| !t.is_empty()),
        })
    }

    async fn send<T: for<'de> Deserialize<'de>>(
        &self,
        request: reqwest::RequestBuilder,
        what: &str,
    ) -> anyhow::Result<T> {
        let request = match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        let response = request
            .send()
            .await
            .with_context(|| format!("{what}: no answer from {}", self.base))?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            bail!("{what}: {status}: {body}");
        }
        response
            .json()
            .await
            .with_context(|| format!("{what}: unreadable answer"))
    }

    async fn post<T: for<'de> Deserialize<'de>>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> anyhow::Result<T> {
        let request = self.http.post(format!("{}{path}", self.base)).json(body);
        self.send(request, &format!("POST {path}")).await
    }

    async fn get<T: for<'de> Deserialize<'de>>(&self, path: &str) -> anyhow::Result<T> {
        let request = self.http.get(format!("{}{path}", self.base));
        self.send(request, &format!("GET {path}")).await
    }
}

#[derive(Serialize)]
struct NewJob<'a> {
    kind: &'a str,
    queue: &'a str,
    payload: Value,
}

#[derive(Serialize)]
struct Batch<'a> {
    jobs: Vec<NewJob<'a>>,
}

#[derive(Deserialize)]
struct BatchAnswer {
    ids: Vec<Uuid>,
}

#[derive(Deserialize)]
struct Created {
    id: Uuid,
}

#[derive(Serialize)]
struct Fetch<'a> {
    worker_id: &'a str,
    queues: [&'a str; 1],
    kinds: [&'a str; 1],
    max: usize,
    wait_ms: u64,
    complete: Vec<Completion>,
    concurrency: usize,
}

#[derive(Serialize, Clone, Copy)]
struct Completion {
    id: Uuid,
    lease_token: Uuid,
}

#[derive(Deserialize)]
struct FetchAnswer {
    jobs: Vec<Leased>,
    #[serde(default)]
    acks: Vec<ItemResult>,
}

#[derive(Deserialize)]
struct Leased {
    id: Uuid,
    lease_token: Uuid,
}

#[derive(Serialize)]
struct Ack {
    complete: Vec<Completion>,
}

#[derive(Deserialize)]
struct AckAnswer {
    results: Vec<ItemResult>,
}

#[derive(Deserialize)]
struct ItemResult {
    id: Uuid,
    status: String,
}

#[derive(Serialize)]
struct Release {
    lease_token: Uuid,
}

#[derive(Deserialize)]
struct Queues {
    queues: Vec<QueueCounts>,
}

#[derive(Deserialize)]
struct QueueCounts {
    name: String,
    completed: u64,
}

async fn completed_on_server(api: &Api, queue: &str) -> anyhow::Result<u64> {
    let queues: Queues = api.get("/v1/queues").await?;
    Ok(queues
        .queues
        .iter()
        .filter(|q| q.name == queue)
        .map(|q| q.completed)
        .sum())
}

/// `POST /v1/jobs/batch` of `batch` jobs at a time from four concurrent producers; seconds.
async fn enqueue(api: &Api, queue: &str, jobs: usize, batch: usize) -> anyhow::Result<f64> {
    let producers = 4.min(jobs.div_ceil(batch));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for p in 0..producers {
        let (api, queue) = (api.clone(), queue.to_string());
        tasks.spawn(async move {
            let mut n = p * batch;
            while n < jobs {
                let end = (n + batch).min(jobs);
                let body = Batch {
                    jobs: (n..end)
                        .map(|i| NewJob {
                            kind: KIND,
                            queue: &queue,
                            payload: json!({ "n": i }),
                        })
                        .collect(),
                };
                let answer: BatchAnswer = api.post("/v1/jobs/batch", &body).await?;
                anyhow::ensure!(
                    answer.ids.len() == end - n,
                    "the server stored {} of {} jobs",
                    answer.ids.len(),
                    end - n
                );
                n += producers * batch;
            }
            Ok::<_, anyhow::Error>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.context("producer task")??;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Runs `options.jobs` queued jobs to completion over HTTP; seconds until the server has
/// answered the last completion `ok`.
async fn drain(api: &Api, queue: &str, options: &Options) -> anyhow::Result<f64> {
    let started = Instant::now();
    let pool = HttpWorker::start(api, queue, options, None);
    pool.wait_acked(options.jobs).await?;
    let seconds = started.elapsed().as_secs_f64();
    pool.stop().await?;
    Ok(seconds)
}

/// Enqueue (`POST /v1/jobs`) to handler start on an idle queue, one job at a time, each after
/// the previous one's completion was acknowledged; (sorted latencies in ms, seconds).
async fn latency(
    api: &Api,
    queue: &str,
    samples: usize,
    options: &Options,
) -> anyhow::Result<(Vec<f64>, f64)> {
    let (started_tx, mut started_rx) = mpsc::unbounded_channel();
    let pool = HttpWorker::start(api, queue, options, Some(started_tx));
    // Let the fetchers reach their long-poll before measuring.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut latencies = Vec::with_capacity(samples);
    let mut begin = Instant::now();
    for n in 0..samples + LATENCY_WARMUP {
        if n == LATENCY_WARMUP {
            begin = Instant::now();
        }
        let job = NewJob {
            kind: KIND,
            queue,
            payload: json!({ "n": n }),
        };
        let sent = Instant::now();
        let created: Created = api.post("/v1/jobs", &job).await?;
        let (id, began) = tokio::time::timeout(Duration::from_secs(10), started_rx.recv())
            .await
            .context("a job did not start within 10 s")?
            .context("the worker stopped")?;
        anyhow::ensure!(
            id == created.id,
            "started job {id}, expected {}",
            created.id
        );
        if n >= LATENCY_WARMUP {
            latencies.push(began.saturating_duration_since(sent).as_secs_f64() * 1000.0);
        }
        // Idle means idle: the next job is enqueued once this one's completion is durable.
        pool.wait_acked(n + 1).await?;
    }
    let seconds = begin.elapsed().as_secs_f64();
    pool.stop().await?;
    latencies.sort_by(|a, b| a.total_cmp(b));
    Ok((latencies, seconds))
}

/// The client-side worker: handler tasks, fetch loops and an acknowledgement flusher.
struct HttpWorker {
    shared: Arc<Shared>,
    tasks: tokio::task::JoinSet<anyhow::Result<()>>,
}

struct Shared {
    api: Api,
    queue: String,
    worker_id: String,
    concurrency: usize,
    /// Most jobs held at once: running, buffered, or asked for by fetches in flight.
    capacity: usize,
    state: Mutex<State>,
    /// A job was buffered (handler tasks wait on it).
    job_ready: Notify,
    /// Room for more jobs, or stopping (fetch loops wait on it).
    room: Notify,
    /// Completions are waiting to be sent (the flusher waits on it).
    pending: Notify,
    /// More completions were answered `ok`, or a request failed (`wait_acked` waits on it).
    acked: Notify,
    /// Each handler start, for the latency workload.
    started: Option<mpsc::UnboundedSender<(Uuid, Instant)>>,
}

#[derive(Default)]
struct State {
    buffer: VecDeque<Leased>,
    running: usize,
    /// Jobs asked for by fetches in flight.
    asked: usize,
    completions: Vec<Completion>,
    acked_ok: usize,
    lease_lost: usize,
    failure: Option<String>,
    stopping: bool,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn record(&self, results: &[ItemResult]) {
        {
            let mut state = self.state();
            for result in results {
                match result.status.as_str() {
                    "ok" => state.acked_ok += 1,
                    "lease_lost" => state.lease_lost += 1,
                    other => {
                        state.failure =
                            Some(format!("completion of {} answered {other}", result.id))
                    }
                }
            }
        }
        self.acked.notify_waiters();
    }

    fn fail(&self, error: &anyhow::Error) {
        self.state().failure = Some(format!("{error:#}"));
        self.acked.notify_waiters();
    }
}

impl HttpWorker {
    fn start(
        api: &Api,
        queue: &str,
        options: &Options,
        started: Option<mpsc::UnboundedSender<(Uuid, Instant)>>,
    ) -> Self {
        let shared = Arc::new(Shared {
            api: api.clone(),
            queue: queue.to_string(),
            worker_id: format!("bench-http-{}", Uuid::new_v4().simple()),
            concurrency: options.concurrency,
            capacity: options.concurrency + options.prefetch,
            state: Mutex::new(State::default()),
            job_ready: Notify::new(),
            room: Notify::new(),
            pending: Notify::new(),
            acked: Notify::new(),
            started,
        });
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..options.concurrency {
            tasks.spawn(run_handlers(shared.clone()));
        }
        for _ in 0..options.fetchers {
            let shared = shared.clone();
            tasks.spawn(async move {
                let outcome = run_fetcher(&shared).await;
                if let Err(error) = &outcome {
                    shared.fail(error);
                }
                outcome
            });
        }
        let flusher = shared.clone();
        tasks.spawn(async move {
            let outcome = run_flusher(&flusher).await;
            if let Err(error) = &outcome {
                flusher.fail(error);
            }
            outcome
        });
        Self { shared, tasks }
    }

    /// Waits until `count` completions were answered `ok` in all.
    async fn wait_acked(&self, count: usize) -> anyhow::Result<()> {
        loop {
            let acked = self.shared.acked.notified();
            tokio::pin!(acked);
            acked.as_mut().enable();
            {
                let state = self.shared.state();
                if let Some(failure) = &state.failure {
                    bail!("the HTTP worker failed: {failure}");
                }
                if state.lease_lost > 0 {
                    bail!("{} completions were answered lease_lost", state.lease_lost);
                }
                if state.acked_ok >= count {
                    return Ok(());
                }
            }
            if tokio::time::timeout(Duration::from_secs(30), acked)
                .await
                .is_err()
            {
                let state = self.shared.state();
                bail!(
                    "no progress for 30 s: {} of {count} completions acknowledged",
                    state.acked_ok
                );
            }
        }
    }

    /// Stops fetching (fetches in flight end within their long-poll), lets the handlers and
    /// the flusher finish, and hands back anything still buffered.
    async fn stop(mut self) -> anyhow::Result<()> {
        self.shared.state().stopping = true;
        self.shared.job_ready.notify_waiters();
        self.shared.room.notify_waiters();
        self.shared.pending.notify_waiters();
        while let Some(done) = self.tasks.join_next().await {
            done.context("HTTP worker task")??;
        }
        let complete = std::mem::take(&mut self.shared.state().completions);
        if !complete.is_empty() {
            let answer: AckAnswer = self.shared.api.post("/v1/ack", &Ack { complete }).await?;
            self.shared.record(&answer.results);
        }
        let leftover: Vec<Leased> = self.shared.state().buffer.drain(..).collect();
        for job in leftover {
            let path = format!("/v1/jobs/{}/release", job.id);
            let _: Value = self
                .shared
                .api
                .post(
                    &path,
                    &Release {
                        lease_token: job.lease_token,
                    },
                )
                .await?;
        }
        Ok(())
    }
}

/// One handler slot: takes buffered jobs and runs a no-op handler on each.
async fn run_handlers(shared: Arc<Shared>) -> anyhow::Result<()> {
    loop {
        let job = loop {
            let ready = shared.job_ready.notified();
            tokio::pin!(ready);
            ready.as_mut().enable();
            {
                let mut state = shared.state();
                if let Some(job) = state.buffer.pop_front() {
                    state.running += 1;
                    break job;
                }
                if state.stopping {
                    return Ok(());
                }
            }
            ready.await;
        };
        if let Some(started) = &shared.started {
            let _ = started.send((job.id, Instant::now()));
        }
        // The handler: nothing to do.
        {
            let mut state = shared.state();
            state.running -= 1;
            state.completions.push(Completion {
                id: job.id,
                lease_token: job.lease_token,
            });
        }
        shared.room.notify_one();
        shared.pending.notify_one();
    }
}

/// One fetch loop: whenever there is room, asks for as many jobs as fit, carrying the
/// completions gathered so far.
async fn run_fetcher(shared: &Shared) -> anyhow::Result<()> {
    // Below this much room, a loop waits for more unless handler slots would idle.
    let worthwhile = (shared.capacity / 4).max(1);
    loop {
        let (max, complete) = loop {
            let room = shared.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut state = shared.state();
                if state.stopping {
                    return Ok(());
                }
                let held = state.running + state.buffer.len() + state.asked;
                let free = shared.capacity.saturating_sub(held);
                let starving = held < shared.concurrency;
                if free > 0 && (starving || free >= worthwhile) {
                    let max = free.min(MAX_FETCH);
                    state.asked += max;
                    break (max, std::mem::take(&mut state.completions));
                }
            }
            room.await;
        };
        // Completions are answered when the fetch returns: such a fetch does not long-poll.
        let wait_ms = if complete.is_empty() { LONG_POLL_MS } else { 0 };
        let body = Fetch {
            worker_id: &shared.worker_id,
            queues: [&shared.queue],
            kinds: [KIND],
            max,
            wait_ms,
            complete,
            concurrency: shared.concurrency,
        };
        let answer: FetchAnswer = shared.api.post("/v1/fetch", &body).await?;
        let fetched = answer.jobs.len();
        {
            let mut state = shared.state();
            state.asked -= max;
            state.buffer.extend(answer.jobs);
        }
        for _ in 0..fetched.min(shared.concurrency) {
            shared.job_ready.notify_one();
        }
        if fetched < max {
            // Room was given back: another loop may want it.
            shared.room.notify_one();
        }
        shared.record(&answer.acks);
    }
}

/// Sends completions that no fetch picked up within `ACK_LINGER` with `POST /v1/ack`.
async fn run_flusher(shared: &Shared) -> anyhow::Result<()> {
    loop {
        let pending = shared.pending.notified();
        tokio::pin!(pending);
        pending.as_mut().enable();
        let (waiting, stopping) = {
            let state = shared.state();
            (!state.completions.is_empty(), state.stopping)
        };
        if !waiting {
            if stopping {
                return Ok(());
            }
            pending.await;
            continue;
        }
        if !stopping {
            tokio::time::sleep(ACK_LINGER).await;
        }
        let complete = std::mem::take(&mut shared.state().completions);
        if complete.is_empty() {
            continue;
        }
        let answer: AckAnswer = shared.api.post("/v1/ack", &Ack { complete }).await?;
        shared.record(&answer.results);
    }
}
