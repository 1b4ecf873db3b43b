//! Versioned, forward-only schema migrations, recorded in `schema_migrations` inside the
//! configured schema.
//!
//! All pending migrations run in one transaction under an advisory lock derived from the schema
//! name, so processes starting at the same time apply each migration exactly once: the others
//! wait for the lock and then find nothing left to do. DDL is transactional in PostgreSQL, so a
//! failed migration leaves no half-built schema behind.

use conveyor_core::{StoreError, StoreResult};
use sqlx::{AssertSqlSafe, PgConnection, PgPool};

use crate::errors::db;
use crate::names::{channel, migration_lock_key, quoted, validate_schema};

/// One schema change. `sql` may hold several statements; `@schema@` stands for the schema and
/// `@channel@` for its NOTIFY channel.
struct Migration {
    version: i32,
    name: &'static str,
    sql: &'static str,
}

/// Every migration, in order; versions are 1, 2, 3, ... Never edit a released entry: add one.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "jobs",
        sql: include_str!("migrations/0001_jobs.sql"),
    },
    Migration {
        version: 2,
        name: "leadership",
        sql: include_str!("migrations/0002_leadership.sql"),
    },
    Migration {
        version: 3,
        name: "queue_settings",
        sql: include_str!("migrations/0003_queue_settings.sql"),
    },
    Migration {
        version: 4,
        name: "concurrency_limit",
        sql: include_str!("migrations/0004_concurrency_limit.sql"),
    },
    Migration {
        version: 5,
        name: "schedules",
        sql: include_str!("migrations/0005_schedules.sql"),
    },
    Migration {
        version: 6,
        name: "unique_jobs",
        sql: include_str!("migrations/0006_unique_jobs.sql"),
    },
    Migration {
        version: 7,
        name: "flow_control",
        sql: include_str!("migrations/0007_flow_control.sql"),
    },
    Migration {
        version: 8,
        name: "drop_jobs_running",
        sql: include_str!("migrations/0008_drop_jobs_running.sql"),
    },
    Migration {
        version: 9,
        name: "access",
        sql: include_str!("migrations/0009_access.sql"),
    },
    Migration {
        version: 10,
        name: "workers",
        sql: include_str!("migrations/0010_workers.sql"),
    },
    Migration {
        version: 11,
        name: "retention",
        sql: include_str!("migrations/0011_retention.sql"),
    },
    Migration {
        version: 12,
        name: "jobs_vacuum",
        sql: include_str!("migrations/0012_jobs_vacuum.sql"),
    },
    Migration {
        version: 13,
        name: "workflows",
        sql: include_str!("migrations/0013_workflows.sql"),
    },
    Migration {
        version: 14,
        name: "kinds",
        sql: include_str!("migrations/0014_kinds.sql"),
    },
    Migration {
        version: 15,
        name: "flow_steps_hot",
        sql: include_str!("migrations/0015_flow_steps_hot.sql"),
    },
    Migration {
        version: 16,
        name: "expiry_trace",
        sql: include_str!("migrations/0016_expiry_trace.sql"),
    },
    Migration {
        version: 17,
        name: "circuit_breakers",
        sql: include_str!("migrations/0017_circuit_breakers.sql"),
    },
    Migration {
        version: 18,
        name: "viewer_role",
        sql: include_str!("migrations/0018_viewer_role.sql"),
    },
    Migration {
        version: 19,
        name: "stats",
        sql: include_str!("migrations/0019_stats.sql"),
    },
    Migration {
        version: 20,
        name: "config",
        sql: include_str!("migrations/0020_config.sql"),
    },
    Migration {
        version: 21,
        name: "limits",
        sql: include_str!("migrations/0021_limits.sql"),
    },
    Migration {
        version: 22,
        name: "sequences",
        sql: include_str!("migrations/0022_sequences.sql"),
    },
    Migration {
        version: 23,
        name: "batches",
        sql: include_str!("migrations/0023_batches.sql"),
    },
    Migration {
        version: 24,
        name: "blocked_depth",
        sql: include_str!("migrations/0024_blocked_depth.sql"),
    },
    Migration {
        version: 25,
        name: "turns",
        sql: include_str!("migrations/0025_turns.sql"),
    },
    Migration {
        version: 26,
        name: "common_path",
        sql: include_str!("migrations/0026_common_path.sql"),
    },
];

/// The migration version this code expects a schema to be at.
pub const SCHEMA_VERSION: u32 = 26;

/// Applies pending migrations to `schema` (creating the schema if it does not exist) and returns
/// how many were applied (0 when it was already up to date).
///
/// Safe to call from several processes at once. Fails with a clear error when the database was
/// migrated by a newer Conveyor than this one.
pub async fn migrate(pool: &PgPool, schema: &str) -> StoreResult<u32> {
    validate_schema(schema)?;
    let mut tx = pool.begin().await.map_err(db("begin migration"))?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(migration_lock_key(schema))
        .execute(&mut *tx)
        .await
        .map_err(db("lock schema for migration"))?;

    let schema_exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
            .bind(schema)
            .fetch_one(&mut *tx)
            .await
            .map_err(db("look up schema"))?;
    // Created only when missing, so a role without CREATE on the database can still run against
    // a schema an administrator made for it.
    if !schema_exists {
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE SCHEMA {}", quoted(schema))))
            .execute(&mut *tx)
            .await
            .map_err(db("create schema"))?;
    }
    if !migrations_table_exists(&mut tx, schema).await? {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE {}.schema_migrations (\
                 version integer PRIMARY KEY, \
                 name text NOT NULL, \
                 applied_at timestamptz NOT NULL DEFAULT now())",
            quoted(schema)
        )))
        .execute(&mut *tx)
        .await
        .map_err(db("create schema_migrations"))?;
    }

    let current = current_version(&mut tx, schema).await?;
    if current > SCHEMA_VERSION {
        return Err(newer_than_code(schema, current));
    }
    let mut applied = 0;
    for migration in MIGRATIONS
        .iter()
        .filter(|m| i64::from(m.version) > i64::from(current))
    {
        let sql = migration
            .sql
            .replace("@schema@", &quoted(schema))
            .replace("@channel@", &channel(schema));
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&mut *tx)
            .await
            .map_err(|e| {
                StoreError::backend(format!(
                    "postgres: migration {} ({}) of schema {schema} failed: {e}",
                    migration.version, migration.name
                ))
            })?;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {}.schema_migrations (version, name) VALUES ($1, $2)",
            quoted(schema)
        )))
        .bind(migration.version)
        .bind(migration.name)
        .execute(&mut *tx)
        .await
        .map_err(db("record migration"))?;
        applied += 1;
        tracing::info!(
            schema,
            version = migration.version,
            name = migration.name,
            "applied migration"
        );
    }
    tx.commit().await.map_err(db("commit migration"))?;
    Ok(applied)
}

