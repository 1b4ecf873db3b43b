//! `serve_tls`: the API over HTTPS with certificates the test makes, plain HTTP refused, client
//! certificates required when a client CA is set, and a silent client dropped at the
//! handshake deadline.

#[path = "common/certs.rs"]
mod certs;

use certs::{Ca, Pair};
use conveyor_core::Store;
use conveyor_server::{
    router_with_options, serve_tls, ConnectionLimits, RouterOptions, ServerConfig, TlsConfig,
    TlsError, TlsFiles,
};
use conveyor_sqlite::{SqliteOptions, SqliteStore};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

struct TlsServer {
    addr: SocketAddr,
    ca: Ca,
    stop: CancellationToken,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
    _dir: tempfile::TempDir,
}

impl TlsServer {
    /// A TLS server with a certificate from a fresh CA; with `client_ca`, clients must present a
    /// certificate it signed.
    async fn start(client_ca: Option<&Ca>, limits: ConnectionLimits) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = Ca::new("conveyor test CA");
        let (cert, key) = ca.server().write(dir.path(), "server");
        let files = TlsFiles {
            cert,
            key,
            client_ca: client_ca.map(|ca| ca.write(dir.path(), "clients-ca.crt")),
        };
        let tls = TlsConfig::from_files(&files).expect("TLS configuration");
        assert_eq!(tls.requires_client_certificate(), client_ca.is_some());
        let store: Arc<dyn Store> = Arc::new(
            SqliteStore::open(dir.path().join("jobs.db"), SqliteOptions::default())
                .expect("open store"),
        );
        let app = router_with_options(store, ServerConfig::default(), RouterOptions::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let stop = CancellationToken::new();
        let served = tokio::spawn(serve_tls(listener, app, limits, tls, stop.clone()));
        Self {
            addr,
            ca,
            stop,
            served,
            _dir: dir,
        }
    }

    fn https(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.addr.port())
    }

    /// A client trusting this server's CA (and nothing else), with `identity` if given.
    fn client(&self, identity: Option<&Pair>) -> reqwest::Client {
        let mut builder = reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(
                reqwest::Certificate::from_pem(self.ca.cert_pem.as_bytes()).expect("CA"),
            )
            .timeout(Duration::from_secs(10));
        if let Some(pair) = identity {
            builder = builder
                .identity(reqwest::Identity::from_pem(&pair.identity_pem()).expect("identity"));
        }
        builder.build().expect("client")
    }

    async fn stop(self) {
        self.stop.cancel();
        self.served
            .await
            .expect("server task")
            .expect("server stops cleanly");
    }
}

/// Enqueues a job over HTTPS and reads it back.
async fn enqueue_and_get(server: &TlsServer, client: &reqwest::Client) -> Result<(), String> {
    let created: Value = client
        .post(server.https("/v1/jobs"))
        .json(&json!({"queue": "tls", "kind": "greet", "payload": {"to": "world"}}))
        .send()
        .await
        .map_err(|e| format!("enqueue: {e:?}"))?
        .error_for_status()
        .map_err(|e| format!("enqueue: {e}"))?
        .json()
        .await
        .map_err(|e| format!("enqueue answer: {e}"))?;
    let id = created["id"].as_str().ok_or("no id")?.to_string();
    let job: Value = client
        .get(server.https(&format!("/v1/jobs/{id}")))
        .send()
        .await
        .map_err(|e| format!("get: {e:?}"))?
        .error_for_status()
        .map_err(|e| format!("get: {e}"))?
        .json()
        .await
        .map_err(|e| format!("get answer: {e}"))?;
    assert_eq!(job["id"], id);
    assert_eq!(job["payload"]["to"], "world");
    assert_eq!(job["state"], "available");
    Ok(())
}

