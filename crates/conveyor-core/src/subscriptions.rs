//! One event, many jobs and flows: producers send a named event (`POST /v1/events`), a source
//! or a hook emits one, and every subscription to that name (optionally narrowed by a filter
//! on the payload) makes a job or a flow of it. What one event makes is stored in one
//! transaction (all or none), each keyed `event:{event id}:{subscription}`, so an event sent
//! again with its id makes nothing twice.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ValidationError;
use crate::fields;
use crate::job::{NewJob, DEFAULT_QUEUE};
use crate::wire;
use crate::wire::read_body;
use crate::workflow::{
    FlowFailurePolicy, NewFlow, NewStep, ParentFailurePolicy, StepAction, ValidFlow, WaitSpec,
};

/// A subscription, as configured (`PUT /v1/subscriptions/{name}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionSpec {
    /// Its name (the path names it).
    #[serde(default, skip_serializing)]
    pub name: String,
    /// The event name it listens to.
    pub event: String,
    /// The job each matching event becomes (its payload: the event's); or `flow`.
    #[serde(
        default,
        deserialize_with = "wire::non_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub job: Option<SubscriptionJob>,
    /// The flow each matching event becomes; or `job`.
    #[serde(
        default,
        deserialize_with = "wire::non_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub flow: Option<FlowTemplate>,
    /// Only events whose payload holds every key of this object with the value given
    /// (nested objects recursively; scalars and arrays compared whole).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<Value>,
}

/// The job a subscription makes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionJob {
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
}

/// The flow a subscription makes: the body `POST /v1/flows` takes, less what belongs to one
/// request rather than to every event (the flow's `idempotency_key`, which the event's id
/// gives; a job's run and expiry times, idempotency key, unique rule and trace context). A job
/// step without a `payload` gets the event's payload; a compensation without one gets its
/// step's when it runs, as in any flow.
// Optional fields refuse `null` (as `POST /v1/flows` does): absent is the only way to leave
// one out, so the documented schema and the checks agree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowTemplate {
    #[serde(
        default,
        deserialize_with = "wire::non_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub name: Option<String>,
    pub steps: Vec<StepTemplate>,
    #[serde(
        default,
        deserialize_with = "wire::non_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub on_failure: Option<FlowFailurePolicy>,
    #[serde(
        default,
        deserialize_with = "wire::non_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub tags: Option<Vec<String>>,
}

/// One step of a [`FlowTemplate`]: `job` or `wait`, exactly one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepTemplate {
    pub name: String,
    #[serde(
        default,
        deserialize_with = "wire::non_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub job: Option<JobTemplate>,
    #[serde(
        default,
        deserialize_with = "wire::non_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub wait: Option<WaitTemplate>,
    #[serde(
        default,
        deserialize_with = "wire::non_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub after: Option<Vec<String>>,
    #[serde(
        default,
        deserialize_with = "wire::non_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub on_parent_failure: Option<ParentFailurePolicy>,
    #[serde(
        default,
        deserialize_with = "wire::non_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub compensate: Option<JobTemplate>,
}

/// A wait step of a [`FlowTemplate`] (see [`WaitSpec`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitTemplate {
    pub signal: String,
    #[serde(
        default,
        deserialize_with = "wire::opt_int",
        skip_serializing_if = "Option::is_none"
    )]
    pub timeout_ms: Option<u64>,
}

/// A job of a [`FlowTemplate`]'s step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobTemplate {
    pub kind: String,
    /// Fixed here; absent (or `null`), the event's payload (a compensation's: its step's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    #[serde(
        default,
        deserialize_with = "wire::non_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub queue: Option<String>,
    #[serde(
        default,
        deserialize_with = "wire::opt_int",
        skip_serializing_if = "Option::is_none"
    )]
    pub priority: Option<i32>,
    #[serde(
        default,
        deserialize_with = "wire::opt_int",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_attempts: Option<u32>,
    #[serde(
        default,
        deserialize_with = "wire::opt_int",
        skip_serializing_if = "Option::is_none"
    )]
    pub timeout_ms: Option<u64>,
    #[serde(
        default,
        deserialize_with = "wire::non_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub tags: Option<Vec<String>>,
    #[serde(
        default,
        deserialize_with = "wire::non_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub tenant: Option<String>,
}

