//! The statements operations run through their context (`Ctx::sql`), built once per store for
//! its schema: the jobs table's here, and those of the flows (`sql/workflow.rs`) and the limited
//! claim (`sql/limits.rs`), which operations on jobs call inside their transactions. Kept apart
//! from those modules so that they and the operations all read them without importing each
//! other. Modules only the `Store` methods call (schedules, access, workers, kinds, retention,
//! history) keep their statements beside their code, held by the store next to these.
//!
//! Table names cannot be bound as parameters, so the (validated, quoted) schema is spliced into
//! the text here, once; every value is a bind parameter. Keeping the text fixed per store also
//! lets sqlx reuse one prepared statement per connection for each.

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};
use std::sync::Arc;

use crate::names::{channel, quoted};

mod limits;
mod workflow;

pub(crate) use workflow::HEAD_COLUMNS;

/// The columns of a job row, in the order `rows::job` expects by name.
pub(crate) const COLUMNS: &str = "id, kind, queue, payload, priority, run_at, attempt, \
    max_attempts, timeout_ms, idempotency_key, tags, tenant, state, errors, lease_worker, \
    lease_token, lease_expires_at, result, created_at, started_at, finished_at, unique_key, \
    flow_id, flow_step, parents, progress, expires_at, trace, limit_keys, sequence_key, \
    sequence_no, sequence_skip_dead";

/// The advisory lock key of a sequence key, as the insert computes it: the same expression the
/// release trigger of migration 22 locks with (its schema is `TG_TABLE_SCHEMA` there, `$2`
/// here), so an enqueue and a release of one key serialize. The same round trip first arms the
/// release triggers if no job of a sequence has yet (migration 26), before the transaction
/// writes a job: the insert trigger would arm them too, but as a lock upgrade that two
/// transactions can deadlock on.
pub(crate) fn sequence_lock_keys_sql(schema: &str) -> String {
    format!(
        "WITH armed AS MATERIALIZED (SELECT {}.sequence_release_arm()) \
         SELECT hashtextextended('conveyor:sequence:' || $2 || ':' || k, 0) \
         FROM armed, unnest($1::text[]) AS k",
        quoted(schema)
    )
}

/// A replayed job's state: available, or blocked behind its sequence (the release trigger of
/// migration 22 lets it run at once when nothing holds the sequence).
const REPLAYED_STATE: &str = "CASE WHEN sequence_key IS NULL THEN 'available' ELSE 'blocked' END";

/// The columns of a queue settings row, as `rows::settings_of` reads them by name.
pub(crate) const SETTINGS_COLUMNS: &str = "paused, max_depth, max_depth_per_tenant, \
    concurrency_limit, per_key_concurrency_limit, rate_count, rate_period_ms, \
    per_key_rate_count, per_key_rate_period_ms, weight, completed_retention_secs, \
    dead_retention_secs, default_ttl_ms, circuit_breaker, limits, sequence";

/// "This row is running", for statements that find their rows by id (and lease token).
///
/// Written with an explicit `COLLATE "C"` so that the planner cannot prove the predicate of the
/// partial index `jobs_lease` (`WHERE state = 'running'`) from it, which leaves the primary key
/// as the only index that fits. Without it, once the table has statistics (at depth they say
/// almost nothing is running), the generic plan of a batched completion scanned every running
/// job through `jobs_lease` and compared each with every item of the batch: 900 ms for 1,000
/// completions with 4,400 jobs running, where the key lookups take 6 ms. Text equality is the
/// same under every deterministic collation, so the meaning does not change.
fn running(alias: &str) -> String {
    format!("{alias}state = 'running' COLLATE \"C\"")
}

