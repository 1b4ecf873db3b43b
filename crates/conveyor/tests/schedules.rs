//! Cron schedules end to end, with real `conveyor serve` processes: a per-second schedule served
//! by two servers on one PostgreSQL schema fires once per tick; `overlap: skip` with a 3 s job
//! skips ticks; `missed: catch_up` after a 5 s outage enqueues the configured number of missed
//! runs (SQLite and PostgreSQL); bad definitions are refused naming the field, over HTTP and in
//! the schedules file.

mod common;

use chrono::{DateTime, Utc};
use common::*;
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn put_schedule(server: &str, name: &str, body: Value) -> (u16, Value) {
    let response = http()
        .put(format!("{server}/v1/schedules/{name}"))
        .json(&body)
        .send()
        .expect("PUT schedule");
    let status = response.status().as_u16();
    (status, response.json().expect("JSON answer"))
}

/// Every run of the schedule (up to 1000), oldest first.
fn runs(server: &str, name: &str) -> Vec<Value> {
    let answer: Value = http()
        .get(format!("{server}/v1/schedules/{name}/runs?limit=1000"))
        .send()
        .expect("GET runs")
        .json()
        .expect("runs JSON");
    let mut runs = answer["runs"].as_array().cloned().unwrap_or_default();
    runs.reverse();
    runs
}

fn time(value: &Value) -> DateTime<Utc> {
    value
        .as_str()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_else(|| panic!("not a time: {value}"))
}

/// Every job carrying the schedule's tag, by id.
fn jobs_of(server: &str, kind: &str) -> Vec<Value> {
    let page: Value = http()
        .get(format!("{server}/v1/jobs?kind={kind}&limit=500"))
        .send()
        .expect("GET jobs")
        .json()
        .expect("jobs JSON");
    page["jobs"].as_array().cloned().unwrap_or_default()
}

#[test]
fn two_servers_fire_a_per_second_schedule_once_per_tick_for_ten_seconds() {
    let schema = Schema::fresh("conveyor_sched");
    let store = schema.url();
    migrate(&store);
    let args = [
        "--maintenance-interval-ms",
        "200",
        "--leader-ttl-ms",
        "3000",
    ];
    let a = start_server_at(&store, &args);
    let b = start_server_at(&store, &args);
    eventually_blocking("one server to lead", || {
        (is_leader(&a.url) != is_leader(&b.url)).then_some(())
    });
    let (status, answer) = put_schedule(
        &a.url,
        "every-second",
        json!({"cron": "* * * * * *", "job": {"kind": "tick"}, "overlap": "allow"}),
    );
    assert_eq!(status, 200, "{answer}");
    let fired = eventually_blocking_within("ten seconds of ticks", Duration::from_secs(60), || {
        let fired = runs(&b.url, "every-second");
        (fired.len() >= 10).then_some(fired)
    });
    let ticks: Vec<DateTime<Utc>> = fired.iter().map(|run| time(&run["tick"])).collect();
    for pair in ticks.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            chrono::Duration::seconds(1),
            "one run per tick, consecutive: {ticks:?}"
        );
    }
    assert!(
        fired.iter().all(|run| run["status"] == "enqueued"),
        "{fired:?}"
    );
    // Jobs fired since the runs were read have later ticks; up to the last tick read, there is
    // exactly one job per tick, due at its tick.
    let last = *ticks.last().expect("ticks");
    let mut per_tick: HashMap<DateTime<Utc>, usize> = HashMap::new();
    for job in jobs_of(&a.url, "tick") {
        let tick = time(&job["run_at"]);
        if tick <= last {
            *per_tick.entry(tick).or_default() += 1;
        }
        assert!(job["tags"]
            .as_array()
            .is_some_and(|tags| tags.contains(&json!("schedule:every-second"))));
    }
    let job_ticks: BTreeSet<DateTime<Utc>> = per_tick.keys().copied().collect();
    assert_eq!(
        job_ticks,
        ticks.iter().copied().collect::<BTreeSet<_>>(),
        "a job for every tick and none other"
    );
    assert!(
        per_tick.values().all(|&n| n == 1),
        "no tick enqueued twice: {per_tick:?}"
    );
    // Both servers show the same schedule state, with its next and last run.
    for server in [&a.url, &b.url] {
        let listed: Value = http()
            .get(format!("{server}/v1/schedules"))
            .send()
            .expect("list")
            .json()
            .expect("JSON");
        let schedule = &listed["schedules"][0];
        assert_eq!(schedule["name"], "every-second");
        assert!(schedule["next_run_at"].is_string(), "{schedule}");
        assert_eq!(schedule["last_run"]["status"], "enqueued", "{schedule}");
    }
}

