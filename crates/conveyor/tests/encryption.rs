//! Encryption at rest on real stores: the bytes in the store are not the plaintext (payloads,
//! results, error messages and backtraces, schedule templates and the jobs they fire, flow step
//! templates, step results, signal payloads and compensations; the SQLite files with their WAL
//! and `pg_dump`), every read returns the plaintext, rotation keeps old values readable, unique
//! jobs still work.

mod common;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use common::{pg_base, Schema};
use conveyor::{open_store, NewJob, OpenOptions, PayloadKeys, Store, UniqueSpec};
use serde_json::json;
use std::sync::Arc;

const MARKER: &str = "plaintext-marker-4111-1111";

fn keys(spec: &[(&str, u8)]) -> Option<Arc<PayloadKeys>> {
    let text: Vec<String> = spec
        .iter()
        .map(|(id, byte)| format!("{id}:{}", BASE64.encode([*byte; 32])))
        .collect();
    Some(Arc::new(PayloadKeys::parse(&text.join(",")).expect("keys")))
}

async fn open(url: &str, payload_keys: Option<Arc<PayloadKeys>>) -> Arc<dyn Store> {
    open_store(
        url,
        OpenOptions {
            payload_keys,
            ..OpenOptions::default()
        },
    )
    .await
    .expect("open store")
}

fn secret_job() -> NewJob {
    NewJob::new("charge", json!({"card": MARKER, "amount": 12}))
}

/// The same story on any store URL; returns the ids of (old, new) jobs.
async fn encrypts_and_rotates(url: &str) -> (uuid::Uuid, uuid::Uuid) {
    let old_keys = keys(&[("k1", 1)]);
    let store = open(url, old_keys).await;
    let inserted = store
        .jobs_insert_many(vec![secret_job()])
        .await
        .expect("insert");
    let old_id = inserted[0].job.id;
    assert_eq!(
        inserted[0].job.payload["card"], MARKER,
        "callers see plaintext"
    );
    assert_eq!(
        store
            .job_get(old_id)
            .await
            .expect("get")
            .expect("job")
            .payload["card"],
        MARKER
    );
    drop(store);

    // Without keys the store shows what it holds: an envelope naming the key.
    let plain = open(url, None).await;
    let stored = plain
        .job_get(old_id)
        .await
        .expect("get")
        .expect("job")
        .payload;
    assert!(!stored.to_string().contains(MARKER), "{stored}");
    assert_eq!(stored["key"], "k1");
    drop(plain);

    // Rotation: a new key first, the old one kept for reading.
    let rotated = open(url, keys(&[("k2", 2), ("k1", 1)])).await;
    let old = rotated.job_get(old_id).await.expect("get").expect("job");
    assert_eq!(old.payload["card"], MARKER, "old jobs stay readable");
    let new_id = rotated
        .jobs_insert_many(vec![secret_job()])
        .await
        .expect("insert")[0]
        .job
        .id;
    // Fetching hands the worker the plaintext.
    let fetched = rotated
        .jobs_fetch(conveyor::FetchParams {
            worker_id: "w".to_string(),
            queues: vec!["default".to_string()],
            max: 10,
            lease: std::time::Duration::from_secs(30),
            kinds: None,
            excluded_kinds: Vec::new(),
        })
        .await
        .expect("fetch");
    assert_eq!(fetched.len(), 2);
    assert!(fetched.iter().all(|job| job.payload["card"] == MARKER));
    drop(rotated);
    let plain = open(url, None).await;
    let stored = plain
        .job_get(new_id)
        .await
        .expect("get")
        .expect("job")
        .payload;
    assert_eq!(stored["key"], "k2", "new writes use the newest key");
    (old_id, new_id)
}

/// Unique jobs keep working although the store cannot read the payload.
async fn unique_jobs_still_deduplicate(url: &str) {
    let store = open(url, keys(&[("k1", 1)])).await;
    let unique = |amount: u32| {
        let mut job = NewJob::new("invoice", json!({"customer": "acme", "amount": amount}));
        job.unique = Some(UniqueSpec::by_args(["customer"]));
        job
    };
    let first = store
        .jobs_insert_many(vec![unique(1)])
        .await
        .expect("insert");
    let second = store
        .jobs_insert_many(vec![unique(2)])
        .await
        .expect("insert");
    assert!(!first[0].duplicate);
    assert!(second[0].duplicate, "same customer: a duplicate");
    assert_eq!(second[0].job.id, first[0].job.id);
    let mut other = unique(1);
    other.payload["customer"] = json!("globex");
    assert!(!store.jobs_insert_many(vec![other]).await.expect("insert")[0].duplicate);
}

