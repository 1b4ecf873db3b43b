//! `conveyor bench`: enqueue, drain and latency workloads against a store, in process (and
//! workflows, the soak, over HTTP, several nodes, and event sources' ingest from a broker).

use anyhow::Context;
use clap::{Args, ValueEnum};
use conveyor::{NewJob, Outcome, Store, Worker};
use serde_json::json;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify};

use super::DurabilityArg;

// So are the workflow workloads.
mod flows;
// The soak is part of `conveyor bench`.
mod soak;
// So is the HTTP bench (`--http URL`).
mod http;
// And event sources: a broker's messages into jobs (`--workload ingest --broker TYPE`).
mod ingest;
mod nodes;

#[derive(Args, Debug)]
pub(crate) struct BenchArgs {
    /// Jobs per workload (default 100,000; latency uses at most 2,000 samples). For ingest:
    /// messages per broker (default 100,000; 2,000 for sqs).
    #[arg(long)]
    jobs: Option<usize>,
    /// Worker concurrency for drain and latency.
    #[arg(long, default_value_t = 100)]
    concurrency: usize,
    /// Store to measure. Default: a fresh SQLite file in a temp directory, deleted afterwards.
    #[arg(long, env = "CONVEYOR_STORE", conflicts_with = "http")]
    store: Option<String>,
    /// Drain with this many worker nodes, each with a store (connection pool) of its own, on
    /// one PostgreSQL (`--store postgres://...`); `--concurrency` is per node. Reports
    /// PostgreSQL's CPU time and lock waits beside the throughput.
    #[arg(long)]
    nodes: Option<usize>,
    /// Measure a running `conveyor serve` at this base URL instead, over HTTP with the batched
    /// worker protocol (`clients/PROTOCOL.md`), as a client library would.
    #[arg(long, value_name = "URL")]
    http: Option<String>,
    /// With --http: an API token, for a server with access control on (an admin token: the
    /// bench enqueues, works and reads `/v1/queues` to check the jobs completed).
    #[arg(
        long,
        env = "CONVEYOR_TOKEN",
        hide_env_values = true,
        requires = "http"
    )]
    token: Option<String>,
    /// Most jobs claimed ahead of free slots: the in-process Worker's prefetch bound (its
    /// default, 200, when not given; 0 turns it off), or what the HTTP client holds beyond
    /// its handler slots (default 200).
    #[arg(long)]
    prefetch: Option<usize>,
    /// With --http: fetch requests the client keeps in flight at once.
    #[arg(long, default_value_t = 2, requires = "http")]
    fetchers: usize,
    #[arg(long, value_enum, default_value_t = DurabilityArg::Durable)]
    durability: DurabilityArg,
    /// Workloads to run. `ingest` (not run unless named) needs --broker.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "enqueue,drain,latency"
    )]
    workload: Vec<WorkloadArg>,
    /// Jobs per insert call in the enqueue workload. For ingest: the source's
    /// `max_in_flight`, the most messages read and committed as jobs in one store call (at
    /// most 10,000).
    #[arg(long, default_value_t = 1000)]
    batch: usize,
    /// For the ingest workload: the brokers to measure, each in a run of its own (a fresh
    /// stream, queue, session or topic, and by default a fresh SQLite store). Brokers other
    /// than sqs and kafka default to their usual port on 127.0.0.1.
    #[arg(long, value_enum, value_delimiter = ',')]
    broker: Vec<ingest::BrokerType>,
    /// For ingest with one --broker: its URL (sqs: the endpoint, e.g. moto's
    /// http://127.0.0.1:5000; kafka: the bootstrap brokers, host:port). Required for sqs and
    /// kafka.
    #[arg(long, value_name = "URL")]
    broker_url: Option<String>,
    /// One JSON object per line instead of text.
    #[arg(long)]
    json: bool,
    /// Spread the jobs over this many tenants (round-robin), so fetches go through tenant
    /// fairness. 0: jobs have no tenant.
    #[arg(long, default_value_t = 0)]
    tenants: usize,
    /// Before the workloads, store this many unfinished flows of ten steps (their first step
    /// queued where no worker looks), to measure the plain job path with flows stored.
    #[arg(long, default_value_t = 0)]
    stored_flows: usize,
    /// Run the workloads with this concurrency limit on their queue.
    #[arg(long)]
    concurrency_limit: Option<u64>,
    /// ... and this per-tenant concurrency limit.
    #[arg(long)]
    per_key_concurrency_limit: Option<u64>,
    /// ... and this rate limit (`COUNT/PERIOD`, e.g. `50000/1s`).
    #[arg(long)]
    rate_limit: Option<super::admin::Rate>,
    /// Spread the jobs over this many customers (`payload.customer`) and put the queue under
    /// a named limit keyed by it (`--key-concurrency` per customer), so fetches go through the
    /// named limits' admission and take turns by customer. 0: no named limit.
    #[arg(long, default_value_t = 0)]
    limit_keys: usize,
    /// With `--limit-keys`: the named limit's concurrency per customer.
    #[arg(long, default_value_t = 10, requires = "limit_keys")]
    key_concurrency: u64,
    #[command(flatten)]
    soak: soak::SoakArgs,
}

