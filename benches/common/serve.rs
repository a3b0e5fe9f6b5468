//! `canaryd serve` in a child process over simulated hosts (in the bench's process or in its
//! sim children), so the daemon's CPU and RSS are its alone (`/proc/<pid>`). Used by `fleet`
//! and `release`.

use std::fmt::Write as _;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use canaryd::cli::ApiClient;
use canaryd_sim::SimHost;

use crate::common::sim_fleet::HostAddr;

pub const R1: &str = "model-sg-glm53-w4afp8-tp4-r1";
pub const R2: &str = "model-sg-glm53-w4afp8-tp4-r2";

pub struct Daemon {
    child: Child,
    pub pid: u32,
    pub api: ApiClient,
    pub url: String,
    dir: tempfile::TempDir,
}

/// The bench's name of simulated host `i`.
pub fn host_name(i: usize) -> String {
    format!("h{i:03}")
}

/// What canaryd's config needs of an in-process simulated host.
pub fn addr(sim: &SimHost) -> anyhow::Result<HostAddr> {
    let health = [R1, R2]
        .iter()
        .map(|s| sim.health_url(s).context("engine port"))
        .collect::<anyhow::Result<_>>()?;
    Ok(HostAddr {
        url: sim.url(),
        token: sim.token().to_owned(),
        health,
    })
}

impl Daemon {
    /// Starts the daemon with every host of `sims` (each with r1 and r2 of one group, their
    /// health URLs in that order), the env file's lines and the runbooks given as (name, YAML);
    /// waits for `/readyz`. `canaryd` runs another build's binary (before/after comparisons);
    /// `None` is this build's.
    pub async fn start(
        sims: &[HostAddr],
        env: &[(String, String)],
        runbooks: &[(&str, String)],
        canaryd: Option<std::ffi::OsString>,
    ) -> anyhow::Result<Self> {
        let first = sims.first().context("at least one simulated host")?;
        let dir = tempfile::tempdir().context("temp dir")?;
        let env: String = env.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
        std::fs::write(dir.path().join("host.env"), env)?;
        std::fs::create_dir(dir.path().join("runbooks"))?;
        for (name, text) in runbooks {
            std::fs::write(dir.path().join(format!("runbooks/{name}.yaml")), text)?;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut cfg = format!(
            "listen: 127.0.0.1:{port}\ndatabase: canaryd.db\nrunbooks_dir: runbooks\n\
             compose: {{busy_retry_initial: 100ms, busy_retry_max: 1s}}\nhosts:\n"
        );
        for (i, sim) in sims.iter().enumerate() {
            writeln!(
                cfg,
                "  {}:\n    compose_manager_url: {}\n    token_env: BENCH_SIM_TOKEN\n    env_file: host.env\n    replicas:",
                host_name(i),
                sim.url
            )?;
            for (service, health) in [R1, R2].into_iter().zip(&sim.health) {
                writeln!(
                    cfg,
                    "      {service}: {{group: glm53-long, health_url: {health}}}"
                )?;
            }
        }
        let config = dir.path().join("canaryd.yaml");
        std::fs::write(&config, cfg)?;
        let log = std::fs::File::create(dir.path().join("canaryd.log"))?;
        let bin = canaryd.unwrap_or_else(|| env!("CARGO_BIN_EXE_canaryd").into());
        let child = Command::new(bin)
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .env("BENCH_SIM_TOKEN", &first.token)
            // The serve default, stated so that a RUST_LOG of the caller does not change it.
            .env("RUST_LOG", "canaryd=info,tower_http=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("spawning canaryd serve")?;
        let pid = child.id();
        let url = format!("http://127.0.0.1:{port}");
        let api = ApiClient::new(&url, None)?;
        let mut daemon = Daemon {
            child,
            pid,
            api,
            url,
            dir,
        };
        let http = reqwest::Client::new();
        for _ in 0..1000 {
            if let Ok(Some(status)) = daemon.child.try_wait() {
                bail!("canaryd exited at start ({status}):\n{}", daemon.log());
            }
            let ready = http.get(format!("{}/readyz", daemon.url)).send().await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                return Ok(daemon);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!("canaryd was not ready within 20 s")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("canaryd.log")).unwrap_or_default()
    }

    /// Stops the daemon; on a failed run, shows the end of its log first.
    pub fn stop_after<T>(self, result: &anyhow::Result<T>) {
        if result.is_err() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            eprintln!("--- end of the canaryd log:\n{}", tail.join("\n"));
        }
        self.stop();
    }

    pub fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
