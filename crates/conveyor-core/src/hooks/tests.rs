use super::*;
use serde_json::json;

fn hook(scheme: &str, secret: &str) -> HookSpec {
    HookSpec::from_json(
        "incoming",
        json!({"scheme": scheme, "secret": secret, "job": {"kind": "hook.received"}}),
    )
    .expect("a valid hook")
}

fn headers(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
        .collect()
}

fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(secs, 0).expect("a time")
}

/// GitHub's published example ("Validating webhook deliveries"): the secret "It's a Secret to
/// Everybody" and the body "Hello, World!".
#[test]
fn github_s_published_example_verifies_and_a_changed_byte_does_not() {
    let github = hook("github", "It's a Secret to Everybody");
    let signed = headers(&[
        (
            "X-Hub-Signature-256",
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
        ),
        ("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
    ]);
    assert_eq!(
        github.verify(
            "It's a Secret to Everybody",
            &signed,
            b"Hello, World!",
            at(0)
        ),
        Ok(())
    );
    assert!(github
        .verify(
            "It's a Secret to Everybody",
            &signed,
            b"Hello, World?",
            at(0)
        )
        .is_err());
    assert!(github
        .verify("another secret", &signed, b"Hello, World!", at(0))
        .is_err());
    assert!(github
        .verify(
            "It's a Secret to Everybody",
            &headers(&[]),
            b"Hello, World!",
            at(0)
        )
        .is_err());
    assert_eq!(
        github.event_id(&signed, b"Hello, World!"),
        "72d3162e-cc78-11e3-81ab-4c9367dc0958"
    );
}

/// The Standard Webhooks specification's example: secret
/// `whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw`, id `msg_p5jXN8AQM9LWM0D4loKWxJek`, timestamp
/// 1614265330, body `{"test": 2432232314}`.
#[test]
fn the_standard_webhooks_example_verifies_within_its_tolerance_only() {
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let standard = hook("standard-webhooks", secret);
    let body = br#"{"test": 2432232314}"#;
    let signed = headers(&[
        ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
        ("webhook-timestamp", "1614265330"),
        (
            "webhook-signature",
            "v1,bm9ldHUjKzFob2VudXRob2VodWUzMjRvdWVvdW9ldQo= v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
        ),
    ]);
    assert_eq!(
        standard.verify(secret, &signed, body, at(1_614_265_330)),
        Ok(())
    );
    assert_eq!(
        standard.verify(secret, &signed, body, at(1_614_265_330 + 299)),
        Ok(())
    );
    assert_eq!(
        standard.verify(secret, &signed, body, at(1_614_265_330 + 301)),
        Err(Refusal::Stale(301))
    );
    assert!(standard
        .verify(secret, &signed, b"{\"test\": 1}", at(1_614_265_330))
        .is_err());
    assert_eq!(
        standard.event_id(&signed, body),
        "msg_p5jXN8AQM9LWM0D4loKWxJek"
    );
}

/// Stripe's scheme as its documentation states it: `t=...,v1=...`, the HMAC-SHA256 (keyed by
/// the whole `whsec_...` secret) of `t.body`; one matching `v1` of several suffices.
#[test]
fn stripe_signatures_verify_by_any_v1_within_the_tolerance() {
    let secret = "whsec_test_secret";
    let stripe = hook("stripe", secret);
    let body = br#"{"id": "evt_1", "object": "event"}"#;
    let mut mac = HmacSha256::new_from_slice(secret.as_bytes()).expect("key");
    mac.update(b"1700000000.");
    mac.update(body);
    let good = hex(&mac.finalize().into_bytes());
    let header = format!("t=1700000000,v1={},v1={good},v0=ignored", "00".repeat(32));
    let signed = headers(&[("Stripe-Signature", &header)]);
    assert_eq!(
        stripe.verify(secret, &signed, body, at(1_700_000_100)),
        Ok(())
    );
    assert_eq!(
        stripe.verify(secret, &signed, body, at(1_700_000_000 - 400)),
        Err(Refusal::Stale(-400))
    );
    let only_bad = headers(&[(
        "Stripe-Signature",
        &format!("t=1700000000,v1={}", "00".repeat(32)),
    )]);
    assert!(stripe
        .verify(secret, &only_bad, body, at(1_700_000_000))
        .is_err());
    assert_eq!(stripe.event_id(&signed, body), "evt_1");
}

#[test]
fn the_generic_scheme_signs_the_body_and_keys_on_its_hash_without_an_event_id() {
    let generic = hook("hmac-sha256", "s3cret");
    let body = br#"{"n": 1}"#;
    let mut mac = HmacSha256::new_from_slice(b"s3cret").expect("key");
    mac.update(body);
    let signed = headers(&[(
        "X-Signature-256",
        &format!("sha256={}", hex(&mac.finalize().into_bytes())),
    )]);
    assert_eq!(generic.verify("s3cret", &signed, body, at(0)), Ok(()));
    let id = generic.event_id(&signed, body);
    assert_eq!(id.len(), 64);
    let mapped = generic.job_for(&signed, body).expect("maps");
    // A kind taken from a header named in any case (the request's are lowercase).
    let by_header = HookSpec::from_json(
        "incoming",
        json!({"scheme": "hmac-sha256", "secret": "s3cret",
               "job": {"kind": {"from": "header:X-Signature-256"}}}),
    )
    .expect("valid");
    assert!(by_header
        .job_for(&signed, body)
        .expect("maps")
        .job
        .kind
        .starts_with("sha256="));
    assert_eq!(
        mapped.job.idempotency_key,
        Some(format!("hook:incoming:{id}"))
    );
    assert_eq!(mapped.job.payload, json!({"n": 1}));
}

#[test]
fn a_hook_is_checked_naming_the_field() {
    let field = |body: serde_json::Value| HookSpec::from_json("h", body).unwrap_err().field;
    assert_eq!(
        field(json!({"scheme": "gitlab", "secret": "x", "job": {"kind": "k"}})),
        "scheme"
    );
    assert_eq!(
        field(json!({"scheme": "github", "job": {"kind": "k"}})),
        "secret"
    );
    assert_eq!(
        field(json!({"scheme": "github", "secret": "x", "secret_env": "Y", "job": {"kind": "k"}})),
        "secret"
    );
    assert_eq!(
        field(json!({"scheme": "standard-webhooks", "secret": "whsec_!!", "job": {"kind": "k"}})),
        "secret"
    );
    assert_eq!(
        field(
            json!({"scheme": "github", "secret": "x", "job": {"kind": "k"}, "event_id": "cookie:x"})
        ),
        "event_id"
    );
    assert_eq!(
        field(
            json!({"scheme": "github", "secret": "x", "job": {"kind": "k"}, "tolerance_secs": 0})
        ),
        "tolerance_secs"
    );
    assert_eq!(
        field(json!({"scheme": "github", "secret": "x", "job": {"kind": ""}})),
        "job.kind"
    );
    assert_eq!(
        field(json!({"scheme": "github", "secret": "x", "job": {"kind": "k"}, "extra": 1})),
        "extra"
    );
}
