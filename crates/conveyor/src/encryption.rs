//! Encryption at rest: [`EncryptedStore`] wraps any [`Store`] and seals every user-supplied
//! value with an AEAD (XChaCha20-Poly1305, random 192-bit nonces, the key id as associated
//! data) before it reaches the store, and opens it again on the way out:
//!
//! - JSON values (job payloads, results, schedule job templates' payloads, flow step and
//!   compensation payloads, signal payloads) are stored as a JSON envelope, valid wherever the
//!   column holds JSON: `{"$conveyor_enc": 1, "key": "k2", "nonce": "<base64>", "data":
//!   "<base64>"}`;
//! - texts (error messages and backtraces) as `$conveyor_enc:1:<key id>:<nonce>:<data>`.
//!
//! The stores move sealed values about without reading them: a completed step's result (or a
//! signal's payload) becomes its step's result and its children's `parents`, a failed job's
//! last error its step's error, a schedule's template the payload of every job it fires; each
//! is opened wherever it is read (jobs, fetches, flow views, schedule views).
//!
//! Left plain, because the stores must read them or they are the server's own words: kinds,
//! queues, tags, tenants, idempotency keys, names of flows, steps, signals and schedules,
//! error classes, progress messages (the store bounds them to 1,024 characters, too short for
//! a sealed message), messages the store writes itself (an expired lease, a timed-out wait, a
//! cancellation), kind schemas, queue settings and the audit log (which holds no payloads).
//!
//! Keys come from configuration (`CONVEYOR_ENCRYPTION_KEYS`): `id:base64key` entries separated
//! by commas, newest first. New values are sealed with the first key; any listed key opens
//! the values sealed with it, so rotating is: put a new key first, keep the old ones until
//! no value sealed with them remains (finished jobs and flows are pruned by retention;
//! schedules are sealed again with the new key when put again). Values stored before
//! encryption was turned on are returned as they are.
//!
//! Wrapping, rather than encrypting inside each store, keeps the stores and their conformance
//! suite unaware of it. Things that need care: unique jobs (the store derives their key from
//! the payload, which it can no longer read) get the key computed here from the plaintext and
//! carried in the envelope as `$unique`; the checks a store makes of plaintext (no NUL in a
//! result or a signal, NUL escaped in a message, a backtrace's length) are made here before
//! sealing, a backtrace cut so that its sealed form fits; and a value that cannot be opened (a
//! key removed too early, tampering) is handed over as `{"$conveyor_decrypt_error": "..."}`
//! (a text as `[$conveyor_decrypt_error: ...]`) rather than failing whole listings or fetches,
//! so the job stays visible and its handler fails it.

use async_trait::async_trait;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use chrono::{DateTime, Utc};
use conveyor_core::workflow::{FlowView, ValidFlow};
use conveyor_core::*;
use rand::RngCore;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::Notify;
use uuid::Uuid;

/// The environment variable `open_store` reads keys from when none are given.
pub const KEYS_ENV: &str = "CONVEYOR_ENCRYPTION_KEYS";
const ENVELOPE: &str = "$conveyor_enc";
const UNIQUE_FIELD: &str = "$unique";
const DECRYPT_ERROR: &str = "$conveyor_decrypt_error";
/// How a sealed text starts (error messages and backtraces are texts in the stores).
const TEXT_ENVELOPE: &str = "$conveyor_enc:1:";

#[derive(Debug, thiserror::Error)]
pub enum EncryptionError {
    #[error("encryption keys ({KEYS_ENV} or OpenOptions::payload_keys): {0}")]
    BadKeys(String),
    #[error("cannot seal a payload: {0}")]
    Seal(String),
}

/// The keys payloads are sealed and opened with; the first seals.
pub struct PayloadKeys {
    keys: Vec<(String, XChaCha20Poly1305)>,
}

impl std::fmt::Debug for PayloadKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key material.
        let ids: Vec<&str> = self.keys.iter().map(|(id, _)| id.as_str()).collect();
        f.debug_struct("PayloadKeys").field("ids", &ids).finish()
    }
}

