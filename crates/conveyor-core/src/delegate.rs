//! [`delegate_store!`]: forwarding for store decorators, so a decorator writes only the
//! operations it changes.

/// Implements the named parts of [`crate::Store`] for a decorator by forwarding every call to
/// the store in one of its fields (anything that dereferences to a store, such as
/// `Arc<dyn Store>`):
///
/// ```ignore
/// conveyor_core::delegate_store!(EncryptedStore => inner:
///     QueueStore, ScheduleStore, AccessStore, WorkerStore, LeadershipStore);
/// ```
///
/// The decorator implements the remaining parts itself. A part's signatures are checked
/// against the trait by the compiler, so this cannot drift from it;
/// `conveyor-sqlite/tests/forwarding_conformance.rs` runs the whole conformance suite through a
/// decorator that forwards every part.
#[macro_export]
macro_rules! delegate_store {
    ($decorator:ty => $field:ident: $($part:ident),+ $(,)?) => {
        $( $crate::delegate_store!(@part $part, $decorator, $field); )+
    };
    (@part JobStore, $decorator:ty, $field:ident) => {
        #[$crate::async_trait::async_trait]
        impl $crate::JobStore for $decorator {
            fn clock(&self) -> std::sync::Arc<dyn $crate::Clock> {
                $crate::JobStore::clock(&*self.$field)
            }
            async fn health(&self) -> $crate::StoreHealth {
                $crate::JobStore::health(&*self.$field).await
            }
            async fn jobs_insert_valid(&self, jobs: Vec<$crate::ValidJob>) -> $crate::StoreResult<Vec<$crate::Inserted>> {
                $crate::JobStore::jobs_insert_valid(&*self.$field, jobs).await
            }
            async fn jobs_insert_many(&self, jobs: Vec<$crate::NewJob>) -> $crate::StoreResult<Vec<$crate::Inserted>> {
                $crate::JobStore::jobs_insert_many(&*self.$field, jobs).await
            }
            async fn job_get(&self, id: uuid::Uuid) -> $crate::StoreResult<Option<$crate::Job>> {
                $crate::JobStore::job_get(&*self.$field, id).await
            }
            async fn jobs_list(&self, params: $crate::JobListParams) -> $crate::StoreResult<Vec<$crate::Job>> {
                $crate::JobStore::jobs_list(&*self.$field, params).await
            }
            async fn job_cancel(&self, id: uuid::Uuid) -> $crate::StoreResult<$crate::Job> {
                $crate::JobStore::job_cancel(&*self.$field, id).await
            }
            async fn dead_replay(&self, selector: $crate::ReplaySelector) -> $crate::StoreResult<u64> {
                $crate::JobStore::dead_replay(&*self.$field, selector).await
            }
            async fn dead_discard(&self, id: uuid::Uuid) -> $crate::StoreResult<bool> {
                $crate::JobStore::dead_discard(&*self.$field, id).await
            }
            async fn jobs_import(&self, jobs: Vec<$crate::Job>) -> $crate::StoreResult<u64> {
                $crate::JobStore::jobs_import(&*self.$field, jobs).await
            }
        }
    };
    (@part ConfigStore, $decorator:ty, $field:ident) => {
        #[$crate::async_trait::async_trait]
        impl $crate::ConfigStore for $decorator {
            async fn config_put(&self, collection: &str, name: &str, document: serde_json::Value) -> $crate::StoreResult<$crate::ConfigEntry> {
                $crate::ConfigStore::config_put(&*self.$field, collection, name, document).await
            }
            async fn config_get(&self, collection: &str, name: &str) -> $crate::StoreResult<Option<$crate::ConfigEntry>> {
                $crate::ConfigStore::config_get(&*self.$field, collection, name).await
            }
            async fn config_list(&self, collection: &str) -> $crate::StoreResult<Vec<$crate::ConfigEntry>> {
                $crate::ConfigStore::config_list(&*self.$field, collection).await
            }
            async fn config_delete(&self, collection: &str, name: &str) -> $crate::StoreResult<bool> {
                $crate::ConfigStore::config_delete(&*self.$field, collection, name).await
            }
        }
    };
    (@part BreakerStore, $decorator:ty, $field:ident) => {
        #[$crate::async_trait::async_trait]
        impl $crate::BreakerStore for $decorator {
            async fn breakers_list(&self) -> $crate::StoreResult<Vec<$crate::StoredBreaker>> {
                $crate::BreakerStore::breakers_list(&*self.$field).await
            }
            async fn breaker_get(&self, scope: $crate::BreakerScope, name: &str) -> $crate::StoreResult<Option<$crate::StoredBreaker>> {
                $crate::BreakerStore::breaker_get(&*self.$field, scope, name).await
            }
            async fn breaker_write_valid(&self, breaker: $crate::Valid<$crate::StoredBreaker>) -> $crate::StoreResult<bool> {
                $crate::BreakerStore::breaker_write_valid(&*self.$field, breaker).await
            }
        }
    };
    (@part CopyStore, $decorator:ty, $field:ident) => {
        #[$crate::async_trait::async_trait]
        impl $crate::CopyStore for $decorator {
            async fn export_queue_settings(&self) -> $crate::StoreResult<Vec<$crate::NamedQueueSettings>> {
                $crate::CopyStore::export_queue_settings(&*self.$field).await
            }
            async fn import_queue_settings(&self, records: Vec<$crate::NamedQueueSettings>) -> $crate::StoreResult<u64> {
                $crate::CopyStore::import_queue_settings(&*self.$field, records).await
            }
            async fn export_config(&self) -> $crate::StoreResult<Vec<$crate::ConfigEntry>> {
                $crate::CopyStore::export_config(&*self.$field).await
            }
            async fn import_config(&self, records: Vec<$crate::ConfigEntry>) -> $crate::StoreResult<u64> {
                $crate::CopyStore::import_config(&*self.$field, records).await
            }
            async fn export_kinds(&self) -> $crate::StoreResult<Vec<$crate::kinds::KindSettings>> {
                $crate::CopyStore::export_kinds(&*self.$field).await
            }
            async fn import_kinds(&self, records: Vec<$crate::kinds::KindSettings>) -> $crate::StoreResult<u64> {
                $crate::CopyStore::import_kinds(&*self.$field, records).await
            }
            async fn export_breakers(&self) -> $crate::StoreResult<Vec<$crate::StoredBreaker>> {
                $crate::CopyStore::export_breakers(&*self.$field).await
            }
            async fn import_breakers(&self, records: Vec<$crate::StoredBreaker>) -> $crate::StoreResult<u64> {
                $crate::CopyStore::import_breakers(&*self.$field, records).await
            }
            async fn export_tokens(&self) -> $crate::StoreResult<Vec<$crate::StoredToken>> {
                $crate::CopyStore::export_tokens(&*self.$field).await
            }
            async fn import_tokens(&self, records: Vec<$crate::StoredToken>) -> $crate::StoreResult<u64> {
                $crate::CopyStore::import_tokens(&*self.$field, records).await
            }
            async fn export_schedules(&self) -> $crate::StoreResult<Vec<$crate::copy::ScheduleRecord>> {
                $crate::CopyStore::export_schedules(&*self.$field).await
            }
            async fn import_schedules(&self, records: Vec<$crate::copy::ScheduleRecord>) -> $crate::StoreResult<u64> {
                $crate::CopyStore::import_schedules(&*self.$field, records).await
            }
            async fn export_schedule_runs(&self, after: Option<$crate::copy::RunKey>, limit: usize) -> $crate::StoreResult<Vec<$crate::copy::ScheduleRunRecord>> {
                $crate::CopyStore::export_schedule_runs(&*self.$field, after, limit).await
            }
            async fn import_schedule_runs(&self, records: Vec<$crate::copy::ScheduleRunRecord>) -> $crate::StoreResult<u64> {
                $crate::CopyStore::import_schedule_runs(&*self.$field, records).await
            }
            async fn export_flows(&self, after: Option<uuid::Uuid>, limit: usize) -> $crate::StoreResult<Vec<$crate::copy::FlowRecord>> {
                $crate::CopyStore::export_flows(&*self.$field, after, limit).await
            }
            async fn import_flows(&self, records: Vec<$crate::copy::FlowRecord>) -> $crate::StoreResult<u64> {
                $crate::CopyStore::import_flows(&*self.$field, records).await
            }
            async fn export_jobs(&self, after: Option<uuid::Uuid>, limit: usize) -> $crate::StoreResult<Vec<$crate::Job>> {
                $crate::CopyStore::export_jobs(&*self.$field, after, limit).await
            }
            async fn import_jobs(&self, records: Vec<$crate::Job>) -> $crate::StoreResult<u64> {
                $crate::CopyStore::import_jobs(&*self.$field, records).await
            }
            async fn export_audit(&self, after: Option<i64>, limit: usize) -> $crate::StoreResult<Vec<$crate::AuditEntry>> {
                $crate::CopyStore::export_audit(&*self.$field, after, limit).await
            }
            async fn import_audit(&self, records: Vec<$crate::AuditEntry>) -> $crate::StoreResult<u64> {
                $crate::CopyStore::import_audit(&*self.$field, records).await
            }
            async fn export_rollups(&self, after: Option<$crate::copy::RollupKey>, limit: usize) -> $crate::StoreResult<Vec<$crate::stats::Rollup>> {
                $crate::CopyStore::export_rollups(&*self.$field, after, limit).await
            }
            async fn import_rollups(&self, records: Vec<$crate::stats::Rollup>) -> $crate::StoreResult<u64> {
                $crate::CopyStore::import_rollups(&*self.$field, records).await
            }
        }
    };
    (@part StatsStore, $decorator:ty, $field:ident) => {
        #[$crate::async_trait::async_trait]
        impl $crate::StatsStore for $decorator {
            async fn stats_merge(&self, rollups: Vec<$crate::stats::Rollup>) -> $crate::StoreResult<()> {
                $crate::StatsStore::stats_merge(&*self.$field, rollups).await
            }
            async fn stats_read(&self, query: $crate::stats::StatsQuery) -> $crate::StoreResult<Vec<$crate::stats::Rollup>> {
                $crate::StatsStore::stats_read(&*self.$field, query).await
            }
            async fn stats_prune(&self, older_than: std::time::Duration) -> $crate::StoreResult<u64> {
                $crate::StatsStore::stats_prune(&*self.$field, older_than).await
            }
        }
    };
    (@part KindStore, $decorator:ty, $field:ident) => {
        #[$crate::async_trait::async_trait]
        impl $crate::KindStore for $decorator {
            async fn kind_put(&self, settings: $crate::kinds::KindSettings) -> $crate::StoreResult<$crate::kinds::KindSettings> {
                $crate::KindStore::kind_put(&*self.$field, settings).await
            }
            async fn kind_get(&self, kind: &str) -> $crate::StoreResult<Option<$crate::kinds::KindSettings>> {
                $crate::KindStore::kind_get(&*self.$field, kind).await
            }
            async fn kinds_list(&self) -> $crate::StoreResult<Vec<$crate::kinds::KindSettings>> {
                $crate::KindStore::kinds_list(&*self.$field).await
            }
            async fn kind_delete(&self, kind: &str) -> $crate::StoreResult<bool> {
                $crate::KindStore::kind_delete(&*self.$field, kind).await
            }
        }
    };
    (@part FlowStore, $decorator:ty, $field:ident) => {
        #[$crate::async_trait::async_trait]
        impl $crate::FlowStore for $decorator {
            async fn flow_create(&self, flow: $crate::workflow::ValidFlow) -> $crate::StoreResult<$crate::workflow::CreatedFlow> {
                $crate::FlowStore::flow_create(&*self.$field, flow).await
            }
            async fn events_accept(&self, jobs: Vec<$crate::ValidJob>, flows: Vec<$crate::workflow::ValidFlow>) -> $crate::StoreResult<$crate::Accepted> {
                $crate::FlowStore::events_accept(&*self.$field, jobs, flows).await
            }
            async fn flow_get(&self, id: uuid::Uuid) -> $crate::StoreResult<Option<$crate::workflow::FlowView>> {
                $crate::FlowStore::flow_get(&*self.$field, id).await
            }
            async fn flows_list(&self, params: $crate::workflow::FlowListParams) -> $crate::StoreResult<Vec<$crate::workflow::FlowView>> {
                $crate::FlowStore::flows_list(&*self.$field, params).await
            }
            async fn flow_cancel(&self, id: uuid::Uuid) -> $crate::StoreResult<$crate::workflow::FlowView> {
                $crate::FlowStore::flow_cancel(&*self.$field, id).await
            }
            async fn flow_signal_valid(&self, id: uuid::Uuid, signal: &str, payload: $crate::Valid<serde_json::Value>) -> $crate::StoreResult<$crate::workflow::SignalOutcome> {
                $crate::FlowStore::flow_signal_valid(&*self.$field, id, signal, payload).await
            }
            async fn flows_expire_waits(&self, limit: usize) -> $crate::StoreResult<u64> {
                $crate::FlowStore::flows_expire_waits(&*self.$field, limit).await
            }
            fn flow_starts(&self) -> std::sync::Arc<$crate::FlowStarts> {
                $crate::FlowStore::flow_starts(&*self.$field)
            }
            async fn flows_prune(&self, params: $crate::PruneParams) -> $crate::StoreResult<u64> {
                $crate::FlowStore::flows_prune(&*self.$field, params).await
            }
        }
    };
    (@part LeaseStore, $decorator:ty, $field:ident) => {
        #[$crate::async_trait::async_trait]
        impl $crate::LeaseStore for $decorator {
            async fn jobs_fetch_valid(&self, params: $crate::Valid<$crate::FetchParams>) -> $crate::StoreResult<Vec<$crate::Job>> {
                $crate::LeaseStore::jobs_fetch_valid(&*self.$field, params).await
            }
            async fn jobs_heartbeat_many(&self, params: Vec<$crate::HeartbeatParams>) -> $crate::StoreResult<Vec<Option<chrono::DateTime<chrono::Utc>>>> {
                $crate::LeaseStore::jobs_heartbeat_many(&*self.$field, params).await
            }
            async fn jobs_complete_valid(&self, params: $crate::Valid<Vec<$crate::CompleteParams>>) -> $crate::StoreResult<Vec<$crate::LeaseOutcome>> {
                $crate::LeaseStore::jobs_complete_valid(&*self.$field, params).await
            }
            async fn job_fail_valid(&self, params: $crate::Valid<$crate::FailParams>) -> $crate::StoreResult<$crate::Job> {
                $crate::LeaseStore::job_fail_valid(&*self.$field, params).await
            }
            async fn job_snooze(&self, params: $crate::SnoozeParams) -> $crate::StoreResult<$crate::Job> {
                $crate::LeaseStore::job_snooze(&*self.$field, params).await
            }
            async fn job_progress(&self, lease: $crate::LeaseRef, percent: u8, message: Option<String>) -> $crate::StoreResult<()> {
                $crate::LeaseStore::job_progress(&*self.$field, lease, percent, message).await
            }
            async fn jobs_release_many(&self, leases: Vec<$crate::LeaseRef>) -> $crate::StoreResult<u64> {
                $crate::LeaseStore::jobs_release_many(&*self.$field, leases).await
            }
            fn wakeup(&self) -> std::sync::Arc<tokio::sync::Notify> {
                $crate::LeaseStore::wakeup(&*self.$field)
            }
            async fn jobs_next_due(&self, queues: &[String]) -> $crate::StoreResult<Option<chrono::DateTime<chrono::Utc>>> {
                $crate::LeaseStore::jobs_next_due(&*self.$field, queues).await
            }
            async fn jobs_available_of_kind(&self, queue: &str, kind: &str, limit: usize) -> $crate::StoreResult<Vec<$crate::Job>> {
                $crate::LeaseStore::jobs_available_of_kind(&*self.$field, queue, kind, limit).await
            }
        }
    };
    (@part QueueStore, $decorator:ty, $field:ident) => {
        #[$crate::async_trait::async_trait]
        impl $crate::QueueStore for $decorator {
            async fn queues_stats(&self) -> $crate::StoreResult<Vec<$crate::QueueStats>> {
                $crate::QueueStore::queues_stats(&*self.$field).await
            }
            async fn queue_settings_get(&self, queue: &str) -> $crate::StoreResult<$crate::QueueSettings> {
                $crate::QueueStore::queue_settings_get(&*self.$field, queue).await
            }
            async fn queue_settings_put_valid(&self, settings: $crate::Valid<$crate::NamedQueueSettings>) -> $crate::StoreResult<$crate::QueueSettings> {
                $crate::QueueStore::queue_settings_put_valid(&*self.$field, settings).await
            }
            async fn queue_settings_list(&self) -> $crate::StoreResult<Vec<$crate::NamedQueueSettings>> {
                $crate::QueueStore::queue_settings_list(&*self.$field).await
            }
            async fn limit_usage(&self, limit: &str, rate_period_ms: Option<u64>) -> $crate::StoreResult<Vec<$crate::limits::named::KeyUsage>> {
                $crate::QueueStore::limit_usage(&*self.$field, limit, rate_period_ms).await
            }
        }
    };
    (@part ScheduleStore, $decorator:ty, $field:ident) => {
        #[$crate::async_trait::async_trait]
        impl $crate::ScheduleStore for $decorator {
            async fn schedule_put(&self, schedule: $crate::Schedule) -> $crate::StoreResult<$crate::ScheduleView> {
                $crate::ScheduleStore::schedule_put(&*self.$field, schedule).await
            }
            async fn schedule_get(&self, name: &str) -> $crate::StoreResult<Option<$crate::ScheduleView>> {
                $crate::ScheduleStore::schedule_get(&*self.$field, name).await
            }
            async fn schedules_list(&self) -> $crate::StoreResult<Vec<$crate::ScheduleView>> {
                $crate::ScheduleStore::schedules_list(&*self.$field).await
            }
            async fn schedule_delete(&self, name: &str) -> $crate::StoreResult<bool> {
                $crate::ScheduleStore::schedule_delete(&*self.$field, name).await
            }
            async fn schedule_fire(&self, request: $crate::FireRequest) -> $crate::StoreResult<$crate::FireOutcome> {
                $crate::ScheduleStore::schedule_fire(&*self.$field, request).await
            }
            async fn schedule_runs(&self, name: &str, limit: usize) -> $crate::StoreResult<Vec<$crate::ScheduleRun>> {
                $crate::ScheduleStore::schedule_runs(&*self.$field, name, limit).await
            }
        }
    };
    (@part AccessStore, $decorator:ty, $field:ident) => {
        #[$crate::async_trait::async_trait]
        impl $crate::AccessStore for $decorator {
            async fn tokens_insert_valid(&self, token: $crate::Valid<$crate::NewToken>) -> $crate::StoreResult<$crate::ApiToken> {
                $crate::AccessStore::tokens_insert_valid(&*self.$field, token).await
            }
            async fn tokens_list(&self) -> $crate::StoreResult<Vec<$crate::ApiToken>> {
                $crate::AccessStore::tokens_list(&*self.$field).await
            }
            async fn token_revoke(&self, selector: $crate::TokenSelector) -> $crate::StoreResult<Option<$crate::ApiToken>> {
                $crate::AccessStore::token_revoke(&*self.$field, selector).await
            }
            async fn token_get(&self, id: uuid::Uuid) -> $crate::StoreResult<Option<$crate::StoredToken>> {
                $crate::AccessStore::token_get(&*self.$field, id).await
            }
            async fn session_insert(&self, session: $crate::NewSession) -> $crate::StoreResult<()> {
                $crate::AccessStore::session_insert(&*self.$field, session).await
            }
            async fn session_get(&self, id: uuid::Uuid) -> $crate::StoreResult<Option<$crate::StoredSession>> {
                $crate::AccessStore::session_get(&*self.$field, id).await
            }
            async fn session_delete(&self, id: uuid::Uuid) -> $crate::StoreResult<bool> {
                $crate::AccessStore::session_delete(&*self.$field, id).await
            }
            async fn audit_append(&self, entry: $crate::NewAuditEntry) -> $crate::StoreResult<$crate::AuditEntry> {
                $crate::AccessStore::audit_append(&*self.$field, entry).await
            }
            async fn audit_list(&self, params: $crate::AuditListParams) -> $crate::StoreResult<Vec<$crate::AuditEntry>> {
                $crate::AccessStore::audit_list(&*self.$field, params).await
            }
            async fn audit_prune(&self, cutoff: $crate::AuditCutoff, limit: usize) -> $crate::StoreResult<u64> {
                $crate::AccessStore::audit_prune(&*self.$field, cutoff, limit).await
            }
        }
    };
    (@part WorkerStore, $decorator:ty, $field:ident) => {
        #[$crate::async_trait::async_trait]
        impl $crate::WorkerStore for $decorator {
            async fn workers_heartbeat(&self, beat: $crate::WorkerHeartbeat) -> $crate::StoreResult<$crate::WorkerInfo> {
                $crate::WorkerStore::workers_heartbeat(&*self.$field, beat).await
            }
            async fn workers_list(&self) -> $crate::StoreResult<Vec<$crate::WorkerInfo>> {
                $crate::WorkerStore::workers_list(&*self.$field).await
            }
            async fn worker_command(&self, id: &str, command: Option<$crate::workers::WorkerCommand>) -> $crate::StoreResult<Option<$crate::WorkerInfo>> {
                $crate::WorkerStore::worker_command(&*self.$field, id, command).await
            }
            async fn workers_mark_stale(&self, params: $crate::StaleWorkerParams) -> $crate::StoreResult<$crate::StaleReport> {
                $crate::WorkerStore::workers_mark_stale(&*self.$field, params).await
            }
            async fn jobs_stuck(&self, params: $crate::StuckParams) -> $crate::StoreResult<Vec<$crate::StuckJob>> {
                $crate::WorkerStore::jobs_stuck(&*self.$field, params).await
            }
        }
    };
    (@part LeadershipStore, $decorator:ty, $field:ident) => {
        #[$crate::async_trait::async_trait]
        impl $crate::LeadershipStore for $decorator {
            async fn storage_maintenance(&self) -> $crate::StoreResult<()> {
                $crate::LeadershipStore::storage_maintenance(&*self.$field).await
            }
            async fn jobs_rescue_expired(&self, params: $crate::RescueParams) -> $crate::StoreResult<$crate::RescueReport> {
                $crate::LeadershipStore::jobs_rescue_expired(&*self.$field, params).await
            }
            async fn jobs_promote_due(&self) -> $crate::StoreResult<u64> {
                $crate::LeadershipStore::jobs_promote_due(&*self.$field).await
            }
            async fn jobs_prune(&self, params: $crate::PruneParams) -> $crate::StoreResult<$crate::PruneReport> {
                $crate::LeadershipStore::jobs_prune(&*self.$field, params).await
            }
            async fn leader_try_acquire(&self, holder: &str, ttl: std::time::Duration) -> $crate::StoreResult<bool> {
                $crate::LeadershipStore::leader_try_acquire(&*self.$field, holder, ttl).await
            }
            async fn leader_release(&self, holder: &str) -> $crate::StoreResult<()> {
                $crate::LeadershipStore::leader_release(&*self.$field, holder).await
            }
        }
    };
}
