use super::*;

fn key(byte: u8) -> String {
    BASE64.encode([byte; 32])
}

#[test]
fn keys_parse_newest_first_and_refuse_bad_entries() {
    let keys = PayloadKeys::parse(&format!("k2:{}, k1:{}", key(2), key(1))).expect("keys");
    assert_eq!(keys.current_id(), "k2");
    for (spec, says) in [
        ("".to_string(), "no keys"),
        (format!("k1{}", key(1)), "not id:base64key"),
        ("k1:not base64!".to_string(), "not valid base64"),
        (
            format!("k1:{}", BASE64.encode([1u8; 16])),
            "must be 32 bytes",
        ),
        (format!("k1:{},k1:{}", key(1), key(2)), "listed twice"),
        (format!("bad id:{}", key(1)), "must be letters"),
    ] {
        let error = PayloadKeys::parse(&spec).expect_err(&spec).to_string();
        assert!(error.contains(says), "{spec}: {error}");
        assert!(!error.contains(&key(1)), "errors never show key material");
    }
}

#[test]
fn sealed_texts_open_fit_the_stores_limits_and_pass_plain_text_through() {
    let keys = PayloadKeys::parse(&format!("k1:{}", key(1))).expect("keys");
    let sealed = keys.seal_text("card 4111 declined").expect("seal");
    assert!(sealed.starts_with("$conveyor_enc:1:k1:"), "{sealed}");
    assert!(!sealed.contains("4111"));
    assert_eq!(
        keys.open_text(sealed.clone()).expect("open"),
        "card 4111 declined"
    );
    // The store's own texts, and texts stored before encryption, are read as they are.
    let plain = "lease held by worker w expired before the job finished".to_string();
    assert_eq!(keys.open_text(plain.clone()).expect("open"), plain);
    // Another key, a cut or a relabelled text does not open.
    let other = PayloadKeys::parse(&format!("k2:{}", key(2))).expect("keys");
    assert!(other
        .open_text(sealed.clone())
        .expect_err("k1")
        .contains("k1"));
    assert!(keys
        .open_text(sealed[..sealed.len() - 4].to_string())
        .is_err());
    assert!(keys.open_text(sealed.replacen(":k1:", ":k2:", 1)).is_err());
    // The capacity is the longest text whose sealed form fits the limit.
    let limit = conveyor_core::job::MAX_BACKTRACE_BYTES;
    let capacity = keys.text_capacity(limit);
    assert!(keys.seal_text(&"x".repeat(capacity)).expect("seal").len() <= limit);
    assert!(
        keys.seal_text(&"x".repeat(capacity + 3))
            .expect("seal")
            .len()
            > limit
    );
}

#[test]
fn sealed_payloads_open_with_any_listed_key_and_detect_tampering() {
    let old = PayloadKeys::parse(&format!("k1:{}", key(1))).expect("keys");
    let payload = json!({"card": "4111 1111 1111 1111", "n": 7});
    let sealed = old.seal(&payload).expect("seal");
    assert!(!sealed.to_string().contains("4111"));
    assert_eq!(sealed["key"], "k1");
    // Rotation: a new key first, the old one still listed.
    let rotated = PayloadKeys::parse(&format!("k2:{},k1:{}", key(2), key(1))).expect("keys");
    assert_eq!(rotated.open(sealed.clone()).expect("open"), payload);
    assert_eq!(rotated.seal(&payload).expect("seal")["key"], "k2");
    // The old key removed: it no longer opens, and says why.
    let without = PayloadKeys::parse(&format!("k2:{}", key(2))).expect("keys");
    assert!(without
        .open(sealed.clone())
        .expect_err("gone")
        .contains("k1"));
    // Tampering with the data or relabelling the key is detected.
    let mut tampered = sealed.clone();
    let data = tampered["data"].as_str().expect("data").to_string();
    let flipped = if data.starts_with('A') { "B" } else { "A" };
    tampered["data"] = Value::String(format!("{flipped}{}", &data[1..]));
    assert!(old.open(tampered).is_err());
    // Payloads stored before encryption was on pass through.
    assert_eq!(
        old.open(json!({"plain": true})).expect("open"),
        json!({"plain": true})
    );
}