impl PayloadKeys {
    /// Parses `id:base64key[,id:base64key...]`, newest first; each key is 32 random bytes
    /// (`openssl rand -base64 32`). Ids are short names (`[A-Za-z0-9_.-]`, unique).
    pub fn parse(spec: &str) -> Result<Self, EncryptionError> {
        let mut keys: Vec<(String, XChaCha20Poly1305)> = Vec::new();
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (id, encoded) = entry.split_once(':').ok_or_else(|| {
                EncryptionError::BadKeys(format!("entry {:?} is not id:base64key", id_hint(entry)))
            })?;
            if id.is_empty()
                || !id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
            {
                return Err(EncryptionError::BadKeys(format!(
                    "key id {id:?} must be letters, digits, '_', '-' or '.'"
                )));
            }
            if keys.iter().any(|(known, _)| known == id) {
                return Err(EncryptionError::BadKeys(format!(
                    "key id {id:?} is listed twice"
                )));
            }
            let bytes = BASE64
                .decode(encoded.trim())
                .map_err(|_| EncryptionError::BadKeys(format!("key {id:?} is not valid base64")))?;
            let cipher = XChaCha20Poly1305::new_from_slice(&bytes).map_err(|_| {
                EncryptionError::BadKeys(format!(
                    "key {id:?} must be 32 bytes (it is {})",
                    bytes.len()
                ))
            })?;
            keys.push((id.to_string(), cipher));
        }
        if keys.is_empty() {
            return Err(EncryptionError::BadKeys("no keys given".to_string()));
        }
        Ok(Self { keys })
    }

    /// The id of the key new payloads are sealed with.
    pub fn current_id(&self) -> &str {
        self.keys.first().map_or("", |(id, _)| id.as_str())
    }

    /// Seals `payload` with the current key. The job's id is not known before insert, so the
    /// associated data binds the envelope to the key id only.
    pub fn seal(&self, payload: &Value) -> Result<Value, EncryptionError> {
        let plaintext =
            serde_json::to_vec(payload).map_err(|e| EncryptionError::Seal(e.to_string()))?;
        let (id, nonce, data) = self.seal_bytes(&plaintext)?;
        Ok(json!({
            ENVELOPE: 1,
            "key": id,
            "nonce": nonce,
            "data": data,
        }))
    }

    /// Opens an envelope; anything else (payloads stored before encryption was on) is returned
    /// as it is.
    pub fn open(&self, stored: Value) -> Result<Value, String> {
        let Some(envelope) = stored.as_object().filter(|o| o.contains_key(ENVELOPE)) else {
            return Ok(stored);
        };
        let field = |name: &str| {
            envelope
                .get(name)
                .and_then(Value::as_str)
                .ok_or_else(|| format!("encrypted payload has no {name}"))
        };
        let plaintext = self.open_bytes(field("key")?, field("nonce")?, field("data")?)?;
        serde_json::from_slice(&plaintext).map_err(|e| format!("decrypted payload: {e}"))
    }

    /// Whether `stored` needs no new sealing after a rotation: an envelope sealed with the
    /// current key, or nothing sealed at all (`null`).
    fn sealed_with_current(&self, stored: &Value) -> bool {
        stored.is_null()
            || stored
                .as_object()
                .filter(|o| o.contains_key(ENVELOPE))
                .and_then(|o| o.get("key"))
                .and_then(Value::as_str)
                == Some(self.current_id())
    }

    /// Seals a text (an error message, a backtrace) with the current key, as a text:
    /// `$conveyor_enc:1:<key id>:<base64 nonce>:<base64 data>`.
    pub fn seal_text(&self, text: &str) -> Result<String, EncryptionError> {
        let (id, nonce, data) = self.seal_bytes(text.as_bytes())?;
        Ok(format!("{TEXT_ENVELOPE}{id}:{nonce}:{data}"))
    }

    /// Opens a text sealed by [`PayloadKeys::seal_text`]; any other text (the store's own
    /// messages, texts stored before encryption was on) is returned as it is.
    pub fn open_text(&self, stored: String) -> Result<String, String> {
        let Some(sealed) = stored.strip_prefix(TEXT_ENVELOPE) else {
            return Ok(stored);
        };
        let mut parts = sealed.splitn(3, ':');
        let (Some(id), Some(nonce), Some(data)) = (parts.next(), parts.next(), parts.next()) else {
            return Err("encrypted text is not key:nonce:data".to_string());
        };
        let plaintext = self.open_bytes(id, nonce, data)?;
        String::from_utf8(plaintext).map_err(|_| "decrypted text is not UTF-8".to_string())
    }

    /// The longest text whose sealed form [`PayloadKeys::seal_text`] is at most `limit` bytes.
    fn text_capacity(&self, limit: usize) -> usize {
        // Prefix, key id and ':', 24-byte nonce in base64 (32) and ':', then the ciphertext
        // (plaintext and a 16-byte tag) in padded base64.
        let overhead = TEXT_ENVELOPE.len() + self.current_id().len() + 1 + 32 + 1;
        (limit.saturating_sub(overhead) / 4 * 3).saturating_sub(16)
    }

    /// Encrypts with the current key: (key id, base64 nonce, base64 ciphertext).
    fn seal_bytes(&self, plaintext: &[u8]) -> Result<(&str, String, String), EncryptionError> {
        let (id, cipher) = self
            .keys
            .first()
            .ok_or_else(|| EncryptionError::Seal("no key".to_string()))?;
        let mut nonce = [0u8; 24];
        rand::rng().fill_bytes(&mut nonce);
        let sealed = cipher
            .encrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: plaintext,
                    aad: id.as_bytes(),
                },
            )
            .map_err(|_| EncryptionError::Seal("encryption failed".to_string()))?;
        Ok((id.as_str(), BASE64.encode(nonce), BASE64.encode(sealed)))
    }

    fn open_bytes(&self, id: &str, nonce: &str, data: &str) -> Result<Vec<u8>, String> {
        let (_, cipher) = self
            .keys
            .iter()
            .find(|(known, _)| known == id)
            .ok_or_else(|| format!("sealed with key {id:?}, which is not configured"))?;
        let nonce: [u8; 24] = BASE64
            .decode(nonce)
            .ok()
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or_else(|| "encrypted value has a bad nonce".to_string())?;
        let data = BASE64
            .decode(data)
            .map_err(|_| "encrypted value has bad data".to_string())?;
        cipher
            .decrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: &data,
                    aad: id.as_bytes(),
                },
            )
            .map_err(|_| format!("does not open with key {id:?} (corrupt or tampered)"))
    }
}

