//! Signed inbound webhooks: a provider (GitHub, Stripe, anyone speaking Standard Webhooks, or a
//! plain HMAC of the body) POSTs to `/hooks/{name}`; the request is verified against the hook's
//! secret, in constant time, before anything is stored, and becomes a job keyed by the
//! provider's event id, so a delivery retried by the provider never becomes a second job.
//! A hook may emit an event instead (`event` in place of `job`), its id
//! `hook:{name}:{provider's event id}`, made into the subscriptions' jobs and flows.
//! This is the pure part: the configuration, its checks, and the verification. The server
//! does the rest (`conveyor-server`'s hooks.rs).

use base64::Engine as _;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

use crate::error::ValidationError;
use crate::fields;
use crate::sources::{check_target, EventMapping, JobMapping, MappedEvent, MappedJob, Message};
use crate::wire;

type HmacSha256 = Hmac<Sha256>;

/// How long a signed timestamp stays acceptable by default (s): Stripe's and Standard
/// Webhooks' own default.
pub const DEFAULT_TOLERANCE_SECS: u64 = 300;

/// How a provider signs its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Scheme {
    /// `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`; the event id is
    /// `X-GitHub-Delivery`. GitHub signs no time: a replay is caught by its delivery id.
    #[serde(rename = "github")]
    Github,
    /// `Stripe-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "t.body">` (several `v1`
    /// while a secret rolls); the event id is the body's `/id`.
    #[serde(rename = "stripe")]
    Stripe,
    /// Standard Webhooks: `webhook-id`, `webhook-timestamp` and `webhook-signature: v1,<base64
    /// HMAC-SHA256 of "id.timestamp.body">` (space-separated, several allowed), with the secret
    /// `whsec_<base64 key>`; the event id is `webhook-id`.
    #[serde(rename = "standard-webhooks")]
    StandardWebhooks,
    /// `X-Signature-256: sha256=<hex HMAC-SHA256 of the body>`; the event id as configured
    /// (`event_id`), else a hash of the body.
    #[serde(rename = "hmac-sha256")]
    HmacSha256,
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Github => "github",
            Scheme::Stripe => "stripe",
            Scheme::StandardWebhooks => "standard-webhooks",
            Scheme::HmacSha256 => "hmac-sha256",
        }
    }

    /// Where the provider puts its event id, when the configuration does not say.
    fn default_event_id(self) -> Option<&'static str> {
        match self {
            Scheme::Github => Some("header:x-github-delivery"),
            Scheme::Stripe => Some("body:/id"),
            Scheme::StandardWebhooks => Some("header:webhook-id"),
            Scheme::HmacSha256 => None,
        }
    }
}

/// One webhook, as configured (`PUT /v1/hooks/{name}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookSpec {
    /// Its name (the path names it).
    #[serde(default, skip_serializing)]
    pub name: String,
    pub scheme: Scheme,
    /// The shared secret; or `secret_env`, the environment variable holding it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_env: Option<String>,
    /// How a request becomes a job (`from` reads `header:NAME`, in any case, or `body:/pointer`);
    /// or `event`.
    #[serde(
        default,
        deserialize_with = "wire::non_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub job: Option<JobMapping>,
    /// How a request becomes an event, fanned out to its subscriptions; or `job`.
    #[serde(
        default,
        deserialize_with = "wire::non_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub event: Option<EventMapping>,
    /// Where the provider's event id is: `header:NAME` or `body:/pointer` (default: the
    /// scheme's own place).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    /// How far a signed timestamp may be from now (s), in either direction.
    #[serde(default = "default_tolerance")]
    pub tolerance_secs: u64,
}

fn default_tolerance() -> u64 {
    DEFAULT_TOLERANCE_SECS
}

/// Why a request was refused: `Unsigned` for a signature that is missing, malformed or wrong
/// (401); `Stale` for a signed time outside the tolerance (401: a replay or a wrong clock).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the signature is missing or does not match: {0}")]
    Unsigned(&'static str),
    #[error("the signed timestamp is {0} s from now, beyond the tolerance")]
    Stale(i64),
}

impl HookSpec {
    /// Reads and checks a hook named `name` from a request's JSON body; errors name the field.
    pub fn from_json(name: &str, body: serde_json::Value) -> Result<Self, ValidationError> {
        let mut spec: HookSpec = crate::wire::read_body(body, "scheme")?;
        spec.name = name.to_string();
        spec.validate()?;
        Ok(spec)
    }

