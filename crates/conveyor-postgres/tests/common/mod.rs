//! Shared by the integration tests: the database to use, fresh schemas, and their cleanup.
//!
//! Tests run against a real PostgreSQL: `postgres://postgres@127.0.0.1:5432/test` unless
//! `CONVEYOR_TEST_PG_URL` says otherwise. Each test works in a schema of its own with a random
//! name, dropped when its [`DropSchema`] guard is dropped, so tests run in parallel and leave
//! nothing behind.

// Each test binary compiles this module and uses a different part of it.
#![allow(dead_code)]

use conveyor_core::{Clock, ManualClock};
use conveyor_postgres::{PgOptions, PgStore};
use sqlx::Connection;
use std::sync::Arc;

pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

pub fn database_url() -> String {
    std::env::var("CONVEYOR_TEST_PG_URL").unwrap_or_else(|_| DEFAULT_URL.to_string())
}

/// A schema name no other test uses.
pub fn fresh_schema() -> String {
    format!("conveyor_test_{}", uuid::Uuid::new_v4().simple())
}

/// Drops its schema (and everything in it) when dropped.
pub struct DropSchema {
    schema: String,
}

impl DropSchema {
    /// Made before the store connects, so even a test that fails while connecting cleans up.
    pub fn new(schema: &str) -> Self {
        Self {
            schema: schema.to_string(),
        }
    }
}

impl Drop for DropSchema {
    fn drop(&mut self) {
        // Drop cannot await, and may run on a runtime thread where blocking on another future
        // would panic: do the work on a thread of its own with its own runtime and connection.
        let url = database_url();
        let schema = self.schema.clone();
        let outcome = std::thread::spawn(move || -> Result<(), String> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let mut conn = sqlx::PgConnection::connect(&url)
                    .await
                    .map_err(|e| e.to_string())?;
                // A connection left inside a transaction by a failed test must not hang the run.
                sqlx::raw_sql("SET lock_timeout = '10s'")
                    .execute(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
                )))
                .execute(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
                conn.close().await.map_err(|e| e.to_string())
            })
        })
        .join();
        // Panicking in Drop could abort a test that is already unwinding; report instead.
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(error)) => eprintln!("could not drop test schema {}: {error}", self.schema),
            Err(_) => eprintln!("dropping test schema {} panicked", self.schema),
        }
    }
}

/// Options for a test store in `schema`, reading time from `clock`.
pub fn options(schema: &str, clock: Arc<dyn Clock>) -> PgOptions {
    PgOptions {
        schema: schema.to_string(),
        clock,
        max_connections: 8,
        ..PgOptions::default()
    }
}

/// A store in a fresh schema, with a manual clock, and the guard that drops the schema.
pub async fn fresh_store() -> (PgStore, Arc<ManualClock>, DropSchema) {
    let schema = fresh_schema();
    let guard = DropSchema::new(&schema);
    let clock = Arc::new(ManualClock::default());
    let store = connect(&schema, clock.clone()).await;
    (store, clock, guard)
}

/// Another store on `schema` with a pool (and listener) of its own, as a second process has.
pub async fn connect(schema: &str, clock: Arc<dyn Clock>) -> PgStore {
    PgStore::connect(&database_url(), options(schema, clock))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "cannot connect to the test database {} (set CONVEYOR_TEST_PG_URL): {e}",
                database_url()
            )
        })
}

/// A conformance harness on a fresh schema (dropped with the harness), driven by a manual clock.
pub async fn make_harness() -> conveyor_storetest::Harness {
    let schema = fresh_schema();
    let guard = DropSchema::new(&schema);
    let clock = Arc::new(ManualClock::default());
    let store = connect(&schema, clock.clone()).await;
    conveyor_storetest::Harness::new(Arc::new(store), clock).with_cleanup(guard)
}