/// The first characters of a key entry, for error messages that must not print keys.
fn id_hint(entry: &str) -> String {
    entry.chars().take(8).collect::<String>() + "…"
}

/// A [`Store`] that keeps every user-supplied value encrypted in `inner`.
pub struct EncryptedStore {
    inner: Arc<dyn Store>,
    keys: Arc<PayloadKeys>,
}

impl EncryptedStore {
    pub fn new(inner: Arc<dyn Store>, keys: Arc<PayloadKeys>) -> Self {
        Self { inner, keys }
    }

    fn seal_error(&self, error: EncryptionError) -> StoreError {
        StoreError::backend(error.to_string())
    }

    /// Seals a JSON value (a result, a signal's payload, a template's payload) after the
    /// check the store would make of the plaintext (no NUL, errors naming `field`); `null`
    /// holds nothing and stays `null`.
    fn seal_value(&self, field: &str, value: &Value) -> StoreResult<Value> {
        conveyor_core::validate::json_without_nul(field, value)?;
        if value.is_null() {
            return Ok(Value::Null);
        }
        self.keys.seal(value).map_err(|e| self.seal_error(e))
    }

    /// Opens a JSON value; one that cannot be opened reads as `{"$conveyor_decrypt_error"}`.
    fn open_value(&self, stored: Value, what: &str, owner: Uuid) -> Value {
        match self.keys.open(stored) {
            Ok(value) => value,
            Err(error) => {
                tracing::error!(%owner, %error, "cannot decrypt a {what}");
                json!({ DECRYPT_ERROR: error })
            }
        }
    }