impl BenchArgs {
    /// The settings each workload's queue gets: the limits asked for, else none.
    fn queue_settings(&self) -> conveyor::QueueSettings {
        let mut settings = conveyor::QueueSettings::default();
        settings.concurrency_limit = self.concurrency_limit;
        settings.per_key_concurrency_limit = self.per_key_concurrency_limit;
        settings.rate_limit = self.rate_limit.and_then(|rate| rate.limit());
        if self.limit_keys > 0 {
            settings.limits = vec![BENCH_LIMIT.to_string()];
        }
        settings
    }
}

/// The named limit `--limit-keys` puts each workload's queue under.
const BENCH_LIMIT: &str = "bench-per-customer";

impl BenchArgs {
    /// Defines the named limit `--limit-keys` asks for (nothing without it).
    async fn define_limit(&self, store: &Arc<dyn Store>) -> anyhow::Result<()> {
        if self.limit_keys == 0 {
            return Ok(());
        }
        let limit = json!({"concurrency": self.key_concurrency, "key": "payload.customer"});
        conveyor::limits::LimitSpec::from_json(BENCH_LIMIT, limit.clone())
            .map_err(|e| anyhow::anyhow!("--key-concurrency: {e}"))?;
        store
            .config_put(conveyor::config::LIMITS, BENCH_LIMIT, limit)
            .await
            .context("defining the bench's named limit")?;
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Workload {
    Enqueue,
    Drain,
    Latency,
    /// Workflow steps: `--jobs / 10` chains of 5 steps, then `--jobs / 100` fan-out/fan-in
    /// flows of 100 steps (a root, 98 members, a callback), each drained by the in-process
    /// worker; compare its steps/s with `drain` of the same run.
    Flow,
}

/// A workload as `--workload` names it: one of the job workloads, or `ingest`. Kept apart from
/// [`Workload`], which the HTTP bench takes whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WorkloadArg {
    Jobs(Workload),
    Ingest,
}

impl ValueEnum for WorkloadArg {
    fn value_variants<'a>() -> &'a [Self] {
        &[
            WorkloadArg::Jobs(Workload::Enqueue),
            WorkloadArg::Jobs(Workload::Drain),
            WorkloadArg::Jobs(Workload::Latency),
            WorkloadArg::Jobs(Workload::Flow),
            WorkloadArg::Ingest,
        ]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        match self {
            WorkloadArg::Jobs(workload) => workload.to_possible_value(),
            WorkloadArg::Ingest => Some(clap::builder::PossibleValue::new("ingest").help(
                "Event sources (needs --broker): publishes `--jobs` messages to a fresh stream, \
                 queue or topic and times it (every message confirmed by the broker), then runs \
                 a source on it as `conveyor serve` does and times it until every message is a \
                 durable job; checks the queue holds exactly one job per message. Reports both \
                 rates and their ratio. MQTT publishes while the source runs (a broker keeps \
                 few messages for a session that is away)",
            )),
        }
    }
}

pub(crate) async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    if let Some(duration) = args.soak.soak {
        let store = args.store.as_deref();
        return soak::run(&args.soak, duration, store, args.durability, args.json).await;
    }
    let jobs = args.jobs.unwrap_or(100_000);
    if jobs == 0 || args.concurrency == 0 || args.batch == 0 {
        anyhow::bail!("--jobs, --concurrency and --batch must be at least 1");
    }
    let ingesting = args.workload.contains(&WorkloadArg::Ingest);
    if ingesting {
        if args.broker.is_empty() {
            anyhow::bail!(
                "--workload ingest needs --broker (redis_stream, amqp, nats, mqtt, sqs, kafka)"
            );
        }
        if args.http.is_some() || args.nodes.is_some() {
            anyhow::bail!("--workload ingest runs in process: --http and --nodes do not apply");
        }
        if args.batch > conveyor_core::sources::MAX_IN_FLIGHT {
            anyhow::bail!(
                "--batch is the source's max_in_flight for ingest: at most {}",
                conveyor_core::sources::MAX_IN_FLIGHT
            );
        }
    } else if !args.broker.is_empty() || args.broker_url.is_some() {
        anyhow::bail!("--broker and --broker-url are for --workload ingest");
    }
    if args.broker_url.is_some() && args.broker.len() > 1 {
        anyhow::bail!("--broker-url goes with one --broker");
    }
    if let Some(url) = &args.http {
        if args.tenants > 0
            || args.limit_keys > 0
            || args.queue_settings() != conveyor::QueueSettings::default()
            || args.durability != DurabilityArg::Durable
        {
            anyhow::bail!(
                "--http measures the server as it runs: --tenants, limits and --durability \
                 do not apply (start `conveyor serve` with the settings wanted)"
            );
        }
        if args.fetchers == 0 {
            anyhow::bail!("--fetchers must be at least 1");
        }
        let options = http::Options {
            url: url.clone(),
            token: args.token.clone(),
            jobs,
            concurrency: args.concurrency,
            prefetch: args.prefetch.unwrap_or(200),
            fetchers: args.fetchers,
            batch: args.batch,
        };
        let json_lines = args.json;
        let workloads: Vec<Workload> = args
            .workload
            .iter()
            .filter_map(|chosen| match chosen {
                WorkloadArg::Jobs(workload) => Some(*workload),
                WorkloadArg::Ingest => None,
            })
            .collect();
        http::run(&options, &workloads, |line| {
            if json_lines {
                println!("{line}");
            } else {
                println!("{}", describe(line));
            }
        })
        .await?;
        return Ok(ExitCode::SUCCESS);
    }
    if args.nodes == Some(0) {
        anyhow::bail!("--nodes must be at least 1");
    }
    let temp = TempDir::create()?;
    let url = match &args.store {
        Some(url) => url.clone(),
        None => format!("sqlite://{}", temp.0.join("bench.db").display()),
    };
    let store = conveyor::open_store(&url, args.durability.open_options())
        .await
        .with_context(|| format!("cannot open store {url}"))?;
    args.define_limit(&store).await?;
    // SQLite: our own fsync policy. PostgreSQL: the server's `synchronous_commit` decides.
    let postgres = url.starts_with("postgres://") || url.starts_with("postgresql://");
    if args.nodes.is_some() && !postgres {
        anyhow::bail!(
            "--nodes needs --store postgres://...: an SQLite file serves one process at a time"
        );
    }
    let durable = if postgres {
        serde_json::Value::Null
    } else {
        json!(args.durability == DurabilityArg::Durable)
    };
    let durability = if postgres {
        "postgres: commits as durable as the server's synchronous_commit"
    } else if args.durability == DurabilityArg::Durable {
        "sqlite: fsync before every acknowledgement"
    } else {
        "sqlite relaxed: no fsync per commit"
    };
    let shown_url = if args.store.is_some() {
        url.clone()
    } else {
        "sqlite://(temp file)".to_string()
    };
    if args.stored_flows > 0 {
        let seconds = flows::store_idle(&store, args.stored_flows).await?;
        let line = json!({"workload": "stored-flows", "store": shown_url, "flows": args.stored_flows,
            "steps": args.stored_flows * 10, "seconds": seconds});
        if args.json {
            println!("{line}");
        } else {
            println!(
                "stored   {} unfinished flows of 10 steps in {seconds:.3} s (kept for the workloads below)",
                args.stored_flows
            );
        }
    }
    for chosen in &args.workload {
        let workload = match chosen {
            WorkloadArg::Jobs(workload) => workload,
            WorkloadArg::Ingest => {
                let line = json!({
                    "workload": "ingest", "store": shown_url, "durable": durable,
                    "durability": durability,
                });
                for (n, &broker) in args.broker.iter().enumerate() {
                    let messages = args.jobs.unwrap_or(broker.default_messages());
                    // A fresh SQLite file for each broker, unless a store was given.
                    let own = match &args.store {
                        Some(_) => None,
                        None => {
                            let path = temp.0.join(format!("ingest-{}.db", broker.name()));
                            let url = format!("sqlite://{}", path.display());
                            let opened = conveyor::open_store(&url, args.durability.open_options())
                                .await
                                .with_context(|| format!("cannot open store {url}"))?;
                            Some(opened)
                        }
                    };
                    let measured = ingest::run(
                        own.as_ref().unwrap_or(&store),
                        broker,
                        args.broker_url.as_deref(),
                        messages,
                        args.batch,
                    )
                    .await?;
                    drop(own);
                    let mut line = line.clone();
                    if let (Some(fields), Some(measured)) =
                        (line.as_object_mut(), measured.as_object())
                    {
                        fields.extend(measured.clone());
                    }
                    if args.json {
                        println!("{line}");
                    } else {
                        if n == 0 {
                            println!(
                                "{:<8} {:<13} {:>9} {:>14} {:>13} {:>6}",
                                "ingest",
                                "broker",
                                "messages",
                                "publish msg/s",
                                "ingest msg/s",
                                "ratio"
                            );
                        }
                        println!("{}", describe_ingest(&line));
                    }
                }
                continue;
            }
        };
        // Each workload gets its own queue so leftovers of one never feed another.
        let queue = format!(
            "bench-{}-{}",
            format!("{workload:?}").to_lowercase(),
            uuid::Uuid::new_v4().simple()
        );
        let settings = args.queue_settings();
        if settings != conveyor::QueueSettings::default() {
            store
                .queue_settings_put(&queue, settings.clone())
                .await
                .context("setting the bench queue's limits")?;
        }
        let mut line = json!({
            "workload": format!("{workload:?}").to_lowercase(),
            "store": shown_url, "durable": durable, "durability": durability,
            "jobs": jobs, "concurrency": args.concurrency, "prefetch": args.prefetch,
            "tenants": args.tenants,
            "limit_keys": args.limit_keys,
            "key_concurrency": (args.limit_keys > 0).then_some(args.key_concurrency),
            "concurrency_limit": settings.concurrency_limit,
            "per_key_concurrency_limit": settings.per_key_concurrency_limit,
            "rate_limit": settings.rate_limit,
        });
        let shape = Shape {
            queue: queue.clone(),
            tenants: args.tenants,
            customers: args.limit_keys,
        };
        match workload {
            Workload::Enqueue => {
                let seconds = enqueue(&store, &shape, jobs, args.batch).await?;
                line["batch"] = json!(args.batch);
                line["seconds"] = json!(seconds);
                line["jobs_per_s"] = json!((jobs as f64 / seconds).round());
            }
            Workload::Drain if args.nodes.is_some() => {
                let nodes = args.nodes.unwrap_or(1);
                enqueue(&store, &shape, jobs, args.batch).await?;
                let measured = nodes::drain(
                    &url,
                    args.durability.open_options(),
                    &queue,
                    jobs,
                    nodes,
                    args.concurrency,
                )
                .await?;
                line["nodes"] = json!(nodes);
                line["seconds"] = json!(measured.seconds);
                line["jobs_per_s"] = json!((jobs as f64 / measured.seconds).round());
                line["postgres_cpu_seconds"] = json!(measured.postgres_cpu_seconds);
                line["lock_wait_samples"] = json!(measured.lock_waits);
                line["activity_samples"] = json!(measured.samples);
                line["skip_locked_misses"] = json!(measured.skip_locked_misses);
            }
            Workload::Drain => {
                enqueue(&store, &shape, jobs, args.batch).await?;
                let seconds = drain(&store, &queue, jobs, args.concurrency, args.prefetch).await?;
                line["seconds"] = json!(seconds);
                line["jobs_per_s"] = json!((jobs as f64 / seconds).round());
            }
            Workload::Flow => {
                for shape in [flows::Shape::Chain, flows::Shape::Fan] {
                    let per = match shape {
                        flows::Shape::Chain => 10,
                        flows::Shape::Fan => 100,
                    };
                    let flows = (jobs / per).max(1);
                    let steps = flows * shape.steps();
                    let queue = format!("bench-{}-{}", shape.name(), uuid::Uuid::new_v4().simple());
                    let created = flows::create(&store, shape, &queue, flows).await?;
                    let seconds =
                        drain(&store, &queue, steps, args.concurrency, args.prefetch).await?;
                    let mut line = line.clone();
                    line["workload"] = json!(shape.name());
                    line["flows"] = json!(flows);
                    line["steps_per_flow"] = json!(shape.steps());
                    line["jobs"] = json!(steps);
                    line["create_seconds"] = json!(created);
                    line["flows_per_s"] = json!((flows as f64 / created).round());
                    line["seconds"] = json!(seconds);
                    line["jobs_per_s"] = json!((steps as f64 / seconds).round());
                    if args.json {
                        println!("{line}");
                    } else {
                        println!(
                            "{}  ({flows} flows of {} steps created at {} flows/s)",
                            describe(&line),
                            shape.steps(),
                            line["flows_per_s"]
                        );
                    }
                }
                continue;
            }
            Workload::Latency => {
                let samples = jobs.min(2000);
                let (latencies, seconds) =
                    latency(&store, &shape, samples, args.concurrency).await?;
                line["jobs"] = json!(samples);
                line["seconds"] = json!(seconds);
                line["jobs_per_s"] = json!((samples as f64 / seconds).round());
                for (key, q) in [("p50_ms", 0.50), ("p95_ms", 0.95), ("p99_ms", 0.99)] {
                    line[key] = json!((percentile(&latencies, q) * 1000.0).round() / 1000.0);
                }
            }
        }
        if args.json {
            println!("{line}");
        } else {
            println!("{}", describe(&line));
        }
    }
    drop(store);
    Ok(ExitCode::SUCCESS)
}

