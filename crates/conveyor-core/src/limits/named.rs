//! Named limits: cluster-wide rules on how many jobs that share a key may run at once and how
//! many may start per period (`PUT /v1/limits/{name}`). A queue, a kind or a job names the
//! limits it is subject to; at enqueue each job is *stamped* with one limit key per limit
//! (`name:value`, the value taken from the job by the limit's key expression), and a claim
//! takes a job only while every key it carries has room. The stamp is computed here, above
//! the stores and before a payload is encrypted; the stores keep the keys, count them under
//! their claim lock, and ask [`Admission`] which candidates may start.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::MAX_RATE_PERIOD_MS;
use crate::debounce::{FoldKey, FoldRule};
use crate::error::ValidationError;
use crate::fields;
use crate::job::{NewJob, RateLimit};
use crate::sequence::{SequenceKey, SequenceSpec};
use crate::wire::read_body;

/// At most this many limits named on one queue, kind or job.
pub const MAX_LIMIT_NAMES: usize = 8;

/// A key value longer than this many bytes is kept as `sha256:<hex>` of itself, so a large
/// payload field does not make a large index entry; equal values still share a key.
pub const MAX_KEY_VALUE_LEN: usize = 200;

/// Where a limit's key is taken from in a job. A job without a value there (no tenant, a
/// payload without the field, or a field that is not a string, number or boolean) is not
/// subject to the limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyExpr {
    Tenant,
    Kind,
    Queue,
    /// A path into the payload: `payload.customer.id` is `["customer", "id"]`; a segment of
    /// digits indexes an array.
    Payload(Vec<String>),
}

impl KeyExpr {
    /// The key value of `job`, or `None` when the job is not subject.
    pub fn value_of(&self, job: &NewJob) -> Option<String> {
        self.value_in(job.tenant.as_deref(), &job.kind, &job.queue, &job.payload)
    }

    /// The key value of a stored job (its payload in the clear), or `None`.
    pub fn value_of_stored(&self, job: &crate::job::Job) -> Option<String> {
        self.value_in(job.tenant.as_deref(), &job.kind, &job.queue, &job.payload)
    }

    fn value_in(
        &self,
        tenant: Option<&str>,
        kind: &str,
        queue: &str,
        payload: &Value,
    ) -> Option<String> {
        let value = match self {
            KeyExpr::Tenant => tenant?.to_string(),
            KeyExpr::Kind => kind.to_string(),
            KeyExpr::Queue => queue.to_string(),
            KeyExpr::Payload(path) => {
                let mut at = payload;
                for segment in path {
                    at = match at {
                        Value::Object(map) => map.get(segment)?,
                        Value::Array(items) => items.get(segment.parse::<usize>().ok()?)?,
                        _ => return None,
                    };
                }
                match at {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    Value::Bool(b) => b.to_string(),
                    _ => return None,
                }
            }
        };
        if value.is_empty() {
            return None;
        }
        if value.len() > MAX_KEY_VALUE_LEN {
            let digest = Sha256::digest(value.as_bytes());
            let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
            return Some(format!("sha256:{hex}"));
        }
        Some(value)
    }
}

impl FromStr for KeyExpr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "tenant" => return Ok(KeyExpr::Tenant),
            "kind" => return Ok(KeyExpr::Kind),
            "queue" => return Ok(KeyExpr::Queue),
            _ => {}
        }
        let Some(path) = text.strip_prefix("payload.") else {
            return Err(format!(
                "{text:?} is not a key: use tenant, kind, queue or payload.<field>[.<field>...]"
            ));
        };
        let segments: Vec<String> = path.split('.').map(str::to_string).collect();
        if segments.len() > 8 {
            return Err("a payload path has at most 8 fields".into());
        }
        for segment in &segments {
            let fine = !segment.is_empty()
                && segment
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
            if !fine {
                return Err(format!(
                    "payload path field {segment:?} must be 1 or more of letters, digits, '_', '-'"
                ));
            }
        }
        Ok(KeyExpr::Payload(segments))
    }
}

