//! Helpers shared by the benchmarks: process accounting from `/proc`, percentiles, env knobs.
//! Their runbooks come from `canaryd::testing`.

#![allow(dead_code)]

pub mod sim_fleet;

use std::time::Duration;

/// An integer knob from the environment, or its default.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// A duration knob in milliseconds from the environment, or its default.
pub fn env_ms(name: &str, default_ms: u64) -> Duration {
    Duration::from_millis(
        std::env::var(name)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(default_ms),
    )
}

/// Clock ticks per second of `/proc/<pid>/stat` (`getconf CLK_TCK`, 100 on Linux by default).
pub fn clk_tck() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// User + system CPU seconds of a process (`utime` + `stime` of `/proc/<pid>/stat`).
pub fn cpu_seconds(pid: u32, tck: f64) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: fields are counted after its closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime field 15.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / tck)
}

/// A `kB` field of `/proc/<pid>/status` (`VmHWM`, `VmRSS`), in MiB.
pub fn status_mib(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Threads of a process (`Threads:` of `/proc/<pid>/status`).
pub fn threads(pid: u32) -> Option<u64> {
    status_u64(&format!("/proc/{pid}/status"), "Threads")
}

/// Context switches, voluntary + involuntary, of every live thread of a process (each
/// thread's `/proc/<pid>/task/<tid>/status`; a thread that has exited is not counted).
pub fn context_switches(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0;
    for task in tasks.flatten() {
        let status = task.path().join("status");
        let status = status.to_str()?;
        total += status_u64(status, "voluntary_ctxt_switches").unwrap_or(0);
        total += status_u64(status, "nonvoluntary_ctxt_switches").unwrap_or(0);
    }
    Some(total)
}

/// A number field of a `/proc` status file.
fn status_u64(path: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(path).ok()?;
    status
        .lines()
        .find(|l| l.split(':').next() == Some(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Percentile (nearest rank) of unsorted samples; NaN when empty.
pub fn pct(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut v = samples.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// Largest sample; NaN when empty.
pub fn max(samples: &[f64]) -> f64 {
    samples.iter().copied().fold(f64::NAN, f64::max)
}

/// Milliseconds between two times.
pub fn ms_between(from: chrono::DateTime<chrono::Utc>, to: chrono::DateTime<chrono::Utc>) -> f64 {
    (to - from).num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0
}

/// A short description of the machine: cores and CPU model.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(str::trim)
        .unwrap_or("unknown CPU")
        .to_owned();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    format!(
        "{cores} cores ({model}), load average {} at start",
        load.join(" ")
    )
}

/// Runs a bench's async body on a 2-worker runtime. Exit code: failure only when the bench
/// itself failed; a missed target is reported in its table (`missed` is printed).
pub fn run_main<F>(name: &str, missed: &str, body: F) -> std::process::ExitCode
where
    F: std::future::Future<Output = anyhow::Result<bool>>,
{
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tokio runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(body) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => {
            println!("\n{missed}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{name} benchmark failed: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
