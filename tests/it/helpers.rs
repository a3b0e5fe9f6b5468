//! `TestApp`: the real daemon on 127.0.0.1:0 with a temp SQLite file, against a simulated host.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::LazyLock;
use std::time::Duration;

use canaryd::api::RolloutOut;
use canaryd::app::App;
use canaryd::cli::ApiClient;
use canaryd::config::sim::dev_config;
use canaryd::config::{ApiToken, Role, Secret};
use canaryd::domain::runbook::{self, Runbook};
use canaryd::engine::Engine;
use canaryd::testing::{self, Timings};
use canaryd_sim::{RecordedCall, SimConfig, SimHost};
use serde_json::{json, Value};

pub const HOST: &str = "gpu02";
pub const FILE: &str = "prod/GLM-5.3-Flash-SGL-TP4-W4AFP8-LongContext.yaml";
pub const R1: &str = "model-sg-glm53-w4afp8-tp4-r1";
pub const R2: &str = "model-sg-glm53-w4afp8-tp4-r2";

/// The shipped canary sequence with millisecond timings.
pub static FAST_CANARY: LazyLock<String> =
    LazyLock::new(|| testing::canary("test canary", &Timings::TESTS));

/// The shipped rollback sequence (the canary without its soak) with millisecond timings.
pub static FAST_ROLLBACK: LazyLock<String> =
    LazyLock::new(|| testing::canary_until("test rollback", &Timings::TESTS, "startup-logs"));

pub const FAST_RECREATE: &str = r#"
description: test recreate in place
steps:
  - {name: snapshot, kind: snapshot}
  - {name: peers, kind: peers_healthy, timeout: 3s}
  - {name: plan, kind: plan, allow: [model-downloader]}
  - {name: up, kind: up, timeout: 5s}
  - {name: neighbours, kind: verify_neighbours}
  - {name: health, kind: wait_health, timeout: 3s, interval: 50ms, consecutive: 2}
"#;

/// The health step of `FAST_CANARY` and `FAST_ROLLBACK`, after which a smoke step goes.
const FAST_HEALTH: &str =
    "  - {name: health, kind: wait_health, timeout: 3s, interval: 50ms, consecutive: 2}\n";

/// The shipped runbooks' smoke step with test timings.
pub const FAST_SMOKE: &str = r#"  - {name: smoke, kind: smoke, model: z-ai/glm-5.3-flash, prompt: "Reply with the word ready.", max_tokens: 16, expect: ["re:(?i)ready"], repeat: 2, timeout: 2s}"#;

/// The fast runbooks with a smoke step after `health`: `canary_smoke` (a YAML step line) in
/// the canary, [`FAST_SMOKE`] in the rollback, as the shipped runbooks have.
#[allow(dead_code)]
pub fn with_smoke(canary_smoke: &str) -> BTreeMap<String, Runbook> {
    let add = |text: &str, smoke: &str| {
        assert!(
            text.contains(FAST_HEALTH),
            "the runbook has the health step"
        );
        text.replace(FAST_HEALTH, &format!("{FAST_HEALTH}{smoke}\n"))
    };
    let mut books = fast_runbooks();
    for (name, text, smoke) in [
        ("single-replica-canary", FAST_CANARY.as_str(), canary_smoke),
        (
            "single-replica-rollback",
            FAST_ROLLBACK.as_str(),
            FAST_SMOKE,
        ),
    ] {
        let rb = runbook::parse(name, "with smoke", &add(text, smoke)).expect("runbook with smoke");
        books.insert(name.to_owned(), rb);
    }
    books
}

/// The fast runbooks, with the canary's text edited (`from` → `to`, each must match).
#[allow(dead_code)]
pub fn canary_with(edits: &[(&str, &str)]) -> BTreeMap<String, Runbook> {
    let mut text = FAST_CANARY.clone();
    for (from, to) in edits {
        assert!(text.contains(from), "FAST_CANARY has {from}");
        text = text.replace(from, to);
    }
    let mut books = fast_runbooks();
    let rb = runbook::parse("single-replica-canary", "edited", &text).expect("edited runbook");
    books.insert("single-replica-canary".to_owned(), rb);
    books
}

pub fn fast_runbooks() -> BTreeMap<String, Runbook> {
    [
        ("single-replica-canary", FAST_CANARY.as_str()),
        ("single-replica-rollback", FAST_ROLLBACK.as_str()),
        ("recreate-in-place", FAST_RECREATE),
    ]
    .into_iter()
    .map(|(name, yaml)| {
        (
            name.to_owned(),
            runbook::parse(name, name, yaml).expect("test runbook parses"),
        )
    })
    .collect()
}