    /// Opens a text; one that cannot be opened reads as a note saying why.
    fn open_text(&self, stored: String, what: &str, owner: Uuid) -> String {
        match self.keys.open_text(stored) {
            Ok(text) => text,
            Err(error) => {
                tracing::error!(%owner, %error, "cannot decrypt a {what}");
                format!("[{DECRYPT_ERROR}: cannot decrypt: {error}]")
            }
        }
    }

    fn open_job(&self, mut job: Job) -> Job {
        let id = job.id;
        let stored = std::mem::take(&mut job.payload);
        job.payload = self.open_value(stored, "job's payload", id);
        job.result = job
            .result
            .take()
            .map(|result| self.open_value(result, "job's result", id));
        for error in &mut job.errors {
            error.message = self.open_text(std::mem::take(&mut error.message), "job's error", id);
            error.backtrace = error
                .backtrace
                .take()
                .map(|trace| self.open_text(trace, "job's backtrace", id));
        }
        if let Some(link) = job.flow.as_mut() {
            for result in link.parents.values_mut() {
                *result = self.open_value(std::mem::take(result), "parent step's result", id);
            }
        }
        job
    }

    fn open_jobs(&self, jobs: Vec<Job>) -> Vec<Job> {
        jobs.into_iter().map(|job| self.open_job(job)).collect()
    }

    fn seal_new(&self, job: ValidJob) -> StoreResult<ValidJob> {
        let unique_key = job.job().unique_key();
        let mut unique = job.job().unique.clone();
        let mut sealed = self
            .keys
            .seal(&job.job().payload)
            .map_err(|e| self.seal_error(e))?;
        if let (Some(key), Some(spec)) = (unique_key, unique.as_mut()) {
            // The store derives the unique key from the fields `args` names: give it the key
            // computed from the plaintext, in the clear, as the only such field.
            sealed[UNIQUE_FIELD] = Value::String(key);
            spec.args = Some(vec![UNIQUE_FIELD.to_string()]);
        }
        Ok(job.with_stored_payload(sealed, unique))
    }

    /// An error message as stored: made storable (as the stores would), then sealed.
    fn seal_message(&self, message: &str) -> StoreResult<String> {
        let storable = conveyor_core::validate::storable_message(message);
        self.keys
            .seal_text(&storable)
            .map_err(|e| self.seal_error(e))
    }

    /// A backtrace as stored: made storable and cut so that its sealed form fits the stores'
    /// limit (which would otherwise cut the ciphertext), then sealed.
    fn seal_backtrace(&self, backtrace: &str) -> StoreResult<String> {
        let storable = conveyor_core::job::storable_backtrace(backtrace);
        let mut end = storable.len().min(
            self.keys
                .text_capacity(conveyor_core::job::MAX_BACKTRACE_BYTES),
        );
        while !storable.is_char_boundary(end) {
            end -= 1;
        }
        self.keys
            .seal_text(&storable[..end])
            .map_err(|e| self.seal_error(e))
    }

    /// A job given whole (an import): every user-supplied value in it sealed.
    fn seal_job(&self, mut job: Job) -> StoreResult<Job> {
        job.payload = self
            .keys
            .seal(&job.payload)
            .map_err(|e| self.seal_error(e))?;
        job.result = job
            .result
            .map(|result| self.seal_value("result", &result))
            .transpose()?;
        for error in &mut job.errors {
            error.message = self.seal_message(&error.message)?;
            error.backtrace = error
                .backtrace
                .as_deref()
                .map(|trace| self.seal_backtrace(trace))
                .transpose()?;
        }
        if let Some(link) = job.flow.as_mut() {
            for result in link.parents.values_mut() {
                *result = self.seal_value("flow.parents", result)?;
            }
        }
        Ok(job)
    }

