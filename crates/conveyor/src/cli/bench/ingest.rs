//! `conveyor bench --workload ingest --broker TYPE`: messages from a broker into durable jobs,
//! through the same source machinery `conveyor serve` runs (`conveyor_sources::run`: read a
//! batch, commit its jobs in one store call, then acknowledge), beside the broker's own publish
//! rate on this machine.
//!
//! Each run makes a stream, queue or topic of its own (`conveyor_sources::publish::prepare`),
//! publishes the messages and times it (every message confirmed by the broker), then starts the
//! source and times it until every message is a job; it checks the store holds exactly one job
//! per message in the run's queue, and deletes what it made at the broker.
//!
//! MQTT is the exception: a broker keeps only so many messages for a session that is away
//! (Mosquitto: 1,000), so the messages are published while the source runs, never more than
//! [`MQTT_WINDOW`] ahead of it, and the publish rate is measured on its own beforehand, to a
//! topic no session subscribes to.

use anyhow::Context;
use clap::ValueEnum;
use conveyor::Store;
use conveyor_core::sources::SourceSpec;
use conveyor_sources::publish::{self, Publisher};
use conveyor_sources::SourceStatus;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// A broker type, as a source's `type` names it.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub(crate) enum BrokerType {
    /// Redis Streams (default URL redis://127.0.0.1:6379).
    #[value(name = "redis_stream")]
    RedisStream,
    /// RabbitMQ (default URL amqp://guest:guest@127.0.0.1:5672/%2f).
    Amqp,
    /// NATS JetStream (default URL nats://127.0.0.1:4222).
    Nats,
    /// MQTT, e.g. Mosquitto (default URL mqtt://127.0.0.1:1883).
    Mqtt,
    /// Amazon SQS or a stand-in such as moto: give its endpoint with --broker-url; the
    /// credentials come from the AWS SDK's chain (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY),
    /// the region from AWS_REGION (default us-east-1).
    Sqs,
    /// Kafka, e.g. Tansu: give the bootstrap brokers (host:port) with --broker-url.
    Kafka,
}

impl BrokerType {
    pub(crate) fn name(self) -> &'static str {
        match self {
            BrokerType::RedisStream => "redis_stream",
            BrokerType::Amqp => "amqp",
            BrokerType::Nats => "nats",
            BrokerType::Mqtt => "mqtt",
            BrokerType::Sqs => "sqs",
            BrokerType::Kafka => "kafka",
        }
    }

    fn default_url(self) -> Option<&'static str> {
        match self {
            BrokerType::RedisStream => Some("redis://127.0.0.1:6379"),
            BrokerType::Amqp => Some("amqp://guest:guest@127.0.0.1:5672/%2f"),
            BrokerType::Nats => Some("nats://127.0.0.1:4222"),
            BrokerType::Mqtt => Some("mqtt://127.0.0.1:1883"),
            BrokerType::Sqs | BrokerType::Kafka => None,
        }
    }

    /// Messages when `--jobs` is not given: moto's SQS answers some ten calls a second here,
    /// so its runs are smaller.
    pub(crate) fn default_messages(self) -> usize {
        match self {
            BrokerType::Sqs => 2_000,
            _ => 100_000,
        }
    }
}

/// How many messages an MQTT run publishes ahead of the source (published and not yet jobs),
/// at most: well under the 1,000 Mosquitto keeps for a session by default.
pub(crate) const MQTT_WINDOW: usize = 500;

/// Messages the MQTT publisher sends between looks at how far the source has come.
const MQTT_CHUNK: usize = 100;

/// How long a run waits without a new job before it fails.
const STALL: Duration = Duration::from_secs(60);

/// What one ingest run measured, as its JSON line's fields.
pub(crate) async fn run(
    store: &Arc<dyn Store>,
    broker: BrokerType,
    url: Option<&str>,
    messages: usize,
    max_in_flight: usize,
) -> anyhow::Result<Value> {
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let name = format!("conveyor-bench-{}", &run_id[..12]);
    let queue = format!("bench-ingest-{run_id}");
    let spec = spec(broker, url, &name, &queue, max_in_flight)?;
    let spec = publish::prepare(&spec)
        .await
        .with_context(|| format!("{}: making the run's {}", broker.name(), what(broker)))?;
    let measured = measure(store, broker, &spec, &queue, messages).await;
    let removed = publish::remove(&spec).await;
    let mut line = measured?;
    if let Err(error) = removed {
        eprintln!(
            "warning: {}: could not delete the run's {} {name}: {error}",
            broker.name(),
            what(broker)
        );
    }
    line["max_in_flight"] = json!(max_in_flight);
    Ok(line)
}

