//! The conformance suite every Conveyor store must pass: one public async function per
//! behaviour, each taking a fresh [`Harness`] (a store driven by a [`ManualClock`]).
//!
//! A store crate runs the whole suite from one of its integration tests:
//!
//! ```ignore
//! async fn make_harness() -> conveyor_storetest::Harness {
//!     let clock = std::sync::Arc::new(conveyor_core::ManualClock::default());
//!     let store = MyStore::open(/* fresh database */, clock.clone());
//!     conveyor_storetest::Harness::new(std::sync::Arc::new(store), clock)
//! }
//!
//! conveyor_storetest::conformance_tests!(make_harness);
//! ```
//!
//! The macro expands into one `#[tokio::test]` per behaviour, named after it, so the test crate
//! needs `tokio` (with the `macros` and `rt-multi-thread` features) among its dependencies.
//! Every harness must be fresh (an empty store), and the store must read "now" from the harness
//! clock for every operation: the suite never sleeps, it moves the clock.
//!
//! The crate is also the workspace's test kit: [`eventually`] is the one poll-until-true
//! helper of the integration tests (a dev-dependency of every crate with such tests).

mod access;
mod admin;
mod batches;
mod breakers;
mod config;
mod copy;
mod debounce;
mod events;
pub mod eventually;
mod expiry;
pub mod faults;
mod fetch;
mod finish;
mod hostile;
mod insert;
mod kinds;
mod kit;
mod limits;
pub mod model;
mod named_limits;
pub mod pg_cluster;
mod rescue;
mod retention;
mod schedules;
mod search;
mod sequences;
mod settings;
mod stats;
mod unique;
mod workers;
mod workflows;

pub use access::*;
pub use admin::*;
pub use batches::*;
pub use breakers::*;
pub use config::*;
pub use copy::*;
pub use debounce::*;
pub use events::*;
pub use expiry::*;
pub use fetch::*;
pub use finish::*;
pub use hostile::*;
pub use insert::*;
pub use kinds::*;
pub use limits::*;
pub use named_limits::*;
pub use rescue::*;
pub use retention::*;
pub use schedules::*;
pub use search::*;
pub use sequences::*;
pub use settings::*;
pub use stats::*;
pub use unique::*;
pub use workers::*;
pub use workflows::*;

// The harness and the helpers, public so store crates can reuse them in their own tests.
pub use kit::{
    backoff, bogus_lease, complete, fail, fetch, fetch_none, fetch_one, fetch_params, get, ids,
    insert, insert_one, job_in, lease_of, list, list_all, make_dead, millis, new_job, secs, span,
    Harness, LEASE, WORKER,
};

/// Every behaviour in the suite, by function name (the names of the generated tests).
pub const BEHAVIOURS: &[&str] = crate::__conveyor_behaviours!(names);

/// Expands into one `#[tokio::test]` per behaviour of the suite, each building a fresh harness
/// with `$make().await` (an async fn returning [`Harness`]) and running that behaviour on it.
///
/// ```ignore
/// conveyor_storetest::conformance_tests!(make_harness);
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($make:path) => {
        $crate::__conveyor_behaviours!(tests $make);
    };
}

