//! Command-line interface.

mod admin;
mod audit;
#[cfg(feature = "bench")]
mod bench;
pub(crate) mod config;
mod demo;
mod event;
mod flow;
mod http;
mod jobs;
mod kind;
mod limit;
mod observe;
mod schedule;
mod serve;
mod source;
mod store;
mod table;
mod token;
mod work;

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

/// Conveyor: durable background jobs. Run `conveyor serve --demo` to see it work.
#[derive(Parser, Debug)]
#[command(name = "conveyor", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Human, env = "CONVEYOR_LOG_FORMAT")]
    log_format: LogFormat,
}

impl Cli {
    /// Whether the command runs until stopped (a server or a worker) rather than printing a
    /// result and exiting.
    pub fn runs_until_stopped(&self) -> bool {
        matches!(self.command, Command::Serve(_) | Command::Work(_))
    }
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub(crate) enum DurabilityArg {
    /// fsync every commit before acknowledging (default).
    Durable,
    /// No fsync per commit: survives `kill -9`, may lose the latest jobs on power loss.
    Relaxed,
}

impl DurabilityArg {
    pub(crate) fn open_options(self) -> conveyor::OpenOptions {
        conveyor::OpenOptions {
            durability: match self {
                DurabilityArg::Durable => conveyor::Durability::Durable,
                DurabilityArg::Relaxed => conveyor::Durability::RelaxedLosesRecentJobsOnPowerLoss,
            },
            ..conveyor::OpenOptions::default()
        }
    }
}

/// Where client commands find the server.
#[derive(Args, Debug, Clone)]
pub(crate) struct ServerArg {
    /// Base URL of a running `conveyor serve`.
    #[arg(long, env = "CONVEYOR_SERVER", default_value = "http://127.0.0.1:7700")]
    pub server: String,
    /// Print raw JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// API token, for a server with access control on (`conveyor token create`).
    #[arg(long, env = "CONVEYOR_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    #[command(flatten)]
    pub tls: ClientTlsArgs,
}

impl ServerArg {
    /// A client for the server, sending the token when one was given.
    pub fn client(&self) -> anyhow::Result<http::ApiClient> {
        http::ApiClient::new(&self.server, self.token.as_deref(), &self.tls)
    }
}

/// How client commands talk to an `https://` server (`serve --tls-cert`).
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct ClientTlsArgs {
    /// Trust the CA certificates in this PEM file for an https:// server (besides the public
    /// roots), e.g. the CA that signed the server's own certificate.
    #[arg(long, env = "CONVEYOR_CA_CERT", value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// Present this client certificate (PEM) to a server that requires one
    /// (`serve --tls-client-ca`). Needs --client-key.
    #[arg(
        long,
        env = "CONVEYOR_CLIENT_CERT",
        value_name = "FILE",
        requires = "client_key"
    )]
    pub client_cert: Option<PathBuf>,
    /// The private key of --client-cert (PEM).
    #[arg(
        long,
        env = "CONVEYOR_CLIENT_KEY",
        value_name = "FILE",
        requires = "client_cert"
    )]
    pub client_key: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the HTTP API server (and with --demo, a producer and worker to watch).
    Serve(serve::ServeArgs),
    /// Enqueue a job through the server.
    Enqueue(admin::EnqueueArgs),
    /// Show or cancel one job.
    Job {
        #[command(subcommand)]
        command: admin::JobCommand,
    },
    /// The dead-letter queue: list, replay, discard.
    Dead {
        #[command(subcommand)]
        command: admin::DeadCommand,
    },
    /// Per-queue counts by state.
    Queues(admin::QueuesArgs),
    /// One queue's settings: show, pause, resume, set limits.
    Queue {
        #[command(subcommand)]
        command: admin::QueueCommand,
    },
    /// Registered workers: id, host, pid, queues, busy slots, last heartbeat.
    Workers(observe::WorkersArgs),
    /// Running jobs past their stuck threshold (much longer than their kind usually takes).
    Stuck(observe::StuckArgs),
    /// History per queue and kind over a span: enqueued, done, failed, dead, failure rate,
    /// throughput, run time and queue wait (p50/p95), from the server's per-minute rollups.
    Stats(observe::StatsArgs),
    /// Tell one worker to quiet (stop fetching), stop (drain and exit) or resume.
    Worker {
        #[command(subcommand)]
        command: observe::WorkerCommandArgs,
    },
    /// Cron schedules: list, show, set, runs, delete.
    Schedule {
        #[command(subcommand)]
        command: schedule::ScheduleCommand,
    },
    /// Workflows: create, show, list, cancel, signal.
    Flow {
        #[command(subcommand)]
        command: flow::FlowCommand,
    },
    /// Find jobs (by queue, state, kind, tag, tenant, id prefix, time, payload) and act on
    /// all of them at once: list, search, bulk cancel|retry|discard.
    Jobs {
        #[command(subcommand)]
        command: jobs::JobsCommand,
    },
    /// Payload schemas per job kind: set, list, show, delete.
    Kind {
        #[command(subcommand)]
        command: kind::KindCommand,
    },
    /// Events: send one, and every subscription to its name makes a job or a flow of it.
    Event {
        #[command(subcommand)]
        command: event::EventCommand,
    },
    /// Event subscriptions (which events make which jobs or flows): set, list, show, delete.
    Subscription {
        #[command(subcommand)]
        command: event::SubscriptionCommand,
    },
    /// Named limits (how many jobs sharing a key may run at once, or start per period):
    /// set, list, show, delete.
    Limit {
        #[command(subcommand)]
        command: limit::LimitCommand,
    },
    /// Event sources (brokers whose messages become jobs): set, list, show, pause, resume,
    /// delete.
    Source {
        #[command(subcommand)]
        command: source::SourceCommand,
    },
    /// Run a worker that executes a shell command for each job.
    Work(work::WorkArgs),
    /// Measure enqueue, drain and latency against a store.
    #[cfg(feature = "bench")]
    Bench(bench::BenchArgs),
    /// Measure enqueue, drain and latency against a store (not in this build: it was built
    /// without the `bench` feature).
    #[cfg(not(feature = "bench"))]
    #[command(disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        args: Vec<String>,
    },
    /// Move jobs between stores (e.g. from the embedded SQLite file to PostgreSQL).
    Store {
        #[command(subcommand)]
        command: store::StoreCommand,
    },
    /// API tokens for a server with access control (`serve --auth`): create, list, revoke.
    Token {
        #[command(subcommand)]
        command: token::TokenCommand,
    },
    /// The audit log: who enqueued, cancelled, replayed, discarded, changed what.
    Audit(audit::AuditArgs),
    /// Create or upgrade a store's schema (PostgreSQL: versioned, forward-only migrations).
    Migrate(store::MigrateArgs),
    /// Print a shell completion script to standard output, e.g.
    /// `conveyor completions bash > /etc/bash_completion.d/conveyor`.
    Completions(CompletionsArgs),
}

