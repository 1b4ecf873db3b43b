//! Network faults (issue 9's fault-injection suite): the test proxy (`support/proxy.rs`) sits on
//! one link of a real deployment and misbehaves on command; its trigger lands a fault at a chosen
//! point of a request: before a statement's transaction commits, after the commit but before its
//! answer, or before an update reaches the database at all.
//!
//! 1. An HTTP worker talks to `conveyor serve` (SQLite) through the proxy and is partitioned
//!    for longer than its lease: the server rescues the job, a healthy worker completes it, and
//!    the partitioned worker's completion, delivered when the partition heals, is refused with
//!    409 `lease_lost` and changes nothing.
//! 2. `conveyor serve` reaches PostgreSQL through the proxy. Under concurrent enqueues and then
//!    under HTTP workers, PostgreSQL is cut off mid-transaction, after a commit whose answer is
//!    lost, and before a completion reaches it, and new connections are refused for a while:
//!    those requests answer 503 (never 2xx), every acknowledged job is stored exactly once,
//!    retries with the same idempotency key or lease find the true outcome, the server recovers
//!    by itself, and no job is completed twice.

mod common;
#[path = "support/proxy.rs"]
mod proxy;

use common::*;
use proxy::{Mode, Proxy};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

// ---------------------------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------------------------

#[derive(Clone)]
struct Http {
    base: String,
    client: reqwest::Client,
}

impl Http {
    fn new(base: &str) -> Self {
        Http {
            base: base.trim_end_matches('/').to_string(),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("client"),
        }
    }

    async fn try_send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), reqwest::Error> {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.try_send(reqwest::Method::POST, path, Some(&body))
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"))
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.try_send(reqwest::Method::GET, path, None)
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    async fn job(&self, id: &str) -> Value {
        let (status, job) = self.get(&format!("/v1/jobs/{id}")).await;
        assert_eq!(status, 200, "GET job {id}: {job}");
        job
    }
}

fn socket_of(url: &str) -> SocketAddr {
    let rest = url.split("://").nth(1).expect("scheme");
    let authority = rest.split('/').next().expect("authority");
    let host_port = authority.rsplit('@').next().expect("host");
    let host_port = if host_port.contains(':') {
        host_port.to_string()
    } else {
        format!("{host_port}:5432")
    };
    std::net::ToSocketAddrs::to_socket_addrs(&host_port)
        .expect("resolve")
        .next()
        .expect("an address")
}

/// `url` with its host and port replaced by `addr`.
fn via(url: &str, addr: SocketAddr) -> String {
    let (scheme, rest) = url.split_once("://").expect("scheme");
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let user = authority
        .rsplit_once('@')
        .map(|(user, _)| format!("{user}@"))
        .unwrap_or_default();
    format!("{scheme}://{user}{addr}/{path}")
}

fn id_of(value: &Value) -> String {
    value["id"].as_str().expect("id").to_string()
}

fn token_of(job: &Value) -> String {
    job["lease_token"]
        .as_str()
        .expect("lease token")
        .to_string()
}

async fn start_server_async(store: String, extra: &'static [&'static str]) -> Server {
    tokio::task::spawn_blocking(move || start_server_at(&store, extra))
        .await
        .expect("start server")
}

// ---------------------------------------------------------------------------------------------
// 1. A worker partitioned past its lease.
// ---------------------------------------------------------------------------------------------