    /// Every step's and compensation's payload sealed; a compensation without a payload of its
    /// own (null) is given the step's at run time, so it stays null here.
    fn seal_flow(&self, flow: ValidFlow) -> StoreResult<ValidFlow> {
        let mut failure = None;
        let sealed = flow.map_jobs(|job| {
            if job.payload.is_null() {
                return;
            }
            match self.keys.seal(&job.payload) {
                Ok(payload) => job.payload = payload,
                Err(error) => failure = Some(error),
            }
        });
        match failure {
            Some(error) => Err(self.seal_error(error)),
            None => Ok(sealed),
        }
    }

    fn open_flow(&self, mut flow: FlowView) -> FlowView {
        let id = flow.id;
        for step in &mut flow.steps {
            step.result = step
                .result
                .take()
                .map(|result| self.open_value(result, "flow step's result", id));
            if let Some(error) = step.error.as_mut() {
                error.message =
                    self.open_text(std::mem::take(&mut error.message), "flow step's error", id);
            }
        }
        flow
    }

    /// The schedule with its job template's payload sealed (the store copies it into every
    /// job the schedule fires, so those are sealed too).
    fn seal_schedule(&self, schedule: &Schedule) -> StoreResult<Schedule> {
        let mut spec = schedule.spec().clone();
        spec.job.payload = self.seal_value("job.payload", &spec.job.payload)?;
        Ok(Schedule::from_spec(schedule.name(), spec)?)
    }

    fn open_schedule(&self, schedule: Schedule) -> Schedule {
        let mut spec = schedule.spec().clone();
        let opened = match self.keys.open(std::mem::take(&mut spec.job.payload)) {
            Ok(payload) => payload,
            Err(error) => {
                tracing::error!(schedule = schedule.name(), %error, "cannot decrypt a schedule's job");
                json!({ DECRYPT_ERROR: error })
            }
        };
        spec.job.payload = opened;
        // The opened spec passed these checks when it was stored; should it not now, the
        // schedule is shown as stored.
        Schedule::from_spec(schedule.name(), spec).unwrap_or(schedule)
    }

    fn open_schedule_view(&self, mut view: ScheduleView) -> ScheduleView {
        view.schedule = self.open_schedule(view.schedule);
        view
    }
}

// Jobs, leases, flows and schedules carry user-supplied values; every other part is forwarded
// unchanged.
conveyor_core::delegate_store!(EncryptedStore => inner:
    QueueStore, AccessStore, WorkerStore, LeadershipStore, KindStore, BreakerStore, StatsStore, CopyStore);

/// Shared configuration may hold secrets (a broker URL with its password): each document is
/// sealed whole, like a payload. Except named limits: numbers and a key expression, which the
/// stores read themselves as they claim, so they are kept in the clear.
#[async_trait]
impl conveyor_core::ConfigStore for EncryptedStore {
    async fn config_put(
        &self,
        collection: &str,
        name: &str,
        document: Value,
    ) -> StoreResult<conveyor_core::ConfigEntry> {
        if !sealed_collection(collection) {
            return self.inner.config_put(collection, name, document).await;
        }
        let sealed = self.seal_value("document", &document)?;
        let mut entry = self.inner.config_put(collection, name, sealed).await?;
        entry.document = document;
        Ok(entry)
    }
    async fn config_get(
        &self,
        collection: &str,
        name: &str,
    ) -> StoreResult<Option<conveyor_core::ConfigEntry>> {
        let entry = self.inner.config_get(collection, name).await?;
        entry.map(|entry| self.open_config(entry)).transpose()
    }
    async fn config_list(&self, collection: &str) -> StoreResult<Vec<conveyor_core::ConfigEntry>> {
        let entries = self.inner.config_list(collection).await?;
        entries
            .into_iter()
            .map(|entry| self.open_config(entry))
            .collect()
    }
    async fn config_delete(&self, collection: &str, name: &str) -> StoreResult<bool> {
        self.inner.config_delete(collection, name).await
    }
}

/// Whether the documents of a configuration collection are sealed: all but named limits.
fn sealed_collection(collection: &str) -> bool {
    collection != conveyor_core::config::LIMITS
}

