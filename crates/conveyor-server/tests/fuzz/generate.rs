//! The generator: a valid request for every route, then mutated.

use super::*;

pub(super) const KINDS: &[&str] = &["fz_email", "fz.report", "fz:sync", "fz-k"];
pub(super) const QUEUES: &[&str] = &["fz", "fz.b", "fz-c:d", "fz_e"];
pub(super) const SETTINGS_QUEUES: &[&str] = &["fz-settings", "fz-settings.2"];
pub(super) const STATES: &[&str] = &[
    "scheduled",
    "available",
    "running",
    "retryable",
    "completed",
    "dead",
    "cancelled",
];
/// Field names of every request body, for "add a known field where it does not belong".
pub(super) const FIELDS: &[&str] = &[
    "kind",
    "payload",
    "queue",
    "priority",
    "run_at",
    "delay_ms",
    "max_attempts",
    "timeout_ms",
    "idempotency_key",
    "tags",
    "tenant",
    "unique",
    "jobs",
    "worker_id",
    "queues",
    "max",
    "lease_ms",
    "wait_ms",
    "lease_token",
    "result",
    "error",
    "retry",
    "retry_after_ms",
    "ids",
    "all",
    "paused",
    "max_depth",
    "rate_limit",
    "weight",
    "cron",
    "timezone",
    "job",
    "overlap",
    "missed",
    "max_catch_up",
    "concurrency",
    "busy",
    "started_at",
    "token",
    "role",
    "name",
];

pub(super) struct Gen {
    pub(super) rng: StdRng,
    /// Raw JSON texts standing in for marker strings (numbers and escapes a `Value` cannot hold).
    pub(super) raws: Vec<String>,
}

