//! A maintenance leader cut off from its store (a partition, a stalled connection) can neither
//! renew its leadership nor learn that it lost it. It must give the leadership up by itself
//! when the lease would lapse, so it neither acts nor says it leads past it while another node
//! takes over. A store whose calls never answer stands for the cut-off link.

use conveyor_core::{
    LeadershipStore, PruneParams, PruneReport, RescueParams, RescueReport, Store, StoreResult,
};
use conveyor_sqlite::{SqliteOptions, SqliteStore};
use conveyor_storetest::eventually::eventually_within;
use conveyor_worker::Maintenance;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const TTL: Duration = Duration::from_millis(400);

/// Forwards every call, except that once `stall_renewal` (or `stall_pass`) is set, renewing
/// the leadership (or promoting due jobs, the first step of a pass) never answers.
struct Stalling {
    inner: Arc<dyn Store>,
    stall_renewal: AtomicBool,
    stall_pass: AtomicBool,
    /// Passes that began while `stall_pass` was set.
    stalled_passes: AtomicUsize,
}

conveyor_core::delegate_store!(Stalling => inner:
    JobStore, LeaseStore, QueueStore, ScheduleStore, AccessStore, WorkerStore, FlowStore,
    KindStore, BreakerStore, StatsStore, CopyStore, ConfigStore);

#[async_trait::async_trait]
impl LeadershipStore for Stalling {
    async fn storage_maintenance(&self) -> StoreResult<()> {
        self.inner.storage_maintenance().await
    }
    async fn jobs_rescue_expired(&self, params: RescueParams) -> StoreResult<RescueReport> {
        self.inner.jobs_rescue_expired(params).await
    }
    async fn jobs_promote_due(&self) -> StoreResult<u64> {
        if self.stall_pass.load(Ordering::SeqCst) {
            self.stalled_passes.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
        self.inner.jobs_promote_due().await
    }
    async fn jobs_prune(&self, params: PruneParams) -> StoreResult<PruneReport> {
        self.inner.jobs_prune(params).await
    }
    async fn leader_try_acquire(&self, holder: &str, ttl: Duration) -> StoreResult<bool> {
        if self.stall_renewal.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        self.inner.leader_try_acquire(holder, ttl).await
    }
    async fn leader_release(&self, holder: &str) -> StoreResult<()> {
        self.inner.leader_release(holder).await
    }
}

/// A leader on a stalling store, running until the test ends; its leadership flag.
fn leader(dir: &tempfile::TempDir) -> (Arc<Stalling>, Arc<AtomicBool>, CancellationToken) {
    let inner: Arc<dyn Store> = Arc::new(
        SqliteStore::open(dir.path().join("jobs.db"), SqliteOptions::default())
            .expect("open store"),
    );
    let store = Arc::new(Stalling {
        inner,
        stall_renewal: AtomicBool::new(false),
        stall_pass: AtomicBool::new(false),
        stalled_passes: AtomicUsize::new(0),
    });
    let maintenance = Maintenance::new(store.clone())
        .interval(Duration::from_millis(20))
        .leader_ttl(TTL);
    let leading = maintenance.leading();
    let stop = CancellationToken::new();
    tokio::spawn(maintenance.run(stop.clone()));
    (store, leading, stop)
}

async fn await_leading(leading: &AtomicBool, wanted: bool, within: Duration) {
    eventually_within(&format!("leading to be {wanted}"), within, || async {
        (leading.load(Ordering::SeqCst) == wanted).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_leader_whose_renewal_never_answers_gives_up_within_its_ttl() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (store, leading, stop) = leader(&dir);
    await_leading(&leading, true, Duration::from_secs(10)).await;
    store.stall_renewal.store(true, Ordering::SeqCst);
    // The renewal asked just before the stall holds for a TTL; the one after it never answers.
    // (Ten TTLs of slack for a loaded machine: without the bound it would lead for good.)
    await_leading(&leading, false, TTL * 10).await;
    stop.cancel();
}

/// A pass whose store stops answering is cut short when the leadership it ran under would
/// lapse: the next pass begins (the renewal before it is answered, so the node leads again).
/// Without the cut, the first stalled pass would hold the loop for good.
#[tokio::test]
async fn a_pass_that_never_ends_is_cut_short_when_the_leadership_lapses() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (store, leading, stop) = leader(&dir);
    await_leading(&leading, true, Duration::from_secs(10)).await;
    store.stall_pass.store(true, Ordering::SeqCst);
    eventually_within(
        "a stalled pass to be cut short",
        Duration::from_secs(10),
        || async { (store.stalled_passes.load(Ordering::SeqCst) >= 2).then_some(()) },
    )
    .await;
    // Once its store answers again, passes run through.
    store.stall_pass.store(false, Ordering::SeqCst);
    await_leading(&leading, true, Duration::from_secs(10)).await;
    stop.cancel();
}
