//! Access control and audit: API tokens, browser sessions and the audit log (see
//! `conveyor_core::access`). Changes run on the writer thread like every other write; lookups
//! (one per authenticated request) use the read pool.

use chrono::{DateTime, Utc};
use conveyor_core::access::{
    ApiToken, AuditEntry, AuditListParams, NewAuditEntry, NewSession, NewToken, Role,
    StoredSession, StoredToken, TokenSelector,
};
use conveyor_core::clock::{from_millis, to_millis};
use conveyor_core::{AuditAction, StoreResult, ValidationError};
use rusqlite::types::Type;
use rusqlite::{params, Connection, OptionalExtension, Row};
use std::str::FromStr;
use uuid::Uuid;

use crate::errors::backend;
use crate::writer::WriteCtx;

const TOKEN_COLUMNS: &str = "id, name, role, created_at, revoked_at, secret_hash";
const AUDIT_COLUMNS: &str =
    "id, at, actor, actor_token_id, action, target, job_ids, job_count, detail";

fn conversion(
    column: usize,
    error: impl std::error::Error + Send + Sync + 'static,
) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(column, Type::Text, Box::new(error))
}

fn uuid_at(row: &Row<'_>, column: usize) -> rusqlite::Result<Uuid> {
    let text: String = row.get(column)?;
    Uuid::parse_str(&text).map_err(|e| conversion(column, e))
}

/// A row selected with [`TOKEN_COLUMNS`] starting at `offset`.
fn token_row(row: &Row<'_>, offset: usize) -> rusqlite::Result<StoredToken> {
    let role: String = row.get(offset + 2)?;
    Ok(StoredToken {
        token: ApiToken {
            id: uuid_at(row, offset)?,
            name: row.get(offset + 1)?,
            role: Role::from_str(&role).map_err(|e| conversion(offset + 2, e))?,
            created_at: from_millis(row.get(offset + 3)?),
            revoked_at: row.get::<_, Option<i64>>(offset + 4)?.map(from_millis),
        },
        secret_hash: row.get(offset + 5)?,
    })
}

fn load_token(conn: &Connection, id: Uuid) -> StoreResult<Option<StoredToken>> {
    conn.prepare_cached(&format!(
        "SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE id = ?1"
    ))
    .and_then(|mut stmt| {
        stmt.query_row(params![id.to_string()], |row| token_row(row, 0))
            .optional()
    })
    .map_err(backend)
}

pub(crate) fn token_get(conn: &Connection, id: Uuid) -> StoreResult<Option<StoredToken>> {
    load_token(conn, id)
}

pub(crate) fn tokens_insert(ctx: &mut WriteCtx<'_>, token: NewToken) -> StoreResult<ApiToken> {
    // Checked here rather than left to the unique index, so the clash is reported as such.
    let taken: bool = ctx
        .conn
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM api_tokens WHERE name = ?1 AND revoked_at IS NULL)",
        )
        .and_then(|mut stmt| stmt.query_row(params![token.name], |row| row.get(0)))
        .map_err(backend)?;
    if taken {
        return Err(name_taken(&token.name).into());
    }
    ctx.conn
        .prepare_cached(
            "INSERT INTO api_tokens (id, name, role, secret_hash, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                token.id.to_string(),
                token.name,
                token.role.as_str(),
                token.secret_hash,
                to_millis(ctx.now)
            ])
        })
        .map_err(backend)?;
    Ok(ApiToken {
        id: token.id,
        name: token.name,
        role: token.role,
        created_at: ctx.now,
        revoked_at: None,
    })
}

pub(crate) fn name_taken(name: &str) -> ValidationError {
    ValidationError::new(
        "name",
        format!("an active token named {name:?} already exists; revoke it or choose another name"),
    )
}

pub(crate) fn tokens_list(conn: &Connection) -> StoreResult<Vec<ApiToken>> {
    conn.prepare_cached(&format!(
        "SELECT {TOKEN_COLUMNS} FROM api_tokens ORDER BY created_at, id"
    ))
    .and_then(|mut stmt| {
        stmt.query_map([], |row| token_row(row, 0).map(|stored| stored.token))?
            .collect()
    })
    .map_err(backend)
}

pub(crate) fn token_revoke(
    ctx: &mut WriteCtx<'_>,
    selector: &TokenSelector,
) -> StoreResult<Option<ApiToken>> {
    let id = match selector {
        TokenSelector::Id(id) => Some(*id),
        TokenSelector::Name(name) => ctx
            .conn
            .prepare_cached("SELECT id FROM api_tokens WHERE name = ?1 AND revoked_at IS NULL")
            .and_then(|mut stmt| {
                stmt.query_row(params![name], |row| uuid_at(row, 0))
                    .optional()
            })
            .map_err(backend)?,
    };
    let Some(id) = id else { return Ok(None) };
    let text = id.to_string();
    ctx.conn
        .prepare_cached(
            "UPDATE api_tokens SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
        )
        .and_then(|mut stmt| stmt.execute(params![text, to_millis(ctx.now)]))
        .map_err(backend)?;
    ctx.conn
        .prepare_cached("DELETE FROM sessions WHERE token_id = ?1")
        .and_then(|mut stmt| stmt.execute(params![text]))
        .map_err(backend)?;
    Ok(load_token(ctx.conn, id)?.map(|stored| stored.token))
}

