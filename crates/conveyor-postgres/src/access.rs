//! Access control and audit: API tokens, browser sessions and the audit log (see
//! `conveyor_core::access`). Every statement is built once per store for its schema, as in
//! `sql.rs`; every value is a bind parameter.

use chrono::{DateTime, Utc};
use conveyor_core::access::{
    ApiToken, AuditEntry, AuditListParams, NewAuditEntry, NewSession, NewToken, Role,
    StoredSession, StoredToken, TokenSelector,
};
use conveyor_core::{AuditAction, StoreError, StoreResult, ValidationError};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row, SqlStr};
use std::str::FromStr;
use uuid::Uuid;

use crate::errors::db;
use crate::names::quoted;
use crate::sql::stmt;

const TOKEN_COLUMNS: &str = "t.id, t.name, t.role, t.created_at, t.revoked_at, t.secret_hash";
const AUDIT_COLUMNS: &str =
    "id, at, actor, actor_token_id, action, target, job_ids, job_count, detail";

/// Unique violation: another active token took the name between our check and our insert.
const UNIQUE_VIOLATION: &str = "23505";

pub(crate) struct AccessSql {
    token_get: SqlStr,
    token_name_taken: SqlStr,
    token_insert: SqlStr,
    tokens_list: SqlStr,
    token_id_by_name: SqlStr,
    token_revoke: SqlStr,
    sessions_of_token: SqlStr,
    sessions_prune: SqlStr,
    session_insert: SqlStr,
    session_get: SqlStr,
    session_delete: SqlStr,
    audit_insert: SqlStr,
    audit_list: SqlStr,
    audit_list_action: SqlStr,
    audit_prune: SqlStr,
}

impl AccessSql {
    /// Statements for `schema`, which must already be validated.
    pub(crate) fn new(schema: &str) -> Self {
        let tokens = format!("{}.api_tokens", quoted(schema));
        let sessions = format!("{}.sessions", quoted(schema));
        let audit = format!("{}.audit_log", quoted(schema));
        Self {
            token_get: stmt(format!(
                "SELECT {TOKEN_COLUMNS} FROM {tokens} t WHERE t.id = $1"
            )),
            token_name_taken: stmt(format!(
                "SELECT EXISTS (SELECT 1 FROM {tokens} WHERE name = $1 AND revoked_at IS NULL)"
            )),
            token_insert: stmt(format!(
                "INSERT INTO {tokens} (id, name, role, secret_hash, created_at) \
                 VALUES ($1, $2, $3, $4, $5)"
            )),
            tokens_list: stmt(format!(
                "SELECT {TOKEN_COLUMNS} FROM {tokens} t ORDER BY t.created_at, t.id"
            )),
            token_id_by_name: stmt(format!(
                "SELECT id FROM {tokens} WHERE name = $1 AND revoked_at IS NULL"
            )),
            token_revoke: stmt(format!(
                "UPDATE {tokens} SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL"
            )),
            sessions_of_token: stmt(format!("DELETE FROM {sessions} WHERE token_id = $1")),
            sessions_prune: stmt(format!("DELETE FROM {sessions} WHERE expires_at <= $1")),
            session_insert: stmt(format!(
                "INSERT INTO {sessions} (id, secret_hash, token_id, created_at, expires_at) \
                 SELECT $1, $2, t.id, $4, $5 FROM {tokens} t WHERE t.id = $3"
            )),
            session_get: stmt(format!(
                "SELECT s.id AS session_id, s.secret_hash AS session_secret_hash, \
                     s.created_at AS session_created_at, s.expires_at, {TOKEN_COLUMNS} \
                 FROM {sessions} s JOIN {tokens} t ON t.id = s.token_id \
                 WHERE s.id = $1 AND s.expires_at > $2"
            )),
            session_delete: stmt(format!("DELETE FROM {sessions} WHERE id = $1")),
            audit_insert: stmt(format!(
                "INSERT INTO {audit} (at, actor, actor_token_id, action, target, job_ids, \
                     job_count, detail) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id"
            )),
            audit_list: stmt(format!(
                "SELECT {AUDIT_COLUMNS} FROM {audit} WHERE id < $1 ORDER BY id DESC LIMIT $2"
            )),
            // A statement of its own, so a filtered listing reads the (action, id) index.
            audit_list_action: stmt(format!(
                "SELECT {AUDIT_COLUMNS} FROM {audit} WHERE action = $3 AND id < $1 \
                 ORDER BY id DESC LIMIT $2"
            )),
            // Only the log's first $2 rows by id are read (appends come in time order, so
            // what expired is the head): no index on `at` to keep up at every append.
            audit_prune: stmt(format!(
                "DELETE FROM {audit} WHERE id IN (SELECT id FROM \
                 (SELECT id, at FROM {audit} ORDER BY id LIMIT $2) head WHERE at < $1)"
            )),
        }
    }
}

