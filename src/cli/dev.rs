//! `canaryd dev [--demo]`: the daemon against an embedded simulated host, with fast runbooks.
//! `--demo` runs a canary of r2 whose analysis passes, a one-click rollback, then a canary of
//! a build whose engine answers twice as slowly: its analysis fails and the automatic
//! rollback restores r2. It ends with a release of a good build to both replicas (r2 the
//! canary, then r1), printed as a progress line per target. It prints each timeline and
//! analysis verdict, and exits 0 when all five ended as expected.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde_json::json;

use super::client::created_id;
use super::output::timeline;
use super::remote::{follow, watch_release};
use super::ApiClient;
use crate::app::{shutdown_signal, App};
use crate::config::sim::{dev_config, DEV_FILE, DEV_HOST, R1, R2};
use crate::domain::runbook::{self, Runbook};
use crate::telemetry::{self, LogFormat};
use canaryd_sim::{SimConfig, SimFaults, SimHost};

/// The shipped runbooks with timings for a simulated engine (seconds, not minutes).
const DEV_RUNBOOKS: [(&str, &str); 3] = [
    (
        "single-replica-canary",
        include_str!("../../config/dev/runbooks/single-replica-canary.yaml"),
    ),
    (
        "recreate-in-place",
        include_str!("../../config/dev/runbooks/recreate-in-place.yaml"),
    ),
    (
        "single-replica-rollback",
        include_str!("../../config/dev/runbooks/single-replica-rollback.yaml"),
    ),
];

#[derive(Debug, Args)]
pub struct DevArgs {
    /// Address of the daemon (default 127.0.0.1:7878; with --demo, a free loopback port).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// SQLite file (default: a fresh one in a temporary folder).
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// Run a canary of r2, a rollback, a failing canary and its automatic rollback, then a
    /// release to r2 and r1; print the timelines and the release's progress, exit.
    #[arg(long)]
    pub demo: bool,
}

/// The dev runbooks, parsed.
pub fn dev_runbooks() -> anyhow::Result<BTreeMap<String, Runbook>> {
    DEV_RUNBOOKS
        .iter()
        .map(|(name, text)| {
            let rb = runbook::parse(name, &format!("config/dev/runbooks/{name}.yaml"), text)?;
            Ok((name.to_string(), rb))
        })
        .collect()
}

pub async fn dev(args: DevArgs, log_format: LogFormat) -> anyhow::Result<ExitCode> {
    telemetry::init(
        log_format,
        if args.demo {
            "canaryd=warn"
        } else {
            "canaryd=info"
        },
    );
    let mut sim_config = SimConfig::example();
    sim_config.cold_start = Duration::from_secs(2);
    let env = sim_config.initial_env.clone();
    let sim = SimHost::start(sim_config)
        .await
        .context("starting the simulated host")?;
    let tmp = tempdir()?;
    let db = args
        .db
        .clone()
        .unwrap_or_else(|| tmp.path().join("canaryd-dev.db"));
    let default_port = if args.demo { 0 } else { 7878 };
    let listen = args
        .listen
        .unwrap_or(SocketAddr::from(([127, 0, 0, 1], default_port)));
    let config = dev_config(&sim, listen, db.clone(), env);
    let mut app = App::build(config, dev_runbooks()?).await?;
    if args.db.is_none() {
        app = app.with_temporary_database();
    }
    // Installed before the banner: a SIGTERM right after it still removes the temp folder.
    let stop = shutdown_signal();
    let addr = app.local_addr()?;
    let url = format!("http://{addr}");
    println!(
        "canaryd dev: daemon on {url}, simulated compose-manager on {}, database {}",
        sim.url(),
        db.display()
    );
    if !args.demo {
        println!("try:\n  curl -s -XPOST {url}/v1/rollouts -H 'content-type: application/json' \\\n    -d '{{\"host\":\"{DEV_HOST}\",\"file\":\"{DEV_FILE}\",\"service\":\"{R2}\",\"tag\":\"v0.0.452\",\"reason\":\"try canaryd\"}}'");
        println!(
            "  CANARYD_SERVER={url} {} rollout watch <id>\n",
            command_name()
        );
        app.run_until_stopped(stop).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until_stopped(async {
        let _ = stop_rx.await;
    }));
    let ok = demo(&url, &sim.faults()).await;
    let _ = stop_tx.send(());
    let _ = server.await;
    sim.shutdown().await;
    ok
}

/// How to run this binary again from a shell: `canaryd` when that is what PATH finds, else
/// its path (a `cargo run` build is not on PATH).
fn command_name() -> String {
    let Ok(exe) = std::env::current_exe() else {
        return "cargo run --release --".to_owned();
    };
    let on_path = std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| {
            std::fs::canonicalize(dir.join("canaryd"))
                .is_ok_and(|found| std::fs::canonicalize(&exe).is_ok_and(|me| me == found))
        })
    });
    if on_path {
        "canaryd".to_owned()
    } else {
        exe.display().to_string()
    }
}

