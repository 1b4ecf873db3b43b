//! Inserting jobs: idempotency and unique keys, sequences, debounce and throttle, queue-depth
//! limits, one statement per batch.

use super::*;
use crate::limits::Reserved;
use crate::sql::InsertShape;
use conveyor_core::debounce::{self, Standing, Verdict};

/// Where each job of a batch ends up.
pub(super) enum Slot {
    /// Inserted as a new job with this id.
    New(Uuid),
    /// A duplicate of a job inserted earlier in the same batch.
    SameBatch(Uuid),
    /// A duplicate of the stored job holding this key.
    Stored(String),
    /// A duplicate of the stored job holding the unique key of the batch's job at this position.
    StoredUnique(usize),
    /// Debounced or throttled into a job this batch adds.
    FoldedSameBatch(Uuid),
    /// Debounced or throttled into this stored job (as it is after the fold).
    Folded(Uuid),
}

/// The new jobs of a batch, column by column, for one `INSERT ... SELECT FROM unnest(...)`.
#[derive(Default)]
pub(super) struct Columns {
    ids: Vec<Uuid>,
    kinds: Vec<String>,
    queues: Vec<String>,
    payloads: Vec<Json<Value>>,
    priorities: Vec<i32>,
    run_ats: Vec<DateTime<Utc>>,
    max_attempts: Vec<i32>,
    timeouts: Vec<Option<i64>>,
    keys: Vec<Option<String>>,
    tags: Vec<Json<Vec<String>>>,
    tenants: Vec<Option<String>>,
    states: Vec<&'static str>,
    unique_keys: Vec<Option<String>>,
    expires: Vec<Option<DateTime<Utc>>>,
    traces: Vec<Option<Json<conveyor_core::trace::TraceContext>>>,
    limit_keys: Vec<Option<Json<Vec<String>>>>,
    fair_keys: Vec<Option<String>>,
    sequence_keys: Vec<Option<String>>,
    sequence_nos: Vec<Option<i64>>,
    sequence_skip_dead: Vec<bool>,
    fold_keys: Vec<Option<String>>,
    fold_untils: Vec<Option<DateTime<Utc>>>,
    /// Each job's turn by key, from the batch's reservation (`None`: the next keyed claim
    /// gives it one).
    fair_turns: Vec<Option<i64>>,
}

/// The outcome of an insert: one result per job, and whether any job became available.
pub(crate) struct Insertion {
    pub inserted: Vec<Inserted>,
    pub made_available: bool,
}

