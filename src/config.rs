//! Configuration (docs/configuration.md): `config/canaryd.yaml`, resolved into a
//! [`ResolvedConfig`].
//!
//! Loading reads the YAML (unknown keys refused), resolves relative paths against the config
//! file's folder, reads every host's env file, takes every secret from the env var named in
//! the file, and checks URLs, names and durations. Errors print as `file:line: key: message`,
//! so `canaryd serve` can stop with exit code 2 and point at the culprit. Secrets are held in
//! [`Secret`] and [`EnvMap`], whose `Debug` never shows a value.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::domain::analysis::AnalysisSource;
use crate::domain::plan::KnownTargets;
use crate::domain::runbook::{Runbook, RunbookError, StepKind};
use crate::domain::yaml_line::{locate, Seg};

mod env_file;
mod file;
pub mod sim;
mod url;

/// The daemon's configuration, every path resolved and every secret loaded.
#[derive(Debug, Clone)]
pub struct ResolvedConfig {
    /// Address the HTTP API listens on.
    pub listen: SocketAddr,
    /// SQLite file (created and migrated at start).
    pub database: PathBuf,
    /// Folder of `*.yaml` runbooks.
    pub runbooks_dir: PathBuf,
    /// API bearer tokens. Empty means no auth, which `serve` only allows on loopback.
    pub tokens: Vec<ApiToken>,
    /// Hosts by name.
    pub hosts: BTreeMap<String, HostConfig>,
    /// compose-manager client timings.
    pub compose: ComposeTuning,
    /// The API server's read timeouts.
    pub http: HttpTuning,
    /// The rollout engine's own timings.
    pub engine: EngineTuning,
    /// How long finished rollouts are kept; `None` keeps them forever.
    pub retention_days: Option<u32>,
    /// Webhook notifications (none unless configured).
    pub notifications: NotificationsConfig,
    /// The Prometheus server `analyze` steps with `source: prometheus` query (none unless
    /// configured; a runbook that needs it is refused at start without it).
    pub prometheus: Option<PrometheusConfig>,
    /// The daemon's address as people reach it (`https://canaryd.example.com`, no trailing
    /// slash): the rollout pages' links in `canaryd show` and in notifications. None: no link.
    pub public_url: Option<String>,
}

/// A Prometheus server (`prometheus:` in the config; optional).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrometheusConfig {
    /// `http(s)://host[:port][/path]`, without a trailing slash; `/api/v1/query` is appended.
    pub url: String,
    /// Bearer token (`token_env` in the file), if the server wants one.
    pub token: Option<Secret>,
}

/// Webhook notifications (`notifications:` in the config; optional).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NotificationsConfig {
    /// Where notifications go.
    pub webhooks: Vec<WebhookConfig>,
    /// Delivery timings and retries.
    pub delivery: DeliveryTuning,
}

/// One webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookConfig {
    /// Names the webhook in logs and in the outbox.
    pub name: String,
    /// Where to POST; may hold a token, hence a [`Secret`] (`url_env` in the file).
    pub url: Secret,
    /// Body shape.
    pub format: WebhookFormat,
    /// The events it receives (every event unless configured).
    pub events: BTreeSet<crate::domain::notification::NotifyEvent>,
}

/// The body a webhook receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum WebhookFormat {
    /// The whole notification as JSON (`id`, `event`, `rollout`, `step`, `error`, `text`).
    #[default]
    Json,
    /// Slack-compatible incoming webhook: `{"text": "..."}`.
    Slack,
}

/// Webhook delivery timings (`notifications:` keys; all optional).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryTuning {
    /// Timeout of one POST, connect included (default 10s).
    pub timeout: Duration,
    /// First retry delay after a failed attempt; doubles per attempt (default 1s).
    pub retry_initial: Duration,
    /// Retry delay cap (default 5m).
    pub retry_max: Duration,
    /// Attempts before a delivery is given up and marked `failed` (default 50).
    pub max_attempts: u32,
    /// How soon the outbox is checked again after a pass that failed on the database
    /// (default 1s); otherwise the notifier is woken by the commits that write to it.
    pub poll_interval: Duration,
}

impl Default for DeliveryTuning {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
            retry_initial: Duration::from_secs(1),
            retry_max: Duration::from_secs(5 * 60),
            max_attempts: 50,
            poll_interval: Duration::from_secs(1),
        }
    }
}