const LEASE_MS: u64 = 1500;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_partitioned_past_its_lease_loses_the_job_and_its_late_completion_changes_nothing()
{
    let dir = temp_dir();
    let store = format!("sqlite://{}", path_in(&dir, "jobs.db").display());
    let server = start_server_async(store, &["--maintenance-interval-ms", "100"]).await;
    let proxy = Proxy::start(socket_of(&server.url)).await;
    let direct = Http::new(&server.url);
    let partitioned = Http::new(&format!("http://{}", proxy.addr));

    let (status, job) = direct
        .post(
            "/v1/jobs",
            json!({"kind": "net_partition", "queue": "net-a", "max_attempts": 5}),
        )
        .await;
    assert_eq!(status, 201, "{job}");
    let id = id_of(&job);

    // The worker behind the proxy takes the job with a short lease.
    let (status, fetched) = partitioned
        .post(
            "/v1/fetch",
            json!({"worker_id": "w-partitioned", "queues": ["net-a"], "lease_ms": LEASE_MS}),
        )
        .await;
    assert_eq!(status, 200, "{fetched}");
    assert_eq!(fetched["jobs"][0]["id"], id.as_str(), "{fetched}");
    assert_eq!(fetched["jobs"][0]["attempt"], 1);
    let stale_token = token_of(&fetched["jobs"][0]);
    let heartbeat = json!({"lease_token": stale_token, "lease_ms": LEASE_MS});

    // Latency well below the lease is harmless.
    proxy.set_delay(Duration::from_millis(100));
    let (status, beat) = partitioned
        .post(&format!("/v1/jobs/{id}/heartbeat"), heartbeat.clone())
        .await;
    assert_eq!(status, 200, "heartbeat over a slow link: {beat}");
    proxy.set_delay(Duration::ZERO);

    // The partition: first the worker's heartbeats vanish...
    proxy.set_mode(Mode::Blackhole);
    let lost = partitioned
        .client
        .post(format!("{}/v1/jobs/{id}/heartbeat", partitioned.base))
        .json(&heartbeat)
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(lost.is_err(), "a heartbeat crossed the partition: {lost:?}");
    // ...then its completion waits in the network while the partition lasts.
    proxy.set_mode(Mode::Hold);
    let late = {
        let partitioned = partitioned.clone();
        let body = json!({"lease_token": stale_token, "result": {"by": "partitioned"}});
        let path = format!("/v1/jobs/{id}/complete");
        tokio::spawn(async move { partitioned.post(&path, body).await })
    };
    eventually_within(
        "the completion to be held in the partition",
        Duration::from_secs(10),
        || async { (proxy.held().0 > 0).then_some(()) },
    )
    .await;

    // The lease expires and the server rescues the job.
    let rescued = eventually_within("the job to be rescued", Duration::from_secs(15), || async {
        let job = direct.job(&id).await;
        (job["state"] != "running").then_some(job)
    })
    .await;
    assert!(
        rescued["state"] == "retryable" || rescued["state"] == "available",
        "{rescued}"
    );
    let errors = rescued["errors"].as_array().expect("errors");
    assert_eq!(errors.len(), 1, "{rescued}");
    assert_eq!(errors[0]["class"], "lease_expired", "{rescued}");
    assert_eq!(errors[0]["attempt"], 1, "{rescued}");
    assert!(rescued["lease"].is_null(), "{rescued}");

    // A healthy worker, connected directly, takes it over (once its retry backoff is over).
    let taken = eventually_within(
        "the healthy worker to fetch the job",
        Duration::from_secs(15),
        || async {
            let (status, fetched) = direct
                .post(
                    "/v1/fetch",
                    json!({"worker_id": "w-healthy", "queues": ["net-a"], "lease_ms": 30_000,
                       "wait_ms": 1000}),
                )
                .await;
            assert_eq!(status, 200, "{fetched}");
            fetched["jobs"].as_array().and_then(|j| j.first().cloned())
        },
    )
    .await;
    assert_eq!(taken["id"], id.as_str());
    assert_eq!(taken["attempt"], 2, "{taken}");
    let fresh_token = token_of(&taken);
    assert_ne!(fresh_token, stale_token);
    let (status, done) = direct
        .post(
            &format!("/v1/jobs/{id}/complete"),
            json!({"lease_token": fresh_token, "result": {"by": "healthy"}}),
        )
        .await;
    assert_eq!(status, 200, "{done}");
    let settled = direct.job(&id).await;

    // The partition heals: the held completion arrives, late, and is refused.
    proxy.resume();
    let (status, refused) = late.await.expect("late completion task");
    assert_eq!(status, 409, "late completion: {refused}");
    assert_eq!(refused["error"]["code"], "lease_lost", "{refused}");
    // Whatever else the stale worker tries is refused the same way.
    let (status, answer) = partitioned
        .post(&format!("/v1/jobs/{id}/heartbeat"), heartbeat)
        .await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["error"]["code"], "lease_lost", "{answer}");
    let (status, answer) = partitioned
        .post(
            &format!("/v1/jobs/{id}/fail"),
            json!({"lease_token": stale_token, "error": {"message": "late"}}),
        )
        .await;
    assert_eq!(status, 409, "{answer}");
    let (status, answer) = partitioned
        .post(
            &format!("/v1/jobs/{id}/release"),
            json!({"lease_token": stale_token}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["released"], false, "{answer}");

    // Completed exactly once, by the healthy worker, on its second attempt; nothing changed.
    let job = direct.job(&id).await;
    assert_eq!(job, settled, "the late completion changed the job");
    assert_eq!(job["state"], "completed", "{job}");
    assert_eq!(job["attempt"], 2, "{job}");
    assert_eq!(job["result"], json!({"by": "healthy"}), "{job}");
    assert_eq!(job["errors"].as_array().map(Vec::len), Some(1), "{job}");
    let (status, queues) = direct.get("/v1/queues").await;
    assert_eq!(status, 200);
    let net_a = queues["queues"]
        .as_array()
        .and_then(|q| q.iter().find(|q| q["name"] == "net-a"))
        .cloned()
        .expect("net-a stats");
    assert_eq!(net_a["completed"], 1, "{net_a}");
    assert_eq!(net_a["running"], 0, "{net_a}");
}

