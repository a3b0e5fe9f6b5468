//! Orchestration overhead and fleet scale, side by side with the manual way.
//!
//! `cargo bench --bench fleet` (results and method: docs/performance.md). Three phases:
//!
//! 1. **One host.** The real `canaryd serve` binary (a child process, config written to a temp
//!    folder) runs `BENCH_RUNS` canaries of r2 against one simulated host (in this process).
//!    Readiness lag: from the instant the engine turns healthy (the container's start plus the
//!    configured cold start) to the start of the next step, and from the instant this bench
//!    prints a required log line (a marker the plan requires) to the start of the soak.
//!    Overhead: the rollout's wall time minus the simulated waits (cold start, marker delay,
//!    soak duration).
//! 2. **The manual way.** `benches/common/manual_canary.sh` (bash, curl, jq, `sleep` polling
//!    with the same interval) runs the same canary against the same host, `BENCH_SCRIPT_RUNS`
//!    times, measured the same way.
//! 3. **Fleet.** `FLEET_HOSTS` simulated hosts in `FLEET_SIM_PROCS` child processes (this
//!    bench re-executed, `common::sim_fleet`), one `canaryd serve` child with every host
//!    configured, a canary on each at once. CPU seconds (`/proc/<pid>/stat`) and peak RSS
//!    (`VmHWM`) are the daemon's alone, the sims' and this bench's CPU are shown apart; CPU
//!    while waiting is measured over a window in which every canary is in its soak and this
//!    bench sends no request. The scale targets are judged for 200 hosts (overhead p50, gap
//!    p99) and for `FLEET_HOSTS=1000` (peak RSS, readiness lag p99).
//!
//! Knobs (env, defaults in brackets): `BENCH_RUNS` [5], `BENCH_SCRIPT_RUNS` [3],
//! `BENCH_INTERVAL_MS` [200], `BENCH_COLD_MS` [2000], `BENCH_SOAK_MS` [2000], `FLEET_HOSTS`
//! [200], `FLEET_SIM_PROCS` [one per 250 hosts], `FLEET_INTERVAL_MS` [1000], `FLEET_COLD_MS`
//! [10000], `FLEET_SOAK_MS` [20000], `FLEET_CANARYD` [the daemon built with this bench: another
//! build, or a wrapper script that runs it under a profiler]. `FLEET_HOSTS=0` skips phase 3.

mod common;
#[path = "common/serve.rs"]
mod serve;

use std::collections::BTreeMap;
use std::io::BufRead;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use canaryd::api::RolloutOut;
use canaryd::cli::ApiClient;
use canaryd::testing::{self, Timings};
use canaryd_sim::{SimConfig, SimHost};
use chrono::{DateTime, Utc};
use common::sim_fleet::{self, HostAddr, SimFleet};
use common::{env_ms, env_usize, ms_between, pct};
use serde_json::{json, Value};
use serve::{addr, host_name, Daemon, R1, R2};

const FILE: &str = "prod/GLM-5.3-Flash-SGL-TP4-W4AFP8-LongContext.yaml";
/// Canaries alternate between two tags old enough for the simulated host (v0.0.450 runs first).
const TAGS: [&str; 2] = ["v0.0.451", "v0.0.452"];
const SCRIPT: &str = include_str!("common/manual_canary.sh");
/// Steps that act or look once (no configured wait inside).
const INSTANT_STEPS: [&str; 7] = [
    "snapshot",
    "peers",
    "preflight",
    "down",
    "plan",
    "up",
    "neighbours",
];

struct Settings {
    runs: usize,
    script_runs: usize,
    interval: Duration,
    cold: Duration,
    soak: Duration,
    hosts: usize,
    /// Child processes holding the fleet's simulated hosts.
    sim_procs: usize,
    fleet_interval: Duration,
    fleet_cold: Duration,
    fleet_soak: Duration,
}