/// One API token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiToken {
    /// Who holds it; recorded as the actor of what it does.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// The bearer value.
    pub secret: Secret,
}

/// What a token may do: `viewer` reads; `oncall` reads, aborts and rolls back; `operator`
/// does everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Read only.
    Viewer,
    /// Read, abort, roll back.
    Oncall,
    /// Everything, including starting canaries.
    Operator,
}

impl Role {
    /// `viewer`, `oncall` or `operator`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Viewer => "viewer",
            Self::Oncall => "oncall",
            Self::Operator => "operator",
        }
    }

    /// Every role may read.
    pub fn can_read(self) -> bool {
        true
    }

    /// Oncall and operator may start a rollback.
    pub fn can_rollback(self) -> bool {
        matches!(self, Self::Oncall | Self::Operator)
    }

    /// Oncall and operator may abort a rollout.
    pub fn can_abort(self) -> bool {
        matches!(self, Self::Oncall | Self::Operator)
    }

    /// Only operators start canaries.
    pub fn can_operate(self) -> bool {
        matches!(self, Self::Operator)
    }
}

/// One GPU host and its compose-manager.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The key under `hosts:` (`gpu02`).
    pub name: String,
    /// `http(s)://host[:port]`, without a trailing slash.
    pub compose_manager_url: String,
    /// compose-manager bearer token.
    pub token: Secret,
    /// The env var the token was read from (`token_env`); `None` when it came from elsewhere
    /// (`canaryd dev`'s simulated host).
    pub token_env: Option<String>,
    /// The host's full env map (from its env file), sent on every compose call.
    pub env: EnvMap,
    /// Compose project; `work` (compose-manager's default) unless configured. compose-manager
    /// refuses `work` as an explicit override, so callers omit the field for it.
    pub project: String,
    /// Replicas (compose services) canaryd may roll, by service name.
    pub replicas: BTreeMap<String, ReplicaConfig>,
    /// Low-traffic windows (UTC) a canary's `window` step waits for; none: it never waits.
    pub windows: Vec<crate::domain::window::TrafficWindow>,
    /// The engines' model-cache volume and its size, for a weights pre-stage's free-space
    /// gate (`free_space`); none: that gate fails, nothing sent.
    pub model_cache: Option<ModelCache>,
}

/// A host's model-cache volume (as compose-manager's `GET /host/cache` names it) and its
/// capacity in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelCache {
    pub volume: String,
    pub capacity: u64,
}

/// One replica canaryd may roll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaConfig {
    /// Replicas of the same group on a host are each other's peers.
    pub group: String,
    /// The replica's `/health` URL.
    pub health_url: String,
    /// Base URL of the engine's OpenAI-compatible API (`/v1/models`, `/v1/chat/completions`
    /// are appended); the origin of `health_url` unless configured.
    pub api_url: String,
    /// Bearer token for that API (`api_token_env` in the file), if it wants one.
    pub api_token: Option<Secret>,
    /// The engine's Prometheus page, when not the origin of `health_url` + `/metrics`.
    pub metrics_url: Option<String>,
    /// The replica's former service names (a compose file renamed it): the same slot, so
    /// its group, health URL, history and rollback follow it under any of them
    /// (docs/reference.md#renamed-replicas).
    pub aliases: Vec<String>,
}

impl ReplicaConfig {
    /// The engine's Prometheus page: `metrics_url`, or the origin of `health_url` +
    /// `/metrics`.
    pub fn metrics_url(&self) -> String {
        if let Some(url) = &self.metrics_url {
            return url.clone();
        }
        let after_scheme = self.health_url.find("://").map_or(0, |i| i + 3);
        let origin_end = self.health_url[after_scheme..]
            .find('/')
            .map_or(self.health_url.len(), |i| after_scheme + i);
        format!("{}/metrics", &self.health_url[..origin_end])
    }
}

impl HostConfig {
    /// Where this host's token comes from, for a message that tells what to fix:
    /// `the env var CANARYD_GPU02_TOKEN (hosts.gpu02.token_env)`.
    pub fn token_source(&self) -> String {
        match &self.token_env {
            Some(var) => format!("the env var {var} (hosts.{}.token_env)", self.name),
            None => format!("the env var named by hosts.{}.token_env", self.name),
        }
    }

