//! The simulated host (docs/reference.md): an in-process compose-manager on `127.0.0.1:0` that follows
//! compose-manager's contract (docs/compose-manager.md) (bearer auth, NDJSON streams ending in `done`, the dry
//! run's `plan` event, the one-operation lock and its 409, tag age, `/version`, `/status`,
//! `/docker/ps`, `/compose/logs`, `/docker/evict`), driving simulated engines that each answer
//! `/health` and `/metrics` (fed by simulated traffic) on their own loopback port and write
//! startup logs. Faults are scriptable through
//! [`SimFaults`]. Used by `canaryd dev` and the tests.
//!
//! Choices where the contract is silent:
//! - At start the host is already deployed (`initial_tag`, `services: []`) and warm: every
//!   default service runs, engines answer 200, their startup lines are in their logs.
//! - An engine's port stays bound for the host's life and answers 503 while its container is
//!   absent or exited.
//! - Every tag serves the same files; a tag's image pins (`SimTag::images`) override the
//!   file's images and are appended to the served text as a comment, so each tag has its
//!   own `file_sha256`.
//! - Engine ports are not recorded in [`SimHost::calls`]; every compose-manager request is
//!   (the latest 50 000); engine API calls are, apart ([`SimHost::api_calls`]).

mod api_fault;
mod checks;
pub mod compose_file;
mod down;
mod dry_run;
mod engine;
mod faults;
mod inspect;
mod metrics;
mod openai;
mod routes;
mod state;
mod stream;
mod up;

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use api_fault::ApiFault;
pub use faults::{SimFaults, SimOp};
pub use metrics::example_page as example_metrics_page;
use state::{sha256_hex, Shared, State, TagEntry};

/// Path of the example compose file in the repo, and in the simulated compose repo.
pub const EXAMPLE_FILE: &str = "prod/GLM-5.3-Flash-SGL-TP4-W4AFP8-LongContext.yaml";
/// The example compose file's text.
pub const EXAMPLE_YAML: &str =
    include_str!("../../prod/GLM-5.3-Flash-SGL-TP4-W4AFP8-LongContext.yaml");

/// A tag of the simulated compose repo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimTag {
    /// Tag name, e.g. `v0.0.451`.
    pub name: String,
    /// The commit it points at (40 hex); also accepted as a ref.
    pub commit: String,
    /// How old its commit is when the host starts (compared with `min_tag_age`).
    pub age: chrono::Duration,
    /// Service → image at this tag, overriding the file's `image`.
    pub images: BTreeMap<String, String>,
}

/// How to build a simulated host.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Bearer token the host accepts.
    pub token: String,
    /// File path in the repo → its YAML, the same at every tag.
    pub compose_files: BTreeMap<String, String>,
    /// The repo's tags.
    pub tags: Vec<SimTag>,
    /// `MIN_TAG_AGE_HOURS`: younger tags are refused (default 48 h).
    pub min_tag_age: chrono::Duration,
    /// How long an engine answers 503 after a (re)start (default 2 s).
    pub cold_start: std::time::Duration,
    /// Pause before each NDJSON line (default 5 ms).
    pub stream_line_delay: std::time::Duration,
    /// Behave like an older server: `/docker/evict` 404, `dry_run` ignored (a real deploy).
    pub legacy: bool,
    /// Tag deployed at start with `services: []` (default: the first tag). The first file
    /// (in path order) is the one deployed.
    pub initial_tag: Option<String>,
    /// The env map of that initial deploy.
    pub initial_env: BTreeMap<String, String>,
}

/// The engine services of the example file.
const EXAMPLE_ENGINES: [&str; 2] = [
    "model-sg-glm53-w4afp8-tp4-r1",
    "model-sg-glm53-w4afp8-tp4-r2",
];

