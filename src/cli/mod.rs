//! The command line (docs/cli.md): one binary, subcommands for the daemon, the client and checks.

#[macro_use]
mod stdout;
mod check;
mod client;
mod dev;
mod output;
mod remote;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::telemetry::LogFormat;

pub use client::ApiClient;
pub use dev::{dev_config, dev_runbooks, DEV_FILE, DEV_HOST};

/// canaryd: one replica at a time onto a new version, and back.
#[derive(Debug, Parser)]
#[command(name = "canaryd", version, about)]
pub struct Cli {
    /// Log format of the daemon (stderr).
    #[arg(long, value_enum, global = true, default_value = "text")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

/// Where the client commands find the daemon.
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// The daemon's URL.
    #[arg(long, env = "CANARYD_SERVER", default_value = "http://127.0.0.1:7878")]
    pub server: String,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon.
    Serve {
        #[arg(long, default_value = "config/canaryd.yaml")]
        config: PathBuf,
    },
    /// Run the daemon against an embedded simulated host.
    Dev(dev::DevArgs),
    /// Submit, watch or abort rollouts.
    Rollout {
        #[command(subcommand)]
        command: remote::RolloutCommand,
    },
    /// One-click rollback of one replica to its prior deployment.
    Rollback(remote::RollbackArgs),
    /// Audit query over past rollouts.
    History(remote::HistoryArgs),
    /// One rollout's step timeline.
    Show {
        id: String,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Offline validation of a config, runbook or plan file.
    Check {
        #[command(subcommand)]
        what: check::CheckCommand,
    },
}

/// Runs the parsed command and maps the outcome to an exit code.
pub async fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Serve { config } => serve::serve(&config, cli.log_format).await,
        Command::Dev(args) => dev::dev(args, cli.log_format).await,
        Command::Rollout { command } => remote::rollout(command).await,
        Command::Rollback(args) => remote::rollback(args).await,
        Command::History(args) => remote::history(args).await,
        Command::Show { id, server } => remote::show(&id, &server).await,
        Command::Check { what } => check::check(what),
    };
    match result {
        Ok(code) => code,
        // The reader of our stdout has gone (`| head`): it has what it wanted.
        Err(e) if e.is::<stdout::StdoutClosed>() => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