    /// The other replicas of `service`'s group on this host (empty for an unknown service).
    /// A former name (`aliases`) stands for its replica.
    pub fn peers(&self, service: &str) -> Vec<&str> {
        let Some((slot, me)) = self.replica(service) else {
            return Vec::new();
        };
        self.replicas
            .iter()
            .filter(|(name, r)| name.as_str() != slot && r.group == me.group)
            .map(|(name, _)| name.as_str())
            .collect()
    }

    /// The replica configured under `name` or with `name` among its `aliases`: its key
    /// (the slot) and config.
    pub fn replica(&self, name: &str) -> Option<(&str, &ReplicaConfig)> {
        if let Some((key, r)) = self.replicas.get_key_value(name) {
            return Some((key.as_str(), r));
        }
        self.replicas
            .iter()
            .find(|(_, r)| r.aliases.iter().any(|a| a == name))
            .map(|(key, r)| (key.as_str(), r))
    }

    /// Whether `name` is a replica of this host under its name or a former one: never a
    /// companion service (safety rule 15).
    pub fn is_replica_name(&self, name: &str) -> bool {
        self.replica(name).is_some()
    }
}

/// compose-manager client timings (`compose:` in the config; all optional).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComposeTuning {
    /// TCP connect timeout (default 5s).
    pub connect_timeout: Duration,
    /// Timeout of a non-streaming call: ps, logs, status, version (default 30s).
    pub request_timeout: Duration,
    /// Longest silence allowed inside an NDJSON stream (default 15m: a `down` waits out the
    /// engines' 5m stop grace without printing).
    pub stream_idle_timeout: Duration,
    /// First backoff after a `409` busy answer (default 2s).
    pub busy_retry_initial: Duration,
    /// Backoff cap (default 60s).
    pub busy_retry_max: Duration,
    /// After a compose call whose outcome is unknown, the target's container must look the
    /// same in two `GET /docker/ps` reads this far apart before anything else is sent
    /// (default 5s): compose-manager frees its lock with the HTTP stream, not with the
    /// `docker compose` child, so `/status` can read idle while the child still works.
    pub settle_interval: Duration,
    /// The companion services a runbook step may `force_recreate` (default
    /// `[otelcol-contrib]`, the one exception the runbooks name). Never a replica.
    pub force_recreate_allowed: Vec<String>,
}

impl Default for ComposeTuning {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            stream_idle_timeout: Duration::from_secs(15 * 60),
            busy_retry_initial: Duration::from_secs(2),
            busy_retry_max: Duration::from_secs(60),
            settle_interval: Duration::from_secs(5),
            force_recreate_allowed: vec!["otelcol-contrib".to_owned()],
        }
    }
}

/// The rollout engine's own timings (`engine:` in the config; all optional). The defaults are
/// what canaryd always used; each is a trade-off an operator may need to move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineTuning {
    /// Timeout of one `/health` sample of an engine (default 3s): a health endpoint answers
    /// from memory, so a slower answer counts as unhealthy rather than stalling a wait.
    pub health_timeout: Duration,
    /// How long a preempting rollback waits for the rollout it aborted to end (default 120s):
    /// the aborted rollout's compose call in flight finishes first; after it, `host_busy`.
    pub preempt_wait: Duration,
    /// Wait after a rollout's write fails on the storage (a full disk, an I/O error) before it
    /// is tried again, and after any other database error before the task resumes the rollout
    /// from the database; doubles after each (default 200ms: a busy SQLite clears in
    /// milliseconds).
    pub storage_retry_initial: Duration,
    /// Longest wait between two tries of a write that fails on the storage (default 10s): such
    /// a write is tried for as long as it fails, so the rollout records what it knows and goes
    /// on within this long of the disk having room again.
    pub storage_retry_max: Duration,
    /// Drives of a rollout before its task gives up on a database error that is not the
    /// storage failing (a refused change read from a stale row) until the next start
    /// (default 5: with the doubling, about 3 s of retries).
    pub storage_tries: u32,
    /// Shortest poll interval of a wait without one of its own, which polls a tenth of its
    /// time left (default 50ms: keeps short waits from spinning).
    pub poll_min: Duration,
    /// Longest such poll interval (default 1s: a long wait still notices within a second).
    pub poll_max: Duration,
    /// How often a running wait saves its evidence (default 5s; the final evidence is written
    /// when the step ends): bounded so that many waits do not queue on SQLite's one writer.
    pub progress_every: Duration,
    /// Longest scrape of an engine's `/metrics` by `analyze` (default 10s; never longer than
    /// the step's `interval`).
    pub scrape_timeout: Duration,
    /// Longest wait for one compose-manager answer in the host doctor (default 10s, or
    /// `compose.request_timeout` if shorter): its two rounds of calls stay inside the CLI's
    /// 30 s.
    pub doctor_call_timeout: Duration,
    /// How many canaries take their first steps at once when many start together (default
    /// twice the CPU cores, at least 2; `engine::admission`): the others queue in arrival
    /// order.
    pub start_concurrency: u32,
    /// Longest a canary keeps its place among those (default 1s): a slow host never holds
    /// the others up for longer.
    pub start_hold: Duration,
}

