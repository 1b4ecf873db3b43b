//! Model-based test: random sequences of operations (enqueue, fetch, heartbeat, complete, fail,
//! cancel, replay, clock moves, rescue, restarts...) applied to a SQLite store and to the
//! reference model in `conveyor_storetest::model`, compared after every step. Each case works
//! on a fresh file in a temporary directory; a restart drops the store and reopens the file.
//!
//! `PROPTEST_CASES` (default 64), `CONVEYOR_MODEL_MAX_OPS` (default 48) and
//! `PROPTEST_RNG_SEED` (printed on failure) tune a run.

use conveyor_core::{ManualClock, StoreResult};
use conveyor_sqlite::{SqliteOptions, SqliteStore};
use conveyor_storetest::model::{check_known_sequences, run_model, ModelBackend, ModelSettings};
use std::sync::Arc;

struct Sqlite;

impl ModelBackend for Sqlite {
    type Db = tempfile::TempDir;
    type Store = SqliteStore;

    async fn create(&self) -> Self::Db {
        tempfile::tempdir().expect("create a temporary directory")
    }

    async fn open(&self, db: &Self::Db, clock: Arc<ManualClock>) -> StoreResult<SqliteStore> {
        SqliteStore::open(
            db.path().join("jobs.db"),
            SqliteOptions {
                clock,
                ..SqliteOptions::default()
            },
        )
    }
}

#[test]
fn sqlite_store_agrees_with_the_model() {
    run_model(Sqlite, ModelSettings::from_env());
}

/// Sequences that pin rules random cases reach rarely (see `model::known_sequences`).
#[test]
fn sqlite_store_agrees_with_the_model_on_known_sequences() {
    check_known_sequences(&Sqlite);
}
