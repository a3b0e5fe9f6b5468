//! A release across a fleet, against the ideal schedule and the manual way.
//!
//! `cargo bench --bench release` (targets and method: docs/performance.md).
//! `RELEASE_HOSTS` simulated hosts (in this process) with r1 and r2 each; one `canaryd serve`
//! child with every host configured; one release of every replica (`h000`'s r2 the canary,
//! then each host's r2 then r1) with `max_parallel_hosts: RELEASE_PARALLEL`.
//!
//! - **Per-target time** `p`: the mean of the non-canary targets' rollout times (`started_at`
//!   to `finished_at`, as canaryd recorded them); `c` is the canary's.
//! - **Ideal schedule** = `c + ceil((N - 1) / P) × p`, with N targets and P parallel hosts: the
//!   canary alone, then the N - 1 other targets in waves of P (one replica per host at a time
//!   never binds when every host has at most 2 targets and hosts ≥ 2P: each wave has P
//!   distinct hosts with a target left).
//! - **Wall time**: the release's `created_at` (the POST) to its `finished_at`. Target: within
//!   5 % of the ideal.
//! - **Strictly sequential operator** (computed, not measured): `N × p`, one target after
//!   another with no time lost between them — the manual way's lower bound.
//! - canaryd's CPU (`utime + stime` of the child, whole release) and peak RSS (`VmHWM`).
//! - canaryd's CPU **while every running target waits** (the fleet bench's definition): with a
//!   soak long enough (`RELEASE_SOAK_MS` ≥ 8000), each wave of P targets all in their soak
//!   gives a window, from the bench seeing them all soaking to 500 ms before the first of
//!   their soaks ends (at most 15 s), with no request from the bench inside it; the CPU
//!   over the sum of the windows.
//!
//! Knobs (env, defaults in brackets): `RELEASE_HOSTS` [50], `RELEASE_PARALLEL` [10],
//! `RELEASE_INTERVAL_MS` [200], `RELEASE_COLD_MS` [2000], `RELEASE_SOAK_MS` [3000];
//! `RELEASE_CANARYD` runs another build's canaryd binary under the same bench.

mod common;
#[path = "common/serve.rs"]
mod serve;

use std::collections::{BTreeSet, HashSet};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{ensure, Context};
use canaryd::api::ReleaseOut;
use canaryd::testing::{self, Timings};
use canaryd_sim::{SimConfig, SimHost};
use common::{env_ms, env_usize, ms_between};
use serde_json::json;
use serve::{addr, host_name, Daemon, R1, R2};

const FILE: &str = "prod/GLM-5.3-Flash-SGL-TP4-W4AFP8-LongContext.yaml";

struct Settings {
    hosts: usize,
    parallel: usize,
    interval: Duration,
    cold: Duration,
    soak: Duration,
}

fn sim_config(cold: Duration) -> SimConfig {
    let mut cfg = SimConfig::example();
    cfg.cold_start = cold;
    cfg.stream_line_delay = Duration::ZERO;
    cfg
}

fn runbook(s: &Settings) -> String {
    testing::canary(
        "benchmark canary (shipped steps, benchmark timings)",
        &Timings {
            peers: Duration::from_secs(60),
            compose: Duration::from_secs(120),
            wait: Duration::from_secs(600),
            interval: s.interval,
            consecutive: 1,
            soak: s.soak,
        },
    )
}

struct Measured {
    wall_ms: f64,
    canary_ms: f64,
    per_target_ms: f64,
    targets: usize,
    cpu_s: f64,
    hwm_mib: f64,
    most_hosts: usize,
    /// Waiting windows: their count, total seconds and canaryd's CPU seconds in them.
    windows: usize,
    window_s: f64,
    window_cpu_s: f64,
}

/// The shortest soak with a waiting window: the active steps take ~2.5 s at the default cold
/// start, the bench sees a wave soaking up to 1 s later, and a window under 1 s is not taken.
const WINDOW_SOAK: Duration = Duration::from_secs(8);
/// The longest waiting window.
const WINDOW_MAX: Duration = Duration::from_secs(15);