    pub fn validate(&self) -> Result<(), ValidationError> {
        fields::name("name", &self.name)?;
        match (&self.secret, &self.secret_env) {
            (Some(_), Some(_)) => {
                return Err(ValidationError::new(
                    "secret",
                    "give secret or secret_env, not both",
                ))
            }
            (None, None) => return Err(ValidationError::new("secret", "is required")),
            (Some(secret), None) => {
                if secret.is_empty() {
                    return Err(ValidationError::new("secret", "must not be empty"));
                }
                fields::text_without_nul("secret", secret)?;
                if self.scheme == Scheme::StandardWebhooks {
                    standard_key(secret).map_err(|m| ValidationError::new("secret", m))?;
                }
            }
            (None, Some(name)) => {
                if name.is_empty() {
                    return Err(ValidationError::new("secret_env", "must not be empty"));
                }
                fields::text_without_nul("secret_env", name)?;
            }
        }
        if let Some(place) = &self.event_id {
            let known = place.strip_prefix("header:").is_some_and(|h| !h.is_empty())
                || place
                    .strip_prefix("body:")
                    .is_some_and(|p| p.starts_with('/'));
            if !known {
                return Err(ValidationError::new(
                    "event_id",
                    "must be \"header:NAME\" or \"body:/json/pointer\"",
                ));
            }
            fields::text_without_nul("event_id", place)?;
        }
        if self.tolerance_secs == 0 || self.tolerance_secs > 86_400 {
            return Err(ValidationError::new("tolerance_secs", "must be 1 to 86400"));
        }
        check_target(self.job.as_ref(), self.event.as_ref())
    }

    /// The secret: given, or read from the environment variable named.
    pub fn resolve_secret(&self) -> Result<String, String> {
        match (&self.secret, &self.secret_env) {
            (Some(secret), _) => Ok(secret.clone()),
            (None, Some(name)) => std::env::var(name)
                .map_err(|_| format!("the environment variable {name} is not set")),
            (None, None) => Err("no secret".into()),
        }
    }

