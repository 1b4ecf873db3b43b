//! `conveyor store copy` and `conveyor migrate`: moving a queue between stores, and schema setup.

use anyhow::Context;
use clap::{Args, Subcommand};
use conveyor::Store;
use conveyor_core::copy::{copy_all, CopyOptions, KindReport};
use std::process::ExitCode;
use std::sync::Arc;

/// Records read and written per round trip while copying.
const COPY_PAGE: usize = 1000;

#[derive(Subcommand, Debug)]
pub(crate) enum StoreCommand {
    /// Copy every kind of durable state from one store to another: queue and kind settings
    /// (schemas, breakers), circuit breaker states, tokens (hashes only), schedules and their
    /// runs, flows with their steps, jobs with their history, the audit log and history
    /// rollups. Records the target already holds are left alone, so a second run adds only
    /// what is missing. Stop servers and workers on the source first: records that change
    /// during the copy may be copied as they were.
    Copy {
        /// Source store URL.
        #[arg(long)]
        from: String,
        /// Target store URL (created and migrated if needed).
        #[arg(long)]
        to: String,
        /// Read and count the source's records; write nothing (the target is not opened).
        #[arg(long)]
        dry_run: bool,
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
        StoreCommand::Copy { from, to, dry_run } => copy(&from, &to, dry_run).await,
    }
}

/// Whether two store URLs name the same store: the same SQLite file, or the same PostgreSQL
/// database and schema.
fn same_store(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    match (conveyor::sqlite_path(a), conveyor::sqlite_path(b)) {
        (Some(a), Some(b)) => match (a.canonicalize(), b.canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => a == b,
        },
        (None, None) => {
            let base = |url: &str| {
                url.split_once('?')
                    .map_or(url, |(base, _)| base)
                    .to_string()
            };
            base(a) == base(b) && conveyor::postgres_schema(a) == conveyor::postgres_schema(b)
        }
        _ => false,
    }
}

/// `1234567` as `1,234,567`.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

async fn copy(from: &str, to: &str, dry_run: bool) -> anyhow::Result<ExitCode> {
    if same_store(from, to) {
        anyhow::bail!("--from and --to name the same store ({from}): nothing to copy");
    }
    // Opening a SQLite URL creates the file: a source that is not there is a mistake.
    if let Some(path) = conveyor::sqlite_path(from) {
        if !path.exists() {
            anyhow::bail!("source store {from}: {} does not exist", path.display());
        }
    }
    let source = conveyor::open_store(from, Default::default())
        .await
        .with_context(|| format!("cannot open source store {from}"))?;
    let target = if dry_run {
        None
    } else {
        Some(
            conveyor::open_store(to, Default::default())
                .await
                .with_context(|| format!("cannot open target store {to}"))?,
        )
    };
    let options = CopyOptions {
        page: COPY_PAGE,
        dry_run,
    };
    let print = |report: &KindReport| {
        if dry_run {
            println!("{}: {} to copy", report.kind, grouped(report.read));
        } else {
            println!(
                "{}: {} read, {} written, {} already there",
                report.kind,
                grouped(report.read),
                grouped(report.written),
                grouped(report.already_there)
            );
        }
    };
    // A dry run reads the source as both sides: `copy_all` writes nothing then.
    let reports = copy_all(
        source.as_ref(),
        target.as_deref().unwrap_or(source.as_ref()),
        options,
        print,
    )
    .await?;
    let total = |f: fn(&KindReport) -> u64| reports.iter().map(f).sum::<u64>();
    if dry_run {
        println!(
            "dry run: {} record(s) in {from} would be copied to {to}; nothing was written",
            grouped(total(|r| r.read))
        );
    } else {
        println!(
            "copied {} record(s) from {from} to {to} ({} read; {} already there)",
            grouped(total(|r| r.written)),
            grouped(total(|r| r.read)),
            grouped(total(|r| r.already_there))
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn migrate(args: MigrateArgs) -> anyhow::Result<ExitCode> {
    let store: Arc<dyn Store> = conveyor::open_store(&args.store, Default::default())
        .await
        .with_context(|| format!("cannot open store {}", args.store))?;
    drop(store);
    println!("store {} is at the current schema version", args.store);
    Ok(ExitCode::SUCCESS)
}