/// Twice the CPU cores (at least 2): the start of a canary is work of this process, and
/// with more at once on 2 cores the median canary started later (docs/performance.md).
fn default_start_concurrency() -> u32 {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    u32::try_from(cores.saturating_mul(2))
        .unwrap_or(u32::MAX)
        .max(2)
}

impl Default for EngineTuning {
    fn default() -> Self {
        Self {
            health_timeout: Duration::from_secs(3),
            preempt_wait: Duration::from_secs(120),
            storage_retry_initial: Duration::from_millis(200),
            storage_retry_max: Duration::from_secs(10),
            storage_tries: 5,
            poll_min: Duration::from_millis(50),
            poll_max: Duration::from_secs(1),
            progress_every: Duration::from_secs(5),
            scrape_timeout: Duration::from_secs(10),
            doctor_call_timeout: Duration::from_secs(10),
            start_concurrency: default_start_concurrency(),
            start_hold: Duration::from_secs(1),
        }
    }
}

/// The API server's timings (`http:` in the config; all optional): a client that is slow to
/// send its request is cut off instead of holding a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpTuning {
    /// Longest wait for a request's headers, and for the next request on an idle
    /// keep-alive connection (default 30s).
    pub header_read_timeout: Duration,
    /// Longest wait for a request's body once its headers arrived (default 30s): `408`.
    pub body_read_timeout: Duration,
    /// Most inbound connections served at once (default 512); the next ones wait in the
    /// listen backlog until one closes. Never more than half the open-file limit, so calls to
    /// hosts always find descriptors.
    pub max_connections: usize,
}

impl Default for HttpTuning {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(30),
            body_read_timeout: Duration::from_secs(30),
            max_connections: 512,
        }
    }
}

/// A secret value: `Debug` and `Display` print `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// A host's env map. Its values may be secrets, so `Debug` prints the keys only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EnvMap(BTreeMap<String, String>);

impl EnvMap {
    /// Wraps a map.
    pub fn new(map: BTreeMap<String, String>) -> Self {
        Self(map)
    }

    /// The map itself, for merging into a compose call.
    pub fn expose(&self) -> &BTreeMap<String, String> {
        &self.0
    }

    /// A copy of the map, for merging into a compose call.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.0.clone()
    }

    /// The keys, safe to log.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for EnvMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnvMap")
            .field("keys", &self.0.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// A configuration that cannot be used. Displays as `file:line: key: message`, leaving out
/// the parts that are not known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The config file or env file at fault.
    pub file: Option<PathBuf>,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// Dotted key path (`hosts.gpu02.token_env`).
    pub key: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}", file.display())?;
            if let Some(line) = self.line {
                write!(f, ":{line}")?;
            }
            f.write_str(": ")?;
        }
        if let Some(key) = &self.key {
            write!(f, "{key}: ")?;
        }
        f.write_str(&self.message)
    }
}

impl ConfigError {
    /// Several errors as one: the first, then every other on a line of its own.
    pub fn all(errors: impl IntoIterator<Item = ConfigError>) -> ConfigError {
        let mut errors = errors.into_iter();
        let mut first = errors.next().expect("at least one error");
        for other in errors {
            first.message.push_str(&format!("\n{other}"));
        }
        first
    }
}

impl ResolvedConfig {
    /// Whether `listen` is a loopback address.
    pub fn is_loopback_listen(&self) -> bool {
        self.listen.ip().is_loopback()
    }

    /// `serve` refuses a non-loopback `listen` without tokens (docs/configuration.md).
    pub fn check_listen_safety(&self) -> Result<(), ConfigError> {
        if self.is_loopback_listen() || !self.tokens.is_empty() {
            return Ok(());
        }
        Err(ConfigError {
            file: None,
            line: None,
            key: Some("listen".to_string()),
            message: format!(
                "refusing to listen on {} without auth tokens: add auth.tokens or listen on 127.0.0.1",
                self.listen
            ),
        })
    }

