//! TLS through the real binary: `conveyor serve --tls-cert --tls-key --tls-client-ca`, client
//! commands and `conveyor work` over https:// with `--ca-cert` and a client certificate, alert
//! webhooks delivered to an HTTPS receiver trusted through `--alert-ca`, and bad TLS input
//! refused at start. Every certificate is made by the test (rcgen).

mod common;

#[path = "../../conveyor-server/tests/common/certs.rs"]
mod certs;

use certs::Ca;
use common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn s(path: &Path) -> &str {
    path.to_str().expect("UTF-8 path")
}

/// An HTTPS receiver for alert webhooks (`POST /hook`), with a certificate from `ca`; its URL and
/// the bodies it receives. It serves on its own thread until the test process ends.
fn https_receiver(ca: &Ca, dir: &Path) -> (String, mpsc::Receiver<Vec<u8>>) {
    let (cert, key) = ca.server().write(dir, "hook");
    let tls = conveyor_server::TlsConfig::from_files(&conveyor_server::TlsFiles {
        cert,
        key,
        client_ca: None,
    })
    .expect("receiver TLS");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind receiver");
    listener.set_nonblocking(true).expect("non-blocking");
    let port = listener.local_addr().expect("addr").port();
    let (sender, received) = mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("receiver runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            let app = axum::Router::new().route(
                "/hook",
                axum::routing::post(move |body: axum::body::Bytes| {
                    let sender = sender.clone();
                    async move {
                        let _ = sender.send(body.to_vec());
                        axum::http::StatusCode::OK
                    }
                }),
            );
            conveyor_server::serve_tls(
                listener,
                app,
                conveyor_server::ConnectionLimits::default(),
                tls,
                tokio_util::sync::CancellationToken::new(),
            )
            .await
        })
    });
    (format!("https://127.0.0.1:{port}/hook"), received)
}

/// Certificates and keys of one test, written into its directory.
struct Files {
    server_cert: PathBuf,
    server_key: PathBuf,
    server_ca: PathBuf,
    clients_ca: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    intruder_cert: PathBuf,
    intruder_key: PathBuf,
}

fn files(dir: &Path) -> Files {
    let server_ca = Ca::new("conveyor server CA");
    let (server_cert, server_key) = server_ca.server().write(dir, "server");
    let clients = Ca::new("conveyor clients CA");
    let (client_cert, client_key) = clients.client("ops").write(dir, "ops");
    let (intruder_cert, intruder_key) = Ca::new("another CA")
        .client("intruder")
        .write(dir, "intruder");
    Files {
        server_cert,
        server_key,
        server_ca: server_ca.write(dir, "server-ca.crt"),
        clients_ca: clients.write(dir, "clients-ca.crt"),
        client_cert,
        client_key,
        intruder_cert,
        intruder_key,
    }
}

/// A blocking client trusting the server's CA and presenting the `ops` certificate.
fn tls_http(files: &Files) -> reqwest::blocking::Client {
    let ca = std::fs::read(&files.server_ca).expect("CA");
    let mut identity = std::fs::read(&files.client_key).expect("key");
    identity.extend(std::fs::read(&files.client_cert).expect("cert"));
    reqwest::blocking::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).expect("CA"))
        .identity(reqwest::Identity::from_pem(&identity).expect("identity"))
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

