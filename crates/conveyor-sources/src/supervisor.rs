//! The sources a server runs: the ones stored in the cluster's shared configuration
//! (`conveyor_core::config::SOURCES`). Every server reads that collection about once a second
//! (and at once when told of a change it made itself), starts the sources it lacks, restarts
//! the ones whose configuration changed, and stops the ones deleted or paused. Every server of
//! a cluster runs every source: the broker's consumer group (or shared queue) spreads the
//! messages among them, and each message's idempotency key keeps any one of them from
//! becoming two jobs.

use conveyor_core::config::SOURCES;
use conveyor_core::sources::SourceSpec;
use conveyor_core::{ConfigEntry, Store, StoreError};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::ingest::{SourceState, SourceStatus};

/// How often the stored configuration is read again.
const RELOAD_EVERY: Duration = Duration::from_secs(1);

/// How long a stopping source may take to finish its batch before it is abandoned (its
/// messages stay unacknowledged at the broker, which redelivers them).
const STOP_WITHIN: Duration = Duration::from_secs(30);

struct Running {
    status: Arc<SourceStatus>,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

/// The sources this server runs (see the module's documentation).
pub struct Sources {
    store: Arc<dyn Store>,
    running: tokio::sync::Mutex<BTreeMap<String, Running>>,
    /// What the API shows: each source's status, by name.
    shown: Mutex<BTreeMap<String, Arc<SourceStatus>>>,
    changed: Notify,
    /// Stored sources that cannot be run, by name: each is warned of once, not every reload.
    skipped: Mutex<std::collections::BTreeSet<String>>,
    /// Whether this server reads the sources (`serve --run-sources=false`: it only stores
    /// and shows them).
    reads: std::sync::atomic::AtomicBool,
}

/// A stored document as a source: its name is the document's.
pub fn spec_of(entry: &ConfigEntry) -> Result<SourceSpec, String> {
    let mut spec: SourceSpec = serde_json::from_value(entry.document.clone())
        .map_err(|error| format!("the stored source {} cannot be read: {error}", entry.name))?;
    spec.name = entry.name.clone();
    spec.validate()
        .map_err(|error| format!("the stored source {} is not valid: {error}", entry.name))?;
    Ok(spec)
}

impl Sources {
    pub fn new(store: Arc<dyn Store>) -> Arc<Self> {
        Arc::new(Self {
            store,
            running: tokio::sync::Mutex::new(BTreeMap::new()),
            shown: Mutex::new(BTreeMap::new()),
            changed: Notify::new(),
            skipped: Mutex::new(std::collections::BTreeSet::new()),
            reads: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Reads the stored configuration again now (after this server changed it).
    pub fn changed(&self) {
        self.changed.notify_one();
    }

    /// Each source's status in this process, by name.
    pub fn statuses(&self) -> Vec<Arc<SourceStatus>> {
        self.shown
            .lock()
            .map(|shown| shown.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The status of `spec` in this process: the running source's when it runs that very
    /// configuration, else a new one (a change this server has not applied yet).
    pub fn status_of(&self, spec: &SourceSpec) -> Arc<SourceStatus> {
        let shown = self
            .shown
            .lock()
            .ok()
            .and_then(|shown| shown.get(&spec.name).cloned());
        match shown {
            Some(status) if status.spec == *spec => status,
            _ => {
                let status = Arc::new(SourceStatus::new(spec.clone()));
                if !self.reads.load(std::sync::atomic::Ordering::Relaxed) && !spec.paused {
                    status.set(SourceState::Stopped, None);
                }
                status
            }
        }
    }

    /// Runs until `shutdown`, then stops every source (each finishes the batch it holds).
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        self.reads.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut failed_before = false;
        while !shutdown.is_cancelled() {
            match self.reload(&shutdown).await {
                Ok(()) => failed_before = false,
                Err(error) => {
                    // Sources keep running as they are while the store cannot be read.
                    if !failed_before {
                        tracing::warn!(%error, "cannot read the event sources' configuration");
                    }
                    failed_before = true;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(RELOAD_EVERY) => {}
                _ = self.changed.notified() => {}
                _ = shutdown.cancelled() => {}
            }
        }
        let mut running = self.running.lock().await;
        let names: Vec<String> = running.keys().cloned().collect();
        for name in names {
            if let Some(source) = running.remove(&name) {
                stop(source).await;
            }
        }
    }

    async fn reload(&self, shutdown: &CancellationToken) -> Result<(), StoreError> {
        let entries = self.store.config_list(SOURCES).await?;
        let mut wanted = BTreeMap::new();
        let mut skipped = std::collections::BTreeSet::new();
        for entry in &entries {
            match spec_of(entry) {
                Ok(spec) => {
                    wanted.insert(spec.name.clone(), spec);
                }
                Err(error) => {
                    let new = self
                        .skipped
                        .lock()
                        .map(|before| !before.contains(&entry.name))
                        .unwrap_or(true);
                    if new {
                        tracing::warn!(%error, "event source skipped");
                    }
                    skipped.insert(entry.name.clone());
                }
            }
        }
        if let Ok(mut before) = self.skipped.lock() {
            *before = skipped;
        }
        let mut running = self.running.lock().await;
        let gone: Vec<String> = running
            .iter()
            .filter(|(name, source)| wanted.get(*name) != Some(&source.status.spec))
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            if let Some(source) = running.remove(&name) {
                tracing::info!(source = %name, "event source stopping (changed, paused or deleted)");
                stop(source).await;
            }
        }
        for (name, spec) in wanted {
            if running.contains_key(&name) || shutdown.is_cancelled() {
                continue;
            }
            let status = Arc::new(SourceStatus::new(spec.clone()));
            let stop = CancellationToken::new();
            let task = (!spec.paused).then(|| {
                tracing::info!(source = %name, kind = spec.broker.type_name(), "event source starting");
                tokio::spawn(crate::run(status.clone(), self.store.clone(), stop.clone()))
            });
            if spec.paused {
                status.set(SourceState::Paused, None);
            }
            running.insert(name, Running { status, stop, task });
        }
        if let Ok(mut shown) = self.shown.lock() {
            *shown = running
                .iter()
                .map(|(name, source)| (name.clone(), source.status.clone()))
                .collect();
        }
        Ok(())
    }
}

async fn stop(source: Running) {
    source.stop.cancel();
    if let Some(task) = source.task {
        if tokio::time::timeout(STOP_WITHIN, task).await.is_err() {
            tracing::warn!(source = %source.status.spec.name, "event source did not stop in time");
        }
    }
}
