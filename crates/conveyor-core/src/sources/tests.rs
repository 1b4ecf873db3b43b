use super::*;

fn spec(job: JobMapping) -> SourceSpec {
    SourceSpec {
        name: "orders".into(),
        broker: BrokerSpec::RedisStream {
            url: Some("redis://127.0.0.1:6379".into()),
            url_env: None,
            stream: "orders".into(),
            group: "conveyor".into(),
            consumer: None,
            body_field: None,
            claim_idle_ms: None,
        },
        job: Some(job),
        event: None,
        max_in_flight: 100,
        start: Start::Earliest,
        on_invalid: OnInvalid::Raw,
        paused: false,
    }
}

fn fixed(kind: &str) -> JobMapping {
    JobMapping {
        kind: Field::Fixed(kind.into()),
        queue: Some(Field::Fixed("orders".into())),
        tenant: None,
        priority: None,
    }
}

fn message(identity: &str, body: &[u8]) -> Message {
    Message {
        identity: identity.into(),
        sent_at: None,
        headers: BTreeMap::from([("X-Kind".to_string(), "order.paid".to_string())]),
        subject: Some("orders.eu".into()),
        body: body.to_vec(),
    }
}

#[test]
fn a_json_message_becomes_a_job_keyed_by_its_identity() {
    let mapped = spec(fixed("order.placed"))
        .job_for(&message("1-0", br#"{"id": 7}"#))
        .expect("maps");
    assert!(!mapped.invalid);
    assert_eq!(mapped.job.kind, "order.placed");
    assert_eq!(mapped.job.queue, "orders");
    assert_eq!(mapped.job.payload, json!({"id": 7}));
    assert_eq!(
        mapped.job.idempotency_key.as_deref(),
        Some("source:orders:1-0")
    );
}

#[test]
fn a_body_that_is_not_json_is_kept_as_base64_with_its_headers() {
    let mapped = spec(fixed("k"))
        .job_for(&message("2-0", b"\xff not json"))
        .expect("maps");
    assert!(mapped.invalid);
    assert_eq!(mapped.job.payload["raw_base64"], json!("/yBub3QganNvbg=="));
    assert_eq!(mapped.job.payload["headers"]["X-Kind"], json!("order.paid"));
}

#[test]
fn parts_are_taken_from_headers_the_subject_and_the_body() {
    let mapping = JobMapping {
        kind: Field::From {
            from: "header:X-Kind".into(),
        },
        queue: Some(Field::From {
            from: "subject".into(),
        }),
        tenant: Some(Field::From {
            from: "body:/customer/id".into(),
        }),
        priority: Some(Field::From {
            from: "body:/rank".into(),
        }),
    };
    let body = br#"{"customer": {"id": "acme"}, "rank": 5}"#;
    let mapped = spec(mapping).job_for(&message("3-0", body)).expect("maps");
    assert_eq!(mapped.job.kind, "order.paid");
    assert_eq!(mapped.job.queue, "orders.eu");
    assert_eq!(mapped.job.tenant.as_deref(), Some("acme"));
    assert_eq!(mapped.job.priority, 5);
}

#[test]
fn a_missing_part_or_a_bad_priority_names_the_field() {
    let mut mapping = fixed("k");
    mapping.tenant = Some(Field::From {
        from: "header:X-Tenant".into(),
    });
    let error = spec(mapping).job_for(&message("4-0", b"{}")).unwrap_err();
    assert_eq!(error.field, "job.tenant");
    let mut mapping = fixed("k");
    mapping.priority = Some(Field::Fixed("high".into()));
    let error = spec(mapping).job_for(&message("4-1", b"{}")).unwrap_err();
    assert_eq!(error.field, "job.priority");
}

#[test]
fn validation_names_the_field_at_fault() {
    let mut bad = spec(fixed("k"));
    bad.max_in_flight = 0;
    assert_eq!(bad.validate().unwrap_err().field, "max_in_flight");
    let mut bad = spec(fixed("k"));
    bad.name = "no spaces".into();
    assert_eq!(bad.validate().unwrap_err().field, "name");
    let mut bad = spec(JobMapping {
        kind: Field::From {
            from: "cookie:x".into(),
        },
        ..fixed("k")
    });
    assert_eq!(bad.validate().unwrap_err().field, "job.kind");
    bad.job = Some(fixed("k"));
    if let BrokerSpec::RedisStream { url, .. } = &mut bad.broker {
        *url = Some("http://x".into());
    }
    assert_eq!(bad.validate().unwrap_err().field, "url");
    assert!(spec(fixed("k")).validate().is_ok());
}

#[test]
fn every_broker_reads_the_issues_example_and_checks_its_fields() {
    let examples = [
        json!({"type": "amqp", "url": "amqp://guest:guest@127.0.0.1:5672/%2f", "queue": "orders"}),
        json!({"type": "nats", "url": "nats://127.0.0.1:4222", "stream": "ORDERS",
               "subject": "orders.>", "consumer": "conveyor"}),
        json!({"type": "mqtt", "url": "mqtt://127.0.0.1:1883", "topic": "orders/#",
               "client_id": "conveyor"}),
        json!({"type": "sqs", "url": "http://127.0.0.1:4566", "queue_url": "http://q",
               "region": "us-east-1"}),
    ];
    for mut example in examples {
        example["name"] = json!("orders");
        example["job"] = json!({"kind": "order.placed", "queue": "orders"});
        let spec: SourceSpec = serde_json::from_value(example.clone()).expect("reads");
        assert!(spec.validate().is_ok(), "{example}");
        assert_eq!(spec.broker.type_name(), example["type"]);
        let mut wrong = example.clone();
        wrong["url"] = json!("ftp://127.0.0.1");
        let spec: SourceSpec = serde_json::from_value(wrong).expect("reads");
        assert_eq!(spec.validate().unwrap_err().field, "url");
    }
    // SQS may go to AWS's own endpoint; the others need a URL.
    let sqs: SourceSpec = serde_json::from_value(json!({"name": "q", "type": "sqs",
        "queue_url": "https://sqs.eu-west-1.amazonaws.com/1/q", "region": "eu-west-1",
        "job": {"kind": "k"}}))
    .expect("reads");
    assert!(sqs.validate().is_ok());
    assert_eq!(sqs.broker.resolve_url(), Ok(None));
    let nats: SourceSpec = serde_json::from_value(json!({"name": "n", "type": "nats",
        "stream": "S", "consumer": "", "url": "nats://x", "job": {"kind": "k"}}))
    .expect("reads");
    assert_eq!(nats.validate().unwrap_err().field, "consumer");
}

#[test]
fn a_kafka_source_names_its_brokers_as_a_list_of_addresses() {
    let mut example = json!({"name": "orders", "type": "kafka", "brokers": "127.0.0.1:9092",
        "topic": "orders", "group": "conveyor", "job": {"kind": "order.placed", "queue": "orders"}});
    let spec: SourceSpec = serde_json::from_value(example.clone()).expect("reads");
    assert!(spec.validate().is_ok());
    assert_eq!(spec.broker.type_name(), "kafka");
    assert_eq!(
        spec.broker.resolve_url(),
        Ok(Some("127.0.0.1:9092".to_string()))
    );
    example["brokers"] = json!("kafka-1.internal:9092,10.0.0.2:9093");
    let spec: SourceSpec = serde_json::from_value(example.clone()).expect("reads");
    assert!(spec.validate().is_ok());
    for bad in [
        "127.0.0.1",
        "a:9092,",
        "kafka://a:9092",
        ":9092",
        "a:99999",
        "a:0",
        "a:9092, b:9093",
        "[::1]:9092",
    ] {
        example["brokers"] = json!(bad);
        let spec: SourceSpec = serde_json::from_value(example.clone()).expect("reads");
        assert_eq!(spec.validate().unwrap_err().field, "brokers", "{bad}");
    }
    example["brokers_env"] = json!("KAFKA_BROKERS");
    let spec: SourceSpec = serde_json::from_value(example.clone()).expect("reads");
    assert_eq!(spec.validate().unwrap_err().field, "brokers");
    example.as_object_mut().map(|o| o.remove("brokers"));
    let spec: SourceSpec = serde_json::from_value(example.clone()).expect("reads");
    assert!(spec.validate().is_ok());
    example.as_object_mut().map(|o| o.remove("brokers_env"));
    let spec: SourceSpec = serde_json::from_value(example.clone()).expect("reads");
    assert_eq!(spec.validate().unwrap_err().field, "brokers");
    example["brokers"] = json!("a:1");
    example["group"] = json!("");
    let spec: SourceSpec = serde_json::from_value(example).expect("reads");
    assert_eq!(spec.validate().unwrap_err().field, "group");
}

#[test]
fn the_configuration_reads_from_toml_and_json_alike() {
    let from_toml: SourceSpec = toml::from_str(
        r#"
        name = "orders"
        type = "redis_stream"
        url = "redis://127.0.0.1:6379"
        stream = "orders"
        group = "conveyor"
        job = { kind = "order.placed", queue = { from = "header:X-Queue" } }
        "#,
    )
    .expect("toml");
    let from_json: SourceSpec = serde_json::from_value(json!({
        "name": "orders", "type": "redis_stream", "url": "redis://127.0.0.1:6379",
        "stream": "orders", "group": "conveyor",
        "job": {"kind": "order.placed", "queue": {"from": "header:X-Queue"}}
    }))
    .expect("json");
    assert_eq!(from_toml, from_json);
    assert_eq!(from_toml.max_in_flight, 1000);
    let unknown = serde_json::from_value::<SourceSpec>(json!({
        "name": "x", "type": "ftp", "job": {"kind": "k"}
    }));
    assert!(unknown.is_err());
}

#[test]
fn a_request_body_is_read_with_errors_naming_the_field() {
    let ok = SourceSpec::from_json(
        "orders",
        json!({"name": "ignored", "type": "redis_stream", "url": "redis://x", "stream": "s",
               "group": "g", "job": {"kind": "k"}, "paused": true}),
    )
    .expect("reads");
    assert_eq!(ok.name, "orders");
    assert!(ok.paused);
    let field = |body: Value| SourceSpec::from_json("orders", body).unwrap_err().field;
    assert_eq!(field(json!([])), "body");
    assert_eq!(
        field(
            json!({"type": "redis_stream", "url": "redis://x", "group": "g", "job": {"kind": "k"}})
        ),
        "stream"
    );
    assert_eq!(field(json!({"type": "ftp", "job": {"kind": "k"}})), "type");
    assert_eq!(
        field(json!({"url": "redis://x", "job": {"kind": "k"}})),
        "type"
    );
    assert_eq!(
        field(
            json!({"type": "amqp", "url": "amqp://x", "queue": "q", "job": {"kind": "k"},
                     "max_in_flight": 0})
        ),
        "max_in_flight"
    );
}

#[test]
fn a_mistyped_field_is_named() {
    let field = |body: Value| SourceSpec::from_json("orders", body).unwrap_err().field;
    let base = json!({"type": "redis_stream", "url": "redis://x", "stream": "s", "group": "g",
                      "job": {"kind": "k"}});
    for (key, value) in [
        ("max_in_flight", json!("many")),
        ("stream", json!(7)),
        ("claim_idle_ms", json!(-1)),
        ("paused", json!("yes")),
        ("job", json!(3)),
    ] {
        let mut body = base.clone();
        body[key] = value;
        assert_eq!(field(body), key);
    }
}