impl EncryptedStore {
    /// Opens a configuration document. One that cannot be opened is an error, not a
    /// placeholder: a source run from a placeholder would read the wrong broker.
    fn open_config(
        &self,
        mut entry: conveyor_core::ConfigEntry,
    ) -> StoreResult<conveyor_core::ConfigEntry> {
        if !sealed_collection(&entry.collection) {
            return Ok(entry);
        }
        let stored = std::mem::take(&mut entry.document);
        entry.document = self.keys.open(stored).map_err(|error| {
            StoreError::backend(format!(
                "cannot decrypt the configuration {}/{}: {error}",
                entry.collection, entry.name
            ))
        })?;
        Ok(entry)
    }
}

#[async_trait]
impl ScheduleStore for EncryptedStore {
    async fn schedule_put(&self, schedule: Schedule) -> StoreResult<ScheduleView> {
        // Sealing twice never gives the same bytes: a definition equal to the stored one once
        // opened is stored as it is, so re-applying it changes nothing (no new revision), as
        // without encryption. Unless it was sealed with an older key: then re-applying it
        // seals it with the current one (a new revision, the same ticks), so that a rotation's
        // old key can be dropped once every schedule has been put again.
        let stored = self.inner.schedule_get(schedule.name()).await?;
        let sealed = match stored {
            Some(view)
                if self.keys.sealed_with_current(&view.schedule.job().payload)
                    && self.open_schedule(view.schedule.clone()) == schedule =>
            {
                view.schedule
            }
            _ => self.seal_schedule(&schedule)?,
        };
        let view = self.inner.schedule_put(sealed).await?;
        Ok(self.open_schedule_view(view))
    }
    async fn schedule_get(&self, name: &str) -> StoreResult<Option<ScheduleView>> {
        Ok(self
            .inner
            .schedule_get(name)
            .await?
            .map(|view| self.open_schedule_view(view)))
    }
    async fn schedules_list(&self) -> StoreResult<Vec<ScheduleView>> {
        Ok(self
            .inner
            .schedules_list()
            .await?
            .into_iter()
            .map(|view| self.open_schedule_view(view))
            .collect())
    }
    async fn schedule_delete(&self, name: &str) -> StoreResult<bool> {
        self.inner.schedule_delete(name).await
    }
    async fn schedule_fire(&self, request: FireRequest) -> StoreResult<FireOutcome> {
        // The store enqueues the stored (sealed) template: the runs' jobs are sealed as well.
        self.inner.schedule_fire(request).await
    }
    async fn schedule_runs(&self, name: &str, limit: usize) -> StoreResult<Vec<ScheduleRun>> {
        self.inner.schedule_runs(name, limit).await
    }
}

