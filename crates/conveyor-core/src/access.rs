//! Access control and the audit log: API tokens with roles, browser sessions, and the record of
//! who did what.
//!
//! A credential (an API token or a session cookie) is a prefix, the record's id (32 hex
//! digits), `_` and a random secret (64 hex digits, 32 bytes from the OS), e.g.
//! `cv_<id>_<secret>`. Stores keep only the SHA-256 of the secret. Verifying a credential looks
//! the record up by its id, which is not secret, and then compares the hashes in constant
//! time: the lookup never depends on secret bytes, so neither the database's index nor its
//! comparisons can leak them through timing. SHA-256 without a salt or a slow hash is enough
//! because the secrets are 256 random bits, not passwords: there is nothing to guess from a
//! leaked hash.

use chrono::{DateTime, Utc};
use rand::TryRngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;
use std::str::FromStr;
use subtle::ConstantTimeEq;
use uuid::Uuid;

use crate::error::{StoreError, StoreResult, ValidationError};
use crate::valid::Valid;
use async_trait::async_trait;

/// Prefix of API tokens, so a leaked one is recognisable (and greppable by secret scanners).
pub const TOKEN_PREFIX: &str = "cv_";
/// Prefix of session credentials (the value of the `conveyor_session` cookie).
pub const SESSION_PREFIX: &str = "cvs_";
/// Random bytes in each secret.
const SECRET_BYTES: usize = 32;
/// Most job ids one audit entry keeps; `job_count` says how many the action touched.
pub const AUDIT_MAX_JOB_IDS: usize = 100;
/// Longest `detail` of an audit entry, in bytes.
pub const AUDIT_MAX_DETAIL: usize = 512;
/// Actor recorded when access control is off.
pub const ANONYMOUS: &str = "anonymous";

/// What a token may do. Admin may do everything; see the route table in `conveyor-server`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Role {
    /// Enqueues jobs and reads them.
    Producer,
    /// Fetches jobs and reports on them (heartbeat, complete, fail, release, snooze).
    Worker,
    /// Everything, including the dead-letter queue, queue settings, schedules, tokens, audit.
    Admin,
    /// Reads everything an admin reads (every `GET`), changes nothing: for dashboards on a
    /// wall, on-call people who look, and auditors.
    Viewer,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Producer, Role::Worker, Role::Admin, Role::Viewer];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Producer => "producer",
            Role::Worker => "worker",
            Role::Admin => "admin",
            Role::Viewer => "viewer",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for Role {
    type Err = ValidationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|role| role.as_str() == s)
            .ok_or_else(|| {
                ValidationError::new(
                    "role",
                    format!("{s:?} is not one of producer, worker, admin, viewer"),
                )
            })
    }
}

/// A token as listed: never its secret, nor the secret's hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiToken {
    pub id: Uuid,
    pub name: String,
    pub role: Role,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

impl ApiToken {
    pub fn is_active(&self) -> bool {
        self.revoked_at.is_none()
    }
}

/// A token as stored, with the hash its secret is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredToken {
    pub token: ApiToken,
    pub secret_hash: String,
}

/// A token to store (see [`TokenSecret::generate`] for the id and hash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewToken {
    pub id: Uuid,
    pub name: String,
    pub role: Role,
    pub secret_hash: String,
}

/// Which token to revoke: by id, or the active token of that name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSelector {
    Id(Uuid),
    Name(String),
}

impl TokenSelector {
    /// A UUID selects by id, anything else by name.
    pub fn parse(raw: &str) -> Self {
        match Uuid::parse_str(raw) {
            Ok(id) => TokenSelector::Id(id),
            Err(_) => TokenSelector::Name(raw.to_string()),
        }
    }
}

/// A browser session, created by logging in with a token: it acts with that token's name and
/// role until it expires, is deleted (logout), or the token is revoked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSession {
    pub id: Uuid,
    pub secret_hash: String,
    pub token: ApiToken,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSession {
    pub id: Uuid,
    pub secret_hash: String,
    pub token_id: Uuid,
    pub expires_at: DateTime<Utc>,
}