#[tokio::test]
async fn sqlite_payloads_are_encrypted_at_rest_and_keys_rotate() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("jobs.db");
    let url = format!("sqlite://{}", path.display());
    encrypts_and_rotates(&url).await;
    unique_jobs_still_deduplicate(&url).await;
    // The database files themselves never contain the plaintext. (The closed stores' writer
    // threads may still be removing their -wal and -shm files: one that vanished holds nothing.)
    for entry in std::fs::read_dir(dir.path()).expect("dir") {
        let bytes = match std::fs::read(entry.expect("entry").path()) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => panic!("read: {error}"),
        };
        assert!(
            !bytes.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()),
            "plaintext found in a database file"
        );
    }
}

#[tokio::test]
async fn postgres_payloads_are_encrypted_at_rest_and_keys_rotate() {
    let schema = Schema::fresh("enc");
    let url = schema.url();
    let (old_id, _) = encrypts_and_rotates(&url).await;
    unique_jobs_still_deduplicate(&url).await;
    // What PostgreSQL holds, read with psql rather than through Conveyor.
    let out = std::process::Command::new("psql")
        .args([
            &pg_base(),
            "-tA",
            "-c",
            &format!(
                "SELECT payload::text FROM {}.jobs WHERE id = '{old_id}'",
                schema.0
            ),
        ])
        .output()
        .expect("psql");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("$conveyor_enc"), "{text}");
    assert!(!text.contains(MARKER));
}

// ---- Every user-supplied value, not only payloads -------------------------------------------

use conveyor::workflow::{FlowFailurePolicy, NewFlow, NewStep, ValidFlow};
use conveyor::{
    CompleteParams, FailParams, FetchParams, FireRequest, Job, JobTemplate, RetryPlan, Schedule,
    ScheduleSpec,
};

/// One marker per kind of value the store keeps for a user; none may reach the store's bytes.
const MARKERS: &[(&str, &str)] = &[
    ("job payload", "mk-payload-5c1e"),
    ("job result", "mk-result-5c1e"),
    ("error message", "mk-message-5c1e"),
    ("error backtrace", "mk-backtrace-5c1e"),
    ("schedule job template", "mk-template-5c1e"),
    ("flow step template", "mk-steptemplate-5c1e"),
    ("flow step result", "mk-stepresult-5c1e"),
    ("flow signal payload", "mk-signal-5c1e"),
    ("flow step error", "mk-steperror-5c1e"),
    ("compensation payload", "mk-compensation-5c1e"),
];

fn marker(what: &str) -> &'static str {
    MARKERS
        .iter()
        .find(|(name, _)| *name == what)
        .map(|(_, m)| *m)
        .unwrap_or_else(|| panic!("no marker for {what}"))
}

/// The markers found in `bytes`, by what they stand for.
fn markers_in(bytes: &[u8]) -> Vec<&'static str> {
    MARKERS
        .iter()
        .filter(|(_, m)| bytes.windows(m.len()).any(|w| w == m.as_bytes()))
        .map(|(name, _)| *name)
        .collect()
}

/// Every file of a SQLite store's directory (the database, its -wal and -shm), concatenated.
fn sqlite_bytes(dir: &std::path::Path) -> Vec<u8> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(dir).expect("dir") {
        match std::fs::read(entry.expect("entry").path()) {
            Ok(bytes) => all.extend(bytes),
            // A closing store's writer thread may be removing its -wal and -shm files.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => panic!("read: {error}"),
        }
    }
    all
}