/// A temporary folder removed when dropped: on every way out of `dev`, errors included.
struct TempDir(PathBuf);

impl TempDir {
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn demo(url: &str, faults: &SimFaults) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(url, None)?;
    outln!("== canary: {R2} to v0.0.452 (r1 keeps serving)")?;
    let plan = json!({
        "host": DEV_HOST, "file": DEV_FILE, "service": R2, "tag": "v0.0.452",
        "reason": "demo: pin glm53 v452 on r2", "env": {"GLM53_R2_HICACHE_RAM_BUDGET": "406GiB"},
        "require_logs": ["rank_budget_bytes=108984795136"],
    });
    let canary = run(&client, "/v1/rollouts", &plan).await?;
    outln!("== one-click rollback of {R2} to its prior deployment")?;
    let body = json!({"host": DEV_HOST, "service": R2, "reason": "demo: roll r2 back"});
    let rollback = run(&client, "/v1/rollbacks", &body).await?;
    // The simulated engine of r2 serves every request twice as slowly (TTFT and inter-token
    // latency) while this build runs: the analysis compares it with r1 and fails it.
    outln!("== a bad build: {R2} to v0.0.451, whose engine answers 2× slower than r1")?;
    faults.set_engine_slowdown(R2, 2.0);
    let plan = json!({
        "host": DEV_HOST, "file": DEV_FILE, "service": R2, "tag": "v0.0.451",
        "reason": "demo: a build with a latency regression",
    });
    let bad = run(&client, "/v1/rollouts", &plan).await;
    faults.set_engine_slowdown(R2, 1.0);
    let bad = bad?;
    let auto = match &bad.rolled_back_by {
        Some(id) => {
            outln!("== the analysis failed: the automatic rollback {id} restores {R2}")?;
            let r = follow(&client, id, |l| outln!("{l}")).await?;
            outln!("\n{}", timeline(&r))?;
            Some(r)
        }
        None => None,
    };
    let release = release(&client).await?;
    let bad_code = bad.error.as_ref().map_or("", |e| e.code.as_str());
    let auto_ok = auto.as_ref().is_some_and(|r| r.status == "succeeded");
    let ok = canary.status == "succeeded"
        && rollback.status == "succeeded"
        && bad.status == "failed"
        && bad_code == "analysis_failed"
        && auto_ok
        && release.status == "succeeded";
    outln!(
        "demo {}: canary {} ({}), rollback {} ({}) back to {}; bad canary {} ({} {bad_code}), automatic rollback {} ({}) back to {}; release {} ({}) of {} to {} target(s)",
        if ok { "finished" } else { "FAILED" },
        canary.id,
        canary.status,
        rollback.id,
        rollback.status,
        rollback.tag,
        bad.id,
        bad.status,
        auto.as_ref().map_or("none", |r| r.id.as_str()),
        auto.as_ref().map_or("-", |r| r.status.as_str()),
        auto.as_ref().map_or("-", |r| r.tag.as_str()),
        release.id,
        release.status,
        release.tag,
        release.targets.len(),
    )?;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// A release of the good build to both replicas: r2 is the canary, r1 follows once it passed
/// (one replica of the group away at a time); a progress line per target change. The build's
/// analysis already passed in the first canary, so each target runs `recreate-in-place` (the
/// same gates without the analysis window): the demo stays short.
async fn release(client: &ApiClient) -> anyhow::Result<crate::api::ReleaseOut> {
    outln!("\n== a release: v0.0.452 to {R2} (the canary), then {R1}, one replica at a time")?;
    let body = json!({
        "file": DEV_FILE, "tag": "v0.0.452", "reason": "demo: promote v452 across the host",
        "runbook": "recreate-in-place",
        "targets": [{"host": DEV_HOST, "service": R2}, {"host": DEV_HOST, "service": R1}],
    });
    let created = client.post("/v1/releases", &body).await?;
    let id = created_id(&created)?;
    watch_release(client, &id).await?;
    Ok(serde_json::from_value(
        client.get(&format!("/v1/releases/{id}")).await?,
    )?)
}

/// Starts a rollout (`POST path`), follows it to its end printing each step, then its
/// timeline (with the analysis verdict, if it has one).
async fn run(
    client: &ApiClient,
    path: &str,
    body: &serde_json::Value,
) -> anyhow::Result<crate::api::RolloutOut> {
    let created = client.post(path, body).await?;
    let id = created_id(&created)?;
    let r = follow(client, &id, |l| outln!("{l}")).await?;
    outln!("\n{}", timeline(&r))?;
    Ok(r)
}

fn tempdir() -> anyhow::Result<TempDir> {
    let dir = std::env::temp_dir().join(format!(
        "canaryd-dev-{}",
        ulid::Ulid::new().to_string().to_lowercase()
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(TempDir(dir))
}