/// A freshly generated credential: the text handed to its owner once, and what the store keeps.
#[derive(Clone)]
pub struct TokenSecret {
    pub id: Uuid,
    /// The whole credential (`prefix` + id + `_` + secret). Shown once, never stored.
    pub plaintext: String,
    pub secret_hash: String,
}

impl fmt::Debug for TokenSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the secret, even in a debug log.
        f.debug_struct("TokenSecret")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// The operating system could not provide random bytes.
#[derive(Debug, thiserror::Error)]
#[error("cannot read random bytes from the operating system: {0}")]
pub struct RandomnessError(String);

impl TokenSecret {
    /// A new credential with `prefix` ([`TOKEN_PREFIX`] or [`SESSION_PREFIX`]).
    pub fn generate(prefix: &str) -> Result<Self, RandomnessError> {
        let mut bytes = [0u8; SECRET_BYTES];
        rand::rngs::OsRng
            .try_fill_bytes(&mut bytes)
            .map_err(|e| RandomnessError(e.to_string()))?;
        let secret = to_hex(&bytes);
        let id = Uuid::new_v4();
        Ok(Self {
            id,
            plaintext: format!("{prefix}{}_{secret}", id.simple()),
            secret_hash: hash_secret(&secret),
        })
    }
}

/// Splits a credential into its record id and secret; `None` when it is not of the form
/// `prefix` + 32 hex digits + `_` + secret.
pub fn parse_credential<'a>(prefix: &str, credential: &'a str) -> Option<(Uuid, &'a str)> {
    let rest = credential.strip_prefix(prefix)?;
    let (id, secret) = rest.split_once('_')?;
    if id.len() != 32 || secret.is_empty() {
        return None;
    }
    Some((Uuid::try_parse(id).ok()?, secret))
}

/// The hex SHA-256 of a secret: what stores keep.
pub fn hash_secret(secret: &str) -> String {
    to_hex(&Sha256::digest(secret.as_bytes()))
}