fn pg_dump(schema: &Schema) -> Vec<u8> {
    let out = std::process::Command::new("pg_dump")
        .args(["-h", "127.0.0.1", "-U", "postgres", "-n", &schema.0, "test"])
        .output()
        .expect("pg_dump");
    assert!(
        out.status.success(),
        "pg_dump: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.stdout.is_empty(), "pg_dump printed nothing");
    out.stdout
}

fn in_queue(mut job: NewJob, queue: &str) -> NewJob {
    job.queue = queue.to_string();
    job
}

fn fetch_params(queue: &str) -> FetchParams {
    FetchParams {
        worker_id: "enc-worker".to_string(),
        queues: vec![queue.to_string()],
        max: 1,
        lease: std::time::Duration::from_secs(60),
        kinds: None,
        excluded_kinds: Vec::new(),
    }
}

async fn fetch_one(store: &dyn Store, queue: &str) -> Job {
    let mut jobs = store.jobs_fetch(fetch_params(queue)).await.expect("fetch");
    assert_eq!(jobs.len(), 1, "one job due in {queue}");
    jobs.remove(0)
}

async fn complete(store: &dyn Store, job: &Job, result: Option<serde_json::Value>) {
    let outcome = store
        .jobs_complete_many(vec![CompleteParams {
            lease: job.lease_ref().expect("a running job"),
            result,
        }])
        .await
        .expect("complete");
    assert_eq!(outcome, vec![conveyor::LeaseOutcome::Applied]);
}

async fn fail(store: &dyn Store, job: &Job, message: &str, backtrace: Option<&str>) -> Job {
    store
        .job_fail(FailParams {
            lease: job.lease_ref().expect("a running job"),
            class: "error".to_string(),
            message: message.to_string(),
            retry: RetryPlan::Never,
            backtrace: backtrace.map(str::to_string),
        })
        .await
        .expect("fail")
}

/// What [`write_every_value`] made, to read back.
struct Written {
    completed: uuid::Uuid,
    failed: uuid::Uuid,
    fired: uuid::Uuid,
    flow: uuid::Uuid,
    ship: uuid::Uuid,
    compensation: uuid::Uuid,
}

/// Writes a marker into every kind of value through the public API and runs what makes the
/// results, errors, signals and compensations happen.
async fn write_every_value(store: &dyn Store) -> Written {
    // A job with a payload, completed with a result.
    store
        .jobs_insert_many(vec![in_queue(
            NewJob::new("charge", json!({"card": marker("job payload")})),
            "enc-jobs",
        )])
        .await
        .expect("insert");
    let completed = fetch_one(store, "enc-jobs").await;
    assert_eq!(completed.payload["card"], marker("job payload"));
    complete(
        store,
        &completed,
        Some(json!({"receipt": marker("job result")})),
    )
    .await;

    // A job failing with a message and a backtrace.
    store
        .jobs_insert_many(vec![in_queue(NewJob::new("mail", json!({})), "enc-jobs")])
        .await
        .expect("insert");
    let running = fetch_one(store, "enc-jobs").await;
    let failed = fail(
        store,
        &running,
        marker("error message"),
        Some(&format!("at frame 1\n{}", marker("error backtrace"))),
    )
    .await;
    assert_eq!(failed.errors[0].message, marker("error message"));

    // A schedule whose template the store copies into the job it fires.
    let mut template = JobTemplate::new("report", json!({"to": marker("schedule job template")}));
    template.queue = "enc-sched".to_string();
    let schedule =
        Schedule::from_spec("enc-report", ScheduleSpec::every("1s", template)).expect("schedule");
    let put = store.schedule_put(schedule).await.expect("schedule put");
    assert_eq!(
        put.schedule.job().payload["to"],
        marker("schedule job template")
    );
    tokio::time::sleep(std::time::Duration::from_millis(1_300)).await;
    let current = store
        .schedule_get("enc-report")
        .await
        .expect("schedule get")
        .expect("schedule");
    let plan = current.schedule.plan(
        current.due_after,
        chrono::Utc::now(),
        conveyor::schedule::DEFAULT_MISFIRE_THRESHOLD,
    );
    let request = FireRequest::from_plan(&current, &plan).expect("a tick is due");
    let conveyor::FireOutcome::Fired(runs) = store.schedule_fire(request).await.expect("fire")
    else {
        panic!("the schedule fired");
    };
    let fired = runs[0].job_id.expect("the run's job");

    // A flow: a step with a template and a compensation, a wait taking a signal, a step
    // receiving both results in `parents` and failing, which runs the compensation.
    let q = "enc-flow";
    let flow = NewFlow::new()
        .on_failure(FlowFailurePolicy::Compensate)
        .step(
            NewStep::job(
                "reserve",
                in_queue(
                    NewJob::new("reserve", json!({"item": marker("flow step template")})),
                    q,
                ),
            )
            .compensate(in_queue(
                NewJob::new("unreserve", json!({"why": marker("compensation payload")})),
                q,
            )),
        )
        .step(NewStep::wait("approval", "approved", None))
        .step(
            NewStep::job("ship", in_queue(NewJob::new("ship", json!({})), q))
                .after(["reserve", "approval"]),
        );
    let created = store
        .flow_create(ValidFlow::new(flow).expect("valid flow"))
        .await
        .expect("flow create");
    let reserve = fetch_one(store, q).await;
    assert_eq!(reserve.payload["item"], marker("flow step template"));
    complete(
        store,
        &reserve,
        Some(json!({"slot": marker("flow step result")})),
    )
    .await;
    store
        .flow_signal(
            created.id,
            "approved",
            json!({"by": marker("flow signal payload")}),
        )
        .await
        .expect("signal");
    let ship = fetch_one(store, q).await;
    assert_eq!(ship.kind, "ship");
    fail(store, &ship, marker("flow step error"), None).await;
    let compensation = fetch_one(store, q).await;
    assert_eq!(compensation.kind, "unreserve");
    complete(store, &compensation, None).await;
    Written {
        completed: completed.id,
        failed: failed.id,
        fired,
        flow: created.id,
        ship: ship.id,
        compensation: compensation.id,
    }
}

/// Reads every value back through the decorator: each in clear.
async fn reads_every_value(store: &dyn Store, written: &Written) {
    let get = |id: uuid::Uuid| async move {
        store
            .job_get(id)
            .await
            .expect("get")
            .unwrap_or_else(|| panic!("job {id}"))
    };
    let completed = get(written.completed).await;
    assert_eq!(completed.payload["card"], marker("job payload"));
    assert_eq!(
        completed.result,
        Some(json!({"receipt": marker("job result")}))
    );
    let mut params = conveyor::JobListParams::default();
    params.queue = Some("enc-jobs".to_string());
    params.limit = 10;
    let listed = store.jobs_list(params).await.expect("list");
    assert!(listed
        .iter()
        .any(|job| job.result == completed.result && job.id == completed.id));

    let failed = get(written.failed).await;
    assert_eq!(failed.errors[0].message, marker("error message"));
    assert_eq!(
        failed.errors[0].backtrace.as_deref(),
        Some(format!("at frame 1\n{}", marker("error backtrace")).as_str())
    );

    let schedule = store
        .schedule_get("enc-report")
        .await
        .expect("schedule get")
        .expect("schedule");
    assert_eq!(
        schedule.schedule.job().payload["to"],
        marker("schedule job template")
    );
    let listed = store.schedules_list().await.expect("schedules");
    assert_eq!(
        listed[0].schedule.job().payload["to"],
        marker("schedule job template")
    );
    let fired = get(written.fired).await;
    assert_eq!(fired.payload["to"], marker("schedule job template"));

    let flow = store
        .flow_get(written.flow)
        .await
        .expect("flow get")
        .expect("flow");
    let step = |name: &str| {
        flow.steps
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("step {name}"))
            .clone()
    };
    assert_eq!(
        step("reserve").result,
        Some(json!({"slot": marker("flow step result")}))
    );
    assert_eq!(
        step("approval").result,
        Some(json!({"by": marker("flow signal payload")}))
    );
    assert_eq!(
        step("ship").error.map(|e| e.message),
        Some(marker("flow step error").to_string())
    );
    let ship = get(written.ship).await;
    let parents = ship.flow.expect("a flow's job").parents;
    assert_eq!(parents["reserve"]["slot"], marker("flow step result"));
    assert_eq!(parents["approval"]["by"], marker("flow signal payload"));
    assert_eq!(ship.errors[0].message, marker("flow step error"));
    let compensation = get(written.compensation).await;
    assert_eq!(compensation.payload["why"], marker("compensation payload"));
    assert_eq!(
        compensation.flow.expect("a flow's job").parents["reserve"]["slot"],
        marker("flow step result")
    );
    let reserve = get(step("reserve").job_id.expect("the step's job")).await;
    assert_eq!(reserve.payload["item"], marker("flow step template"));
}

