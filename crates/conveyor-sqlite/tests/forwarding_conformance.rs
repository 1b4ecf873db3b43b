//! The whole conformance suite through a decorator that forwards every part of `Store` with
//! `conveyor_core::delegate_store!`: the macro's forwarding must change nothing a store promises
//! (a part forwarded to the wrong method, or an argument dropped, fails a behaviour here).

mod common;

use conveyor_core::Store;
use std::sync::Arc;

/// Changes nothing: every part is forwarded by the macro.
struct ForwardsEverything {
    inner: Arc<dyn Store>,
}

conveyor_core::delegate_store!(ForwardsEverything => inner:
    JobStore, LeaseStore, QueueStore, ScheduleStore, AccessStore, WorkerStore, LeadershipStore,
    FlowStore, KindStore, BreakerStore, StatsStore, CopyStore, ConfigStore);

async fn make_harness() -> conveyor_storetest::Harness {
    common::make_wrapped_harness(|inner| Arc::new(ForwardsEverything { inner })).await
}

conveyor_storetest::conformance_tests!(make_harness);
