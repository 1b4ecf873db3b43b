//! One event, many jobs: producers send a named event (`POST /v1/events`), and every
//! subscription to that name (optionally narrowed by a filter on the payload) makes a job of
//! it. The jobs of one event are stored in one transaction (all or none), each keyed
//! `event:{event id}:{subscription}`, so an event sent again with its id makes nothing twice.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ValidationError;
use crate::fields;
use crate::job::{NewJob, DEFAULT_QUEUE};
use crate::sources::read_body;

/// A subscription, as configured (`PUT /v1/subscriptions/{name}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionSpec {
    /// Its name (the path names it).
    #[serde(default, skip_serializing)]
    pub name: String,
    /// The event name it listens to.
    pub event: String,
    /// The job each matching event becomes (its payload: the event's).
    pub job: SubscriptionJob,
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
        fields::name("job.kind", &self.job.kind)?;
        if let Some(queue) = &self.job.queue {
            fields::name("job.queue", queue)?;
        }
        if let Some(tenant) = &self.job.tenant {
            fields::name("job.tenant", tenant)?;
        }
        if self.job.max_attempts == Some(0) {
            return Err(ValidationError::new(
                "job.max_attempts",
                "must be at least 1",
            ));
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

    /// The job `event` (whose id is `event_id`) becomes.
    pub fn job_for(&self, event: &Event, event_id: &str) -> NewJob {
        let mut job = NewJob::new(self.job.kind.clone(), event.payload.clone());
        job.queue = self
            .job
            .queue
            .clone()
            .unwrap_or_else(|| DEFAULT_QUEUE.to_string());
        if let Some(priority) = self.job.priority {
            job.priority = priority;
        }
        job.tenant = self.job.tenant.clone();
        if let Some(max_attempts) = self.job.max_attempts {
            job.max_attempts = max_attempts;
        }
        job.idempotency_key = Some(format!("event:{event_id}:{}", self.name));
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
        let job = pro.job_for(&event(payload.clone()), "e1");
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
    }
}
