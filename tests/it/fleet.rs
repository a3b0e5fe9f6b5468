//! One daemon over several simulated hosts (`gpu01`, `gpu02`, …), each with r1 and r2: what
//! the releases' and admission's tests boot. Their own reads and waits are `impl Fleet`
//! blocks in their files.

use std::path::PathBuf;

use canaryd::app::App;
use canaryd::config::EngineTuning;
use canaryd::engine::Engine;
use canaryd_sim::SimHost;
use serde_json::Value;

use crate::helpers::{crash, fast_runbooks, post_json, sim_config};

pub struct Fleet {
    pub sims: Vec<(String, SimHost)>,
    pub url: String,
    pub engine: Engine,
    db: PathBuf,
    dir: tempfile::TempDir,
    /// The engine's timings of every daemon this fleet boots (a restart keeps them).
    timings: EngineTuning,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Fleet {
    /// `hosts` simulated hosts and a daemon with the default engine timings.
    pub async fn spawn(hosts: usize) -> Fleet {
        Self::spawn_with(hosts, |_| {}).await
    }

    /// `hosts` simulated hosts and a daemon whose engine timings `tune` sets.
    pub async fn spawn_with(hosts: usize, tune: impl FnOnce(&mut EngineTuning)) -> Fleet {
        let mut sims = Vec::new();
        for i in 1..=hosts {
            let sim = SimHost::start(sim_config()).await.expect("simulated host");
            sims.push((format!("gpu{i:02}"), sim));
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("canaryd.db");
        // `dev_config`'s engine timings are the defaults.
        let mut timings = EngineTuning::default();
        tune(&mut timings);
        Self::boot(sims, dir, db, timings).await
    }

    async fn boot(
        sims: Vec<(String, SimHost)>,
        dir: tempfile::TempDir,
        db: PathBuf,
        timings: EngineTuning,
    ) -> Fleet {
        let mut config = fleet_config(&sims, db.clone());
        config.engine = timings;
        let app = App::build(config, fast_runbooks())
            .await
            .unwrap_or_else(|e| panic!("daemon builds: {e:#}"));
        let url = format!("http://{}", app.local_addr().expect("bound"));
        let engine = app.engine();
        let server = tokio::spawn(app.run_until_stopped(std::future::pending::<()>()));
        Fleet {
            sims,
            url,
            engine,
            db,
            dir,
            timings,
            server: Some(server),
        }
    }

    /// Dies as a crash would; the hosts and the database survive, and a new daemon boots.
    pub async fn crash_and_restart(mut self) -> Fleet {
        crash(&self.engine, self.server.take()).await;
        Self::boot(self.sims, self.dir, self.db, self.timings).await
    }

    pub fn sim(&self, host: &str) -> &SimHost {
        &self.sims.iter().find(|(n, _)| n == host).expect("host").1
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        post_json(&self.url, path, body).await
    }

    pub async fn get(&self, path: &str) -> Value {
        reqwest::get(format!("{}{path}", self.url))
            .await
            .expect("request reaches the daemon")
            .json()
            .await
            .expect("json")
    }
}

/// The daemon's config over several simulated hosts, each under its given name:
/// `dev_config`'s, with one host entry per simulated host.
fn fleet_config(sims: &[(String, SimHost)], db: PathBuf) -> canaryd::config::ResolvedConfig {
    let listen = "127.0.0.1:0".parse().expect("addr");
    let env = sim_config().initial_env;
    let mut config = canaryd::config::sim::dev_config(&sims[0].1, listen, db.clone(), env.clone());
    config.hosts.clear();
    for (name, sim) in sims {
        let one = canaryd::config::sim::dev_config(sim, listen, db.clone(), env.clone());
        let mut host = one.hosts.into_values().next().expect("one host");
        host.name = name.clone();
        config.hosts.insert(name.clone(), host);
    }
    config
}
