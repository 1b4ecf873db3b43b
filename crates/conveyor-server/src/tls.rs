//! TLS for [`crate::serve_tls`]: the server's certificate chain and key from PEM files, and
//! optionally a CA whose certificates clients must present (mutual TLS).
//!
//! rustls on the `ring` provider; TLS 1.2 and 1.3; ALPN offers HTTP/2 and HTTP/1.1.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::{self, PemObject};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why the TLS configuration could not be built; each names the file concerned.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {}: {source}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} {} is not valid PEM: {message}", path.display())]
    Pem {
        what: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("{what} {} holds no {expected}", path.display())]
    Missing {
        what: &'static str,
        path: PathBuf,
        expected: &'static str,
    },
    #[error("client CA file {}: {message}", path.display())]
    ClientCa { path: PathBuf, message: String },
    #[error("the certificate {} and key {} do not make a TLS configuration: {source}", cert.display(), key.display())]
    Config {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
}

/// The files of a TLS server.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The server's certificate chain (PEM, leaf first).
    pub cert: PathBuf,
    /// The server's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by one of this file's CAs (PEM).
    pub client_ca: Option<PathBuf>,
}

/// A server TLS configuration ready for [`crate::serve_tls`].
#[derive(Clone)]
pub struct TlsConfig {
    pub(crate) inner: Arc<rustls::ServerConfig>,
    client_auth: bool,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("client_auth", &self.client_auth)
            .finish_non_exhaustive()
    }
}

impl TlsConfig {
    /// Reads and checks the files: the key must match the certificate, the client CA file
    /// must hold at least one usable CA certificate.
    pub fn from_files(files: &TlsFiles) -> Result<Self, TlsError> {
        let certs = read_certificates(&files.cert, "certificate file")?;
        let key = read_key(&files.key)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config_error = |source| TlsError::Config {
            cert: files.cert.clone(),
            key: files.key.clone(),
            source,
        };
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(config_error)?;
        let builder = match &files.client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let mut roots = rustls::RootCertStore::empty();
                for ca in read_certificates(path, "client CA file")? {
                    roots.add(ca).map_err(|e| TlsError::ClientCa {
                        path: path.clone(),
                        message: format!("not a usable CA certificate: {e}"),
                    })?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .map_err(|e| TlsError::ClientCa {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_single_cert(certs, key).map_err(config_error)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Self {
            inner: Arc::new(config),
            client_auth: files.client_ca.is_some(),
        })
    }

    /// Whether clients must present a certificate.
    pub fn requires_client_certificate(&self) -> bool {
        self.client_auth
    }
}

fn read_file(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

fn pem_error(path: &Path, what: &'static str, error: pem::Error) -> TlsError {
    TlsError::Pem {
        what,
        path: path.to_path_buf(),
        message: error.to_string(),
    }
}

/// Every certificate in a PEM file (at least one).
pub(crate) fn read_certificates(
    path: &Path,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read_file(path, what)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, what, e))?;
    if certs.is_empty() {
        return Err(TlsError::Missing {
            what,
            path: path.to_path_buf(),
            expected: "certificate (-----BEGIN CERTIFICATE-----)",
        });
    }
    Ok(certs)
}

/// The first private key in a PEM file.
fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let what = "key file";
    let bytes = read_file(path, what)?;
    match PrivateKeyDer::from_pem_slice(&bytes) {
        Ok(key) => Ok(key),
        Err(pem::Error::NoItemsFound) => Err(TlsError::Missing {
            what,
            path: path.to_path_buf(),
            expected: "private key (-----BEGIN PRIVATE KEY-----, RSA or EC PRIVATE KEY)",
        }),
        Err(error) => Err(pem_error(path, what, error)),
    }
}