// ---------------------------------------------------------------------------------------------
// 2. The server cut off from PostgreSQL.
// ---------------------------------------------------------------------------------------------

/// One answer (or transport failure) seen by a background client.
struct Seen {
    at: Instant,
    status: Option<u16>,
    what: String,
}

#[derive(Default)]
struct Ledger {
    seen: Vec<Seen>,
    /// Idempotency key -> the id acknowledged for it.
    acked: BTreeMap<String, String>,
    /// Job id -> completions answered 200.
    completed: HashMap<String, usize>,
    /// Job id -> times a background worker fetched it.
    fetched: HashMap<String, usize>,
    /// Jobs whose completion got an answer other than 200 or 409 at least once.
    ambiguous: BTreeSet<String>,
}

type Shared503 = Arc<Mutex<Ledger>>;

fn note(ledger: &Shared503, status: Option<u16>, what: impl Into<String>) {
    ledger.lock().unwrap().seen.push(Seen {
        at: Instant::now(),
        status,
        what: what.into(),
    });
}

fn refused_since(ledger: &Shared503, since: Instant) -> usize {
    ledger
        .lock()
        .unwrap()
        .seen
        .iter()
        .filter(|s| s.at >= since && s.status == Some(503))
        .count()
}

/// Enqueues under `key` until acknowledged, retrying 503s and lost connections.
async fn enqueue_until_acked(api: &Http, key: &str, ledger: &Shared503) {
    let body = json!({"kind": "net_fault", "queue": "net-b", "idempotency_key": key,
                      "payload": {"key": key}});
    let what = format!("{key} to be acknowledged");
    let id = eventually_within(&what, Duration::from_secs(60), || async {
        let answer = api
            .try_send(reqwest::Method::POST, "/v1/jobs", Some(&body))
            .await;
        let status = answer.as_ref().ok().map(|(s, _)| *s);
        note(ledger, status, format!("enqueue {key}"));
        match &answer {
            Ok((200 | 201, job)) => Ok(id_of(job)),
            _ => Err(format!("{answer:?}")),
        }
    })
    .await;
    let previous = ledger.lock().unwrap().acked.insert(key.to_string(), id);
    assert!(previous.is_none(), "{key} acknowledged twice");
}