impl SimConfig {
    /// The example: the `prod/` file, tags `v0.0.450` (30 days old), `v0.0.451` (10 days),
    /// `v0.0.452` (3 days) and `v0.0.453` (1 hour: too recent), each pinning both engines to
    /// `lmsysorg/sglang:glm53-v<N>`; `v0.0.450` deployed at start; token `sim-token`.
    pub fn example() -> Self {
        let tag = |n: u32, age: chrono::Duration| SimTag {
            name: format!("v0.0.{n}"),
            commit: sha256_hex(format!("v0.0.{n}").as_bytes())[..40].to_string(),
            age,
            images: EXAMPLE_ENGINES
                .iter()
                .map(|s| (s.to_string(), format!("lmsysorg/sglang:glm53-v{n}")))
                .collect(),
        };
        let env = [
            ("CVM_HOST", "gpu02"),
            ("GLM53_HICACHE_RAM_BUDGET", "406GiB"),
            ("GLM53_R2_HICACHE_RAM_BUDGET", "406GiB"),
            ("HUGGING_FACE_HUB_TOKEN", "hf_sim_not_a_real_token"),
            ("MONITORING_INGEST_TOKEN", "sim-monitoring-token"),
            ("PROXY_TOKEN", "sim-proxy-token"),
        ];
        SimConfig {
            token: "sim-token".to_string(),
            compose_files: BTreeMap::from([(EXAMPLE_FILE.to_string(), EXAMPLE_YAML.to_string())]),
            tags: vec![
                tag(450, chrono::Duration::days(30)),
                tag(451, chrono::Duration::days(10)),
                tag(452, chrono::Duration::days(3)),
                tag(453, chrono::Duration::hours(1)),
            ],
            min_tag_age: chrono::Duration::hours(48),
            cold_start: std::time::Duration::from_secs(2),
            stream_line_delay: std::time::Duration::from_millis(5),
            legacy: false,
            initial_tag: Some("v0.0.450".to_string()),
            initial_env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig::example()
    }
}

/// One request the host received.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedCall {
    /// `GET`, `POST`, …
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The JSON body; `Null` when empty, a string when not JSON.
    pub body: serde_json::Value,
    /// When it arrived.
    pub at: DateTime<Utc>,
}

/// One call of an engine's OpenAI-compatible API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimApiCall {
    /// The engine's service.
    pub service: String,
    /// `/v1/models` or `/v1/chat/completions`.
    pub path: String,
    /// The JSON body; `Null` when empty, a string when not JSON.
    pub body: serde_json::Value,
    /// The bearer token it carried, if any.
    pub bearer: Option<String>,
    /// When it arrived.
    pub at: DateTime<Utc>,
}

/// One container of the host's compose project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimContainer {
    /// Compose service.
    pub service: String,
    /// Container name.
    pub name: String,
    /// Full 64-hex id (`/docker/ps` shows the first 12, as docker does).
    pub id: String,
    /// Image it runs.
    pub image: String,
    /// `running` or `exited`.
    pub state: String,
    /// Last (re)start.
    pub started_at: DateTime<Utc>,
    /// Tag of the up that created it.
    pub tag: String,
}

/// A running simulated host. Dropping it (or [`SimHost::shutdown`]) stops its servers,
/// streams and engines.
pub struct SimHost {
    shared: Arc<Shared>,
    url: String,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

fn invalid(message: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, message)
}

