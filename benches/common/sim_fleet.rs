//! Simulated hosts in child processes of a bench: one process cannot hold 1,000
//! simulated hosts next to the bench's own work without measuring itself, and their CPU is
//! then counted apart from canaryd's and the bench's.
//!
//! The bench re-executes itself with `SIM_FLEET_CHILD=<hosts>,<cold start ms>,<tag>`: the
//! child starts that many `SimHost`s on loopback ports and prints, on stdout,
//!
//! - `HOST <compose-manager url> <token> <r1 health url> <r2 health url>`, one line per host,
//!   then `READY`;
//! - `UP <host index> <unix ms>` once per host, when its r2 runs `<tag>` (the container's
//!   start, from the simulated host's own clock: the instant its cold start begins).
//!
//! It exits when its stdin closes (the parent dropped it) or after an hour at most.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use canaryd_sim::{SimConfig, SimHost};
use chrono::{DateTime, Utc};

/// The env var that makes a bench process a sim child.
pub const CHILD_VAR: &str = "SIM_FLEET_CHILD";

/// One simulated host as canaryd's config needs it.
#[derive(Debug, Clone)]
pub struct HostAddr {
    pub url: String,
    pub token: String,
    /// Health URLs of the replicas, in the order the parent asked for them.
    pub health: Vec<String>,
}

/// The simulated hosts of every child, in order, and when each one's target came up.
pub struct SimFleet {
    pub hosts: Vec<HostAddr>,
    children: Vec<(Child, Option<ChildStdin>)>,
    ups: Arc<Mutex<HashMap<usize, DateTime<Utc>>>>,
}

impl SimFleet {
    /// Starts `procs` children holding `hosts` simulated hosts between them (the bench's own
    /// executable, `CHILD_VAR` set). Waits until every child printed `READY`.
    pub fn start(
        hosts: usize,
        procs: usize,
        cold: Duration,
        tag: &str,
        services: [&str; 2],
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("the bench's executable")?;
        let procs = procs.clamp(1, hosts.max(1));
        let ups = Arc::new(Mutex::new(HashMap::new()));
        let mut fleet = SimFleet {
            hosts: Vec::with_capacity(hosts),
            children: Vec::new(),
            ups: ups.clone(),
        };
        let mut offset = 0;
        for p in 0..procs {
            let n = hosts / procs + usize::from(p < hosts % procs);
            let mut child = Command::new(&exe)
                .env(
                    CHILD_VAR,
                    format!(
                        "{n},{},{tag},{},{}",
                        cold.as_millis(),
                        services[0],
                        services[1]
                    ),
                )
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .context("spawning a sim child")?;
            let stdin = child.stdin.take();
            let stdout = child.stdout.take().context("child stdout")?;
            fleet.children.push((child, stdin));
            let mut lines = BufReader::new(stdout).lines();
            let first = offset;
            loop {
                let Some(line) = lines.next() else {
                    bail!("sim child {p} ended before READY");
                };
                let line = line?;
                let parts: Vec<&str> = line.split_whitespace().collect();
                match parts.as_slice() {
                    ["HOST", url, token, health @ ..] => fleet.hosts.push(HostAddr {
                        url: url.to_string(),
                        token: token.to_string(),
                        health: health.iter().map(|h| h.to_string()).collect(),
                    }),
                    ["READY"] => break,
                    _ => bail!("sim child {p}: unexpected line {line:?}"),
                }
            }
            offset += n;
            let ups = ups.clone();
            std::thread::spawn(move || {
                for line in lines.map_while(Result::ok) {
                    let parts: Vec<&str> = line.split_whitespace().collect();
                    if let ["UP", i, ms] = parts.as_slice() {
                        let (Ok(i), Ok(ms)) = (i.parse::<usize>(), ms.parse::<i64>()) else {
                            continue;
                        };
                        if let (Some(at), Ok(mut ups)) =
                            (DateTime::from_timestamp_millis(ms), ups.lock())
                        {
                            ups.insert(first + i, at);
                        }
                    }
                }
            });
        }
        Ok(fleet)
    }

    /// When host `i`'s target started running the tag (its cold start began), if it did.
    pub fn up_at(&self, i: usize) -> Option<DateTime<Utc>> {
        self.ups.lock().ok()?.get(&i).copied()
    }

    /// The children's process ids (CPU and memory accounting).
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|(c, _)| c.id()).collect()
    }

    /// Closes the children's stdin and waits for them (killing one that lingers).
    pub fn stop(mut self) {
        for (child, stdin) in &mut self.children {
            drop(stdin.take());
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The child's side: runs when `CHILD_VAR` is set. `config` builds each host's `SimConfig`
/// from the cold start.
pub fn child_main(spec: &str, config: impl Fn(Duration) -> SimConfig) -> anyhow::Result<()> {
    let parts: Vec<&str> = spec.split(',').collect();
    let [n, cold_ms, tag, r1, r2] = parts.as_slice() else {
        bail!("{CHILD_VAR}={spec}: want <hosts>,<cold ms>,<tag>,<r1>,<r2>");
    };
    let n: usize = n.parse().context("hosts")?;
    let cold = Duration::from_millis(cold_ms.parse().context("cold start ms")?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut sims = Vec::with_capacity(n);
        for _ in 0..n {
            sims.push(SimHost::start(config(cold)).await?);
        }
        let mut out = std::io::stdout().lock();
        for sim in &sims {
            let r1 = sim.health_url(r1).context("r1 health")?;
            let r2h = sim.health_url(r2).context("r2 health")?;
            writeln!(out, "HOST {} {} {r1} {r2h}", sim.url(), sim.token())?;
        }
        writeln!(out, "READY")?;
        out.flush()?;
        drop(out);
        let (closed_tx, mut closed) = tokio::sync::watch::channel(false);
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
            let _ = closed_tx.send(true);
        });
        let mut reported = vec![false; n];
        let limit = Instant::now() + Duration::from_secs(3600);
        while Instant::now() < limit && !*closed.borrow() {
            let mut lines = String::new();
            for (i, sim) in sims.iter().enumerate() {
                if reported[i] {
                    continue;
                }
                let up = sim
                    .containers()
                    .into_iter()
                    .find(|c| c.service == *r2 && c.state == "running" && c.tag == *tag);
                if let Some(c) = up {
                    reported[i] = true;
                    lines.push_str(&format!("UP {i} {}\n", c.started_at.timestamp_millis()));
                }
            }
            if !lines.is_empty() {
                let mut out = std::io::stdout().lock();
                out.write_all(lines.as_bytes())?;
                out.flush()?;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = closed.changed() => {}
            }
        }
        for sim in sims {
            sim.shutdown().await;
        }
        Ok(())
    })
}