/// Inserts validated jobs. Must run inside a transaction: the idempotency locks are
/// transaction-scoped, and the batch must be all-or-nothing.
///
/// Keyed jobs first take an advisory lock per key (in ascending key order, so concurrent batches
/// cannot deadlock), then look for a job holding the key. A concurrent insert of the same key
/// waits on the lock until the first commits, and then finds its job: exactly one job per key.
/// Unique jobs do the same with their unique keys (locked in the same sorted acquisition), after
/// the idempotency key, which keeps precedence (see `unique`).
///
/// Depth limits count only the jobs the batch really adds: duplicates of stored jobs do not
/// take up room, so resubmitting an accepted job succeeds even when its queue is full.
///
/// Available jobs holding a round-robin limit key take their turns from `reserved` (see
/// `limits::reserve_turns`), or are left without one for the next keyed claim to give.
pub(crate) async fn insert_many(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    jobs: Vec<NewJob>,
    reserved: &mut Reserved,
) -> StoreResult<Insertion> {
    let keys: BTreeSet<&str> = jobs
        .iter()
        .filter_map(|job| job.idempotency_key.as_deref())
        .collect();
    let unique_keys = unique::keys(&jobs);
    let sequence_keys: BTreeSet<&str> = jobs
        .iter()
        .filter_map(|job| job.sequence_key.as_ref().map(|s| s.key.as_str()))
        .collect();
    let sequence_keys: Vec<&str> = sequence_keys.into_iter().collect();
    let sequence_locks = sequence_lock_keys(&mut *conn, ctx, &sequence_keys).await?;
    let fold_keys: BTreeSet<&str> = jobs
        .iter()
        .filter_map(|job| job.fold_key.as_ref().map(|f| f.key.as_str()))
        .collect();
    let fold_keys: Vec<&str> = fold_keys.into_iter().collect();
    let lock_keys: Vec<i64> = keys
        .iter()
        .map(|key| idempotency_lock_key(ctx.schema, key))
        .chain(unique::lock_keys(ctx.schema, &unique_keys))
        .chain(sequence_locks)
        .chain(fold_keys.iter().map(|key| fold_lock_key(ctx.schema, key)))
        .collect();
    lock_in_order(
        &mut *conn,
        ctx,
        lock_keys,
        "lock idempotency and unique keys",
    )
    .await?;
    let mut stored: HashMap<String, Job> = HashMap::new();
    if !keys.is_empty() {
        let keys: Vec<&str> = keys.into_iter().collect();
        // The newest job that still holds each key: an older job made unfinished again (a
        // replayed dead job) holds it even when a newer one with the key has finished.
        let window_start =
            conveyor_core::clock::before(ctx.now, ctx.options.completed_idempotency_window);
        let found = sqlx::query(ctx.sql.idempotent_matches.clone())
            .bind(&keys)
            .bind(window_start)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("find idempotency keys"))?;
        for job in rows::jobs(&found)? {
            if job.holds_idempotency_key(ctx.now, ctx.options.completed_idempotency_window) {
                if let Some(key) = job.idempotency_key.clone() {
                    stored.insert(key, job);
                }
            }
        }
    }

    let stored_unique = unique::stored_matches(&mut *conn, ctx, &jobs, &unique_keys).await?;
    let mut tails = sequence_tails(&mut *conn, ctx, &sequence_keys).await?;
    // Each fold key's latest job: stored, then the one this batch adds, if any (with its place
    // among the columns, so a later enqueue of the batch can fold into it).
    let mut standing: HashMap<String, (Standing, Option<usize>)> =
        fold_standing(&mut *conn, ctx, &fold_keys).await?;
    // Folds into stored jobs, applied once the batch's own jobs are inserted.
    let mut replaced: Vec<(Uuid, Value, DateTime<Utc>)> = Vec::new();
    let mut extended: Vec<(Uuid, Option<DateTime<Utc>>)> = Vec::new();

    let mut slots = Vec::with_capacity(jobs.len());
    let mut batch_keys: HashMap<String, Uuid> = HashMap::new();
    // The jobs this batch adds, with their initial states, by unique key (latest last).
    let mut batch_unique: HashMap<String, Vec<(Uuid, JobState)>> = HashMap::new();
    let mut columns = Columns::default();
    for (index, (mut new, unique_key)) in jobs.into_iter().zip(unique_keys).enumerate() {
        if let Some(key) = &new.idempotency_key {
            if stored.contains_key(key) {
                slots.push(Slot::Stored(key.clone()));
                continue;
            }
            if let Some(id) = batch_keys.get(key) {
                slots.push(Slot::SameBatch(*id));
                continue;
            }
        }
        if let (Some(spec), Some(key)) = (&new.unique, &unique_key) {
            // The latest job holding the key wins: one this batch added (created now, so inside
            // any window) whose state the spec counts, else the stored one.
            let in_batch = batch_unique
                .get(key)
                .and_then(|added| added.iter().rev().find(|(_, state)| spec.blocks_in(*state)));
            if let Some((id, _)) = in_batch {
                slots.push(Slot::SameBatch(*id));
                continue;
            }
            if stored_unique.contains_key(&index) {
                slots.push(Slot::StoredUnique(index));
                continue;
            }
        }
        // A debounced or throttled enqueue may fold into the key's standing job instead.
        let mut fold_until = None;
        if let Some(fold) = &new.fold_key {
            let found = standing.get(&fold.key).copied();
            match debounce::verdict(fold.rule, found.map(|(job, _)| job), ctx.now) {
                Verdict::Replace { id, run_at } => {
                    let run_at = truncate_to_millis(run_at);
                    match found.and_then(|(_, place)| place) {
                        Some(place) => {
                            columns.payloads[place] = Json(new.payload);
                            columns.run_ats[place] = run_at;
                            slots.push(Slot::FoldedSameBatch(id));
                        }
                        None => {
                            replaced.push((id, new.payload, run_at));
                            slots.push(Slot::Folded(id));
                        }
                    }
                    continue;
                }
                Verdict::Drop { id, until } => {
                    match found.and_then(|(_, place)| place) {
                        Some(place) => {
                            if let Some(until) = until {
                                columns.fold_untils[place] = Some(until);
                            }
                            slots.push(Slot::FoldedSameBatch(id));
                        }
                        None => {
                            extended.push((id, until));
                            slots.push(Slot::Folded(id));
                        }
                    }
                    continue;
                }
                Verdict::Insert { run_at, until } => {
                    if run_at.is_some() {
                        new.run_at = run_at;
                    }
                    fold_until = until;
                }
            }
        }
        let id = Uuid::now_v7();
        if let Some(key) = &new.idempotency_key {
            batch_keys.insert(key.clone(), id);
        }
        // A past run_at is kept (it orders the job among others) but makes the job available.
        let run_at = truncate_to_millis(new.run_at.unwrap_or(ctx.now));
        let mut state = if run_at > ctx.now {
            JobState::Scheduled
        } else {
            JobState::Available
        };
        let sequence = new.sequence_key.as_ref().map(|place| {
            let tail = tails.entry(place.key.clone()).or_default();
            tail.last += 1;
            if tail.waits {
                state = JobState::Blocked;
            }
            // Whatever state it starts in, it holds or waits in the sequence: later jobs of the
            // batch wait behind it.
            tail.waits = true;
            (place.key.clone(), tail.last, place.on_dead == OnDead::Skip)
        });
        let fair_key = conveyor_core::limits::named::fair_key(&new.limit_keys);
        let turn = match fair_key {
            Some(key) if state == JobState::Available => {
                reserved.take(&new.queue, new.priority, key)
            }
            _ => None,
        };
        columns.fair_turns.push(turn);
        columns.ids.push(id);
        columns.kinds.push(new.kind);
        columns.queues.push(new.queue);
        columns.payloads.push(Json(new.payload));
        columns.priorities.push(new.priority);
        columns.run_ats.push(run_at);
        columns
            .max_attempts
            .push(to_i32(new.max_attempts, "max_attempts")?);
        columns.timeouts.push(
            new.timeout_ms
                .map(|ms| i64::try_from(ms).unwrap_or(i64::MAX)),
        );
        columns.keys.push(new.idempotency_key);
        columns.tags.push(Json(new.tags));
        columns.tenants.push(new.tenant);
        columns.states.push(state.as_str());
        if let Some(key) = &unique_key {
            batch_unique
                .entry(key.clone())
                .or_default()
                .push((id, state));
        }
        columns.unique_keys.push(unique_key);
        columns.expires.push(new.expires_at.map(truncate_to_millis));
        columns.traces.push(new.trace.map(Json));
        columns.fair_keys.push(fair_key.map(str::to_string));
        columns
            .limit_keys
            .push((!new.limit_keys.is_empty()).then_some(Json(new.limit_keys)));
        let (sequence_key, sequence_no, skip_dead) = match sequence {
            Some((key, no, skip)) => (Some(key), Some(no), skip),
            None => (None, None, false),
        };
        columns.sequence_keys.push(sequence_key);
        columns.sequence_nos.push(sequence_no);
        columns.sequence_skip_dead.push(skip_dead);
        if let Some(fold) = new.fold_key {
            let added = Standing {
                id,
                state,
                created_at: ctx.now,
                until: fold_until,
            };
            standing.insert(fold.key.clone(), (added, Some(columns.ids.len() - 1)));
            columns.fold_keys.push(Some(fold.key));
        } else {
            columns.fold_keys.push(None);
        }
        columns.fold_untils.push(fold_until);
        slots.push(Slot::New(id));
    }

    let mut created: HashMap<Uuid, Job> = HashMap::new();
    if !columns.ids.is_empty() {
        // Optimistically as if no queue of the batch had a depth limit: the statement checks,
        // and inserts nothing when one has. Only then are limits read, locked and counted.
        let queues: BTreeSet<&str> = columns.queues.iter().map(String::as_str).collect();
        let queues: Vec<&str> = queues.into_iter().collect();
        let shape = columns.shape();
        let (unlimited, limited) = match shape {
            InsertShape::Plain => (&ctx.sql.insert_plain_unlimited, &ctx.sql.insert_plain),
            InsertShape::Featured => (&ctx.sql.insert_unlimited, &ctx.sql.insert),
        };
        let mut found = bind_columns(unlimited.clone(), &columns, shape, ctx.now)
            .bind(&queues)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("insert jobs"))?;
        if found.is_empty() {
            check_depth_limits(&mut *conn, ctx, &columns, &queues).await?;
            found = bind_columns(limited.clone(), &columns, shape, ctx.now)
                .fetch_all(&mut *conn)
                .await
                .map_err(db("insert jobs"))?;
        }
        for job in rows::jobs(&found)? {
            created.insert(job.id, job);
        }
    }
    let woken: BTreeSet<String> = created
        .values()
        .filter(|job| job.state == JobState::Available)
        .map(|job| job.queue.clone())
        .collect();
    let woken: Vec<String> = woken.into_iter().collect();
    notify(conn, ctx.sql, &woken).await?;

    let folded = fold_stored(&mut *conn, ctx, replaced, extended).await?;
    // A new job answers its own slot by value; only one a later slot of the batch also
    // answers with (a duplicate or a fold into it) is copied. Copying every job cost the
    // enqueue of plain jobs a clone of each payload.
    let shared: HashSet<Uuid> = slots
        .iter()
        .filter_map(|slot| match slot {
            Slot::SameBatch(id) | Slot::FoldedSameBatch(id) => Some(*id),
            _ => None,
        })
        .collect();
    let mut inserted = Vec::with_capacity(slots.len());
    for slot in slots {
        let (job, answer): (_, fn(Job) -> Inserted) = match slot {
            Slot::Stored(key) => (stored.get(&key).cloned(), Inserted::duplicate_of),
            Slot::StoredUnique(index) => {
                (stored_unique.get(&index).cloned(), Inserted::duplicate_of)
            }
            Slot::New(id) if shared.contains(&id) => (created.get(&id).cloned(), Inserted::new),
            Slot::New(id) => (created.remove(&id), Inserted::new),
            Slot::SameBatch(id) => (created.get(&id).cloned(), Inserted::duplicate_of),
            Slot::FoldedSameBatch(id) => (created.get(&id).cloned(), Inserted::folded_into),
            Slot::Folded(id) => (folded.get(&id).cloned(), Inserted::folded_into),
        };
        let job =
            job.ok_or_else(|| StoreError::backend("postgres: an inserted job was not returned"))?;
        inserted.push(answer(job));
    }
    Ok(Insertion {
        inserted,
        made_available: !woken.is_empty(),
    })
}