impl SimHost {
    /// Binds the host and one port per engine on 127.0.0.1, deploys the initial tag and
    /// starts serving. Fails on a compose file that does not parse or an unknown initial tag.
    pub async fn start(cfg: SimConfig) -> std::io::Result<SimHost> {
        let mut parsed = BTreeMap::new();
        for (path, text) in &cfg.compose_files {
            let file = compose_file::parse(text).map_err(|e| invalid(format!("{path}: {e}")))?;
            parsed.insert(path.clone(), file);
        }
        let mut engine_listeners = BTreeMap::new();
        for file in parsed.values() {
            for def in file.services.values().filter(|d| engine::is_engine(d)) {
                if !engine_listeners.contains_key(&def.name) {
                    engine_listeners
                        .insert(def.name.clone(), TcpListener::bind("127.0.0.1:0").await?);
                }
            }
        }
        let mut engine_ports = BTreeMap::new();
        for (name, listener) in &engine_listeners {
            engine_ports.insert(name.clone(), listener.local_addr()?.port());
        }
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let now = Utc::now();
        let (stop, stop_rx) = watch::channel(false);
        let mut state = State::default();
        state.faults.cold_start = cfg.cold_start;
        state.faults.legacy = cfg.legacy;
        state.host_env = cfg.initial_env.clone();
        let shared = Arc::new(Shared {
            token: cfg.token.clone(),
            files: cfg.compose_files.clone(),
            parsed,
            tags: cfg
                .tags
                .iter()
                .map(|t| TagEntry {
                    tag: t.clone(),
                    committed_at: now - t.age,
                })
                .collect(),
            min_tag_age: cfg.min_tag_age,
            stream_line_delay: cfg.stream_line_delay,
            engine_ports,
            shutdown: stop_rx.clone(),
            booted_at: now,
            inner: std::sync::Mutex::new(state),
            stalled: watch::channel(0).0,
            release_stalls: watch::channel(0).0,
        });
        let initial = cfg
            .initial_tag
            .clone()
            .or_else(|| cfg.tags.first().map(|t| t.name.clone()));
        if let (Some(tag), Some(file)) = (initial, cfg.compose_files.keys().next()) {
            up::initial_deploy(&shared, file, &tag, &cfg.initial_env).map_err(invalid)?;
        }
        let mut tasks = Vec::new();
        for (service, listener) in engine_listeners {
            tasks.push(engine::serve_engine(shared.clone(), service, listener));
        }
        tasks.push(metrics::spawn_traffic(shared.clone()));
        let app = routes::router(shared.clone());
        let mut stop_main = stop_rx;
        tasks.push(tokio::spawn(async move {
            let signal = async move {
                let _ = stop_main.wait_for(|s| *s).await;
            };
            // TCP_NODELAY, as a real compose-manager answers: with Nagle on, every NDJSON
            // line after the first waited for the client's delayed ACK (about 40 ms a call).
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                let _ = tcp.set_nodelay(true);
            });
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(signal)
                .await
            {
                tracing::warn!(error = %e, "simulated compose-manager stopped");
            }
        }));
        tracing::info!(url = %url, "simulated compose-manager listening");
        Ok(SimHost {
            shared,
            url,
            stop,
            tasks,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The bearer token it accepts.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// `http://127.0.0.1:P/health` of an engine service; the port never changes.
    pub fn health_url(&self, service: &str) -> Option<String> {
        self.shared
            .engine_ports
            .get(service)
            .map(|port| format!("http://127.0.0.1:{port}/health"))
    }

    /// `http://127.0.0.1:P`: the base of an engine's OpenAI-compatible API (same port as
    /// its health).
    pub fn api_url(&self, service: &str) -> Option<String> {
        self.shared
            .engine_ports
            .get(service)
            .map(|port| format!("http://127.0.0.1:{port}"))
    }

    /// `http://127.0.0.1:P/metrics` of an engine service (same port as its health).
    pub fn metrics_url(&self, service: &str) -> Option<String> {
        self.shared
            .engine_ports
            .get(service)
            .map(|port| format!("http://127.0.0.1:{port}/metrics"))
    }

    /// Every compose-manager request received, oldest first.
    pub fn calls(&self) -> Vec<RecordedCall> {
        self.shared.state().calls.iter().cloned().collect()
    }

    /// Every call of the engines' OpenAI-compatible APIs, oldest first.
    pub fn api_calls(&self) -> Vec<SimApiCall> {
        self.shared.state().api_calls.iter().cloned().collect()
    }

    /// The project's containers (running and exited), by service.
    pub fn containers(&self) -> Vec<SimContainer> {
        self.shared
            .state()
            .containers
            .values()
            .map(|c| c.view())
            .collect()
    }

    /// A handle on the host's faults.
    pub fn faults(&self) -> SimFaults {
        SimFaults {
            shared: self.shared.clone(),
        }
    }

    /// Stops the servers, open streams and engines, and waits (at most 5 s) for them.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        let tasks = std::mem::take(&mut self.tasks);
        let wait = futures_util::future::join_all(tasks);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), wait).await;
    }
}

impl Drop for SimHost {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}