/// Fails unless `schema` is at exactly [`SCHEMA_VERSION`]: for stores opened with
/// `run_migrations: false`, whose schema someone else manages.
pub(crate) async fn check_version(pool: &PgPool, schema: &str) -> StoreResult<()> {
    let mut conn = pool.acquire().await.map_err(db("check schema version"))?;
    let current = if migrations_table_exists(&mut conn, schema).await? {
        current_version(&mut conn, schema).await?
    } else {
        0
    };
    match current.cmp(&SCHEMA_VERSION) {
        std::cmp::Ordering::Equal => Ok(()),
        std::cmp::Ordering::Greater => Err(newer_than_code(schema, current)),
        std::cmp::Ordering::Less => Err(StoreError::backend(format!(
            "postgres: schema {schema} is at migration version {current} but this Conveyor \
             needs version {SCHEMA_VERSION}; run the migrations (PgOptions::run_migrations, or \
             conveyor_postgres::migrate)"
        ))),
    }
}

async fn migrations_table_exists(conn: &mut PgConnection, schema: &str) -> StoreResult<bool> {
    sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(format!("{}.schema_migrations", quoted(schema)))
        .fetch_one(conn)
        .await
        .map_err(db("look up schema_migrations"))
}

async fn current_version(conn: &mut PgConnection, schema: &str) -> StoreResult<u32> {
    let version: i32 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT COALESCE(MAX(version), 0) FROM {}.schema_migrations",
        quoted(schema)
    )))
    .fetch_one(conn)
    .await
    .map_err(db("read migration version"))?;
    u32::try_from(version).map_err(|_| {
        StoreError::backend(format!(
            "postgres: schema {schema} records a negative migration version ({version})"
        ))
    })
}

fn newer_than_code(schema: &str, found: u32) -> StoreError {
    StoreError::backend(format!(
        "postgres: schema {schema} is at migration version {found}, newer than this Conveyor \
         knows ({SCHEMA_VERSION}); upgrade Conveyor before using this database"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The release triggers as migration 22 created them and as migration 26 arms them again:
    /// the same text but for comments and layout.
    #[test]
    fn the_armed_release_triggers_are_migration_22s() {
        let triggers = |sql: &str| -> String {
            let start = sql.find("CREATE TRIGGER jobs_sequence_release_on_update");
            let end = sql.rfind("EXECUTE FUNCTION @schema@.sequence_release('@channel@');");
            let (Some(start), Some(end)) = (start, end) else {
                panic!("no release triggers in {sql}");
            };
            sql[start..end]
                .lines()
                .map(|line| line.split("--").next().unwrap_or("").trim())
                .filter(|line| !line.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(
            triggers(include_str!("migrations/0022_sequences.sql")),
            triggers(include_str!("migrations/0026_common_path.sql"))
        );
    }

    #[test]
    fn the_sequence_release_trigger_spells_cores_rule() {
        let sql = include_str!("migrations/0022_sequences.sql");
        for prefix in ["", "OLD.", "NEW."] {
            let rule = conveyor_core::sequence::holds_sql(prefix);
            assert!(sql.contains(&rule), "migration 22 lacks {rule}");
        }
        let open: Vec<String> = conveyor_core::sequence::OPEN_STATES
            .iter()
            .map(|state| format!("'{}'", state.as_str()))
            .collect();
        assert!(
            sql.contains(&open.join(", ")),
            "the open states as the index lists them"
        );
    }

    #[test]
    fn enqueues_and_the_release_trigger_lock_a_sequence_key_alike() {
        let trigger = include_str!("migrations/0022_sequences.sql");
        let insert = crate::sql::sequence_lock_keys_sql("conveyor");
        let key = |schema: &str, key: &str| {
            format!("'conveyor:sequence:' || {schema} || ':' || {key}, 0)")
        };
        assert!(trigger.contains(&key("TG_TABLE_SCHEMA", "OLD.sequence_key")));
        assert!(
            insert.contains(&format!("hashtextextended({}", key("$2", "k"))),
            "{insert}"
        );
    }

    #[test]
    fn migrations_are_numbered_one_to_latest() {
        for (i, migration) in MIGRATIONS.iter().enumerate() {
            assert_eq!(migration.version as usize, i + 1, "{}", migration.name);
            assert!(
                migration.sql.contains("@schema@"),
                "every statement is schema-qualified: {}",
                migration.name
            );
        }
        assert_eq!(MIGRATIONS.len(), SCHEMA_VERSION as usize);
    }
}