/// Stops a daemon as a crash would: every rollout task and the listener die where they are,
/// and its SQLite connections close (any open transaction with them), as with the process.
pub async fn crash(engine: &Engine, server: Option<tokio::task::JoinHandle<std::io::Result<()>>>) {
    engine.kill();
    if let Some(server) = server {
        server.abort();
        let _ = server.await;
    }
    let closed = tokio::time::timeout(Duration::from_secs(5), engine.store().close());
    assert!(closed.await.is_ok(), "the dead daemon's database closes");
}

/// POSTs `body` as JSON to the daemon at `base`; returns (status, body; `Null` if not JSON).
pub async fn post_json(base: &str, path: &str, body: &Value) -> (u16, Value) {
    let res = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .expect("request reaches the daemon");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

/// The simulated host as the tests use it: the example, with a short cold start.
pub fn sim_config() -> SimConfig {
    let mut cfg = SimConfig::example();
    cfg.cold_start = Duration::from_millis(300);
    cfg.stream_line_delay = Duration::from_millis(1);
    cfg
}

/// How a `TestApp` boots, beyond the simulated host.
#[derive(Clone, Default)]
pub struct TestOptions {
    /// Runbooks (default: `fast_runbooks()`).
    pub runbooks: Option<BTreeMap<String, Runbook>>,
    /// API tokens as (name, role, secret); empty is dev mode (anonymous operator).
    pub tokens: Vec<(String, Role, String)>,
    /// compose-manager client timings (default: `dev_config`'s).
    pub tuning: Option<canaryd::config::ComposeTuning>,
    /// Replicas moved to another group, as (service, group).
    pub groups: Vec<(String, String)>,
    /// The API server's read timeouts (default: the config's defaults).
    pub http: Option<canaryd::config::HttpTuning>,
    /// Bearer token of every replica's OpenAI-compatible API (`api_token_env`).
    pub api_token: Option<String>,
    /// The config's `prometheus:` server (none by default).
    pub prometheus: Option<canaryd::config::PrometheusConfig>,
    /// Former names of replicas (`aliases:`), as (service, aliases).
    pub aliases: Vec<(String, Vec<String>)>,
    /// The config's `notifications:` (none by default).
    pub notifications: Option<canaryd::config::NotificationsConfig>,
    /// The engine's timings (default: `dev_config`'s).
    pub engine: Option<canaryd::config::EngineTuning>,
    /// Every host's low-traffic windows (none by default).
    pub windows: Vec<canaryd::domain::window::TrafficWindow>,
}

#[allow(dead_code)] // not every test module uses every helper
impl TestOptions {
    /// The three roles (docs/reference.md#http-api), with these secrets.
    pub fn with_tokens(operator: &str, oncall: &str, viewer: &str) -> Self {
        TestOptions {
            runbooks: None,
            tuning: None,
            groups: Vec::new(),
            http: None,
            api_token: None,
            prometheus: None,
            aliases: Vec::new(),
            notifications: None,
            engine: None,
            windows: Vec::new(),
            tokens: vec![
                ("ops-alice".into(), Role::Operator, operator.into()),
                ("oncall".into(), Role::Oncall, oncall.into()),
                ("audit".into(), Role::Viewer, viewer.into()),
            ],
        }
    }
}

pub struct TestApp {
    pub sim: SimHost,
    pub api: ApiClient,
    pub url: String,
    pub db: PathBuf,
    pub env: BTreeMap<String, String>,
    pub engine: Engine,
    opts: TestOptions,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    _dir: tempfile::TempDir,
}

/// A daemon stopped the hard way: its simulated host and database survive for a restart.
pub struct Crashed {
    pub sim: SimHost,
    pub db: PathBuf,
    env: BTreeMap<String, String>,
    opts: TestOptions,
    dir: tempfile::TempDir,
}

impl Crashed {
    /// Boots a new daemon on the same database and host (restart recovery runs first).
    pub async fn restart(self) -> TestApp {
        TestApp::boot_with(self.sim, self.dir, self.db, self.env, self.opts).await
    }

    /// Restarts with other runbooks (a config changed while the daemon was down).
    #[allow(dead_code)]
    pub async fn restart_with_runbooks(mut self, runbooks: BTreeMap<String, Runbook>) -> TestApp {
        self.opts.runbooks = Some(runbooks);
        self.restart().await
    }
}

impl TestApp {
    pub async fn spawn() -> TestApp {
        Self::spawn_with(sim_config()).await
    }

    pub async fn spawn_with(cfg: SimConfig) -> TestApp {
        let env = cfg.initial_env.clone();
        let sim = SimHost::start(cfg).await.expect("simulated host starts");
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("canaryd.db");
        Self::boot(sim, dir, db, env).await
    }

    /// Boots with tokens and/or other runbooks.
    #[allow(dead_code)]
    pub async fn spawn_custom(cfg: SimConfig, opts: TestOptions) -> TestApp {
        let env = cfg.initial_env.clone();
        let sim = SimHost::start(cfg).await.expect("simulated host starts");
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("canaryd.db");
        Self::boot_with(sim, dir, db, env, opts).await
    }

    /// Boots with the three roles' tokens (docs/reference.md#http-api); `api` uses the operator's.
    #[allow(dead_code)]
    pub async fn spawn_with_tokens(operator: &str, oncall: &str, viewer: &str) -> TestApp {
        Self::spawn_custom(
            sim_config(),
            TestOptions::with_tokens(operator, oncall, viewer),
        )
        .await
    }

    async fn boot(
        sim: SimHost,
        dir: tempfile::TempDir,
        db: PathBuf,
        env: BTreeMap<String, String>,
    ) -> TestApp {
        Self::boot_with(sim, dir, db, env, TestOptions::default()).await
    }

    async fn boot_with(
        sim: SimHost,
        dir: tempfile::TempDir,
        db: PathBuf,
        env: BTreeMap<String, String>,
        opts: TestOptions,
    ) -> TestApp {
        let listen = "127.0.0.1:0".parse().expect("addr");
        let mut config = dev_config(&sim, listen, db.clone(), env.clone());
        config.tokens = opts
            .tokens
            .iter()
            .map(|(name, role, secret)| ApiToken {
                name: name.clone(),
                role: *role,
                secret: Secret::new(secret.clone()),
            })
            .collect();
        if let Some(tuning) = &opts.tuning {
            config.compose = tuning.clone();
        }
        if let Some(http) = &opts.http {
            config.http = http.clone();
        }
        config.prometheus = opts.prometheus.clone();
        if let Some(notifications) = &opts.notifications {
            config.notifications = notifications.clone();
        }
        if let Some(engine) = opts.engine {
            config.engine = engine;
        }
        for host in config.hosts.values_mut() {
            for replica in host.replicas.values_mut() {
                replica.api_token = opts.api_token.clone().map(Secret::new);
            }
        }
        for host in config.hosts.values_mut() {
            host.windows = opts.windows.clone();
        }
        for (service, aliases) in &opts.aliases {
            for host in config.hosts.values_mut() {
                if let Some(replica) = host.replicas.get_mut(service) {
                    replica.aliases = aliases.clone();
                }
            }
        }
        for (service, group) in &opts.groups {
            for host in config.hosts.values_mut() {
                if let Some(replica) = host.replicas.get_mut(service) {
                    replica.group = group.clone();
                }
            }
        }
        let runbooks = opts.runbooks.clone().unwrap_or_else(fast_runbooks);
        let app = App::build(config, runbooks)
            .await
            .unwrap_or_else(|e| panic!("daemon builds: {e:#}"))
            .with_shutdown_grace(Duration::from_secs(3));
        let url = format!("http://{}", app.local_addr().expect("bound"));
        let engine = app.engine();
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(app.run_until_stopped(async {
            let _ = rx.await;
        }));
        let token = opts
            .tokens
            .iter()
            .find(|t| t.1 == Role::Operator)
            .map(|t| t.2.clone());
        let api = ApiClient::new(&url, token).expect("client");
        TestApp {
            sim,
            api,
            url,
            db,
            env,
            engine,
            opts,
            stop: Some(stop),
            server: Some(server),
            _dir: dir,
        }
    }

    /// Stops the daemon as a crash would: the listener and every rollout task die where they
    /// are, nothing more is written. The host and the database stay.
    pub async fn kill(mut self) -> Crashed {
        crash(&self.engine, self.server.take()).await;
        Crashed {
            sim: self.sim,
            db: self.db,
            env: self.env,
            opts: self.opts,
            dir: self._dir,
        }
    }

    /// Stops the daemon gracefully (as on SIGTERM) and keeps host and database for a restart.
    #[allow(dead_code)]
    pub async fn stop_gracefully(mut self) -> Crashed {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
        Crashed {
            sim: self.sim,
            db: self.db,
            env: self.env,
            opts: self.opts,
            dir: self._dir,
        }
    }

    /// Every audit event of a rollout, oldest first, straight from SQLite.
    pub async fn audit_kinds(&self, id: &str) -> Vec<String> {
        self.engine
            .store()
            .audit_events(id, 0)
            .await
            .expect("audit events")
            .into_iter()
            .map(|e| e.kind.as_str().to_owned())
            .collect()
    }

    /// A canary plan of r2 to `tag`.
    pub fn plan(tag: &str) -> Value {
        json!({"host": HOST, "file": FILE, "service": R2, "tag": tag, "reason": "test canary"})
    }

    /// POSTs a plan; returns (status, body).
    pub async fn post_plan(&self, plan: &Value) -> (u16, Value) {
        self.post("/v1/rollouts", plan).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        post_json(&self.url, path, body).await
    }

    /// Starts a canary and returns its id (panics if refused).
    pub async fn start_canary(&self, plan: &Value) -> String {
        let (status, body) = self.post_plan(plan).await;
        assert_eq!(status, 201, "plan accepted: {body}");
        body["id"].as_str().expect("id").to_owned()
    }

    pub async fn rollout(&self, id: &str) -> RolloutOut {
        self.api.rollout(id).await.expect("rollout readable")
    }

    /// Polls until the rollout is terminal (bounded: 300 × 50 ms).
    pub async fn wait_terminal(&self, id: &str) -> RolloutOut {
        for _ in 0..300 {
            let r = self.rollout(id).await;
            if matches!(r.status.as_str(), "succeeded" | "failed" | "aborted") {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "rollout {id} did not finish in 15 s: {:#?}",
            self.rollout(id).await
        );
    }

    /// Polls until a step of the rollout reaches `status` (bounded: 200 × 25 ms).
    pub async fn wait_step(&self, id: &str, step: &str, status: &str) -> RolloutOut {
        for _ in 0..200 {
            let r = self.rollout(id).await;
            if r.steps.iter().any(|s| s.name == step && s.status == status) {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!(
            "step {step} of {id} never became {status}: {:#?}",
            self.rollout(id).await
        );
    }

    /// Compose-manager calls with side effects or a dry run, as (path, body), in order.
    pub fn compose_calls(&self) -> Vec<RecordedCall> {
        self.sim
            .calls()
            .into_iter()
            .filter(|c| c.path.starts_with("/compose/up") || c.path.starts_with("/compose/down"))
            .collect()
    }

    pub fn container_id(&self, service: &str) -> Option<String> {
        self.sim
            .containers()
            .into_iter()
            .find(|c| c.service == service)
            .map(|c| c.id)
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
        self.sim.shutdown().await;
    }
}

/// Whether a compose call body is a dry run.
pub fn is_dry_run(call: &RecordedCall) -> bool {
    call.body.get("dry_run").and_then(Value::as_bool) == Some(true)
}

/// Step `name` of rollout `r`; panics naming it (and showing the rollout) when it has none.
pub fn step<'a>(r: &'a canaryd::api::RolloutOut, name: &str) -> &'a canaryd::api::StepOut {
    r.steps
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no step {name}: {r:#?}"))
}

/// The stored verdict of check `name` of the rollout's `analysis` step.
pub fn check<'a>(r: &'a canaryd::api::RolloutOut, name: &str) -> &'a serde_json::Value {
    step(r, "analysis").detail["checks"]
        .as_array()
        .and_then(|checks| checks.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no check {name} in {:#}", step(r, "analysis").detail))
}

/// `v` as a number; panics showing it otherwise.
pub fn number(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The `canaryd` binary run as a client of the daemon at `server` (no token in the
/// environment), blocking only the thread it runs on.
pub(crate) fn canaryd(args: &[&str], server: &str) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_canaryd"))
        .args(args)
        .env("CANARYD_SERVER", server)
        .env_remove("CANARYD_TOKEN")
        .output()
        .expect("the canaryd binary runs")
}

/// [`canaryd`] off the runtime's threads, for a test whose daemon runs in the same runtime.
pub(crate) async fn canaryd_async(args: &[&str], server: &str) -> std::process::Output {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let server = server.to_owned();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        canaryd(&args, &server)
    })
    .await
    .expect("join")
}