/// Whether `secret` hashes to `stored_hash`, comparing in constant time.
pub fn secret_matches(secret: &str, stored_hash: &str) -> bool {
    hash_secret(secret)
        .as_bytes()
        .ct_eq(stored_hash.as_bytes())
        .into()
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What an audit entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum AuditAction {
    #[serde(rename = "job.enqueue")]
    JobEnqueue,
    #[serde(rename = "job.cancel")]
    JobCancel,
    #[serde(rename = "dead.replay")]
    DeadReplay,
    #[serde(rename = "dead.discard")]
    DeadDiscard,
    /// Any change of a queue's settings, pause and resume included (the detail says which).
    #[serde(rename = "queue.settings")]
    QueueSettings,
    #[serde(rename = "schedule.put")]
    SchedulePut,
    #[serde(rename = "schedule.delete")]
    ScheduleDelete,
    /// A schedule's job enqueued by hand, outside its ticks.
    #[serde(rename = "schedule.trigger")]
    ScheduleTrigger,
    #[serde(rename = "token.create")]
    TokenCreate,
    #[serde(rename = "token.revoke")]
    TokenRevoke,
    #[serde(rename = "flow.create")]
    FlowCreate,
    #[serde(rename = "flow.cancel")]
    FlowCancel,
    #[serde(rename = "flow.signal")]
    FlowSignal,
    #[serde(rename = "kind.put")]
    KindPut,
    #[serde(rename = "kind.delete")]
    KindDelete,
    /// A circuit breaker opened (by its failure ratio, a retry-after, or an operator).
    #[serde(rename = "breaker.open")]
    BreakerOpen,
    /// A circuit breaker started handing out probe jobs.
    #[serde(rename = "breaker.half_open")]
    BreakerHalfOpen,
    #[serde(rename = "breaker.close")]
    BreakerClose,
    /// A worker told to stop fetching (it keeps running).
    #[serde(rename = "worker.quiet")]
    WorkerQuiet,
    /// A worker told to stop fetching and exit once drained.
    #[serde(rename = "worker.stop")]
    WorkerStop,
    /// A worker's quiet or stop cleared.
    #[serde(rename = "worker.resume")]
    WorkerResume,
    /// An event source set, paused or resumed (the detail says which).
    #[serde(rename = "source.put")]
    SourcePut,
    #[serde(rename = "source.delete")]
    SourceDelete,
    #[serde(rename = "hook.put")]
    HookPut,
    #[serde(rename = "hook.delete")]
    HookDelete,
    #[serde(rename = "subscription.put")]
    SubscriptionPut,
    #[serde(rename = "subscription.delete")]
    SubscriptionDelete,
    #[serde(rename = "limit.put")]
    LimitPut,
    #[serde(rename = "limit.delete")]
    LimitDelete,
}

impl AuditAction {
    pub const ALL: [AuditAction; 29] = [
        AuditAction::JobEnqueue,
        AuditAction::JobCancel,
        AuditAction::DeadReplay,
        AuditAction::DeadDiscard,
        AuditAction::QueueSettings,
        AuditAction::SchedulePut,
        AuditAction::ScheduleDelete,
        AuditAction::ScheduleTrigger,
        AuditAction::TokenCreate,
        AuditAction::TokenRevoke,
        AuditAction::FlowCreate,
        AuditAction::FlowCancel,
        AuditAction::FlowSignal,
        AuditAction::KindPut,
        AuditAction::KindDelete,
        AuditAction::BreakerOpen,
        AuditAction::BreakerHalfOpen,
        AuditAction::BreakerClose,
        AuditAction::WorkerQuiet,
        AuditAction::WorkerStop,
        AuditAction::WorkerResume,
        AuditAction::SourcePut,
        AuditAction::SourceDelete,
        AuditAction::HookPut,
        AuditAction::HookDelete,
        AuditAction::SubscriptionPut,
        AuditAction::SubscriptionDelete,
        AuditAction::LimitPut,
        AuditAction::LimitDelete,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AuditAction::JobEnqueue => "job.enqueue",
            AuditAction::JobCancel => "job.cancel",
            AuditAction::FlowCreate => "flow.create",
            AuditAction::FlowCancel => "flow.cancel",
            AuditAction::FlowSignal => "flow.signal",
            AuditAction::KindPut => "kind.put",
            AuditAction::KindDelete => "kind.delete",
            AuditAction::BreakerOpen => "breaker.open",
            AuditAction::BreakerHalfOpen => "breaker.half_open",
            AuditAction::BreakerClose => "breaker.close",
            AuditAction::WorkerQuiet => "worker.quiet",
            AuditAction::WorkerStop => "worker.stop",
            AuditAction::WorkerResume => "worker.resume",
            AuditAction::SourcePut => "source.put",
            AuditAction::SourceDelete => "source.delete",
            AuditAction::HookPut => "hook.put",
            AuditAction::HookDelete => "hook.delete",
            AuditAction::SubscriptionPut => "subscription.put",
            AuditAction::SubscriptionDelete => "subscription.delete",
            AuditAction::LimitPut => "limit.put",
            AuditAction::LimitDelete => "limit.delete",
            AuditAction::DeadReplay => "dead.replay",
            AuditAction::DeadDiscard => "dead.discard",
            AuditAction::QueueSettings => "queue.settings",
            AuditAction::SchedulePut => "schedule.put",
            AuditAction::ScheduleDelete => "schedule.delete",
            AuditAction::ScheduleTrigger => "schedule.trigger",
            AuditAction::TokenCreate => "token.create",
            AuditAction::TokenRevoke => "token.revoke",
        }
    }
}

impl fmt::Display for AuditAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for AuditAction {
    type Err = ValidationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AuditAction::ALL
            .into_iter()
            .find(|action| action.as_str() == s)
            .ok_or_else(|| {
                let known: Vec<&str> = AuditAction::ALL.iter().map(|a| a.as_str()).collect();
                ValidationError::new(
                    "action",
                    format!("{s:?} is not an audited action ({})", known.join(", ")),
                )
            })
    }
}

