//! Model-based test: random sequences of operations (enqueue, fetch, heartbeat, complete, fail,
//! cancel, replay, clock moves, rescue, restarts...) applied to a PostgreSQL store and to the
//! reference model in `conveyor_storetest::model`, compared after every step. Each case works
//! in a schema of its own, dropped afterwards; a restart closes the store's pool and connects
//! a new store to the same schema.
//!
//! `PROPTEST_CASES` (default 64), `CONVEYOR_MODEL_MAX_OPS` (default 48) and
//! `PROPTEST_RNG_SEED` (printed on failure) tune a run.

mod common;

use conveyor_core::{ManualClock, StoreResult};
use conveyor_postgres::PgStore;
use conveyor_storetest::model::{check_known_sequences, run_model, ModelBackend, ModelSettings};
use std::sync::Arc;

struct Postgres;

impl ModelBackend for Postgres {
    /// The schema's name and the guard that drops it.
    type Db = (String, common::DropSchema);
    type Store = PgStore;

    async fn create(&self) -> Self::Db {
        let schema = common::fresh_schema();
        let guard = common::DropSchema::new(&schema);
        (schema, guard)
    }

    async fn open(&self, db: &Self::Db, clock: Arc<ManualClock>) -> StoreResult<PgStore> {
        PgStore::connect(&common::database_url(), common::options(&db.0, clock)).await
    }

    async fn close(&self, store: PgStore) {
        store.pool().close().await;
        drop(store);
    }
}

#[test]
fn postgres_store_agrees_with_the_model() {
    run_model(Postgres, ModelSettings::from_env());
}

/// Sequences that pin rules random cases reach rarely (see `model::known_sequences`).
#[test]
fn postgres_store_agrees_with_the_model_on_known_sequences() {
    check_known_sequences(&Postgres);
}