impl fmt::Display for KeyExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyExpr::Tenant => f.write_str("tenant"),
            KeyExpr::Kind => f.write_str("kind"),
            KeyExpr::Queue => f.write_str("queue"),
            KeyExpr::Payload(path) => write!(f, "payload.{}", path.join(".")),
        }
    }
}

impl Serialize for KeyExpr {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for KeyExpr {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A limit, as configured (`PUT /v1/limits/{name}`): at most `concurrency` jobs of one key
/// running at once, at most `rate.count` started within any `rate.period_ms`, or both. Without
/// a `key` the limit has one key: every job subject to it shares the budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSpec {
    /// Its name (the path names it).
    #[serde(default, skip_serializing)]
    pub name: String,
    #[serde(
        default,
        deserialize_with = "crate::wire::non_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub concurrency: Option<u64>,
    #[serde(
        default,
        deserialize_with = "crate::wire::non_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub rate: Option<RateLimit>,
    #[serde(
        default,
        deserialize_with = "crate::wire::non_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub key: Option<KeyExpr>,
    /// Round-robin weights by key value: a key weighing 3 gets three starts per turn where
    /// the others (weighing 1) get one. Only for a limit with a key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub weights: BTreeMap<String, u32>,
}

impl LimitSpec {
    /// Reads and checks a limit named `name` from a request's JSON body; errors name the field.
    pub fn from_json(name: &str, body: Value) -> Result<Self, ValidationError> {
        let mut spec: LimitSpec = read_body(body, "concurrency")?;
        spec.name = name.to_string();
        spec.validate()?;
        Ok(spec)
    }

    pub fn validate(&self) -> Result<(), ValidationError> {
        limit_name("name", &self.name)?;
        if self.concurrency.is_none() && self.rate.is_none() {
            return Err(ValidationError::new(
                "concurrency",
                "a limit needs concurrency, rate or both",
            ));
        }
        if let Some(concurrency) = self.concurrency {
            fields::stored_integer("concurrency", concurrency)?;
        }
        if let Some(rate) = self.rate {
            fields::stored_integer("rate.count", rate.count)?;
        }
        if self.concurrency == Some(0) {
            return Err(ValidationError::new(
                "concurrency",
                "must be at least 1 (pause a queue to hold its jobs)",
            ));
        }
        if !self.weights.is_empty() && self.key.is_none() {
            return Err(ValidationError::new(
                "weights",
                "weigh key values of a limit with a key",
            ));
        }
        for (value, weight) in &self.weights {
            // A key value is never empty, and one longer than MAX_KEY_VALUE_LEN is kept as its
            // hash: a weight for either would never apply.
            if value.is_empty() || value.len() > MAX_KEY_VALUE_LEN {
                return Err(ValidationError::new(
                    "weights",
                    format!("a key value weighed must be 1 to {MAX_KEY_VALUE_LEN} bytes"),
                ));
            }
            fields::text_without_nul("weights", value)?;
            if !(1..=MAX_WEIGHT).contains(weight) {
                return Err(ValidationError::new(
                    format!("weights.{value}"),
                    format!("must be between 1 and {MAX_WEIGHT}"),
                ));
            }
        }
        if let Some(rate) = self.rate {
            if rate.count == 0 {
                return Err(ValidationError::new("rate.count", "must be at least 1"));
            }
            if rate.period_ms == 0 || rate.period_ms > MAX_RATE_PERIOD_MS {
                return Err(ValidationError::new(
                    "rate.period_ms",
                    format!("must be between 1 and {MAX_RATE_PERIOD_MS} (a day)"),
                ));
            }
        }
        Ok(())
    }

