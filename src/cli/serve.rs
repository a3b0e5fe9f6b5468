//! `canaryd serve`: load and validate the config and runbooks, then run the daemon.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use crate::app::{shutdown_signal, App};
use crate::store::StoreError;
use crate::telemetry::{self, LogFormat};

/// Exit code for a configuration that cannot be used, and for usage errors
/// (docs/cli.md#exit-codes).
pub const EXIT_BAD_CONFIG: u8 = 2;

pub async fn serve(
    config_path: &Path,
    lock_wait: Duration,
    log_format: LogFormat,
) -> anyhow::Result<ExitCode> {
    telemetry::init(log_format, "canaryd=info,tower_http=warn");
    let config =
        match crate::config::load(config_path).and_then(|c| c.check_listen_safety().map(|()| c)) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{e}");
                return Ok(ExitCode::from(EXIT_BAD_CONFIG));
            }
        };
    let runbooks = match crate::domain::runbook::load_dir(&config.runbooks_dir)
        .and_then(|r| config.check_runbooks(&r).map(|()| r))
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{e}");
            return Ok(ExitCode::from(EXIT_BAD_CONFIG));
        }
    };
    let app = match App::build_waiting(config, runbooks, lock_wait).await {
        Ok(app) => app,
        Err(e) => match e.downcast_ref::<StoreError>() {
            // Another daemon drives this database: touch nothing (safety rule 17).
            Some(in_use @ StoreError::InUse { .. }) => {
                eprintln!(
                    "error: {in_use}; stop it, or start with `--wait-for-lock DURATION` to take \
                     over once it exits"
                );
                return Ok(ExitCode::from(EXIT_BAD_CONFIG));
            }
            // The `listen` address is taken or not this machine's: the config's to change.
            _ if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>().is_some_and(|io| {
                    matches!(
                        io.kind(),
                        std::io::ErrorKind::AddrInUse | std::io::ErrorKind::AddrNotAvailable
                    )
                })
            }) =>
            {
                eprintln!("error: {e:#}");
                return Ok(ExitCode::from(EXIT_BAD_CONFIG));
            }
            _ => return Err(e),
        },
    };
    let addr = app.local_addr()?;
    tracing::info!(listen = %addr, "canaryd listening on http://{addr}");
    app.run_until_stopped(shutdown_signal()).await?;
    Ok(ExitCode::SUCCESS)
}