#[test]
fn serve_over_tls_with_client_certificates_and_alerts_over_https() {
    let dir = temp_dir();
    let files = files(dir.path());
    let hook_ca = Ca::new("webhook receiver CA");
    let hook_ca_file = hook_ca.write(dir.path(), "hook-ca.crt");
    let (hook, alerts) = https_receiver(&hook_ca, dir.path());

    let db = path_in(&dir, "jobs.db");
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--store"])
        .arg(format!("sqlite://{}", db.display()))
        .args(["--tls-cert", s(&files.server_cert)])
        .args(["--tls-key", s(&files.server_key)])
        // The client CA through its environment variable.
        .env("CONVEYOR_TLS_CLIENT_CA", &files.clients_ca)
        .args(["--alert-webhook", &hook, "--alert-ca", s(&hook_ca_file)])
        .args([
            "--alert-secret-env",
            "TEST_ALERT_SECRET",
            "--alert-check-ms",
            "100",
        ])
        .args(["--maintenance-interval-ms", "100"])
        .env("TEST_ALERT_SECRET", "tls-alert-secret")
        .env("CONVEYOR_LOG", "warn,conveyor::alerts=info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn conveyor serve");
    let (armed, is_armed) = mpsc::channel();
    let stderr = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{line}");
            if line.contains("alerting on what happens from now on") {
                let _ = armed.send(());
            }
        }
    });
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let _server = Proc { child };
    let mut banner = String::new();
    stdout.read_line(&mut banner).expect("listen line");
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    assert!(
        banner.contains("tls: on, client certificates required"),
        "{banner}"
    );
    let url = banner
        .split_whitespace()
        .find(|w| w.starts_with("https://"))
        .unwrap_or_else(|| panic!("no https:// address in {banner:?}"))
        .to_string();

    // Plain HTTP to the TLS port gets no answer.
    let plain = http()
        .get(format!(
            "{}/healthz",
            url.replacen("https://", "http://", 1)
        ))
        .send();
    assert!(plain.is_err(), "plain HTTP must fail: {plain:?}");

    let ca = s(&files.server_ca);
    let (cert, key) = (s(&files.client_cert), s(&files.client_key));
    // Without a client certificate, with one from another CA, or without trusting the
    // server's CA: refused.
    for (what, extra) in [
        ("no client certificate", vec!["--ca-cert", ca]),
        (
            "a certificate from another CA",
            vec![
                "--ca-cert",
                ca,
                "--client-cert",
                s(&files.intruder_cert),
                "--client-key",
                s(&files.intruder_key),
            ],
        ),
        (
            "the server's CA not trusted",
            vec!["--client-cert", cert, "--client-key", key],
        ),
    ] {
        let mut args = vec!["queues", "--json", "--server", &url];
        args.extend(extra);
        let refused = conveyor(&args);
        assert!(
            !refused.status.success(),
            "{what}: must be refused, got {}",
            text(&refused.stdout)
        );
    }

    // With both: served. `enqueue` by flags, `queues` by environment variables.
    let enqueued = conveyor(&[
        "enqueue",
        "charge",
        "--queue",
        "alerts",
        "--max-attempts",
        "1",
        "--json",
        "--server",
        &url,
        "--ca-cert",
        ca,
        "--client-cert",
        cert,
        "--client-key",
        key,
    ]);
    assert!(enqueued.status.success(), "{}", text(&enqueued.stderr));
    let job: Value = serde_json::from_slice(&enqueued.stdout).expect("job JSON");
    let id = job["id"].as_str().expect("id").to_string();
    let queues = Command::new(BIN)
        .args(["queues", "--json", "--server", &url])
        .env("CONVEYOR_LOG", "warn")
        .env("CONVEYOR_CA_CERT", ca)
        .env("CONVEYOR_CLIENT_CERT", cert)
        .env("CONVEYOR_CLIENT_KEY", key)
        .output()
        .expect("run conveyor queues");
    assert!(queues.status.success(), "{}", text(&queues.stderr));
    assert!(
        text(&queues.stdout).contains("alerts"),
        "{}",
        text(&queues.stdout)
    );

    // A worker over HTTPS lets the job die; the dead-letter alert reaches the HTTPS receiver.
    is_armed
        .recv_timeout(Duration::from_secs(30))
        .expect("the alert engine to take its baseline");
    let _worker = start_worker(
        &url,
        "exit 65",
        &[
            "--queues",
            "alerts",
            "--ca-cert",
            ca,
            "--client-cert",
            cert,
            "--client-key",
            key,
        ],
    );
    let body = alerts
        .recv_timeout(Duration::from_secs(30))
        .expect("a dead-letter alert over HTTPS");
    let alert: Value = serde_json::from_slice(&body).expect("alert JSON");
    assert_eq!(alert["alert"], "job_dead", "{alert}");
    assert_eq!(alert["details"]["jobs"][0]["id"], json!(id));
    let dead: Value = tls_http(&files)
        .get(format!("{url}/v1/jobs/{id}"))
        .send()
        .expect("GET job over HTTPS")
        .json()
        .expect("job JSON");
    assert_eq!(dead["state"], "dead");
}