/// After a rotation (new key first, the old one kept), re-applying a schedule unchanged seals
/// its template with the new key: it then survives the old key's removal.
async fn reseals_schedule_after_rotation(store: &dyn Store) {
    let before = store
        .schedule_get("enc-report")
        .await
        .expect("schedule get")
        .expect("schedule");
    let again = store
        .schedule_put(before.schedule.clone())
        .await
        .expect("schedule put");
    assert_eq!(again.schedule, before.schedule);
    assert_ne!(again.revision, before.revision, "resealed with the new key");
    assert_eq!(
        again.due_after, before.due_after,
        "the same ticks: no tick lost"
    );
    let unchanged = store
        .schedule_put(before.schedule.clone())
        .await
        .expect("schedule put");
    assert_eq!(
        unchanged.revision, again.revision,
        "sealed with the current key: an unchanged definition changes nothing"
    );
}

/// With the key a value was sealed with gone, it reads as a decryption error naming that key,
/// never as ciphertext passed off as the value; values sealed with the remaining key read.
async fn reads_after_dropping_the_old_key(store: &dyn Store, written: &Written) {
    let completed = store
        .job_get(written.completed)
        .await
        .expect("get")
        .expect("job");
    let result = completed.result.expect("result").to_string();
    assert!(
        result.contains("$conveyor_decrypt_error") && result.contains("k1"),
        "{result}"
    );
    let failed = store
        .job_get(written.failed)
        .await
        .expect("get")
        .expect("job");
    let message = &failed.errors[0].message;
    assert!(
        message.contains("cannot decrypt") && message.contains("k1"),
        "{message}"
    );
    // The schedule resealed after the rotation reads, and so does what it fires now.
    let schedule = store
        .schedule_get("enc-report")
        .await
        .expect("schedule get")
        .expect("schedule");
    assert_eq!(
        schedule.schedule.job().payload["to"],
        marker("schedule job template")
    );
}