#[async_trait]
impl conveyor_core::FlowStore for EncryptedStore {
    async fn flow_create(
        &self,
        flow: ValidFlow,
    ) -> StoreResult<conveyor_core::workflow::CreatedFlow> {
        self.inner.flow_create(self.seal_flow(flow)?).await
    }
    async fn events_accept(
        &self,
        jobs: Vec<ValidJob>,
        flows: Vec<ValidFlow>,
    ) -> StoreResult<conveyor_core::Accepted> {
        // Sealed as jobs_insert_valid and flow_create seal theirs.
        let jobs = jobs
            .into_iter()
            .map(|job| self.seal_new(job))
            .collect::<StoreResult<Vec<_>>>()?;
        let flows = flows
            .into_iter()
            .map(|flow| self.seal_flow(flow))
            .collect::<StoreResult<Vec<_>>>()?;
        let accepted = self.inner.events_accept(jobs, flows).await?;
        Ok(conveyor_core::Accepted {
            jobs: accepted
                .jobs
                .into_iter()
                .map(|i| Inserted {
                    job: self.open_job(i.job),
                    ..i
                })
                .collect(),
            flows: accepted.flows,
        })
    }
    async fn flow_get(&self, id: Uuid) -> StoreResult<Option<FlowView>> {
        Ok(self
            .inner
            .flow_get(id)
            .await?
            .map(|flow| self.open_flow(flow)))
    }
    async fn flows_list(
        &self,
        params: conveyor_core::workflow::FlowListParams,
    ) -> StoreResult<Vec<FlowView>> {
        Ok(self
            .inner
            .flows_list(params)
            .await?
            .into_iter()
            .map(|flow| self.open_flow(flow))
            .collect())
    }
    async fn flow_cancel(&self, id: Uuid) -> StoreResult<FlowView> {
        Ok(self.open_flow(self.inner.flow_cancel(id).await?))
    }
    async fn flow_signal_valid(
        &self,
        id: Uuid,
        signal: &str,
        payload: Valid<Value>,
    ) -> StoreResult<conveyor_core::workflow::SignalOutcome> {
        // The payload becomes the wait step's result: sealed like a job's.
        let sealed = payload.try_vouched_map(|payload| self.seal_value("payload", &payload))?;
        self.inner.flow_signal_valid(id, signal, sealed).await
    }
    async fn flows_expire_waits(&self, limit: usize) -> StoreResult<u64> {
        self.inner.flows_expire_waits(limit).await
    }
    // The inner store starts the jobs and tells of them as it stored them, payloads sealed:
    // what observers are for (counting enqueues by queue and kind) reads no payload.
    fn flow_starts(&self) -> Arc<conveyor_core::FlowStarts> {
        self.inner.flow_starts()
    }
    async fn flows_prune(&self, params: conveyor_core::PruneParams) -> StoreResult<u64> {
        self.inner.flows_prune(params).await
    }
}

#[async_trait]
impl JobStore for EncryptedStore {
    fn clock(&self) -> Arc<dyn conveyor_core::Clock> {
        self.inner.clock()
    }

    async fn health(&self) -> conveyor_core::StoreHealth {
        self.inner.health().await
    }

    async fn jobs_insert_valid(&self, jobs: Vec<ValidJob>) -> StoreResult<Vec<Inserted>> {
        // Validated as plaintext by the caller, so errors named the caller's fields.
        let sealed = jobs
            .into_iter()
            .map(|job| self.seal_new(job))
            .collect::<StoreResult<Vec<_>>>()?;
        let inserted = self.inner.jobs_insert_valid(sealed).await?;
        Ok(inserted
            .into_iter()
            .map(|i| Inserted {
                job: self.open_job(i.job),
                ..i
            })
            .collect())
    }

    async fn job_get(&self, id: Uuid) -> StoreResult<Option<Job>> {
        Ok(self.inner.job_get(id).await?.map(|job| self.open_job(job)))
    }

    async fn jobs_list(&self, params: JobListParams) -> StoreResult<Vec<Job>> {
        if params.payload.is_none() {
            return Ok(self.open_jobs(self.inner.jobs_list(params).await?));
        }
        // The store holds ciphertext: the payload filter is applied here, to the opened
        // payloads, over the store's pages of the other filters (at most SCAN_LIMIT rows read).
        let wanted = params.limit;
        let mut matched = Vec::with_capacity(wanted.min(1024));
        let mut page_params = params.clone();
        page_params.payload = None;
        page_params.limit = 500;
        let mut scanned = 0;
        loop {
            let page = self.inner.jobs_list(page_params.clone()).await?;
            let done = page.len() < page_params.limit;
            scanned += page.len();
            page_params.after = page.last().map(|job| job.id);
            for job in self.open_jobs(page) {
                if payload_contains(&job.payload, &params) {
                    matched.push(job);
                    if matched.len() == wanted {
                        return Ok(matched);
                    }
                }
            }
            if done {
                return Ok(matched);
            }
            if scanned >= SCAN_LIMIT {
                return Err(conveyor_core::ValidationError::new(
                    "payload",
                    format!(
                        "payloads are encrypted: a payload search reads them one by one, and \
                         {SCAN_LIMIT} jobs matched the other filters; narrow it (queue, kind, \
                         state, tag, time)"
                    ),
                )
                .into());
            }
        }
    }