fn what(broker: BrokerType) -> &'static str {
    match broker {
        BrokerType::RedisStream | BrokerType::Nats => "stream",
        BrokerType::Amqp | BrokerType::Sqs => "queue",
        BrokerType::Mqtt => "session",
        BrokerType::Kafka => "topic",
    }
}

/// The run's source: `start: earliest`, jobs of kind `bench.ingest` in `queue`.
fn spec(
    broker: BrokerType,
    url: Option<&str>,
    name: &str,
    queue: &str,
    max_in_flight: usize,
) -> anyhow::Result<SourceSpec> {
    let url = match url.or(broker.default_url()) {
        Some(url) => url.to_string(),
        None => anyhow::bail!(
            "--broker {} needs --broker-url: {}",
            broker.name(),
            match broker {
                BrokerType::Sqs =>
                    "the SQS endpoint, e.g. http://127.0.0.1:5000 for `moto_server -p 5000`",
                _ =>
                    "the bootstrap brokers, e.g. 127.0.0.1:9092 for `tansu broker --listener-url \
                      tcp://127.0.0.1:9092 --advertised-listener-url tcp://127.0.0.1:9092 \
                      --storage-engine memory://tansu/`",
            }
        ),
    };
    let mut config = json!({
        "name": name,
        "type": broker.name(),
        "start": "earliest",
        "max_in_flight": max_in_flight,
        "job": { "kind": "bench.ingest", "queue": queue },
    });
    let fields = match broker {
        BrokerType::RedisStream => {
            json!({ "url": url, "stream": name, "group": "conveyor" })
        }
        BrokerType::Amqp => json!({ "url": url, "queue": name }),
        BrokerType::Nats => json!({
            "url": url, "stream": name, "subject": format!("{name}.jobs"), "consumer": "conveyor",
        }),
        BrokerType::Mqtt => json!({
            "url": url, "topic": format!("conveyor-bench/{name}"), "client_id": name,
        }),
        BrokerType::Sqs => {
            if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
                anyhow::bail!(
                    "--broker sqs takes its credentials from AWS_ACCESS_KEY_ID and \
                     AWS_SECRET_ACCESS_KEY (moto takes any: AWS_ACCESS_KEY_ID=test \
                     AWS_SECRET_ACCESS_KEY=test)"
                );
            }
            let region = std::env::var("AWS_REGION")
                .or_else(|_| std::env::var("AWS_DEFAULT_REGION"))
                .unwrap_or_else(|_| "us-east-1".into());
            json!({
                "url": url,
                // The queue's name is the last segment; the URL becomes the one CreateQueue gives.
                "queue_url": format!("{}/queue/{name}", url.trim_end_matches('/')),
                "region": region,
            })
        }
        // A group of the run's own: a group an earlier run's consumer left waits out its
        // session before it takes a new member.
        BrokerType::Kafka => json!({ "brokers": url, "topic": name, "group": name }),
    };
    if let (Some(config), Some(fields)) = (config.as_object_mut(), fields.as_object()) {
        config.extend(fields.clone());
    }
    let spec: SourceSpec = serde_json::from_value(config).context("the run's source")?;
    spec.validate()
        .map_err(|error| anyhow::anyhow!("the run's source: {error}"))?;
    Ok(spec)
}

/// The bodies: `{"n": n}` for each message.
fn bodies(messages: usize) -> Vec<Vec<u8>> {
    (0..messages)
        .map(|n| json!({ "n": n }).to_string().into_bytes())
        .collect()
}