fn unreadable(what: impl std::fmt::Display) -> StoreError {
    StoreError::backend(format!("postgres: unreadable access row: {what}"))
}

fn column<'r, T>(row: &'r PgRow, name: &str) -> StoreResult<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(name)
        .map_err(|e| unreadable(format!("column {name}: {e}")))
}

fn token_of(row: &PgRow) -> StoreResult<StoredToken> {
    let role: String = column(row, "role")?;
    Ok(StoredToken {
        token: ApiToken {
            id: column(row, "id")?,
            name: column(row, "name")?,
            role: Role::from_str(&role).map_err(unreadable)?,
            created_at: column(row, "created_at")?,
            revoked_at: column(row, "revoked_at")?,
        },
        secret_hash: column(row, "secret_hash")?,
    })
}

fn name_taken(name: &str) -> StoreError {
    ValidationError::new(
        "name",
        format!("an active token named {name:?} already exists; revoke it or choose another name"),
    )
    .into()
}

pub(crate) async fn token_get(
    conn: &mut PgConnection,
    sql: &AccessSql,
    id: Uuid,
) -> StoreResult<Option<StoredToken>> {
    sqlx::query(sql.token_get.clone())
        .bind(id)
        .fetch_optional(conn)
        .await
        .map_err(db("read token"))?
        .as_ref()
        .map(token_of)
        .transpose()
}

pub(crate) async fn tokens_insert(
    conn: &mut PgConnection,
    sql: &AccessSql,
    now: DateTime<Utc>,
    token: NewToken,
) -> StoreResult<ApiToken> {
    let taken: bool = sqlx::query_scalar(sql.token_name_taken.clone())
        .bind(&token.name)
        .fetch_one(&mut *conn)
        .await
        .map_err(db("check token name"))?;
    if taken {
        return Err(name_taken(&token.name));
    }
    let inserted = sqlx::query(sql.token_insert.clone())
        .bind(token.id)
        .bind(&token.name)
        .bind(token.role.as_str())
        .bind(&token.secret_hash)
        .bind(now)
        .execute(conn)
        .await;
    match inserted {
        Ok(_) => Ok(ApiToken {
            id: token.id,
            name: token.name,
            role: token.role,
            created_at: now,
            revoked_at: None,
        }),
        // A concurrent insert of the same name won the race for the partial unique index.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(UNIQUE_VIOLATION) => {
            Err(name_taken(&token.name))
        }
        Err(e) => Err(db("insert token")(e)),
    }
}

pub(crate) async fn tokens_list(
    conn: &mut PgConnection,
    sql: &AccessSql,
) -> StoreResult<Vec<ApiToken>> {
    sqlx::query(sql.tokens_list.clone())
        .fetch_all(conn)
        .await
        .map_err(db("list tokens"))?
        .iter()
        .map(|row| token_of(row).map(|stored| stored.token))
        .collect()
}

/// Runs in the caller's transaction, so the revocation and the deletion of its sessions
/// commit together.
pub(crate) async fn token_revoke(
    conn: &mut PgConnection,
    sql: &AccessSql,
    now: DateTime<Utc>,
    selector: &TokenSelector,
) -> StoreResult<Option<ApiToken>> {
    let id = match selector {
        TokenSelector::Id(id) => Some(*id),
        TokenSelector::Name(name) => sqlx::query_scalar(sql.token_id_by_name.clone())
            .bind(name)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db("find token by name"))?,
    };
    let Some(id) = id else { return Ok(None) };
    sqlx::query(sql.token_revoke.clone())
        .bind(id)
        .bind(now)
        .execute(&mut *conn)
        .await
        .map_err(db("revoke token"))?;
    sqlx::query(sql.sessions_of_token.clone())
        .bind(id)
        .execute(&mut *conn)
        .await
        .map_err(db("delete the token's sessions"))?;
    Ok(token_get(conn, sql, id).await?.map(|stored| stored.token))
}

