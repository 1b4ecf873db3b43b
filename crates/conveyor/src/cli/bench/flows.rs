//! `conveyor bench --workload flow`: workflow steps drained through the in-process worker, to
//! compare with the plain drain of the same run; and `--stored-flows`, flows left in the
//! store while the other workloads run, to show they do not slow the plain job path.

use conveyor::workflow::{NewFlow, NewStep, ValidFlow};
use conveyor::{NewJob, Store};
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;

/// Steps of each chain flow.
pub(super) const CHAIN_STEPS: usize = 5;
/// Steps of each fan-out/fan-in flow: one root, its members, one callback.
pub(super) const FAN_STEPS: usize = 100;

fn step_job(queue: &str, flow: usize, step: usize) -> NewJob {
    let mut job = NewJob::new("bench.noop", json!({"flow": flow, "step": step}));
    job.queue = queue.to_string();
    job
}

/// `root`, then `FAN_STEPS - 2` members after it, then `join` after every member.
fn fan_flow(queue: &str, n: usize) -> NewFlow {
    let members: Vec<String> = (1..FAN_STEPS - 1).map(|m| format!("m{m}")).collect();
    let mut flow = NewFlow::new().step(NewStep::job("root", step_job(queue, n, 0)));
    for (i, member) in members.iter().enumerate() {
        flow = flow.step(NewStep::job(member.clone(), step_job(queue, n, i + 1)).after(["root"]));
    }
    flow.step(NewStep::job("join", step_job(queue, n, FAN_STEPS - 1)).after(members))
}

fn chain_flow(queue: &str, n: usize) -> NewFlow {
    NewFlow::chain((0..CHAIN_STEPS).map(|s| (format!("s{s}"), step_job(queue, n, s))))
}

/// Which shape of flow to create.
#[derive(Clone, Copy)]
pub(super) enum Shape {
    Chain,
    Fan,
}

impl Shape {
    pub(super) fn steps(self) -> usize {
        match self {
            Shape::Chain => CHAIN_STEPS,
            Shape::Fan => FAN_STEPS,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Shape::Chain => "flow-chain",
            Shape::Fan => "flow-fan",
        }
    }

    fn flow(self, queue: &str, n: usize) -> NewFlow {
        match self {
            Shape::Chain => chain_flow(queue, n),
            Shape::Fan => fan_flow(queue, n),
        }
    }
}

/// Creates `count` flows of `shape` in `queue` from four concurrent producers; returns seconds.
pub(super) async fn create(
    store: &Arc<dyn Store>,
    shape: Shape,
    queue: &str,
    count: usize,
) -> anyhow::Result<f64> {
    let producers = 4.min(count.max(1));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for p in 0..producers {
        let store = store.clone();
        let queue = queue.to_string();
        tasks.spawn(async move {
            let mut n = p;
            while n < count {
                store
                    .flow_create(ValidFlow::new(shape.flow(&queue, n))?)
                    .await?;
                n += producers;
            }
            Ok::<_, conveyor::StoreError>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Stores `count` flows of ten steps that stay unfinished for the whole bench: each starts
/// with a job in a queue nobody works, then nine steps wait behind it.
pub(super) async fn store_idle(store: &Arc<dyn Store>, count: usize) -> anyhow::Result<f64> {
    let started = Instant::now();
    let queue = format!("bench-idle-flows-{}", uuid::Uuid::new_v4().simple());
    let mut tasks = tokio::task::JoinSet::new();
    let producers = 4.min(count.max(1));
    for p in 0..producers {
        let store = store.clone();
        let queue = queue.clone();
        tasks.spawn(async move {
            let mut n = p;
            while n < count {
                let flow =
                    NewFlow::chain((0..10).map(|s| (format!("s{s}"), step_job(&queue, n, s))));
                store.flow_create(ValidFlow::new(flow)?).await?;
                n += producers;
            }
            Ok::<_, conveyor::StoreError>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(started.elapsed().as_secs_f64())
}