/// The insert statement `text` with the batch's columns bound as `$1` to `$16`, and `$17` to
/// `$24` unless `shape` (the batch's [`Columns::shape`]) is plain.
pub(super) fn bind_columns<'q>(
    text: sqlx::SqlStr,
    columns: &'q Columns,
    shape: InsertShape,
    now: DateTime<Utc>,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let query = sqlx::query(text)
        .bind(&columns.ids)
        .bind(&columns.kinds)
        .bind(&columns.queues)
        .bind(&columns.payloads)
        .bind(&columns.priorities)
        .bind(&columns.run_ats)
        .bind(&columns.max_attempts)
        .bind(&columns.timeouts)
        .bind(&columns.keys)
        .bind(&columns.tags)
        .bind(&columns.tenants)
        .bind(&columns.states)
        .bind(now)
        .bind(&columns.unique_keys)
        .bind(&columns.expires)
        .bind(&columns.traces);
    if shape == InsertShape::Plain {
        return query;
    }
    query
        .bind(&columns.limit_keys)
        .bind(&columns.fair_keys)
        .bind(&columns.sequence_keys)
        .bind(&columns.sequence_nos)
        .bind(&columns.sequence_skip_dead)
        .bind(&columns.fold_keys)
        .bind(&columns.fold_untils)
        .bind(&columns.fair_turns)
}

