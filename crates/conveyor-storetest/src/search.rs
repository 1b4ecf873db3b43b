//! Searching jobs (`JobListParams`): id prefix, tag, tenant, creation time range, payload
//! containment, each alone and combined, newest first, page by page with the cursor.

use conveyor_core::{JobListParams, NewJob};
use serde_json::json;

use crate::kit::{ids, insert, list, new_job, secs, span, Harness};

fn params(change: impl FnOnce(&mut JobListParams)) -> JobListParams {
    let mut params = JobListParams::default();
    params.limit = 100;
    change(&mut params);
    params
}

fn job(kind: &str, payload: serde_json::Value, tags: &[&str], tenant: Option<&str>) -> NewJob {
    let mut job = new_job(kind);
    job.payload = payload;
    job.tags = tags.iter().map(|t| t.to_string()).collect();
    job.tenant = tenant.map(str::to_string);
    job
}

/// Every search filter finds exactly its jobs, newest first; filters combine with AND; the
/// cursor pages through a filtered list without repeats or gaps.
pub async fn jobs_are_found_by_id_prefix_tag_tenant_time_and_payload(h: &Harness) {
    let start = h.now();
    let a = insert(
        h,
        job(
            "signup",
            json!({"user": {"id": 7, "plan": "pro"}, "ok": true, "n": 1.5, "list": [1, 2]}),
            &["vip", "eu"],
            Some("acme"),
        ),
    )
    .await;
    h.advance(secs(10));
    let b = insert(
        h,
        job(
            "signup",
            json!({"user": {"id": 8, "plan": "pro"}, "ok": false}),
            &["eu"],
            Some("globex"),
        ),
    )
    .await;
    h.advance(secs(10));
    let c = insert(h, job("invoice", json!({"user": {"id": 7}}), &[], None)).await;

    let found = |p: JobListParams| async move { ids(&list(h, p).await) };
    assert_eq!(
        found(params(|p| p.tag = Some("eu".into()))).await,
        vec![b.id, a.id]
    );
    assert_eq!(
        found(params(|p| p.tag = Some("vip".into()))).await,
        vec![a.id]
    );
    assert_eq!(
        found(params(|p| p.tenant = Some("globex".into()))).await,
        vec![b.id]
    );
    let middle = start + span(secs(10));
    assert_eq!(
        found(params(|p| p.created_after = Some(middle))).await,
        vec![c.id, b.id]
    );
    assert_eq!(
        found(params(|p| p.created_before = Some(middle))).await,
        vec![a.id]
    );
    let payload = |value: serde_json::Value| params(move |p| p.payload = Some(value));
    assert_eq!(
        found(payload(json!({"user": {"id": 7}}))).await,
        vec![c.id, a.id]
    );
    assert_eq!(
        found(payload(json!({"user": {"plan": "pro"}}))).await,
        vec![b.id, a.id]
    );
    assert_eq!(
        found(payload(json!({"ok": true}))).await,
        vec![a.id],
        "booleans"
    );
    assert_eq!(found(payload(json!({"ok": false}))).await, vec![b.id]);
    assert_eq!(
        found(payload(json!({"n": 1.5}))).await,
        vec![a.id],
        "numbers"
    );
    assert_eq!(
        found(payload(json!({"list": [1, 2]}))).await,
        vec![a.id],
        "arrays whole"
    );
    assert!(
        found(payload(json!({"user": {"id": "7"}})))
            .await
            .is_empty(),
        "a string is not 7"
    );
    assert!(
        found(payload(json!({"missing": null}))).await.is_empty(),
        "absent is not null"
    );
    assert_eq!(
        found(payload(json!({}))).await.len(),
        3,
        "an empty object matches any"
    );
    let combined = params(|p| {
        p.kind = Some("signup".into());
        p.payload = Some(json!({"user": {"id": 7}}));
        p.tag = Some("eu".into());
    });
    assert_eq!(found(combined).await, vec![a.id]);

    let text = a.id.to_string();
    for length in [1, 8, 9, 13, 36] {
        let prefix = text[..length].to_string();
        let hits = found(params(|p| p.id_prefix = Some(prefix.clone()))).await;
        assert!(hits.contains(&a.id), "{prefix} finds {}", a.id);
        assert!(
            hits.iter().all(|id| id.to_string().starts_with(&prefix)),
            "{prefix}: {hits:?}"
        );
    }
    assert_eq!(
        found(params(|p| p.id_prefix = Some(text.clone()))).await,
        vec![a.id]
    );

    // Paging a filtered list with the cursor.
    for n in 0..5 {
        insert(h, job("bulk", json!({"n": n}), &["page"], None)).await;
    }
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = found(params(|p| {
            p.tag = Some("page".into());
            p.limit = 2;
            p.after = after;
        }))
        .await;
        if page.is_empty() {
            break;
        }
        after = page.last().copied();
        seen.extend(page);
    }
    assert_eq!(seen.len(), 5, "{seen:?}");
    let mut sorted = seen.clone();
    sorted.sort_unstable_by(|x, y| y.cmp(x));
    assert_eq!(seen, sorted, "newest first, no repeats");
}

/// A payload filter names keys exactly, whatever characters they hold: quotes, backslashes,
/// dots, brackets, control characters, letters that spell an escape (`\b` is a backslash and a
/// `b`, not a backspace), at any depth; and it finds nothing for keys that merely look alike.
pub async fn payload_filters_match_keys_with_quotes_backslashes_and_dots(h: &Harness) {
    let awkward = insert(
        h,
        job(
            "awkward",
            json!({
                "back\\slash": 1,
                "\\b": 2,
                "quo\"te": 3,
                "dot.ted": 4,
                "br[0]": 5,
                "new\nline": 6,
                "outer": {"in\\\"ner": 7, "$.x": 8},
            }),
            &[],
            None,
        ),
    )
    .await;
    let lookalike = insert(
        h,
        job(
            "lookalike",
            json!({
                "backslash": 1,
                "\u{8}": 2,
                "quote": 3,
                "dot": {"ted": 4},
                "br": [5],
                "newline": 6,
                "outer": {"in\"ner": 7, "x": 8},
            }),
            &[],
            None,
        ),
    )
    .await;
    let found = |value: serde_json::Value| async move {
        ids(&list(h, params(move |p| p.payload = Some(value))).await)
    };
    for (filter, expected) in [
        (json!({"back\\slash": 1}), awkward.id),
        (json!({"\\b": 2}), awkward.id),
        (json!({"quo\"te": 3}), awkward.id),
        (json!({"dot.ted": 4}), awkward.id),
        (json!({"br[0]": 5}), awkward.id),
        (json!({"new\nline": 6}), awkward.id),
        (json!({"outer": {"in\\\"ner": 7}}), awkward.id),
        (json!({"outer": {"$.x": 8}}), awkward.id),
        (json!({"\u{8}": 2}), lookalike.id),
        (json!({"dot": {"ted": 4}}), lookalike.id),
        (json!({"outer": {"in\"ner": 7}}), lookalike.id),
    ] {
        assert_eq!(found(filter.clone()).await, vec![expected], "{filter}");
    }
    assert!(
        found(json!({"back\\slash": 2})).await.is_empty(),
        "the key matches, the value does not"
    );
}