impl Settings {
    fn from_env() -> Self {
        Settings {
            runs: env_usize("BENCH_RUNS", 5).max(1),
            script_runs: env_usize("BENCH_SCRIPT_RUNS", 3),
            interval: env_ms("BENCH_INTERVAL_MS", 200),
            cold: env_ms("BENCH_COLD_MS", 2000),
            soak: env_ms("BENCH_SOAK_MS", 2000),
            hosts: env_usize("FLEET_HOSTS", 200),
            sim_procs: env_usize(
                "FLEET_SIM_PROCS",
                env_usize("FLEET_HOSTS", 200).div_ceil(250),
            ),
            fleet_interval: env_ms("FLEET_INTERVAL_MS", 1000),
            fleet_cold: env_ms("FLEET_COLD_MS", 10_000),
            fleet_soak: env_ms("FLEET_SOAK_MS", 20_000),
        }
    }
}

/// The shipped canary sequence with benchmark timings; `consecutive: 1` so that the health
/// lag is the detection lag alone (N consecutive samples add N-1 intervals by design).
fn timings(interval: Duration, soak: Duration) -> Timings {
    Timings {
        peers: Duration::from_secs(60),
        compose: Duration::from_secs(120),
        wait: Duration::from_secs(600),
        interval,
        consecutive: 1,
        soak,
    }
}

fn canary_runbook(interval: Duration, soak: Duration) -> String {
    testing::canary(
        "benchmark canary (shipped steps, benchmark timings)",
        &timings(interval, soak),
    )
}

/// The rollback: the canary's steps up to its health wait.
fn rollback_runbook(interval: Duration) -> String {
    testing::canary_until(
        "benchmark rollback",
        &timings(interval, Duration::ZERO),
        "health",
    )
}

fn sim_config(cold: Duration) -> SimConfig {
    let mut cfg = SimConfig::example();
    cfg.cold_start = cold;
    // Stream pacing is the same for canaryd and the script; zero keeps it out of "overhead".
    cfg.stream_line_delay = Duration::ZERO;
    cfg
}

/// `canaryd serve` in a child process over `sims`, with the canary and rollback runbooks at
/// these timings and the sim's env file.
async fn start_daemon(
    sims: &[HostAddr],
    interval: Duration,
    soak: Duration,
) -> anyhow::Result<Daemon> {
    let env: Vec<(String, String)> = sim_config(Duration::ZERO).initial_env.into_iter().collect();
    let runbooks = [
        ("single-replica-canary", canary_runbook(interval, soak)),
        ("single-replica-rollback", rollback_runbook(interval)),
    ];
    // FLEET_CANARYD: another build of the daemon (or a wrapper that profiles it).
    Daemon::start(sims, &env, &runbooks, std::env::var_os("FLEET_CANARYD")).await
}

fn plan(host: &str, tag: &str, marker: Option<&str>) -> Value {
    let mut plan = json!({"host": host, "file": FILE, "service": R2, "tag": tag,
        "reason": "benchmark canary"});
    if let Some(m) = marker {
        plan["require_logs"] = json!([m]);
    }
    plan
}

fn step_times(r: &RolloutOut, name: &str) -> anyhow::Result<(DateTime<Utc>, DateTime<Utc>)> {
    let s = r
        .steps
        .iter()
        .find(|s| s.name == name)
        .with_context(|| format!("step {name} of {}", r.id))?;
    match (s.started_at, s.finished_at) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => bail!("step {name} of {} has no times: {}", r.id, s.status),
    }
}

/// Orchestration gaps: from a step's end to the next step's start, in ms.
fn gaps(r: &RolloutOut) -> Vec<f64> {
    r.steps
        .windows(2)
        .filter_map(|w| Some(ms_between(w[0].finished_at?, w[1].started_at?)))
        .collect()
}

/// Durations of the steps without a configured wait, in ms.
fn instant_durations(r: &RolloutOut) -> Vec<f64> {
    r.steps
        .iter()
        .filter(|s| INSTANT_STEPS.contains(&s.name.as_str()))
        .filter_map(|s| Some(ms_between(s.started_at?, s.finished_at?)))
        .collect()
}

/// When r2's engine turned (or turns) healthy: its container's start plus the cold start.
fn healthy_at(sim: &SimHost, cold: Duration) -> anyhow::Result<DateTime<Utc>> {
    let c = sim
        .containers()
        .into_iter()
        .find(|c| c.service == R2 && c.state == "running")
        .context("r2 runs")?;
    Ok(c.started_at + chrono::Duration::from_std(cold)?)
}