pub(crate) fn session_insert(ctx: &mut WriteCtx<'_>, session: NewSession) -> StoreResult<()> {
    let now = to_millis(ctx.now);
    ctx.conn
        .prepare_cached("DELETE FROM sessions WHERE expires_at <= ?1")
        .and_then(|mut stmt| stmt.execute(params![now]))
        .map_err(backend)?;
    if load_token(ctx.conn, session.token_id)?.is_none() {
        return Err(ValidationError::new(
            "token",
            format!("no token with id {}", session.token_id),
        )
        .into());
    }
    ctx.conn
        .prepare_cached(
            "INSERT INTO sessions (id, secret_hash, token_id, created_at, expires_at) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                session.id.to_string(),
                session.secret_hash,
                session.token_id.to_string(),
                now,
                to_millis(session.expires_at)
            ])
        })
        .map_err(backend)?;
    Ok(())
}

pub(crate) fn session_get(
    conn: &Connection,
    id: Uuid,
    now: DateTime<Utc>,
) -> StoreResult<Option<StoredSession>> {
    let columns = TOKEN_COLUMNS
        .split(", ")
        .map(|column| format!("t.{column}"))
        .collect::<Vec<_>>()
        .join(", ");
    conn.prepare_cached(&format!(
        "SELECT s.id, s.secret_hash, s.created_at, s.expires_at, {columns} \
         FROM sessions s JOIN api_tokens t ON t.id = s.token_id \
         WHERE s.id = ?1 AND s.expires_at > ?2"
    ))
    .and_then(|mut stmt| {
        stmt.query_row(params![id.to_string(), to_millis(now)], |row| {
            Ok(StoredSession {
                id: uuid_at(row, 0)?,
                secret_hash: row.get(1)?,
                created_at: from_millis(row.get(2)?),
                expires_at: from_millis(row.get(3)?),
                token: token_row(row, 4)?.token,
            })
        })
        .optional()
    })
    .map_err(backend)
}

pub(crate) fn session_delete(ctx: &mut WriteCtx<'_>, id: Uuid) -> StoreResult<bool> {
    ctx.conn
        .prepare_cached("DELETE FROM sessions WHERE id = ?1")
        .and_then(|mut stmt| stmt.execute(params![id.to_string()]))
        .map(|deleted| deleted > 0)
        .map_err(backend)
}

pub(crate) fn audit_append(
    ctx: &mut WriteCtx<'_>,
    entry: NewAuditEntry,
) -> StoreResult<AuditEntry> {
    let entry = entry.bounded();
    let job_ids = serde_json::to_string(&entry.job_ids)
        .map_err(|e| conveyor_core::StoreError::backend(format!("audit job ids: {e}")))?;
    let job_count = i64::try_from(entry.job_count).unwrap_or(i64::MAX);
    ctx.conn
        .prepare_cached(
            "INSERT INTO audit_log (at, actor, actor_token_id, action, target, job_ids, \
                 job_count, detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                to_millis(ctx.now),
                entry.actor.name,
                entry.actor.token_id.map(|id| id.to_string()),
                entry.action.as_str(),
                entry.target,
                job_ids,
                job_count,
                entry.detail
            ])
        })
        .map_err(backend)?;
    Ok(AuditEntry::recorded(
        ctx.conn.last_insert_rowid(),
        ctx.now,
        entry,
    ))
}

fn audit_row(row: &Row<'_>) -> rusqlite::Result<AuditEntry> {
    let token_id: Option<String> = row.get(3)?;
    let action: String = row.get(4)?;
    let job_ids: String = row.get(6)?;
    Ok(AuditEntry {
        id: row.get(0)?,
        at: from_millis(row.get(1)?),
        actor: row.get(2)?,
        actor_token_id: token_id
            .map(|id| Uuid::parse_str(&id))
            .transpose()
            .map_err(|e| conversion(3, e))?,
        action: AuditAction::from_str(&action).map_err(|e| conversion(4, e))?,
        target: row.get(5)?,
        job_ids: serde_json::from_str(&job_ids).map_err(|e| conversion(6, e))?,
        job_count: row.get::<_, i64>(7)?.max(0) as u64,
        detail: row.get(8)?,
    })
}

pub(crate) fn audit_list(
    conn: &Connection,
    params: &AuditListParams,
) -> StoreResult<Vec<AuditEntry>> {
    // Two statements, so a filtered listing reads the `(action, id)` index instead of
    // scanning the whole log backwards for matches.
    let (before, limit) = params.stored_bounds();
    let outcome = match params.action {
        Some(action) => conn
            .prepare_cached(&format!(
                "SELECT {AUDIT_COLUMNS} FROM audit_log WHERE action = ?1 AND id < ?2 \
                 ORDER BY id DESC LIMIT ?3"
            ))
            .and_then(|mut stmt| {
                stmt.query_map(params![action.as_str(), before, limit], audit_row)?
                    .collect()
            }),
        None => conn
            .prepare_cached(&format!(
                "SELECT {AUDIT_COLUMNS} FROM audit_log WHERE id < ?1 ORDER BY id DESC LIMIT ?2"
            ))
            .and_then(|mut stmt| stmt.query_map(params![before, limit], audit_row)?.collect()),
    };
    outcome.map_err(backend)
}

/// Deletes up to `limit` of the oldest entries stamped before `cutoff`. Only the log's first
/// `limit` rows by id are read (appends come in time order, so what expired is the head): no
/// index on `at` to keep up at every append, and no scan of the log when nothing expired.
pub(crate) fn audit_prune(
    ctx: &mut WriteCtx<'_>,
    cutoff: conveyor_core::AuditCutoff,
    limit: usize,
) -> StoreResult<u64> {
    let before = cutoff.before(ctx.now);
    ctx.conn
        .prepare_cached(
            "DELETE FROM audit_log WHERE id IN (SELECT id FROM \
             (SELECT id, at FROM audit_log ORDER BY id LIMIT ?2) WHERE at < ?1)",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                to_millis(before),
                i64::try_from(limit).unwrap_or(i64::MAX)
            ])
        })
        .map(|deleted| deleted as u64)
        .map_err(backend)
}