    /// How many more jobs of one key may start, given its running jobs and its starts within
    /// the rate period.
    pub fn room(&self, running: u64, recent_starts: u64) -> u64 {
        let mut room = u64::MAX;
        if let Some(concurrency) = self.concurrency {
            room = room.min(concurrency.saturating_sub(running));
        }
        if let Some(rate) = self.rate {
            room = room.min(rate.count.saturating_sub(recent_starts));
        }
        room
    }
}

/// The round-robin weight of limit key `key` under `specs`: its value's weight in its limit's
/// `weights`, 1 when the limit weighs it not (or is gone).
pub fn weight(specs: &BTreeMap<String, LimitSpec>, key: &str) -> u32 {
    let (name, value) = split_limit_key(key);
    specs
        .get(name)
        .and_then(|spec| spec.weights.get(value).copied())
        .unwrap_or(1)
}

/// The largest round-robin weight of a key value.
pub const MAX_WEIGHT: u32 = 1000;

/// The round-robin key of a job holding `keys`: its first key of a limit with a key (an
/// unkeyed limit's key ends in ':'), so the jobs of each customer (or tenant, or whatever the
/// first keyed limit names) take turns. `None`: the job holds no such key.
pub fn fair_key(keys: &[String]) -> Option<&str> {
    keys.iter()
        .map(String::as_str)
        .find(|key| !split_limit_key(key).1.is_empty())
}

/// A limit's name: a [`fields::name`] without ':', which separates the name from the value in
/// a limit key.
pub fn limit_name(field: &str, name: &str) -> Result<(), ValidationError> {
    fields::name(field, name)?;
    if name.contains(':') {
        return Err(ValidationError::new(
            field,
            "contains illegal character ':'; allowed are letters, digits, '_', '-', '.'",
        ));
    }
    Ok(())
}

/// Checks a list of limit names given in queue, kind or job settings (`field` is its name).
pub fn limit_names(field: &str, names: &[String]) -> Result<(), ValidationError> {
    if names.len() > MAX_LIMIT_NAMES {
        return Err(ValidationError::new(
            field,
            format!("names at most {MAX_LIMIT_NAMES} limits"),
        ));
    }
    for (index, name) in names.iter().enumerate() {
        limit_name(&format!("{field}[{index}]"), name)?;
        if names[..index].contains(name) {
            return Err(ValidationError::new(
                format!("{field}[{index}]"),
                format!("names {name:?} twice"),
            ));
        }
    }
    Ok(())
}

/// The key a job holds under limit `name` with key value `value` (`None` for a limit without
/// a key): `name:value`. Limit names have no ':', so the first one splits it.
pub fn limit_key(name: &str, value: Option<&str>) -> String {
    format!("{name}:{}", value.unwrap_or(""))
}

/// The limit name and key value of a limit key (value `""` for a limit without a key).
pub fn split_limit_key(key: &str) -> (&str, &str) {
    key.split_once(':').unwrap_or((key, ""))
}

/// Checks a sequence as configured: its key must be a key expression (field `<field>.key`,
/// or `<field>` for the short form).
pub fn sequence(field: &str, spec: &SequenceSpec) -> Result<(), ValidationError> {
    spec.key
        .parse::<KeyExpr>()
        .map(|_| ())
        .map_err(|message| ValidationError::new(field, message))
}

/// The fold `job` enters: its debounce's or throttle's key with the job's value there, within
/// its kind and queue; none when the job has no value for the key.
pub fn fold_key(job: &NewJob) -> Option<FoldKey> {
    let (key, rule) = match (&job.debounce, &job.throttle) {
        (Some(spec), _) => (&spec.key, FoldRule::of_debounce(spec)),
        (None, Some(spec)) => (&spec.key, FoldRule::of_throttle(spec)),
        (None, None) => return None,
    };
    let expression: KeyExpr = key.parse().ok()?;
    let value = expression.value_of(job)?;
    Some(FoldKey {
        key: crate::debounce::fold_key(&job.kind, &job.queue, &expression.to_string(), &value),
        rule,
    })
}

/// Which limits exist and which queues and kinds name them, and the queues' and kinds'
/// sequences: what a job is stamped from. The engine keeps one refreshed from the store about
/// once a second.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LimitBook {
    pub specs: BTreeMap<String, LimitSpec>,
    /// Limit names by queue, from the queues' settings.
    pub queues: BTreeMap<String, Vec<String>>,
    /// Limit names by kind, from the kinds' settings.
    pub kinds: BTreeMap<String, Vec<String>>,
    /// Sequences by queue, from the queues' settings.
    pub queue_sequences: BTreeMap<String, SequenceSpec>,
    /// Sequences by kind, from the kinds' settings.
    pub kind_sequences: BTreeMap<String, SequenceSpec>,
}

