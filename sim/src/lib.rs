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
//! - Every tag serves the same files (`SimConfig::compose_files`) unless it carries its own
//!   (`SimTag::files`, so a tag can rename a service); a dry run, an up, a down and a logs
//!   call use the file at the tag that fetched it. A tag's image pins (`SimTag::images`)
//!   override the file's images and are appended to the served text as a comment, so each
//!   tag has its own `file_sha256`.
//! - Engine ports are not recorded in [`SimHost::calls`]; every compose-manager request is
//!   (the latest 50 000); engine API calls are, apart ([`SimHost::api_calls`]), and so are
//!   the reads of their `/health` and `/metrics` ([`SimHost::engine_reads`]).

mod api_fault;
mod checks;
pub mod compose_file;
mod down;
mod dry_run;
mod engine;
mod engine_server;
mod fault_state;
mod faults;
mod inspect;
mod metrics;
mod openai;
mod routes;
mod state;
mod stream;
mod traffic;
mod up;

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use api_fault::ApiFault;
pub use fault_state::SimOp;
pub use faults::SimFaults;
use state::{sha256_hex, Shared, State, TagEntry};
pub use traffic::{example_page as example_metrics_page, pages_around_traffic};

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
    /// The files this tag serves (path → YAML) instead of `SimConfig::compose_files`;
    /// `None`: those.
    pub files: Option<BTreeMap<String, String>>,
}

/// How to build a simulated host.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Bearer token the host accepts.
    pub token: String,
    /// File path in the repo → its YAML, the same at every tag without files of its own.
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
    /// (in path order) of that tag is the one deployed.
    pub initial_tag: Option<String>,
    /// The env map of that initial deploy.
    pub initial_env: BTreeMap<String, String>,
    /// Engine service → the engine service whose loopback port it answers on: a renamed
    /// replica keeps its host port, so both names share one health URL (the one running
    /// answers).
    pub port_aliases: BTreeMap<String, String>,
}

/// The real long-context file of gpu02 (`tests/fixtures/real-compose/`, unchanged): its
/// full service set, `verification` and `maintenance` profiles and TP2 `r2a`/`r2b` included.
pub const LONG_CONTEXT_YAML: &str =
    include_str!("../../tests/fixtures/real-compose/GLM-5.3-Flash-SGL-TP4-W4AFP8-LongContext.yaml");
/// r2's service before the long-context rollout renamed it (tags `v0.0.450`, `v0.0.451` of
/// [`SimConfig::long_context`]).
pub const LONG_CONTEXT_OLD_R2: &str = "model-sg-glm53-fp8-tp4-r2";
/// r2's service in the real file (tags `v0.0.452`, `v0.0.453`).
pub const LONG_CONTEXT_NEW_R2: &str = "model-sg-glm53-w4afp8-tp4-r2";
/// r1's service (never renamed).
pub const LONG_CONTEXT_R1: &str = "model-sg-glm53-w4afp8-tp4-r1";

/// The long-context file as it was before the rollout: the real file with r2's service
/// (its key, `container_name`, and every reference to it: the proxy's backends, the
/// collector's scrape labels, the perception check's targets) named
/// [`LONG_CONTEXT_OLD_R2`]. Nothing else differs.
pub fn long_context_old_yaml() -> String {
    LONG_CONTEXT_YAML.replace(LONG_CONTEXT_NEW_R2, LONG_CONTEXT_OLD_R2)
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
            files: None,
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
            port_aliases: BTreeMap::new(),
            initial_env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }
}