    /// Refuses a runbook this config cannot run: an `analyze` step with `source: prometheus`
    /// without `prometheus:` in the config; a `plan`/`down`/`up` step whose `services` name a
    /// configured replica (safety rule 15); `force_recreate: true` on a step with a service
    /// outside `compose.force_recreate_allowed`. The error names the runbook file (in
    /// `runbooks_dir`), the line of the step's offending field when the file can be read, and
    /// the step.
    pub fn check_runbooks(&self, runbooks: &BTreeMap<String, Runbook>) -> Result<(), RunbookError> {
        for runbook in runbooks.values() {
            for (index, step) in runbook.steps.iter().enumerate() {
                if let Some((field, message)) = self.step_problem(&step.kind) {
                    let file = self.runbooks_dir.join(format!("{}.yaml", runbook.name));
                    let line = std::fs::read_to_string(&file).ok().and_then(|text| {
                        let at = [Seg::Key("steps"), Seg::Index(index), Seg::Key(field)];
                        locate(&text, &at)
                    });
                    return Err(RunbookError {
                        file: file.display().to_string(),
                        line,
                        message: format!("step {} \"{}\": {message}", index + 1, step.name),
                    });
                }
            }
        }
        Ok(())
    }

    /// What this config cannot run in one step: its field and why.
    fn step_problem(&self, kind: &StepKind) -> Option<(&'static str, String)> {
        if let StepKind::Analyze(spec) = kind {
            if spec.source == AnalysisSource::Prometheus && self.prometheus.is_none() {
                return Some(("source", "`source: prometheus` needs a `prometheus:` server in the daemon config (`prometheus: {url, token_env}`), which has none".to_string()));
            }
        }
        let scope = kind.scope()?;
        // Safety rule 15: a replica is only ever touched as the rollout's target.
        let replicas = self.replica_names();
        if let Some(replica) = scope
            .services
            .iter()
            .find(|s| replicas.iter().any(|r| *r == s.as_str()))
        {
            return Some(("services", format!("`services` names `{replica}`, a configured replica: a replica is only ever touched as the rollout's target, never as a companion service")));
        }
        let allowed = &self.compose.force_recreate_allowed;
        if scope.force_recreate {
            let others: Vec<&str> = scope
                .services
                .iter()
                .map(|s| s.as_str())
                .filter(|s| !allowed.iter().any(|a| a == s))
                .collect();
            if !others.is_empty() {
                return Some(("force_recreate", format!("`force_recreate: true` is allowed only when every service is in the config's `compose.force_recreate_allowed` ({allowed:?}); not {others:?}")));
            }
        }
        None
    }

    /// Every service name a host's replica is configured under, former names included.
    pub fn replica_names(&self) -> BTreeSet<&String> {
        self.hosts
            .values()
            .flat_map(|h| h.replicas.iter())
            .flat_map(|(key, r)| std::iter::once(key).chain(&r.aliases))
            .collect()
    }

    /// The hosts and replicas a plan may name, with the given runbook names.
    pub fn known_targets(&self, runbooks: &BTreeSet<String>) -> KnownTargets {
        KnownTargets {
            replicas: self
                .hosts
                .iter()
                .map(|(name, host)| (name.clone(), host.replicas.keys().cloned().collect()))
                .collect(),
            runbooks: runbooks.clone(),
            aliases: self
                .hosts
                .iter()
                .map(|(name, host)| {
                    let aliases = host.replicas.iter().flat_map(|(key, r)| {
                        r.aliases.iter().map(move |a| (a.clone(), key.clone()))
                    });
                    (name.clone(), aliases.collect())
                })
                .collect(),
        }
    }
}

/// Loads the config at `path`, taking secrets from the process environment.
pub fn load(path: &Path) -> Result<ResolvedConfig, ConfigError> {
    load_with_env(path, &|key| std::env::var(key).ok())
}

/// Loads the config at `path`, taking secrets from `env` (tests pass a map lookup).
pub fn load_with_env(
    path: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ResolvedConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: Some(path.to_path_buf()),
        line: None,
        key: None,
        message: format!("cannot read the config file: {e}"),
    })?;
    file::resolve(path, &text, env)
}

#[cfg(test)]
mod tests;