/// Who acted: a token (by name and id), or [`ANONYMOUS`] when access control is off, or a local
/// operator using the store directly (the CLI's `token` commands).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor {
    pub name: String,
    pub token_id: Option<Uuid>,
}

impl Actor {
    /// Changes Conveyor makes on its own (a circuit breaker tripping, say).
    pub fn system() -> Self {
        Self {
            name: "system".to_string(),
            token_id: None,
        }
    }

    pub fn anonymous() -> Self {
        Self {
            name: ANONYMOUS.to_string(),
            token_id: None,
        }
    }

    pub fn token(token: &ApiToken) -> Self {
        Self {
            name: token.name.clone(),
            token_id: Some(token.id),
        }
    }
}

/// An entry to append. Never put payloads or secrets in it: `detail` is a short summary made
/// by the code that records the action (e.g. `paused=true`), and stores cut it to
/// [`AUDIT_MAX_DETAIL`] bytes and `job_ids` to [`AUDIT_MAX_JOB_IDS`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAuditEntry {
    pub actor: Actor,
    pub action: AuditAction,
    /// The queue, schedule or token acted on, when there is one.
    pub target: Option<String>,
    pub job_ids: Vec<Uuid>,
    /// How many jobs the action touched (may exceed `job_ids.len()`).
    pub job_count: u64,
    pub detail: Option<String>,
}

impl NewAuditEntry {
    pub fn new(actor: Actor, action: AuditAction) -> Self {
        Self {
            actor,
            action,
            target: None,
            job_ids: Vec::new(),
            job_count: 0,
            detail: None,
        }
    }

    pub fn target(mut self, target: impl Into<String>) -> Self {
        self.target = Some(target.into());
        self
    }

    /// The jobs acted on; `job_count` becomes their number.
    pub fn jobs(mut self, ids: Vec<Uuid>) -> Self {
        self.job_count = ids.len() as u64;
        self.job_ids = ids;
        self
    }

    pub fn job_count(mut self, count: u64) -> Self {
        self.job_count = count;
        self
    }

    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// Applies the size bounds every store keeps.
    pub fn bounded(mut self) -> Self {
        self.job_ids.truncate(AUDIT_MAX_JOB_IDS);
        if let Some(detail) = &mut self.detail {
            if detail.len() > AUDIT_MAX_DETAIL {
                let mut end = AUDIT_MAX_DETAIL;
                while !detail.is_char_boundary(end) {
                    end -= 1;
                }
                detail.truncate(end);
            }
        }
        self
    }
}

/// A recorded entry. `id` grows with every append, so it orders entries and pages them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub actor_token_id: Option<Uuid>,
    pub action: AuditAction,
    pub target: Option<String>,
    pub job_ids: Vec<Uuid>,
    pub job_count: u64,
    pub detail: Option<String>,
}

impl AuditEntry {
    /// `entry` as stored with `id` at `at`.
    pub fn recorded(id: i64, at: DateTime<Utc>, entry: NewAuditEntry) -> Self {
        Self {
            id,
            at,
            actor: entry.actor.name,
            actor_token_id: entry.actor.token_id,
            action: entry.action,
            target: entry.target,
            job_ids: entry.job_ids,
            job_count: entry.job_count,
            detail: entry.detail,
        }
    }
}

/// Entries newest first: up to `limit`, with ids below `before`, of `action` when given.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditListParams {
    pub limit: usize,
    pub before: Option<i64>,
    pub action: Option<AuditAction>,
}

impl AuditListParams {
    /// The listing's bounds as stored integers: entries with ids below this (all when no
    /// `before`), and at most this many.
    pub fn stored_bounds(&self) -> (i64, i64) {
        (
            self.before.unwrap_or(i64::MAX),
            i64::try_from(self.limit).unwrap_or(i64::MAX),
        )
    }
}

impl Default for AuditListParams {
    fn default() -> Self {
        Self {
            limit: 100,
            before: None,
            action: None,
        }
    }
}

