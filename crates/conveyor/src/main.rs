//! The `conveyor` command: server, CLI client, exec worker and benchmark.

mod cli;

use clap::Parser;
use std::io::Write;

/// A line on standard error; a closed stderr is not worth a panic (exit code 101).
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn main() -> std::process::ExitCode {
    // A `serve --config FILE` sets the variables of its settings first (below flags and
    // variables already set), while this is the only thread.
    if let Err(problem) = cli::config::apply(&std::env::args_os().collect::<Vec<_>>()) {
        say(&format!("conveyor: {problem}"));
        return std::process::ExitCode::from(2);
    }
    let args = cli::Cli::parse();
    if !args.runs_until_stopped() {
        // Commands that print and exit behave like other Unix tools when their reader goes
        // away (`conveyor audit | head`): SIGPIPE ends them quietly. Rust ignores SIGPIPE by
        // default, which turns that into a panic on the next println!. Servers and workers
        // keep ignoring it: a closed log pipe must never stop them (they write through
        // writers that drop failed output).
        // SAFETY: setting a signal's disposition to its default before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            say(&format!("conveyor: cannot start the async runtime: {e}"));
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(args)) {
        Ok(code) => code,
        Err(e) => {
            say(&format!("conveyor: {e:#}"));
            std::process::ExitCode::FAILURE
        }
    }
}
