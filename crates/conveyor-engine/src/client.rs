//! The typed producer: enqueues [`TypedJob`]s with [`JobOptions`] into any store, checking
//! payloads against their kind's schema.

use std::sync::Arc;

use conveyor_core::error::{StoreError, ValidationError};
use conveyor_core::job::Inserted;
use conveyor_core::store::{Store, StoreResult};

use conveyor_core::{JobOptions, TypedJob};

use crate::kinds::KindRegistry;

/// Enqueues typed jobs into any store, checking payloads against their kind's schema (see
/// [`conveyor_core::kinds`]).
#[derive(Clone)]
pub struct Client {
    store: Arc<dyn Store>,
    kinds: Arc<KindRegistry>,
}

impl Client {
    pub fn new(store: Arc<dyn Store>) -> Self {
        let kinds = Arc::new(KindRegistry::new(store.clone()));
        Self { store, kinds }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The payload schemas this client enforces.
    pub fn kinds(&self) -> &Arc<KindRegistry> {
        &self.kinds
    }

    /// Stores `J::schema()` as the schema of `J::KIND`, so every producer (in any language) is
    /// held to it. Refused with a `Conflict` naming how many queued jobs of the kind it would
    /// reject, unless `force`. Returns false when `J` has no schema to publish.
    pub async fn publish_schema<J: TypedJob>(&self, force: bool) -> StoreResult<bool> {
        let Some(schema) = J::schema() else {
            return Ok(false);
        };
        let compiled = conveyor_core::kinds::KindSchema::compile(&schema)?;
        if !force {
            let found =
                crate::kinds::queued_violations(self.store.as_ref(), J::KIND, &compiled).await?;
            if found.failing > 0 {
                return Err(ValidationError::new(
                    "schema",
                    format!(
                        "would reject {} queued job(s) of kind {:?}; publish with force to set \
                         it anyway",
                        found.failing,
                        J::KIND
                    ),
                )
                .into());
            }
        }
        let existing = self.store.kind_get(J::KIND).await?;
        let version = existing.as_ref().and_then(|k| k.version);
        let limits = existing
            .as_ref()
            .map(|k| k.limits.clone())
            .unwrap_or_default();
        let sequence = existing.as_ref().and_then(|k| k.sequence.clone());
        let batch = existing.as_ref().and_then(|k| k.batch.clone());
        self.store
            .kind_put(conveyor_core::kinds::KindSettings {
                kind: J::KIND.to_string(),
                schema: Some(schema),
                version,
                circuit_breaker: existing.and_then(|k| k.circuit_breaker),
                limits,
                sequence,
                batch,
                updated_at: chrono::DateTime::UNIX_EPOCH,
            })
            .await?;
        self.kinds.invalidate();
        Ok(true)
    }

    /// Enqueues one job with its type's default options.
    pub async fn enqueue<J: TypedJob>(&self, job: J) -> StoreResult<Inserted> {
        self.enqueue_with(job, J::default_options()).await
    }

    /// Enqueues one job; returns once it is durably stored.
    pub async fn enqueue_with<J: TypedJob>(
        &self,
        job: J,
        options: JobOptions,
    ) -> StoreResult<Inserted> {
        let mut inserted = self.enqueue_many_with(vec![(job, options)]).await?;
        inserted
            .pop()
            .ok_or(StoreError::backend("store returned no row for an insert"))
    }

    /// Enqueues many jobs in one transaction: all are stored, or none.
    pub async fn enqueue_many<J: TypedJob>(&self, jobs: Vec<J>) -> StoreResult<Vec<Inserted>> {
        self.enqueue_many_with(
            jobs.into_iter()
                .map(|j| (j, J::default_options()))
                .collect(),
        )
        .await
    }

    pub async fn enqueue_many_with<J: TypedJob>(
        &self,
        jobs: Vec<(J, JobOptions)>,
    ) -> StoreResult<Vec<Inserted>> {
        let mut new_jobs = Vec::with_capacity(jobs.len());
        for (job, options) in jobs {
            let payload = serde_json::to_value(&job)
                .map_err(|e| ValidationError::new("payload", e.to_string()))?;
            new_jobs.push(options.into_valid_job(J::KIND, payload)?);
        }
        // One job's error names its payload alone (`payload/user_id`), as the HTTP enqueue's
        // does; in a batch, the job's index (`jobs[3].payload/user_id`).
        if let [job] = new_jobs.as_slice() {
            self.kinds
                .check(&job.job().kind, &job.job().payload)
                .await?;
        } else {
            self.kinds
                .check_all(
                    new_jobs
                        .iter()
                        .map(|j| (j.job().kind.as_str(), &j.job().payload)),
                    |index| format!("jobs[{index}]"),
                )
                .await?;
        }
        let inserted = self.store.jobs_insert_valid(new_jobs).await?;
        let now = chrono::Utc::now();
        for one in &inserted {
            conveyor_core::trace::end_enqueue(&one.job, one.duplicate, now);
        }
        Ok(inserted)
    }

    /// Creates a workflow (see [`conveyor_core::workflow`]): checked whole, stored all or nothing, its
    /// first steps started at once.
    ///
    /// ```ignore
    /// let flow = NewFlow::chain([("fetch", fetch_job), ("resize", resize_job)]);
    /// let created = client.create_flow(flow).await?;
    /// ```
    pub async fn create_flow(
        &self,
        flow: conveyor_core::workflow::NewFlow,
    ) -> StoreResult<conveyor_core::workflow::CreatedFlow> {
        let flow = conveyor_core::workflow::ValidFlow::new(flow)?;
        let names: Vec<String> = flow.step_jobs().map(|(path, _, _)| path).collect();
        self.kinds
            .check_all(
                flow.step_jobs().map(|(_, kind, payload)| (kind, payload)),
                |index| names.get(index).cloned().unwrap_or_default(),
            )
            .await?;
        self.store.flow_create(flow).await
    }
}
