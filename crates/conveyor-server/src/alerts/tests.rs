use super::*;

fn config() -> AlertConfig {
    let mut config = AlertConfig::new("http://127.0.0.1:9/hook", b"secret".to_vec());
    config.sustain = Duration::from_secs(10);
    config.cooldown = Duration::from_secs(60);
    config.max_depth.add("5", "max depth").expect("threshold");
    config
}

fn queue(name: &str, available: u64, dead: u64) -> QueueStats {
    QueueStats {
        name: name.to_string(),
        available,
        dead,
        ..QueueStats::default()
    }
}

fn kinds(verdict: &Verdict) -> Vec<(AlertKind, String)> {
    verdict
        .alerts
        .iter()
        .map(|a| (a.alert, a.subject.clone()))
        .collect()
}

#[test]
fn thresholds_alert_only_when_sustained_then_cool_down() {
    let mut rules = Evaluator::new(&config());
    let start = Instant::now();
    let at = |secs: u64| start + Duration::from_secs(secs);
    assert!(rules
        .check(at(0), &[queue("q", 9, 0)], &[])
        .alerts
        .is_empty());
    assert!(rules
        .check(at(5), &[queue("q", 9, 0)], &[])
        .alerts
        .is_empty());
    // A dip resets the clock.
    assert!(rules
        .check(at(6), &[queue("q", 1, 0)], &[])
        .alerts
        .is_empty());
    assert!(rules
        .check(at(15), &[queue("q", 9, 0)], &[])
        .alerts
        .is_empty());
    let fired = rules.check(at(25), &[queue("q", 9, 0)], &[]);
    assert_eq!(
        kinds(&fired),
        vec![(AlertKind::QueueDepth, "q".to_string())]
    );
    assert!(rules
        .check(at(30), &[queue("q", 9, 0)], &[])
        .alerts
        .is_empty());
    assert!(rules
        .check(at(84), &[queue("q", 9, 0)], &[])
        .alerts
        .is_empty());
    assert_eq!(
        kinds(&rules.check(at(85), &[queue("q", 9, 0)], &[])),
        vec![(AlertKind::QueueDepth, "q".to_string())],
        "still crossed after the cool-down: alerts again"
    );
}

fn breaker(name: &str, open: bool, opened_secs: i64) -> conveyor_core::StoredBreaker {
    let at = DateTime::<Utc>::from_timestamp(1_800_000_000 + opened_secs, 0).expect("time");
    let mut record = conveyor_core::breaker::BreakerRecord::closed(at);
    if open {
        record.state = conveyor_core::BreakerState::Open;
        record.opened_at = Some(at);
        record.reason = Some("too many failures".to_string());
    }
    conveyor_core::StoredBreaker {
        scope: conveyor_core::BreakerScope::Queue,
        name: name.to_string(),
        version: 1,
        record,
    }
}

#[test]
fn a_breaker_alerts_each_time_it_opens_not_while_it_stays_open() {
    let mut rules = Evaluator::new(&config());
    let start = Instant::now();
    let at = |secs: u64| start + Duration::from_secs(secs);
    let mut check = |secs: u64, breakers: &[conveyor_core::StoredBreaker]| {
        let mut verdict = rules.check(at(secs), &[], &[]);
        rules.check_breakers(at(secs), breakers, &mut verdict);
        verdict
            .alerts
            .iter()
            .map(|a| (a.alert, a.subject.clone()))
            .collect::<Vec<_>>()
    };
    assert!(check(0, &[breaker("old", true, 0)]).is_empty(), "baseline");
    let opened = check(1, &[breaker("old", true, 0), breaker("pay", true, 1)]);
    assert_eq!(
        opened,
        vec![(AlertKind::CircuitOpen, "queue:pay".to_string())]
    );
    assert!(
        check(2, &[breaker("pay", true, 1)]).is_empty(),
        "still open"
    );
    assert!(check(3, &[breaker("pay", false, 1)]).is_empty(), "closed");
    let again = check(200, &[breaker("pay", true, 200)]);
    assert_eq!(again.len(), 1, "opened again after the cool-down");
}