/// What a subscription makes of an event.
// Unboxed: one is made per matching subscription and handed on at once.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Work {
    Job(NewJob),
    Flow(NewFlow),
}

/// An event as sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Event {
    pub name: String,
    #[serde(default)]
    pub payload: Value,
    /// The sender's id for it: the same id sent again makes no new jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

impl SubscriptionSpec {
    /// Reads and checks a subscription named `name` from a request's JSON body; errors name
    /// the field.
    pub fn from_json(name: &str, body: Value) -> Result<Self, ValidationError> {
        let mut spec: SubscriptionSpec = read_body(body, "event")?;
        spec.name = name.to_string();
        spec.validate()?;
        Ok(spec)
    }

    pub fn validate(&self) -> Result<(), ValidationError> {
        fields::name("name", &self.name)?;
        fields::name("event", &self.event)?;
        match (&self.job, &self.flow) {
            (Some(job), None) => job.validate()?,
            (None, Some(flow)) => flow.validate()?,
            (Some(_), Some(_)) => {
                return Err(ValidationError::new("flow", "give job or flow, not both"))
            }
            (None, None) => {
                return Err(ValidationError::new(
                    "job",
                    "is required (or flow, to make a flow)",
                ))
            }
        }
        if let Some(filter) = &self.filter {
            if !filter.is_object() {
                return Err(ValidationError::new("filter", "must be a JSON object"));
            }
            fields::json_without_nul("filter", filter)?;
        }
        Ok(())
    }

    /// Whether `event` is one this subscription takes.
    pub fn matches(&self, event: &Event) -> bool {
        self.event == event.name
            && self
                .filter
                .as_ref()
                .is_none_or(|filter| contains(&event.payload, filter))
    }

    /// The idempotency key of what `event` (whose id is `event_id`) makes.
    pub fn key(&self, event_id: &str) -> String {
        format!("event:{event_id}:{}", self.name)
    }

    /// The job or the flow `event` (whose id is `event_id`) becomes.
    pub fn work_for(&self, event: &Event, event_id: &str) -> Work {
        match (&self.job, &self.flow) {
            (_, Some(flow)) => Work::Flow(flow.flow_for(&event.payload, self.key(event_id))),
            (Some(job), None) => Work::Job(job.job_for(&event.payload, self.key(event_id))),
            // A checked subscription has one of them: an unchecked one without makes a job
            // the enqueue checks refuse, naming `job.kind`.
            (None, None) => Work::Job(NewJob::new(String::new(), event.payload.clone())),
        }
    }
}

impl SubscriptionJob {
    fn validate(&self) -> Result<(), ValidationError> {
        fields::name("job.kind", &self.kind)?;
        if let Some(queue) = &self.queue {
            fields::name("job.queue", queue)?;
        }
        if let Some(tenant) = &self.tenant {
            fields::name("job.tenant", tenant)?;
        }
        if self.max_attempts == Some(0) {
            return Err(ValidationError::new(
                "job.max_attempts",
                "must be at least 1",
            ));
        }
        Ok(())
    }

    fn job_for(&self, payload: &Value, key: String) -> NewJob {
        let mut job = NewJob::new(self.kind.clone(), payload.clone());
        job.queue = self
            .queue
            .clone()
            .unwrap_or_else(|| DEFAULT_QUEUE.to_string());
        if let Some(priority) = self.priority {
            job.priority = priority;
        }
        job.tenant = self.tenant.clone();
        if let Some(max_attempts) = self.max_attempts {
            job.max_attempts = max_attempts;
        }
        job.idempotency_key = Some(key);
        job
    }
}

impl FlowTemplate {
    /// Checks the template as a flow made of it would be checked (with a `null` payload for
    /// the event's), naming the field within `flow` (`flow.steps[1].after[0]`).
    fn validate(&self) -> Result<(), ValidationError> {
        for (i, step) in self.steps.iter().enumerate() {
            if step.job.is_some() == step.wait.is_some() {
                return Err(ValidationError::new(
                    format!("flow.steps[{i}]"),
                    "give a step either a job or a wait, not both or neither",
                ));
            }
        }
        ValidFlow::new(self.flow_for(&Value::Null, "event:check".to_string()))
            .map(|_| ())
            .map_err(|error| ValidationError::new(format!("flow.{}", error.field), error.message))
    }