#[test]
fn overlap_skip_skips_ticks_while_a_three_second_job_runs() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let _worker = start_worker(&server.url, "sleep 3", &["--queues", "slow"]);
    let (status, answer) = put_schedule(
        &server.url,
        "slow",
        json!({"cron": "* * * * * *", "job": {"kind": "slow", "queue": "slow"}, "overlap": "skip"}),
    );
    assert_eq!(status, 200, "{answer}");
    // Three enqueued runs: two whole jobs, and the skipped ticks in between.
    let fired = eventually_blocking_within("three enqueued runs", Duration::from_secs(60), || {
        let fired = runs(&server.url, "slow");
        let enqueued = fired.iter().filter(|r| r["status"] == "enqueued").count();
        (enqueued >= 3).then_some(fired)
    });
    let enqueued: Vec<&Value> = fired.iter().filter(|r| r["status"] == "enqueued").collect();
    let skipped = fired
        .iter()
        .filter(|r| r["status"] == "skipped_overlap")
        .count();
    assert!(
        skipped >= 4,
        "ticks are skipped while a run is unfinished: {fired:?}"
    );
    for pair in enqueued.windows(2) {
        let previous = get_job(&server.url, pair[0]["job_id"].as_str().expect("job id"));
        let finished = previous["finished_at"].clone();
        assert!(!finished.is_null(), "{previous}");
        // The next run starts only after the previous job finished (it ran about 3 s).
        assert!(
            time(&finished) <= time(&pair[1]["fired_at"]),
            "overlap: {previous} vs {}",
            pair[1]
        );
        let gap = time(&pair[1]["tick"]) - time(&pair[0]["tick"]);
        assert!(gap >= chrono::Duration::seconds(3), "{fired:?}");
    }
    for run in fired.iter().filter(|r| r["status"] == "skipped_overlap") {
        assert!(run["job_id"].is_null());
        let detail = run["detail"].as_str().unwrap_or_default();
        assert!(detail.contains("still"), "{detail}");
    }
}

/// A per-second schedule with `missed: catch_up, max_catch_up: 2`, defined in a schedules file;
/// the server is stopped for 5 s and started again with the same file: the first pass after
/// the restart catches up exactly two missed ticks (the most recent of at least three) besides
/// the on-time ones, and no tick fires twice.
fn catch_up_after_an_outage(store: &str, dir: &tempfile::TempDir) {
    let file = path_in(dir, "schedules.toml");
    std::fs::write(
        &file,
        r#"
[schedules.catcher]
cron = "* * * * * *"
overlap = "allow"
missed = "catch_up"
max_catch_up = 2
job = { kind = "caught", payload = { from = "file" } }
"#,
    )
    .expect("write schedules file");
    let file = file.to_str().expect("utf-8 path").to_string();
    let args = [
        "--schedules",
        file.as_str(),
        "--schedule-misfire-ms",
        "2000",
        "--maintenance-interval-ms",
        "200",
    ];
    let mut server = start_server_at(store, &args);
    eventually_blocking("two ticks before the outage", || {
        (runs(&server.url, "catcher").len() >= 2).then_some(())
    });
    server.proc.sigterm();
    assert!(server.proc.wait_exit(Duration::from_secs(30)).success());
    // The outage itself: nothing runs the schedule for five seconds.
    std::thread::sleep(Duration::from_secs(5));
    let restarted = start_server_at(store, &args);
    let all = eventually_blocking("the catch-up after the restart", || {
        let all = runs(&restarted.url, "catcher");
        all.iter().any(|r| r["catch_up"] == true).then_some(all)
    });
    drop(restarted);
    let ticks: Vec<DateTime<Utc>> = all.iter().map(|r| time(&r["tick"])).collect();
    let unique: BTreeSet<_> = ticks.iter().collect();
    assert_eq!(unique.len(), ticks.len(), "no tick twice: {ticks:?}");
    let caught: Vec<&Value> = all.iter().filter(|r| r["catch_up"] == true).collect();
    assert_eq!(
        caught.len(),
        2,
        "exactly max_catch_up missed ticks run: {all:?}"
    );
    // The outage is where consecutive ticks are more than a second apart: at least one missed
    // tick was dropped there, and the two caught up lie right after the gap.
    let gap = ticks
        .windows(2)
        .position(|w| w[1] - w[0] > chrono::Duration::seconds(1))
        .expect("some missed ticks were dropped");
    let after_gap: Vec<&Value> = all[gap + 1..].iter().collect();
    assert_eq!(after_gap[0]["catch_up"], true, "{all:?}");
    assert_eq!(after_gap[1]["catch_up"], true, "{all:?}");
    assert!(all[..=gap].iter().all(|r| r["catch_up"] == false));
    assert!(all.iter().all(|r| r["status"] == "enqueued"));
}

#[test]
fn catch_up_after_a_five_second_outage_on_sqlite() {
    let dir = temp_dir();
    let store = format!("sqlite://{}", path_in(&dir, "jobs.db").display());
    catch_up_after_an_outage(&store, &dir);
}

#[test]
fn catch_up_after_a_five_second_outage_on_postgres() {
    let dir = temp_dir();
    let schema = Schema::fresh("conveyor_catch");
    catch_up_after_an_outage(&schema.url(), &dir);
}