fn assert_no_marker(place: &str, bytes: &[u8]) {
    let found = markers_in(bytes);
    assert!(found.is_empty(), "plaintext in {place}: {found:?}");
}

#[tokio::test]
async fn sqlite_every_user_value_is_encrypted_at_rest_and_keys_rotate() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("jobs.db").display());
    let store = open(&url, keys(&[("k1", 1)])).await;
    let written = write_every_value(&*store).await;
    reads_every_value(&*store, &written).await;
    // While the store is open its latest writes are in the -wal file.
    assert_no_marker("the SQLite files (open)", &sqlite_bytes(dir.path()));
    drop(store);
    let rotated = open(&url, keys(&[("k2", 2), ("k1", 1)])).await;
    reads_every_value(&*rotated, &written).await;
    reseals_schedule_after_rotation(&*rotated).await;
    reads_every_value(&*rotated, &written).await;
    drop(rotated);
    let without_old = open(&url, keys(&[("k2", 2)])).await;
    reads_after_dropping_the_old_key(&*without_old, &written).await;
    drop(without_old);
    assert_no_marker("the SQLite files (closed)", &sqlite_bytes(dir.path()));
}

#[tokio::test]
async fn postgres_every_user_value_is_encrypted_at_rest_and_keys_rotate() {
    let schema = Schema::fresh("encall");
    let url = schema.url();
    let store = open(&url, keys(&[("k1", 1)])).await;
    let written = write_every_value(&*store).await;
    reads_every_value(&*store, &written).await;
    assert_no_marker("pg_dump", &pg_dump(&schema));
    drop(store);
    let rotated = open(&url, keys(&[("k2", 2), ("k1", 1)])).await;
    reads_every_value(&*rotated, &written).await;
    reseals_schedule_after_rotation(&*rotated).await;
    reads_every_value(&*rotated, &written).await;
    drop(rotated);
    let without_old = open(&url, keys(&[("k2", 2)])).await;
    reads_after_dropping_the_old_key(&*without_old, &written).await;
}

/// A backtrace longer than the stores keep is cut before it is sealed (a store cutting the
/// ciphertext would make it unreadable): it reads back as its start.
#[tokio::test]
async fn long_backtraces_are_cut_before_sealing_and_read_back() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("jobs.db").display());
    let store = open(&url, keys(&[("k1", 1)])).await;
    store
        .jobs_insert_many(vec![in_queue(NewJob::new("deep", json!({})), "enc-bt")])
        .await
        .expect("insert");
    let running = fetch_one(&*store, "enc-bt").await;
    let backtrace: String = (0..4000).map(|i| format!("frame {i:05}\n")).collect();
    assert!(backtrace.len() > conveyor::job::MAX_BACKTRACE_BYTES);
    fail(&*store, &running, "too deep", Some(&backtrace)).await;
    let stored = store
        .job_get(running.id)
        .await
        .expect("get")
        .expect("job")
        .errors[0]
        .backtrace
        .clone()
        .expect("backtrace");
    assert!(
        stored.len() > 16 * 1024,
        "most of it is kept: {}",
        stored.len()
    );
    assert!(backtrace.starts_with(&stored), "its start, readable");
}