impl SimConfig {
    /// gpu02's long-context host as Procedure A found it: the real file
    /// ([`LONG_CONTEXT_YAML`]) at `prod/GLM-5.3-Flash-SGL-TP4-W4AFP8-LongContext.yaml`,
    /// served by tags `v0.0.452` (3 days old) and `v0.0.453` (1 hour: too recent), while
    /// `v0.0.450` (30 days) and `v0.0.451` (10 days) serve it with r2 named
    /// [`LONG_CONTEXT_OLD_R2`] ([`long_context_old_yaml`]). `v0.0.451` is deployed at start
    /// (every default service: r1, the old r2, r2a/r2b, proxy, nginx, registrar, DCGM,
    /// collector; the `verification` and `maintenance` services stay absent). The env map
    /// holds every variable the file requires. Token `sim-token`.
    pub fn long_context() -> Self {
        let old = BTreeMap::from([(EXAMPLE_FILE.to_string(), long_context_old_yaml())]);
        let new = BTreeMap::from([(EXAMPLE_FILE.to_string(), LONG_CONTEXT_YAML.to_string())]);
        let tag = |n: u32, age: chrono::Duration, files: &BTreeMap<String, String>| SimTag {
            name: format!("v0.0.{n}"),
            commit: sha256_hex(format!("v0.0.{n}").as_bytes())[..40].to_string(),
            age,
            images: BTreeMap::new(),
            files: Some(files.clone()),
        };
        let env = [
            ("CVM_HOST", "gpu02"),
            ("CVM_NAME", "gpu02-cvm"),
            ("ENV", "sim"),
            ("HOST_IP", "127.0.0.1"),
            ("GLM53_HICACHE_RAM_BUDGET", "406GiB"),
            ("GLM53_R2_HICACHE_RAM_BUDGET", "406GiB"),
            ("HUGGING_FACE_HUB_TOKEN", "hf_sim_not_a_real_token"),
            ("MODEL_NAME", "graphistry/GLM-5.3-Flash-W4AFP8"),
            ("MODEL_PROXY_TOKEN", "sim-model-proxy-token"),
            ("MONITORING_INGEST_TOKEN", "sim-monitoring-token"),
            ("PROXY_TOKEN", "sim-proxy-token"),
        ];
        SimConfig {
            compose_files: new.clone(),
            tags: vec![
                tag(450, chrono::Duration::days(30), &old),
                tag(451, chrono::Duration::days(10), &old),
                tag(452, chrono::Duration::days(3), &new),
                tag(453, chrono::Duration::hours(1), &new),
            ],
            initial_tag: Some("v0.0.451".to_string()),
            port_aliases: BTreeMap::from([(
                LONG_CONTEXT_OLD_R2.to_string(),
                LONG_CONTEXT_NEW_R2.to_string(),
            )]),
            initial_env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..SimConfig::example()
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

/// One read of an engine's `/health` or `/metrics` page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimEngineRead {
    /// The engine's service.
    pub service: String,
    /// `/health` or `/metrics`.
    pub path: String,
    /// The status it answered.
    pub status: u16,
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
        let parse_all = |files: &BTreeMap<String, String>| {
            let mut parsed = BTreeMap::new();
            for (path, text) in files {
                let file =
                    compose_file::parse(text).map_err(|e| invalid(format!("{path}: {e}")))?;
                parsed.insert(path.clone(), file);
            }
            Ok::<_, std::io::Error>(parsed)
        };
        let parsed = parse_all(&cfg.compose_files)?;
        let mut tag_parsed = BTreeMap::new();
        for tag in &cfg.tags {
            if let Some(files) = &tag.files {
                let files =
                    parse_all(files).map_err(|e| invalid(format!("tag {}: {e}", tag.name)))?;
                tag_parsed.insert(tag.name.clone(), files);
            }
        }
        let mut engine_listeners = BTreeMap::new();
        for file in parsed
            .values()
            .chain(tag_parsed.values().flat_map(|f| f.values()))
        {
            for def in file.services.values().filter(|d| engine::is_engine(d)) {
                let owner = cfg.port_aliases.get(&def.name).unwrap_or(&def.name);
                if !engine_listeners.contains_key(owner) {
                    engine_listeners.insert(owner.clone(), TcpListener::bind("127.0.0.1:0").await?);
                }
            }
        }
        let mut engine_ports = BTreeMap::new();
        for (name, listener) in &engine_listeners {
            engine_ports.insert(name.clone(), listener.local_addr()?.port());
        }
        for (alias, owner) in &cfg.port_aliases {
            if let Some(port) = engine_ports.get(owner).copied() {
                engine_ports.insert(alias.clone(), port);
            }
        }
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let now = Utc::now();
        let (stop, stop_rx) = watch::channel(false);
        let mut state = State::default();
        state.faults.cold_start = cfg.cold_start;
        state.faults.legacy = cfg.legacy;
        state.host_env = cfg.initial_env.clone();
        // The engines' model cache holds what the running engines load.
        state
            .cache_volumes
            .insert(state::HF_VOLUME.to_owned(), 180 << 30);
        state.cached_weights = vec!["models--zai-org--GLM-5.3-Flash-W4AFP8".to_owned()];
        let shared = Arc::new(Shared {
            token: cfg.token.clone(),
            files: cfg.compose_files.clone(),
            parsed,
            tag_parsed,
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
        if let Some(tag) = initial {
            let files = cfg
                .tags
                .iter()
                .find(|t| t.name == tag)
                .and_then(|t| t.files.as_ref())
                .unwrap_or(&cfg.compose_files);
            if let Some(file) = files.keys().next() {
                up::initial_deploy(&shared, file, &tag, &cfg.initial_env).map_err(invalid)?;
            }
        }
        let mut tasks = Vec::new();
        for (service, listener) in engine_listeners {
            let mut names = vec![service.clone()];
            names.extend(
                cfg.port_aliases
                    .iter()
                    .filter(|(_, owner)| **owner == service)
                    .map(|(alias, _)| alias.clone()),
            );
            tasks.push(engine_server::serve_engine(shared.clone(), names, listener));
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

    /// Every read of an engine's `/health` or `/metrics`, oldest first.
    pub fn engine_reads(&self) -> Vec<SimEngineRead> {
        self.shared.state().engine_reads.iter().cloned().collect()
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
