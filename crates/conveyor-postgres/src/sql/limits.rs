//! The statements of the limited claim (`crate::limits`), built once per store for its schema.

use sqlx::SqlStr;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{stmt, COLUMNS, SETTINGS_COLUMNS};
use crate::names::quoted;

/// What the claim order, the named limits' admission and the claim itself need of a candidate
/// (`limits::Candidate`), read from `jobs`; `CANDIDATE_COLUMNS` are their names.
const CANDIDATE: &str = "id, priority, run_at, limit_keys, ctid::text AS tid";
const CANDIDATE_COLUMNS: &str = "id, priority, run_at, limit_keys, tid";

/// The statements of the limited claim for one schema, and the round-robin cursors.
pub(crate) struct LimitSql {
    /// What the claim reads before it locks anything, in one statement: each queue's
    /// settings, whether it has available jobs with a tenant or a round-robin limit key, and
    /// the named limits.
    pub(crate) prelude: SqlStr,
    pub(crate) running: SqlStr,
    pub(crate) prune_starts: SqlStr,
    pub(crate) recent_starts: SqlStr,
    pub(crate) record_starts: SqlStr,
    pub(crate) first: SqlStr,
    pub(crate) tenants: SqlStr,
    pub(crate) untenanted: SqlStr,
    pub(crate) tenant_jobs: SqlStr,
    /// Jobs without a round-robin limit key (`fair_key`), beside those taking turns by it.
    pub(crate) unkeyed: SqlStr,
    /// Keyed jobs in turn order, passing over full keys (`crate::limits`, turns).
    pub(crate) by_turn: SqlStr,
    /// Gives turns to a queue's available keyed jobs that have none.
    pub(crate) give_waiting: SqlStr,
    /// Reserves turns for the keyed jobs of a batch about to be inserted.
    pub(crate) reserve_turns: SqlStr,
    /// Moves the turns served up after a claim and forgets keys behind them.
    pub(crate) serve: SqlStr,
    pub(crate) key_counts: SqlStr,
    pub(crate) claim_ids: SqlStr,
    pub(crate) running_by_key: SqlStr,
    pub(crate) starts_by_key: SqlStr,
    pub(crate) first_with_room: SqlStr,
    /// Per queue, the tenant group this process served last (`None`: jobs without a tenant),
    /// so its next fetch continues the rotation. Kept per process: with several nodes each
    /// rotates on its own, which still serves every tenant in turn.
    cursors: Mutex<HashMap<String, Option<String>>>,
    /// When the gate last sent a fetch of these queues (joined) to the limited claim: for a
    /// second after, their fetches go straight there (`limited_lately`).
    limited: Mutex<HashMap<String, Instant>>,
}

/// How long a gate's "limited" answer sends a queue's fetches straight to the limited claim.
/// The limited claim is right for any queue, only slower than the plain one: a queue whose
/// limits went away takes it at most this long more.
const LIMITED_HINT: Duration = Duration::from_secs(1);

