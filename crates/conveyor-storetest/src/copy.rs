//! `conveyor store copy`'s store side (`CopyStore`): what a store exports, it takes back as
//! already held.

use conveyor_core::access::Actor;
use conveyor_core::copy::{copy_all, CopyOptions, RecordKind};
use conveyor_core::{
    AuditAction, AuditListParams, JobListParams, NewAuditEntry, QueueSettings, Role,
};

use crate::kit::{complete, fetch_one, insert, job_in, lease_of, Harness};

/// A copy of a store onto itself reads every record it holds and writes none: each export is
/// taken back by its import as already there (rows are keyed as stored), and nothing read
/// changes, so a copy run twice doubles nothing.
pub async fn copy_onto_itself_reads_everything_and_writes_nothing(h: &Harness) {
    h.store
        .queue_settings_put("copied", {
            let mut settings = QueueSettings::default();
            settings.concurrency_limit = Some(3);
            settings
        })
        .await
        .expect("settings");
    conveyor_core::access::create_token(
        h.store.as_ref(),
        Role::Worker,
        Some("copier".to_string()),
        Actor::anonymous(),
    )
    .await
    .expect("token");
    h.store
        .config_put(
            "sources",
            "orders",
            serde_json::json!({"type": "redis_stream"}),
        )
        .await
        .expect("config");
    insert(h, job_in("copied", "waits")).await;
    insert(h, job_in("copied", "runs")).await;
    let running = fetch_one(h, "copied").await;
    complete(h, lease_of(&running), Some(serde_json::json!({"ok": true}))).await;
    h.store
        .audit_append(
            NewAuditEntry::new(Actor::anonymous(), AuditAction::QueueSettings).target("copied"),
        )
        .await
        .expect("audit");

    let jobs_before = h
        .store
        .jobs_list(JobListParams::default())
        .await
        .expect("jobs");
    let audit_before = h
        .store
        .audit_list(AuditListParams::default())
        .await
        .expect("audit");
    let reports = copy_all(
        h.store.as_ref(),
        h.store.as_ref(),
        CopyOptions::default(),
        |_| {},
    )
    .await
    .expect("copy onto itself");
    for report in &reports {
        assert_eq!(report.written, 0, "{report:?}");
        assert_eq!(report.already_there, report.read, "{report:?}");
    }
    let read = |kind: RecordKind| {
        reports
            .iter()
            .find(|r| r.kind == kind)
            .map_or(0, |r| r.read)
    };
    assert_eq!(read(RecordKind::Jobs), 2, "{reports:?}");
    assert!(read(RecordKind::QueueSettings) >= 1, "{reports:?}");
    assert_eq!(read(RecordKind::Tokens), 1, "{reports:?}");
    assert_eq!(read(RecordKind::Config), 1, "{reports:?}");
    assert_eq!(
        read(RecordKind::Audit),
        audit_before.len() as u64,
        "{reports:?}"
    );
    assert_eq!(
        h.store
            .jobs_list(JobListParams::default())
            .await
            .expect("jobs"),
        jobs_before,
        "the jobs are as they were"
    );
    assert_eq!(
        h.store
            .audit_list(AuditListParams::default())
            .await
            .expect("audit"),
        audit_before,
        "the audit log is as it was"
    );
}
