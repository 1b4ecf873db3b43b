//! The statements of workflows (`crate::workflow`), built once per store for its schema.

use sqlx::SqlStr;

use super::stmt;
use crate::names::quoted;

/// The statements of workflows for one schema.
pub(crate) struct WorkflowSql {
    /// `"schema".flows` and `"schema".flow_steps`, for the list, whose text depends on its
    /// filters.
    pub(crate) flows: String,
    pub(crate) steps: String,
    pub(crate) custom_plans: SqlStr,
    pub(crate) lock_heads: SqlStr,
    pub(crate) lock_many: SqlStr,
    pub(crate) try_lock: SqlStr,
    pub(crate) exists: SqlStr,
    pub(crate) graph_steps: SqlStr,
    pub(crate) insert_flow: SqlStr,
    pub(crate) flow_by_key: SqlStr,
    pub(crate) insert_steps: SqlStr,
    pub(crate) step_jobs: SqlStr,
    pub(crate) set_steps: SqlStr,
    pub(crate) start_steps: SqlStr,
    pub(crate) begin_waits: SqlStr,
    pub(crate) compensation_row: SqlStr,
    pub(crate) compensation_started: SqlStr,
    pub(crate) compensation_state: SqlStr,
    pub(crate) flow_state: SqlStr,
    pub(crate) signal: SqlStr,
    pub(crate) due_waits: SqlStr,
    pub(crate) prune: SqlStr,
    pub(crate) view_head: SqlStr,
    pub(crate) view_steps: SqlStr,
}

pub(crate) const HEAD_COLUMNS: &str =
    "id, name, state, on_failure, failed_step, tags, created_at, finished_at";