/// If the release's running targets are exactly `parallel`, all in their soak, none measured
/// before: the waiting window (sleeps through it, no request) as (seconds, CPU seconds).
async fn waiting_window(
    s: &Settings,
    daemon: &Daemon,
    now: &ReleaseOut,
    measured: &mut HashSet<String>,
    tck: f64,
) -> anyhow::Result<Option<(f64, f64)>> {
    let running: Vec<&canaryd::api::ReleaseTargetOut> = now
        .targets
        .iter()
        .filter(|t| t.state == "pending" || t.state == "running")
        .collect();
    let ids: Vec<&str> = running
        .iter()
        .filter_map(|t| t.rollout_id.as_deref())
        .collect();
    if running.len() != s.parallel
        || ids.len() != running.len()
        || running
            .iter()
            .any(|t| t.current_step.as_deref() != Some("soak"))
        || ids.iter().any(|id| measured.contains(*id))
    {
        return Ok(None);
    }
    let mut earliest: Option<chrono::DateTime<chrono::Utc>> = None;
    for id in &ids {
        let r = daemon.api.rollout(id).await?;
        let started = r
            .steps
            .iter()
            .find(|st| st.name == "soak")
            .and_then(|st| st.started_at)
            .context("a soaking target's soak start")?;
        earliest = Some(earliest.map_or(started, |e| e.min(started)));
    }
    measured.extend(ids.iter().map(|id| (*id).to_owned()));
    let end = earliest.context("a soak")? + chrono::Duration::from_std(s.soak)?
        - chrono::Duration::milliseconds(500);
    let Ok(left) = (end - chrono::Utc::now()).to_std() else {
        return Ok(None);
    };
    let window = left.min(WINDOW_MAX);
    if window < Duration::from_secs(1) {
        return Ok(None);
    }
    let cpu0 = common::cpu_seconds(daemon.pid, tck).context("canaryd's CPU")?;
    let t0 = std::time::Instant::now();
    tokio::time::sleep(window).await;
    let cpu1 = common::cpu_seconds(daemon.pid, tck).context("canaryd's CPU")?;
    Ok(Some((t0.elapsed().as_secs_f64(), cpu1 - cpu0)))
}

async fn release(s: &Settings, sims: &[SimHost], daemon: &Daemon) -> anyhow::Result<Measured> {
    let tck = common::clk_tck();
    let cpu_before = common::cpu_seconds(daemon.pid, tck).context("canaryd's CPU")?;
    let targets: Vec<serde_json::Value> = (0..sims.len())
        .flat_map(|i| [R2, R1].map(|service| json!({"host": host_name(i), "service": service})))
        .collect();
    let body = json!({"file": FILE, "tag": "v0.0.452", "reason": "release benchmark",
                      "targets": targets, "max_parallel_hosts": s.parallel});
    let created = daemon.api.post("/v1/releases", &body).await?;
    let id = created["id"].as_str().context("release id")?.to_owned();
    // Bounded: 1200 looks, 1 s apart (plus the windows, at most 15 s each): < 20 min + 5 h.
    let mut r: Option<ReleaseOut> = None;
    let (mut windows, mut window_s, mut window_cpu_s) = (0, 0.0, 0.0);
    let mut measured = HashSet::new();
    for _ in 0..1200 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now: ReleaseOut =
            serde_json::from_value(daemon.api.get(&format!("/v1/releases/{id}")).await?)?;
        if matches!(now.status.as_str(), "succeeded" | "failed" | "aborted") {
            r = Some(now);
            break;
        }
        if s.soak >= WINDOW_SOAK {
            if let Some((secs, cpu)) = waiting_window(s, daemon, &now, &mut measured, tck).await? {
                windows += 1;
                window_s += secs;
                window_cpu_s += cpu;
            }
        }
    }
    let r = r.context("the release did not end within 20 minutes")?;
    ensure!(
        r.status == "succeeded",
        "release ended {}: {:?}",
        r.status,
        r.error
    );
    let cpu_s = common::cpu_seconds(daemon.pid, tck).context("canaryd's CPU")? - cpu_before;
    let hwm_mib = common::status_mib(daemon.pid, "VmHWM").unwrap_or(f64::NAN);
    let span = |t: &canaryd::api::ReleaseTargetOut| -> anyhow::Result<(f64, f64, f64)> {
        let (a, b) = (
            t.started_at.context("started")?,
            t.finished_at.context("finished")?,
        );
        Ok((
            ms_between(r.created_at, a),
            ms_between(r.created_at, b),
            ms_between(a, b),
        ))
    };
    let spans: Vec<(f64, f64, f64)> = r.targets.iter().map(span).collect::<anyhow::Result<_>>()?;
    let rest = &spans[1..];
    let per_target_ms = rest.iter().map(|s| s.2).sum::<f64>() / rest.len().max(1) as f64;
    // Hosts away at once, from the recorded intervals (a check of the limit, not a target).
    let mut most_hosts = 0;
    for (start, _, _) in &spans {
        let hosts: BTreeSet<&str> = spans
            .iter()
            .zip(&r.targets)
            .filter(|((a, b, _), _)| a <= start && start < b)
            .map(|(_, t)| t.host.as_str())
            .collect();
        most_hosts = most_hosts.max(hosts.len());
    }
    Ok(Measured {
        wall_ms: ms_between(r.created_at, r.finished_at.context("finished")?),
        canary_ms: spans[0].2,
        per_target_ms,
        targets: r.targets.len(),
        cpu_s,
        hwm_mib,
        most_hosts,
        windows,
        window_s,
        window_cpu_s,
    })
}