    /// Verifies a request: its headers (names lowercase), its raw body, against `secret`, at
    /// `now`. Compares in constant time.
    pub fn verify(
        &self,
        secret: &str,
        headers: &BTreeMap<String, String>,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<(), Refusal> {
        let header = |name: &str| headers.get(name).map(String::as_str);
        match self.scheme {
            Scheme::Github | Scheme::HmacSha256 => {
                let name = if self.scheme == Scheme::Github {
                    "x-hub-signature-256"
                } else {
                    "x-signature-256"
                };
                let given = header(name)
                    .and_then(|v| v.trim().strip_prefix("sha256="))
                    .ok_or(Refusal::Unsigned("no sha256= signature header"))?;
                let given = decode_hex(given).ok_or(Refusal::Unsigned("not hex"))?;
                check(secret.as_bytes(), &[body], &given)
            }
            Scheme::Stripe => {
                let value = header("stripe-signature")
                    .ok_or(Refusal::Unsigned("no Stripe-Signature header"))?;
                let mut at = None;
                let mut signatures = Vec::new();
                for part in value.split(',') {
                    match part.trim().split_once('=') {
                        Some(("t", t)) => at = t.parse::<i64>().ok(),
                        Some(("v1", sig)) => signatures.extend(decode_hex(sig)),
                        _ => {}
                    }
                }
                let at = at.ok_or(Refusal::Unsigned("no t= timestamp"))?;
                fresh(at, now, self.tolerance_secs)?;
                let stamp = at.to_string();
                any_matches(
                    secret.as_bytes(),
                    &[stamp.as_bytes(), b".", body],
                    &signatures,
                )
            }
            Scheme::StandardWebhooks => {
                let id = header("webhook-id").ok_or(Refusal::Unsigned("no webhook-id"))?;
                let stamp =
                    header("webhook-timestamp").ok_or(Refusal::Unsigned("no webhook-timestamp"))?;
                let at = stamp
                    .trim()
                    .parse::<i64>()
                    .map_err(|_| Refusal::Unsigned("webhook-timestamp is not a number"))?;
                fresh(at, now, self.tolerance_secs)?;
                let key = standard_key(secret).map_err(|_| Refusal::Unsigned("bad secret"))?;
                let signatures: Vec<Vec<u8>> = header("webhook-signature")
                    .ok_or(Refusal::Unsigned("no webhook-signature"))?
                    .split_whitespace()
                    .filter_map(|sig| sig.strip_prefix("v1,"))
                    .filter_map(|sig| base64::engine::general_purpose::STANDARD.decode(sig).ok())
                    .collect();
                any_matches(
                    &key,
                    &[id.as_bytes(), b".", stamp.trim().as_bytes(), b".", body],
                    &signatures,
                )
            }
        }
    }

    /// The provider's event id of a verified request: where the configuration (or the scheme)
    /// says, else a SHA-256 of the body.
    pub fn event_id(&self, headers: &BTreeMap<String, String>, body: &[u8]) -> String {
        let place = self.event_id.as_deref().or(self.scheme.default_event_id());
        let found = place.and_then(|place| {
            if let Some(name) = place.strip_prefix("header:") {
                headers.get(&name.to_ascii_lowercase()).cloned()
            } else {
                let pointer = place.strip_prefix("body:")?;
                let value: serde_json::Value = serde_json::from_slice(body).ok()?;
                match value.pointer(pointer)? {
                    serde_json::Value::String(text) => Some(text.clone()),
                    other => Some(other.to_string()),
                }
            }
        });
        found
            .filter(|id| !id.is_empty())
            .unwrap_or_else(|| hex(&Sha256::digest(body)))
    }

    /// The job a verified request becomes, keyed `hook:{name}:{event id}`.
    pub fn job_for(
        &self,
        headers: &BTreeMap<String, String>,
        body: &[u8],
    ) -> Result<MappedJob, ValidationError> {
        let (message, key) = self.message(headers, body);
        self.job
            .as_ref()
            .ok_or_else(|| ValidationError::new("job", "this hook emits events"))?
            .job_for(&message, key)
    }

    /// The event a verified request becomes, its id `hook:{name}:{event id}` (the key a job of
    /// it would carry).
    pub fn event_for(
        &self,
        headers: &BTreeMap<String, String>,
        body: &[u8],
    ) -> Result<MappedEvent, ValidationError> {
        let (message, id) = self.message(headers, body);
        self.event
            .as_ref()
            .ok_or_else(|| ValidationError::new("event", "this hook makes jobs"))?
            .event_for(&message, id)
    }

    /// A verified request as a message, and what it becomes is keyed by.
    fn message(&self, headers: &BTreeMap<String, String>, body: &[u8]) -> (Message, String) {
        let event_id = self.event_id(headers, body);
        let key = format!("hook:{}:{event_id}", self.name);
        let message = Message {
            identity: event_id,
            sent_at: None,
            headers: headers.clone(),
            subject: Some(self.name.clone()),
            body: body.to_vec(),
        };
        (message, key)
    }
}

/// A Standard Webhooks secret's key: the base64 after `whsec_`.
fn standard_key(secret: &str) -> Result<Vec<u8>, &'static str> {
    let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
    base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| "must be whsec_ followed by base64")
        .and_then(|key| {
            if key.is_empty() {
                Err("must not be empty")
            } else {
                Ok(key)
            }
        })
}

fn fresh(at: i64, now: DateTime<Utc>, tolerance_secs: u64) -> Result<(), Refusal> {
    let off = now.timestamp().saturating_sub(at);
    if off.unsigned_abs() > tolerance_secs {
        return Err(Refusal::Stale(off));
    }
    Ok(())
}

fn mac(key: &[u8], parts: &[&[u8]]) -> Result<HmacSha256, Refusal> {
    let mut mac = HmacSha256::new_from_slice(key).map_err(|_| Refusal::Unsigned("bad key"))?;
    for part in parts {
        mac.update(part);
    }
    Ok(mac)
}

/// Whether `given` is the HMAC of `parts`, compared in constant time.
fn check(key: &[u8], parts: &[&[u8]], given: &[u8]) -> Result<(), Refusal> {
    mac(key, parts)?
        .verify_slice(given)
        .map_err(|_| Refusal::Unsigned("the signature does not match"))
}

/// Whether any of `signatures` matches (each compared in constant time).
fn any_matches(key: &[u8], parts: &[&[u8]], signatures: &[Vec<u8>]) -> Result<(), Refusal> {
    if signatures.is_empty() {
        return Err(Refusal::Unsigned("no v1 signature"));
    }
    let mut matched = false;
    for signature in signatures {
        matched |= check(key, parts, signature).is_ok();
    }
    if matched {
        Ok(())
    } else {
        Err(Refusal::Unsigned("the signature does not match"))
    }
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    let text = text.trim();
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests;