/// Runs `conveyor serve` with `args`, expecting it to refuse to start; its stderr.
fn serve_refused(dir: &Path, args: &[&str]) -> String {
    let child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--store"])
        .arg(format!("sqlite://{}", dir.join("refused.db").display()))
        .args(args)
        .env("CONVEYOR_LOG", "warn")
        .env("TEST_ALERT_SECRET", "secret")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn conveyor serve");
    let mut proc = Proc { child };
    let status = proc.wait_exit(Duration::from_secs(30));
    let mut stderr = String::new();
    proc.child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    assert!(!status.success(), "serve {args:?} must refuse to start");
    stderr
}

#[test]
fn bad_tls_input_is_refused_with_a_clear_error() {
    let dir = temp_dir();
    let files = files(dir.path());
    let (cert, key) = (s(&files.server_cert), s(&files.server_key));
    let missing = dir.path().join("missing.pem");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "-----BEGIN CERTIFICATE-----\n%%% not base64\n").expect("write");
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").expect("write");

    let error = serve_refused(dir.path(), &["--tls-key", key]);
    assert!(error.contains("--tls-cert"), "{error}");
    let error = serve_refused(dir.path(), &["--tls-cert", cert]);
    assert!(error.contains("--tls-key"), "{error}");
    let error = serve_refused(dir.path(), &["--tls-client-ca", s(&files.clients_ca)]);
    assert!(error.contains("--tls-cert"), "{error}");
    let error = serve_refused(dir.path(), &["--tls-cert", cert, "--tls-key", s(&missing)]);
    assert!(
        error.contains("cannot read key file") && error.contains("missing.pem"),
        "{error}"
    );
    let error = serve_refused(dir.path(), &["--tls-cert", s(&garbage), "--tls-key", key]);
    assert!(
        error.contains("garbage.pem") && error.contains("not valid PEM"),
        "{error}"
    );
    let error = serve_refused(dir.path(), &["--tls-cert", cert, "--tls-key", cert]);
    assert!(
        error.contains("server.crt") && error.contains("no private key"),
        "{error}"
    );
    let error = serve_refused(
        dir.path(),
        &[
            "--tls-cert",
            cert,
            "--tls-key",
            key,
            "--tls-client-ca",
            s(&empty),
        ],
    );
    assert!(
        error.contains("client CA file") && error.contains("empty.pem"),
        "{error}"
    );
    let error = serve_refused(
        dir.path(),
        &[
            "--alert-webhook",
            "https://127.0.0.1:9/hook",
            "--alert-secret-env",
            "TEST_ALERT_SECRET",
            "--alert-ca",
            s(&empty),
        ],
    );
    assert!(
        error.contains("--alert-ca") && error.contains("empty.pem"),
        "{error}"
    );

    // Client commands name the file they could not use.
    let refused = conveyor(&[
        "queues",
        "--server",
        "https://127.0.0.1:9",
        "--ca-cert",
        s(&missing),
    ]);
    assert!(!refused.status.success());
    let error = text(&refused.stderr);
    assert!(
        error.contains("cannot read --ca-cert") && error.contains("missing.pem"),
        "{error}"
    );
    let refused = conveyor(&[
        "queues",
        "--server",
        "https://127.0.0.1:9",
        "--client-cert",
        cert,
    ]);
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("--client-key"),
        "{}",
        text(&refused.stderr)
    );
}