    /// The flow an event with `payload` makes, keyed `key`.
    pub fn flow_for(&self, payload: &Value, key: String) -> NewFlow {
        let mut flow = NewFlow::new();
        flow.name = self.name.clone();
        flow.on_failure = self.on_failure.unwrap_or_default();
        flow.idempotency_key = Some(key);
        flow.tags = self.tags.clone().unwrap_or_default();
        for step in &self.steps {
            let action = match (&step.job, &step.wait) {
                (Some(job), _) => StepAction::Job(job.job_for(Some(payload))),
                (None, Some(wait)) => StepAction::Wait(WaitSpec {
                    signal: wait.signal.clone(),
                    timeout_ms: wait.timeout_ms,
                }),
                // Refused by `validate`; an unchecked one waits for nothing a flow accepts.
                (None, None) => StepAction::Wait(WaitSpec {
                    signal: String::new(),
                    timeout_ms: None,
                }),
            };
            flow.steps.push(NewStep {
                name: step.name.clone(),
                action,
                after: step.after.clone().unwrap_or_default(),
                on_parent_failure: step.on_parent_failure.unwrap_or_default(),
                compensate: step.compensate.as_ref().map(|job| job.job_for(None)),
            });
        }
        flow
    }
}

impl JobTemplate {
    /// The job, its payload the template's, else `default` (else `null`).
    fn job_for(&self, default: Option<&Value>) -> NewJob {
        let payload = self
            .payload
            .clone()
            .or_else(|| default.cloned())
            .unwrap_or(Value::Null);
        let mut job = NewJob::new(self.kind.clone(), payload);
        job.queue = self
            .queue
            .clone()
            .unwrap_or_else(|| DEFAULT_QUEUE.to_string());
        if let Some(priority) = self.priority {
            job.priority = priority;
        }
        if let Some(max_attempts) = self.max_attempts {
            job.max_attempts = max_attempts;
        }
        job.timeout_ms = self.timeout_ms;
        job.tags = self.tags.clone().unwrap_or_default();
        job.tenant = self.tenant.clone();
        job
    }
}

impl Event {
    pub fn validate(&self) -> Result<(), ValidationError> {
        fields::name("name", &self.name)?;
        if let Some(id) = &self.id {
            if id.is_empty() || id.len() > 200 {
                return Err(ValidationError::new("id", "must be 1 to 200 characters"));
            }
            fields::text_without_nul("id", id)?;
        }
        Ok(())
    }
}

