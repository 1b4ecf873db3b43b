//! A small JSON client for the server's API, used by the client commands and `conveyor work`.

use anyhow::{anyhow, Context};
use conveyor_server::api::ErrorResponse;
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

use super::ClientTlsArgs;

#[derive(Clone)]
pub(crate) struct ApiClient {
    base: String,
    http: reqwest::Client,
    /// Sent as `Authorization: Bearer` on every request when set.
    token: Option<String>,
}

/// A non-2xx answer: its status and the server's JSON error.
#[derive(Debug)]
pub(crate) struct ApiFailure {
    pub status: StatusCode,
    pub body: Value,
}

impl std::fmt::Display for ApiFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let error = ErrorResponse::deserialize(&self.body)
            .ok()
            .map(|body| body.error);
        let code = error.as_ref().map_or("error", |e| e.code.as_str());
        let message = error
            .as_ref()
            .map_or("request failed", |e| e.message.as_str());
        let message = if self.status == StatusCode::UNAUTHORIZED {
            format!("{message} (give an API token with --token or CONVEYOR_TOKEN)")
        } else {
            message.to_string()
        };
        match error.as_ref().and_then(|e| e.field.as_deref()) {
            Some(field) => write!(
                f,
                "{} ({code}): {message} [field: {field}]",
                self.status.as_u16()
            ),
            None => write!(f, "{} ({code}): {message}", self.status.as_u16()),
        }
    }
}

impl std::error::Error for ApiFailure {}

impl ApiClient {
    pub fn new(base: &str, token: Option<&str>, tls: &ClientTlsArgs) -> anyhow::Result<Self> {
        check_base(base)?;
        let builder = reqwest::Client::builder().connect_timeout(Duration::from_secs(5));
        let http = with_tls(builder, tls)?
            .build()
            .context("building HTTP client")?;
        Ok(Self {
            base: base.trim_end_matches('/').to_string(),
            http,
            token: token.map(str::to_string).filter(|t| !t.is_empty()),
        })
    }

    /// Sends a request; Ok((status, body)) for 2xx, Err(ApiFailure) for other statuses.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(StatusCode, Value)> {
        let url = format!("{}{path}", self.base);
        let mut request = self
            .http
            .request(method, &url)
            .timeout(Duration::from_secs(60));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|e| {
            if e.is_connect() {
                anyhow!(
                    "cannot reach the Conveyor server at {}: is `conveyor serve` running? ({e})",
                    self.base
                )
            } else {
                anyhow!("request to {url} failed: {e}")
            }
        })?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .with_context(|| format!("reading answer from {url}"))?;
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        if status.is_success() {
            Ok((status, body))
        } else {
            Err(ApiFailure { status, body }.into())
        }
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        Ok(self.call(Method::GET, path, None).await?.1)
    }

    pub async fn post(&self, path: &str, body: &Value) -> anyhow::Result<(StatusCode, Value)> {
        self.call(Method::POST, path, Some(body)).await
    }
}

/// The client with the extra CAs to trust and the certificate to present.
pub(crate) fn with_tls(
    mut builder: reqwest::ClientBuilder,
    tls: &ClientTlsArgs,
) -> anyhow::Result<reqwest::ClientBuilder> {
    if let Some(path) = &tls.ca_cert {
        for certificate in read_ca_file(path, "--ca-cert")? {
            builder = builder.add_root_certificate(certificate);
        }
    }
    if let (Some(cert), Some(key)) = (&tls.client_cert, &tls.client_key) {
        let mut pem = read_file(key, "--client-key")?;
        pem.push(b'\n');
        pem.extend(read_file(cert, "--client-cert")?);
        let identity = reqwest::Identity::from_pem(&pem).with_context(|| {
            format!(
                "--client-cert {} and --client-key {} are not a PEM certificate and its private key",
                cert.display(),
                key.display()
            )
        })?;
        builder = builder.identity(identity);
    }
    Ok(builder)
}

fn read_file(path: &Path, flag: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {flag} {}", path.display()))
}

/// The certificates of a PEM file of CAs (at least one).
pub(crate) fn read_ca_file(path: &Path, flag: &str) -> anyhow::Result<Vec<reqwest::Certificate>> {
    parse_ca_pem(&read_file(path, flag)?, path, flag)
}

/// The certificates of PEM read from `path` (at least one).
pub(crate) fn parse_ca_pem(
    pem: &[u8],
    path: &Path,
    flag: &str,
) -> anyhow::Result<Vec<reqwest::Certificate>> {
    let certificates = reqwest::Certificate::from_pem_bundle(pem)
        .with_context(|| format!("{flag} {}: not valid PEM certificates", path.display()))?;
    if certificates.is_empty() {
        anyhow::bail!(
            "{flag} {}: no certificate (-----BEGIN CERTIFICATE-----) in it",
            path.display()
        );
    }
    Ok(certificates)
}

/// Reads a server answer as its type in `conveyor_server::api` (or core), the definitions the
/// server itself writes from. `--json` output prints the answer as received instead, so fields
/// a newer server adds are not lost.
pub(crate) fn decode<T: DeserializeOwned>(answer: &Value, what: &str) -> anyhow::Result<T> {
    T::deserialize(answer).with_context(|| {
        format!("the server's answer to {what} is not what this conveyor expects (a different version?)")
    })
}

/// A timestamp as the API writes it (RFC 3339, UTC, milliseconds).
pub(crate) fn stamp(at: &chrono::DateTime<chrono::Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// A server URL must say its scheme: `127.0.0.1:7700` would otherwise fail later with a
/// confusing "builder error" or "relative URL" message.
fn check_base(base: &str) -> anyhow::Result<()> {
    let trimmed = base.trim();
    if trimmed.starts_with("http://") || trimmed.starts_with("https://") {
        return Ok(());
    }
    if trimmed.contains("://") {
        anyhow::bail!("--server {base:?}: only http:// and https:// servers are supported");
    }
    anyhow::bail!(
        "--server {base:?} has no scheme; did you mean --server http://{trimmed} \
         (or https://{trimmed} for a server started with --tls-cert)?"
    )
}

#[cfg(test)]
mod base_tests {
    use super::check_base;

    #[test]
    fn a_server_without_a_scheme_gets_a_hint() {
        assert!(check_base("http://127.0.0.1:7700").is_ok());
        assert!(check_base("https://conveyor.internal").is_ok());
        let error = check_base("127.0.0.1:7700")
            .expect_err("no scheme")
            .to_string();
        assert!(
            error.contains("did you mean --server http://127.0.0.1:7700"),
            "{error}"
        );
        let error = check_base("ftp://x").expect_err("not http").to_string();
        assert!(error.contains("only http:// and https://"), "{error}");
    }
}