#[test]
fn deaths_alert_once_per_cool_down_and_are_summed() {
    let mut rules = Evaluator::new(&config());
    let start = Instant::now();
    let at = |secs: u64| start + Duration::from_secs(secs);
    // Dead jobs from before are the baseline.
    assert!(rules.check(at(0), &[queue("q", 0, 4)], &[]).dead.is_empty());
    let first = rules.check(at(1), &[queue("q", 0, 5)], &[]);
    assert_eq!(first.dead.len(), 1);
    assert_eq!(first.dead[0].count, 1);
    assert!(rules.check(at(2), &[queue("q", 0, 7)], &[]).dead.is_empty());
    assert!(
        rules.check(at(3), &[queue("q", 0, 2)], &[]).dead.is_empty(),
        "replayed"
    );
    let later = rules.check(at(62), &[queue("q", 0, 3)], &[]);
    assert_eq!(later.dead.len(), 1);
    assert_eq!(
        later.dead[0].count, 3,
        "two held back by the cool-down, one new"
    );
}

#[test]
fn signatures_verify_and_expire() {
    let now = Utc::now();
    let body = br#"{"alert":"job_dead"}"#;
    let signature = sign(b"k", now.timestamp(), body).expect("sign");
    let ts = now.timestamp().to_string();
    let five_min = Duration::from_secs(300);
    assert!(verify(b"k", &ts, &signature, body, now, five_min));
    assert!(!verify(b"other", &ts, &signature, body, now, five_min));
    assert!(!verify(b"k", &ts, &signature, b"{}", now, five_min));
    let later = now + chrono::Duration::seconds(301);
    assert!(
        !verify(b"k", &ts, &signature, body, later, five_min),
        "replayed"
    );
}

/// A receiver on a loopback port answering the given statuses in turn; it reports each
/// request's signature check and alert kind.
fn flaky_receiver(statuses: Vec<u16>) -> (String, std::sync::mpsc::Receiver<(bool, String)>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/", listener.local_addr().expect("addr"));
    let (seen, requests) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for (stream, status) in listener.incoming().zip(statuses) {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut headers = HashMap::new();
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                if let Some((name, value)) = line.trim_end().split_once(':') {
                    headers.insert(name.to_ascii_lowercase(), value.trim().to_string());
                }
                line.clear();
            }
            let length = headers["content-length"].parse().expect("length");
            let mut body = vec![0; length];
            reader.read_exact(&mut body).expect("body");
            let valid = verify(
                b"secret",
                &headers[TIMESTAMP_HEADER],
                &headers[SIGNATURE_HEADER],
                &body,
                Utc::now(),
                Duration::from_secs(300),
            );
            let alert: Value = serde_json::from_slice(&body).expect("JSON");
            let _ = write!(
                stream,
                "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
            let _ = seen.send((valid, alert["alert"].as_str().unwrap_or("").to_string()));
        }
    });
    (url, requests)
}

#[tokio::test]
async fn failed_deliveries_are_retried_with_backoff_then_given_up() {
    let (url, requests) = flaky_receiver(vec![500, 503, 200, 500, 500]);
    let mut config = AlertConfig::new(url, b"secret".to_vec());
    config.retry_base = Duration::from_millis(10);
    config.delivery_attempts = 3;
    let (outbox, inbox) = mpsc::channel(4);
    let stop = CancellationToken::new();
    let delivery = tokio::spawn(deliver(reqwest::Client::new(), config, inbox, stop.clone()));
    let alert = |kind| Alert::new(kind, "q", "test".to_string(), json!({}));
    outbox.try_send(alert(AlertKind::JobDead)).expect("queued");
    outbox.try_send(alert(AlertKind::QueueAge)).expect("queued");
    drop(outbox);
    delivery.await.expect("delivery task");
    let seen: Vec<(bool, String)> = requests.try_iter().collect();
    assert_eq!(
        seen,
        vec![
            (true, "job_dead".to_string()),
            (true, "job_dead".to_string()),
            (true, "job_dead".to_string()),
            (true, "queue_age".to_string()),
            (true, "queue_age".to_string()),
        ],
        "the first alert lands on its third try; the second fails all three (the last \
         finds the receiver gone) and is given up, without blocking the queue"
    );
}

#[test]
fn threshold_settings_parse() {
    let mut t = Thresholds::default();
    t.add("100", "x").expect("default");
    t.add("mail=5", "x").expect("per queue");
    assert_eq!(t.for_queue("mail"), Some(5));
    assert_eq!(t.for_queue("other"), Some(100));
    assert!(t.add("mail=five", "x").is_err());
    assert!(t.add("bad queue=1", "x").is_err());
}
