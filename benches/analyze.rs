//! The `analyze` step's cost, per scrape and at fleet scale.
//!
//! 1. **One page.** Parsing one SGLang-sized `/metrics` page (~2,000 series, the simulated
//!    engine's page with padding) and taking the three families an analysis reads from it.
//!    Target: parsing one page p99 < 5 ms.
//! 2. **Fleet.** `ANALYZE_ROLLOUTS` simulated hosts in this process, each with two engines
//!    whose pages carry ~`ANALYZE_SERIES` series, and one `canaryd serve` child with every
//!    host configured: a rollout on each host at once whose runbook is one `analyze` step
//!    (target r2 against its peer r1, the fleet checks, every `ANALYZE_INTERVAL_MS`, over
//!    `ANALYZE_WINDOW_MS`). CPU (`utime + stime` of `/proc/<pid>/stat`) and peak RSS
//!    (`VmHWM`) are the child's alone: the engines, their traffic and their pages are this
//!    process's. CPU is measured over a window in which every analysis runs and this bench
//!    sends no request. Targets: under 10 % of one core, under 150 MB.
//!
//! Knobs: `ANALYZE_SERIES` [2000], `ANALYZE_PARSES` [1000], `ANALYZE_ROLLOUTS` [200, 0 skips
//! phase 2], `ANALYZE_INTERVAL_MS` [5000], `ANALYZE_WINDOW_MS` [60000]. For comparing builds:
//! `ANALYZE_CANARYD` (the daemon binary to run, [the one built with this bench]: a saved
//! copy of an earlier build runs against the same bench), `ANALYZE_CALLGRIND` (a folder:
//! the daemon runs under `valgrind --tool=callgrind`, its counts zeroed when the measured
//! window starts and dumped when it ends, and the window's instructions are printed, per
//! scrape: repeatable where CPU time moves with the machine's other load; use few rollouts,
//! valgrind is ~50× slower).

mod common;

use std::fmt::Write as _;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use canaryd::cli::ApiClient;
use canaryd::domain::exposition::Page;
use canaryd_sim::{SimConfig, SimHost};
use common::{env_ms, env_usize, pct};
use serde_json::{json, Value};

const TARGET_P99_MS: f64 = 5.0;
const TARGET_CPU_PCT: f64 = 10.0;
const TARGET_HWM_MB: f64 = 150.0;
const R1: &str = "model-sg-glm53-w4afp8-tp4-r1";
const R2: &str = "model-sg-glm53-w4afp8-tp4-r2";
const FILE: &str = "prod/GLM-5.3-Flash-SGL-TP4-W4AFP8-LongContext.yaml";
/// The engine's own series on a page; the rest is padding (`sim::metrics::example_page`).
const ENGINE_SERIES: usize = 16;

async fn run() -> anyhow::Result<bool> {
    println!("analyze benchmark: {}", common::machine());
    let mut ok = one_page()?;
    let rollouts = env_usize("ANALYZE_ROLLOUTS", 200);
    if rollouts > 0 {
        ok &= fleet(rollouts).await?;
    }
    Ok(ok)
}