impl Gen {
    pub(super) fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.rng.random_range(0..items.len())]
    }

    pub(super) fn chance(&mut self, p: f64) -> bool {
        self.rng.random_bool(p)
    }

    /// A marker string replaced by `text` verbatim after serialization.
    pub(super) fn raw(&mut self, text: impl Into<String>) -> Value {
        self.raws.push(text.into());
        Value::String(format!("\u{1}RAW{}\u{1}", self.raws.len() - 1))
    }

    /// An item learnt from earlier answers (with probability `p`, when there is one). Always
    /// draws the same numbers, so what the servers answered never shifts the random stream.
    pub(super) fn known<T: Clone>(&mut self, list: &[T], p: f64) -> Option<T> {
        let wanted = self.chance(p);
        let at = self.rng.random::<u64>() as usize;
        (wanted && !list.is_empty()).then(|| list[at % list.len()].clone())
    }

    pub(super) fn name(&mut self, names: &[&str]) -> String {
        self.pick(names).to_string()
    }

    pub(super) fn uuid_from_rng(&mut self) -> Uuid {
        uuid::Builder::from_random_bytes(self.rng.random()).into_uuid()
    }

    pub(super) fn payload(&mut self) -> Value {
        match self.rng.random_range(0..5) {
            0 => Value::Null,
            1 => json!({"user": self.rng.random_range(0..1000), "email": "a@example.com"}),
            2 => json!({"nested": {"list": [1, 2.5, "three", null, true], "empty": {}}}),
            3 => json!([1, 2, 3]),
            _ => json!("a plain string"),
        }
    }

    pub(super) fn time_from_now(&mut self) -> String {
        let offset = chrono::Duration::milliseconds(self.rng.random_range(-60_000..600_000));
        (chrono::Utc::now() + offset).to_rfc3339()
    }

    pub(super) fn job(&mut self) -> Value {
        let mut job = Map::new();
        job.insert("kind".into(), json!(self.name(KINDS)));
        if self.chance(0.7) {
            job.insert("payload".into(), self.payload());
        }
        if self.chance(0.8) {
            job.insert("queue".into(), json!(self.name(QUEUES)));
        }
        if self.chance(0.5) {
            job.insert("priority".into(), json!(self.rng.random_range(-10..10)));
        }
        match self.rng.random_range(0..4) {
            0 => {
                job.insert("delay_ms".into(), json!(self.rng.random_range(0..2000)));
            }
            1 => {
                let at = self.time_from_now();
                job.insert("run_at".into(), json!(at));
            }
            _ => {}
        }
        if self.chance(0.5) {
            job.insert("max_attempts".into(), json!(self.rng.random_range(1..6)));
        }
        if self.chance(0.5) {
            job.insert("timeout_ms".into(), json!(self.rng.random_range(1..60_000)));
        }
        if self.chance(0.4) {
            let key = format!("ik-{}", self.rng.random_range(0..40));
            job.insert("idempotency_key".into(), json!(key));
        }
        if self.chance(0.4) {
            job.insert("tags".into(), json!(["t1", "t-2"]));
        }
        if self.chance(0.4) {
            job.insert("tenant".into(), json!(self.name(&["acme", "globex"])));
        }
        if self.chance(0.25) {
            let mut unique = Map::new();
            if self.chance(0.5) {
                unique.insert("args".into(), json!(["user"]));
            }
            if self.chance(0.5) {
                unique.insert("by_queue".into(), json!(self.chance(0.5)));
            }
            if self.chance(0.5) {
                unique.insert(
                    "period_ms".into(),
                    json!(self.rng.random_range(1..3_600_000)),
                );
            }
            if self.chance(0.5) {
                let state = self.name(STATES);
                unique.insert("states".into(), json!(["available", state]));
            }
            job.insert("unique".into(), Value::Object(unique));
        }
        Value::Object(job)
    }

    pub(super) fn lease(&mut self, world: &World) -> (Uuid, Uuid) {
        let fallback = (self.uuid_from_rng(), self.uuid_from_rng());
        self.known(&world.leases, 0.9).unwrap_or(fallback)
    }

    pub(super) fn job_id(&mut self, world: &World) -> String {
        let fallback = self.uuid_from_rng();
        let id = self.known(&world.jobs, 0.8).unwrap_or(fallback);
        self.maybe_bad_segment(id.to_string())
    }

    /// A path segment, sometimes replaced by something hostile.
    pub(super) fn maybe_bad_segment(&mut self, good: String) -> String {
        if !self.chance(0.15) {
            return encode(&good);
        }
        let choices: Vec<String> = vec![
            String::new(),
            "not-a-uuid".into(),
            Uuid::nil().to_string(),
            good.to_uppercase(),
            format!("{{{good}}}"),
            format!("urn:uuid:{good}"),
            format!("{good}x"),
            "%00".into(),
            "a%00b".into(),
            "%F0%9F%9A%80".into(),
            "%FF%FE".into(),
            "%ZZ".into(),
            "%".into(),
            "..".into(),
            "..%2F..%2Fetc%2Fpasswd".into(),
            "x".repeat(5000),
            encode("ünïcödé\u{202e}"),
            "-1".into(),
            "18446744073709551616".into(),
        ];
        let mutated = self.pick(&choices).clone();
        mutated
    }

    pub(super) fn nasty_number(&mut self) -> Value {
        match self.rng.random_range(0..26) {
            0 => json!(0),
            1 => json!(-1),
            2 => json!(1),
            3 => json!(i32::MAX as i64 + 1),
            4 => json!(i32::MIN as i64 - 1),
            5 => json!(u32::MAX),
            6 => json!(u32::MAX as u64 + 1),
            7 => json!(i64::MAX),
            8 => json!(i64::MAX as u64 + 1),
            9 => json!(i64::MIN),
            10 => json!(u64::MAX),
            11 => json!(1e308),
            12 => json!(-1e308),
            13 => json!(0.5),
            14 => json!(-0.0),
            15 => json!(5e-324),
            16 => self.raw("18446744073709551616"),
            17 => self.raw("-9223372036854775809"),
            18 => self.raw("1e400"),
            19 => self.raw("-1e400"),
            20 => {
                let text = *self.pick(&["NaN", "Infinity", "-Infinity", "nan"]);
                self.raw(text)
            }
            21 => {
                let text = *self.pick(&["01", "1.", ".5", "+1", "0x10", "1e", "--1"]);
                self.raw(text)
            }
            22 => self.raw("123456789012345678901234567890"),
            23 => self.raw("1E2"),
            24 => json!(86_400_001),
            _ => json!(self.rng.random::<i64>()),
        }
    }

    pub(super) fn nasty_string(&mut self) -> Value {
        let text: String = match self.rng.random_range(0..30) {
            0 => String::new(),
            1 => " ".into(),
            2 => "\u{0}".into(),
            3 => "a\u{0}b".into(),
            4 => "ünïcödé".into(),
            5 => "🚀🔥".into(),
            6 => "\u{202e}evil".into(),
            7 => "\u{feff}bom".into(),
            8 => "x".repeat(129),
            9 => "x".repeat(513),
            10 => "é".repeat(300),
            11 => "x".repeat(MAX_PAYLOAD + 10),
            12 => "NaN".into(),
            13 => "Infinity".into(),
            14 => "-1".into(),
            15 => "1e308".into(),
            16 => "18446744073709551615".into(),
            17 => "'; DROP TABLE jobs; --".into(),
            18 => "../../etc/passwd".into(),
            19 => "conveyor:owner:00000000000000000000000000000000".into(),
            20 => "\\\"".into(),
            21 => "9999-12-31T23:59:59Z".into(),
            22 => "0000-01-01T00:00:00Z".into(),
            23 => "2024-02-30T00:00:00Z".into(),
            24 => "1970-01-01T00:00:00+23:59".into(),
            25 => "* * * * * * *".into(),
            26 => Uuid::nil().to_string(),
            27 => "%00%zz".into(),
            28 => {
                let text = *self.pick(&["\"\\ud800\"", "\"\\udfff\\ud800\"", "\"\\u0000\""]);
                return self.raw(text);
            }
            _ => "\u{7f}\u{1b}[31m".into(),
        };
        Value::String(text)
    }

    pub(super) fn nasty_value(&mut self) -> Value {
        match self.rng.random_range(0..10) {
            0..=2 => self.nasty_number(),
            3..=5 => self.nasty_string(),
            6 => json!(self.chance(0.5)),
            7 => Value::Null,
            8 => match self.rng.random_range(0..5) {
                0 => json!([]),
                1 => json!({}),
                2 => json!([null]),
                3 => json!({"": null, "\u{0}": 1}),
                _ => json!([self.nasty_string(), self.nasty_number()]),
            },
            _ => self.deep(),
        }
    }

    /// Deeply nested arrays or objects, as raw text (serde_json's limit is 128 levels).
    pub(super) fn deep(&mut self) -> Value {
        let depth = *self.pick(&[20usize, 126, 127, 128, 129, 500, 3000]);
        let text = if self.chance(0.5) {
            format!("{}{}", "[".repeat(depth), "]".repeat(depth))
        } else {
            format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth))
        };
        self.raw(text)
    }

    pub(super) fn huge_array(&mut self, element: Value) -> Value {
        let len = *self.pick(&[100usize, 1000, 2500]);
        Value::Array(vec![element; len])
    }

    /// One structural mutation somewhere in `value`.
    pub(super) fn mutate(&mut self, value: &mut Value, notes: &mut Vec<String>) {
        let mut paths = Vec::new();
        collect_paths(value, &mut Vec::new(), &mut paths);
        let path = self.pick(&paths).clone();
        let at = path_text(&path);
        let op = self.rng.random_range(0..10);
        let Some(node) = node_at(value, &path) else {
            return;
        };
        match op {
            0 | 1 => {
                let nasty = self.nasty_value();
                notes.push(format!("{at} = {}", short(&nasty)));
                *node = nasty;
            }
            2 => {
                if let Some((last, parent_path)) = path.split_last() {
                    if let Some(parent) = node_at(value, parent_path) {
                        match (parent, last) {
                            (Value::Object(map), Seg::Key(key)) => {
                                map.remove(key);
                            }
                            (Value::Array(items), Seg::Index(i)) if *i < items.len() => {
                                items.remove(*i);
                            }
                            _ => {}
                        }
                        notes.push(format!("drop {at}"));
                    }
                }
            }
            3 => {
                if let Value::Object(map) = node {
                    let key = match self.rng.random_range(0..4) {
                        0 => self.name(FIELDS),
                        1 => "ki\u{0}nd".to_string(),
                        2 => "x".repeat(300),
                        _ => "unknown_field".to_string(),
                    };
                    let nasty = self.nasty_value();
                    notes.push(format!("{at}.{key:?} += {}", short(&nasty)));
                    map.insert(key, nasty);
                }
            }
            4 => {
                // Another type for the same thing.
                let swapped = match node.clone() {
                    Value::Number(n) => json!(n.to_string()),
                    Value::String(s) => s
                        .parse::<i64>()
                        .map(|n| json!(n))
                        .unwrap_or_else(|_| json!([s])),
                    Value::Bool(b) => json!(if b { "true" } else { "false" }),
                    Value::Array(items) => {
                        let map: Map<String, Value> = items
                            .into_iter()
                            .enumerate()
                            .map(|(i, v)| (i.to_string(), v))
                            .collect();
                        Value::Object(map)
                    }
                    Value::Object(map) => Value::Array(map.into_values().collect()),
                    Value::Null => json!(0),
                };
                notes.push(format!("{at} retyped to {}", short(&swapped)));
                *node = swapped;
            }
            5 => {
                if let Value::Object(map) = node {
                    if !map.is_empty() {
                        let keys: Vec<String> = map.keys().cloned().collect();
                        let key = self.pick(&keys).clone();
                        let nasty = self.nasty_value();
                        notes.push(format!("duplicate key {at}.{key} = {}", short(&nasty)));
                        map.insert(format!("\u{1}DUP:{key}"), nasty);
                    } else {
                        notes.push(format!("duplicate key {at}.kind"));
                        map.insert("kind".into(), json!("a"));
                        map.insert("\u{1}DUP:kind".into(), json!("b"));
                    }
                }
            }
            6 => {
                let wrapped = match self.rng.random_range(0..4) {
                    0 => json!([]),
                    1 => json!({}),
                    2 => json!([node.clone()]),
                    _ => json!({"v": node.clone()}),
                };
                notes.push(format!("{at} wrapped as {}", short(&wrapped)));
                *node = wrapped;
            }
            7 => {
                let element = match &*node {
                    Value::Array(items) if !items.is_empty() => items[0].clone(),
                    other => other.clone(),
                };
                notes.push(format!("{at} = huge array of {}", short(&element)));
                *node = self.huge_array(element);
            }
            8 => {
                let deep = self.deep();
                notes.push(format!("{at} = deeply nested"));
                *node = deep;
            }
            _ => {
                let nasty = self.nasty_string();
                notes.push(format!("{at} = string {}", short(&nasty)));
                *node = nasty;
            }
        }
    }

    /// Serializes `value` (with markers resolved), then maybe damages the bytes or the headers.
    pub(super) fn finish(&mut self, mut req: Req, value: Option<Value>, mutated: bool) -> Req {
        if let Some(value) = value {
            let mut text = serde_json::to_string(&value).expect("serialize");
            let mut exact = !mutated || !text.contains("\\u0001");
            for (i, raw) in self.raws.iter().enumerate().rev() {
                let marker = format!("\"\\u0001RAW{i}\\u0001\"");
                if text.contains(&marker) {
                    text = text.replace(&marker, raw);
                    exact = false;
                }
            }
            if text.contains("\"\\u0001DUP:") {
                text = text.replace("\"\\u0001DUP:", "\"");
                exact = false;
            }
            req.body = Some(text.into_bytes());
            req.sent = if exact { Some(value) } else { None };
            if !req.headers.iter().any(|(n, _)| n == "content-type") {
                req.headers
                    .push(("content-type".into(), "application/json".into()));
            }
        }
        self.raws.clear();
        if req.body.is_some() && self.chance(0.08) {
            self.damage_bytes(&mut req);
            req.sent = None;
        }
        if self.chance(0.08) {
            let content_type = *self.pick(&[
                "",
                "text/plain",
                "application/x-www-form-urlencoded",
                "multipart/form-data; boundary=x",
                "application/json; charset=utf-16",
                "application/xml",
                "*/*",
            ]);
            req.headers.retain(|(n, _)| n != "content-type");
            if !content_type.is_empty() {
                req.headers
                    .push(("content-type".into(), content_type.to_string()));
            }
            req.mutations.push(format!("content-type {content_type:?}"));
        }
        if self.chance(0.02) {
            let method = *self.pick(&["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]);
            req.mutations.push(format!("method {method}"));
            req.method = method.to_string();
        }
        req
    }

    pub(super) fn damage_bytes(&mut self, req: &mut Req) {
        let body = req.body.get_or_insert_with(Vec::new);
        let note = match self.rng.random_range(0..8) {
            0 => {
                let at = self.rng.random_range(0..=body.len());
                body.truncate(at);
                format!("truncated at {at}")
            }
            1 => {
                let at = self.rng.random_range(0..=body.len());
                let byte = *self.pick(&[0u8, 0xff, 0xc3, 0x80, b'"', b'}', b',', b'\\']);
                body.insert(at, byte);
                format!("byte {byte:#x} inserted at {at}")
            }
            2 => {
                body.splice(0..0, [0xef, 0xbb, 0xbf]);
                "UTF-8 BOM first".into()
            }
            3 => {
                body.extend_from_slice(b" trailing");
                "trailing garbage".into()
            }
            4 => {
                let len = self.rng.random_range(0..64);
                *body = (0..len).map(|_| self.rng.random()).collect();
                "random bytes".into()
            }
            5 => {
                let text = *self.pick(&[
                    "", " ", "null", "[]", "\"s\"", "1", "{", "}", "{\"a\":}", "{}{}", "kind=x",
                    "\u{0}",
                ]);
                *body = text.as_bytes().to_vec();
                format!("body {text:?}")
            }
            6 => {
                // Over the whole-body limit (413 naming `body`).
                let mut big = vec![b' '; BODY_LIMIT + 10];
                big.extend_from_slice(b"{}");
                *body = big;
                "body over the limit".into()
            }
            _ => {
                // Invalid UTF-8 inside a string.
                if let Some(at) = body.iter().position(|b| *b == b'"') {
                    body.insert(at + 1, 0xfe);
                }
                "invalid UTF-8 in a string".into()
            }
        };
        req.mutations.push(note);
    }

    fn query(&mut self, keys: &[&str]) -> String {
        if self.chance(0.3) {
            return String::new();
        }
        let count = self.rng.random_range(1..4);
        let mut parts = Vec::new();
        for _ in 0..count {
            let key = if self.chance(0.85) {
                self.pick(keys).to_string()
            } else {
                self.pick(&["bogus", "", "li%00mit", "state[]", "%ZZ"])
                    .to_string()
            };
            let value = match self.rng.random_range(0..6) {
                0 => {
                    let queue = self.name(QUEUES);
                    encode(&queue)
                }
                1 => {
                    let state = self.name(STATES);
                    encode(&state)
                }
                2 => self.rng.random_range(-2..1200).to_string(),
                3 => self.uuid_from_rng().to_string(),
                4 => match self.nasty_value() {
                    Value::String(s) if !s.starts_with('\u{1}') => encode(&s),
                    Value::Number(n) => encode(&n.to_string()),
                    _ => "%00".into(),
                },
                _ => self
                    .pick(&["", "%", "%G1", "+", "a+b", "%00", "%FF", "==", "&&", "1e3"])
                    .to_string(),
            };
            if key.is_empty() && self.chance(0.5) {
                parts.push(value);
            } else {
                parts.push(format!("{key}={value}"));
            }
        }
        format!("?{}", parts.join("&"))
    }

    /// A request for a random route, valid or mutated.
    pub(super) fn request(&mut self, world: &World) -> Req {
        let route = self.rng.random_range(0..36);
        let (mut req, body) = self.seed(route, world);
        let mut value = body;
        let mut mutated = false;
        if let Some(value) = value.as_mut() {
            let rounds = *self.pick(&[0usize, 0, 1, 1, 1, 2, 3]);
            for _ in 0..rounds {
                self.mutate(value, &mut req.mutations);
                mutated = true;
            }
        }
        self.finish(req, value, mutated)
    }

    /// The valid request of route number `route`, and its JSON body.
    fn seed(&mut self, route: u32, world: &World) -> (Req, Option<Value>) {
        let post = |route, target: String| Req::new(route, "POST", target);
        match route {
            0..=3 => {
                let job = self.job();
                (post("POST /v1/jobs", "/v1/jobs".into()), Some(job))
            }
            4 => {
                let count = self.rng.random_range(1..4);
                let jobs: Vec<Value> = (0..count).map(|_| self.job()).collect();
                (
                    post("POST /v1/jobs/batch", "/v1/jobs/batch".into()),
                    Some(json!({ "jobs": jobs })),
                )
            }
            5..=7 => {
                let mut queues = vec![self.name(QUEUES)];
                if self.chance(0.5) {
                    queues.push(self.name(QUEUES));
                }
                let mut body = json!({
                    "worker_id": format!("fuzz-worker-{}", self.rng.random_range(0..3)),
                    "queues": queues,
                    "max": self.rng.random_range(1..4),
                });
                if self.chance(0.5) {
                    body["lease_ms"] = json!(self.rng.random_range(100..60_000));
                }
                if self.chance(0.3) {
                    body["wait_ms"] = json!(self.rng.random_range(0..50));
                }
                if self.chance(0.3) {
                    body["kinds"] = json!([self.name(KINDS)]);
                }
                if self.chance(0.3) {
                    let (id, token) = self.lease(world);
                    body["complete"] =
                        json!([{"id": id, "lease_token": token, "result": self.payload()}]);
                    body["busy"] = json!(self.rng.random_range(0..4));
                }
                (post("POST /v1/fetch", "/v1/fetch".into()), Some(body))
            }
            8..=17 => {
                let (id, token) = self.lease(world);
                let id = self.maybe_bad_segment(id.to_string());
                let (route, action, body): (&'static str, &str, Value) = match route {
                    8 | 9 => {
                        let mut body = json!({ "lease_token": token });
                        if self.chance(0.5) {
                            body["lease_ms"] = json!(self.rng.random_range(100..60_000));
                        }
                        ("POST /v1/jobs/{id}/heartbeat", "heartbeat", body)
                    }
                    10 | 11 => {
                        let mut body = json!({ "lease_token": token });
                        if self.chance(0.6) {
                            body["result"] = self.payload();
                        }
                        ("POST /v1/jobs/{id}/complete", "complete", body)
                    }
                    12..=14 => {
                        let mut body = json!({
                            "lease_token": token,
                            "error": {"message": "upstream said no"},
                        });
                        if self.chance(0.5) {
                            body["error"]["class"] = json!("upstream_error");
                        }
                        match self.rng.random_range(0..4) {
                            0 => body["retry"] = json!("never"),
                            1 => {
                                body["retry"] = json!("after");
                                body["retry_after_ms"] = json!(self.rng.random_range(0..5000));
                            }
                            2 => body["retry"] = json!("auto"),
                            _ => {}
                        }
                        ("POST /v1/jobs/{id}/fail", "fail", body)
                    }
                    15 => (
                        "POST /v1/jobs/{id}/release",
                        "release",
                        json!({ "lease_token": token }),
                    ),
                    _ => (
                        "POST /v1/jobs/{id}/snooze",
                        "snooze",
                        json!({ "lease_token": token, "delay_ms": self.rng.random_range(0..5000) }),
                    ),
                };
                (post(route, format!("/v1/jobs/{id}/{action}")), Some(body))
            }
            18 => {
                let body = match self.rng.random_range(0..4) {
                    0 => {
                        let fallback = self.uuid_from_rng();
                        let ids = vec![self.known(&world.dead, 1.0).unwrap_or(fallback)];
                        json!({ "ids": ids })
                    }
                    1 => json!({ "queue": self.name(QUEUES) }),
                    2 => json!({ "queue": self.name(QUEUES), "kind": self.name(KINDS) }),
                    _ => json!({ "all": true }),
                };
                (
                    post("POST /v1/dead/replay", "/v1/dead/replay".into()),
                    Some(body),
                )
            }
            19 => {
                let name = self.name(SETTINGS_QUEUES);
                let name = self.maybe_bad_segment(name);
                let mut body = Map::new();
                let fields = [
                    "paused",
                    "max_depth",
                    "max_depth_per_tenant",
                    "concurrency_limit",
                    "per_key_concurrency_limit",
                    "rate_limit",
                    "per_key_rate_limit",
                    "weight",
                    "completed_retention_secs",
                    "dead_retention_secs",
                ];
                for field in fields {
                    if !self.chance(0.4) {
                        continue;
                    }
                    let value = match field {
                        "paused" => json!(self.chance(0.5)),
                        "rate_limit" | "per_key_rate_limit" => json!({
                            "count": self.rng.random_range(1..1000),
                            "period_ms": self.rng.random_range(1..86_400_000),
                        }),
                        _ if self.chance(0.2) => Value::Null,
                        _ => json!(self.rng.random_range(1..100_000)),
                    };
                    body.insert(field.into(), value);
                }
                let req = Req::new("PUT /v1/queues/{name}", "PUT", format!("/v1/queues/{name}"));
                (req, Some(Value::Object(body)))
            }
            20 => {
                let name = format!("fz-sched-{}", self.rng.random_range(0..8));
                let name = self.maybe_bad_segment(name);
                let cron = *self.pick(&[
                    "*/5 * * * *",
                    "0 3 * * MON-FRI",
                    "*/10 * * * * *",
                    "@daily",
                    "0 0 1 1 *",
                    "0 0 L * *",
                    "30 2 * * *",
                ]);
                let mut body = json!({
                    "cron": cron,
                    "job": {"kind": self.name(KINDS), "queue": "fz-sched"},
                });
                if self.chance(0.6) {
                    body["timezone"] = json!(self.name(&[
                        "UTC",
                        "Europe/Berlin",
                        "America/New_York",
                        "Asia/Kolkata",
                        "Australia/Lord_Howe",
                    ]));
                }
                if self.chance(0.5) {
                    body["job"]["payload"] = self.payload();
                    body["job"]["priority"] = json!(self.rng.random_range(-5..5));
                    body["job"]["max_attempts"] = json!(self.rng.random_range(1..10));
                    body["job"]["timeout_ms"] = json!(self.rng.random_range(1..10_000));
                    body["job"]["tags"] = json!(["nightly"]);
                    body["job"]["tenant"] = json!("acme");
                }
                if self.chance(0.5) {
                    body["overlap"] = json!(self.name(&["skip", "allow"]));
                }
                if self.chance(0.5) {
                    body["missed"] = json!("catch_up");
                    body["max_catch_up"] = json!(self.rng.random_range(1..20));
                } else if self.chance(0.3) {
                    body["missed"] = json!("skip");
                }
                let req = Req::new(
                    "PUT /v1/schedules/{name}",
                    "PUT",
                    format!("/v1/schedules/{name}"),
                );
                (req, Some(body))
            }
            21 => {
                let mut body = json!({
                    "worker_id": format!("fuzz-worker-{}", self.rng.random_range(0..3)),
                    "queues": [self.name(QUEUES)],
                    "concurrency": self.rng.random_range(0..16),
                    "started_at": self.time_from_now(),
                });
                if self.chance(0.6) {
                    body["host"] = json!("fuzz-host");
                    body["pid"] = json!(self.rng.random_range(1..100_000));
                    body["busy"] = json!(self.rng.random_range(0..4));
                    body["version"] = json!("0.1.0");
                }
                if self.chance(0.2) {
                    body["stopping"] = json!(true);
                }
                (
                    post("POST /v1/workers/heartbeat", "/v1/workers/heartbeat".into()),
                    Some(body),
                )
            }
            22 => {
                let fallback = format!("cv_{}_{}", Uuid::nil().simple(), "0".repeat(64));
                let token = self.known(&world.secrets, 0.5).unwrap_or(fallback);
                (
                    post("POST /v1/session", "/v1/session".into()),
                    Some(json!({ "token": token })),
                )
            }
            23 => {
                let mut body = json!({ "role": self.name(&["producer", "worker", "admin"]) });
                if self.chance(0.7) {
                    body["name"] = json!(format!("fz-token-{}", self.rng.random_range(0..1000)));
                }
                (post("POST /v1/tokens", "/v1/tokens".into()), Some(body))
            }
            24 => {
                let token = self
                    .known(&world.tokens, 0.7)
                    .unwrap_or_else(|| "fz-no-such-token".into());
                let token = self.maybe_bad_segment(token);
                (
                    Req::new(
                        "DELETE /v1/tokens/{token}",
                        "DELETE",
                        format!("/v1/tokens/{token}"),
                    ),
                    None,
                )
            }
            25 => {
                let id = self.job_id(world);
                let (route, method, target) = match self.rng.random_range(0..3) {
                    0 => ("GET /v1/jobs/{id}", "GET", format!("/v1/jobs/{id}")),
                    1 => (
                        "POST /v1/jobs/{id}/cancel",
                        "POST",
                        format!("/v1/jobs/{id}/cancel"),
                    ),
                    _ => ("DELETE /v1/dead/{id}", "DELETE", format!("/v1/dead/{id}")),
                };
                (Req::new(route, method, target), None)
            }
            26 => {
                let q = self.query(&["queue", "kind", "state", "limit", "after"]);
                (
                    Req::new("GET /v1/jobs", "GET", format!("/v1/jobs{q}")),
                    None,
                )
            }
            27 => {
                let q = self.query(&["queue", "kind", "limit", "after", "state"]);
                (
                    Req::new("GET /v1/dead", "GET", format!("/v1/dead{q}")),
                    None,
                )
            }
            28 => {
                let (route, path, keys): (&'static str, &str, &[&str]) =
                    match self.rng.random_range(0..3) {
                        0 => ("GET /v1/jobs/stuck", "/v1/jobs/stuck", &["queue"]),
                        1 => ("GET /v1/workers", "/v1/workers", &["state"]),
                        _ => ("GET /v1/audit", "/v1/audit", &["limit", "before", "action"]),
                    };
                let q = self.query(keys);
                (Req::new(route, "GET", format!("{path}{q}")), None)
            }
            29 => {
                let name = self
                    .known(&world.schedules, 0.7)
                    .unwrap_or_else(|| "fz-sched-none".into());
                let name = self.maybe_bad_segment(name);
                let (route, method, target) = match self.rng.random_range(0..3) {
                    0 => (
                        "GET /v1/schedules/{name}",
                        "GET",
                        format!("/v1/schedules/{name}"),
                    ),
                    1 => {
                        let q = self.query(&["limit"]);
                        (
                            "GET /v1/schedules/{name}/runs",
                            "GET",
                            format!("/v1/schedules/{name}/runs{q}"),
                        )
                    }
                    _ => (
                        "DELETE /v1/schedules/{name}",
                        "DELETE",
                        format!("/v1/schedules/{name}"),
                    ),
                };
                (Req::new(route, method, target), None)
            }
            30 => {
                let name = self.name(SETTINGS_QUEUES);
                let name = self.maybe_bad_segment(name);
                (
                    Req::new("GET /v1/queues/{name}", "GET", format!("/v1/queues/{name}")),
                    None,
                )
            }
            31 => {
                let (route, method, path) = *self.pick(&[
                    ("GET /v1/queues", "GET", "/v1/queues"),
                    ("GET /v1/schedules", "GET", "/v1/schedules"),
                    ("GET /v1/tokens", "GET", "/v1/tokens"),
                    ("GET /v1/session", "GET", "/v1/session"),
                    ("DELETE /v1/session", "DELETE", "/v1/session"),
                    ("GET /healthz", "GET", "/healthz"),
                    ("GET /metrics", "GET", "/metrics"),
                ]);
                (Req::new(route, method, path.to_string()), None)
            }
            32 => {
                let count = self.rng.random_range(1..4);
                let complete: Vec<Value> = (0..count)
                    .map(|_| {
                        let (id, token) = self.lease(world);
                        json!({"id": id, "lease_token": token, "result": self.payload()})
                    })
                    .collect();
                let (id, token) = self.lease(world);
                let fail = json!([{"id": id, "lease_token": token,
                    "error": {"class": "ValueError", "message": "boom"},
                    "retry": *self.pick(&["auto", "never"])}]);
                (
                    post("POST /v1/ack", "/v1/ack".into()),
                    Some(json!({"complete": complete, "fail": fail})),
                )
            }
            33 => {
                let count = self.rng.random_range(1..4);
                let leases: Vec<Value> = (0..count)
                    .map(|_| {
                        let (id, token) = self.lease(world);
                        json!({"id": id, "lease_token": token})
                    })
                    .collect();
                let mut body = json!({ "leases": leases });
                if self.chance(0.5) {
                    body["lease_ms"] = json!(self.rng.random_range(100..60_000));
                }
                if self.chance(0.5) {
                    body["worker_id"] = json!("fuzz-worker-0");
                }
                (
                    post("POST /v1/heartbeat", "/v1/heartbeat".into()),
                    Some(body),
                )
            }
            _ => {
                // Routes that do not exist, and methods a route does not have.
                let segment = self.maybe_bad_segment("nope".into());
                let (method, target) = self
                    .pick(&[
                        ("GET", format!("/v1/{segment}")),
                        ("PATCH", "/v1/jobs".to_string()),
                        ("DELETE", "/v1/fetch".to_string()),
                        ("PUT", "/v1/jobs/batch".to_string()),
                        ("POST", "/v1/queues".to_string()),
                        ("GET", format!("/v1/jobs/{segment}/complete")),
                        ("POST", format!("/v2/{segment}")),
                        ("OPTIONS", "/v1/jobs".to_string()),
                        ("GET", format!("/ui/{segment}")),
                    ])
                    .clone();
                let mut req = Req::new("unknown route", method, target);
                req.body = Some(b"{}".to_vec());
                (req, None)
            }
        }
    }

    /// Credentials for a request to the auth server.
    pub(super) fn credentials(&mut self, req: &mut Req, server: &Server, world: &World) {
        // The same draws whatever the choice, so the random stream never depends on answers.
        let choice = self.rng.random_range(0..12);
        let session = self.known(&world.sessions, 1.0);
        let damage_at = self.rng.random::<u64>() as usize;
        let malformed = *self.pick(&[
            "Bearer",
            "Bearer ",
            "Basic YWRtaW46YWRtaW4=",
            "bearer cv_x",
            "Bearer cv_00000000000000000000000000000000_00",
            "Bearer cvs_zz",
            "Bearer cv_\u{e9}",
        ]);
        let cookie_len = self.rng.random_range(0..300);
        let bearer =
            |secret: &Option<String>| format!("Bearer {}", secret.as_deref().unwrap_or(""));
        let (name, value, note) = match (choice, session) {
            (0..=4, _) => ("authorization", bearer(&server.admin), "admin token"),
            (5, _) => ("authorization", bearer(&server.producer), "producer token"),
            (6, _) => ("authorization", bearer(&server.worker), "worker token"),
            (7, Some(cookie)) => {
                req.headers.push(("x-conveyor-csrf".into(), "1".into()));
                (
                    "cookie",
                    format!("conveyor_session={cookie}"),
                    "session cookie",
                )
            }
            (8, _) => {
                let mut secret = server.admin.clone().unwrap_or_default();
                let at = damage_at % secret.len();
                secret.replace_range(at..at + 1, "0");
                (
                    "authorization",
                    format!("Bearer {secret}"),
                    "damaged admin token",
                )
            }
            (9, _) => (
                "authorization",
                malformed.to_string(),
                "malformed authorization",
            ),
            (10, _) => (
                "cookie",
                format!("conveyor_session={}; other=1", "x".repeat(cookie_len)),
                "garbage cookie",
            ),
            _ => ("x-nothing", "1".to_string(), "no credentials"),
        };
        req.headers.push((name.to_string(), value));
        req.mutations.push(note.to_string());
    }
}

#[derive(Clone, Debug)]
enum Seg {
    Key(String),
    Index(usize),
}

fn collect_paths(value: &Value, prefix: &mut Vec<Seg>, out: &mut Vec<Vec<Seg>>) {
    out.push(prefix.clone());
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                prefix.push(Seg::Key(key.clone()));
                collect_paths(child, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(items) => {
            // A few elements are enough (arrays may be huge after a mutation).
            for (i, child) in items.iter().enumerate().take(3) {
                prefix.push(Seg::Index(i));
                collect_paths(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

fn node_at<'a>(value: &'a mut Value, path: &[Seg]) -> Option<&'a mut Value> {
    let mut node = value;
    for seg in path {
        node = match (node, seg) {
            (Value::Object(map), Seg::Key(key)) => map.get_mut(key)?,
            (Value::Array(items), Seg::Index(i)) => items.get_mut(*i)?,
            _ => return None,
        };
    }
    Some(node)
}

fn path_text(path: &[Seg]) -> String {
    if path.is_empty() {
        return "(root)".into();
    }
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(&format!("{key:?}"));
            }
            Seg::Index(i) => {
                let _ = write!(out, "[{i}]");
            }
        }
    }
    out
}

fn short(value: &Value) -> String {
    let text = value.to_string();
    if text.len() > 60 {
        let mut end = 60;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}...({} bytes)", &text[..end], text.len())
    } else {
        text
    }
}
