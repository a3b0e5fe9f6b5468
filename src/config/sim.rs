//! A daemon config pointing at the simulated host (`canaryd dev`, the tests, the benches).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use canaryd_sim::SimHost;

use super::{ComposeTuning, EnvMap, HostConfig, ReplicaConfig, ResolvedConfig, Secret};

/// The example compose file the simulated host serves.
pub const DEV_FILE: &str = "prod/GLM-5.3-Flash-SGL-TP4-W4AFP8-LongContext.yaml";
/// The simulated host's name.
pub const DEV_HOST: &str = "gpu02";
/// The simulated host's first replica.
pub const R1: &str = "model-sg-glm53-w4afp8-tp4-r1";
/// Its second replica, the one canaries roll.
pub const R2: &str = "model-sg-glm53-w4afp8-tp4-r2";

/// A daemon config pointing at a simulated host (`canaryd dev`, the tests).
pub fn dev_config(
    sim: &SimHost,
    listen: SocketAddr,
    database: PathBuf,
    env: BTreeMap<String, String>,
) -> ResolvedConfig {
    let mut replicas = BTreeMap::new();
    for service in [R1, R2] {
        let health_url = sim.health_url(service).unwrap_or_default();
        let api_url = sim.api_url(service).unwrap_or_default();
        replicas.insert(
            service.to_owned(),
            ReplicaConfig {
                group: "glm53-long".to_owned(),
                health_url,
                api_url,
                api_token: None,
                metrics_url: None,
                aliases: Vec::new(),
            },
        );
    }
    let host = HostConfig {
        name: DEV_HOST.to_owned(),
        compose_manager_url: sim.url(),
        token: Secret::new(sim.token().to_owned()),
        token_env: None,
        env: EnvMap::new(env),
        project: "work".to_owned(),
        replicas,
        windows: Vec::new(),
        // The simulated host's model cache (`/host/cache`): a 1 TiB volume.
        model_cache: Some(crate::config::ModelCache {
            volume: "work_huggingface_cache".to_owned(),
            capacity: 1 << 40,
        }),
    };
    let compose = ComposeTuning {
        busy_retry_initial: Duration::from_millis(100),
        busy_retry_max: Duration::from_secs(1),
        settle_interval: Duration::from_millis(500),
        ..ComposeTuning::default()
    };
    ResolvedConfig {
        public_url: None,
        listen,
        database,
        runbooks_dir: PathBuf::from("config/dev/runbooks"),
        tokens: Vec::new(),
        hosts: BTreeMap::from([(DEV_HOST.to_owned(), host)]),
        compose,
        http: Default::default(),
        engine: Default::default(),
        retention_days: None,
        notifications: Default::default(),
        prometheus: None,
    }
}
