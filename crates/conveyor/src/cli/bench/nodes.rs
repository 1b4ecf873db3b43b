//! `conveyor bench --nodes K`: the drain workload with K worker nodes on one PostgreSQL, each
//! with a store (and connection pool) of its own, as K servers would run. Besides throughput it
//! reports what the database spent: PostgreSQL's own CPU time (its processes' user + system
//! time from /proc, so only for a server on this machine) and how often a backend was seen
//! waiting on a lock (`pg_stat_activity`, sampled every 50 ms), and an estimate of the rows the
//! claims skipped because another node held them (SKIP LOCKED misses, which PostgreSQL does not
//! count): the live rows the claims' scans of `jobs_fetch` fetched (`idx_tup_fetch`) beyond the
//! jobs claimed. A row is fetched and then skipped when another claim has it locked, or has
//! just claimed it (the lock then finds it no longer available).

use anyhow::Context;
use conveyor::{Outcome, Store, Worker};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// What one multi-node drain measured.
pub(crate) struct NodesDrain {
    pub seconds: f64,
    /// CPU seconds PostgreSQL's processes used during the drain (`None`: not readable here).
    pub postgres_cpu_seconds: Option<f64>,
    /// Samples of `pg_stat_activity` taken, and backends seen waiting on a lock in them.
    pub samples: u64,
    pub lock_waits: u64,
    /// Rows the claims fetched from `jobs_fetch` and did not claim (`None`: not readable).
    pub skip_locked_misses: Option<i64>,
}

/// Drains `jobs` already queued in `queue` with `nodes` workers at `concurrency` each, each on
/// its own store opened from `url`.
pub(crate) async fn drain(
    url: &str,
    options: conveyor::OpenOptions,
    queue: &str,
    jobs: usize,
    nodes: usize,
    concurrency: usize,
) -> anyhow::Result<NodesDrain> {
    let mut stores: Vec<Arc<dyn Store>> = Vec::with_capacity(nodes);
    for _ in 0..nodes {
        stores.push(
            conveyor::open_store(url, options.clone())
                .await
                .with_context(|| format!("cannot open store {url}"))?,
        );
    }
    let pool = sqlx_pool(url).await?;
    let schema = conveyor::postgres_schema(url);
    let fetched_before = settled_fetches(&pool, &schema).await;
    let handled = Arc::new(AtomicUsize::new(0));
    let all_handled = Arc::new(Notify::new());
    let finished = Arc::new(AtomicBool::new(false));
    let cpu_before = postgres_cpu_ticks();
    let sampler = {
        let (pool, finished) = (pool.clone(), finished.clone());
        tokio::spawn(async move {
            let (mut samples, mut waits) = (0u64, 0u64);
            while !finished.load(Ordering::Relaxed) {
                let waiting: Result<i64, _> = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
                )
                .fetch_one(&pool)
                .await;
                if let Ok(waiting) = waiting {
                    samples += 1;
                    waits += u64::try_from(waiting).unwrap_or(0);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (samples, waits)
        })
    };
    // Held until PostgreSQL's CPU time is read: a closed pool's backends exit, taking their
    // CPU time with them.
    let open_until_measured = stores.clone();
    let started = Instant::now();
    let mut runs = tokio::task::JoinSet::new();
    for store in stores {
        let (h, done) = (handled.clone(), all_handled.clone());
        let worker = Worker::builder(store.clone())
            .queue(queue, concurrency)
            .poll_interval(Duration::from_millis(50))
            .with_maintenance(conveyor::Maintenance::new(store))
            .handle_json("bench.noop", move |_, _| {
                let (h, done) = (h.clone(), done.clone());
                async move {
                    if h.fetch_add(1, Ordering::Relaxed) + 1 == jobs {
                        done.notify_waiters();
                    }
                    Outcome::ok()
                }
            })
            .build()?;
        let stop = all_handled.clone();
        let stop_flag = finished.clone();
        runs.spawn(async move {
            worker
                .run(async move {
                    // Every node stops once the last job was handled by any of them.
                    while !stop_flag.load(Ordering::Relaxed) {
                        stop.notified().await;
                    }
                })
                .await
        });
    }
    all_handled.notified().await;
    finished.store(true, Ordering::Relaxed);
    all_handled.notify_waiters();
    while runs.join_next().await.is_some() {}
    let seconds = started.elapsed().as_secs_f64();
    let (samples, lock_waits) = sampler.await.unwrap_or((0, 0));
    let postgres_cpu_seconds = match (cpu_before, postgres_cpu_ticks()) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before) as f64 / clock_ticks()),
        _ => None,
    };
    drop(open_until_measured);
    let fetched_after = settled_fetches(&pool, &schema).await;
    let skip_locked_misses = match (fetched_before, fetched_after) {
        (Some(before), Some(after)) => {
            Some(after - before - i64::try_from(jobs).unwrap_or(i64::MAX))
        }
        _ => None,
    };
    Ok(NodesDrain {
        seconds,
        postgres_cpu_seconds,
        samples,
        lock_waits,
        skip_locked_misses,
    })
}

/// Live rows fetched through `jobs_fetch` so far, once the figure stops moving: backends report
/// their counts at most once a second, and when they exit.
async fn settled_fetches(pool: &sqlx::PgPool, schema: &str) -> Option<i64> {
    let read = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT idx_tup_fetch FROM pg_stat_user_indexes \
             WHERE schemaname = $1 AND indexrelname = 'jobs_fetch'",
        )
        .bind(schema)
        .fetch_optional(pool)
        .await
        .ok()
        .flatten()
    };
    let mut last = read().await?;
    let mut unchanged = 0;
    // At most 12 s: an idle backend's counts arrive within about one.
    for _ in 0..24 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = read().await?;
        if now == last {
            unchanged += 1;
            if unchanged == 3 {
                break;
            }
        } else {
            (last, unchanged) = (now, 0);
        }
    }
    Some(last)
}

pub(super) async fn sqlx_pool(url: &str) -> anyhow::Result<sqlx::PgPool> {
    let base = url.split('?').next().unwrap_or(url);
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(base)
        .await
        .with_context(|| "cannot connect to PostgreSQL for its statistics")
}

/// User + system clock ticks of every process named `postgres` on this machine.
fn postgres_cpu_ticks() -> Option<u64> {
    let mut total = 0u64;
    let mut seen = false;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let stat = entry.path().join("stat");
        let Ok(text) = std::fs::read_to_string(stat) else {
            continue;
        };
        // `pid (comm) state ...`: the name may hold spaces, so split after the last ')'.
        let Some((head, rest)) = text.rsplit_once(')') else {
            continue;
        };
        if !head.ends_with("(postgres") {
            continue;
        }
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // After the name: state is field 3, utime 14 and stime 15 (1-based in proc(5)).
        let (Some(utime), Some(stime)) = (fields.get(11), fields.get(12)) else {
            continue;
        };
        if let (Ok(utime), Ok(stime)) = (utime.parse::<u64>(), stime.parse::<u64>()) {
            total += utime + stime;
            seen = true;
        }
    }
    seen.then_some(total)
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf reads a constant of the running system.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}
