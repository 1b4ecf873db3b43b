//! Access control and audit: tokens, sessions, the audit log.

use conveyor_core::access::{Actor, TokenSecret, SESSION_PREFIX, TOKEN_PREFIX};
use conveyor_core::{
    ApiToken, AuditAction, AuditListParams, NewAuditEntry, NewSession, NewToken, Role, StoreError,
    TokenSelector,
};
use uuid::Uuid;

use crate::kit::{secs, span, Harness};

fn new_token(name: &str, role: Role) -> (NewToken, TokenSecret) {
    let secret = TokenSecret::generate(TOKEN_PREFIX).expect("randomness");
    let token = NewToken {
        id: secret.id,
        name: name.to_string(),
        role,
        secret_hash: secret.secret_hash.clone(),
    };
    (token, secret)
}

async fn create(h: &Harness, name: &str, role: Role) -> (ApiToken, TokenSecret) {
    let (token, secret) = new_token(name, role);
    let stored = h.store.tokens_insert(token).await.expect("insert token");
    (stored, secret)
}

fn invalid_field(error: StoreError) -> String {
    match error {
        StoreError::Invalid(invalid) => invalid.field,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

/// A token is stored with its hash (never anything that reads back as the secret), listed
/// oldest first, and found by id.
pub async fn token_insert_get_and_list(h: &Harness) {
    let (ci, ci_secret) = create(h, "ci", Role::Producer).await;
    assert_eq!(ci.name, "ci");
    assert_eq!(ci.role, Role::Producer);
    assert_eq!(ci.created_at, h.now());
    assert!(ci.is_active());
    h.advance(secs(1));
    let (ops, _) = create(h, "ops", Role::Admin).await;

    let stored = h
        .store
        .token_get(ci.id)
        .await
        .expect("get")
        .expect("token exists");
    assert_eq!(stored.token, ci);
    assert_eq!(stored.secret_hash, ci_secret.secret_hash);
    assert!(
        !ci_secret.plaintext.contains(&stored.secret_hash),
        "the hash is not part of the secret"
    );
    assert!(h
        .store
        .token_get(Uuid::new_v4())
        .await
        .expect("get")
        .is_none());
    assert_eq!(h.store.tokens_list().await.expect("list"), vec![ci, ops]);
}

/// Names are unique among active tokens; bad names are refused naming `name`; a revoked
/// token's name can be given to a new token.
pub async fn token_names_are_unique_among_active_tokens(h: &Harness) {
    let (first, _) = create(h, "deploy", Role::Worker).await;
    let (clash, _) = new_token("deploy", Role::Admin);
    let error = h.store.tokens_insert(clash).await.expect_err("name taken");
    assert_eq!(invalid_field(error), "name");
    let (bad, _) = new_token("has space", Role::Admin);
    let error = h.store.tokens_insert(bad).await.expect_err("bad name");
    assert_eq!(invalid_field(error), "name");
    assert_eq!(h.store.tokens_list().await.expect("list").len(), 1);

    h.store
        .token_revoke(TokenSelector::Name("deploy".into()))
        .await
        .expect("revoke")
        .expect("revoked");
    h.advance(secs(1));
    let (second, _) = create(h, "deploy", Role::Admin).await;
    assert_ne!(second.id, first.id);
    let listed = h.store.tokens_list().await.expect("list");
    assert_eq!(listed.len(), 2);
    assert!(
        !listed[0].is_active() && listed[1].is_active(),
        "{listed:?}"
    );
}

/// Revoking by name or id stamps `revoked_at`, is idempotent by id, says `None` for unknown
/// tokens, and ends the token's sessions.
pub async fn token_revoke_by_name_or_id_ends_its_sessions(h: &Harness) {
    let (alice, _) = create(h, "alice", Role::Admin).await;
    let (bob, _) = create(h, "bob", Role::Producer).await;
    let session = TokenSecret::generate(SESSION_PREFIX).expect("randomness");
    h.store
        .session_insert(NewSession {
            id: session.id,
            secret_hash: session.secret_hash.clone(),
            token_id: alice.id,
            expires_at: h.now() + span(secs(3600)),
        })
        .await
        .expect("session");
    assert!(h
        .store
        .session_get(session.id)
        .await
        .expect("get")
        .is_some());

    h.advance(secs(5));
    let revoked = h
        .store
        .token_revoke(TokenSelector::Name("alice".into()))
        .await
        .expect("revoke")
        .expect("alice existed");
    assert_eq!(revoked.id, alice.id);
    assert_eq!(revoked.revoked_at, Some(h.now()));
    assert!(
        h.store
            .session_get(session.id)
            .await
            .expect("get")
            .is_none(),
        "revoking a token ends its sessions"
    );
    let stored = h
        .store
        .token_get(alice.id)
        .await
        .expect("get")
        .expect("kept");
    assert_eq!(
        stored.token.revoked_at,
        Some(revoked.revoked_at.expect("set"))
    );

    // Again by id: unchanged. By name: no active token of that name any more.
    h.advance(secs(5));
    let again = h
        .store
        .token_revoke(TokenSelector::Id(alice.id))
        .await
        .expect("revoke")
        .expect("found by id");
    assert_eq!(
        again.revoked_at, revoked.revoked_at,
        "the first revocation stands"
    );
    assert!(h
        .store
        .token_revoke(TokenSelector::Name("alice".into()))
        .await
        .expect("revoke")
        .is_none());
    assert!(h
        .store
        .token_revoke(TokenSelector::Id(Uuid::new_v4()))
        .await
        .expect("revoke")
        .is_none());
    let bob_now = h.store.token_get(bob.id).await.expect("get").expect("bob");
    assert!(bob_now.token.is_active(), "other tokens are untouched");
}

/// A session carries its token and hash, expires with the store's clock, and is deleted by
/// logout; a session for an unknown token is refused.
pub async fn session_round_trip_expiry_and_delete(h: &Harness) {
    let (token, _) = create(h, "browser", Role::Worker).await;
    let make = |expires_in: u64| {
        let secret = TokenSecret::generate(SESSION_PREFIX).expect("randomness");
        let session = NewSession {
            id: secret.id,
            secret_hash: secret.secret_hash.clone(),
            token_id: token.id,
            expires_at: h.now() + span(secs(expires_in)),
        };
        (session, secret)
    };
    let (short, short_secret) = make(10);
    let (long, _) = make(3600);
    h.store.session_insert(short.clone()).await.expect("insert");
    h.store.session_insert(long.clone()).await.expect("insert");

    let got = h
        .store
        .session_get(short.id)
        .await
        .expect("get")
        .expect("live session");
    assert_eq!(got.id, short.id);
    assert_eq!(got.secret_hash, short_secret.secret_hash);
    assert_eq!(got.token, token);
    assert_eq!(got.created_at, h.now());
    assert_eq!(got.expires_at, short.expires_at);

    h.advance(secs(10));
    assert!(
        h.store.session_get(short.id).await.expect("get").is_none(),
        "expired at expires_at"
    );
    assert!(h.store.session_get(long.id).await.expect("get").is_some());
    assert!(h.store.session_delete(long.id).await.expect("delete"));
    assert!(!h.store.session_delete(long.id).await.expect("delete"));
    assert!(h.store.session_get(long.id).await.expect("get").is_none());

    let (mut orphan, _) = make(60);
    orphan.token_id = Uuid::new_v4();
    let error = h
        .store
        .session_insert(orphan)
        .await
        .expect_err("unknown token");
    assert_eq!(invalid_field(error), "token");
}

/// Entries come back newest first with every field, filtered by action and paged by `before`;
/// job ids are bounded while `job_count` keeps the full number.
pub async fn audit_append_and_list_newest_first_with_filters(h: &Harness) {
    let (admin, _) = create(h, "admin", Role::Admin).await;
    let ids: Vec<Uuid> = (0..3).map(|_| Uuid::now_v7()).collect();
    let first = h
        .store
        .audit_append(
            NewAuditEntry::new(Actor::token(&admin), AuditAction::JobEnqueue)
                .target("mail")
                .jobs(ids.clone()),
        )
        .await
        .expect("append");
    assert_eq!(first.actor, "admin");
    assert_eq!(first.actor_token_id, Some(admin.id));
    assert_eq!(first.action, AuditAction::JobEnqueue);
    assert_eq!(first.target.as_deref(), Some("mail"));
    assert_eq!(first.job_ids, ids);
    assert_eq!(first.job_count, 3);
    assert_eq!(first.at, h.now());

    h.advance(secs(1));
    let many: Vec<Uuid> = (0..conveyor_core::access::AUDIT_MAX_JOB_IDS + 20)
        .map(|_| Uuid::now_v7())
        .collect();
    let second = h
        .store
        .audit_append(
            NewAuditEntry::new(Actor::anonymous(), AuditAction::DeadReplay)
                .jobs(many.clone())
                .detail("queue=mail"),
        )
        .await
        .expect("append");
    assert_eq!(
        second.job_ids.len(),
        conveyor_core::access::AUDIT_MAX_JOB_IDS
    );
    assert_eq!(second.job_count, many.len() as u64);
    h.advance(secs(1));
    let third = h
        .store
        .audit_append(
            NewAuditEntry::new(Actor::token(&admin), AuditAction::QueueSettings)
                .target("mail")
                .detail("paused=true"),
        )
        .await
        .expect("append");
    assert!(first.id < second.id && second.id < third.id, "ids grow");

    let all = h
        .store
        .audit_list(AuditListParams::default())
        .await
        .expect("list");
    assert_eq!(all, vec![third.clone(), second.clone(), first.clone()]);
    assert_eq!(all[1].actor, conveyor_core::access::ANONYMOUS);
    assert_eq!(all[1].actor_token_id, None);
    assert_eq!(all[1].detail.as_deref(), Some("queue=mail"));

    let page = h
        .store
        .audit_list({
            let mut params = AuditListParams::default();
            params.limit = 1;
            params.before = Some(third.id);
            params.action = None;
            params
        })
        .await
        .expect("page");
    assert_eq!(page, vec![second.clone()]);
    let enqueues = h
        .store
        .audit_list({
            let mut params = AuditListParams::default();
            params.limit = 10;
            params.before = None;
            params.action = Some(AuditAction::JobEnqueue);
            params
        })
        .await
        .expect("filtered");
    assert_eq!(enqueues, vec![first.clone()]);
    let none_before = h
        .store
        .audit_list({
            let mut params = AuditListParams::default();
            params.limit = 10;
            params.before = Some(first.id);
            params.action = None;
            params
        })
        .await
        .expect("empty page");
    assert!(none_before.is_empty());
}

/// Retention of the audit log: `audit_prune` deletes the oldest entries stamped before its
/// cutoff, at most `limit` at a time, by a moment or by an age on the store's clock, and
/// leaves every newer entry whole.
pub async fn audit_prune_deletes_the_oldest_entries_before_the_cutoff(h: &Harness) {
    let mut appended = Vec::new();
    for n in 0..5 {
        let entry = h
            .store
            .audit_append(
                NewAuditEntry::new(Actor::anonymous(), AuditAction::JobEnqueue)
                    .target(format!("queue-{n}")),
            )
            .await
            .expect("append");
        appended.push(entry);
        h.advance(secs(10));
    }
    // Entries at t, t+10, ..., t+40; now is t+50.
    let none = h
        .store
        .audit_prune(conveyor_core::AuditCutoff::Before(appended[0].at), 100)
        .await
        .expect("prune nothing");
    assert_eq!(none, 0, "no entry is older than the first");

    // Before t+25: three entries qualify, two per statement.
    let cutoff = appended[2].at + chrono::Duration::seconds(5);
    let first = h
        .store
        .audit_prune(conveyor_core::AuditCutoff::Before(cutoff), 2)
        .await
        .expect("prune");
    assert_eq!(first, 2, "at most `limit` a statement");
    let left = h
        .store
        .audit_list(AuditListParams::default())
        .await
        .expect("list");
    assert_eq!(
        left,
        appended[2..].iter().rev().cloned().collect::<Vec<_>>(),
        "the oldest go first"
    );
    let second = h
        .store
        .audit_prune(conveyor_core::AuditCutoff::Before(cutoff), 2)
        .await
        .expect("prune");
    assert_eq!(second, 1);
    let again = h
        .store
        .audit_prune(conveyor_core::AuditCutoff::Before(cutoff), 2)
        .await
        .expect("prune");
    assert_eq!(again, 0, "nothing more before the cutoff");

    // By age on the store's clock: older than 15 s at t+50 is before t+35 (the entry at t+30).
    let by_age = h
        .store
        .audit_prune(conveyor_core::AuditCutoff::OlderThan(secs(15)), 100)
        .await
        .expect("prune by age");
    assert_eq!(by_age, 1);
    let left = h
        .store
        .audit_list(AuditListParams::default())
        .await
        .expect("list");
    assert_eq!(left, vec![appended[4].clone()], "the newest stays whole");
    // An age past 1970 deletes nothing and is no error.
    let ancient = h
        .store
        .audit_prune(
            conveyor_core::AuditCutoff::OlderThan(std::time::Duration::from_secs(u64::MAX / 4)),
            100,
        )
        .await
        .expect("prune by a huge age");
    assert_eq!(ancient, 0);
}
