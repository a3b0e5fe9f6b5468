//! `canaryd healthcheck [--url URL]`: GET the daemon's `/healthz`, exit 0 when it answers 2xx
//! and 1 otherwise. For a container's `HEALTHCHECK` (the slim image has no curl).

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

#[derive(Debug, Args)]
pub struct HealthcheckArgs {
    /// The URL to probe.
    #[arg(long, default_value = "http://127.0.0.1:7878/healthz")]
    pub url: String,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 5)]
    pub timeout_secs: u64,
}

pub async fn healthcheck(args: HealthcheckArgs) -> anyhow::Result<ExitCode> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(args.timeout_secs))
        .build()?;
    match client.get(&args.url).send().await {
        Ok(res) if res.status().is_success() => {
            println!("{} answered {}", args.url, res.status());
            Ok(ExitCode::SUCCESS)
        }
        Ok(res) => {
            eprintln!("{} answered {}", args.url, res.status());
            Ok(ExitCode::from(1))
        }
        Err(e) => {
            eprintln!("{} did not answer: {e}", args.url);
            Ok(ExitCode::from(1))
        }
    }
}