impl Columns {
    /// Plain when no job of the batch holds a limit key, a sequence, a fold or a turn: the
    /// insert then leaves those columns to their defaults.
    fn shape(&self) -> InsertShape {
        let featured = self.limit_keys.iter().any(Option::is_some)
            || self.fair_keys.iter().any(Option::is_some)
            || self.sequence_keys.iter().any(Option::is_some)
            || self.sequence_nos.iter().any(Option::is_some)
            || self.sequence_skip_dead.iter().any(|skip| *skip)
            || self.fold_keys.iter().any(Option::is_some)
            || self.fold_untils.iter().any(Option::is_some)
            || self.fair_turns.iter().any(Option::is_some);
        if featured {
            InsertShape::Featured
        } else {
            InsertShape::Plain
        }
    }
}

/// Each fold key's latest stored job (none for a batch without debounce or throttle, which
/// pays no round trip), locked until the transaction ends.
async fn fold_standing(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    keys: &[&str],
) -> StoreResult<HashMap<String, (Standing, Option<usize>)>> {
    let mut standing = HashMap::new();
    if keys.is_empty() {
        return Ok(standing);
    }
    let found = sqlx::query(ctx.sql.fold_standing.clone())
        .bind(keys)
        .fetch_all(&mut *conn)
        .await
        .map_err(db("read debounced jobs"))?;
    for row in &found {
        let read = |e: sqlx::Error| corrupt(e.to_string());
        let key: String = row.try_get("key").map_err(read)?;
        let state: String = row.try_get("state").map_err(read)?;
        let job = Standing {
            id: row.try_get("id").map_err(read)?,
            state: JobState::from_str(&state)?,
            created_at: row.try_get("created_at").map_err(read)?,
            until: row.try_get("fold_until").map_err(read)?,
        };
        standing.insert(key, (job, None));
    }
    Ok(standing)
}