pub(crate) async fn session_insert(
    conn: &mut PgConnection,
    sql: &AccessSql,
    now: DateTime<Utc>,
    session: NewSession,
) -> StoreResult<()> {
    sqlx::query(sql.sessions_prune.clone())
        .bind(now)
        .execute(&mut *conn)
        .await
        .map_err(db("prune expired sessions"))?;
    let inserted = sqlx::query(sql.session_insert.clone())
        .bind(session.id)
        .bind(&session.secret_hash)
        .bind(session.token_id)
        .bind(now)
        .bind(session.expires_at)
        .execute(conn)
        .await
        .map_err(db("insert session"))?;
    if inserted.rows_affected() == 0 {
        return Err(ValidationError::new(
            "token",
            format!("no token with id {}", session.token_id),
        )
        .into());
    }
    Ok(())
}

pub(crate) async fn session_get(
    conn: &mut PgConnection,
    sql: &AccessSql,
    now: DateTime<Utc>,
    id: Uuid,
) -> StoreResult<Option<StoredSession>> {
    let Some(row) = sqlx::query(sql.session_get.clone())
        .bind(id)
        .bind(now)
        .fetch_optional(conn)
        .await
        .map_err(db("read session"))?
    else {
        return Ok(None);
    };
    Ok(Some(StoredSession {
        id: column(&row, "session_id")?,
        secret_hash: column(&row, "session_secret_hash")?,
        created_at: column(&row, "session_created_at")?,
        expires_at: column(&row, "expires_at")?,
        token: token_of(&row)?.token,
    }))
}

pub(crate) async fn session_delete(
    conn: &mut PgConnection,
    sql: &AccessSql,
    id: Uuid,
) -> StoreResult<bool> {
    let deleted = sqlx::query(sql.session_delete.clone())
        .bind(id)
        .execute(conn)
        .await
        .map_err(db("delete session"))?;
    Ok(deleted.rows_affected() > 0)
}

pub(crate) async fn audit_append(
    conn: &mut PgConnection,
    sql: &AccessSql,
    now: DateTime<Utc>,
    entry: NewAuditEntry,
) -> StoreResult<AuditEntry> {
    let entry = entry.bounded();
    let id: i64 = sqlx::query_scalar(sql.audit_insert.clone())
        .bind(now)
        .bind(&entry.actor.name)
        .bind(entry.actor.token_id)
        .bind(entry.action.as_str())
        .bind(&entry.target)
        .bind(&entry.job_ids)
        .bind(i64::try_from(entry.job_count).unwrap_or(i64::MAX))
        .bind(&entry.detail)
        .fetch_one(conn)
        .await
        .map_err(db("append audit entry"))?;
    Ok(AuditEntry::recorded(id, now, entry))
}

fn audit_of(row: &PgRow) -> StoreResult<AuditEntry> {
    let action: String = column(row, "action")?;
    Ok(AuditEntry {
        id: column(row, "id")?,
        at: column(row, "at")?,
        actor: column(row, "actor")?,
        actor_token_id: column(row, "actor_token_id")?,
        action: AuditAction::from_str(&action).map_err(unreadable)?,
        target: column(row, "target")?,
        job_ids: column(row, "job_ids")?,
        job_count: column::<i64>(row, "job_count")?.max(0) as u64,
        detail: column(row, "detail")?,
    })
}

pub(crate) async fn audit_list(
    conn: &mut PgConnection,
    sql: &AccessSql,
    params: &AuditListParams,
) -> StoreResult<Vec<AuditEntry>> {
    let (before, limit) = params.stored_bounds();
    let query = match params.action {
        Some(action) => sqlx::query(sql.audit_list_action.clone())
            .bind(before)
            .bind(limit)
            .bind(action.as_str()),
        None => sqlx::query(sql.audit_list.clone()).bind(before).bind(limit),
    };
    query
        .fetch_all(conn)
        .await
        .map_err(db("list audit entries"))?
        .iter()
        .map(audit_of)
        .collect()
}

pub(crate) async fn audit_prune(
    conn: &mut PgConnection,
    sql: &AccessSql,
    before: DateTime<Utc>,
    limit: usize,
) -> StoreResult<u64> {
    let deleted = sqlx::query(sql.audit_prune.clone())
        .bind(before)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .execute(conn)
        .await
        .map_err(db("prune audit entries"))?;
    Ok(deleted.rows_affected())
}