/// Completes a fetched job, retrying until the server says 200 or 409.
async fn complete_until_settled(api: &Http, id: &str, token: &str, ledger: &Shared503) -> u16 {
    let body = json!({"lease_token": token});
    let path = format!("/v1/jobs/{id}/complete");
    let what = format!("the completion of {id} to settle (200 or 409)");
    eventually_within(&what, Duration::from_secs(60), || async {
        let answer = api
            .try_send(reqwest::Method::POST, &path, Some(&body))
            .await;
        let status = answer.as_ref().ok().map(|(s, _)| *s);
        note(ledger, status, format!("complete {id}"));
        match status {
            Some(200) => {
                *ledger
                    .lock()
                    .unwrap()
                    .completed
                    .entry(id.to_string())
                    .or_default() += 1;
                Ok(200)
            }
            Some(409) => Ok(409),
            _ => {
                ledger.lock().unwrap().ambiguous.insert(id.to_string());
                Err(format!("{answer:?}"))
            }
        }
    })
    .await
}

async fn background_worker(api: Http, name: String, ledger: Shared503, stop: CancellationToken) {
    while !stop.is_cancelled() {
        let body = json!({"worker_id": name, "queues": ["net-b"], "max": 20,
                          "lease_ms": 3000, "wait_ms": 200});
        let answer = api
            .try_send(reqwest::Method::POST, "/v1/fetch", Some(&body))
            .await;
        let status = answer.as_ref().ok().map(|(s, _)| *s);
        note(&ledger, status, format!("fetch by {name}"));
        let Ok((200, fetched)) = answer else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        for job in fetched["jobs"].as_array().into_iter().flatten() {
            let id = id_of(job);
            *ledger
                .lock()
                .unwrap()
                .fetched
                .entry(id.clone())
                .or_default() += 1;
            complete_until_settled(&api, &id, &token_of(job), &ledger).await;
        }
    }
}

/// When a fault began and ended.
struct Window {
    cut_at: Instant,
    resumed_at: Instant,
}

/// Arms `stages` on the proxy, sends the victim request, and once the trigger has fired (and
/// the victim's bytes are held where `forward_matching` says), refuses new connections, cuts
/// every open one, and keeps refusing until the background clients have met the closed door a
/// few times. Returns the victim's answer and the fault's window.
async fn fault<Fut>(
    proxy: &Proxy,
    stages: &[&[u8]],
    forward_matching: bool,
    victim: Fut,
    ledger: &Shared503,
) -> (Result<(u16, Value), reqwest::Error>, Window)
where
    Fut: Future<Output = Result<(u16, Value), reqwest::Error>> + Send + 'static,
{
    proxy.hold_when(stages, forward_matching);
    let victim = tokio::spawn(victim);
    eventually_within("the trigger to fire", Duration::from_secs(20), || async {
        let (up, down) = proxy.victim_held();
        let in_place = if forward_matching { down > 0 } else { up > 0 };
        (proxy.triggered() && in_place).then_some(())
    })
    .await;
    proxy.refuse(true);
    let cut_at = Instant::now();
    let cut = proxy.cut();
    assert!(cut > 0, "no connection to cut");
    let answer = victim.await.expect("victim task");
    eventually_within(
        "background requests to be refused while the database is unreachable",
        Duration::from_secs(20),
        || async {
            (refused_since(ledger, cut_at) >= 5 && cut_at.elapsed() >= Duration::from_secs(1))
                .then_some(())
        },
    )
    .await;
    let resumed_at = Instant::now();
    proxy.refuse(false);
    proxy.resume();
    (answer, Window { cut_at, resumed_at })
}