/// Applies the folds into stored jobs: a trailing debounce's new payload and run_at, a leading
/// debounce's longer window. Returns the jobs as they now are, by id. The jobs were locked when
/// read, so a trailing debounce's job is still waiting.
async fn fold_stored(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    replaced: Vec<(Uuid, Value, DateTime<Utc>)>,
    extended: Vec<(Uuid, Option<DateTime<Utc>>)>,
) -> StoreResult<HashMap<Uuid, Job>> {
    let mut folded = HashMap::new();
    for (id, payload, run_at) in replaced {
        let row = sqlx::query(ctx.sql.fold_replace.clone())
            .bind(id)
            .bind(Json(payload))
            .bind(run_at)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db("fold an enqueue into a debounced job"))?
            .ok_or_else(|| {
                StoreError::backend("postgres: a locked debounced job stopped waiting")
            })?;
        let job = rows::job(&row)?;
        folded.insert(job.id, job);
    }
    for (id, until) in extended {
        let row = sqlx::query(ctx.sql.fold_extend.clone())
            .bind(id)
            .bind(until)
            .fetch_one(&mut *conn)
            .await
            .map_err(db("extend a debounce window"))?;
        let job = rows::job(&row)?;
        folded.insert(job.id, job);
    }
    Ok(folded)
}

/// The last number of a sequence key, and whether a job of it holds the sequence or waits in
/// it (a new job must then wait too).
#[derive(Default)]
pub(super) struct Tail {
    last: i64,
    waits: bool,
}

/// The advisory lock keys of a batch's sequence keys (none for a batch without sequences,
/// which pays no round trip).
async fn sequence_lock_keys(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    keys: &[&str],
) -> StoreResult<Vec<i64>> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_scalar(ctx.sql.sequence_lock_keys.clone())
        .bind(keys)
        .bind(ctx.schema)
        .fetch_all(&mut *conn)
        .await
        .map_err(db("compute sequence lock keys"))
}

