//! Defects found by hostile testing of the `conveyor` binary, each kept found: closed log
//! pipes, closed output pipes, absurd flag values, two servers on one SQLite file.

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::Duration;

/// `conveyor serve --demo 2>&1 | head -1`, then SIGTERM: the server must stop although every
/// log line it writes now fails (before the fix, the logger's complaint panicked the signal
/// task and the server served on until killed).
#[test]
fn sigterm_stops_a_server_whose_log_pipe_is_closed() {
    let dir = temp_dir();
    let store = format!("sqlite://{}", path_in(&dir, "jobs.db").display());
    let (reader, writer) = std::io::pipe().expect("pipe");
    let writer_too = writer.try_clone().expect("clone pipe");
    let child = Command::new(BIN)
        .args([
            "serve",
            "--demo",
            "--listen",
            "127.0.0.1:0",
            "--store",
            &store,
        ])
        .env("CONVEYOR_LOG", "info")
        .stdout(writer)
        .stderr(writer_too)
        .spawn()
        .expect("spawn serve");
    let mut server = Proc { child };
    let mut reader = BufReader::new(reader);
    // The demo's worker may log that it started before the server says where it listens.
    let mut seen = Vec::new();
    let listening = loop {
        let mut line = String::new();
        let read = reader.read_line(&mut line).expect("a log line");
        assert!(
            read > 0 && seen.len() < 50,
            "no `listening` line in {seen:?}"
        );
        if line.contains("listening") {
            break line;
        }
        seen.push(line);
    };
    let url = listening
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .expect("address")
        .to_string();
    // Like `head -1`: the reader goes away while the server keeps logging.
    drop(reader);
    // The demo keeps jobs (and log lines) flowing; wait until some were processed after the
    // pipe closed, so the server has certainly met a failed write.
    eventually_blocking("demo jobs completed", || {
        let queues: serde_json::Value = http()
            .get(format!("{url}/v1/queues"))
            .send()
            .ok()?
            .json()
            .ok()?;
        let completed: u64 = queues["queues"]
            .as_array()?
            .iter()
            .filter_map(|q| q["completed"].as_u64())
            .sum();
        (completed >= 3).then_some(())
    });
    server.sigterm();
    let status = server.wait_exit(Duration::from_secs(40));
    assert!(status.success(), "clean exit after SIGTERM: {status:?}");
}

/// A command's reader going away (`conveyor audit | head`) ends it quietly, like other Unix
/// tools: by SIGPIPE, never with a panic (exit code 101 and "failed printing to stdout").
#[test]
fn cli_commands_exit_quietly_on_a_closed_pipe() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    for i in 0..5 {
        enqueue(&server.url, serde_json::json!({"kind": format!("k{i}")}));
    }
    for args in [
        vec!["audit", "--server", &server.url],
        vec!["workers", "--server", &server.url],
        vec!["queues", "--server", &server.url],
        vec!["dead", "list", "--server", &server.url],
    ] {
        let mut child = Command::new(BIN)
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        // Close the read end before the command writes anything.
        drop(child.stdout.take());
        let output = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !stderr.contains("panicked") && output.status.code() != Some(101),
            "{args:?}: {:?} {stderr}",
            output.status
        );
        // Either it printed nothing before exiting (an unknown subcommand would be a failure
        // too, so require SIGPIPE or success).
        assert!(
            output.status.signal() == Some(libc::SIGPIPE) || output.status.success(),
            "{args:?}: {:?} {stderr}",
            output.status
        );
    }
}

/// Durations from flags are added to timestamps; absurd ones are refused at parse time,
/// naming the flag, instead of panicking the store's writer later.
#[test]
fn absurd_durations_are_refused_at_start() {
    let dir = temp_dir();
    let store = format!("sqlite://{}", path_in(&dir, "jobs.db").display());
    for (flag, value) in [
        ("--idempotency-window-secs", "10000000000000"),
        ("--leader-ttl-ms", "18446744073709551615"),
        ("--maintenance-interval-ms", "18446744073709551615"),
        ("--session-ttl-secs", "18446744073709551615"),
    ] {
        let output = Command::new(BIN)
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--store",
                &store,
                flag,
                value,
            ])
            .output()
            .expect("run serve");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{flag}: {stderr}");
        assert!(stderr.contains(flag), "{flag} named: {stderr}");
    }
    assert!(
        !path_in(&dir, "jobs.db").exists(),
        "refused before the store was opened"
    );
}

