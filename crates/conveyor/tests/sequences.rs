//! Sequences with real processes: two accounts' jobs, each account's strictly one after another
//! in enqueue order, survive a worker killed with SIGKILL in the middle of a job; on the
//! embedded SQLite store and on PostgreSQL with two servers sharing one schema (and a worker
//! on each).

mod common;

use chrono::{DateTime, Utc};
use common::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

const ACCOUNTS: [&str; 2] = ["acme", "globex"];
const PER_ACCOUNT: u64 = 10;
/// How far apart two servers' records of one moment may be: a fetch's time is taken before its
/// statements run (a few milliseconds on a busy machine), and each server carries the
/// database's clock to well under a millisecond (`conveyor_postgres` clock).
const RECORD_SKEW: chrono::Duration = chrono::Duration::milliseconds(50);

fn time(job: &Value, field: &str) -> DateTime<Utc> {
    job[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} of {job}"))
        .parse()
        .expect("timestamp")
}

fn jobs_of(server: &str, queue: &str) -> Vec<Value> {
    let listed: Value = http()
        .get(format!("{server}/v1/jobs?queue={queue}&limit=500"))
        .send()
        .expect("GET jobs")
        .json()
        .expect("jobs JSON");
    listed["jobs"].as_array().expect("jobs").clone()
}

fn starts_logged(log: &std::path::Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|line| line.starts_with("start"))
        .count()
}

fn sequence_survives_a_killed_worker(backend: Backend) {
    let dir = temp_dir();
    let servers = backend.servers();
    let server = &servers[0].url;
    set_queue(server, "ledger", json!({"sequence": "payload.account"}));
    // The accounts' jobs interleaved, each account's numbered in the order it is enqueued.
    let jobs: Vec<Value> = (0..PER_ACCOUNT)
        .flat_map(|n| {
            ACCOUNTS.map(|account| {
                json!({"kind": "post", "queue": "ledger", "payload": {"account": account, "n": n}})
            })
        })
        .collect();
    enqueue_many(server, jobs);

    let log = path_in(&dir, "runs.log");
    let exec = format!(
        "echo \"start $CONVEYOR_JOB_ID $CONVEYOR_JOB_ATTEMPT\" >> {log}; sleep 0.3; \
         echo \"end $CONVEYOR_JOB_ID $CONVEYOR_JOB_ATTEMPT\" >> {log}",
        log = log.display()
    );
    let worker_args = [
        "--queues",
        "ledger",
        "--concurrency",
        "4",
        "--lease-ms",
        "1000",
    ];
    let mut first = start_worker(server, &exec, &worker_args);
    eventually_blocking_within("three runs to start", Duration::from_secs(30), || {
        (starts_logged(&log) >= 3).then_some(())
    });
    first.kill_9();
    // The killed worker's commands die with it (PR_SET_PDEATHSIG): whatever it held is run
    // again once its lease expires.
    let _workers: Vec<Proc> = servers
        .iter()
        .map(|s| start_worker(&s.url, &exec, &worker_args))
        .collect();
    eventually_blocking_within("every job to complete", Duration::from_secs(120), || {
        let jobs = jobs_of(server, "ledger");
        (jobs.len() as u64 == PER_ACCOUNT * 2 && jobs.iter().all(|j| j["state"] == "completed"))
            .then_some(())
    });

    let jobs = jobs_of(server, "ledger");
    let mut by_account: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for job in &jobs {
        let account = job["payload"]["account"].as_str().expect("account");
        by_account.entry(account.to_string()).or_default().push(job);
    }
    let mut rerun = 0;
    for (account, mut jobs) in by_account {
        jobs.sort_by_key(|job| job["sequence"]["no"].as_u64().expect("sequence.no"));
        let order: Vec<u64> = jobs
            .iter()
            .map(|job| job["payload"]["n"].as_u64().expect("n"))
            .collect();
        assert_eq!(
            order,
            (0..PER_ACCOUNT).collect::<Vec<_>>(),
            "{account}: numbered in enqueue order"
        );
        assert!(jobs
            .iter()
            .all(|job| job["sequence"]["key"] == format!("payload.account={account}")));
        // Each job started (its last attempt) only after the one before it had finished. The
        // two times are read by different servers, each from the database's clock as it
        // carries it, when its fetch or completion began: a fetch that began just before the
        // completion that released its job records a start a little before that finish. The
        // handlers' own log below checks the real order strictly; here the records must agree
        // to within `RECORD_SKEW`.
        for pair in jobs.windows(2) {
            let finished = time(pair[0], "finished_at");
            let started = time(pair[1], "started_at");
            assert!(
                started + RECORD_SKEW >= finished,
                "{account}: job {} started at {started} before job {} finished at {finished}",
                pair[1]["payload"]["n"],
                pair[0]["payload"]["n"]
            );
        }
        rerun += jobs
            .iter()
            .filter(|job| job["attempt"].as_u64() > Some(1))
            .count();
    }
    assert!(rerun >= 1, "a job the killed worker held ran again");

    // The handlers' own record: runs of one account never overlapped, and ran in order (a run
    // the kill cut short has a start and no end).
    let text = std::fs::read_to_string(&log).expect("log");
    let account_of: BTreeMap<String, (String, u64)> = jobs
        .iter()
        .map(|job| {
            (
                job["id"].as_str().expect("id").to_string(),
                (
                    job["payload"]["account"]
                        .as_str()
                        .expect("account")
                        .to_string(),
                    job["payload"]["n"].as_u64().expect("n"),
                ),
            )
        })
        .collect();
    // A job of each account that has started and not ended (a run the kill cut short never
    // ends), the last one ended, and every job that ended.
    let mut open: BTreeMap<String, u64> = BTreeMap::new();
    let mut last_ended: BTreeMap<String, u64> = BTreeMap::new();
    let mut ended = std::collections::BTreeSet::new();
    for line in text.lines() {
        let mut words = line.split(' ');
        let (what, id) = (words.next().expect("event"), words.next().expect("id"));
        let (account, n) = account_of.get(id).expect("a job of the queue").clone();
        if what == "start" {
            if let Some(other) = open.get(&account) {
                // Only the run of the same job again (after the kill) may follow an open one.
                assert_eq!(
                    *other, n,
                    "{account}: job {n} started while job {other} ran"
                );
            }
            // A job runs again only when a worker died before its end was acknowledged:
            // never one before the last that ended.
            if let Some(last) = last_ended.get(&account) {
                assert!(
                    n >= *last,
                    "{account}: job {n} ran after job {last} had ended"
                );
            }
            open.insert(account, n);
        } else {
            open.remove(&account);
            last_ended.insert(account, n);
            ended.insert(id.to_string());
        }
    }
    assert_eq!(
        ended.len() as u64,
        PER_ACCOUNT * 2,
        "every job ran to its end"
    );
}

#[test]
fn a_sequence_survives_a_killed_worker_on_sqlite() {
    sequence_survives_a_killed_worker(Backend::Sqlite(temp_dir()));
}

#[test]
fn a_sequence_survives_a_killed_worker_on_two_postgres_servers() {
    sequence_survives_a_killed_worker(Backend::Postgres(Schema::fresh("sequence_kill")));
}