/// Each sequence key's [`Tail`], read after its lock is held.
async fn sequence_tails(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    keys: &[&str],
) -> StoreResult<HashMap<String, Tail>> {
    let mut tails = HashMap::new();
    if keys.is_empty() {
        return Ok(tails);
    }
    let found = sqlx::query(ctx.sql.sequence_tails.clone())
        .bind(keys)
        .fetch_all(&mut *conn)
        .await
        .map_err(db("read sequence tails"))?;
    for row in &found {
        let read = |e: sqlx::Error| corrupt(e.to_string());
        let key: String = row.try_get("key").map_err(read)?;
        let last: Option<i64> = row.try_get("last").map_err(read)?;
        let waits: bool = row.try_get("waits").map_err(read)?;
        tails.insert(
            key,
            Tail {
                last: last.unwrap_or(0),
                waits,
            },
        );
    }
    Ok(tails)
}

/// Refuses the batch's new jobs (`columns`, in `queues`) with `QueueFull` when they would take a
/// queue, or a tenant's share of one, past its maximum depth.
///
/// Each limited queue (and each tenant of the batch in a queue with a per-tenant limit) is
/// locked until the transaction ends, in ascending key order, so concurrent batches cannot both
/// see the last free places, and cannot deadlock (every transaction takes its idempotency and
/// unique key locks before these). The counts run after the locks, so they see every batch that
/// held them before.
pub(super) async fn check_depth_limits(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    columns: &Columns,
    queues: &[&str],
) -> StoreResult<()> {
    let found = sqlx::query(ctx.sql.depth_limits.clone())
        .bind(queues)
        .fetch_all(&mut *conn)
        .await
        .map_err(db("read queue depth limits"))?;
    let mut limits: HashMap<String, (Option<u64>, Option<u64>)> = HashMap::new();
    for row in &found {
        let read = |e: sqlx::Error| corrupt(e.to_string());
        let queue: String = row.try_get("queue").map_err(read)?;
        let max_depth: Option<i64> = row.try_get("max_depth").map_err(read)?;
        let per_tenant: Option<i64> = row.try_get("max_depth_per_tenant").map_err(read)?;
        limits.insert(queue, (max_depth.map(count_of), per_tenant.map(count_of)));
    }
    let limit_of = |queue: &str| limits.get(queue).copied();
    let adding = conveyor_core::limits::depth_demand(
        columns
            .queues
            .iter()
            .zip(&columns.tenants)
            .map(|(queue, tenant)| (queue.as_str(), tenant.as_deref())),
        limit_of,
    );
    if adding.is_empty() {
        return Ok(());
    }
    let lock_keys: Vec<i64> = adding
        .keys()
        .map(|(queue, tenant)| depth_lock_key(ctx.schema, queue, *tenant))
        .collect();
    lock_in_order(&mut *conn, ctx, lock_keys, "lock queue depths").await?;
    let depth_queues: Vec<&str> = adding.keys().map(|(queue, _)| *queue).collect();
    let depth_tenants: Vec<Option<&str>> = adding.keys().map(|(_, tenant)| *tenant).collect();
    let depths: Vec<i64> = sqlx::query_scalar(ctx.sql.depths.clone())
        .bind(&depth_queues)
        .bind(&depth_tenants)
        .fetch_all(&mut *conn)
        .await
        .map_err(db("count queue depths"))?;
    if depths.len() != adding.len() {
        return Err(StoreError::backend(
            "postgres: queue depth count returned the wrong number of rows",
        ));
    }
    let mut depths = depths.into_iter();
    conveyor_core::limits::depth_verdict(&adding, |_, _| Ok(depths.next().map_or(0, count_of)))
}

/// A limit as stored: `bigint`, so limits past `i64::MAX` (no queue holds that many) are kept
/// as `i64::MAX`.
pub(super) fn stored_depth(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