impl WorkflowSql {
    /// Statements for `schema`, which must already be validated.
    pub(crate) fn new(schema: &str) -> Self {
        let flows = format!("{}.flows", quoted(schema));
        let steps = format!("{}.flow_steps", quoted(schema));
        let jobs = format!("{}.jobs", quoted(schema));
        Self {
            // See `plan_flow_statements`.
            custom_plans: stmt(
                "SELECT set_config('plan_cache_mode', 'force_custom_plan', true), \
                     set_config('enable_hashjoin', 'off', true), \
                     set_config('enable_mergejoin', 'off', true), \
                     set_config('jit', 'off', true)"
                    .to_string(),
            ),
            // The heads of the graphs, locked: the first statement of every flow event. Rows are
            // locked as the sort hands them over: in id order, so two transactions locking
            // overlapping sets of flows cannot deadlock.
            lock_heads: stmt(format!(
                "SELECT id, state, on_failure, failed_step FROM {flows} \
                 WHERE id = ANY($1) ORDER BY id FOR UPDATE"
            )),
            // Rows are locked as the sort hands them over: in id order, so two transactions
            // locking overlapping sets of flows cannot deadlock.
            lock_many: stmt(format!(
                "SELECT id FROM {flows} WHERE id = ANY($1) ORDER BY id FOR UPDATE"
            )),
            try_lock: stmt(format!(
                "SELECT id FROM {flows} WHERE id = $1 FOR UPDATE SKIP LOCKED"
            )),
            exists: stmt(format!(
                "SELECT EXISTS (SELECT 1 FROM {flows} WHERE id = $1)"
            )),
            // Each flow's steps found through the primary key, whatever the planner estimates
            // (a subquery per flow, kept apart by `OFFSET 0`): planned while the table was
            // small, `flow_id = ANY($1)` reads it whole, and keeps doing so once it is large.
            graph_steps: stmt(format!(
                "SELECT s.flow_id, s.name, s.state, s.after, s.on_parent_failure, s.job_id, \
                     s.wait_signal, s.signalled, s.has_compensate, s.compensation, \
                     s.compensation_job_id, s.completed_seq, s.position \
                 FROM unnest($1::uuid[]) AS f(id) \
                 CROSS JOIN LATERAL (SELECT t.flow_id, t.name, t.state, t.after, \
                         t.on_parent_failure, t.job_id, t.wait_signal, t.signalled, \
                         t.compensate IS NOT NULL AS has_compensate, t.compensation, \
                         t.compensation_job_id, t.completed_seq, t.position \
                     FROM {steps} t WHERE t.flow_id = f.id OFFSET 0) s"
            )),
            // A concurrent create with the same key waits here until the first commits, then
            // inserts nothing and returns no row.
            insert_flow: stmt(format!(
                "INSERT INTO {flows} (id, name, state, on_failure, idempotency_key, tags, \
                     created_at) \
                 VALUES ($1, $2, 'running', $3, $4, $5, $6) \
                 ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING \
                 RETURNING id"
            )),
            flow_by_key: stmt(format!("SELECT id FROM {flows} WHERE idempotency_key = $1")),
            // Each step's parents travel as one JSON array (an SQL array of arrays must be
            // rectangular), unpacked in order.
            insert_steps: stmt(format!(
                "INSERT INTO {steps} (flow_id, name, position, state, after, on_parent_failure, \
                     job_id, job, compensate, wait_signal, wait_timeout_ms) \
                 SELECT $1, n.name, n.position, 'pending', \
                     ARRAY(SELECT a.name FROM jsonb_array_elements_text(n.after) \
                           WITH ORDINALITY AS a(name, pos) ORDER BY a.pos), \
                     n.on_parent_failure, n.job_id, n.job, n.compensate, n.wait_signal, \
                     n.wait_timeout_ms \
                 FROM unnest($2::text[], $3::int4[], $4::jsonb[], $5::text[], $6::uuid[], \
                             $7::jsonb[], $8::jsonb[], $9::text[], $10::int8[]) \
                     AS n(name, position, after, on_parent_failure, job_id, job, compensate, \
                          wait_signal, wait_timeout_ms)"
            )),
            step_jobs: stmt(format!(
                "SELECT name, job_id FROM {steps} WHERE flow_id = $1 AND job_id IS NOT NULL"
            )),
            // A job step takes its job's result when it completes, and its job's last error
            // when it fails without an error of the policy's own (a wait's timeout, a skip).
            // Steps of any number of flows, each (flow, name) once.
            // A step that stops waiting loses its deadline (see migration 15: the deadline
            // index holds waiting steps only, and a job step's change stays a HOT update).
            set_steps: stmt(format!(
                "UPDATE {steps} s SET state = u.state, finished_at = u.finished_at, \
                     wait_deadline = CASE WHEN u.state = 'waiting' THEN s.wait_deadline END, \
                     completed_seq = CASE WHEN u.state = 'completed' THEN u.seq \
                         ELSE s.completed_seq END, \
                     result = CASE WHEN u.state = 'completed' AND s.job_id IS NOT NULL \
                         THEN (SELECT j.result FROM {jobs} j WHERE j.id = s.job_id) \
                         ELSE s.result END, \
                     error = CASE WHEN u.state IN ('active', 'completed') THEN NULL \
                         WHEN u.error IS NOT NULL THEN u.error \
                         WHEN u.state = 'failed' AND s.job_id IS NOT NULL \
                         THEN (SELECT j.errors -> -1 FROM {jobs} j WHERE j.id = s.job_id) \
                         ELSE s.error END \
                 FROM unnest($1::uuid[], $2::text[], $3::text[], $4::timestamptz[], \
                             $5::int8[], $6::jsonb[]) \
                     AS u(flow_id, name, state, finished_at, seq, error) \
                 WHERE s.flow_id = u.flow_id AND s.name = u.name"
            )),
            // Starts steps of any number of flows in one round trip: marks each job step
            // active and each wait step waiting (its deadline follows in `begin_waits`), and
            // returns the started steps' specs (`starting`) together with the results of
            // their completed parents (once per parent, however many children start). The
            // parents are read from the statement's snapshot, which has every step change
            // written before it, and none of them starts here (a step starts only once its
            // parents have finished). Each parent is looked up by its key (`LIMIT 1` keeps the
            // lookup a subquery of its own), so the read is an index probe per parent whatever
            // the planner estimates.
            start_steps: stmt(format!(
                "WITH started AS ( \
                     UPDATE {steps} s SET state = CASE WHEN s.job IS NULL THEN 'waiting' \
                         ELSE 'active' END \
                     FROM unnest($1::uuid[], $2::text[]) AS k(flow_id, name) \
                     WHERE s.flow_id = k.flow_id AND s.name = k.name \
                     RETURNING s.flow_id, s.name, s.job, s.job_id, s.after, s.wait_timeout_ms) \
                 SELECT true AS starting, flow_id, name, job, job_id, after, wait_timeout_ms, \
                     NULL::jsonb AS result \
                 FROM started \
                 UNION ALL \
                 SELECT false, w.flow_id, w.name, NULL, NULL, NULL, NULL, p.result \
                 FROM (SELECT DISTINCT st.flow_id, a.name FROM started st \
                       CROSS JOIN LATERAL unnest(st.after) AS a(name) \
                       WHERE st.job IS NOT NULL) w \
                 CROSS JOIN LATERAL (SELECT p.result FROM {steps} p \
                     WHERE p.flow_id = w.flow_id AND p.name = w.name \
                         AND p.state = 'completed' LIMIT 1) p"
            )),
            begin_waits: stmt(format!(
                "UPDATE {steps} s SET state = 'waiting', wait_deadline = w.deadline \
                 FROM unnest($1::uuid[], $2::text[], $3::timestamptz[]) \
                     AS w(flow_id, name, deadline) \
                 WHERE s.flow_id = w.flow_id AND s.name = w.name"
            )),
            compensation_row: stmt(format!(
                "SELECT job, compensate, result FROM {steps} WHERE flow_id = $1 AND name = $2"
            )),
            compensation_started: stmt(format!(
                "UPDATE {steps} SET compensation = 'running', compensation_job_id = $1 \
                 WHERE flow_id = $2 AND name = $3"
            )),
            compensation_state: stmt(format!(
                "UPDATE {steps} SET compensation = $1 WHERE flow_id = $2 AND name = $3"
            )),
            // Flow states of any number of flows, each flow once.
            flow_state: stmt(format!(
                "UPDATE {flows} f SET state = u.state, failed_step = u.failed_step, \
                     finished_at = u.finished_at \
                 FROM unnest($1::uuid[], $2::text[], $3::text[], $4::timestamptz[]) \
                     AS u(id, state, failed_step, finished_at) \
                 WHERE f.id = u.id"
            )),
            signal: stmt(format!(
                "UPDATE {steps} SET result = $1, signalled = true \
                 WHERE flow_id = $2 AND name = $3"
            )),
            due_waits: stmt(format!(
                "SELECT flow_id, name FROM {steps} \
                 WHERE wait_deadline IS NOT NULL AND wait_deadline <= $1 AND state = 'waiting' \
                 ORDER BY wait_deadline LIMIT $2"
            )),
            // Steps go with their flow (ON DELETE CASCADE); a flow another transaction holds is
            // left for the next pass.
            prune: stmt(format!(
                "DELETE FROM {flows} WHERE id IN (SELECT id FROM {flows} \
                 WHERE finished_at IS NOT NULL \
                 AND ((state IN ('completed', 'compensated', 'cancelled') AND finished_at <= $1) \
                      OR (state = 'failed' AND finished_at <= $2)) \
                 ORDER BY finished_at LIMIT $3 FOR UPDATE SKIP LOCKED)"
            )),
            view_head: stmt(format!("SELECT {HEAD_COLUMNS} FROM {flows} WHERE id = $1")),
            view_steps: stmt(format!(
                "SELECT s.name, s.state, s.after, s.on_parent_failure, s.job_id, \
                     s.job ->> 'kind' AS kind, s.wait_signal, s.wait_timeout_ms, s.result, \
                     s.error, s.compensation, s.compensation_job_id, s.wait_deadline, \
                     s.finished_at, j.state AS job_state, j.attempt, j.progress \
                 FROM {steps} s LEFT JOIN {jobs} j ON j.id = s.job_id \
                 WHERE s.flow_id = $1 ORDER BY s.position"
            )),
            flows,
            steps,
        }
    }
}