async fn run() -> anyhow::Result<bool> {
    let s = Settings {
        hosts: env_usize("RELEASE_HOSTS", 50).max(2),
        parallel: env_usize("RELEASE_PARALLEL", 10).max(1),
        interval: env_ms("RELEASE_INTERVAL_MS", 200),
        cold: env_ms("RELEASE_COLD_MS", 2000),
        soak: env_ms("RELEASE_SOAK_MS", 3000),
    };
    println!("release benchmark: {}", common::machine());
    println!(
        "{} hosts x 2 replicas, max_parallel_hosts {}, poll {:?}, cold start {:?}, soak {:?}",
        s.hosts, s.parallel, s.interval, s.cold, s.soak
    );
    let mut sims = Vec::with_capacity(s.hosts);
    for _ in 0..s.hosts {
        sims.push(SimHost::start(sim_config(s.cold)).await?);
    }
    let env: Vec<(String, String)> = sim_config(Duration::ZERO).initial_env.into_iter().collect();
    let hosts = sims.iter().map(addr).collect::<anyhow::Result<Vec<_>>>()?;
    // `RELEASE_CANARYD`: another build's binary under the same bench (before/after).
    let daemon = Daemon::start(
        &hosts,
        &env,
        &[("single-replica-canary", runbook(&s))],
        std::env::var_os("RELEASE_CANARYD"),
    )
    .await?;
    let result = release(&s, &sims, &daemon).await;
    daemon.stop_after(&result);
    for sim in sims {
        sim.shutdown().await;
    }
    let m = result?;
    let waves = (m.targets - 1).div_ceil(s.parallel);
    let ideal_ms = m.canary_ms + waves as f64 * m.per_target_ms;
    let sequential_ms = m.targets as f64 * m.per_target_ms;
    let off = (m.wall_ms - ideal_ms) / ideal_ms * 100.0;
    let cpu_pct = m.cpu_s / (m.wall_ms / 1000.0) * 100.0;
    let within = off <= 5.0;
    let rss_ok = m.hwm_mib < 100.0;
    let cpu_ok = cpu_pct < 10.0;
    let window_pct = m.window_cpu_s / m.window_s * 100.0;
    let window_ok = m.windows == 0 || window_pct < 10.0;
    println!();
    println!("| what | value | target | met |");
    println!("|---|---|---|---|");
    println!("| targets | {} ({} hosts x 2) | | |", m.targets, s.hosts);
    println!("| canary target c (measured) | {:.0} ms | | |", m.canary_ms);
    println!(
        "| per-target time p (mean of the other {}) | {:.0} ms | | |",
        m.targets - 1,
        m.per_target_ms
    );
    println!(
        "| ideal = c + ceil(({} - 1) / {}) x p = c + {waves} x p | {:.1} s | | |",
        m.targets,
        s.parallel,
        ideal_ms / 1000.0
    );
    println!(
        "| release wall time (created to finished) | **{:.1} s** ({:+.1} % of ideal) | within 5 % | {} |",
        m.wall_ms / 1000.0,
        off,
        if within { "yes" } else { "NO" }
    );
    println!(
        "| most hosts away at once (recorded) | {} | <= {} | {} |",
        m.most_hosts,
        s.parallel,
        if m.most_hosts <= s.parallel {
            "yes"
        } else {
            "NO"
        }
    );
    println!(
        "| strictly sequential operator = N x p (computed) | {:.1} s ({:.1}x the release) | | |",
        sequential_ms / 1000.0,
        sequential_ms / m.wall_ms
    );
    println!(
        "| canaryd CPU, whole release | {:.2} s ({:.1} % of one core) | < 10 % | {} |",
        m.cpu_s,
        cpu_pct,
        if cpu_ok { "yes" } else { "NO" }
    );
    println!(
        "| canaryd CPU per target, whole release | {:.0} ms | | |",
        m.cpu_s * 1000.0 / m.targets as f64
    );
    if m.windows > 0 {
        println!(
            "| canaryd CPU while every running target waits ({} soaking; {} windows, {:.1} s) | {:.2} s ({:.1} % of one core, {:.2} % per waiting target) | < 10 % | {} |",
            s.parallel,
            m.windows,
            m.window_s,
            m.window_cpu_s,
            window_pct,
            window_pct / s.parallel as f64,
            if window_ok { "yes" } else { "NO" }
        );
    } else {
        let why = if s.soak < WINDOW_SOAK {
            format!("RELEASE_SOAK_MS < {}", WINDOW_SOAK.as_millis())
        } else {
            "no wave was seen all soaking".to_owned()
        };
        println!("| canaryd CPU while every running target waits | not measured ({why}) | | |");
    }
    println!(
        "| canaryd peak RSS (VmHWM) | {:.1} MiB | < 100 MB | {} |",
        m.hwm_mib,
        if rss_ok { "yes" } else { "NO" }
    );
    Ok(within && rss_ok && cpu_ok && window_ok && m.most_hosts <= s.parallel)
}

fn main() -> ExitCode {
    common::run_main("release", "MISSED: a target above was not met", run())
}