/// Phase 1: parsing one page.
fn one_page() -> anyhow::Result<bool> {
    let series = env_usize("ANALYZE_SERIES", 2_000);
    let parses = env_usize("ANALYZE_PARSES", 1_000).max(1);
    let text = canaryd_sim::example_metrics_page(series);
    let page = Page::parse(&text)?;
    let lines = text.lines().filter(|l| !l.starts_with('#')).count();
    println!(
        "page: {:.0} KiB, {} sample lines, {} series",
        text.len() as f64 / 1024.0,
        lines,
        page.series_count()
    );
    let families = [
        "sglang:time_to_first_token_seconds",
        "sglang:inter_token_latency_seconds",
        "sglang:num_requests_total",
    ];
    let (mut whole_ms, mut scrape_ms, mut streamed_ms) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..parses {
        // What the analysis does per scrape: the families its checks read.
        let t = Instant::now();
        let page = Page::parse_families(&text, &families)?;
        let ttft = page.histogram(families[0]);
        let itl = page.histogram(families[1]);
        let requests = page.counter(families[2]);
        scrape_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(
            !ttft.is_empty() && !itl.is_empty() && !requests.is_empty(),
            "the families are on the page"
        );
        // As the analysis reads a body: in 16 KiB chunks, keeping only the families' lines.
        let t = Instant::now();
        let mut lines = canaryd::domain::exposition::FamilyLines::new(&families);
        for chunk in text.as_bytes().chunks(16 * 1024) {
            lines.push(chunk);
        }
        let streamed = lines.finish()?;
        let n = streamed.histogram(families[0]).len();
        streamed_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(n == ttft.len(), "the streamed page has the same series");
        // Every series of the page, for comparison.
        let t = Instant::now();
        let whole = Page::parse(&text)?;
        whole_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(whole.series_count() > 0, "the page parses");
    }
    let p99 = pct(&scrape_ms, 99.0);
    println!("\n| what | p50 | p99 | max | target |\n|---|---|---|---|---|");
    println!(
        "| one scrape: parse the page's TTFT, ITL and request families and read them ({parses}×) | {:.2} ms | {:.2} ms | {:.2} ms | p99 < {TARGET_P99_MS:.0} ms {} |",
        pct(&scrape_ms, 50.0),
        p99,
        common::max(&scrape_ms),
        if p99 < TARGET_P99_MS { "yes" } else { "NO" }
    );
    println!(
        "| the same, fed in 16 KiB chunks as the analysis reads a body (`FamilyLines`) | {:.2} ms | {:.2} ms | {:.2} ms | |",
        pct(&streamed_ms, 50.0),
        pct(&streamed_ms, 99.0),
        common::max(&streamed_ms)
    );
    println!(
        "| parse every series of the page | {:.2} ms | {:.2} ms | {:.2} ms | |",
        pct(&whole_ms, 50.0),
        pct(&whole_ms, 99.0),
        common::max(&whole_ms)
    );
    Ok(p99 < TARGET_P99_MS)
}

/// The benchmark runbook: one `analyze` step with the shipped canary's checks.
fn analysis_runbook(interval: Duration, window: Duration) -> String {
    let d = canaryd::testing::runbook_duration;
    format!(
        "description: benchmark analysis (one analyze step)\nsteps:\n  - name: analysis\n    kind: analyze\n    \
         warmup: 0s\n    duration: {}\n    interval: {}\n    checks:\n      \
         - {{name: ttft_p95, histogram: \"sglang:time_to_first_token_seconds\", quantile: 0.95, max_ratio_to_peers: 1.2, min_requests: 50}}\n      \
         - {{name: itl_p95, histogram: \"sglang:inter_token_latency_seconds\", quantile: 0.95, max_ratio_to_peers: 1.2, min_requests: 50}}\n      \
         - {{name: took_traffic, counter: \"sglang:num_requests_total\", min: 1}}\n",
        d(window),
        d(interval)
    )
}

/// `canaryd serve` in a child process with one host per simulated host.
struct Daemon {
    child: Child,
    pid: u32,
    api: ApiClient,
    _dir: tempfile::TempDir,
}