#[derive(Args, Debug)]
struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    shell: CompletionShell,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

/// `conveyor completions SHELL`: the script, generated from this very command definition, on
/// standard output (SIGPIPE is at its default here, so `| head` ends it quietly).
fn completions(args: CompletionsArgs) -> ExitCode {
    let shell = match args.shell {
        CompletionShell::Bash => clap_complete::Shell::Bash,
        CompletionShell::Zsh => clap_complete::Shell::Zsh,
        CompletionShell::Fish => clap_complete::Shell::Fish,
    };
    clap_complete::generate(
        shell,
        &mut Cli::command(),
        "conveyor",
        &mut std::io::stdout(),
    );
    ExitCode::SUCCESS
}

/// Standard error for logs, where a failed write is dropped rather than reported. Under
/// systemd, Docker or `| head`, the reader of our logs can go away; the server must go on
/// serving (and shut down on SIGTERM) without anyone to read them.
struct LossyStderr;

impl std::io::Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// Colours only for a person at a terminal: never into a file or a pipe, and never with
/// `NO_COLOR` set to anything but the empty string (<https://no-color.org>).
fn colour_logs(stderr_is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|value| value.is_empty())
}

fn init_logging(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CONVEYOR_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour_logs(
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
            std::env::var_os("NO_COLOR"),
        ))
        .with_writer(|| LossyStderr)
        // Its own complaint about a failed write goes through eprintln!, which panics when
        // stderr is a closed pipe; the panic then kills whichever task was logging.
        .log_internal_errors(false);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Human => builder.try_init(),
    };
    if format == LogFormat::Json {
        // Panics (a job handler's included: the worker contains them and records them in the
        // job's history) would otherwise print plain text between the JSON lines, breaking
        // whoever parses them line by line.
        std::panic::set_hook(Box::new(|info| {
            let thread = std::thread::current();
            tracing::error!(target: "panic", thread = thread.name().unwrap_or("unnamed"),
                panic = %info, "panicked");
        }));
    }
}

pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    // A benchmark runs far too many jobs to log each one's start and end (failures still are).
    // lapin (the AMQP sources' client) logs a closed channel as an error of its own; the
    // source reports the same failure once, with its name, as a warning and in its status.
    let default_filter = match cli.command {
        #[cfg(feature = "bench")]
        Command::Bench(_) => format!("info,lapin=off,{}=warn", conveyor::JOB_LOG_TARGET),
        _ => "info,lapin=off".to_string(),
    };
    init_logging(cli.log_format, &default_filter);
    match cli.command {
        Command::Serve(args) => serve::run(args).await,
        Command::Enqueue(args) => admin::enqueue(args).await,
        Command::Job { command } => admin::job(command).await,
        Command::Dead { command } => admin::dead(command).await,
        Command::Queues(args) => admin::queues(args).await,
        Command::Workers(args) => observe::workers(args).await,
        Command::Stuck(args) => observe::stuck(args).await,
        Command::Stats(args) => observe::stats(args).await,
        Command::Worker { command } => observe::worker(command).await,
        Command::Queue { command } => admin::queue(command).await,
        Command::Schedule { command } => schedule::run(command).await,
        Command::Source { command } => source::run(command).await,
        Command::Event { command } => event::run_event(command).await,
        Command::Subscription { command } => event::run_subscription(command).await,
        Command::Flow { command } => flow::run(command).await,
        Command::Kind { command } => kind::run(command).await,
        Command::Limit { command } => limit::run(command).await,
        Command::Jobs { command } => jobs::run(command).await,
        Command::Work(args) => work::run(args).await,
        #[cfg(feature = "bench")]
        Command::Bench(args) => bench::run(args).await,
        #[cfg(not(feature = "bench"))]
        Command::Bench { .. } => {
            eprintln!(
                "conveyor bench: this build has no benchmarks; build with \
                 `cargo build --release -p conveyor --features bench`"
            );
            Ok(ExitCode::from(2))
        }
        Command::Store { command } => store::run(command).await,
        Command::Migrate(args) => store::migrate(args).await,
        Command::Token { command } => token::run(command).await,
        Command::Audit(args) => audit::run(args).await,
        Command::Completions(args) => Ok(completions(args)),
    }
}

#[cfg(test)]
mod colour_tests {
    use super::colour_logs;

    #[test]
    fn logs_are_coloured_only_on_a_terminal_without_no_color() {
        assert!(colour_logs(true, None));
        assert!(
            colour_logs(true, Some("".into())),
            "an empty NO_COLOR is unset"
        );
        assert!(!colour_logs(true, Some("1".into())));
        assert!(!colour_logs(false, None), "a file or a pipe");
    }
}

#[cfg(test)]
mod env_tests {
    /// Every `serve` flag can be set by a `CONVEYOR_*` variable (and so from `--config`).
    #[test]
    fn every_serve_flag_has_an_environment_variable() {
        use clap::CommandFactory;
        let command = super::Cli::command();
        let serve = command.find_subcommand("serve").expect("serve");
        let missing: Vec<String> = serve
            .get_arguments()
            .filter(|arg| arg.get_long().is_some() && arg.get_env().is_none())
            .filter(|arg| !matches!(arg.get_id().as_str(), "help" | "version"))
            .map(|arg| arg.get_id().to_string())
            .collect();
        assert!(
            missing.is_empty(),
            "serve flags without an env var: {missing:?}"
        );
    }
}