/// Which audit entries [`crate::AccessStore::audit_prune`] deletes: those stamped before a
/// moment, or older than an age by the store's clock (the maintenance leader's retention, so
/// every server of a cluster prunes by the same clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditCutoff {
    Before(DateTime<Utc>),
    OlderThan(std::time::Duration),
}

impl AuditCutoff {
    /// The moment before which entries go, with the store's `now` (an age reaching before 1970
    /// gives 1970: no entry is that old, and every store can hold the moment).
    pub fn before(self, now: DateTime<Utc>) -> DateTime<Utc> {
        match self {
            AuditCutoff::Before(at) => at,
            AuditCutoff::OlderThan(age) => chrono::Duration::from_std(age)
                .ok()
                .and_then(|age| now.checked_sub_signed(age))
                .map_or(DateTime::UNIX_EPOCH, |at| at.max(DateTime::UNIX_EPOCH)),
        }
    }
}

/// The default for `serve --retain-audit-secs`: 90 days.
pub const DEFAULT_AUDIT_RETENTION: std::time::Duration =
    std::time::Duration::from_secs(90 * 24 * 3600);

/// A token just created, with the secret to hand to its owner (once: only its hash is kept).
#[derive(Debug, Clone)]
pub struct CreatedToken {
    pub token: ApiToken,
    pub secret: TokenSecret,
}

/// Creates a token of `role` (named `name`, or `ROLE-xxxxxxxx` after its id) and records who
/// did it in the audit log: what `conveyor token create` and `POST /v1/tokens` share.
pub async fn create_token(
    store: &(impl AccessStore + ?Sized),
    role: Role,
    name: Option<String>,
    actor: Actor,
) -> StoreResult<CreatedToken> {
    let secret =
        TokenSecret::generate(TOKEN_PREFIX).map_err(|e| StoreError::backend(e.to_string()))?;
    let name = name.unwrap_or_else(|| format!("{role}-{}", &secret.id.simple().to_string()[..8]));
    let token = store
        .tokens_insert(NewToken {
            id: secret.id,
            name,
            role,
            secret_hash: secret.secret_hash.clone(),
        })
        .await?;
    store
        .audit_append(
            NewAuditEntry::new(actor, AuditAction::TokenCreate)
                .target(token.name.clone())
                .detail(format!("role={role} id={}", token.id)),
        )
        .await?;
    Ok(CreatedToken { token, secret })
}

/// Revokes a token and records who did it: what `conveyor token revoke` and
/// `DELETE /v1/tokens/{token}` share. `None` (and no audit entry) when there is no such token.
pub async fn revoke_token(
    store: &(impl AccessStore + ?Sized),
    selector: TokenSelector,
    actor: Actor,
) -> StoreResult<Option<ApiToken>> {
    let Some(token) = store.token_revoke(selector).await? else {
        return Ok(None);
    };
    store
        .audit_append(
            NewAuditEntry::new(actor, AuditAction::TokenRevoke)
                .target(token.name.clone())
                .detail(format!("id={}", token.id)),
        )
        .await?;
    Ok(Some(token))
}

/// Access control and audit: the store's side (the rest of [`crate::Store`] is in
/// [`crate::store`]).
#[async_trait]
pub trait AccessStore: Send + Sync {
    /// Stores a new token. Names are unique among active tokens (a revoked token's name may
    /// be used again): a clash is `Invalid` naming `name`.
    ///
    /// Checks the name ([`Valid::token`]) first.
    async fn tokens_insert(&self, token: NewToken) -> StoreResult<ApiToken> {
        self.tokens_insert_valid(Valid::token(token)?).await
    }

    /// Stores a new token (see [`AccessStore::tokens_insert`]).
    async fn tokens_insert_valid(&self, token: Valid<NewToken>) -> StoreResult<ApiToken>;

    /// Every token, revoked ones included, oldest first.
    async fn tokens_list(&self) -> StoreResult<Vec<ApiToken>>;

    /// Revokes a token (by id, or the active token of that name) and deletes its sessions.
    /// Revoking a revoked token by id changes nothing and returns it; `None` when there is no
    /// such token.
    async fn token_revoke(&self, selector: TokenSelector) -> StoreResult<Option<ApiToken>>;