impl Daemon {
    async fn start(sims: &[SimHost], runbook: &str) -> anyhow::Result<Daemon> {
        let first = sims.first().context("at least one simulated host")?;
        let dir = tempfile::tempdir()?;
        let env: String = SimConfig::example()
            .initial_env
            .iter()
            .map(|(k, v)| format!("{k}={v}\n"))
            .collect();
        std::fs::write(dir.path().join("host.env"), env)?;
        std::fs::create_dir(dir.path().join("runbooks"))?;
        std::fs::write(
            dir.path().join("runbooks/single-replica-canary.yaml"),
            runbook,
        )?;
        let t = canaryd::testing::Timings::TESTS;
        std::fs::write(
            dir.path().join("runbooks/single-replica-rollback.yaml"),
            canaryd::testing::canary_until("benchmark rollback", &t, "health"),
        )?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut cfg = format!(
            "listen: 127.0.0.1:{port}\ndatabase: canaryd.db\nrunbooks_dir: runbooks\nhosts:\n"
        );
        for (i, sim) in sims.iter().enumerate() {
            writeln!(
                cfg,
                "  h{i:03}:\n    compose_manager_url: {}\n    token_env: BENCH_SIM_TOKEN\n    env_file: host.env\n    replicas:",
                sim.url()
            )?;
            for service in [R1, R2] {
                let health = sim.health_url(service).context("engine port")?;
                writeln!(
                    cfg,
                    "      {service}: {{group: glm53-long, health_url: {health}}}"
                )?;
            }
        }
        let config = dir.path().join("canaryd.yaml");
        std::fs::write(&config, cfg)?;
        let log = std::fs::File::create(dir.path().join("canaryd.log"))?;
        let bin = std::env::var_os("ANALYZE_CANARYD")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_canaryd").into());
        let mut command = match callgrind_dir() {
            Some(out) => {
                let mut c = Command::new("valgrind");
                c.arg("--tool=callgrind")
                    .arg(format!(
                        "--callgrind-out-file={}/callgrind.out.%p",
                        out.display()
                    ))
                    .arg(bin);
                c
            }
            None => Command::new(bin),
        };
        let child = command
            .args(["serve", "--config"])
            .arg(&config)
            .env("BENCH_SIM_TOKEN", first.token())
            .env("RUST_LOG", "canaryd=info,tower_http=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("spawning canaryd serve")?;
        let pid = child.id();
        let url = format!("http://127.0.0.1:{port}");
        let mut daemon = Daemon {
            child,
            pid,
            api: ApiClient::new(&url, None)?,
            _dir: dir,
        };
        let http = reqwest::Client::new();
        for _ in 0..3000 {
            if let Ok(Some(status)) = daemon.child.try_wait() {
                bail!("canaryd exited at start ({status})");
            }
            let ready = http.get(format!("{url}/readyz")).send().await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                return Ok(daemon);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        daemon.stop();
        bail!("canaryd was not ready within 60 s")
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// System CPU seconds of a process (`stime` of `/proc/<pid>/stat`).
fn system_seconds(pid: u32, tck: f64) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let stime: f64 = rest.split_whitespace().nth(12)?.parse().ok()?;
    Some(stime / tck)
}

/// `ANALYZE_CALLGRIND`: where callgrind writes its counts, when the daemon runs under it.
fn callgrind_dir() -> Option<std::path::PathBuf> {
    std::env::var_os("ANALYZE_CALLGRIND")
        .filter(|d| !d.is_empty())
        .map(Into::into)
}

/// Under callgrind: zeroes the daemon's counts (`zero`) or dumps them (`dump`), by pid.
fn callgrind_control(pid: u32, what: &str) -> anyhow::Result<()> {
    let status = Command::new("callgrind_control")
        .arg(format!("--{what}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .status()
        .context("running callgrind_control")?;
    ensure!(
        status.success(),
        "callgrind_control --{what} {pid}: {status}"
    );
    Ok(())
}

/// The instructions (`Ir`) of the newest dump of `pid` in `dir` (its `totals:` line).
fn callgrind_window_ir(dir: &std::path::Path, pid: u32) -> anyhow::Result<u64> {
    let prefix = format!("callgrind.out.{pid}.");
    let newest = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .context("no callgrind dump")?;
    let text = std::fs::read_to_string(newest.path())?;
    let totals = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .context("no totals line in the dump")?;
    Ok(totals
        .split_whitespace()
        .next()
        .context("empty totals")?
        .parse()?)
}

/// The rollouts in `status` (one listing request).
async fn count(api: &ApiClient, status: &str, n: usize) -> anyhow::Result<usize> {
    let page = api
        .get(&format!("/v1/rollouts?status={status}&limit={}", n.max(1)))
        .await?;
    Ok(page["items"].as_array().map_or(0, Vec::len))
}

/// Phase 2: `rollouts` concurrent analyses in one canaryd.
async fn fleet(rollouts: usize) -> anyhow::Result<bool> {
    let series = env_usize("ANALYZE_SERIES", 2_000);
    let interval = env_ms("ANALYZE_INTERVAL_MS", 5_000);
    let window = env_ms("ANALYZE_WINDOW_MS", 60_000);
    println!(
        "\n== fleet: {rollouts} rollouts at once, each analysing target + 1 peer every {} ms over {} ms; pages of ~{series} series",
        interval.as_millis(),
        window.as_millis()
    );
    let mut sims = Vec::with_capacity(rollouts);
    for _ in 0..rollouts {
        let mut cfg = SimConfig::example();
        cfg.cold_start = Duration::ZERO;
        let sim = SimHost::start(cfg).await?;
        sim.faults()
            .set_metrics_padding(series.saturating_sub(ENGINE_SERIES));
        sims.push(sim);
    }
    let page = reqwest::get(sims[0].metrics_url(R1).context("metrics url")?)
        .await?
        .text()
        .await?;
    println!(
        "one engine page: {:.0} KiB, {} series",
        page.len() as f64 / 1024.0,
        Page::parse(&page)?.series_count()
    );
    let daemon = Daemon::start(&sims, &analysis_runbook(interval, window)).await?;
    let result = measure(&daemon, rollouts, interval, window).await;
    daemon.stop();
    for sim in sims {
        sim.shutdown().await;
    }
    let m = result?;
    let cpu_ok = m.cpu_pct < TARGET_CPU_PCT;
    let hwm_ok = m.hwm_mib * 1.048_576 < TARGET_HWM_MB;
    println!(
        "{} of {rollouts} analyses ended (succeeded {}), {} scrapes per replica; canaryd: {} threads",
        m.ended, m.succeeded, m.scrapes, m.threads
    );
    println!("\n| what | value | target |\n|---|---|---|");
    println!(
        "| CPU of canaryd while every analysis runs (% of one core) | {:.1} % over {:.1} s | < {TARGET_CPU_PCT:.0} % {} |",
        m.cpu_pct,
        m.window_s,
        if cpu_ok { "yes" } else { "NO" }
    );
    println!(
        "| of which in the kernel (`stime`) | {:.1} % | |",
        m.sys_pct
    );
    println!(
        "| CPU of canaryd, whole run | {:.2} s in {:.1} s ({:.1} %) | |",
        m.cpu_total_s,
        m.wall_s,
        100.0 * m.cpu_total_s / m.wall_s.max(1e-9)
    );
    println!("| RSS of canaryd, idle | {:.1} MiB | |", m.rss_idle_mib);
    println!(
        "| peak RSS of canaryd (VmHWM) | {:.1} MiB | < {TARGET_HWM_MB:.0} MB {} |",
        m.hwm_mib,
        if hwm_ok { "yes" } else { "NO" }
    );
    if let Some(ir) = m.window_ir {
        // Every rollout scrapes target and peer once per interval.
        let scrapes = 2.0 * rollouts as f64 * m.window_s / interval.as_secs_f64().max(1e-9);
        println!(
            "| instructions of canaryd over the window (callgrind) | {ir} ({:.0} per scrape, ~{scrapes:.0} scrapes) | |",
            ir as f64 / scrapes.max(1.0)
        );
    }
    println!(
        "| load average after the run | {} | |",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    Ok(cpu_ok && hwm_ok && m.ended == rollouts)
}

struct Measured {
    ended: usize,
    succeeded: usize,
    scrapes: String,
    threads: u64,
    cpu_pct: f64,
    /// The kernel's part of `cpu_pct` (`stime`: sockets, reads, SQLite's writes).
    sys_pct: f64,
    window_s: f64,
    cpu_total_s: f64,
    wall_s: f64,
    rss_idle_mib: f64,
    hwm_mib: f64,
    /// Under callgrind: the daemon's instructions over the measured window.
    window_ir: Option<u64>,
}

async fn measure(
    daemon: &Daemon,
    rollouts: usize,
    interval: Duration,
    window: Duration,
) -> anyhow::Result<Measured> {
    let tck = common::clk_tck();
    let pid = daemon.pid;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_idle_mib = common::status_mib(pid, "VmRSS").unwrap_or(f64::NAN);
    let cpu0 = common::cpu_seconds(pid, tck).context("cpu of canaryd")?;
    let t0 = Instant::now();
    let posts = (0..rollouts).map(|i| {
        let api = &daemon.api;
        async move {
            let plan = json!({"host": format!("h{i:03}"), "file": FILE, "service": R2,
                              "tag": "v0.0.451", "reason": "benchmark analysis"});
            api.post("/v1/rollouts", &plan).await
        }
    });
    let mut ids = Vec::with_capacity(rollouts);
    for created in futures_util::future::join_all(posts).await {
        ids.push(created?["id"].as_str().context("id")?.to_owned());
    }
    // Every analysis running: one listing a second until then.
    let limit = Instant::now() + Duration::from_secs(60);
    while count(&daemon.api, "running", rollouts).await? < rollouts {
        ensure!(Instant::now() < limit, "the analyses did not all start");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let started = Instant::now();
    // The measured window: no request from here until shortly before the first one ends.
    let quiet = window
        .saturating_sub(started.duration_since(t0))
        .saturating_sub(interval.min(Duration::from_secs(5)));
    let callgrind = callgrind_dir();
    if callgrind.is_some() {
        callgrind_control(pid, "zero")?;
    }
    let w_cpu0 = common::cpu_seconds(pid, tck).context("cpu")?;
    let w_sys0 = system_seconds(pid, tck).context("cpu")?;
    let w0 = Instant::now();
    tokio::time::sleep(quiet).await;
    let w_cpu1 = common::cpu_seconds(pid, tck).context("cpu")?;
    let w_sys1 = system_seconds(pid, tck).context("cpu")?;
    let window_s = w0.elapsed().as_secs_f64();
    let window_ir = match &callgrind {
        Some(dir) => {
            callgrind_control(pid, "dump")?;
            Some(callgrind_window_ir(dir, pid)?)
        }
        None => None,
    };
    let limit = Instant::now() + window + Duration::from_secs(120);
    let ended = loop {
        let ended = count(&daemon.api, "succeeded", rollouts).await?
            + count(&daemon.api, "failed", rollouts).await?;
        if ended >= rollouts {
            break ended;
        }
        ensure!(
            Instant::now() < limit,
            "{ended} of {rollouts} analyses ended"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let wall_s = t0.elapsed().as_secs_f64();
    let cpu1 = common::cpu_seconds(pid, tck).context("cpu")?;
    let succeeded = count(&daemon.api, "succeeded", rollouts).await?;
    let first: Value = daemon.api.get(&format!("/v1/rollouts/{}", ids[0])).await?;
    let replicas = &first["steps"][0]["detail"]["replicas"];
    let scrapes = format!(
        "target {} / peer {}",
        replicas[R2]["scrapes"], replicas[R1]["scrapes"]
    );
    Ok(Measured {
        ended,
        succeeded,
        scrapes,
        threads: common::threads(pid).unwrap_or(0),
        cpu_pct: 100.0 * (w_cpu1 - w_cpu0) / window_s.max(1e-9),
        sys_pct: 100.0 * (w_sys1 - w_sys0) / window_s.max(1e-9),
        window_s,
        cpu_total_s: cpu1 - cpu0,
        wall_s,
        rss_idle_mib,
        hwm_mib: common::status_mib(pid, "VmHWM").unwrap_or(f64::NAN),
        window_ir,
    })
}

fn main() -> ExitCode {
    // `cargo bench` passes `--bench`; this harness takes its knobs from the environment.
    common::run_main("analyze", "target missed (see the table)", run())
}