fn describe(line: &serde_json::Value) -> String {
    let mut text = format!(
        "{:<8} {:>10} jobs/s  ({} jobs in {:.3} s, concurrency {}, {})",
        line["workload"].as_str().unwrap_or("?"),
        line["jobs_per_s"],
        line["jobs"],
        line["seconds"].as_f64().unwrap_or(0.0),
        line["concurrency"],
        line["durability"].as_str().unwrap_or("?")
    );
    if line.get("p50_ms").is_some() {
        text.push_str(&format!(
            "  p50 {} ms  p95 {} ms  p99 {} ms",
            line["p50_ms"], line["p95_ms"], line["p99_ms"]
        ));
    }
    text
}

/// One ingest run as a row under its header, its details after.
fn describe_ingest(line: &serde_json::Value) -> String {
    format!(
        "{:<8} {:<13} {:>9} {:>14.0} {:>13.0} {:>6.2}  (publish {:.3} s; ingest {:.3} s, first \
         job after {:.3} s; {}; max_in_flight {}; {})",
        "ingest",
        line["broker"].as_str().unwrap_or("?"),
        line["messages"].as_u64().unwrap_or(0),
        line["publish_msgs_per_s"].as_f64().unwrap_or(0.0),
        line["ingest_msgs_per_s"].as_f64().unwrap_or(0.0),
        line["ratio"].as_f64().unwrap_or(0.0),
        line["publish_seconds"].as_f64().unwrap_or(0.0),
        line["ingest_seconds"].as_f64().unwrap_or(0.0),
        line["first_job_seconds"].as_f64().unwrap_or(0.0),
        line["mode"].as_str().unwrap_or("?"),
        line["max_in_flight"],
        line["durability"].as_str().unwrap_or("?")
    )
}