    async fn job_cancel(&self, id: Uuid) -> StoreResult<Job> {
        Ok(self.open_job(self.inner.job_cancel(id).await?))
    }

    async fn dead_replay(&self, selector: ReplaySelector) -> StoreResult<u64> {
        self.inner.dead_replay(selector).await
    }

    async fn dead_discard(&self, id: Uuid) -> StoreResult<bool> {
        self.inner.dead_discard(id).await
    }

    async fn jobs_import(&self, jobs: Vec<Job>) -> StoreResult<u64> {
        let sealed = jobs
            .into_iter()
            .map(|job| self.seal_job(job))
            .collect::<StoreResult<Vec<_>>>()?;
        self.inner.jobs_import(sealed).await
    }
}

#[async_trait]
impl LeaseStore for EncryptedStore {
    async fn jobs_fetch_valid(&self, params: Valid<FetchParams>) -> StoreResult<Vec<Job>> {
        Ok(self.open_jobs(self.inner.jobs_fetch_valid(params).await?))
    }

    async fn jobs_heartbeat_many(
        &self,
        params: Vec<HeartbeatParams>,
    ) -> StoreResult<Vec<Option<DateTime<Utc>>>> {
        self.inner.jobs_heartbeat_many(params).await
    }

    async fn jobs_complete_valid(
        &self,
        params: Valid<Vec<CompleteParams>>,
    ) -> StoreResult<Vec<LeaseOutcome>> {
        let sealed = params.try_vouched_map(|params| {
            params
                .into_iter()
                .map(|complete| {
                    Ok(CompleteParams {
                        result: complete
                            .result
                            .map(|result| self.seal_value("result", &result))
                            .transpose()?,
                        ..complete
                    })
                })
                .collect::<StoreResult<Vec<_>>>()
        })?;
        self.inner.jobs_complete_valid(sealed).await
    }

    async fn job_fail_valid(&self, params: Valid<FailParams>) -> StoreResult<Job> {
        let sealed = params.try_vouched_map(|mut params| {
            params.message = self.seal_message(&params.message)?;
            params.backtrace = params
                .backtrace
                .as_deref()
                .map(|trace| self.seal_backtrace(trace))
                .transpose()?;
            Ok::<_, StoreError>(params)
        })?;
        Ok(self.open_job(self.inner.job_fail_valid(sealed).await?))
    }

    async fn job_snooze(&self, params: SnoozeParams) -> StoreResult<Job> {
        Ok(self.open_job(self.inner.job_snooze(params).await?))
    }

    async fn job_progress(
        &self,
        lease: LeaseRef,
        percent: u8,
        message: Option<String>,
    ) -> StoreResult<()> {
        self.inner.job_progress(lease, percent, message).await
    }

    async fn jobs_release_many(&self, leases: Vec<LeaseRef>) -> StoreResult<u64> {
        self.inner.jobs_release_many(leases).await
    }

    fn wakeup(&self) -> Arc<Notify> {
        self.inner.wakeup()
    }

    async fn jobs_next_due(&self, queues: &[String]) -> StoreResult<Option<DateTime<Utc>>> {
        self.inner.jobs_next_due(queues).await
    }

    async fn jobs_available_of_kind(
        &self,
        queue: &str,
        kind: &str,
        limit: usize,
    ) -> StoreResult<Vec<Job>> {
        // Opened: a batch's key may be a payload field.
        let jobs = self
            .inner
            .jobs_available_of_kind(queue, kind, limit)
            .await?;
        Ok(self.open_jobs(jobs))
    }
}

/// Most jobs a payload search over encrypted payloads reads.
const SCAN_LIMIT: usize = 100_000;

/// Whether `payload` holds every (path, value) of the search's payload filter.
fn payload_contains(payload: &serde_json::Value, params: &JobListParams) -> bool {
    params.payload_leaves().iter().all(|(keys, value)| {
        let mut at = payload;
        for key in keys {
            match at.get(key) {
                Some(inner) => at = inner,
                None => return false,
            }
        }
        at == value
    })
}

#[cfg(test)]
mod tests;
