//! `conveyor job show|cancel`.

use crate::cli::http::decode;
use clap::Subcommand;
use serde_json::json;
use std::process::ExitCode;

use super::{check_id, print_job, print_json};
use crate::cli::ServerArg;

#[derive(Subcommand, Debug)]
pub(crate) enum JobCommand {
    /// Show a job with its error history.
    Show {
        id: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Cancel a job that has not finished.
    Cancel {
        id: String,
        #[command(flatten)]
        server: ServerArg,
    },
}

pub(crate) async fn job(command: JobCommand) -> anyhow::Result<ExitCode> {
    let (id, server, cancel) = match command {
        JobCommand::Show { id, server } => (id, server, false),
        JobCommand::Cancel { id, server } => (id, server, true),
    };
    check_id(&id)?;
    let client = server.client()?;
    let job = if cancel {
        client
            .post(&format!("/v1/jobs/{id}/cancel"), &json!({}))
            .await?
            .1
    } else {
        client.get(&format!("/v1/jobs/{id}")).await?
    };
    if server.json {
        print_json(&job);
    } else {
        print_job(&decode(&job, "a job request")?);
    }
    Ok(ExitCode::SUCCESS)
}
