//! Certificates made by the TLS tests (rcgen): a CA, server certificates for the loopback
//! address, client certificates. Shared with the `conveyor` crate's TLS tests (by `#[path]`).
#![allow(dead_code)]

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// A certificate authority that signs server and client certificates.
pub struct Ca {
    /// The CA's own certificate (PEM), what a peer trusts.
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its private key, both PEM.
pub struct Pair {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Pair {
    /// Key and certificate in one PEM (what `reqwest::Identity::from_pem` reads).
    pub fn identity_pem(&self) -> Vec<u8> {
        format!("{}{}", self.key_pem, self.cert_pem).into_bytes()
    }

    /// Writes `NAME.crt` and `NAME.key` into `dir`; their paths.
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&cert, &self.cert_pem).expect("write certificate");
        std::fs::write(&key, &self.key_pem).expect("write key");
        (cert, key)
    }
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("self-sign the CA");
        Self {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// Writes the CA certificate to `dir/NAME`; its path.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, &self.cert_pem).expect("write CA certificate");
        path
    }

    /// A server certificate for 127.0.0.1 and localhost.
    pub fn server(&self) -> Pair {
        self.leaf(
            vec!["127.0.0.1".to_string(), "localhost".to_string()],
            "conveyor test server",
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A client certificate named `name`.
    pub fn client(&self, name: &str) -> Pair {
        self.leaf(Vec::new(), name, ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn leaf(&self, names: Vec<String>, common_name: &str, usage: ExtendedKeyUsagePurpose) -> Pair {
        let mut params = CertificateParams::new(names).expect("leaf params");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign the leaf");
        Pair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}