/// Whether `value` holds every key of `filter` with the value given (objects recursively).
pub fn contains(value: &Value, filter: &Value) -> bool {
    match (value, filter) {
        (Value::Object(value), Value::Object(filter)) => filter
            .iter()
            .all(|(key, wanted)| value.get(key).is_some_and(|found| contains(found, wanted))),
        (value, filter) => value == filter,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn subscription(filter: Option<Value>) -> SubscriptionSpec {
        let mut body =
            json!({"event": "user.signed_up", "job": {"kind": "email.welcome", "queue": "mail"}});
        if let Some(filter) = filter {
            body["filter"] = filter;
        }
        SubscriptionSpec::from_json("welcome", body).expect("valid")
    }

    fn event(payload: Value) -> Event {
        Event {
            name: "user.signed_up".into(),
            payload,
            id: Some("e1".into()),
        }
    }

    #[test]
    fn an_event_matches_by_name_and_filter_and_keys_its_job() {
        let all = subscription(None);
        let pro = subscription(Some(json!({"plan": "pro", "user": {"country": "FR"}})));
        let payload = json!({"plan": "pro", "user": {"id": 7, "country": "FR"}});
        assert!(all.matches(&event(payload.clone())));
        assert!(pro.matches(&event(payload.clone())));
        assert!(!pro.matches(&event(json!({"plan": "free", "user": {"country": "FR"}}))));
        assert!(!pro.matches(&event(json!({"plan": "pro"}))));
        let other = Event {
            name: "user.deleted".into(),
            ..event(payload.clone())
        };
        assert!(!all.matches(&other));
        let Work::Job(job) = pro.work_for(&event(payload.clone()), "e1") else {
            panic!("a job subscription makes a job");
        };
        assert_eq!(
            (job.kind.as_str(), job.queue.as_str()),
            ("email.welcome", "mail")
        );
        assert_eq!(job.payload, payload);
        assert_eq!(job.idempotency_key.as_deref(), Some("event:e1:welcome"));
    }

    #[test]
    fn a_subscription_is_checked_naming_the_field() {
        let field = |body: Value| SubscriptionSpec::from_json("s", body).unwrap_err().field;
        assert_eq!(field(json!({"job": {"kind": "k"}})), "event");
        assert_eq!(
            field(json!({"event": "no spaces", "job": {"kind": "k"}})),
            "event"
        );
        assert_eq!(
            field(json!({"event": "e", "job": {"kind": ""}})),
            "job.kind"
        );
        assert_eq!(
            field(json!({"event": "e", "job": {"kind": "k"}, "filter": [1]})),
            "filter"
        );
        assert_eq!(
            field(json!({"event": "e", "job": {"kind": "k", "max_attempts": 0}})),
            "job.max_attempts"
        );
        assert_eq!(field(json!({"event": "e"})), "job", "neither job nor flow");
        assert_eq!(field(json!({"event": "e", "job": null})), "job");
        let steps = json!([{"name": "a", "job": {"kind": "k"}}]);
        assert_eq!(
            field(json!({"event": "e", "job": {"kind": "k"}, "flow": {"steps": steps}})),
            "flow",
            "both job and flow"
        );
        assert_eq!(field(json!({"event": "e", "flow": null})), "flow");
    }

    fn flow_subscription(flow: Value) -> Result<SubscriptionSpec, ValidationError> {
        SubscriptionSpec::from_json(
            "onboarding",
            json!({"event": "user.signed_up", "flow": flow}),
        )
    }

    #[test]
    fn a_flow_template_is_checked_as_a_flow_naming_the_field_within_flow() {
        let field = |flow: Value| flow_subscription(flow).unwrap_err().field;
        assert_eq!(field(json!({"steps": []})), "flow.steps");
        assert_eq!(
            field(json!({"steps": [{"name": "a", "job": {"kind": "k"}},
                                   {"name": "b", "job": {"kind": "k"}, "after": ["nope"]}]})),
            "flow.steps[1].after[0]"
        );
        assert_eq!(
            field(json!({"steps": [{"name": "a", "job": {"kind": "no spaces"}}]})),
            "flow.steps[0].job.kind"
        );
        assert_eq!(
            field(json!({"steps": [{"name": "a"}]})),
            "flow.steps[0]",
            "a step with neither job nor wait"
        );
        assert_eq!(
            field(json!({"steps": [{"name": "a", "job": {"kind": "k"}}],
                         "idempotency_key": "mine"})),
            "flow.idempotency_key",
            "the event's id keys the flow"
        );
        assert_eq!(
            field(
                json!({"steps": [{"name": "a", "job": {"kind": "k", "run_at": "2030-01-01T00:00:00Z"}}]})
            ),
            "flow.steps[0].job.run_at"
        );
    }

    #[test]
    fn a_flow_template_makes_a_flow_keyed_by_the_event_with_its_payload() {
        let spec = flow_subscription(json!({
            "name": "onboarding",
            "on_failure": "compensate",
            "steps": [
                {"name": "welcome", "job": {"kind": "email.welcome", "queue": "mail"},
                 "compensate": {"kind": "email.sorry"}},
                {"name": "later", "wait": {"signal": "confirmed", "timeout_ms": 60000},
                 "after": ["welcome"]},
                {"name": "fixed", "job": {"kind": "crm.add", "payload": {"list": "new"}},
                 "after": ["later"]}
            ]
        }))
        .expect("a valid flow subscription");
        let payload = json!({"user": 7});
        let Work::Flow(flow) = spec.work_for(&event(payload.clone()), "e1") else {
            panic!("a flow subscription makes a flow");
        };
        assert_eq!(flow.idempotency_key.as_deref(), Some("event:e1:onboarding"));
        assert_eq!(flow.name.as_deref(), Some("onboarding"));
        assert_eq!(flow.on_failure, FlowFailurePolicy::Compensate);
        let jobs: Vec<(&str, &str, &Value)> = flow
            .steps
            .iter()
            .filter_map(|step| match &step.action {
                StepAction::Job(job) => {
                    Some((step.name.as_str(), job.queue.as_str(), &job.payload))
                }
                StepAction::Wait(_) => None,
            })
            .collect();
        assert_eq!(
            jobs,
            vec![
                ("welcome", "mail", &payload),
                ("fixed", DEFAULT_QUEUE, &json!({"list": "new"}))
            ],
            "a step without a payload takes the event's"
        );
        let compensation = flow.steps[0].compensate.as_ref().expect("a compensation");
        assert_eq!(compensation.payload, Value::Null, "its step's, at run time");
        assert_eq!(flow.steps[1].after, vec!["welcome".to_string()]);
        assert!(ValidFlow::new(flow).is_ok());
        // Stored and read back, the subscription is the same.
        let stored = serde_json::to_value(&spec).expect("serializable");
        assert_eq!(
            SubscriptionSpec::from_json("onboarding", stored).expect("reads back"),
            spec
        );
    }

    /// A source or a hook takes `event` in place of `job`: exactly one, errors naming the
    /// field.
    #[test]
    fn a_source_or_a_hook_emits_an_event_instead_of_a_job() {
        use crate::hooks::HookSpec;
        use crate::sources::{Message, SourceSpec};
        let source = |target: Value| {
            let mut body = json!({"type": "redis_stream", "url": "redis://x", "stream": "s",
                                  "group": "g"});
            for (key, value) in target.as_object().expect("an object") {
                body[key] = value.clone();
            }
            SourceSpec::from_json("signups", body)
        };
        let hook = |target: Value| {
            let mut body = json!({"scheme": "hmac-sha256", "secret": "s"});
            for (key, value) in target.as_object().expect("an object") {
                body[key] = value.clone();
            }
            HookSpec::from_json("crm", body)
        };
        let field = |result: Result<(), ValidationError>| result.unwrap_err().field;
        let checks: [&dyn Fn(Value) -> Result<(), ValidationError>; 2] =
            [&|t: Value| source(t).map(|_| ()), &|t: Value| {
                hook(t).map(|_| ())
            }];
        for check in checks {
            assert_eq!(field(check(json!({}))), "job", "neither");
            assert_eq!(
                field(check(json!({"job": {"kind": "k"}, "event": {"name": "e"}}))),
                "event",
                "both"
            );
            assert_eq!(
                field(check(json!({"event": {"name": "not a name"}}))),
                "event.name"
            );
            assert_eq!(
                field(check(json!({"event": {"name": {"from": "cookie:x"}}}))),
                "event.name"
            );
            assert_eq!(
                field(check(json!({"event": {"name": "e", "kind": "k"}}))),
                "event.kind"
            );
            assert_eq!(field(check(json!({"event": null}))), "event");
            assert!(check(json!({"event": {"name": {"from": "header:X-Event"}}})).is_ok());
        }

        let spec = source(json!({"event": {"name": {"from": "body:/type"}}})).expect("valid");
        let message = |body: &[u8]| Message {
            identity: "1-0".into(),
            body: body.to_vec(),
            ..Message::default()
        };
        let mapped = spec
            .event_for(&message(br#"{"type": "user.signed_up", "user": 7}"#))
            .expect("maps");
        assert_eq!(mapped.event.name, "user.signed_up");
        assert_eq!(mapped.event.id.as_deref(), Some("source:signups:1-0"));
        assert_eq!(mapped.event.payload["user"], json!(7));
        assert!(!mapped.invalid);
        let error = spec.event_for(&message(br#"{"user": 7}"#)).unwrap_err();
        assert_eq!(error.field, "event.name", "{error}");
        let error = spec
            .event_for(&message(br#"{"type": "not a name"}"#))
            .unwrap_err();
        assert_eq!(error.field, "event.name", "{error}");
        assert!(spec.job_for(&message(b"{}")).is_err(), "no job mapping");
        // Stored and read back, the source is the same.
        let stored = serde_json::to_value(&spec).expect("serializable");
        assert!(stored.get("job").is_none(), "{stored}");
        assert_eq!(
            SourceSpec::from_json("signups", stored).expect("reads back"),
            spec
        );

        let spec = hook(json!({"event": {"name": "crm.contact"}, "event_id": "header:x-id"}))
            .expect("valid");
        let headers = [("x-id".to_string(), "d1".to_string())]
            .into_iter()
            .collect();
        let mapped = spec.event_for(&headers, b"not json").expect("maps");
        assert_eq!(mapped.event.id.as_deref(), Some("hook:crm:d1"));
        assert_eq!(mapped.event.name, "crm.contact");
        assert!(mapped.invalid);
        assert!(mapped.event.payload["raw_base64"].is_string());
    }
}