/// The embedded store caches settings in its one writer process: a second server on the same
/// file is refused, naming the first one's pid, and the first keeps serving.
#[test]
fn a_second_server_on_the_same_sqlite_file_is_refused() {
    let dir = temp_dir();
    let db = path_in(&dir, "jobs.db");
    let first = start_server(&db, &[]);
    let output = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--store"])
        .arg(format!("sqlite://{}", db.display()))
        .output()
        .expect("run a second serve");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "second server refused: {stderr}");
    assert!(
        stderr.contains(&format!("pid {}", first.proc.pid())),
        "names the holder: {stderr}"
    );
    let job = enqueue(&first.url, serde_json::json!({"kind": "still-served"}));
    assert_eq!(job["state"], "available");
    // Token commands share the file on purpose: they write only tokens, which no server caches.
    let output = Command::new(BIN)
        .args(["token", "create", "--role", "admin", "--store"])
        .arg(format!("sqlite://{}", db.display()))
        .output()
        .expect("token create");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Once the first server is gone the file is free again.
    drop(first);
    let again = start_server(&db, &[]);
    assert_eq!(
        get_job(&again.url, job["id"].as_str().expect("id"))["kind"],
        "still-served"
    );
}

/// Reads from `stream` until the server closes it (or 20 s pass, which fails the test); returns
/// what was received.
fn read_until_closed(stream: &mut std::net::TcpStream) -> String {
    use std::io::Read;
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("read timeout");
    let mut received = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return String::from_utf8_lossy(&received).into_owned(),
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return String::from_utf8_lossy(&received).into_owned()
            }
            Err(e) => panic!("the server did not close the connection: {e}"),
        }
    }
}

fn connect(url: &str) -> std::net::TcpStream {
    std::net::TcpStream::connect(url.trim_start_matches("http://")).expect("connect")
}

/// Idle sockets and one-byte-per-interval headers are closed by the server instead of being
/// held forever (which let 1,100 idle sockets exhaust a 1,024-descriptor limit).
#[test]
fn idle_and_slow_connections_are_closed() {
    let dir = temp_dir();
    let server = start_server(
        &path_in(&dir, "jobs.db"),
        &[
            "--idle-timeout-secs",
            "1",
            "--header-read-timeout-ms",
            "500",
        ],
    );
    // A connection that never sends anything.
    let mut idle = connect(&server.url);
    assert_eq!(read_until_closed(&mut idle), "");

    // Slowloris: a header line trickled one byte at a time, never finished in time.
    let mut slow = connect(&server.url);
    let mut trickle = slow.try_clone().expect("clone");
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
        for byte in request {
            if trickle.write_all(&[*byte]).is_err() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    });
    let answer = read_until_closed(&mut slow);
    assert!(
        !answer.contains("200 OK"),
        "a trickled request was served: {answer}"
    );
    drop(slow);
    let _ = writer.join();

    // The server still answers well-behaved clients.
    let health = http()
        .get(format!("{}/healthz", server.url))
        .send()
        .expect("healthz");
    assert!(health.status().is_success());
}

/// A connection that never sends a byte is closed once the header-read timeout has passed
/// since it connected, not held for the idle timeout (issue 27: ~900 silent connections under
/// a 1,024-descriptor limit denied service a minute at a time).
#[test]
fn a_silent_connection_is_closed_at_the_header_read_timeout() {
    let dir = temp_dir();
    let server = start_server(
        &path_in(&dir, "jobs.db"),
        &[
            "--idle-timeout-secs",
            "120",
            "--header-read-timeout-ms",
            "300",
        ],
    );
    let mut silent = connect(&server.url);
    // Waits 20 s at most, far below the idle timeout.
    assert_eq!(
        read_until_closed(&mut silent),
        "",
        "closed without an answer"
    );

    // The server still answers.
    let health = http()
        .get(format!("{}/healthz", server.url))
        .send()
        .expect("healthz");
    assert!(health.status().is_success());
}

/// Past `--max-connections`, new connections are closed at once; the server answers again as
/// soon as one ends.
#[test]
fn connections_beyond_the_limit_are_closed_at_once() {
    let dir = temp_dir();
    let server = start_server(
        &path_in(&dir, "jobs.db"),
        &["--max-connections", "3", "--idle-timeout-secs", "60"],
    );
    let held: Vec<_> = (0..3).map(|_| connect(&server.url)).collect();
    // Make sure the server has accepted all three before the next one.
    for mut stream in held.iter().map(|s| s.try_clone().expect("clone")) {
        use std::io::Write;
        stream
            .write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("request");
        use std::io::Read;
        let mut buf = [0u8; 64];
        let n = stream.read(&mut buf).expect("answer");
        assert!(String::from_utf8_lossy(&buf[..n]).contains("200"));
    }
    let mut beyond = connect(&server.url);
    assert_eq!(
        read_until_closed(&mut beyond),
        "",
        "closed without an answer"
    );
    drop(held);
    eventually_blocking("a free connection slot", || {
        http()
            .get(format!("{}/healthz", server.url))
            .send()
            .ok()
            .filter(|r| r.status().is_success())
    });
}