async fn wait_rollout(
    api: &ApiClient,
    id: &str,
    until: impl Fn(&RolloutOut) -> bool,
    limit: Duration,
    every: Duration,
) -> anyhow::Result<RolloutOut> {
    let deadline = Instant::now() + limit;
    loop {
        let r = api.rollout(id).await?;
        if until(&r) {
            return Ok(r);
        }
        if r.status == "failed" || r.status == "aborted" {
            bail!("rollout {id} ended {}: {:?}", r.status, r.error);
        }
        ensure!(Instant::now() < deadline, "rollout {id} stuck: {:#?}", r);
        tokio::time::sleep(every).await;
    }
}

fn step_running(r: &RolloutOut, name: &str) -> bool {
    r.steps
        .iter()
        .any(|s| s.name == name && s.status != "pending")
}

/// A pseudo-random fraction in [0, 1) for run `n` (golden-ratio sequence: reproducible).
fn fraction(n: usize) -> f64 {
    (n as f64 * 0.618_033_988_7 + 0.21).fract()
}

#[derive(Default)]
struct Sample {
    wall_ms: Vec<f64>,
    overhead_ms: Vec<f64>,
    lag_health_ms: Vec<f64>,
    lag_logs_ms: Vec<f64>,
    gaps_ms: Vec<f64>,
    instant_ms: Vec<f64>,
    /// Where a canary's time goes: created -> first step, then each step's duration, by name.
    phases_ms: BTreeMap<String, Vec<f64>>,
}

impl Sample {
    fn add_phases(&mut self, r: &RolloutOut) {
        let first = r.steps.first().and_then(|s| s.started_at);
        if let Some(first) = first {
            self.phases_ms
                .entry("(queued)".into())
                .or_default()
                .push(ms_between(r.created_at, first));
        }
        for (i, s) in r.steps.iter().enumerate() {
            if let (Some(a), Some(b)) = (s.started_at, s.finished_at) {
                let key = format!("{i:02} {}", s.name);
                self.phases_ms
                    .entry(key)
                    .or_default()
                    .push(ms_between(a, b));
            }
        }
        if let (Some(last), Some(end)) = (r.steps.last().and_then(|s| s.finished_at), r.finished_at)
        {
            self.phases_ms
                .entry("(finish)".into())
                .or_default()
                .push(ms_between(last, end));
        }
    }