fn psql(sql: &str) -> String {
    let output = std::process::Command::new("psql")
        .args([&pg_base(), "-At", "-c", sql])
        .output()
        .expect("run psql");
    assert!(
        output.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_cut_off_mid_commit_loses_no_acknowledged_job_and_completes_none_twice() {
    let schema = Schema::fresh("conveyor_netfault");
    let proxy = Proxy::start(socket_of(&pg_base())).await;
    let store = format!("{}?schema={}", via(&pg_base(), proxy.addr), schema.0);
    let server = start_server_async(
        store,
        &[
            "--maintenance-interval-ms",
            "200",
            "--leader-ttl-ms",
            "2000",
        ],
    )
    .await;
    let api = Http::new(&server.url);
    let ledger: Shared503 = Arc::new(Mutex::new(Ledger::default()));

    // Producers enqueue concurrently, each key until it is acknowledged.
    let stop_producers = CancellationToken::new();
    let producers: Vec<JoinHandle<()>> = (0..4)
        .map(|p| {
            let (api, ledger, stop) = (api.clone(), ledger.clone(), stop_producers.clone());
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.is_cancelled() {
                    enqueue_until_acked(&api, &format!("bg-{p}-{i}"), &ledger).await;
                    i += 1;
                    // Pacing, so the run stays small; not synchronisation.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        })
        .collect();
    let acked = || ledger.lock().unwrap().acked.len();
    eventually_within(
        "producers to get going",
        Duration::from_secs(20),
        || async { (acked() >= 100).then_some(()) },
    )
    .await;

    let mut windows = Vec::new();
    let enqueue = |key: String| {
        let api = api.clone();
        async move {
            let body =
                json!({"kind": "net_fault", "queue": "net-b-victim", "idempotency_key": key});
            api.try_send(reqwest::Method::POST, "/v1/jobs", Some(&body))
                .await
        }
    };

    // Fault 1: the insert has run inside its transaction, then PostgreSQL is cut off before
    // the COMMIT. The answer is 503 and nothing was stored: the retry inserts the job.
    let key = format!("before-commit-{}", uuid::Uuid::new_v4().simple());
    let (answer, window) = fault(
        &proxy,
        &[key.as_bytes()],
        true,
        enqueue(key.clone()),
        &ledger,
    )
    .await;
    windows.push(window);
    let (status, body) = answer.expect("an answer");
    assert_eq!(status, 503, "enqueue cut off before its commit: {body}");
    assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
    let before = acked();
    eventually_within(
        "enqueues to succeed again",
        Duration::from_secs(30),
        || async { (acked() >= before + 50).then_some(()) },
    )
    .await;
    let (status, body) = enqueue(key.clone()).await.expect("retry");
    assert_eq!(
        status, 201,
        "the cut enqueue was not stored, so its retry is new: {body}"
    );
    assert_eq!(body["duplicate"], false, "{body}");
    let victims = vec![(key.clone(), id_of(&body))];

    // Fault 2: the COMMIT reaches PostgreSQL, its answer is cut off. The answer is 503 though
    // the job is stored: the retry with the same key finds it.
    let key = format!("after-commit-{}", uuid::Uuid::new_v4().simple());
    let (answer, window) = fault(
        &proxy,
        &[key.as_bytes(), b"COMMIT"],
        true,
        enqueue(key.clone()),
        &ledger,
    )
    .await;
    windows.push(window);
    let (status, body) = answer.expect("an answer");
    assert_eq!(status, 503, "enqueue whose commit answer was lost: {body}");
    let before = acked();
    eventually_within(
        "enqueues to succeed again",
        Duration::from_secs(30),
        || async { (acked() >= before + 50).then_some(()) },
    )
    .await;
    let (status, body) = enqueue(key.clone()).await.expect("retry");
    assert_eq!(
        status, 200,
        "the committed enqueue is found by its key: {body}"
    );
    assert_eq!(body["duplicate"], true, "{body}");
    let mut victims = victims;
    victims.push((key.clone(), id_of(&body)));

    stop_producers.cancel();
    for producer in producers {
        producer.await.expect("producer");
    }

    // Every acknowledged job is stored, once, under the id it was acknowledged with; nothing
    // else is stored.
    let acked_jobs = ledger.lock().unwrap().acked.clone();
    let stored: BTreeMap<String, String> = psql(&format!(
        "SELECT idempotency_key, id FROM {}.jobs WHERE queue = 'net-b'",
        schema.0
    ))
    .lines()
    .filter_map(|line| line.split_once('|'))
    .map(|(key, id)| (key.to_string(), id.to_string()))
    .collect();
    assert_eq!(
        stored.len(),
        acked_jobs.len(),
        "jobs stored vs acknowledged"
    );
    assert_eq!(
        stored, acked_jobs,
        "stored jobs differ from acknowledged ones"
    );
    let victim_rows = psql(&format!(
        "SELECT idempotency_key, id FROM {}.jobs WHERE queue = 'net-b-victim' ORDER BY idempotency_key",
        schema.0
    ));
    let mut expected: Vec<String> = victims.iter().map(|(k, id)| format!("{k}|{id}")).collect();
    expected.sort();
    assert_eq!(
        victim_rows.lines().collect::<Vec<_>>(),
        expected,
        "each victim stored exactly once"
    );

    // Workers through the same server; two more faults hit completions.
    let stop_workers = CancellationToken::new();
    let workers: Vec<JoinHandle<()>> = (0..3)
        .map(|w| {
            tokio::spawn(background_worker(
                api.clone(),
                format!("net-worker-{w}"),
                ledger.clone(),
                stop_workers.clone(),
            ))
        })
        .collect();
    let take_victim = || async {
        let (status, fetched) = api
            .post(
                "/v1/fetch",
                json!({"worker_id": "net-victim", "queues": ["net-b-victim"], "lease_ms": 60_000}),
            )
            .await;
        assert_eq!(status, 200, "{fetched}");
        let job = fetched["jobs"][0].clone();
        assert!(job.is_object(), "{fetched}");
        (id_of(&job), token_of(&job))
    };
    let complete = |id: String, token: String| {
        let api = api.clone();
        async move {
            let body = json!({"lease_token": token});
            api.try_send(
                reqwest::Method::POST,
                &format!("/v1/jobs/{id}/complete"),
                Some(&body),
            )
            .await
        }
    };

    // Fault 3: the completion is applied, its answer is lost: 503, and the retry, finding the
    // lease already used, is refused with 409. Completed once.
    let (id, token) = take_victim().await;
    let lease = uuid::Uuid::parse_str(&token).expect("token");
    let (answer, window) = fault(
        &proxy,
        &[lease.as_bytes()],
        true,
        complete(id.clone(), token.clone()),
        &ledger,
    )
    .await;
    windows.push(window);
    let (status, body) = answer.expect("an answer");
    assert_eq!(status, 503, "completion whose answer was lost: {body}");
    let retried = eventually_within(
        "the completion retry to get through",
        Duration::from_secs(30),
        || async {
            match complete(id.clone(), token.clone()).await {
                Ok((503, _)) | Err(_) => None,
                Ok(answer) => Some(answer),
            }
        },
    )
    .await;
    assert_eq!(
        retried.0, 409,
        "the applied completion is not applied again: {}",
        retried.1
    );
    assert_eq!(retried.1["error"]["code"], "lease_lost", "{}", retried.1);
    let job = api.job(&id).await;
    assert_eq!(job["state"], "completed", "{job}");
    assert_eq!(job["attempt"], 1, "{job}");

    // Fault 4: the completion never reaches PostgreSQL: 503, and the retry applies it.
    let (id, token) = take_victim().await;
    let lease = uuid::Uuid::parse_str(&token).expect("token");
    let (answer, window) = fault(
        &proxy,
        &[lease.as_bytes()],
        false,
        complete(id.clone(), token.clone()),
        &ledger,
    )
    .await;
    windows.push(window);
    let (status, body) = answer.expect("an answer");
    assert_eq!(
        status, 503,
        "completion cut off before the database: {body}"
    );
    assert_eq!(api.job(&id).await["state"], "running");
    let retried = eventually_within(
        "the completion retry to get through",
        Duration::from_secs(30),
        || async {
            match complete(id.clone(), token.clone()).await {
                Ok((503, _)) | Err(_) => None,
                Ok(answer) => Some(answer),
            }
        },
    )
    .await;
    assert_eq!(
        retried.0, 200,
        "the lost completion applies on retry: {}",
        retried.1
    );
    let job = api.job(&id).await;
    assert_eq!(job["state"], "completed", "{job}");
    assert_eq!(job["attempt"], 1, "{job}");

    // The workers finish everything (jobs whose fetch answer was lost come back once their
    // lease expires and the server rescues them).
    let total = acked_jobs.len() as u64;
    eventually_within(
        "every job to be completed",
        Duration::from_secs(60),
        || async {
            let (status, queues) = api.get("/v1/queues").await;
            if status != 200 {
                return None;
            }
            let done = queues["queues"]
                .as_array()?
                .iter()
                .find(|q| q["name"] == "net-b")?["completed"]
                .as_u64()?;
            (done == total).then_some(())
        },
    )
    .await;
    stop_workers.cancel();
    for worker in workers {
        worker.await.expect("worker");
    }

    // The workers have stopped: the ledger is final.
    let ledger = std::mem::take(&mut *ledger.lock().unwrap());
    // During each fault every answer was a 503: never a 2xx for something not stored (a small
    // margin after the cut for answers already on their way).
    let margin = Duration::from_millis(150);
    for window in &windows {
        for seen in &ledger.seen {
            if seen.at >= window.cut_at + margin && seen.at < window.resumed_at {
                assert_eq!(
                    seen.status,
                    Some(503),
                    "{} answered {:?} while the database was unreachable",
                    seen.what,
                    seen.status
                );
            }
        }
    }
    // Only expected statuses (and no dropped connection) from the server, throughout.
    for seen in &ledger.seen {
        assert!(
            matches!(seen.status, Some(200 | 201 | 409 | 503)),
            "{} answered {:?}",
            seen.what,
            seen.status
        );
    }
    let refused = ledger.seen.iter().filter(|s| s.status == Some(503)).count();
    assert!(refused >= 4 * 5, "only {refused} requests met the faults");

    // Every job: completed, once; every extra attempt explained by a rescued lease.
    let mut listed = BTreeSet::new();
    let mut retried_after_rescue = 0;
    let mut after = String::new();
    loop {
        let (status, page) = api
            .get(&format!("/v1/jobs?queue=net-b&limit=500{after}"))
            .await;
        assert_eq!(status, 200, "{page}");
        for job in page["jobs"].as_array().expect("jobs") {
            let id = id_of(job);
            assert_eq!(job["state"], "completed", "{job}");
            let completions = ledger.completed.get(&id).copied().unwrap_or(0);
            assert!(
                completions <= 1,
                "{id} completed {completions} times: {job}"
            );
            if completions == 0 {
                assert!(
                    ledger.ambiguous.contains(&id),
                    "{id} is completed but no completion of it was answered: {job}"
                );
            }
            let attempt = job["attempt"].as_u64().expect("attempt") as usize;
            let errors = job["errors"].as_array().expect("errors");
            assert_eq!(errors.len(), attempt - 1, "{job}");
            assert!(
                errors.iter().all(|e| e["class"] == "lease_expired"),
                "{job}"
            );
            if attempt > 1 {
                retried_after_rescue += 1;
            }
            let fetched = ledger.fetched.get(&id).copied().unwrap_or(0);
            assert!(
                attempt >= fetched,
                "{id} fetched {fetched} times, attempt {attempt}"
            );
            listed.insert(id);
        }
        match page["next"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
    }
    let acked_ids: BTreeSet<String> = acked_jobs.values().cloned().collect();
    assert_eq!(listed, acked_ids, "jobs listed vs acknowledged");
    println!(
        "{} jobs, {refused} answers 503 during {} faults, {} completions ambiguous, \
         {retried_after_rescue} jobs run again after a lease expired",
        listed.len(),
        windows.len(),
        ledger.ambiguous.len()
    );
    drop(ledger);

    // And the server serves as before.
    let (status, job) = api
        .post(
            "/v1/jobs",
            json!({"kind": "after_faults", "queue": "net-after"}),
        )
        .await;
    assert_eq!(status, 201, "{job}");
    let (status, fetched) = api
        .post(
            "/v1/fetch",
            json!({"worker_id": "after", "queues": ["net-after"]}),
        )
        .await;
    assert_eq!(status, 200, "{fetched}");
    let (status, done) = api
        .post(
            &format!("/v1/jobs/{}/complete", id_of(&job)),
            json!({"lease_token": token_of(&fetched["jobs"][0])}),
        )
        .await;
    assert_eq!(status, 200, "{done}");
    drop(server);
}
