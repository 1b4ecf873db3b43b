//! `conveyor token create|list|revoke`: API tokens for `conveyor serve --auth`, managed on the
//! store directly (so the first admin token can be made before any server runs). The secret is
//! printed once, by `create`; the store keeps only its hash.

use anyhow::Context;
use clap::{Args, Subcommand};
use conveyor::access::{create_token, revoke_token, Actor};
use conveyor::{ApiToken, Role, Store, TokenSelector};
use std::process::ExitCode;
use std::sync::Arc;

use super::table::Table;

/// Where the tokens are stored: the store the server runs on.
#[derive(Args, Debug)]
pub(crate) struct StoreArg {
    /// Store URL (the one `conveyor serve` uses).
    #[arg(long, env = "CONVEYOR_STORE", default_value = conveyor::DEFAULT_STORE_URL)]
    store: String,
    /// PostgreSQL: schema holding Conveyor's tables (a `?schema=` in the URL wins).
    #[arg(long, env = "CONVEYOR_SCHEMA", default_value = "conveyor")]
    schema: String,
}

impl StoreArg {
    pub(crate) async fn open(&self) -> anyhow::Result<Arc<dyn Store>> {
        let options = conveyor::OpenOptions {
            schema: self.schema.clone(),
            // Tokens may be created and revoked beside a running server: they live in a table
            // no server caches (every request reads its token), so sharing the file is safe.
            // The integrity check is the server's to run.
            exclusive: false,
            integrity_check: false,
            ..conveyor::OpenOptions::default()
        };
        conveyor::open_store(&self.store, options)
            .await
            .with_context(|| format!("cannot open store {}", self.store))
    }
}

#[derive(Subcommand, Debug)]
pub(crate) enum TokenCommand {
    /// Create a token and print its secret (once: it cannot be shown again).
    Create {
        /// producer (enqueue, read jobs), worker (fetch and report), or admin (everything).
        #[arg(long)]
        role: String,
        /// A name for the audit log (default: ROLE-xxxxxxxx). Unique among active tokens.
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        store: StoreArg,
    },
    /// List tokens (never their secrets).
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Revoke a token by name or id: it stops working at once, and its browser sessions end.
    Revoke {
        /// The token's name or id.
        token: String,
        #[command(flatten)]
        store: StoreArg,
    },
}

/// The audit log's actor for changes made here: whoever can open the store, named by login.
fn local_actor() -> Actor {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".to_string());
    Actor {
        name: format!("cli:{user}"),
        token_id: None,
    }
}

pub(crate) async fn run(command: TokenCommand) -> anyhow::Result<ExitCode> {
    match command {
        TokenCommand::Create { role, name, store } => {
            let role: Role = role.parse()?;
            let store = store.open().await?;
            let created = create_token(store.as_ref(), role, name, local_actor()).await?;
            // The secret alone on stdout, so `TOKEN=$(conveyor token create ...)` works.
            eprintln!(
                "created {} token {:?} ({}); its secret follows and is not shown again:",
                created.token.role, created.token.name, created.token.id
            );
            println!("{}", created.secret.plaintext);
            Ok(ExitCode::SUCCESS)
        }
        TokenCommand::List { json, store } => {
            let tokens = store.open().await?.tokens_list().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&tokens)?);
            } else {
                print_tokens(&tokens);
            }
            Ok(ExitCode::SUCCESS)
        }
        TokenCommand::Revoke { token, store } => {
            let store = store.open().await?;
            match revoke_token(store.as_ref(), TokenSelector::parse(&token), local_actor()).await? {
                Some(revoked) => {
                    println!("revoked token {:?} ({})", revoked.name, revoked.id);
                    Ok(ExitCode::SUCCESS)
                }
                None => {
                    eprintln!(
                        "conveyor: no active token named {token:?} and no token with that id"
                    );
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    }
}

fn print_tokens(tokens: &[ApiToken]) {
    if tokens.is_empty() {
        println!("no tokens; create one with `conveyor token create --role admin`");
        return;
    }
    let mut table = Table::new(["ID", "NAME", "ROLE", "CREATED", "REVOKED"]);
    let time = |at: chrono::DateTime<chrono::Utc>| at.format("%Y-%m-%d %H:%M:%S").to_string();
    for token in tokens {
        table.row([
            token.id.to_string(),
            token.name.clone(),
            token.role.to_string(),
            time(token.created_at),
            token
                .revoked_at
                .map(time)
                .unwrap_or_else(|| "-".to_string()),
        ]);
    }
    table.print();
}
