//! The `conveyor` command: server, CLI client, exec worker and benchmark.

mod cli;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("conveyor: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("conveyor: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