#[tokio::test]
async fn https_serves_the_api_and_plain_http_is_refused() {
    let server = TlsServer::start(None, ConnectionLimits::default()).await;
    enqueue_and_get(&server, &server.client(None))
        .await
        .expect("an HTTPS client trusting the CA is served");
    let answer = server
        .client(None)
        .get(server.https("/healthz"))
        .send()
        .await
        .expect("healthz");
    assert!(answer.status().is_success());

    // Plain HTTP to the TLS port: no HTTP answer.
    let plain = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let refused = plain
        .get(format!("http://{}/healthz", server.addr))
        .send()
        .await;
    assert!(
        refused.is_err(),
        "a plain-HTTP request must fail: {refused:?}"
    );

    // A client that does not trust the server's CA refuses it.
    let stranger = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(
            reqwest::Certificate::from_pem(Ca::new("another CA").cert_pem.as_bytes()).expect("CA"),
        )
        .build()
        .expect("client");
    let untrusted = stranger.get(server.https("/healthz")).send().await;
    assert!(untrusted.is_err(), "{untrusted:?}");

    // The server still serves after all that.
    enqueue_and_get(&server, &server.client(None))
        .await
        .expect("still serving");
    server.stop().await;
}

#[tokio::test]
async fn a_client_certificate_from_the_client_ca_is_required_when_one_is_set() {
    let clients = Ca::new("conveyor clients CA");
    let server = TlsServer::start(Some(&clients), ConnectionLimits::default()).await;

    let no_certificate = enqueue_and_get(&server, &server.client(None)).await;
    // The server's TLS alert, not an HTTP status.
    assert!(
        matches!(&no_certificate, Err(e) if e.contains("CertificateRequired")),
        "a client without a certificate must be refused: {no_certificate:?}"
    );

    let other = Ca::new("some other CA").client("intruder");
    let wrong_ca = enqueue_and_get(&server, &server.client(Some(&other))).await;
    assert!(
        matches!(&wrong_ca, Err(e) if e.contains("UnknownCA")),
        "a certificate from another CA must be refused: {wrong_ca:?}"
    );

    let worker = clients.client("worker-1");
    enqueue_and_get(&server, &server.client(Some(&worker)))
        .await
        .expect("a certificate from the client CA is accepted");
    server.stop().await;
}

#[tokio::test]
async fn a_client_that_never_completes_the_handshake_is_disconnected() {
    let limits = ConnectionLimits {
        tls_handshake_timeout: Duration::from_millis(300),
        ..ConnectionLimits::default()
    };
    let server = TlsServer::start(None, limits).await;
    let mut silent = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connect");
    // The server closes the socket at the deadline: the read ends (EOF or reset) well before
    // the test's own bound.
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut buf))
        .await
        .expect("the server must close a silent connection at the handshake deadline");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "no bytes expected: {read:?}"
    );
    server.stop().await;
}

#[test]
fn bad_files_are_refused_naming_the_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = Ca::new("conveyor test CA");
    let (cert, key) = ca.server().write(dir.path(), "server");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "-----BEGIN CERTIFICATE-----\nnot base64!\n").expect("write");
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").expect("write");
    let missing = dir.path().join("missing.pem");
    let other_key = ca.server().write(dir.path(), "other").1;

    let files = |cert: &std::path::Path,
                 key: &std::path::Path,
                 client_ca: Option<&std::path::Path>| TlsFiles {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        client_ca: client_ca.map(std::path::Path::to_path_buf),
    };
    let refused = |files: TlsFiles| -> String {
        let error: TlsError = TlsConfig::from_files(&files).expect_err("must be refused");
        error.to_string()
    };

    let message = refused(files(&missing, &key, None));
    assert!(
        message.contains("cannot read certificate file") && message.contains("missing.pem"),
        "{message}"
    );
    let message = refused(files(&cert, &missing, None));
    assert!(
        message.contains("cannot read key file") && message.contains("missing.pem"),
        "{message}"
    );
    let message = refused(files(&garbage, &key, None));
    assert!(
        message.contains("garbage.pem") && message.contains("not valid PEM"),
        "{message}"
    );
    let message = refused(files(&empty, &key, None));
    assert!(
        message.contains("empty.pem") && message.contains("no certificate"),
        "{message}"
    );
    let message = refused(files(&cert, &cert, None));
    assert!(
        message.contains("server.crt") && message.contains("no private key"),
        "{message}"
    );
    let message = refused(files(&cert, &other_key, None));
    assert!(
        message.contains("do not make a TLS configuration"),
        "{message}"
    );
    let message = refused(files(&cert, &key, Some(&empty)));
    assert!(
        message.contains("client CA file") && message.contains("empty.pem"),
        "{message}"
    );
    TlsConfig::from_files(&files(&cert, &key, Some(&ca.write(dir.path(), "ca.crt"))))
        .expect("good files are accepted");
}