#[test]
fn bad_definitions_are_refused_naming_the_field() {
    let dir = temp_dir();
    let db = path_in(&dir, "jobs.db");
    let server = start_server(&db, &[]);
    for (body, field) in [
        (json!({"cron": "61 * * * *", "job": {"kind": "k"}}), "cron"),
        (
            json!({"cron": "* * * * *", "timezone": "Mars/Olympus", "job": {"kind": "k"}}),
            "timezone",
        ),
    ] {
        let (status, answer) = put_schedule(&server.url, "bad", body);
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["error"]["field"], field, "{answer}");
    }
    drop(server);

    // The same mistakes in a schedules file stop `conveyor serve` at start, naming them.
    let file = path_in(&dir, "bad.toml");
    std::fs::write(
        &file,
        "[schedules.bad]\ncron = \"* * * * *\"\ntimezone = \"Mars/Olympus\"\njob = { kind = \"k\" }\n",
    )
    .expect("write");
    let output = serve_output(&db, &file);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("bad") && stderr.contains("timezone") && stderr.contains("Mars/Olympus"),
        "{stderr}"
    );
}

/// Runs `conveyor serve` with a schedules file that should stop it at start.
fn serve_output(db: &Path, file: &Path) -> std::process::Output {
    Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--store"])
        .arg(format!("sqlite://{}", db.display()))
        .arg("--schedules")
        .arg(file)
        .env("CONVEYOR_LOG", "warn")
        .output()
        .expect("run conveyor serve")
}

/// `conveyor schedule pause|resume|trigger` against a real server: a paused per-second
/// schedule fires nothing while paused (its run count holds across several ticks), a trigger
/// enqueues its job at once, resuming shows the next run; an unknown name fails clearly.
#[test]
fn schedules_are_paused_resumed_and_triggered_from_the_cli() {
    let dir = temp_dir();
    let server = start_server(
        &path_in(&dir, "jobs.db"),
        &["--maintenance-interval-ms", "50"],
    );
    let s = server.url.as_str();
    let (status, _) = put_schedule(
        s,
        "pulse",
        json!({"every": "1s", "job": {"kind": "pulse.beat"}, "overlap": "allow"}),
    );
    assert_eq!(status, 200);
    let out = conveyor(&["schedule", "pause", "pulse", "--server", s]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("paused"));
    let before = runs(s, "pulse").len();
    // A trigger lands in the same store; once its job exists, later ticks would have too.
    let out = conveyor(&["schedule", "trigger", "pulse", "--server", s, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let id = run["id"].as_str().expect("id").to_string();
    let job = get_job(s, &id);
    assert!(
        job["tags"]
            .as_array()
            .expect("tags")
            .contains(&json!("manual")),
        "{job}"
    );
    // Three seconds of ticks pass while paused (the view's due_after moves past them).
    let paused_at = time(
        &http()
            .get(format!("{s}/v1/schedules/pulse"))
            .send()
            .expect("get")
            .json::<Value>()
            .expect("json")["due_after"],
    );
    conveyor_storetest::eventually::eventually_blocking("three ticks to pass unfired", || {
        let view: Value = http()
            .get(format!("{s}/v1/schedules/pulse"))
            .send()
            .ok()?
            .json()
            .ok()?;
        (time(&view["due_after"]) >= paused_at + chrono::Duration::seconds(3)).then_some(())
    });
    assert_eq!(runs(s, "pulse").len(), before, "no run while paused");
    assert_eq!(
        jobs_of(s, "pulse.beat").len(),
        before + 1,
        "only the triggered job was added"
    );

    let out = conveyor(&["schedule", "resume", "pulse", "--server", s]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("next run"));
    conveyor_storetest::eventually::eventually_blocking("a run after resuming", || {
        (runs(s, "pulse").len() > before).then_some(())
    });

    let out = conveyor(&["schedule", "trigger", "nope", "--server", s]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nope"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A schedule paused by an operator stays paused when the server restarts with the schedules
/// file that defines it (the file says what runs, not whether someone stopped it for now).
#[test]
fn a_paused_schedule_stays_paused_across_a_restart_with_its_file() {
    let dir = temp_dir();
    let file = path_in(&dir, "schedules.toml");
    std::fs::write(
        &file,
        "[schedules.from-file]\nevery = \"5m\"\njob = { kind = \"refresh\" }\n",
    )
    .expect("write schedules file");
    let file_arg = file.display().to_string();
    let db = path_in(&dir, "jobs.db");
    let mut server = start_server(&db, &["--schedules", &file_arg]);
    let out = conveyor(&["schedule", "pause", "from-file", "--server", &server.url]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    server.proc.sigterm();
    assert!(server.proc.wait_exit(Duration::from_secs(30)).success());

    let again = start_server(&db, &["--schedules", &file_arg]);
    let view: Value = http()
        .get(format!("{}/v1/schedules/from-file", again.url))
        .send()
        .expect("get")
        .json()
        .expect("json");
    assert_eq!(view["paused"], true, "{view}");
    assert!(view["next_run_at"].is_null(), "{view}");
}
