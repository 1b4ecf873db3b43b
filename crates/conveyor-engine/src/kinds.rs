//! The kinds' settings a process acts on (see [`conveyor_core::kinds`]): payload schemas
//! compiled from the store, and which kinds go out in batches; re-read when a second old, so a
//! setting made through one node holds on every node within [`KindRegistry::REFRESH`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use conveyor_core::batch::BatchSpec;
use conveyor_core::error::{StoreError, StoreResult, ValidationError};
use conveyor_core::job::JobState;
use conveyor_core::kinds::KindSchema;
use conveyor_core::store::{JobListParams, Store};

/// Compiled schemas of every kind that has one, and how batch kinds are batched.
#[derive(Default)]
struct Snapshot {
    /// A stored schema this build cannot compile is kept as its error: reported on every
    /// enqueue of its kind, and only there (fetches and other kinds go on).
    schemas: HashMap<String, Result<Arc<KindSchema>, String>>,
    /// Each kind's schema as stored, so a refresh compiles only what changed (fetches refresh
    /// the snapshot every second, for the batch kinds).
    sources: HashMap<String, Value>,
    batches: Arc<BTreeMap<String, BatchSpec>>,
}

/// The payload schemas a process enforces, read from its store and refreshed when stale.
pub struct KindRegistry {
    store: Arc<dyn Store>,
    current: crate::refreshed::Refreshed<Snapshot>,
}

impl std::fmt::Debug for KindRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KindRegistry")
    }
}

impl KindRegistry {
    /// How old the compiled schemas may get before the next check re-reads them.
    pub const REFRESH: Duration = Duration::from_secs(1);

    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            current: crate::refreshed::Refreshed::new(Self::REFRESH),
        }
    }

    async fn current(&self) -> StoreResult<Arc<Snapshot>> {
        self.current
            .get(|| async {
                let last = self.current.last();
                let mut schemas = HashMap::new();
                let mut sources = HashMap::new();
                let mut batches = BTreeMap::new();
                for settings in self.store.kinds_list().await? {
                    if let Some(batch) = settings.batch {
                        batches.insert(settings.kind.clone(), batch);
                    }
                    let Some(schema) = settings.schema else {
                        continue;
                    };
                    if last.sources.get(&settings.kind) == Some(&schema) {
                        if let Some(compiled) = last.schemas.get(&settings.kind) {
                            schemas.insert(settings.kind.clone(), compiled.clone());
                            sources.insert(settings.kind, schema);
                            continue;
                        }
                    }
                    // A stored schema was compiled when it was set; one this build cannot
                    // compile is reported on every enqueue of its kind rather than silently
                    // not enforced.
                    let compiled = KindSchema::compile(&schema).map(Arc::new).map_err(|e| {
                        format!(
                            "the stored schema of kind {:?} does not compile: {}",
                            settings.kind, e.message
                        )
                    });
                    schemas.insert(settings.kind.clone(), compiled);
                    sources.insert(settings.kind, schema);
                }
                Ok(Snapshot {
                    schemas,
                    sources,
                    batches: Arc::new(batches),
                })
            })
            .await
    }

    /// Forgets the compiled schemas: the next check reads them again (after this process
    /// changed one).
    pub fn invalidate(&self) {
        self.current.invalidate();
    }

    /// The kinds whose jobs go out in batches, and how (see [`conveyor_core::batch`]).
    pub async fn batches(&self) -> StoreResult<Arc<BTreeMap<String, BatchSpec>>> {
        Ok(self.current().await?.batches.clone())
    }

    /// Checks one payload of `kind` against the kind's schema, if it has one.
    pub async fn check(&self, kind: &str, payload: &Value) -> StoreResult<()> {
        let snapshot = self.current().await?;
        if let Some(schema) = snapshot.schemas.get(kind) {
            compiled(schema)?.check(payload)?;
        }
        Ok(())
    }

    /// Checks many payloads; an error is named within `prefix(index)` (say `jobs[3]`).
    pub async fn check_all<'a>(
        &self,
        jobs: impl IntoIterator<Item = (&'a str, &'a Value)>,
        prefix: impl Fn(usize) -> String,
    ) -> StoreResult<()> {
        let snapshot = self.current().await?;
        if snapshot.schemas.is_empty() {
            return Ok(());
        }
        for (index, (kind, payload)) in jobs.into_iter().enumerate() {
            if let Some(schema) = snapshot.schemas.get(kind) {
                compiled(schema)?.check(payload).map_err(|e| {
                    ValidationError::new(format!("{}.{}", prefix(index), e.field), e.message)
                })?;
            }
        }
        Ok(())
    }
}

/// A kind's compiled schema, or the error its stored schema gave.
fn compiled(schema: &Result<Arc<KindSchema>, String>) -> StoreResult<&KindSchema> {
    schema
        .as_deref()
        .map_err(|message| StoreError::backend(message.clone()))
}

/// The states of jobs that are queued: not yet started, so a new schema would apply to them.
pub const QUEUED_STATES: [JobState; 3] = [
    JobState::Available,
    JobState::Scheduled,
    JobState::Retryable,
];

/// How many queued jobs of `kind` `schema` would reject, and the first one's id and error.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QueuedViolations {
    pub checked: u64,
    pub failing: u64,
    pub first: Option<(uuid::Uuid, String)>,
}

/// Checks every queued job of `kind` against `schema` (a page at a time).
pub async fn queued_violations(
    store: &dyn Store,
    kind: &str,
    schema: &KindSchema,
) -> StoreResult<QueuedViolations> {
    const PAGE: usize = 1000;
    let mut found = QueuedViolations::default();
    for state in QUEUED_STATES {
        let mut after = None;
        loop {
            let mut params = JobListParams::default();
            params.kind = Some(kind.to_string());
            params.state = Some(state);
            params.limit = PAGE;
            params.after = after;
            let page = store.jobs_list(params).await?;
            for job in &page {
                found.checked += 1;
                if let Err(e) = schema.check(&job.payload) {
                    found.failing += 1;
                    if found.first.is_none() {
                        found.first = Some((job.id, format!("{}: {}", e.field, e.message)));
                    }
                }
            }
            if page.len() < PAGE {
                break;
            }
            after = page.last().map(|job| job.id);
        }
    }
    Ok(found)
}