impl LimitBook {
    /// The first of `names` that no limit is defined for, with its position.
    pub fn unknown<'a>(&self, names: &'a [String]) -> Option<(usize, &'a str)> {
        names
            .iter()
            .enumerate()
            .find(|(_, name)| !self.specs.contains_key(name.as_str()))
            .map(|(index, name)| (index, name.as_str()))
    }

    /// The limit keys `job` is subject to: for each limit it names itself (`job.limits`), its
    /// queue names and its kind names, in that order and each once, the key under that limit.
    /// A name no limit is defined for (one deleted since) holds nothing, and a limit whose key
    /// the job has no value for does not apply to it.
    pub fn stamp(&self, job: &NewJob) -> Vec<String> {
        let named = job
            .limits
            .iter()
            .chain(self.queues.get(&job.queue).into_iter().flatten())
            .chain(self.kinds.get(&job.kind).into_iter().flatten());
        let mut keys: Vec<String> = Vec::new();
        let mut seen: Vec<&str> = Vec::new();
        for name in named {
            if seen.contains(&name.as_str()) {
                continue;
            }
            seen.push(name);
            let Some(spec) = self.specs.get(name) else {
                continue;
            };
            let key = match &spec.key {
                None => limit_key(name, None),
                Some(expr) => match expr.value_of(job) {
                    Some(value) => limit_key(name, Some(&value)),
                    None => continue,
                },
            };
            keys.push(key);
        }
        keys
    }

    /// The sequence `job` enters: the one it names, else its kind's, else its queue's; none
    /// when that sequence's key has no value in the job (or the key no longer parses).
    pub fn sequence(&self, job: &NewJob) -> Option<SequenceKey> {
        let spec = job
            .sequence
            .as_ref()
            .or_else(|| self.kind_sequences.get(&job.kind))
            .or_else(|| self.queue_sequences.get(&job.queue))?;
        let expression: KeyExpr = spec.key.parse().ok()?;
        let value = expression.value_of(job)?;
        Some(SequenceKey {
            key: crate::sequence::sequence_key(&expression.to_string(), &value),
            on_dead: spec.on_dead,
        })
    }
}

/// What the jobs under each limit key use now: running jobs, and starts within the limit's
/// rate period. Keys absent from both use nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LimitUsage {
    pub running: HashMap<String, u64>,
    pub recent_starts: HashMap<String, u64>,
}

/// What one key of a limit uses now (`GET /v1/limits/{name}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyUsage {
    /// The key value (`""` for a limit without a key).
    pub key: String,
    pub running: u64,
    /// Starts within the rate period (0 for a limit without a rate).
    pub recent_starts: u64,
}

/// What each key of one limit uses, ordered by key value, from its running jobs by limit key
/// (`name:value`) and its starts within the rate period by key value.
pub fn key_usage(
    running: impl IntoIterator<Item = (String, u64)>,
    recent_starts: impl IntoIterator<Item = (String, u64)>,
) -> Vec<KeyUsage> {
    let mut usage: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (key, count) in running {
        let (_, value) = split_limit_key(&key);
        usage.entry(value.to_string()).or_default().0 = count;
    }
    for (value, count) in recent_starts {
        usage.entry(value).or_default().1 = count;
    }
    usage
        .into_iter()
        .map(|(key, (running, recent_starts))| KeyUsage {
            key,
            running,
            recent_starts,
        })
        .collect()
}

/// Candidates held back by each limit in this process since it started (every claim's
/// [`Admission`] adds its own when it ends): `conveyor_limit_throttled_total{limit}`.
static THROTTLED: std::sync::Mutex<BTreeMap<String, u64>> = std::sync::Mutex::new(BTreeMap::new());

/// How many candidates each limit has held back in this process (a candidate passed over by
/// several claims counts once per claim).
pub fn throttled_totals() -> BTreeMap<String, u64> {
    THROTTLED
        .lock()
        .map(|totals| totals.clone())
        .unwrap_or_default()
}