/// The one list of behaviours; `conformance_tests!` and [`BEHAVIOURS`] are both built from it.
#[doc(hidden)]
#[macro_export]
macro_rules! __conveyor_behaviours {
    ($($mode:tt)*) => {
        $crate::__conveyor_expand! {
            [$($mode)*]
            // insert and idempotency
            insert_returns_available_job_with_uuid_v7,
            insert_many_returns_one_result_per_job_in_order,
            insert_with_future_run_at_is_scheduled,
            insert_with_past_run_at_is_available,
            // search
            jobs_are_found_by_id_prefix_tag_tenant_time_and_payload,
            payload_filters_match_keys_with_quotes_backslashes_and_dots,
            // history
            stats_rollups_add_up_filter_and_prune,
            stats_recorded_events_come_back_as_a_report,
            // circuit breakers
            breaker_records_are_written_only_on_their_version,
            breaker_settings_round_trip_with_queue_and_kind_settings,
            a_fetch_skips_excluded_kinds,
            a_queue_breaker_opens_probes_and_closes_across_processes,
            a_kind_breaker_holds_only_its_kind_and_obeys_operators,
            // expiry and trace context
            a_job_not_started_by_its_expiry_expires_instead_of_running,
            a_retry_after_the_expiry_expires_the_job,
            expired_jobs_are_replayed_like_dead_ones,
            a_queue_default_ttl_gives_jobs_an_expiry,
            trace_context_travels_with_the_job,
            insert_many_is_all_or_nothing,
            idempotency_key_returns_existing_unfinished_job,
            idempotency_key_deduplicates_within_one_batch,
            idempotency_key_matches_completed_job_within_window_only,
            idempotency_key_ignores_dead_and_cancelled_jobs,
            concurrent_duplicate_enqueues_yield_one_job,
            payload_and_tags_round_trip,
            get_unknown_id_returns_none,
            // fetch
            fetch_with_kinds_claims_only_those_kinds,
            fetch_claims_highest_priority_first,
            fetch_orders_by_run_at_then_age_within_priority,
            fetch_respects_max_and_queues,
            fetch_sets_lease_and_increments_attempt,
            concurrent_fetches_never_claim_a_job_twice,
            scheduled_job_becomes_fetchable_when_due,
            // finishing an attempt
            complete_requires_current_lease,
            complete_stores_result_and_finished_at,
            heartbeat_extends_lease_and_reports_lost_leases,
            fail_with_backoff_goes_retryable_then_runs_again,
            fail_records_error_history_in_order,
            fail_after_last_attempt_goes_dead,
            fail_never_goes_dead_at_once,
            fail_at_sets_run_at,
            fail_with_stale_token_changes_nothing,
            snooze_does_not_count_an_attempt,
            release_returns_job_available_without_counting_attempt,
            // rescue
            rescue_moves_expired_leases_to_retryable_with_lease_expired_error,
            rescue_sends_exhausted_jobs_to_dead,
            rescue_leaves_live_leases_alone,
            rescue_honours_limit,
            stale_completion_after_rescue_is_rejected,
            // administration
            cancel_unfinished_job,
            cancel_running_job_revokes_lease,
            cancel_finished_job_conflicts,
            cancel_unknown_job_is_not_found,
            dead_replay_by_ids_keeps_history_and_resets_attempts,
            dead_replay_by_queue_and_kind_filter,
            dead_discard_deletes_only_dead_jobs,
            list_filters_by_queue_state_kind_with_cursor_paging,
            queue_stats_count_each_state_and_oldest_age,
            promote_due_makes_scheduled_and_retryable_available,
            next_due_reports_earliest_scheduled_run_at,
            wakeup_is_notified_after_insert,
            wakeup_is_notified_when_jobs_become_available_again,
            import_preserves_every_field_and_skips_existing_ids,
            leadership_is_exclusive_until_released_or_expired,
            // queue settings
            queue_settings_default_then_round_trip_and_list,
            paused_queue_accepts_enqueues_but_is_not_fetched,
            max_depth_refuses_enqueues_past_the_limit_and_stores_nothing,
            max_depth_per_tenant_limits_each_tenant_separately,
            duplicate_enqueue_into_a_full_queue_returns_the_existing_job,
            concurrency_limit_caps_running_jobs_across_fetches,
            // limits
            per_key_concurrency_limit_caps_each_tenant,
            rate_limit_caps_starts_per_period,
            per_key_rate_limit_budgets_each_tenant,
            tenants_are_served_round_robin,
            kinds_filter_applies_before_limits_pick,
            untenanted_jobs_take_a_turn_among_tenants,
            untenanted_jobs_get_their_turn_after_many_tenants,
            fairness_keeps_priority_within_a_tenant,
            weighted_queues_share_a_fetch,
            invalid_flow_settings_are_refused,
            // named limits
            several_named_limits_hold_at_once,
            limits_named_by_job_queue_and_kind_combine,
            a_named_rate_counts_starts_per_key_and_period,
            a_changed_or_deleted_limit_applies_at_the_next_claim,
            a_keyed_limits_keys_take_turns_by_weight,
            a_key_that_arrives_late_waits_at_most_one_turn,
            a_burst_that_comes_due_takes_one_turn_at_a_time,
            priority_leads_across_keys_and_within_a_key,
            racing_enqueues_of_one_key_take_consecutive_turns,
            // sequences
            a_sequence_runs_one_at_a_time_in_enqueue_order,
            a_retry_holds_back_its_successors,
            a_dead_job_blocks_or_is_skipped,
            a_replayed_dead_job_runs_before_its_successors,
            cancelling_or_expiring_the_job_in_front_releases_the_next,
            a_jobs_sequence_comes_from_itself_its_kind_or_its_queue,
            blocked_jobs_count_towards_the_queue_depth,
            // debounce and throttle
            a_trailing_debounce_keeps_the_last_payload_and_moves_the_run,
            a_trailing_debounce_runs_by_max_wait_however_long_the_burst,
            a_leading_debounce_runs_the_first_and_drops_the_rest,
            a_throttle_lets_one_job_per_key_through_each_period,
            // batches
            a_batch_goes_out_full_or_when_its_oldest_has_waited,
            a_keyed_batch_holds_one_key_and_gives_the_rest_back,
            a_limit_holds_a_batch_and_the_next_ready_one_goes,
            a_plain_fetch_never_claims_a_batch_kind,
            // unique jobs
            unique_by_whole_payload_returns_the_existing_job,
            unique_by_args_ignores_other_fields,
            unique_key_ignores_payload_key_order,
            unique_distinguishes_kinds_and_queues,
            unique_blocks_only_in_the_given_states,
            unique_period_counts_only_jobs_created_within_it,
            unique_deduplicates_within_one_batch,
            unique_idempotency_key_takes_precedence,
            unique_duplicate_into_a_full_queue_returns_the_existing_job,
            unique_concurrent_inserters_yield_one_job,
            unique_spec_is_validated,
            unique_key_survives_import,
            // cron schedules
            schedule_put_get_list_delete_round_trip,
            schedule_fire_is_exactly_once_under_a_race,
            schedule_overlap_skip_records_a_skipped_run,
            schedule_catch_up_fires_at_most_the_maximum_of_missed_ticks,
            schedule_run_history_shows_a_dead_runs_state,
            schedule_refused_job_is_recorded_as_a_refused_run,
            schedule_runs_enter_their_queues_sequence,
            schedule_dst_edges_fire_at_the_right_utc_instants,
            schedule_interval_ticks_from_its_anchor,
            // access control and audit
            token_insert_get_and_list,
            token_names_are_unique_among_active_tokens,
            token_revoke_by_name_or_id_ends_its_sessions,
            session_round_trip_expiry_and_delete,
            audit_append_and_list_newest_first_with_filters,
            audit_prune_deletes_the_oldest_entries_before_the_cutoff,
            // store copy
            copy_onto_itself_reads_everything_and_writes_nothing,
            // worker registry and stuck jobs
            heartbeat_keeps_what_a_later_one_leaves_out,
            workers_keep_an_operators_command_across_heartbeats,
            workers_heartbeat_registers_and_updates_a_worker,
            workers_stopping_heartbeat_records_a_stopped_worker,
            workers_mark_stale_rescues_the_jobs_of_dead_workers,
            workers_dead_worker_that_heartbeats_is_alive_again,
            workers_ended_long_ago_are_forgotten,
            workers_heartbeat_is_validated,
            stuck_jobs_are_judged_by_history_then_timeout_then_default,
            // hostile input
            nul_characters_are_refused_naming_the_field,
            nul_characters_in_error_messages_are_stored_escaped,
            numbers_beyond_i64_are_refused,
            absurd_leases_are_refused_and_the_store_keeps_working,
            fetches_name_a_bounded_number_of_distinct_queues,
            idempotency_key_is_held_by_an_older_job_made_unfinished_again,
            payloads_nested_too_deeply_are_refused,
            // retention
            prune_deletes_finished_jobs_past_their_retention,
            prune_honours_queue_retention_and_limit,
            // workflows
            flow_chain_runs_steps_in_order_handing_on_results,
            flow_fan_in_callback_starts_once_with_every_result,
            flow_dead_step_fails_the_flow_and_its_replay_resumes_it,
            flow_skip_and_continue_policies_absorb_a_failure,
            flow_compensates_completed_steps_latest_first,
            flow_dying_compensation_fails_the_flow_naming_the_step,
            flow_wait_completes_on_its_signal_even_one_sent_early,
            flow_wait_fails_with_timeout_when_its_deadline_passes,
            flow_signal_errors_name_what_is_wrong,
            flow_cancel_cancels_every_unfinished_step,
            flow_step_cancelled_alone_counts_as_a_failure,
            flow_step_whose_lease_expires_on_its_last_attempt_fails_the_flow,
            flow_create_is_validated_and_all_or_nothing,
            flow_idempotency_key_returns_the_first_flow,
            flow_started_jobs_are_told_once_committed,
            flows_list_filters_by_state_and_name_newest_first,
            job_progress_is_recorded_while_the_lease_holds,
            flows_prune_deletes_finished_flows_past_their_retention,
            flow_step_keeps_its_outcome_when_its_job_is_pruned,
            // settings per kind
            kind_settings_round_trip_and_refuse_bad_schemas,
            kind_schema_is_enforced_on_enqueue_and_counts_queued_violations,
            // shared configuration
            config_documents_round_trip_by_collection,
            // events
            events_accept_stores_jobs_and_flows_all_or_none_once,
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conveyor_expand {
    ([tests $make:path] $($name:ident,)*) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let h = $make().await;
                $crate::$name(&h).await;
            }
        )*
    };
    ([names] $($name:ident,)*) => {
        &[$(stringify!($name)),*]
    };
}