impl LimitSql {
    pub(crate) fn new(schema: &str) -> Self {
        let jobs = format!("{}.jobs", quoted(schema));
        let settings = format!("{}.queue_settings", quoted(schema));
        let starts = format!("{}.rate_starts", quoted(schema));
        let config = format!("{}.config", quoted(schema));
        let turns = Turns::new(schema);
        let order = "ORDER BY priority DESC, run_at, id";
        let kinds3 = kinds_at(3);
        let settings_columns = SETTINGS_COLUMNS
            .split(", ")
            .map(|column| format!("s.{column}"))
            .collect::<Vec<_>>()
            .join(", ");
        Self {
            // Read before the claim's locks: settings and named limits change rarely (a change
            // holds within a second, as documented), and the probes only choose how candidates
            // are read; the counts that limits hold by are read under the locks. Each probe is
            // a subquery ordered as its index (`jobs_fair`, `jobs_fair_turn`), not an EXISTS
            // (whose ORDER BY PostgreSQL drops): where every available job has a key, the
            // planner chose to scan the table from its start, through every job a drain had
            // already claimed (1.4 ms a claim late in a 20,000-job drain).
            prelude: stmt(format!(
                "SELECT q.queue, s.queue IS NOT NULL AS stored, {settings_columns}, \
                     COALESCE((SELECT true FROM {jobs} t WHERE t.state = 'available' \
                         AND t.queue = q.queue AND t.tenant IS NOT NULL \
                         ORDER BY t.queue, t.tenant LIMIT 1), false) AS tenanted, \
                     COALESCE((SELECT true FROM {jobs} t WHERE t.state = 'available' \
                         AND t.queue = q.queue AND t.fair_key IS NOT NULL \
                         ORDER BY t.queue, t.priority DESC LIMIT 1), false) AS fair_keyed, \
                     COALESCE((SELECT true FROM {jobs} t WHERE t.state = 'available' \
                         AND t.queue = q.queue AND t.fair_key IS NOT NULL \
                         AND t.fair_turn IS NULL ORDER BY t.queue, t.run_at LIMIT 1), false) \
                         AS unturned, \
                     (SELECT jsonb_agg(jsonb_build_array(c.name, c.document)) FROM {config} c \
                         WHERE c.collection = 'limits') AS limit_specs \
                 FROM unnest($1::text[]) AS q(queue) LEFT JOIN {settings} s ON s.queue = q.queue"
            )),
            running: stmt(format!(
                "SELECT count(*) FROM {jobs} WHERE state = 'running' AND queue = $1"
            )),
            prune_starts: stmt(format!(
                "DELETE FROM {starts} WHERE queue = $1 AND started_at <= $2"
            )),
            recent_starts: stmt(format!(
                "SELECT count(*) FROM {starts} WHERE queue = $1 AND scope = $2 \
                 AND started_at > $3"
            )),
            record_starts: stmt(format!(
                "INSERT INTO {starts} (queue, scope, started_at) \
                 SELECT s.queue, s.scope, $3 FROM unnest($1::text[], $2::text[]) AS s(queue, scope)"
            )),
            // Every candidate read below takes only the fetch's kinds (`$k::text[]`, NULL for
            // any) and none of its excluded kinds: filtered after the claim instead, jobs of
            // other kinds ahead in the queue would take the whole quota.
            first: stmt(format!(
                "SELECT {CANDIDATE} FROM {jobs} WHERE state = 'available' \
                 AND queue = $1 AND {kinds3} {order} LIMIT $2"
            )),
            tenants: group_keys(&jobs, "tenant"),
            untenanted: ungrouped(&jobs, "tenant"),
            tenant_jobs: group_jobs(&jobs, "tenant"),
            unkeyed: ungrouped(&jobs, "fair_key"),
            // `$5` the full keys: left out by the index's own column first, and by every key a
            // job holds when there are any (`?|` reads the row).
            by_turn: stmt(format!(
                "SELECT {CANDIDATE}, fair_turn FROM {jobs} WHERE state = 'available' \
                 AND queue = $1 AND fair_key IS NOT NULL AND fair_turn IS NOT NULL \
                 AND {kinds3} AND fair_key <> ALL($5::text[]) \
                 AND (cardinality($5::text[]) = 0 \
                      OR NOT (COALESCE(limit_keys, '[]'::jsonb) ?| $5::text[])) \
                 ORDER BY priority DESC, fair_turn, fair_key, id LIMIT $2"
            )),
            // In the order they came due, as `jobs_unturned` holds them.
            give_waiting: stmt(format!(
                "WITH waiting AS ( \
                     SELECT id, queue, priority, fair_key AS key, row_number() OVER ( \
                         PARTITION BY priority, fair_key ORDER BY run_at, id) AS rank \
                     FROM {jobs} WHERE state = 'available' AND queue = $1 \
                     AND fair_key IS NOT NULL AND fair_turn IS NULL), \
                 counts AS (SELECT queue, priority, key, count(*) AS n FROM waiting \
                     GROUP BY queue, priority, key), \
                 {giving} \
                 UPDATE {jobs} j SET fair_turn = (f.start + w.rank - 1) / f.weight \
                 FROM waiting w JOIN fair f \
                     ON (f.queue, f.priority, f.key) = (w.queue, w.priority, w.key) \
                 WHERE j.id = w.id AND j.state = 'available'",
                giving = turns.giving()
            )),
            reserve_turns: stmt(turns.reserve()),
            // `$1`..`$3` the highest turn claimed per queue and priority. A key's record is
            // deleted only if no enqueue holds it (SKIP LOCKED): a claim never waits on one.
            serve: stmt(format!(
                "WITH moved AS ( \
                     INSERT INTO {served} AS s (queue, priority, turn) \
                     SELECT * FROM unnest($1::text[], $2::int4[], $3::int8[]) \
                     ON CONFLICT (queue, priority) DO UPDATE SET turn = excluded.turn \
                         WHERE s.turn < excluded.turn \
                     RETURNING queue, priority, turn) \
                 DELETE FROM {fair_turns} WHERE ctid = ANY(ARRAY( \
                     SELECT t.ctid FROM {fair_turns} t JOIN moved m \
                         ON (t.queue, t.priority) = (m.queue, m.priority) \
                     WHERE t.next_turn <= m.turn FOR UPDATE OF t SKIP LOCKED))",
                served = turns.served,
                fair_turns = turns.turns,
            )),
            // Each tenant's running jobs and starts since `$3`, in the order of `$2`.
            key_counts: stmt(format!(
                "SELECT \
                     (SELECT count(*) FROM {jobs} r WHERE r.state = 'running' \
                      AND r.queue = $1 AND r.tenant = t.tenant AND r.tenant IS NOT NULL) \
                         AS running, \
                     (SELECT count(*) FROM {starts} s WHERE s.queue = $1 \
                      AND s.scope = t.tenant AND s.started_at > $3) AS recent \
                 FROM unnest($2::text[]) WITH ORDINALITY AS t(tenant, pos) ORDER BY t.pos"
            )),
            // The candidates `$1` at their addresses `$7` (read with them, under the same
            // locks): a TID scan, where looking each up by id in `jobs_pkey` took a quarter of
            // a keyed claim. A candidate changed since it was read has left that address (its
            // row there is no longer visible) and is simply not claimed; `id` is checked too,
            // so an address reused by another row claims nothing it should not.
            claim_ids: stmt(format!(
                "UPDATE {jobs} SET state = 'running', attempt = attempt + 1, \
                     lease_worker = $2, lease_token = gen_random_uuid(), \
                     lease_expires_at = $3, started_at = $4, fair_turn = NULL \
                 WHERE ctid = ANY($7::text[]::tid[]) AND id = ANY($1) AND state = 'available' \
                 AND ($5::text[] IS NULL OR kind = ANY($5)) AND kind <> ALL($6) \
                 AND (expires_at IS NULL OR expires_at > $4) \
                 RETURNING {COLUMNS}"
            )),
            // Running jobs per limit key (keys starting with `$1`, or all when NULL), bounded
            // by the running jobs that hold keys (`jobs_running_keyed`, migration 26).
            running_by_key: stmt(format!(
                "SELECT k AS key, count(*) AS n \
                 FROM {jobs} j CROSS JOIN LATERAL jsonb_array_elements_text(j.limit_keys) k \
                 WHERE j.state = 'running' AND j.limit_keys IS NOT NULL \
                 AND ($1::text IS NULL OR starts_with(k, $1)) GROUP BY k"
            )),
            starts_by_key: stmt(format!(
                "SELECT scope, count(*) AS n FROM {starts} WHERE queue = $1 AND started_at > $2 \
                 GROUP BY scope ORDER BY scope"
            )),
            // Like `first`, passing over jobs that hold any of the full keys `$5`.
            first_with_room: stmt(format!(
                "SELECT {CANDIDATE} FROM {jobs} WHERE state = 'available' \
                 AND queue = $1 AND {kinds3} \
                 AND NOT (COALESCE(limit_keys, '[]'::jsonb) ?| $5::text[]) {order} LIMIT $2"
            )),
            cursors: Mutex::new(HashMap::new()),
            limited: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the gate sent a fetch of `queues` to the limited claim within the last
    /// `LIMITED_HINT`: then the fetch goes there at once, without the plain claim that would
    /// claim nothing and the gate that would say so again (four round trips).
    /// Asked on every fetch: without limited queues the map is empty, and nothing is built.
    pub(crate) fn limited_lately(&self, queues: &[String]) -> bool {
        let Ok(limited) = self.limited.lock() else {
            return false;
        };
        !limited.is_empty()
            && limited
                .get(&queues.join("\u{1f}"))
                .is_some_and(|at| at.elapsed() < LIMITED_HINT)
    }

    /// Remembers that the gate sent a fetch of `queues` to the limited claim.
    pub(crate) fn set_limited(&self, queues: &[String]) {
        if let Ok(mut limited) = self.limited.lock() {
            limited.insert(queues.join("\u{1f}"), Instant::now());
        }
    }

    pub(crate) fn cursor(&self, queue: &str) -> Option<Option<String>> {
        self.cursors
            .lock()
            .map(|cursors| cursors.get(queue).cloned())
            .unwrap_or(None)
    }

    pub(crate) fn set_cursor(&self, queue: &str, tenant: Option<String>) {
        if let Ok(mut cursors) = self.cursors.lock() {
            if tenant.is_some() || cursors.contains_key(queue) {
                cursors.insert(queue.to_string(), tenant);
            }
        }
    }
}

/// Distinct values of `column` (tenants) among a queue's available jobs after `$2` ('' for
/// from the first), up to `$3`, each with its first job in claim order (what a pass that takes
/// one job per group needs, so it reads no more): one seek each in the index on (queue,
/// column, claim order) (`jobs_fair`; the ORDER BY is that index's order, so no other index can
/// serve it unsorted).
fn group_keys(jobs: &str, column: &str) -> SqlStr {
    let kinds4 = kinds_at(4);
    let first = |after: &str| {
        format!(
            "SELECT j.{column} AS k, j.id, j.priority, j.run_at, j.limit_keys, \
                 j.ctid::text AS tid FROM {jobs} j \
             WHERE j.state = 'available' AND j.queue = $1 AND j.{column} IS NOT NULL \
             AND j.{column} > {after} AND {kinds4} \
             ORDER BY j.{column}, j.priority DESC, j.run_at, j.id LIMIT 1"
        )
    };
    let (from_cursor, after_last) = (first("$2"), first("t.k"));
    stmt(format!(
        "WITH RECURSIVE t AS ( \
             ({from_cursor}) \
             UNION ALL \
             SELECT n.* FROM t CROSS JOIN LATERAL ({after_last}) n) \
         SELECT k, {CANDIDATE_COLUMNS} FROM t LIMIT $3"
    ))
}

/// Available jobs without a value in `column`, looked for among the queue's first `$2`.
fn ungrouped(jobs: &str, column: &str) -> SqlStr {
    let kinds4 = kinds_at(4);
    let order = "ORDER BY priority DESC, run_at, id";
    stmt(format!(
        "SELECT {CANDIDATE_COLUMNS} FROM ( \
             SELECT {CANDIDATE}, {column} AS k FROM {jobs} \
             WHERE state = 'available' AND queue = $1 AND {kinds4} {order} LIMIT $2) w \
         WHERE k IS NULL {order} LIMIT $3"
    ))
}

/// Each group's first `n` available jobs (`$2` values of `column`, `$3` counts side by side).
fn group_jobs(jobs: &str, column: &str) -> SqlStr {
    let kinds4 = kinds_at(4);
    let order = "ORDER BY priority DESC, run_at, id";
    stmt(format!(
        "SELECT t.k AS tenant, j.id, j.priority, j.run_at, j.limit_keys, j.tid \
         FROM unnest($2::text[], $3::int8[]) AS t(k, n) \
         CROSS JOIN LATERAL ( \
             SELECT {CANDIDATE} FROM {jobs} WHERE state = 'available' \
             AND queue = $1 AND {column} = t.k AND {column} IS NOT NULL \
             AND {kinds4} {order} LIMIT t.n) j"
    ))
}

/// The condition that a job is of a kind the fetch takes: its kinds at `$n` (NULL: any), its
/// excluded kinds at `$n+1`.
fn kinds_at(n: usize) -> String {
    let excluded = n + 1;
    format!("(${n}::text[] IS NULL OR kind = ANY(${n})) AND kind <> ALL(${excluded}::text[])")
}

/// The tables of turns by key (`conveyor_core::limits::turns`) in one schema, and the statement
/// parts that give them.
pub(crate) struct Turns {
    turns: String,
    served: String,
    config: String,
}

impl Turns {
    pub(crate) fn new(schema: &str) -> Self {
        Self {
            turns: format!("{}.fair_turns", quoted(schema)),
            served: format!("{}.fair_served", quoted(schema)),
            config: format!("{}.config", quoted(schema)),
        }
    }

    /// Common table expressions that give turns ([`conveyor_core::limits::turns::next_turn`]
    /// for `n` jobs at once) to the keys of a CTE `counts(queue, priority, key, n)` defined
    /// before them, and record what each key was given. They define `fair(queue, priority, key,
    /// weight, start)`: the k-th of a key's `n` jobs (from 1) gets turn `(start + k - 1) /
    /// weight`, `start` counting the key's places (turn times weight, plus those given of it).
    /// One upsert per key does it, so the key's row is locked only as long as the statement's
    /// transaction: a key whose next turn has been served, or that has no row, starts after the
    /// turn served (the row keeps the batch's `weight` and `added`, from which the place the
    /// batch started at is read back).
    pub(crate) fn giving(&self) -> String {
        let Self {
            turns,
            served,
            config,
        } = self;
        // The place after the turn served, and the key's own next place, in this batch's weight.
        let fresh = "(excluded.next_turn * excluded.weight + excluded.given - excluded.added)";
        let own = "(t.next_turn * excluded.weight + t.given)";
        let after = format!(
            "(CASE WHEN t.next_turn * excluded.weight >= {fresh} THEN {own} ELSE {fresh} END \
              + excluded.added)"
        );
        format!(
            "weights AS MATERIALIZED ( \
                 SELECT d.name, d.document -> 'weights' AS weights FROM {config} d \
                 WHERE d.collection = 'limits' AND jsonb_typeof(d.document -> 'weights') = 'object'), \
             weighed AS ( \
                 SELECT c.queue, c.priority, c.key, c.n, COALESCE(( \
                     SELECT GREATEST(1, LEAST({max_weight}, (w.weights ->> v.value)::numeric)) \
                     FROM weights w WHERE w.name = split_part(c.key, ':', 1) \
                     AND jsonb_typeof(w.weights -> v.value) = 'number'), 1)::int8 AS weight, \
                     COALESCE(s.turn, 0) AS served \
                 FROM counts c \
                 CROSS JOIN LATERAL (SELECT substr(c.key, strpos(c.key, ':') + 1) AS value) v \
                 LEFT JOIN {served} s ON (s.queue, s.priority) = (c.queue, c.priority)), \
             fair AS ( \
                 INSERT INTO {turns} AS t (queue, priority, key, next_turn, given, weight, added) \
                 SELECT queue, priority, key, ((served + 1) * weight + n) / weight, \
                     (((served + 1) * weight + n) % weight)::int4, weight::int4, n::int4 \
                 FROM weighed ORDER BY queue, priority, key \
                 ON CONFLICT (queue, priority, key) DO UPDATE \
                     SET next_turn = {after} / excluded.weight, \
                         given = ({after} % excluded.weight)::int4, \
                         weight = excluded.weight, added = excluded.added \
                 RETURNING queue, priority, key, weight::int8 AS weight, \
                     next_turn * weight + given - added AS start)",
            max_weight = conveyor_core::limits::named::MAX_WEIGHT
        )
    }

    /// Reserves turns for a batch about to be inserted (`$1`..`$4`: queue, priority, key and
    /// how many jobs, side by side), in a transaction of its own (`turns::reserve`).
    pub(crate) fn reserve(&self) -> String {
        format!(
            "WITH counts AS ( \
                 SELECT * FROM unnest($1::text[], $2::int4[], $3::text[], $4::int8[]) \
                     AS c(queue, priority, key, n)), \
             {giving} \
             SELECT queue, priority, key, weight, start FROM fair",
            giving = self.giving()
        )
    }
}