async fn measure(
    store: &Arc<dyn Store>,
    broker: BrokerType,
    spec: &SourceSpec,
    queue: &str,
    messages: usize,
) -> anyhow::Result<Value> {
    let bodies = bodies(messages);
    let name = broker.name();
    let paced = broker == BrokerType::Mqtt;
    // The broker's own rate: every message published and confirmed.
    let publish_seconds = if paced {
        let mut unsubscribed = spec.clone();
        if let conveyor_core::sources::BrokerSpec::Mqtt { topic, .. } = &mut unsubscribed.broker {
            topic.push_str("-unsubscribed");
        }
        timed_publish(&unsubscribed, &bodies).await
    } else {
        timed_publish(spec, &bodies).await
    }
    .with_context(|| format!("{name}: publishing"))?;

    let status = Arc::new(SourceStatus::new(spec.clone()));
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let source = tokio::spawn(conveyor_sources::run(
        status.clone(),
        store.clone(),
        shutdown.clone(),
    ));
    let ingested = if paced {
        paced_ingest(spec, &bodies, &status, started).await
    } else {
        wait_for(&status, messages as u64, started, None).await
    };
    let ingest_seconds = started.elapsed().as_secs_f64();
    shutdown.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(30), source).await;
    let first_job_seconds = ingested.with_context(|| format!("{name}: ingesting"))?;
    stopped
        .context("the source did not stop within 30 s")?
        .context("the source's task")?;

    let enqueued = count(&status, "enqueued");
    let duplicates = count(&status, "duplicate");
    let invalid = count(&status, "invalid");
    let in_queue: u64 = store
        .queues_stats()
        .await?
        .iter()
        .filter(|stats| stats.name == queue)
        .map(|s| s.available + s.scheduled + s.running + s.retryable + s.dead + s.completed)
        .sum();
    anyhow::ensure!(
        in_queue == messages as u64 && enqueued == messages as u64 && invalid == 0,
        "{name}: {messages} messages made {in_queue} jobs in the queue ({enqueued} enqueued, \
         {duplicates} duplicates, {invalid} invalid)"
    );
    let publish_rate = messages as f64 / publish_seconds;
    let ingest_rate = messages as f64 / ingest_seconds;
    Ok(json!({
        "workload": "ingest",
        "broker": name,
        "mode": if paced { format!("paced (window {MQTT_WINDOW})") } else { "backlog".to_string() },
        "messages": messages,
        "jobs": in_queue,
        "duplicates": duplicates,
        "publish_seconds": publish_seconds,
        "publish_msgs_per_s": publish_rate.round(),
        "ingest_seconds": ingest_seconds,
        "first_job_seconds": first_job_seconds,
        "ingest_msgs_per_s": ingest_rate.round(),
        "ratio": (ingest_rate / publish_rate * 100.0).round() / 100.0,
    }))
}

async fn timed_publish(spec: &SourceSpec, bodies: &[Vec<u8>]) -> anyhow::Result<f64> {
    let mut publisher = Publisher::connect(spec).await?;
    let started = Instant::now();
    publisher.send(bodies).await?;
    let seconds = started.elapsed().as_secs_f64();
    publisher.close().await?;
    Ok(seconds)
}

fn count(status: &SourceStatus, outcome: &str) -> u64 {
    status
        .counts()
        .iter()
        .find(|(name, _)| *name == outcome)
        .map_or(0, |(_, count)| *count)
}

/// Messages stored as jobs (new, or found again).
fn stored(status: &SourceStatus) -> u64 {
    count(status, "enqueued") + count(status, "duplicate")
}

/// Waits until `messages` are jobs; returns the seconds from `started` until the first was
/// (`first`, if already seen). Fails when no new job comes for [`STALL`], with the source's
/// state and last error.
async fn wait_for(
    status: &SourceStatus,
    messages: u64,
    started: Instant,
    mut first: Option<f64>,
) -> anyhow::Result<f64> {
    let (mut last, mut moved) = (0, Instant::now());
    loop {
        let now = stored(status);
        if now > 0 && first.is_none() {
            first = Some(started.elapsed().as_secs_f64());
        }
        if now >= messages {
            return Ok(first.unwrap_or_default());
        }
        if now != last {
            (last, moved) = (now, Instant::now());
        } else if moved.elapsed() >= STALL {
            let view = status.view();
            anyhow::bail!(
                "{now} of {messages} messages became jobs, none in the last {} s (source {}, \
                 last error: {})",
                STALL.as_secs(),
                view["state"],
                view["last_error"]
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// MQTT: publishes while the source runs, never more than [`MQTT_WINDOW`] messages ahead of
/// the jobs, then waits for the last; returns the seconds from `started` (the source's start)
/// until the first job.
async fn paced_ingest(
    spec: &SourceSpec,
    bodies: &[Vec<u8>],
    status: &SourceStatus,
    started: Instant,
) -> anyhow::Result<f64> {
    let mut first = None;
    let mut publisher = Publisher::connect(spec).await?;
    let look = |first: &mut Option<f64>| {
        let now = stored(status);
        if first.is_none() && now > 0 {
            *first = Some(started.elapsed().as_secs_f64());
        }
        now
    };
    let mut published = 0u64;
    for chunk in bodies.chunks(MQTT_CHUNK) {
        let mut moved = Instant::now();
        let mut last = look(&mut first);
        while published.saturating_sub(look(&mut first)) + chunk.len() as u64 > MQTT_WINDOW as u64 {
            let now = stored(status);
            if now != last {
                (last, moved) = (now, Instant::now());
            }
            anyhow::ensure!(
                moved.elapsed() < STALL,
                "{now} of {published} published messages became jobs, none in the last {} s \
                 (last error: {})",
                STALL.as_secs(),
                status.view()["last_error"]
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        publisher.send(chunk).await?;
        published += chunk.len() as u64;
    }
    publisher.close().await?;
    wait_for(status, bodies.len() as u64, started, first).await
}
