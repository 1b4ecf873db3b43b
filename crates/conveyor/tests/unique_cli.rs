//! Unique jobs from the command line: `conveyor enqueue --unique*`, and a unique job keeps its
//! key through `conveyor store copy`, so it still blocks duplicates in PostgreSQL.

mod common;

use common::*;
use serde_json::Value;

/// `conveyor enqueue KIND --payload PAYLOAD EXTRA... --server SERVER --json`, which must succeed.
fn enqueue_json(server: &str, kind: &str, payload: &str, extra: &[&str]) -> Value {
    let mut args = vec!["enqueue", kind, "--payload", payload];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--server", server, "--json"]);
    let output = conveyor(&args);
    assert!(
        output.status.success(),
        "enqueue failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON on stdout")
}

#[test]
fn enqueue_unique_options_and_store_copy_keep_jobs_unique() {
    let dir = temp_dir();
    let db = path_in(&dir, "jobs.db");
    let first;
    {
        let server = start_server(&db, &[]);
        let s = server.url.as_str();
        first = enqueue_json(
            s,
            "refresh",
            r#"{"customer": 7, "by": "a"}"#,
            &["--unique-args", "customer"],
        );
        assert_eq!(first["duplicate"], false);
        let again = enqueue_json(
            s,
            "refresh",
            r#"{"by": "b", "customer": 7}"#,
            &[
                "--unique-args",
                "customer",
                "--unique-period-secs",
                "3600",
                "--unique-states",
                "available,running",
            ],
        );
        assert_eq!(again["duplicate"], true, "{again}");
        assert_eq!(again["id"], first["id"]);

        let whole = enqueue_json(s, "refresh", r#"{"customer": 7, "by": "a"}"#, &["--unique"]);
        assert_eq!(
            whole["duplicate"], false,
            "the whole payload is another identity than one field"
        );
        let elsewhere = enqueue_json(
            s,
            "refresh",
            r#"{"customer": 7}"#,
            &[
                "--unique-args",
                "customer",
                "--unique-across-queues",
                "--queue",
                "other",
            ],
        );
        assert_eq!(
            elsewhere["duplicate"], false,
            "by_queue: false is another identity"
        );

        let bad = conveyor(&[
            "enqueue",
            "refresh",
            "--unique-states",
            "queued",
            "--server",
            s,
        ]);
        assert!(!bad.status.success());
        let message = String::from_utf8_lossy(&bad.stderr);
        assert!(message.contains("unique.states"), "{message}");

        let text = conveyor(&[
            "enqueue",
            "refresh",
            "--payload",
            r#"{"customer": 7}"#,
            "--unique-args",
            "customer",
            "--server",
            s,
        ]);
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(text.contains("duplicate"), "{text}");
    }

    let schema = Schema::fresh("conveyor_unique_copy");
    let postgres = schema.url();
    let sqlite = format!("sqlite://{}", db.display());
    let copied = conveyor(&["store", "copy", "--from", &sqlite, "--to", &postgres]);
    assert!(
        copied.status.success(),
        "{}",
        String::from_utf8_lossy(&copied.stderr)
    );
    let server = start_server_at(&postgres, &[]);
    let s = server.url.as_str();
    let id = first["id"].as_str().expect("id");
    assert_eq!(
        get_job(s, id)["unique_key"],
        first["unique_key"],
        "the key is copied"
    );
    let again = enqueue_json(
        s,
        "refresh",
        r#"{"customer": 7, "by": "c"}"#,
        &["--unique-args", "customer"],
    );
    assert_eq!(
        again["duplicate"], true,
        "PostgreSQL computes the same key and finds the copied job: {again}"
    );
    assert_eq!(again["id"], first["id"]);
}
