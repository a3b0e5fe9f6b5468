//! The `canaryd` binary: parse the command line, dispatch, exit with its code.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    canaryd::cli::run(canaryd::cli::Cli::parse()).await
}