    /// A token by id with its secret's hash, revoked or not (the caller checks both).
    async fn token_get(&self, id: Uuid) -> StoreResult<Option<StoredToken>>;

    /// Stores a session for an existing token (`Invalid` naming `token` when there is none),
    /// pruning expired sessions.
    async fn session_insert(&self, session: NewSession) -> StoreResult<()>;

    /// A session that has not expired, with its token (which may have been revoked since).
    async fn session_get(&self, id: Uuid) -> StoreResult<Option<StoredSession>>;

    /// Deletes a session (logout). False when there was none.
    async fn session_delete(&self, id: Uuid) -> StoreResult<bool>;

    /// Appends an entry to the audit log, bounded as [`NewAuditEntry::bounded`] says, stamped
    /// with the store's clock.
    async fn audit_append(&self, entry: NewAuditEntry) -> StoreResult<AuditEntry>;

    /// Audit entries newest first (see [`AuditListParams`]).
    async fn audit_list(&self, params: AuditListParams) -> StoreResult<Vec<AuditEntry>>;

    /// Deletes up to `limit` of the oldest entries stamped before `cutoff`, in one short
    /// statement that reads no more than `limit` rows (the log is appended in time order, so
    /// its expired entries are its head); returns how many. Run repeatedly until it deletes
    /// fewer than `limit`. An entry stamped out of order (a skewed clock) waits until the
    /// entries before it expire.
    async fn audit_prune(&self, cutoff: AuditCutoff, limit: usize) -> StoreResult<u64>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_round_trip_and_verify() {
        let secret = TokenSecret::generate(TOKEN_PREFIX).expect("randomness");
        assert!(secret.plaintext.starts_with(TOKEN_PREFIX));
        let (id, raw) = parse_credential(TOKEN_PREFIX, &secret.plaintext).expect("parses");
        assert_eq!(id, secret.id);
        assert_eq!(raw.len(), 64);
        assert!(secret_matches(raw, &secret.secret_hash));
        assert!(!secret_matches(
            "0".repeat(64).as_str(),
            &secret.secret_hash
        ));
        assert!(
            !format!("{secret:?}").contains(raw),
            "Debug hides the secret"
        );
        // The wrong prefix, a short id and a missing secret are not credentials.
        assert!(parse_credential(SESSION_PREFIX, &secret.plaintext).is_none());
        assert!(parse_credential(TOKEN_PREFIX, "cv_abc_def").is_none());
        assert!(parse_credential(TOKEN_PREFIX, &format!("cv_{}_", id.simple())).is_none());
        let other = TokenSecret::generate(TOKEN_PREFIX).expect("randomness");
        assert_ne!(other.plaintext, secret.plaintext, "secrets are random");
    }

    #[test]
    fn names_parse_back() {
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>().expect("role"), role);
        }
        for action in AuditAction::ALL {
            assert_eq!(
                action.as_str().parse::<AuditAction>().expect("action"),
                action
            );
            assert_eq!(
                serde_json::to_value(action).expect("json"),
                serde_json::json!(action.as_str())
            );
        }
        assert_eq!("root".parse::<Role>().expect_err("unknown").field, "role");
    }

    #[test]
    fn entries_are_bounded() {
        let ids: Vec<Uuid> = (0..AUDIT_MAX_JOB_IDS + 5).map(|_| Uuid::new_v4()).collect();
        let entry = NewAuditEntry::new(Actor::anonymous(), AuditAction::JobEnqueue)
            .jobs(ids)
            .detail("é".repeat(AUDIT_MAX_DETAIL))
            .bounded();
        assert_eq!(entry.job_ids.len(), AUDIT_MAX_JOB_IDS);
        assert_eq!(entry.job_count, (AUDIT_MAX_JOB_IDS + 5) as u64);
        assert!(entry
            .detail
            .as_ref()
            .is_some_and(|d| d.len() <= AUDIT_MAX_DETAIL));
    }
}