/// The room each limit key has during one claim: a candidate is admitted only if every key it
/// carries has room, and admitting it spends one from each. Built from the limits and their
/// usage counted under the store's claim lock, so the counts include every earlier claim.
/// Dropped, it adds the candidates it held back to [`throttled_totals`].
#[derive(Debug)]
pub struct Admission<'a> {
    specs: &'a BTreeMap<String, LimitSpec>,
    /// Room of the keys looked at so far (keys with usage, and keys admitted).
    room: HashMap<String, u64>,
    /// Candidates refused for a full key, by limit name.
    held_back: BTreeMap<String, u64>,
    /// Keys with waiting jobs passed over whole because they had no room (their jobs are never
    /// read as candidates), by limit name: each counts as one held back.
    passed_over: std::sync::Mutex<BTreeMap<String, u64>>,
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        let Ok(passed_over) = self.passed_over.get_mut() else {
            return;
        };
        if self.held_back.is_empty() && passed_over.is_empty() {
            return;
        }
        if let Ok(mut totals) = THROTTLED.lock() {
            for (limit, count) in self.held_back.iter().chain(passed_over.iter()) {
                *totals.entry(limit.clone()).or_insert(0) += count;
            }
        }
    }
}

impl<'a> Admission<'a> {
    pub fn new(specs: &'a BTreeMap<String, LimitSpec>, usage: &LimitUsage) -> Self {
        let mut room = HashMap::new();
        let keys = usage.running.keys().chain(usage.recent_starts.keys());
        for key in keys {
            if room.contains_key(key) {
                continue;
            }
            let (name, _) = split_limit_key(key);
            if let Some(spec) = specs.get(name) {
                let running = usage.running.get(key).copied().unwrap_or(0);
                let recent = usage.recent_starts.get(key).copied().unwrap_or(0);
                room.insert(key.clone(), spec.room(running, recent));
            }
        }
        Self {
            specs,
            room,
            held_back: BTreeMap::new(),
            passed_over: std::sync::Mutex::new(BTreeMap::new()),
        }
    }

    /// How many jobs of `key`, a key some waiting job holds, a claim may start now; a key with
    /// none is passed over, and counted as held back.
    pub fn budget(&self, key: &str) -> u64 {
        let room = self.room(key);
        if room == 0 {
            let (name, _) = split_limit_key(key);
            if let Ok(mut passed_over) = self.passed_over.lock() {
                *passed_over.entry(name.to_string()).or_insert(0) += 1;
            }
        }
        room
    }

    /// Keys with no room left: candidates carrying one are not worth reading.
    pub fn full(&self) -> Vec<String> {
        let mut full: Vec<String> = self
            .room
            .iter()
            .filter(|(_, room)| **room == 0)
            .map(|(key, _)| key.clone())
            .collect();
        full.sort_unstable();
        full
    }

    /// Whether a candidate carrying `keys` may start now; if so, its start is counted.
    pub fn admit(&mut self, keys: &[String]) -> bool {
        for key in keys {
            let (name, _) = split_limit_key(key);
            let Some(spec) = self.specs.get(name) else {
                continue;
            };
            let room = *self
                .room
                .entry(key.clone())
                .or_insert_with(|| spec.room(0, 0));
            if room == 0 {
                *self.held_back.entry(name.to_string()).or_insert(0) += 1;
                return false;
            }
        }
        for key in keys {
            if let Some(room) = self.room.get_mut(key) {
                *room = room.saturating_sub(1);
            }
        }
        true
    }

    /// How many more jobs holding `key` may start now.
    pub fn room(&self, key: &str) -> u64 {
        if let Some(room) = self.room.get(key) {
            return *room;
        }
        let (name, _) = split_limit_key(key);
        self.specs
            .get(name)
            .map_or(u64::MAX, |spec| spec.room(0, 0))
    }

    /// Candidates refused so far, by limit name.
    pub fn held_back(&self) -> &BTreeMap<String, u64> {
        &self.held_back
    }

