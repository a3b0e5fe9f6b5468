//! The config file's exact shape (serde, unknown keys refused) and its resolution.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::url::{check_url, origin};
use super::{
    env_file, ApiToken, ComposeTuning, ConfigError, DeliveryTuning, EngineTuning, EnvMap,
    HostConfig, HttpTuning, NotificationsConfig, PrometheusConfig, ReplicaConfig, ResolvedConfig,
    Role, Secret, WebhookConfig, WebhookFormat,
};
use crate::domain::duration::parse_duration;
use crate::domain::notification::NotifyEvent;
use crate::domain::plan::is_env_key;
use crate::domain::yaml_line::{self, describe_yaml_error, locate, Seg};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    listen: String,
    database: PathBuf,
    runbooks_dir: PathBuf,
    #[serde(default)]
    auth: Option<AuthFile>,
    hosts: BTreeMap<String, HostFile>,
    #[serde(default)]
    compose: Option<ComposeFile>,
    #[serde(default)]
    http: Option<HttpFile>,
    #[serde(default)]
    engine: Option<EngineFile>,
    #[serde(default)]
    retention_days: Option<u32>,
    #[serde(default)]
    notifications: Option<NotificationsFile>,
    #[serde(default)]
    prometheus: Option<PrometheusFile>,
    #[serde(default)]
    public_url: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PrometheusFile {
    url: String,
    #[serde(default)]
    token_env: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct NotificationsFile {
    #[serde(default)]
    webhooks: Vec<WebhookFile>,
    timeout: Option<String>,
    retry_initial: Option<String>,
    retry_max: Option<String>,
    max_attempts: Option<u32>,
    poll_interval: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WebhookFile {
    name: String,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    url_env: Option<String>,
    #[serde(default)]
    format: WebhookFormat,
    #[serde(default)]
    events: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthFile {
    #[serde(default)]
    tokens: Vec<TokenFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    name: String,
    role: Role,
    token_env: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HostFile {
    compose_manager_url: String,
    token_env: String,
    env_file: PathBuf,
    #[serde(default)]
    project: Option<String>,
    /// Low-traffic windows (UTC) a `window` step waits for.
    #[serde(default)]
    windows: Vec<crate::domain::window::TrafficWindow>,
    #[serde(default)]
    model_cache: Option<ModelCacheFile>,
    replicas: BTreeMap<String, ReplicaFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelCacheFile {
    volume: String,
    capacity: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplicaFile {
    group: String,
    health_url: String,
    #[serde(default)]
    api_url: Option<String>,
    #[serde(default)]
    api_token_env: Option<String>,
    metrics_url: Option<String>,
    #[serde(default)]
    aliases: Vec<String>,
}

/// Durations stay text here and are parsed in `resolve_compose`, so errors name the key.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ComposeFile {
    connect_timeout: Option<String>,
    request_timeout: Option<String>,
    stream_idle_timeout: Option<String>,
    busy_retry_initial: Option<String>,
    busy_retry_max: Option<String>,
    settle_interval: Option<String>,
    force_recreate_allowed: Option<Vec<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct HttpFile {
    header_read_timeout: Option<String>,
    body_read_timeout: Option<String>,
    max_connections: Option<usize>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct EngineFile {
    health_timeout: Option<String>,
    preempt_wait: Option<String>,
    storage_retry_initial: Option<String>,
    storage_retry_max: Option<String>,
    storage_tries: Option<u32>,
    poll_min: Option<String>,
    poll_max: Option<String>,
    progress_every: Option<String>,
    scrape_timeout: Option<String>,
    doctor_call_timeout: Option<String>,
    start_concurrency: Option<u32>,
    start_hold: Option<String>,
}

/// Builds errors that point at a key of the config file.
struct Source<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Source<'_> {
    fn error(&self, segs: &[Seg<'_>], message: impl Into<String>) -> ConfigError {
        let key = segs
            .iter()
            .map(|s| match s {
                Seg::Key(k) => format!(".{k}"),
                Seg::Index(i) => format!("[{i}]"),
            })
            .collect::<String>();
        ConfigError {
            file: Some(self.path.to_path_buf()),
            line: locate(self.text, segs),
            key: Some(key.trim_start_matches('.').to_string()),
            message: message.into(),
        }
    }

    fn secret(
        &self,
        segs: &[Seg<'_>],
        var: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Secret, ConfigError> {
        if !is_env_key(var) {
            return Err(self.error(
                segs,
                format!("`{var}` is not a valid environment variable name"),
            ));
        }
        match env(var) {
            None => Err(self.error(segs, format!("environment variable {var} is not set"))),
            Some(v) if v.is_empty() => {
                Err(self.error(segs, format!("environment variable {var} is empty")))
            }
            Some(v) => Ok(Secret::new(v)),
        }
    }
}

/// Every secret's env var that is unset or empty, reported at once (one at a time would
/// make an operator restart once per missing variable).
fn unset_env_vars(
    src: &Source<'_>,
    raw: &ConfigFile,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    use Seg::{Index, Key};
    let mut errors = Vec::new();
    let mut check = |segs: &[Seg<'_>], var: &str| {
        if is_env_key(var) {
            if let Err(e) = src.secret(segs, var, env) {
                errors.push(e);
            }
        }
    };
    for (i, t) in raw.auth.iter().flat_map(|a| a.tokens.iter()).enumerate() {
        check(
            &[Key("auth"), Key("tokens"), Index(i), Key("token_env")],
            &t.token_env,
        );
    }
    for (name, h) in &raw.hosts {
        check(&[Key("hosts"), Key(name), Key("token_env")], &h.token_env);
    }
    if let Some(var) = raw.prometheus.as_ref().and_then(|p| p.token_env.as_ref()) {
        check(&[Key("prometheus"), Key("token_env")], var);
    }
    let webhooks = raw.notifications.iter().flat_map(|n| n.webhooks.iter());
    for (i, w) in webhooks.enumerate() {
        if let Some(var) = &w.url_env {
            check(
                &[
                    Key("notifications"),
                    Key("webhooks"),
                    Index(i),
                    Key("url_env"),
                ],
                var,
            );
        }
    }
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        n => Err(ConfigError {
            file: None,
            line: None,
            key: None,
            message: format!(
                "{n} environment variables are not set (or empty):\n  {}",
                errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("\n  ")
            ),
        }),
    }
}

fn valid_name(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Resolves `p` against the config file's folder unless it is absolute.
fn relative(base: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

pub(super) fn resolve(
    path: &Path,
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ResolvedConfig, ConfigError> {
    use Seg::Key;
    let src = Source { path, text };
    // Every unknown key at once, in file order; any other error as serde_yaml words it.
    let raw: ConfigFile = match yaml_line::read::<ConfigFile>(text) {
        Ok(raw) => raw,
        Err(errors) if errors.iter().all(|e| e.unknown.is_some()) => {
            return Err(ConfigError::all(errors.into_iter().map(|e| ConfigError {
                file: Some(path.to_path_buf()),
                line: e.line,
                key: (!e.path.is_empty()).then_some(e.path),
                message: e.message,
            })));
        }
        Err(_) => serde_yaml::from_str(text).map_err(|e| {
            let (line, message) = describe_yaml_error(&e);
            ConfigError {
                file: Some(path.to_path_buf()),
                line,
                key: None,
                message,
            }
        })?,
    };
    unset_env_vars(&src, &raw, env)?;
    let base = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let listen: SocketAddr = raw.listen.parse().map_err(|_| {
        let why = format!(
            "\"{}\" is not an IP:port address such as 127.0.0.1:7878",
            raw.listen
        );
        src.error(&[Key("listen")], why)
    })?;
    if raw.database.as_os_str().is_empty() {
        return Err(src.error(&[Key("database")], "must be a file path"));
    }
    let runbooks_dir = relative(&base, &raw.runbooks_dir);
    if !runbooks_dir.is_dir() {
        let why = format!("{} is not a directory", runbooks_dir.display());
        return Err(src.error(&[Key("runbooks_dir")], why));
    }
    let tokens = resolve_tokens(&src, raw.auth.map(|a| a.tokens).unwrap_or_default(), env)?;
    if raw.hosts.is_empty() {
        return Err(src.error(&[Key("hosts")], "at least one host is required"));
    }
    let mut hosts = BTreeMap::new();
    for (name, h) in raw.hosts {
        let host = resolve_host(&src, &base, &name, h, env)?;
        hosts.insert(name, host);
    }
    let compose = resolve_compose(&src, raw.compose.unwrap_or_default())?;
    let replica = compose
        .force_recreate_allowed
        .iter()
        .find(|s| hosts.values().any(|h: &HostConfig| h.is_replica_name(s)));
    if let Some(replica) = replica {
        let at = [Key("compose"), Key("force_recreate_allowed")];
        let why =
            format!("`{replica}` is a configured replica: a replica is never force-recreated");
        return Err(src.error(&at, why));
    }
    let http = resolve_http(&src, raw.http.unwrap_or_default())?;
    let engine = resolve_engine(&src, raw.engine.unwrap_or_default())?;
    if raw.retention_days == Some(0) {
        let why = "must be at least 1 (leave it out to keep everything)";
        return Err(src.error(&[Key("retention_days")], why));
    }
    let notifications = resolve_notifications(&src, raw.notifications.unwrap_or_default(), env)?;
    let prometheus = match raw.prometheus {
        Some(p) => Some(resolve_prometheus(&src, p, env)?),
        None => None,
    };
    let public_url = match raw.public_url {
        Some(url) => Some(
            check_url(url.trim_end_matches('/'), true)
                .map_err(|e| src.error(&[Key("public_url")], e))?,
        ),
        None => None,
    };
    Ok(ResolvedConfig {
        public_url,
        listen,
        database: relative(&base, &raw.database),
        runbooks_dir,
        tokens,
        hosts,
        compose,
        http,
        engine,
        retention_days: raw.retention_days,
        notifications,
        prometheus,
    })
}

fn resolve_prometheus(
    src: &Source<'_>,
    p: PrometheusFile,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<PrometheusConfig, ConfigError> {
    let at = |key| [Seg::Key("prometheus"), Seg::Key(key)];
    let url = check_url(&p.url, true).map_err(|e| src.error(&at("url"), e))?;
    if url.ends_with("/api/v1/query") || url.ends_with("/api/v1") {
        let why = "give the server's base URL: canaryd appends `/api/v1/query`";
        return Err(src.error(&at("url"), why));
    }
    let token = match &p.token_env {
        Some(var) => Some(src.secret(&at("token_env"), var, env)?),
        None => None,
    };
    Ok(PrometheusConfig { url, token })
}

fn resolve_tokens(
    src: &Source<'_>,
    raw: Vec<TokenFile>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<ApiToken>, ConfigError> {
    let mut tokens: Vec<ApiToken> = Vec::new();
    for (i, t) in raw.into_iter().enumerate() {
        let at = |key| {
            [
                Seg::Key("auth"),
                Seg::Key("tokens"),
                Seg::Index(i),
                Seg::Key(key),
            ]
        };
        if t.name.trim().is_empty() {
            return Err(src.error(&at("name"), "must not be empty"));
        }
        if tokens.iter().any(|other| other.name == t.name) {
            return Err(src.error(&at("name"), format!("duplicate token name `{}`", t.name)));
        }
        let secret = src.secret(&at("token_env"), &t.token_env, env)?;
        if let Some(other) = tokens.iter().find(|other| other.secret == secret) {
            let why = format!(
                "token `{}` has the same secret as token `{}`: each token must be distinct",
                t.name, other.name
            );
            return Err(src.error(&at("token_env"), why));
        }
        tokens.push(ApiToken {
            name: t.name,
            role: t.role,
            secret,
        });
    }
    Ok(tokens)
}

fn resolve_host(
    src: &Source<'_>,
    base: &Path,
    name: &str,
    h: HostFile,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<HostConfig, ConfigError> {
    use Seg::Key;
    let at = |key| [Key("hosts"), Key(name), Key(key)];
    if !valid_name(name) {
        let why = "a host name must be letters, digits, `.`, `_` or `-`";
        return Err(src.error(&[Key("hosts"), Key(name)], why));
    }
    let url = check_url(&h.compose_manager_url, false)
        .map_err(|e| src.error(&at("compose_manager_url"), e))?;
    let token = src.secret(&at("token_env"), &h.token_env, env)?;
    let env_path = relative(base, &h.env_file);
    let env_text = std::fs::read_to_string(&env_path).map_err(|e| {
        src.error(
            &at("env_file"),
            format!("cannot read {}: {e}", env_path.display()),
        )
    })?;
    let host_env = env_file::parse(&env_path, &env_text)?;
    let project = h.project.unwrap_or_else(|| "work".to_string());
    let canonical = project.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && project
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if !canonical || project == "dstack" {
        let why = format!("\"{project}\" is not a usable compose project (lowercase [a-z0-9_-], starting with a letter or digit; `dstack` is reserved)");
        return Err(src.error(&at("project"), why));
    }
    if h.replicas.is_empty() {
        return Err(src.error(&at("replicas"), "at least one replica is required"));
    }
    let mut replicas = BTreeMap::new();
    // Every name a replica answers to on this host (its key, its former names) → the replica.
    let mut names: BTreeMap<String, String> =
        h.replicas.keys().map(|k| (k.clone(), k.clone())).collect();
    for (service, r) in h.replicas {
        let replica = [Key("hosts"), Key(name), Key("replicas"), Key(&service)];
        let field = |key| [replica[0], replica[1], replica[2], replica[3], Key(key)];
        if !valid_name(&service) {
            let why = "a replica must be a compose service name (letters, digits, `.`, `_`, `-`)";
            return Err(src.error(&replica, why));
        }
        if !valid_name(&r.group) {
            let why = "must be a non-empty name (letters, digits, `.`, `_`, `-`)";
            return Err(src.error(&field("group"), why));
        }
        let health_url =
            check_url(&r.health_url, true).map_err(|e| src.error(&field("health_url"), e))?;
        let api_url = match &r.api_url {
            Some(url) => {
                let url = check_url(url, true).map_err(|e| src.error(&field("api_url"), e))?;
                if url.ends_with("/v1") {
                    let why = "leave out the trailing `/v1`: canaryd appends `/v1/models` and `/v1/chat/completions`";
                    return Err(src.error(&field("api_url"), why));
                }
                url
            }
            None => origin(&health_url),
        };
        let api_token = match &r.api_token_env {
            Some(var) => Some(src.secret(&field("api_token_env"), var, env)?),
            None => None,
        };
        let metrics_url = match &r.metrics_url {
            Some(url) => {
                Some(check_url(url, true).map_err(|e| src.error(&field("metrics_url"), e))?)
            }
            None => None,
        };
        for (i, alias) in r.aliases.iter().enumerate() {
            let key = format!("aliases[{i}]");
            let at = [replica[0], replica[1], replica[2], replica[3], Key(&key)];
            let why = if !valid_name(alias) {
                "a former name must be a compose service name (letters, digits, `.`, `_`, `-`)"
                    .to_string()
            } else if alias == &service {
                "a replica is not its own former name".to_string()
            } else if names.contains_key(alias.as_str()) {
                format!(
                    "`{alias}` is already a replica or a former name of {} on this host: one name, one replica",
                    names[alias.as_str()]
                )
            } else {
                String::new()
            };
            if !why.is_empty() {
                return Err(src.error(&at, why));
            }
            names.insert(alias.clone(), service.clone());
        }
        replicas.insert(
            service,
            ReplicaConfig {
                group: r.group,
                health_url,
                api_url,
                api_token,
                metrics_url,
                aliases: r.aliases,
            },
        );
    }
    let model_cache = match h.model_cache {
        Some(m) => {
            let at = [Key("hosts"), Key(name), Key("model_cache"), Key("capacity")];
            let capacity =
                crate::domain::staging::parse_size(&m.capacity).map_err(|e| src.error(&at, e))?;
            if m.volume.trim().is_empty() {
                let at = [Key("hosts"), Key(name), Key("model_cache"), Key("volume")];
                return Err(src.error(&at, "the volume must be named"));
            }
            Some(crate::config::ModelCache {
                volume: m.volume,
                capacity,
            })
        }
        None => None,
    };
    Ok(HostConfig {
        name: name.to_string(),
        compose_manager_url: url,
        token,
        token_env: Some(h.token_env.clone()),
        env: EnvMap::new(host_env),
        project,
        replicas,
        windows: h.windows,
        model_cache,
    })
}

fn resolve_compose(src: &Source<'_>, c: ComposeFile) -> Result<ComposeTuning, ConfigError> {
    let d = ComposeTuning::default();
    let read =
        |key: &str, text: Option<String>, default: Duration| -> Result<Duration, ConfigError> {
            let at = [Seg::Key("compose"), Seg::Key(key)];
            match text.as_deref().map(parse_duration) {
                None => Ok(default),
                Some(Err(e)) => Err(src.error(&at, e)),
                Some(Ok(d)) if d.is_zero() => Err(src.error(&at, "must be longer than zero")),
                Some(Ok(d)) => Ok(d),
            }
        };
    let tuning = ComposeTuning {
        connect_timeout: read("connect_timeout", c.connect_timeout, d.connect_timeout)?,
        request_timeout: read("request_timeout", c.request_timeout, d.request_timeout)?,
        stream_idle_timeout: read(
            "stream_idle_timeout",
            c.stream_idle_timeout,
            d.stream_idle_timeout,
        )?,
        busy_retry_initial: read(
            "busy_retry_initial",
            c.busy_retry_initial,
            d.busy_retry_initial,
        )?,
        busy_retry_max: read("busy_retry_max", c.busy_retry_max, d.busy_retry_max)?,
        settle_interval: read("settle_interval", c.settle_interval, d.settle_interval)?,
        force_recreate_allowed: c.force_recreate_allowed.unwrap_or(d.force_recreate_allowed),
    };
    if tuning.busy_retry_initial > tuning.busy_retry_max {
        let at = [Seg::Key("compose"), Seg::Key("busy_retry_initial")];
        return Err(src.error(&at, "must not be longer than busy_retry_max"));
    }
    Ok(tuning)
}

/// A duration under `section.key`: the default when absent, never zero.
fn duration(
    src: &Source<'_>,
    section: &str,
    key: &str,
    text: Option<String>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    let at = [Seg::Key(section), Seg::Key(key)];
    match text.as_deref().map(parse_duration) {
        None => Ok(default),
        Some(Err(e)) => Err(src.error(&at, e)),
        Some(Ok(d)) if d.is_zero() => Err(src.error(&at, "must be longer than zero")),
        Some(Ok(d)) => Ok(d),
    }
}

fn resolve_http(src: &Source<'_>, h: HttpFile) -> Result<HttpTuning, ConfigError> {
    let d = HttpTuning::default();
    if h.max_connections == Some(0) {
        let at = [Seg::Key("http"), Seg::Key("max_connections")];
        return Err(src.error(&at, "must be at least 1"));
    }
    Ok(HttpTuning {
        max_connections: h.max_connections.unwrap_or(d.max_connections),
        header_read_timeout: duration(
            src,
            "http",
            "header_read_timeout",
            h.header_read_timeout,
            d.header_read_timeout,
        )?,
        body_read_timeout: duration(
            src,
            "http",
            "body_read_timeout",
            h.body_read_timeout,
            d.body_read_timeout,
        )?,
    })
}

fn resolve_engine(src: &Source<'_>, e: EngineFile) -> Result<EngineTuning, ConfigError> {
    let d = EngineTuning::default();
    let read = |key: &str, text: Option<String>, default: Duration| {
        duration(src, "engine", key, text, default)
    };
    let tuning = EngineTuning {
        health_timeout: read("health_timeout", e.health_timeout, d.health_timeout)?,
        preempt_wait: read("preempt_wait", e.preempt_wait, d.preempt_wait)?,
        storage_retry_initial: read(
            "storage_retry_initial",
            e.storage_retry_initial,
            d.storage_retry_initial,
        )?,
        storage_retry_max: read(
            "storage_retry_max",
            e.storage_retry_max,
            d.storage_retry_max,
        )?,
        storage_tries: e.storage_tries.unwrap_or(d.storage_tries),
        poll_min: read("poll_min", e.poll_min, d.poll_min)?,
        poll_max: read("poll_max", e.poll_max, d.poll_max)?,
        progress_every: read("progress_every", e.progress_every, d.progress_every)?,
        scrape_timeout: read("scrape_timeout", e.scrape_timeout, d.scrape_timeout)?,
        doctor_call_timeout: read(
            "doctor_call_timeout",
            e.doctor_call_timeout,
            d.doctor_call_timeout,
        )?,
        start_concurrency: e.start_concurrency.unwrap_or(d.start_concurrency),
        start_hold: read("start_hold", e.start_hold, d.start_hold)?,
    };
    if tuning.storage_tries == 0 {
        let at = [Seg::Key("engine"), Seg::Key("storage_tries")];
        return Err(src.error(&at, "must be at least 1"));
    }
    if tuning.storage_retry_max < tuning.storage_retry_initial {
        let at = [Seg::Key("engine"), Seg::Key("storage_retry_max")];
        return Err(src.error(&at, "must be at least storage_retry_initial"));
    }
    if tuning.start_concurrency == 0 {
        let at = [Seg::Key("engine"), Seg::Key("start_concurrency")];
        return Err(src.error(&at, "must be at least 1"));
    }
    if tuning.poll_min > tuning.poll_max {
        let at = [Seg::Key("engine"), Seg::Key("poll_min")];
        return Err(src.error(&at, "must not be longer than poll_max"));
    }
    Ok(tuning)
}

fn resolve_notifications(
    src: &Source<'_>,
    n: NotificationsFile,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<NotificationsConfig, ConfigError> {
    use Seg::{Index, Key};
    let d = DeliveryTuning::default();
    let read =
        |key: &str, text: Option<String>, default: Duration| -> Result<Duration, ConfigError> {
            let at = [Key("notifications"), Key(key)];
            match text.as_deref().map(parse_duration) {
                None => Ok(default),
                Some(Err(e)) => Err(src.error(&at, e)),
                Some(Ok(d)) if d.is_zero() => Err(src.error(&at, "must be longer than zero")),
                Some(Ok(d)) => Ok(d),
            }
        };
    let delivery = DeliveryTuning {
        timeout: read("timeout", n.timeout, d.timeout)?,
        retry_initial: read("retry_initial", n.retry_initial, d.retry_initial)?,
        retry_max: read("retry_max", n.retry_max, d.retry_max)?,
        max_attempts: n.max_attempts.unwrap_or(d.max_attempts),
        poll_interval: read("poll_interval", n.poll_interval, d.poll_interval)?,
    };
    if delivery.max_attempts == 0 {
        let at = [Key("notifications"), Key("max_attempts")];
        return Err(src.error(&at, "must be at least 1"));
    }
    if delivery.retry_initial > delivery.retry_max {
        let at = [Key("notifications"), Key("retry_initial")];
        return Err(src.error(&at, "must not be longer than retry_max"));
    }
    let mut webhooks: Vec<WebhookConfig> = Vec::new();
    for (i, w) in n.webhooks.into_iter().enumerate() {
        let at = |key| [Key("notifications"), Key("webhooks"), Index(i), Key(key)];
        if !valid_name(&w.name) {
            let why = "must be a non-empty name (letters, digits, `.`, `_`, `-`)";
            return Err(src.error(&at("name"), why));
        }
        if webhooks.iter().any(|other| other.name == w.name) {
            let why = format!("duplicate webhook name `{}`", w.name);
            return Err(src.error(&at("name"), why));
        }
        let (url, key) = match (w.url, w.url_env) {
            (Some(url), None) => (Secret::new(url), "url"),
            (None, Some(var)) => (src.secret(&at("url_env"), &var, env)?, "url_env"),
            _ => {
                let why = "give exactly one of `url` and `url_env` (an env var holding a URL that contains a token)";
                return Err(src.error(&[Key("notifications"), Key("webhooks"), Index(i)], why));
            }
        };
        // The message never shows the URL: it may hold a token.
        check_url(url.expose(), true).map_err(|_| {
            src.error(
                &at(key),
                "is not an http(s)://host[:port][/path] URL (without credentials)",
            )
        })?;
        let events = match w.events {
            None => NotifyEvent::ALL.into_iter().collect(),
            Some(list) if list.is_empty() => {
                let why = "must name at least one event (leave it out for every event)";
                return Err(src.error(&at("events"), why));
            }
            Some(list) => {
                let mut events = BTreeSet::new();
                for (j, name) in list.iter().enumerate() {
                    let event = name.parse::<NotifyEvent>().map_err(|e| {
                        src.error(
                            &[
                                Key("notifications"),
                                Key("webhooks"),
                                Index(i),
                                Key("events"),
                                Index(j),
                            ],
                            e,
                        )
                    })?;
                    events.insert(event);
                }
                events
            }
        };
        webhooks.push(WebhookConfig {
            name: w.name,
            url,
            format: w.format,
            events,
        });
    }
    Ok(NotificationsConfig { webhooks, delivery })
}
