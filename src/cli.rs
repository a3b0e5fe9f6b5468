//! The command line (docs/cli.md): one binary, subcommands for the daemon, the client and checks.

#[macro_use]
mod stdout;
mod check;
mod client;
mod dev;
mod healthcheck;
mod output;
mod remote;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::telemetry::LogFormat;

pub use client::ApiClient;
pub use dev::dev_runbooks;

/// What the client commands read from the environment, shown under every `--help`.
const CLIENT_ENV_HELP: &str = "\
Environment:
  CANARYD_SERVER  the daemon's URL (or --server; default http://127.0.0.1:7878)
  CANARYD_TOKEN   the API bearer token, when the daemon has auth.tokens (never a flag: flags
                  show in `ps` and shell history)";

/// canaryd: one replica at a time onto a new version, and back.
#[derive(Debug, Parser)]
#[command(name = "canaryd", version, about, after_help = CLIENT_ENV_HELP)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// Where the client commands find the daemon.
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// The daemon's URL; the API token is read from CANARYD_TOKEN.
    #[arg(long, env = "CANARYD_SERVER", default_value = "http://127.0.0.1:7878")]
    pub server: String,
}

/// The daemon's log options (`serve` and `dev` only).
#[derive(Debug, Clone, Args)]
pub struct LogArgs {
    /// Log lines on stderr as readable text or one JSON object per line.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon.
    Serve {
        /// The daemon's config file; the secrets it names come from environment variables.
        #[arg(long, default_value = "config/canaryd.yaml")]
        config: PathBuf,
        /// When another canaryd owns the database, wait up to this long (`90s`, `5m`) for it to
        /// exit, then resume its unfinished rollouts (rolling redeploys); without it, exit 2 at
        /// once.
        #[arg(long, value_name = "DURATION", value_parser = crate::domain::duration::parse_duration)]
        wait_for_lock: Option<std::time::Duration>,
        #[command(flatten)]
        log: LogArgs,
    },
    /// Run the daemon against an embedded simulated host.
    Dev {
        #[command(flatten)]
        args: dev::DevArgs,
        #[command(flatten)]
        log: LogArgs,
    },
    /// Submit, watch, abort or approve rollouts.
    #[command(after_help = CLIENT_ENV_HELP)]
    Rollout {
        #[command(subcommand)]
        command: remote::RolloutCommand,
    },
    /// Promote a version across replicas and hosts: start, watch, pause, resume, abort, show.
    #[command(after_help = CLIENT_ENV_HELP)]
    Release {
        #[command(subcommand)]
        command: remote::ReleaseCommand,
    },
    /// One-click rollback of one replica to its prior deployment.
    #[command(after_help = CLIENT_ENV_HELP)]
    Rollback(remote::RollbackArgs),
    /// Audit query over past rollouts.
    #[command(after_help = CLIENT_ENV_HELP)]
    History(remote::HistoryArgs),
    /// One rollout's step timeline.
    #[command(after_help = CLIENT_ENV_HELP)]
    Show {
        /// The rollout's id (`ro_...`).
        id: String,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Check hosts before a rollout: token, dry-run support, logs, health, peers.
    Doctor(remote::DoctorArgs),
    /// Probe a daemon's /healthz: exit 0 when it answers, 1 when not (a container HEALTHCHECK).
    Healthcheck(healthcheck::HealthcheckArgs),
    /// Offline validation of a config, runbook, plan or release file.
    Check {
        #[command(subcommand)]
        what: check::CheckCommand,
    },
}

/// Runs the parsed command and maps the outcome to an exit code.
pub async fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Serve {
            config,
            wait_for_lock,
            log,
        } => serve::serve(&config, wait_for_lock.unwrap_or_default(), log.log_format).await,
        Command::Dev { args, log } => dev::dev(args, log.log_format).await,
        Command::Rollout { command } => remote::rollout(command).await,
        Command::Release { command } => remote::release(command).await,
        Command::Rollback(args) => remote::rollback(args).await,
        Command::History(args) => remote::history(args).await,
        Command::Show { id, server } => remote::show(&id, &server).await,
        Command::Doctor(args) => remote::doctor(args).await,
        Command::Healthcheck(args) => healthcheck::healthcheck(args).await,
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