/// The `q` quantile (0..=1) of sorted samples; 0 when there are none.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

/// The default bench store's directory, removed when the bench ends, however it ends.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn create() -> anyhow::Result<Self> {
        let dir =
            std::env::temp_dir().join(format!("conveyor-bench-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where a workload's jobs go and how they are spread over tenants.
#[derive(Clone)]
struct Shape {
    queue: String,
    tenants: usize,
    /// Spread over this many `payload.customer` values (0: no customer).
    customers: usize,
}

impl Shape {
    fn job(&self, n: usize) -> NewJob {
        let payload = if self.customers > 0 {
            json!({"n": n, "customer": format!("c{}", n % self.customers)})
        } else {
            json!({"n": n})
        };
        let mut job = NewJob::new("bench.noop", payload);
        job.queue = self.queue.clone();
        if self.tenants > 0 {
            job.tenant = Some(format!("tenant-{}", n % self.tenants));
        }
        job
    }
}

/// Bulk insert in batches from a few concurrent producers; returns seconds.
async fn enqueue(
    store: &Arc<dyn Store>,
    shape: &Shape,
    jobs: usize,
    batch: usize,
) -> anyhow::Result<f64> {
    let producers = 4.min(jobs.div_ceil(batch));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for p in 0..producers {
        let store = store.clone();
        let shape = shape.clone();
        tasks.spawn(async move {
            let mut n = p * batch;
            while n < jobs {
                let end = (n + batch).min(jobs);
                let chunk = (n..end).map(|i| shape.job(i)).collect();
                store.jobs_insert_many(chunk).await?;
                n += producers * batch;
            }
            Ok::<_, conveyor::StoreError>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Runs `jobs` pre-inserted no-op jobs to completion; returns seconds until every completion is
/// committed (the worker's shutdown flushes its completion batches).
async fn drain(
    store: &Arc<dyn Store>,
    queue: &str,
    jobs: usize,
    concurrency: usize,
    prefetch: Option<usize>,
) -> anyhow::Result<f64> {
    let handled = Arc::new(AtomicUsize::new(0));
    let all_handled = Arc::new(Notify::new());
    let (h, done) = (handled.clone(), all_handled.clone());
    let mut builder = Worker::builder(store.clone());
    if let Some(prefetch) = prefetch {
        builder = builder.prefetch(prefetch);
    }
    let worker = builder
        .queue(queue, concurrency)
        .poll_interval(Duration::from_millis(50))
        // As a deployed worker (or `conveyor serve`) would run: lease rescue, promotion and the
        // store's own housekeeping (on PostgreSQL with autovacuum off, vacuuming the table).
        .with_maintenance(conveyor::Maintenance::new(store.clone()))
        .handle_json("bench.noop", move |_, _| {
            let (h, done) = (h.clone(), done.clone());
            async move {
                if h.fetch_add(1, Ordering::Relaxed) + 1 == jobs {
                    done.notify_one();
                }
                Outcome::ok()
            }
        })
        .build()?;
    let started = Instant::now();
    let finished = all_handled.clone();
    worker.run(async move { finished.notified().await }).await;
    let seconds = started.elapsed().as_secs_f64();
    let completed: u64 = store
        .queues_stats()
        .await?
        .iter()
        .filter(|q| q.name == queue)
        .map(|q| q.completed)
        .sum();
    anyhow::ensure!(
        completed as usize == jobs,
        "drain finished with {completed} of {jobs} jobs completed"
    );
    Ok(seconds)
}

/// Enqueue-to-handler-start on an idle queue, one job at a time; returns (sorted latencies in
/// ms, seconds).
async fn latency(
    store: &Arc<dyn Store>,
    shape: &Shape,
    samples: usize,
    concurrency: usize,
) -> anyhow::Result<(Vec<f64>, f64)> {
    let queue = shape.queue.as_str();
    let (started_tx, mut started_rx) = mpsc::unbounded_channel::<Instant>();
    let worker = Worker::builder(store.clone())
        .queue(queue, concurrency)
        .handle_json("bench.noop", move |_, _| {
            let at = Instant::now();
            let started_tx = started_tx.clone();
            async move {
                let _ = started_tx.send(at);
                Outcome::ok()
            }
        })
        .build()?;
    let stop = Arc::new(Notify::new());
    let stopper = stop.clone();
    let running = tokio::spawn(worker.run(async move { stopper.notified().await }));
    // Let the worker reach its idle wait before measuring.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut latencies = Vec::with_capacity(samples);
    let begin = Instant::now();
    for n in 0..samples {
        let sent = Instant::now();
        let id = store.jobs_insert_many(vec![shape.job(n)]).await?[0].job.id;
        let began = tokio::time::timeout(Duration::from_secs(10), started_rx.recv())
            .await
            .context("a job did not start within 10 s")?
            .context("worker stopped")?;
        latencies.push(began.saturating_duration_since(sent).as_secs_f64() * 1000.0);
        // Idle means idle: let this job's completion commit before the next enqueue, so no
        // sample waits behind the previous job's write.
        while store.job_get(id).await?.map(|job| job.state) != Some(conveyor::JobState::Completed) {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    }
    let seconds = begin.elapsed().as_secs_f64();
    stop.notify_one();
    let _ = running.await;
    latencies.sort_by(|a, b| a.total_cmp(b));
    Ok((latencies, seconds))
}