/// [`COLUMNS`] qualified with the alias `j`, for `UPDATE ... FROM` statements where a bare `id`
/// would be ambiguous.
fn columns_of_j() -> String {
    COLUMNS
        .split(", ")
        .map(|column| format!("j.{column}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A statement text that clones without copying (sqlx copies plain `String`s on each clone).
pub(crate) fn stmt(text: String) -> SqlStr {
    AssertSqlSafe(Arc::<str>::from(text)).into_sql_str()
}

pub(crate) struct Sql {
    /// `"schema".jobs`, for statements assembled per call (job listing).
    pub jobs: String,
    /// The NOTIFY channel of this schema.
    pub channel: String,
    pub get: SqlStr,
    pub lock_keys: SqlStr,
    pub idempotent_matches: SqlStr,
    /// The advisory lock key of each sequence key (`$1`) in schema `$2`: computed by the
    /// database, because its release trigger takes the same lock (migration 22).
    pub sequence_lock_keys: SqlStr,
    /// Arms the sequence release triggers unless they are (migration 26): a copy's import calls
    /// it before it writes jobs of a sequence, for the reason `sequence_lock_keys_sql` gives.
    pub sequence_release_arm: SqlStr,
    /// Per sequence key (`$1`): the last number, and whether a job of the key holds the
    /// sequence or waits in it.
    pub sequence_tails: SqlStr,
    /// Per fold key (`$1`): its latest job, locked until the insert commits, so no claim or
    /// promotion changes it while an enqueue folds into it.
    pub fold_standing: SqlStr,
    /// A trailing debounce's standing job takes the payload (`$2`) and run_at (`$3`).
    pub fold_replace: SqlStr,
    /// A leading debounce's standing job keeps dropping enqueues until `$2`.
    pub fold_extend: SqlStr,
    pub unique_matches: SqlStr,
    pub insert: SqlStr,
    pub insert_unlimited: SqlStr,
    /// `insert` and `insert_unlimited` for a batch of plain jobs (`InsertShape::Plain`).
    pub insert_plain: SqlStr,
    pub insert_plain_unlimited: SqlStr,
    pub depth_limits: SqlStr,
    pub depths: SqlStr,
    pub notify: SqlStr,
    pub promote: SqlStr,
    pub expire_plain: SqlStr,
    pub expiring_flow_jobs: SqlStr,
    pub expire_flow_job: SqlStr,
    pub claim: SqlStr,
    pub claim_one_queue: SqlStr,
    /// `claim` and `claim_one_queue` for a fetch of every kind (no `$6`): see `KindFilter`.
    pub claim_any_kind: SqlStr,
    pub claim_one_queue_any_kind: SqlStr,
    /// `claim` and `claim_one_queue` for a fetch of every kind but `$6` (kinds whose circuit
    /// breaker is open).
    pub claim_except_kinds: SqlStr,
    pub claim_one_queue_except_kinds: SqlStr,
    pub claim_gate: SqlStr,
    pub claim_one_queue_gate: SqlStr,
    pub heartbeat: SqlStr,
    pub complete: SqlStr,
    pub complete_flow_jobs: SqlStr,
    pub held: SqlStr,
    pub record_failure: SqlStr,
    pub snooze: SqlStr,
    pub release: SqlStr,
    pub rescue_pick: SqlStr,
    pub cancel_lock: SqlStr,
    pub cancel: SqlStr,
    pub cancel_unhooked: SqlStr,
    pub replay_ids: SqlStr,
    pub replay_filter: SqlStr,
    pub dead_flow_jobs_ids: SqlStr,
    pub dead_flow_jobs_filter: SqlStr,
    pub replay_flow_jobs: SqlStr,
    pub progress: SqlStr,
    pub discard: SqlStr,
    pub stats: SqlStr,
    pub next_due: SqlStr,
    pub available_of_kind: SqlStr,
    pub import: SqlStr,
    pub leader_acquire: SqlStr,
    pub leader_release: SqlStr,
    pub settings_get: SqlStr,
    pub settings_put: SqlStr,
    pub settings_list: SqlStr,
    pub paused_queues: SqlStr,
    /// The limited claim's statements and state.
    pub limits: limits::LimitSql,
    /// Workflows' statements.
    pub workflow: workflow::WorkflowSql,
}

impl Sql {
    /// Statements for `schema`, which must already be validated.
    pub(crate) fn new(schema: &str) -> Self {
        let jobs = format!("{}.jobs", quoted(schema));
        let leadership = format!("{}.leadership", quoted(schema));
        let settings = format!("{}.queue_settings", quoted(schema));
        let j_columns = columns_of_j();
        let many_gate = flow_gate(
            &jobs,
            &settings,
            "s.queue = ANY($1)",
            "t.queue = ANY($1)",
            true,
        );
        let one_gate = flow_gate(&jobs, &settings, "s.queue = $1", "t.queue = $1", false);
        let many_condition = format!(
            "c.queue = ANY($1) AND NOT EXISTS (SELECT 1 FROM {settings} s \
                 WHERE s.queue = c.queue AND s.paused)"
        );
        // Statements that make jobs available end with this: one NOTIFY per queue, sent by
        // PostgreSQL when (and only if) the statement's transaction commits. `changed` is the
        // CTE of the modified rows; the caller sums `n`. The unnamed void column is not read.
        let notify_changed = |param: u32| {
            format!(
                "SELECT queue, count(*) AS n, pg_notify(${param}, queue) \
                 FROM changed GROUP BY queue"
            )
        };
        Self {
            channel: channel(schema),
            get: stmt(format!("SELECT {COLUMNS} FROM {jobs} WHERE id = $1")),
            // `unnest` reads the array in order, and the caller sorts it: every transaction takes
            // its key locks in ascending order, so two batches sharing keys cannot deadlock.
            lock_keys: stmt(
                "SELECT pg_advisory_xact_lock(k) FROM unnest($1::int8[]) AS t(k)".to_string(),
            ),
            sequence_lock_keys: stmt(sequence_lock_keys_sql(schema)),
            sequence_release_arm: stmt(format!(
                "SELECT {}.sequence_release_arm()",
                quoted(schema)
            )),
            sequence_tails: stmt(format!(
                "SELECT k AS key, \
                     (SELECT max(sequence_no) FROM {jobs} WHERE sequence_key = k) AS last, \
                     EXISTS (SELECT 1 FROM {jobs} WHERE sequence_key = k \
                         AND state IN ('blocked', 'scheduled', 'available', 'running', \
                             'retryable', 'dead') \
                         AND {}) AS waits \
                 FROM unnest($1::text[]) AS k",
                conveyor_core::sequence::waits_sql("")
            )),
            fold_standing: stmt(format!(
                "SELECT k AS key, s.id, s.state, s.created_at, s.fold_until \
                 FROM unnest($1::text[]) AS k, LATERAL ( \
                     SELECT id, state, created_at, fold_until FROM {jobs} \
                     WHERE fold_key = k ORDER BY created_at DESC, id DESC LIMIT 1 \
                     FOR UPDATE) s"
            )),
            fold_replace: stmt(format!(
                "UPDATE {jobs} SET payload = $2, run_at = $3 \
                 WHERE id = $1 AND state = 'scheduled' RETURNING {COLUMNS}"
            )),
            fold_extend: stmt(format!(
                "UPDATE {jobs} SET fold_until = COALESCE($2, fold_until) WHERE id = $1 \
                 RETURNING {COLUMNS}"
            )),
            // The latest job holding each key; the caller applies the window rules.
            idempotent_matches: stmt(format!(
                "SELECT DISTINCT ON (idempotency_key) {COLUMNS} FROM {jobs} \
                 WHERE idempotency_key = ANY($1) \
                 AND (state NOT IN ('completed', 'dead', 'cancelled', 'expired') \
                      OR (state = 'completed' AND finished_at > $2)) \
                 ORDER BY idempotency_key, created_at DESC, id DESC"
            )),
            // For each unique job of a batch (`$1` keys, `$2` comma-separated states, `$3` the
            // window's start or NULL), the latest job holding the key in one of the states,
            // created after the start; `pos` is the entry's 1-based position. One backward
            // range scan of `jobs_unique` per state, so a key's long history in other states
            // is never read (with the states as one `= ANY` filter the planner cannot estimate
            // them and scans every job of the key).
            unique_matches: stmt(format!(
                "SELECT u.pos, m.* \
                 FROM unnest($1::text[], $2::text[], $3::timestamptz[]) WITH ORDINALITY \
                     AS u(key, states, since, pos) \
                 CROSS JOIN LATERAL ( \
                     SELECT x.* FROM unnest(string_to_array(u.states, ',')) AS s(state) \
                     CROSS JOIN LATERAL ( \
                         SELECT {j_columns} FROM {jobs} j \
                         WHERE j.unique_key = u.key AND j.state = s.state \
                             AND j.created_at > COALESCE(u.since, '-infinity') \
                         ORDER BY j.created_at DESC, j.id DESC LIMIT 1) x \
                     ORDER BY x.created_at DESC, x.id DESC LIMIT 1) m"
            )),
            insert: stmt(insert_sql(&jobs, &settings, InsertShape::Featured, false)),
            insert_unlimited: stmt(insert_sql(&jobs, &settings, InsertShape::Featured, true)),
            insert_plain: stmt(insert_sql(&jobs, &settings, InsertShape::Plain, false)),
            insert_plain_unlimited: stmt(insert_sql(&jobs, &settings, InsertShape::Plain, true)),
            depth_limits: stmt(format!(
                "SELECT queue, max_depth, max_depth_per_tenant FROM {settings} \
                 WHERE queue = ANY($1) \
                     AND (max_depth IS NOT NULL OR max_depth_per_tenant IS NOT NULL)"
            )),
            // Unfinished jobs of each (queue, tenant) pair, in the order given; a NULL tenant
            // asks for the whole queue. The queue's count is the sum over the partial indexes
            // that together cover the unfinished states (`jobs_fetch`, `jobs_lease`,
            // `jobs_waiting`, `jobs_blocked`), the tenant's likewise (`jobs_fair`,
            // `jobs_running_keyed`, `jobs_waiting_tenant`, `jobs_blocked`; migrations 7, 24, 26).
            depths: stmt(format!(
                "SELECT CASE WHEN d.tenant IS NULL THEN \
                         (SELECT count(*) FROM {jobs} j \
                          WHERE j.queue = d.queue AND j.state = 'available') \
                         + (SELECT count(*) FROM {jobs} j \
                            WHERE j.queue = d.queue AND j.state = 'running') \
                         + (SELECT count(*) FROM {jobs} j \
                            WHERE j.queue = d.queue AND j.state IN ('scheduled', 'retryable')) \
                         + (SELECT count(*) FROM {jobs} j \
                            WHERE j.queue = d.queue AND j.state = 'blocked') \
                     ELSE \
                         (SELECT count(*) FROM {jobs} j \
                          WHERE j.queue = d.queue AND j.tenant = d.tenant \
                              AND j.tenant IS NOT NULL AND j.state = 'available') \
                         + (SELECT count(*) FROM {jobs} j \
                            WHERE j.queue = d.queue AND j.tenant = d.tenant \
                                AND j.tenant IS NOT NULL AND j.state = 'running') \
                         + (SELECT count(*) FROM {jobs} j \
                            WHERE j.queue = d.queue AND j.tenant = d.tenant \
                                AND j.tenant IS NOT NULL \
                                AND j.state IN ('scheduled', 'retryable')) \
                         + (SELECT count(*) FROM {jobs} j \
                            WHERE j.queue = d.queue AND j.tenant = d.tenant \
                                AND j.state = 'blocked') \
                     END AS depth \
                 FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS d(queue, tenant, pos) \
                 ORDER BY d.pos"
            )),
            notify: stmt("SELECT pg_notify($1, q) FROM unnest($2::text[]) AS t(q)".to_string()),
            // Due jobs, earliest first, in a bounded batch. SKIP LOCKED: concurrent fetchers
            // promote disjoint rows instead of queueing behind each other. MATERIALIZED pins the
            // pick to one evaluation, so the LIMIT and the locks apply exactly once.
            promote: stmt(format!(
                "WITH due AS MATERIALIZED ( \
                     SELECT id FROM {jobs} \
                     WHERE state IN ('scheduled', 'retryable') AND run_at <= $1 \
                     ORDER BY run_at LIMIT $2 \
                     FOR UPDATE SKIP LOCKED), \
                 changed AS ( \
                     UPDATE {jobs} j SET state = 'available' FROM due \
                     WHERE j.id = due.id RETURNING j.queue) \
                 {}",
                notify_changed(3)
            )),
            // Waiting jobs whose expiry has come, soonest first, in a bounded batch (see
            // `ops::expire_due`); jobs of flows go one by one, after their flow's lock.
            expire_plain: stmt(format!(
                "WITH due AS MATERIALIZED ( \
                     SELECT id FROM {jobs} WHERE expires_at IS NOT NULL \
                     AND state IN ('scheduled', 'available', 'retryable') \
                     AND expires_at <= $1 AND flow_id IS NULL \
                     ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
                 UPDATE {jobs} j SET state = 'expired', finished_at = $1 FROM due \
                 WHERE j.id = due.id"
            )),
            expiring_flow_jobs: stmt(format!(
                "SELECT id, flow_id FROM {jobs} WHERE expires_at IS NOT NULL \
                 AND state IN ('scheduled', 'available', 'retryable') \
                 AND expires_at <= $1 AND flow_id IS NOT NULL \
                 ORDER BY expires_at LIMIT $2"
            )),
            expire_flow_job: stmt(format!(
                "UPDATE {jobs} SET state = 'expired', finished_at = $1 \
                 WHERE id = $2 AND state IN ('scheduled', 'available', 'retryable') \
                     AND expires_at <= $1 \
                 RETURNING {COLUMNS}"
            )),
            // Claim and mark running in one statement: rows another fetcher is claiming are
            // skipped, never double-claimed, and never waited for.
            // Jobs of paused queues are not claimed. With several queues the check is per row
            // (an anti-join on the settings' primary key); with one it is a one-time check on
            // `$1`, leaving the ordered scan of `jobs_fetch` as it was.
            // Both are the fast path for queues without limits: a one-time check (the
            // gate) refuses to claim anything when a (not paused) queue of `$1` has limits or
            // tenanted jobs waiting. When nothing was claimed the caller asks the gate alone
            // (`claim_gate`), and if it says so takes the limited claim (`limits.rs`).
            claim: stmt(gated_claim_sql(
                &jobs,
                &j_columns,
                &many_condition,
                &many_gate,
                KindFilter::Kinds,
            )),
            claim_any_kind: stmt(gated_claim_sql(
                &jobs,
                &j_columns,
                &many_condition,
                &many_gate,
                KindFilter::AnyKind,
            )),
            claim_except_kinds: stmt(gated_claim_sql(
                &jobs,
                &j_columns,
                &many_condition,
                &many_gate,
                KindFilter::ExceptKinds,
            )),
            claim_gate: stmt(format!("SELECT {many_gate}")),
            // The common case (a worker's fetch loop serves one queue): with `queue = $1` the
            // index hands rows over in claim order, where `= ANY` makes PostgreSQL sort every
            // available job of the queues on each fetch.
            claim_one_queue: stmt(gated_claim_sql(
                &jobs,
                &j_columns,
                &one_queue_condition(&settings),
                &one_gate,
                KindFilter::Kinds,
            )),
            claim_one_queue_any_kind: stmt(gated_claim_sql(
                &jobs,
                &j_columns,
                &one_queue_condition(&settings),
                &one_gate,
                KindFilter::AnyKind,
            )),
            claim_one_queue_except_kinds: stmt(gated_claim_sql(
                &jobs,
                &j_columns,
                &one_queue_condition(&settings),
                &one_gate,
                KindFilter::ExceptKinds,
            )),
            claim_one_queue_gate: stmt(format!("SELECT {one_gate}")),
            heartbeat: stmt(format!(
                "UPDATE {jobs} j SET lease_expires_at = b.expires_at \
                 FROM unnest($1::uuid[], $2::uuid[], $3::timestamptz[]) \
                     AS b(id, token, expires_at) \
                 WHERE j.id = b.id AND {} AND j.lease_token = b.token \
                 RETURNING j.id, b.token",
                running("j.")
            )),
            // `result` stays SQL NULL for "no result" and is jsonb `null` for `Some(Null)`.
            // Plain jobs only: a job of a flow must tell its flow in the same transaction,
            // after locking the flow, so it is left for `complete_flow_jobs` (the filter reads
            // one column of the row the key lookup already found). The filter mentions `c` so
            // that it is a join filter, never a filter of the scan of `jobs`: on a table not yet
            // analyzed, `flow_id IS NULL AND state = 'running'` was estimated at one row, and
            // the planner scanned `jobs` first and compared every running job with every
            // completion (4.85 M comparisons, 870 ms for a batch of 1,000 with 4,851 running,
            // seen with auto_explain on a fresh schema).
            //
            // Rows with a token are the completions applied. When some were not, the same
            // round trip names the batch's jobs of flows (`flow_id` set, token null), read
            // from the statement's snapshot (a job's flow never changes): a batch that every
            // row of the update applied (any plain drain) skips that read (a one-time filter).
            complete: stmt(format!(
                "WITH done AS ( \
                     UPDATE {jobs} j SET state = 'completed', result = c.result, \
                         finished_at = $4, lease_token = NULL, lease_expires_at = NULL \
                     FROM unnest($1::uuid[], $2::uuid[], $3::jsonb[]) AS c(id, token, result) \
                     WHERE j.id = c.id AND {} AND j.lease_token = c.token \
                         AND (j.flow_id IS NULL OR c.id IS NULL) \
                     RETURNING j.id, c.token) \
                 SELECT id, token, NULL::uuid AS flow_id FROM done \
                 UNION ALL \
                 SELECT f.id, NULL::uuid, f.flow_id FROM {jobs} f \
                 WHERE (SELECT count(*) FROM done) < cardinality($1::uuid[]) \
                     AND f.id = ANY($1::uuid[]) AND f.flow_id IS NOT NULL",
                running("j.")
            )),
            // The same for jobs of flows, run once their flows are locked, under the flow
            // transaction's planner settings (joins as nested loops only). The running check
            // mentions `c`, so it is a join filter and never a filter of the scan of `jobs`:
            // with statistics taken while no job ran, `state = 'running'` was estimated at one
            // row, and the plan scanned the running jobs and compared each with every completion
            // (0.35 to 1 s a batch of 1,000 with 1,000 to 4,000 running, seen with auto_explain
            // in a flow benchmark run after a drain). Without a filter of its own, the scan of
            // `jobs` is the whole table, and the only nested loop worth its cost probes the key.
            complete_flow_jobs: stmt(format!(
                "UPDATE {jobs} j SET state = 'completed', result = c.result, finished_at = $4, \
                     lease_token = NULL, lease_expires_at = NULL \
                 FROM unnest($1::uuid[], $2::uuid[], $3::jsonb[]) AS c(id, token, result) \
                 WHERE j.id = c.id AND ({} OR c.id IS NULL) AND j.lease_token = c.token \
                 RETURNING j.id, c.token, j.flow_id",
                running("j.")
            )),
            held: stmt(format!(
                "SELECT attempt, max_attempts, flow_id, expires_at, lease_worker, started_at \
                 FROM {jobs} \
                 WHERE id = $1 AND {} AND lease_token = $2",
                running("")
            )),
            // Shared by fail and rescue. Still conditional on the token: if the lease was lost
            // since it was read, nothing changes and no row comes back.
            // A retry that could not start before the job expires makes it expire now.
            record_failure: stmt(format!(
                "UPDATE {jobs} SET \
                     state = CASE WHEN $1 = 'retryable' AND expires_at IS NOT NULL \
                         AND $2 >= expires_at THEN 'expired' ELSE $1 END, \
                     finished_at = CASE WHEN $1 = 'retryable' AND expires_at IS NOT NULL \
                         AND $2 >= expires_at THEN $7 ELSE $3 END, \
                     run_at = COALESCE($2, run_at), \
                     errors = errors || jsonb_build_array($4::jsonb), \
                     lease_token = NULL, lease_expires_at = NULL \
                 WHERE id = $5 AND {} AND lease_token = $6 \
                 RETURNING {COLUMNS}",
                running("")
            )),
            snooze: stmt(format!(
                "UPDATE {jobs} SET state = $1, run_at = $2, attempt = GREATEST(attempt - 1, 0), \
                     lease_token = NULL, lease_expires_at = NULL \
                 WHERE id = $3 AND {} AND lease_token = $4 \
                 RETURNING {COLUMNS}",
                running("")
            )),
            release: stmt(format!(
                "WITH changed AS ( \
                     UPDATE {jobs} j SET state = 'available', \
                         attempt = GREATEST(j.attempt - 1, 0), \
                         lease_token = NULL, lease_expires_at = NULL \
                     FROM unnest($1::uuid[], $2::uuid[]) AS r(id, token) \
                     WHERE j.id = r.id AND {} AND j.lease_token = r.token \
                     RETURNING j.queue) \
                 {}",
                running("j."),
                notify_changed(3)
            )),
            // Locked so two rescuers (or a rescuer and the holder's completion) never both act
            // on one job; SKIP LOCKED lets concurrent rescuers share the work.
            rescue_pick: stmt(format!(
                "SELECT id, attempt, max_attempts, lease_worker, lease_token, flow_id, expires_at, \
                     started_at \
                 FROM {jobs} \
                 WHERE state = 'running' AND lease_expires_at <= $1 \
                 ORDER BY lease_expires_at LIMIT $2 \
                 FOR UPDATE SKIP LOCKED"
            )),
            cancel_lock: stmt(format!(
                "SELECT state, flow_id FROM {jobs} WHERE id = $1 FOR UPDATE"
            )),
            cancel: stmt(format!(
                "UPDATE {jobs} SET state = 'cancelled', finished_at = $1, \
                     lease_token = NULL, lease_expires_at = NULL \
                 WHERE id = $2 RETURNING {COLUMNS}"
            )),
            // A flow cancelling its own step's job: no state check to report, and no hook.
            cancel_unhooked: stmt(format!(
                "UPDATE {jobs} SET state = 'cancelled', finished_at = $1, \
                     lease_token = NULL, lease_expires_at = NULL \
                 WHERE id = $2 AND state NOT IN ('completed', 'dead', 'cancelled', 'expired')"
            )),
            replay_ids: stmt(format!(
                "WITH changed AS ( \
                     UPDATE {jobs} SET state = {REPLAYED_STATE}, attempt = 0, run_at = $1, fair_turn = NULL, \
                         finished_at = NULL, result = NULL, expires_at = NULL, \
                         errors = CASE WHEN jsonb_array_length(errors) > 0 \
                             THEN jsonb_set(errors, ARRAY[(jsonb_array_length(errors) - 1)::text, \
                                 'replayed_at'], to_jsonb($1::timestamptz)) ELSE errors END \
                     WHERE id = ANY($2) AND state IN ('dead', 'expired') AND flow_id IS NULL \
                     RETURNING queue) \
                 {}",
                notify_changed(3)
            )),
            replay_filter: stmt(format!(
                "WITH changed AS ( \
                     UPDATE {jobs} SET state = {REPLAYED_STATE}, attempt = 0, run_at = $1, fair_turn = NULL, \
                         finished_at = NULL, result = NULL, \
                         errors = CASE WHEN jsonb_array_length(errors) > 0 \
                             THEN jsonb_set(errors, ARRAY[(jsonb_array_length(errors) - 1)::text, \
                                 'replayed_at'], to_jsonb($1::timestamptz)) ELSE errors END \
                     WHERE state = 'dead' \
                         AND ($2::text IS NULL OR queue = $2) \
                         AND ($3::text IS NULL OR kind = $3) \
                         AND flow_id IS NULL \
                     RETURNING queue) \
                 {}",
                notify_changed(4)
            )),
            // The dead jobs of flows a replay selects (by ids, or by queue and kind): replayed
            // by `replay_flow_jobs` once their flows are locked.
            dead_flow_jobs_ids: stmt(format!(
                "SELECT id, flow_id FROM {jobs} \
                 WHERE id = ANY($1) AND state IN ('dead', 'expired') AND flow_id IS NOT NULL"
            )),
            dead_flow_jobs_filter: stmt(format!(
                "SELECT id, flow_id FROM {jobs} \
                 WHERE state = 'dead' AND ($1::text IS NULL OR queue = $1) \
                     AND ($2::text IS NULL OR kind = $2) AND flow_id IS NOT NULL"
            )),
            replay_flow_jobs: stmt(format!(
                "UPDATE {jobs} SET state = 'available', attempt = 0, run_at = $1, \
                     fair_turn = NULL, finished_at = NULL, result = NULL, expires_at = NULL, \
                     errors = CASE WHEN jsonb_array_length(errors) > 0 \
                             THEN jsonb_set(errors, ARRAY[(jsonb_array_length(errors) - 1)::text, \
                                 'replayed_at'], to_jsonb($1::timestamptz)) ELSE errors END \
                 WHERE id = ANY($2) AND state IN ('dead', 'expired') \
                 RETURNING id, queue, flow_id"
            )),
            progress: stmt(format!(
                "UPDATE {jobs} SET progress = $1 WHERE id = $2 AND {} AND lease_token = $3",
                running("")
            )),
            discard: stmt(format!(
                "DELETE FROM {jobs} WHERE id = $1 AND state IN ('dead', 'expired')"
            )),
            stats: stmt(format!(
                "SELECT queue, state, count(*) AS n, \
                     min(run_at) FILTER (WHERE state = 'available') AS oldest_run_at \
                 FROM {jobs} GROUP BY queue, state"
            )),
            next_due: stmt(format!(
                "SELECT run_at FROM {jobs} \
                 WHERE state IN ('scheduled', 'retryable') AND queue = ANY($1) \
                 ORDER BY run_at LIMIT 1"
            )),
            // A batch fetch's look: a range of the claim index, other kinds skipped.
            available_of_kind: stmt(format!(
                "SELECT {COLUMNS} FROM {jobs} \
                 WHERE state = 'available' AND queue = $1 AND kind = $2 \
                 ORDER BY priority DESC, run_at, id LIMIT $3"
            )),
            // Jobs exactly as given, every column, skipping ids that exist (so an interrupted
            // copy resumes). Also how a flow's jobs are stored as their steps start.
            import: stmt(format!(
                "INSERT INTO {jobs} ({COLUMNS}, fair_key) \
                 SELECT n.id, n.kind, n.queue, n.payload, n.priority, n.run_at, n.attempt, \
                     n.max_attempts, n.timeout_ms, n.idempotency_key, \
                     ARRAY(SELECT t.tag FROM jsonb_array_elements_text(n.tags) \
                           WITH ORDINALITY AS t(tag, pos) ORDER BY t.pos), \
                     n.tenant, n.state, n.errors, n.lease_worker, n.lease_token, \
                     n.lease_expires_at, n.result, n.created_at, n.started_at, n.finished_at, \
                     n.unique_key, n.flow_id, n.flow_step, n.parents, n.progress, \
                     n.expires_at, n.trace, n.limit_keys, n.sequence_key, n.sequence_no, \
                     n.sequence_skip_dead, n.fair_key \
                 FROM unnest($1::uuid[], $2::text[], $3::text[], $4::jsonb[], $5::int4[], \
                             $6::timestamptz[], $7::int4[], $8::int4[], $9::int8[], \
                             $10::text[], $11::jsonb[], $12::text[], $13::text[], \
                             $14::jsonb[], $15::text[], $16::uuid[], $17::timestamptz[], \
                             $18::jsonb[], $19::timestamptz[], $20::timestamptz[], \
                             $21::timestamptz[], $22::text[], $23::uuid[], $24::text[], \
                             $25::jsonb[], $26::jsonb[], $27::timestamptz[], \
                             $28::jsonb[], $29::jsonb[], $30::text[], $31::text[], \
                             $32::int8[], $33::bool[]) \
                     AS n(id, kind, queue, payload, priority, run_at, attempt, max_attempts, \
                          timeout_ms, idempotency_key, tags, tenant, state, errors, \
                          lease_worker, lease_token, lease_expires_at, result, created_at, \
                          started_at, finished_at, unique_key, flow_id, flow_step, parents, \
                          progress, expires_at, trace, limit_keys, fair_key, sequence_key, \
                          sequence_no, sequence_skip_dead) \
                 ON CONFLICT (id) DO NOTHING \
                 RETURNING id, queue, state"
            )),
            // Takes the role when it is free, expired, or already the caller's; otherwise the
            // conflict's WHERE leaves the row alone and nothing is returned. One atomic
            // statement, so two nodes racing for an expired role cannot both win.
            leader_acquire: stmt(format!(
                "INSERT INTO {leadership} AS l (name, holder, expires_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (name) DO UPDATE \
                     SET holder = excluded.holder, expires_at = excluded.expires_at \
                     WHERE l.holder = excluded.holder OR l.expires_at <= $4 \
                 RETURNING holder"
            )),
            leader_release: stmt(format!(
                "DELETE FROM {leadership} WHERE name = $1 AND holder = $2"
            )),
            settings_get: stmt(format!(
                "SELECT {SETTINGS_COLUMNS} FROM {settings} WHERE queue = $1"
            )),
            // Also says whether the queue was paused before, so a resume can wake fetchers.
            settings_put: stmt(format!(
                "WITH previous AS (SELECT paused FROM {settings} WHERE queue = $1), \
                 stored AS ( \
                     INSERT INTO {settings} AS s \
                         (queue, paused, max_depth, max_depth_per_tenant, concurrency_limit, \
                          updated_at, per_key_concurrency_limit, rate_count, rate_period_ms, \
                          per_key_rate_count, per_key_rate_period_ms, weight, \
                          completed_retention_secs, dead_retention_secs, default_ttl_ms, \
                          circuit_breaker, limits, sequence) \
                     VALUES ($1, $2, $3, $4, $6, $5, $7, $8, $9, $10, $11, $12, $13, $14, \
                         $15, $16, $17, $18) \
                     ON CONFLICT (queue) DO UPDATE SET paused = excluded.paused, \
                         max_depth = excluded.max_depth, \
                         max_depth_per_tenant = excluded.max_depth_per_tenant, \
                         concurrency_limit = excluded.concurrency_limit, \
                         per_key_concurrency_limit = excluded.per_key_concurrency_limit, \
                         rate_count = excluded.rate_count, \
                         rate_period_ms = excluded.rate_period_ms, \
                         per_key_rate_count = excluded.per_key_rate_count, \
                         per_key_rate_period_ms = excluded.per_key_rate_period_ms, \
                         weight = excluded.weight, \
                         completed_retention_secs = excluded.completed_retention_secs, \
                         dead_retention_secs = excluded.dead_retention_secs, \
                         default_ttl_ms = excluded.default_ttl_ms, \
                         circuit_breaker = excluded.circuit_breaker, \
                         limits = excluded.limits, \
                         sequence = excluded.sequence, \
                         updated_at = excluded.updated_at \
                     RETURNING {SETTINGS_COLUMNS}) \
                 SELECT stored.*, \
                     COALESCE((SELECT paused FROM previous), false) AS was_paused \
                 FROM stored"
            )),
            settings_list: stmt(format!(
                "SELECT queue, {SETTINGS_COLUMNS} FROM {settings} ORDER BY queue"
            )),
            paused_queues: stmt(format!("SELECT queue FROM {settings} WHERE paused")),
            limits: limits::LimitSql::new(schema),
            workflow: workflow::WorkflowSql::new(schema),
            jobs,
        }
    }
}

/// The batch insert, of `shape`, guarded by the depth limits' check when `unlimited`. `$24`
/// holds each job's turn by key, reserved before the insert's transaction (`turns::reserve`),
/// or NULL (the next keyed claim of its queue gives it one). A `NewJob` has no flow and no
/// progress, so `flow_id`, `flow_step`, `parents` and `progress` are left NULL here rather
/// than bound as four arrays of NULLs; a flow's jobs are stored through `import`, which
/// writes every column.
fn insert_sql(jobs: &str, settings: &str, shape: InsertShape, unlimited: bool) -> String {
    // The columns of issue 31's features (limit keys, sequences, debounce, turns), `$17` to
    // `$24`: a batch holding none of them leaves them out, so it binds and unpacks eight
    // arrays fewer and the rows take the columns' defaults.
    let (features, feature_arrays, queues) = match shape {
        InsertShape::Plain => ("", "", 17),
        InsertShape::Featured => (
            ", limit_keys, fair_key, sequence_key, sequence_no, sequence_skip_dead, fold_key, \
             fold_until, fair_turn",
            ", $17::jsonb[], $18::text[], $19::text[], $20::int8[], $21::bool[], $22::text[], \
             $23::timestamptz[], $24::int8[]",
            25,
        ),
    };
    let selected = features.replace(", ", ", n.");
    // The fast path for queues without depth limits: guarded by a one-time check that no
    // queue of the batch (`$17` or `$25`, distinct) has a limit. When one does, nothing is
    // inserted and no row comes back, and the caller takes the locks, counts, and inserts
    // without the guard.
    let condition = if unlimited {
        format!(
            "WHERE NOT EXISTS (SELECT 1 FROM {settings} s WHERE s.queue = ANY(${queues}) \
                 AND (s.max_depth IS NOT NULL OR s.max_depth_per_tenant IS NOT NULL))"
        )
    } else {
        String::new()
    };
    // One statement for the whole batch. Tags travel as one JSON array per job because a SQL
    // array of arrays must be rectangular; they are unpacked in order. A job without an expiry
    // takes its queue's default (`QueueSettings::default_expiry`: `default_ttl_ms` after its
    // run_at or now, whichever is later), read by key from the settings.
    format!(
        "INSERT INTO {jobs} (id, kind, queue, payload, priority, run_at, attempt, \
             max_attempts, timeout_ms, idempotency_key, tags, tenant, state, errors, \
             created_at, unique_key, expires_at, trace{features}) \
         SELECT n.id, n.kind, n.queue, n.payload, n.priority, n.run_at, 0, \
             n.max_attempts, n.timeout_ms, n.idempotency_key, \
             ARRAY(SELECT t.tag FROM jsonb_array_elements_text(n.tags) \
                   WITH ORDINALITY AS t(tag, pos) ORDER BY t.pos), \
             n.tenant, n.state, '[]'::jsonb, $13, n.unique_key, \
             COALESCE(n.expires_at, (SELECT GREATEST(n.run_at, $13) \
                 + s.default_ttl_ms * interval '1 millisecond' \
                 FROM {settings} s WHERE s.queue = n.queue)), \
             n.trace{selected} \
         FROM unnest($1::uuid[], $2::text[], $3::text[], $4::jsonb[], $5::int4[], \
                     $6::timestamptz[], $7::int4[], $8::int8[], $9::text[], \
                     $10::jsonb[], $11::text[], $12::text[], $14::text[], \
                     $15::timestamptz[], $16::jsonb[]{feature_arrays}) \
             AS n(id, kind, queue, payload, priority, run_at, max_attempts, \
                  timeout_ms, idempotency_key, tags, tenant, state, unique_key, \
                  expires_at, trace{features}) \
         {condition} \
         RETURNING {COLUMNS}"
    )
}

/// Which columns a batch insert writes: [`InsertShape::Plain`] when no job of the batch holds
/// a limit key, a sequence, a fold or a turn.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum InsertShape {
    Plain,
    Featured,
}

/// The single-queue claim condition: the queue, unless it is paused (a one-time check).
fn one_queue_condition(settings: &str) -> String {
    format!(
        "c.queue = $1 AND NOT EXISTS (SELECT 1 FROM {settings} s \
             WHERE s.queue = $1 AND s.paused)"
    )
}

/// The limits gate: true when a queue of the fetch needs the limited claim
/// (`limits.rs`): a settings row `s` matching `settings_condition` (which binds `$1`) that is not
/// paused and has a concurrency or rate limit (or, when `weights_count`, a weight), or an
/// available job `t` matching `tenanted_condition` with a tenant or with named-limit keys.
/// Each is an index probe (`jobs_fair`, `jobs_limited`).
fn flow_gate(
    jobs: &str,
    settings: &str,
    settings_condition: &str,
    tenanted_condition: &str,
    weights_count: bool,
) -> String {
    let weight = if weights_count {
        " OR s.weight IS NOT NULL"
    } else {
        ""
    };
    format!(
        "EXISTS (SELECT 1 FROM {settings} s WHERE {settings_condition} \
             AND NOT s.paused AND (s.concurrency_limit IS NOT NULL \
                 OR s.per_key_concurrency_limit IS NOT NULL OR s.rate_count IS NOT NULL \
                 OR s.per_key_rate_count IS NOT NULL{weight})) \
         OR EXISTS (SELECT 1 FROM {jobs} t WHERE t.state = 'available' \
             AND {tenanted_condition} AND t.tenant IS NOT NULL) \
         OR EXISTS (SELECT 1 FROM {jobs} t WHERE t.state = 'available' \
             AND {tenanted_condition} AND t.limit_keys IS NOT NULL)"
    )
}

/// Opens the transaction a one-statement claim runs in, with sorting disabled for its plan.
///
/// The claim must walk `jobs_fetch` in order and stop after `LIMIT` rows. The planner picks
/// that path only while it expects the queue to hold many rows; when the statistics say the
/// queue is rare (analyzed before a burst landed in it, as in a new queue that receives a million
/// jobs, or `bench`'s drain queue filled after an ANALYZE that saw only the enqueue queue), it
/// prefers a bitmap scan of every available job of the queue and a sort, which read the whole
/// backlog on every claim: 1.3 s per claim at a million queued jobs on a fresh cluster, where
/// the ordered scan takes about 2 ms. With sorting disabled no estimate can choose that plan; a
/// claim over several queues, which must sort, still sorts (the setting only adds cost).
/// `SET LOCAL` ends with the transaction, so the connection's other statements plan as usual.
pub(crate) const CLAIM_BEGIN: &str = "BEGIN; SET LOCAL enable_sort = off";

/// Whether a claim statement filters by kind (`$6`, a fetch restricted to some kinds) or takes
/// every kind (no `$6` at all, the common case).
///
/// Two statements rather than one with `($6 IS NULL OR c.kind = ANY($6))`: in a generic plan
/// that filter cannot be folded away, and its default selectivity makes the planner expect about
/// one matching row, so it prefers a bitmap scan of every available job of the queue followed by
/// a sort over the ordered scan of `jobs_fetch` that stops after `LIMIT` rows. The sort reads the
/// whole backlog on every fetch: harmless at 20,000 queued jobs, a hundred jobs a second at a
/// million on a table without statistics (docs/guide/src/postgresql.md, "How it works").
#[derive(Clone, Copy)]
enum KindFilter {
    Kinds,
    AnyKind,
    /// Every kind but `$6`: only while a kind's circuit breaker is open.
    ExceptKinds,
}

/// The picked rows are updated by their physical address (`ctid`), read while they are locked,
/// so the update is a TID scan whatever the planner estimates. Joined by id, the generic plan of
/// this statement on a table with statistics hashed the whole table (376 ms per claim at a
/// million jobs, where the TID scan takes under 2 ms), and avoiding that relied on PostgreSQL
/// re-planning every claim. A locked row's address cannot change before the update in the same
/// statement; a row updated by another transaction after this statement's snapshot (and still
/// available) is locked but not visible to the update, so it is left as it was, not lost.
///
/// The plain claim behind the limits `gate` (which binds `$1`; PostgreSQL evaluates it
/// once per statement): claims nothing when the gate is true. A claim that returns no rows is
/// followed by the gate alone, to tell "nothing available" from "take the limited
/// claim"; a claim that returns rows costs nothing more, which keeps the common path one
/// statement (run inside `CLAIM_BEGIN`'s transaction) with no wrapper around the
/// `UPDATE ... RETURNING`.
fn gated_claim_sql(
    jobs: &str,
    j_columns: &str,
    queue_condition: &str,
    gate: &str,
    kinds: KindFilter,
) -> String {
    let kind_condition = match kinds {
        KindFilter::Kinds => "AND c.kind = ANY($6)",
        KindFilter::AnyKind => "",
        KindFilter::ExceptKinds => "AND c.kind <> ALL($6)",
    };
    format!(
        "WITH picked AS MATERIALIZED ( \
             SELECT c.ctid AS tid FROM {jobs} c \
             WHERE c.state = 'available' AND {queue_condition} AND NOT ({gate}) \
             {kind_condition} AND (c.expires_at IS NULL OR c.expires_at > $5) \
             ORDER BY c.priority DESC, c.run_at, c.id LIMIT $2 \
             FOR UPDATE SKIP LOCKED) \
         UPDATE {jobs} j SET state = 'running', attempt = j.attempt + 1, \
             lease_worker = $3, lease_token = gen_random_uuid(), \
             lease_expires_at = $4, started_at = $5 \
         WHERE j.ctid = ANY(ARRAY(SELECT tid FROM picked)) \
         RETURNING {j_columns}"
    )
}