    /// `name p50` of each phase, on one line.
    fn phases(&self) -> String {
        self.phases_ms
            .iter()
            .map(|(k, v)| format!("{k} {:.0}", pct(v, 50.0)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

async fn canaryd_single(s: &Settings, sim: &SimHost) -> anyhow::Result<Sample> {
    let daemon = start_daemon(&[addr(sim)?], s.interval, s.soak).await?;
    let result = async {
        let mut out = Sample::default();
        let limit = s.cold + s.soak + Duration::from_secs(60);
        for n in 0..s.runs {
            let marker = format!("bench-ready-marker-canaryd-{n}");
            let body = plan(&host_name(0), TAGS[n % 2], Some(&marker));
            let created = daemon.api.post("/v1/rollouts", &body).await?;
            let id = created["id"].as_str().context("rollout id")?.to_owned();
            let every = Duration::from_millis(10);
            wait_rollout(
                &daemon.api,
                &id,
                |r| step_running(r, "startup-logs"),
                limit,
                every,
            )
            .await?;
            tokio::time::sleep(s.interval.mul_f64(fraction(n))).await;
            let marker_at = Utc::now();
            sim.faults().emit_log_line(R2, &marker);
            let r =
                wait_rollout(&daemon.api, &id, |r| r.status == "succeeded", limit, every).await?;
            let healthy = healthy_at(sim, s.cold)?;
            let (logs_start, _) = step_times(&r, "startup-logs")?;
            let (soak_start, _) = step_times(&r, "soak")?;
            let finished = r.finished_at.context("finished_at")?;
            let wall = ms_between(r.created_at, finished);
            let marker_wait = ms_between(logs_start, marker_at).max(0.0);
            out.wall_ms.push(wall);
            out.overhead_ms
                .push(wall - s.cold.as_secs_f64() * 1e3 - s.soak.as_secs_f64() * 1e3 - marker_wait);
            out.lag_health_ms.push(ms_between(healthy, logs_start));
            out.lag_logs_ms.push(ms_between(marker_at, soak_start));
            out.gaps_ms.extend(gaps(&r));
            out.instant_ms.extend(instant_durations(&r));
            out.add_phases(&r);
        }
        Ok::<_, anyhow::Error>(out)
    }
    .await;
    daemon.stop_after(&result);
    result
}

/// One run of the manual script.
struct ScriptRun {
    wall_ms: f64,
    /// Step name → when the script started it.
    steps: BTreeMap<String, DateTime<Utc>>,
    marker_at: DateTime<Utc>,
}

/// Runs the manual script once.
fn run_script(
    s: &Settings,
    sim: &SimHost,
    tag: &str,
    marker: &str,
    n: usize,
) -> anyhow::Result<ScriptRun> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("manual_canary.sh");
    std::fs::write(&path, SCRIPT)?;
    let env_json = serde_json::to_string(&sim_config(Duration::ZERO).initial_env)?;
    let max_polls = ((s.cold + s.soak).as_secs_f64() / s.interval.as_secs_f64()) as u64 + 600;
    let started = Instant::now();
    let mut child = Command::new("bash")
        .arg(&path)
        .current_dir(dir.path())
        .env("CM", sim.url())
        .env("TOKEN", sim.token())
        .env("FILE", FILE)
        .env("SERVICE", R2)
        .env("TAG", tag)
        .env("HEALTH", sim.health_url(R2).context("r2 port")?)
        .env("PEER_HEALTH", sim.health_url(R1).context("r1 port")?)
        .env("ENV_JSON", env_json)
        .env("INTERVAL", format!("{:.3}", s.interval.as_secs_f64()))
        .env("SOAK_MS", s.soak.as_millis().to_string())
        .env("MARKER", marker)
        .env("MAX_POLLS", max_polls.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("spawning bash")?;
    let stdout = child.stdout.take().context("script stdout")?;
    let mut steps = BTreeMap::new();
    let mut marker_at = None;
    let mut failure = None;
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line?;
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["STEP", name, ms] => {
                let ms: i64 = ms.parse()?;
                let at = DateTime::from_timestamp_millis(ms).context("script time")?;
                steps.insert(name.to_string(), at);
                if *name == "startup-logs" {
                    std::thread::sleep(s.interval.mul_f64(fraction(n)));
                    marker_at = Some(Utc::now());
                    sim.faults().emit_log_line(R2, marker);
                }
            }
            _ => failure = Some(line.clone()),
        }
    }
    let status = child.wait()?;
    let wall = started.elapsed().as_secs_f64() * 1e3;
    ensure!(status.success(), "manual script failed: {failure:?}");
    Ok(ScriptRun {
        wall_ms: wall,
        steps,
        marker_at: marker_at.context("the script reached startup-logs")?,
    })
}

async fn script_single(s: &Settings, sim: &SimHost) -> anyhow::Result<Sample> {
    let mut out = Sample::default();
    for n in 0..s.script_runs {
        let tag = TAGS[(s.runs + n) % 2];
        let marker = format!("bench-ready-marker-script-{n}");
        let ScriptRun {
            wall_ms: wall,
            steps,
            marker_at,
        } = tokio::task::block_in_place(|| run_script(s, sim, tag, &marker, n))?;
        let healthy = healthy_at(sim, s.cold)?;
        let at = |name: &str| steps.get(name).copied().context("script step time");
        let marker_wait = ms_between(at("startup-logs")?, marker_at).max(0.0);
        out.wall_ms.push(wall);
        out.overhead_ms
            .push(wall - s.cold.as_secs_f64() * 1e3 - s.soak.as_secs_f64() * 1e3 - marker_wait);
        out.lag_health_ms
            .push(ms_between(healthy, at("startup-logs")?));
        out.lag_logs_ms.push(ms_between(marker_at, at("soak")?));
    }
    Ok(out)
}

struct Fleet {
    hosts: usize,
    succeeded: usize,
    wall_s: f64,
    cpu_total_s: f64,
    /// CPU seconds of the sim children and of this bench over the same run: they share the
    /// 2 cores with canaryd.
    cpu_sims_s: f64,
    cpu_bench_s: f64,
    rss_idle_mib: f64,
    /// Peak RSS once every engine turned healthy, before this bench read any rollout: the
    /// start burst's share of the peak (the reads of every rollout come after).
    hwm_burst_mib: f64,
    /// The start burst: from the first POST until every canary's `up` reached its simulated
    /// host (polled every 200 ms), with canaryd's and the sims' CPU seconds over it.
    burst_s: f64,
    burst_cpu_s: f64,
    burst_sims_s: f64,
    /// canaryd's context switches (every thread's, voluntary + involuntary) over the burst.
    burst_switches: u64,
    hwm_mib: f64,
    threads: u64,
    wait_window_s: f64,
    wait_cpu_pct: f64,
    wait_sims_pct: f64,
    sample: Sample,
    soak_overshoot_ms: Vec<f64>,
}

fn cpu_of(pids: &[u32], tck: f64) -> f64 {
    pids.iter()
        .filter_map(|p| common::cpu_seconds(*p, tck))
        .sum()
}

async fn fleet(s: &Settings) -> anyhow::Result<Fleet> {
    let tck = common::clk_tck();
    let sims = tokio::task::block_in_place(|| {
        SimFleet::start(s.hosts, s.sim_procs, s.fleet_cold, TAGS[0], [R1, R2])
    })?;
    let result = match start_daemon(&sims.hosts, s.fleet_interval, s.fleet_soak).await {
        Ok(daemon) => {
            let result = fleet_run(s, tck, &daemon, &sims).await;
            daemon.stop_after(&result);
            result
        }
        Err(e) => Err(e),
    };
    tokio::task::block_in_place(|| sims.stop());
    result
}

async fn fleet_run(
    s: &Settings,
    tck: f64,
    daemon: &Daemon,
    sims: &SimFleet,
) -> anyhow::Result<Fleet> {
    let pid = daemon.pid;
    let me = std::process::id();
    let sim_pids = sims.pids();
    let cold = chrono::Duration::from_std(s.fleet_cold)?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_idle = common::status_mib(pid, "VmRSS").unwrap_or(f64::NAN);
    let cpu0 = common::cpu_seconds(pid, tck).context("cpu of canaryd")?;
    let (sims0, bench0) = (cpu_of(&sim_pids, tck), cpu_of(&[me], tck));
    let switches0 = common::context_switches(pid).unwrap_or(0);
    let t0 = Instant::now();
    let posts = (0..s.hosts).map(|i| {
        let api = &daemon.api;
        async move {
            api.post("/v1/rollouts", &plan(&host_name(i), TAGS[0], None))
                .await
        }
    });
    let mut ids = Vec::with_capacity(s.hosts);
    for created in futures_util::future::join_all(posts).await {
        ids.push(created?["id"].as_str().context("id")?.to_owned());
    }
    // No request to canaryd while the canaries run up to their soak (the driver must not
    // be the load): the simulated hosts say when every new r2 has turned healthy.
    let slack = Duration::from_secs(120) + Duration::from_millis(100) * s.hosts as u32;
    let limit = Instant::now() + s.fleet_cold + slack;
    let mut burst = None;
    loop {
        if burst.is_none() && (0..s.hosts).all(|i| sims.up_at(i).is_some()) {
            burst = Some((
                t0.elapsed().as_secs_f64(),
                common::cpu_seconds(pid, tck).context("cpu")? - cpu0,
                cpu_of(&sim_pids, tck) - sims0,
                common::context_switches(pid).unwrap_or(0) - switches0,
            ));
        }
        let now = Utc::now();
        let healthy = (0..s.hosts)
            .filter(|i| sims.up_at(*i).is_some_and(|up| up + cold <= now))
            .count();
        if healthy == s.hosts {
            break;
        }
        ensure!(
            Instant::now() < limit,
            "{healthy} of {} engines turned healthy",
            s.hosts
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let hwm_burst = common::status_mib(pid, "VmHWM").unwrap_or(f64::NAN);
    let (burst_s, burst_cpu_s, burst_sims_s, burst_switches) = burst.context("every up sent")?;
    tokio::time::sleep(2 * s.fleet_interval).await;
    // Then every canary should be in its soak: one read of each (at most every second).
    let earliest_soak = loop {
        let all = read_all(&daemon.api, &ids).await?;
        let soaking: Vec<DateTime<Utc>> = all
            .iter()
            .filter_map(|r| r.steps.iter().find(|st| st.name == "soak"))
            .filter_map(|st| st.started_at)
            .collect();
        if let Some(bad) = all
            .iter()
            .find(|r| r.status == "failed" || r.status == "aborted")
        {
            bail!(
                "fleet canary {} ended {}: {:?}",
                bad.id,
                bad.status,
                bad.error
            );
        }
        if soaking.len() == ids.len() {
            break soaking.into_iter().min().context("a soak")?;
        }
        ensure!(
            Instant::now() < limit,
            "{} of {} canaries reached the soak",
            soaking.len(),
            ids.len()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    // The waiting window: no request from here, until shortly before the first soak ends.
    let soak_end = earliest_soak + chrono::Duration::from_std(s.fleet_soak)?;
    let left = (soak_end - Utc::now() - chrono::Duration::milliseconds(500))
        .to_std()
        .unwrap_or_default();
    let window = left.min(Duration::from_secs(10));
    let w_cpu0 = common::cpu_seconds(pid, tck).context("cpu")?;
    let w_sims0 = cpu_of(&sim_pids, tck);
    let w0 = Instant::now();
    tokio::time::sleep(window).await;
    let w_cpu1 = common::cpu_seconds(pid, tck).context("cpu")?;
    let w_sims1 = cpu_of(&sim_pids, tck);
    let window_s = w0.elapsed().as_secs_f64();
    // Until every canary is terminal.
    let limit = Instant::now() + s.fleet_soak + slack;
    let done = loop {
        let all = read_all(&daemon.api, &ids).await?;
        if all
            .iter()
            .all(|r| matches!(r.status.as_str(), "succeeded" | "failed" | "aborted"))
        {
            break all;
        }
        ensure!(Instant::now() < limit, "fleet canaries did not finish");
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let wall_s = t0.elapsed().as_secs_f64();
    let cpu1 = common::cpu_seconds(pid, tck).context("cpu")?;
    let (sims1, bench1) = (cpu_of(&sim_pids, tck), cpu_of(&[me], tck));
    let mut sample = Sample::default();
    let mut overshoot = Vec::new();
    for (i, r) in done.iter().enumerate() {
        if r.status != "succeeded" {
            continue;
        }
        let healthy = sims.up_at(i).context("r2 came up")? + cold;
        let (logs_start, _) = step_times(r, "startup-logs")?;
        let (soak_start, soak_end) = step_times(r, "soak")?;
        let wall = ms_between(r.created_at, r.finished_at.context("finished")?);
        sample.wall_ms.push(wall);
        // What the simulated host and the runbook impose: the cold start and the soak.
        sample
            .overhead_ms
            .push(wall - s.fleet_cold.as_secs_f64() * 1e3 - s.fleet_soak.as_secs_f64() * 1e3);
        sample.lag_health_ms.push(ms_between(healthy, logs_start));
        sample.gaps_ms.extend(gaps(r));
        sample.instant_ms.extend(instant_durations(r));
        sample.add_phases(r);
        overshoot.push(ms_between(soak_start, soak_end) - s.fleet_soak.as_secs_f64() * 1e3);
    }
    Ok(Fleet {
        hosts: s.hosts,
        succeeded: sample.wall_ms.len(),
        wall_s,
        cpu_total_s: cpu1 - cpu0,
        cpu_sims_s: sims1 - sims0,
        cpu_bench_s: bench1 - bench0,
        rss_idle_mib: rss_idle,
        hwm_burst_mib: hwm_burst,
        burst_s,
        burst_cpu_s,
        burst_sims_s,
        burst_switches,
        hwm_mib: common::status_mib(pid, "VmHWM").unwrap_or(f64::NAN),
        threads: common::threads(pid).unwrap_or(0),
        wait_window_s: window_s,
        wait_cpu_pct: 100.0 * (w_cpu1 - w_cpu0) / window_s.max(1e-9),
        wait_sims_pct: 100.0 * (w_sims1 - w_sims0) / window_s.max(1e-9),
        sample,
        soak_overshoot_ms: overshoot,
    })
}

async fn read_all(api: &ApiClient, ids: &[String]) -> anyhow::Result<Vec<RolloutOut>> {
    let reads = ids.iter().map(|id| api.rollout(id));
    futures_util::future::join_all(reads)
        .await
        .into_iter()
        .collect()
}

fn p(v: &[f64]) -> String {
    format!(
        "{:.0} / {:.0} / {:.0}",
        pct(v, 50.0),
        pct(v, 99.0),
        common::max(v)
    )
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "yes"
    } else {
        "NO"
    }
}

async fn run() -> anyhow::Result<bool> {
    let s = Settings::from_env();
    println!("fleet benchmark: {}", common::machine());
    println!(
        "one host: {} canaryd canaries + {} manual-script canaries, poll interval {} ms, cold start {} ms, soak {} ms",
        s.runs,
        s.script_runs,
        s.interval.as_millis(),
        s.cold.as_millis(),
        s.soak.as_millis()
    );
    let sim = SimHost::start(sim_config(s.cold)).await?;
    let started = Instant::now();
    let cd = canaryd_single(&s, &sim).await?;
    let sc = script_single(&s, &sim).await?;
    sim.shutdown().await;
    println!("phase 1-2 took {:.1} s", started.elapsed().as_secs_f64());
    let iv = s.interval.as_secs_f64() * 1e3;
    let ratio = |a: &[f64], b: &[f64]| pct(a, 50.0) / pct(b, 50.0);
    let mut ok = true;
    println!("\n== one canary (ms, p50 / p99 / max)");
    println!(
        "{:<44} {:>22} {:>22} {:>7} {:>18} {:>3}",
        "metric", "canaryd", "manual script", "ratio", "target", "ok"
    );
    let lag_target = iv + 50.0;
    type Row<'a> = (&'a str, &'a Vec<f64>, &'a Vec<f64>, String, Option<bool>);
    let rows: [Row<'_>; 4] = [
        (
            "canary wall time (created -> finished)",
            &cd.wall_ms,
            &sc.wall_ms,
            "-".into(),
            None,
        ),
        (
            "orchestration overhead (wall - sim waits)",
            &cd.overhead_ms,
            &sc.overhead_ms,
            "p50 < 250".into(),
            Some(pct(&cd.overhead_ms, 50.0) < 250.0),
        ),
        (
            "readiness lag: healthy -> next step",
            &cd.lag_health_ms,
            &sc.lag_health_ms,
            format!("<= {lag_target:.0}"),
            Some(common::max(&cd.lag_health_ms) <= lag_target),
        ),
        (
            "readiness lag: last log line -> next step",
            &cd.lag_logs_ms,
            &sc.lag_logs_ms,
            format!("<= {lag_target:.0}"),
            Some(common::max(&cd.lag_logs_ms) <= lag_target),
        ),
    ];
    for (name, a, b, target, good) in rows {
        ok &= good.unwrap_or(true);
        println!(
            "{:<44} {:>22} {:>22} {:>7.2} {:>18} {:>3}",
            name,
            p(a),
            p(b),
            ratio(a, b),
            target,
            good.map(verdict).unwrap_or("-")
        );
    }
    println!(
        "{:<44} {:>22}",
        "gap between steps (canaryd)",
        p(&cd.gaps_ms)
    );
    println!(
        "{:<44} {:>22}",
        "steps without waits (snapshot..neighbours)",
        p(&cd.instant_ms)
    );
    println!("phases, p50 ms: {}", cd.phases());
    if s.hosts == 0 {
        return Ok(ok);
    }
    println!(
        "\n== fleet: {} hosts, a canary on each at once; poll interval {} ms, cold start {} ms, soak {} ms",
        s.hosts,
        s.fleet_interval.as_millis(),
        s.fleet_cold.as_millis(),
        s.fleet_soak.as_millis()
    );
    let f = fleet(&s).await?;
    let fiv = s.fleet_interval.as_secs_f64() * 1e3;
    let fs = &f.sample;
    println!(
        "{} of {} canaries succeeded in {:.1} s; canaryd process: {} threads; sims in {} child process(es)",
        f.succeeded, f.hosts, f.wall_s, f.threads, s.sim_procs
    );
    println!(
        "{:<44} {:>22} {:>18} {:>3}",
        "metric", "value", "target", "ok"
    );
    // The scale targets: 200 hosts (overhead, gaps) and 1,000 hosts (memory, lag p99).
    let big = s.hosts >= 1000;
    let (rss_target, lag_target, lag_ok) = if big {
        (
            200.0,
            format!("p99 <= {:.0}", fiv + 250.0),
            pct(&fs.lag_health_ms, 99.0) <= fiv + 250.0,
        )
    } else {
        (
            100.0,
            format!("max <= {:.0}", fiv + 50.0),
            common::max(&fs.lag_health_ms) <= fiv + 50.0,
        )
    };
    let judged = |target: &str, good: bool| {
        if big {
            ("-".to_owned(), None)
        } else {
            (target.to_owned(), Some(good))
        }
    };
    let (gap_target, gap_ok) = judged("p99 < 50", pct(&fs.gaps_ms, 99.0) < 50.0);
    let (over_target, over_ok) = judged("p50 < 500", pct(&fs.overhead_ms, 50.0) < 500.0);
    let fleet_rows: [(String, String, String, Option<bool>); 12] = [
        (
            "CPU seconds of canaryd, whole run".into(),
            format!("{:.2} s", f.cpu_total_s),
            "-".into(),
            None,
        ),
        (
            "CPU per canary".into(),
            format!("{:.1} ms", 1e3 * f.cpu_total_s / f.hosts as f64),
            "-".into(),
            None,
        ),
        (
            "start burst (POSTs -> every up sent)".into(),
            format!(
                "{:.2} s; CPU canaryd {:.2} s ({:.1} ms/canary, {:.0} switches/canary), sims {:.2} s",
                f.burst_s,
                f.burst_cpu_s,
                1e3 * f.burst_cpu_s / f.hosts as f64,
                f.burst_switches as f64 / f.hosts as f64,
                f.burst_sims_s
            ),
            "-".into(),
            None,
        ),
        (
            "CPU seconds of the sims / of this bench".into(),
            format!("{:.2} s / {:.2} s", f.cpu_sims_s, f.cpu_bench_s),
            "-".into(),
            None,
        ),
        (
            format!("RSS idle ({} hosts configured)", f.hosts),
            format!("{:.1} MiB", f.rss_idle_mib),
            "-".into(),
            None,
        ),
        (
            "peak RSS (VmHWM)".into(),
            format!("{:.1} MiB (burst: {:.1})", f.hwm_mib, f.hwm_burst_mib),
            format!("< {rss_target:.0} MB"),
            Some(f.hwm_mib * 1.048_576 < rss_target),
        ),
        (
            "CPU while all soak (% of one core)".into(),
            format!(
                "{:.1} % over {:.1} s (sims {:.0} %)",
                f.wait_cpu_pct, f.wait_window_s, f.wait_sims_pct
            ),
            "< 10 %".into(),
            Some(f.wait_cpu_pct < 10.0),
        ),
        (
            "readiness lag: healthy -> next step (ms)".into(),
            p(&fs.lag_health_ms),
            lag_target,
            Some(lag_ok),
        ),
        (
            "gap between steps (ms)".into(),
            format!("{} (1 host: {})", p(&fs.gaps_ms), p(&cd.gaps_ms)),
            gap_target,
            gap_ok,
        ),
        (
            "steps without waits (ms)".into(),
            format!("{} (1 host: {})", p(&fs.instant_ms), p(&cd.instant_ms)),
            "-".into(),
            None,
        ),
        (
            "overhead per canary (ms)".into(),
            p(&fs.overhead_ms),
            over_target,
            over_ok,
        ),
        (
            "soak overshoot (ms)".into(),
            p(&f.soak_overshoot_ms),
            "-".into(),
            None,
        ),
    ];
    for (name, value, target, good) in fleet_rows {
        ok &= good.unwrap_or(true);
        println!(
            "{:<44} {:>22} {:>18} {:>3}",
            name,
            value,
            target,
            good.map(verdict).unwrap_or("-")
        );
    }
    println!("phases, p50 ms: {}", fs.phases());
    ok &= f.succeeded == f.hosts;
    Ok(ok)
}

fn main() -> ExitCode {
    // A child holding simulated hosts for the fleet phase (`common::sim_fleet`).
    if let Ok(spec) = std::env::var(sim_fleet::CHILD_VAR) {
        return match sim_fleet::child_main(&spec, sim_config) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sim child: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    // `cargo bench` passes `--bench`; this harness takes its knobs from the environment.
    common::run_main("fleet", "some targets missed (see the table)", run())
}
