//! An event's fan-out, the one place it is done for `POST /v1/events`, the sources and the
//! hooks: the stored subscriptions the event matches, each making a job or a flow
//! (`conveyor_core::subscriptions`), checked as an enqueue is (the request checks, then the
//! kinds' schemas), ready for one [`conveyor_core::FlowStore::events_accept`] call.

use conveyor_core::config::SUBSCRIPTIONS;
use conveyor_core::subscriptions::{Event, SubscriptionSpec, Work};
use conveyor_core::workflow::ValidFlow;
use conveyor_core::{Accepted, Store, StoreError, StoreResult, ValidJob};

use crate::KindRegistry;

/// What one event (or several, [`Fanout::extend`]) makes, by subscription.
#[derive(Debug, Clone, Default)]
pub struct Fanout {
    pub jobs: Vec<ValidJob>,
    /// The subscription that made each of `jobs`.
    pub job_subscriptions: Vec<String>,
    pub flows: Vec<ValidFlow>,
    /// The subscription that made each of `flows`.
    pub flow_subscriptions: Vec<String>,
}

impl Fanout {
    /// Whether the event matched no subscription.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.flows.is_empty()
    }

    pub fn extend(&mut self, other: Fanout) {
        self.jobs.extend(other.jobs);
        self.job_subscriptions.extend(other.job_subscriptions);
        self.flows.extend(other.flows);
        self.flow_subscriptions.extend(other.flow_subscriptions);
    }

    /// Stores everything in one transaction (nothing to store asks nothing of the store).
    pub async fn accept(self, store: &dyn Store) -> StoreResult<Accepted> {
        if self.is_empty() {
            return Ok(Accepted::default());
        }
        store.events_accept(self.jobs, self.flows).await
    }
}

/// The stored subscriptions. One that does not read back as valid is an error of the store
/// (it was checked when stored), not skipped: an event must not silently miss a subscriber.
pub async fn subscriptions(store: &dyn Store) -> StoreResult<Vec<SubscriptionSpec>> {
    let mut specs = Vec::new();
    for entry in store.config_list(SUBSCRIPTIONS).await? {
        let spec = SubscriptionSpec::from_json(&entry.name, entry.document).map_err(|error| {
            StoreError::backend(format!(
                "the stored subscription {} is not valid: {error}",
                entry.name
            ))
        })?;
        specs.push(spec);
    }
    Ok(specs)
}

/// The jobs and flows of every subscription `event` matches, keyed by `event_id`. A job or a
/// flow any check refuses refuses the whole event: `StoreError::Invalid` naming
/// `subscriptions.{name}.{field}`.
pub async fn fan_out(
    subscriptions: &[SubscriptionSpec],
    event: &Event,
    event_id: &str,
    kinds: &KindRegistry,
) -> StoreResult<Fanout> {
    let mut fanout = Fanout::default();
    for spec in subscriptions.iter().filter(|spec| spec.matches(event)) {
        let prefix = format!("subscriptions.{}", spec.name);
        let within = |error: StoreError| within(&prefix, error);
        match spec.work_for(event, event_id) {
            Work::Job(job) => {
                let job = ValidJob::new(job).map_err(|e| within(e.into()))?;
                kinds
                    .check(&job.job().kind, &job.job().payload)
                    .await
                    .map_err(within)?;
                fanout.jobs.push(job);
                fanout.job_subscriptions.push(spec.name.clone());
            }
            Work::Flow(flow) => {
                let flow = ValidFlow::new(flow).map_err(|e| within(flow_field(e.into())))?;
                let places: Vec<String> = flow.step_jobs().map(|(place, _, _)| place).collect();
                kinds
                    .check_all(
                        flow.step_jobs().map(|(_, kind, payload)| (kind, payload)),
                        |index| places.get(index).cloned().unwrap_or_default(),
                    )
                    .await
                    .map_err(|e| within(flow_field(e)))?;
                fanout.flows.push(flow);
                fanout.flow_subscriptions.push(spec.name.clone());
            }
        }
    }
    Ok(fanout)
}

/// `error` with its field named within `prefix` (`prefix.field`, `prefix[0]`), as the
/// server names a part of a request.
fn within(prefix: &str, error: StoreError) -> StoreError {
    match error {
        StoreError::Invalid(error) => StoreError::Invalid(error.within(prefix)),
        other => other,
    }
}

/// A flow's error named as in its subscription (`flow.steps[0].job.kind`). A job's needs no
/// more: its fields are the subscription's `job`'s, and a schema names the payload.
fn flow_field(error: StoreError) -> StoreError {
    within("flow", error)
}