    /// The keys of `keys` whose limit counts starts per period (their starts are recorded).
    pub fn rated<'k>(&'k self, keys: &'k [String]) -> impl Iterator<Item = &'k str> + 'k {
        keys.iter().map(String::as_str).filter(|key| {
            let (name, _) = split_limit_key(key);
            self.specs.get(name).is_some_and(|spec| spec.rate.is_some())
        })
    }
}

/// The rate-start rows of limits are kept beside the queues' ones under this prefix and the
/// limit's name (queue names cannot hold '@'), with the key value as scope.
pub fn rate_scope_of(key: &str) -> (String, &str) {
    let (name, value) = split_limit_key(key);
    (format!("@{name}"), value)
}

/// The limit whose rate-start rows are kept under `queue` (see [`rate_scope_of`]).
pub fn limit_of_rate_scope(queue: &str) -> Option<&str> {
    queue.strip_prefix('@')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(name: &str, body: Value) -> LimitSpec {
        LimitSpec::from_json(name, body).expect("a valid limit")
    }

    fn book(specs: Vec<LimitSpec>) -> LimitBook {
        LimitBook {
            specs: specs.into_iter().map(|s| (s.name.clone(), s)).collect(),
            ..LimitBook::default()
        }
    }

    #[test]
    fn keys_come_from_tenant_kind_queue_or_a_payload_path() {
        let mut job = NewJob::new("sync", json!({"customer": {"id": 42}, "tags": ["a", "b"]}));
        job.tenant = Some("acme".into());
        let value = |expr: &str| expr.parse::<KeyExpr>().expect("expr").value_of(&job);
        assert_eq!(value("tenant").as_deref(), Some("acme"));
        assert_eq!(value("kind").as_deref(), Some("sync"));
        assert_eq!(value("queue").as_deref(), Some("default"));
        assert_eq!(value("payload.customer.id").as_deref(), Some("42"));
        assert_eq!(value("payload.tags.1").as_deref(), Some("b"));
        assert_eq!(value("payload.customer"), None, "an object is no key");
        assert_eq!(value("payload.missing"), None);
        let long = NewJob::new("k", json!({"v": "x".repeat(500)}));
        let hashed = "payload.v"
            .parse::<KeyExpr>()
            .expect("expr")
            .value_of(&long);
        assert!(hashed.is_some_and(|v| v.starts_with("sha256:") && v.len() == 71));
    }

    #[test]
    fn bad_limits_are_refused_naming_the_field() {
        let field =
            |name: &str, body: Value| LimitSpec::from_json(name, body).expect_err("refused").field;
        assert_eq!(field("a", json!({})), "concurrency");
        assert_eq!(field("a", json!({"concurrency": 0})), "concurrency");
        assert_eq!(
            field("a", json!({"rate": {"count": 0, "period_ms": 10}})),
            "rate.count"
        );
        assert_eq!(
            field("a", json!({"rate": {"count": 1, "period_ms": 0}})),
            "rate.period_ms"
        );
        assert_eq!(
            field("a", json!({"concurrency": 1, "key": "payload."})),
            "key"
        );
        assert_eq!(
            field("a", json!({"concurrency": 1, "key": "customer"})),
            "key"
        );
        assert_eq!(field("a:b", json!({"concurrency": 1})), "name");
        assert_eq!(
            field("a", json!({"concurrency": 1, "weights": {"x": 2}})),
            "weights"
        );
        assert_eq!(
            field(
                "a",
                json!({"concurrency": 1, "key": "tenant", "weights": {"x": 0}})
            ),
            "weights.x"
        );
        assert_eq!(field("a", json!({"concurrency": 1, "colour": 1})), "colour");
        assert_eq!(field("a", json!({"concurrency": 1, "key": null})), "key");
        assert_eq!(field("a", json!({"concurrency": u64::MAX})), "concurrency");
        let names = |list: Vec<&str>| {
            limit_names(
                "limits",
                &list.into_iter().map(String::from).collect::<Vec<_>>(),
            )
            .err()
            .map(|e| e.field)
        };
        assert_eq!(names(vec!["a", "a"]).as_deref(), Some("limits[1]"));
        assert_eq!(names(vec!["a", "b:c"]).as_deref(), Some("limits[1]"));
        assert_eq!(names(vec!["a", "b"]), None);
    }

    #[test]
    fn a_job_is_stamped_once_per_limit_it_is_subject_to() {
        let mut book = book(vec![
            spec(
                "per-customer",
                json!({"concurrency": 10, "key": "payload.customer"}),
            ),
            spec("vendor", json!({"concurrency": 100})),
            spec("per-tenant", json!({"concurrency": 1, "key": "tenant"})),
        ]);
        book.queues
            .insert("calls".into(), vec!["vendor".into(), "gone".into()]);
        book.kinds.insert(
            "sync".into(),
            vec!["per-customer".into(), "per-tenant".into()],
        );
        let mut job = NewJob::new("sync", json!({"customer": "c1"}));
        job.queue = "calls".into();
        job.limits = vec!["vendor".into()];
        assert_eq!(
            book.stamp(&job),
            vec!["vendor:".to_string(), "per-customer:c1".to_string()],
            "named once; a deleted limit and a key the job lacks (tenant) hold nothing"
        );
        assert_eq!(
            book.unknown(&["vendor".into(), "nope".into()]),
            Some((1, "nope"))
        );
    }

    #[test]
    fn several_limits_hold_at_once() {
        let specs: BTreeMap<String, LimitSpec> = [
            spec(
                "per-customer",
                json!({"concurrency": 2, "key": "payload.c"}),
            ),
            spec("total", json!({"concurrency": 3})),
        ]
        .into_iter()
        .map(|s| (s.name.clone(), s))
        .collect();
        let mut usage = LimitUsage::default();
        usage.running.insert("per-customer:a".into(), 1);
        usage.running.insert("total:".into(), 1);
        let mut admission = Admission::new(&specs, &usage);
        assert!(admission.full().is_empty());
        let a = vec!["per-customer:a".to_string(), "total:".to_string()];
        let b = vec!["per-customer:b".to_string(), "total:".to_string()];
        assert!(admission.admit(&a), "a has room for one more");
        assert!(!admission.admit(&a), "a is at 2");
        assert!(admission.admit(&b), "the total has one more");
        assert!(!admission.admit(&b), "the total is at 3, though b has room");
        assert_eq!(admission.full(), vec!["per-customer:a", "total:"]);
        assert_eq!(admission.held_back().get("per-customer"), Some(&1));
        assert_eq!(admission.held_back().get("total"), Some(&1));
        assert!(admission.admit(&[]), "a job under no limit always starts");
        assert!(
            admission.admit(&["deleted:x".to_string()]),
            "a deleted limit holds nothing"
        );
    }

    #[test]
    fn rate_and_concurrency_combine_per_key() {
        let specs: BTreeMap<String, LimitSpec> = [spec(
            "api",
            json!({"concurrency": 5, "rate": {"count": 2, "period_ms": 60000}, "key": "tenant"}),
        )]
        .into_iter()
        .map(|s| (s.name.clone(), s))
        .collect();
        let mut usage = LimitUsage::default();
        usage.recent_starts.insert("api:t1".into(), 2);
        let mut admission = Admission::new(&specs, &usage);
        assert_eq!(admission.full(), vec!["api:t1"]);
        let t2 = vec!["api:t2".to_string()];
        assert!(admission.admit(&t2));
        assert!(admission.admit(&t2));
        assert!(!admission.admit(&t2));
        assert_eq!(admission.rated(&t2).collect::<Vec<_>>(), vec!["api:t2"]);
        assert_eq!(rate_scope_of("api:t2"), ("@api".to_string(), "t2"));
        assert_eq!(admission.room("api:t3"), 2);
        assert_eq!(admission.room("api:t1"), 0);
        let keys = vec![
            "total:".to_string(),
            "api:t1".to_string(),
            "b:x".to_string(),
        ];
        assert_eq!(fair_key(&keys), Some("api:t1"));
        assert_eq!(fair_key(&keys[..1]), None);
        assert_eq!(limit_of_rate_scope("@api"), Some("api"));
    }
}
