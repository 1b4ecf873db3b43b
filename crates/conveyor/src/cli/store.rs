//! `conveyor store copy` and `conveyor migrate`: moving a queue between stores, and schema setup.

use anyhow::Context;
use clap::{Args, Subcommand};
use conveyor::{JobListParams, Store};
use std::process::ExitCode;
use std::sync::Arc;

/// Jobs read and written per round trip while copying.
const COPY_PAGE: usize = 1000;

#[derive(Subcommand, Debug)]
pub(crate) enum StoreCommand {
    /// Copy every job, with its state and history, from one store to another. Stop servers and
    /// workers on the source first: jobs that change during the copy may be copied as they were.
    Copy {
        /// Source store URL.
        #[arg(long)]
        from: String,
        /// Target store URL (created and migrated if needed).
        #[arg(long)]
        to: String,
    },
}

#[derive(Args, Debug)]
pub(crate) struct MigrateArgs {
    /// Store to create or upgrade.
    #[arg(long, env = "CONVEYOR_STORE", default_value = conveyor::DEFAULT_STORE_URL)]
    store: String,
}

pub(crate) async fn run(command: StoreCommand) -> anyhow::Result<ExitCode> {
    match command {
        StoreCommand::Copy { from, to } => {
            if from == to {
                anyhow::bail!("--from and --to name the same store");
            }
            let source = conveyor::open_store(&from, Default::default())
                .await
                .with_context(|| format!("cannot open source store {from}"))?;
            let target = conveyor::open_store(&to, Default::default())
                .await
                .with_context(|| format!("cannot open target store {to}"))?;
            let (read, written) = copy(source.as_ref(), target.as_ref()).await?;
            println!(
                "copied {written} job(s) from {from} to {to} ({read} read; {} already there)",
                read - written
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Copies every job page by page (newest first); returns (read, inserted).
pub(crate) async fn copy(source: &dyn Store, target: &dyn Store) -> anyhow::Result<(u64, u64)> {
    let (mut read, mut written) = (0u64, 0u64);
    let mut after = None;
    loop {
        let page = source
            .jobs_list({
                let mut params = JobListParams::default();
                params.limit = COPY_PAGE;
                params.after = after;
                params
            })
            .await
            .context("reading from the source store")?;
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        read += page.len() as u64;
        written += target
            .jobs_import(page)
            .await
            .context("writing to the target store")?;
    }
    Ok((read, written))
}

pub(crate) async fn migrate(args: MigrateArgs) -> anyhow::Result<ExitCode> {
    let store: Arc<dyn Store> = conveyor::open_store(&args.store, Default::default())
        .await
        .with_context(|| format!("cannot open store {}", args.store))?;
    drop(store);
    println!("store {} is at the current schema version", args.store);
    Ok(ExitCode::SUCCESS)
}
