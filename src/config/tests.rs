use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;

const R1: &str = "model-sg-glm53-w4afp8-tp4-r1";
const R2: &str = "model-sg-glm53-w4afp8-tp4-r2";

/// A valid config in a temp folder: `canaryd.yaml`, `env/gpu02.env`, `runbooks/`.
const BASE: &str = "\
listen: 127.0.0.1:7878
database: canaryd.db
runbooks_dir: runbooks
auth:
  tokens:
    - {name: ops-alice, role: operator, token_env: CANARYD_TOKEN_OPS_ALICE}
    - {name: oncall,    role: oncall,   token_env: CANARYD_TOKEN_ONCALL}
hosts:
  gpu02:
    compose_manager_url: http://gpu02.internal:8080
    token_env: GPU02_COMPOSE_MANAGER_TOKEN
    env_file: env/gpu02.env
    replicas:
      model-sg-glm53-w4afp8-tp4-r1: {group: glm53-long, health_url: http://gpu02.internal:18001/health}
      model-sg-glm53-w4afp8-tp4-r2: {group: glm53-long, health_url: http://gpu02.internal:18002/health}
      model-sg-glm52-w4a-tp4-r1: {group: glm52, health_url: http://gpu02.internal:18003/health}
";

const ENV_FILE: &str = "# fake\nGLM53_HICACHE_RAM_BUDGET=406GiB\nMODEL_PROXY_TOKEN=change-me\n";

fn fake_env(key: &str) -> Option<String> {
    let vars = [
        ("CANARYD_TOKEN_OPS_ALICE", "alice-secret"),
        ("CANARYD_TOKEN_ONCALL", "oncall-secret"),
        ("CANARYD_TOKEN_AUDIT", "audit-secret"),
        ("GPU02_COMPOSE_MANAGER_TOKEN", "cm-secret"),
        ("GLM53_API_TOKEN", "engine-api-secret"),
        ("EMPTY_VAR", ""),
    ];
    vars.iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.to_string())
}

fn write_setup(config: &str, env_file: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir_all(dir.path().join("env")).expect("mkdir env");
    std::fs::create_dir_all(dir.path().join("runbooks")).expect("mkdir runbooks");
    std::fs::write(dir.path().join("env/gpu02.env"), env_file).expect("write env");
    let path = dir.path().join("canaryd.yaml");
    std::fs::write(&path, config).expect("write config");
    (dir, path)
}

fn load_text(config: &str) -> Result<ResolvedConfig, ConfigError> {
    let (_dir, path) = write_setup(config, ENV_FILE);
    load_with_env(&path, &fake_env)
}

#[test]
fn a_valid_config_resolves_paths_secrets_and_defaults() {
    let (dir, path) = write_setup(BASE, ENV_FILE);
    let config = load_with_env(&path, &fake_env).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.listen.to_string(), "127.0.0.1:7878");
    assert_eq!(config.database, dir.path().join("canaryd.db"));
    assert_eq!(config.runbooks_dir, dir.path().join("runbooks"));
    assert_eq!(config.tokens[0].name, "ops-alice");
    assert_eq!(config.tokens[0].role, Role::Operator);
    assert_eq!(config.tokens[0].secret.expose(), "alice-secret");
    let host = &config.hosts["gpu02"];
    assert_eq!(host.name, "gpu02");
    assert_eq!(host.compose_manager_url, "http://gpu02.internal:8080");
    assert_eq!(host.token.expose(), "cm-secret");
    assert_eq!(host.project, "work");
    assert_eq!(host.env.expose()["GLM53_HICACHE_RAM_BUDGET"], "406GiB");
    assert_eq!(
        host.replicas[R2].health_url,
        "http://gpu02.internal:18002/health"
    );
    assert_eq!(config.compose, ComposeTuning::default());
    assert_eq!(config.http, HttpTuning::default());
    assert_eq!(config.engine, EngineTuning::default());
    assert_eq!(config.retention_days, None);
    assert!(config.is_loopback_listen());
    assert_eq!(config.check_listen_safety(), Ok(()));
}

#[test]
fn peers_are_the_other_replicas_of_the_same_group_on_the_host() {
    let config = load_text(BASE).unwrap_or_else(|e| panic!("{e}"));
    let host = &config.hosts["gpu02"];
    assert_eq!(host.peers(R2), vec![R1]);
    assert_eq!(host.peers(R1), vec![R2]);
    assert!(host.peers("model-sg-glm52-w4a-tp4-r1").is_empty());
    assert!(host.peers("nginx").is_empty());
    let runbooks = BTreeSet::from(["single-replica-canary".to_string()]);
    let known = config.known_targets(&runbooks);
    assert_eq!(known.replicas["gpu02"].len(), 3);
    assert_eq!(known.runbooks, runbooks);
}

#[test]
fn a_replica_api_defaults_to_the_origin_of_its_health_url_and_may_carry_a_token() {
    let text = BASE.replace(
        "{group: glm53-long, health_url: http://gpu02.internal:18002/health}",
        "{group: glm53-long, health_url: http://gpu02.internal:18002/health,\n         api_url: \"https://gpu02.internal:8444/r2/\", api_token_env: GLM53_API_TOKEN}",
    );
    assert_ne!(text, BASE, "the edit applies");
    let config = load_text(&text).unwrap_or_else(|e| panic!("{e}"));
    let replicas = &config.hosts["gpu02"].replicas;
    assert_eq!(replicas[R1].api_url, "http://gpu02.internal:18001");
    assert_eq!(replicas[R1].api_token, None);
    assert_eq!(replicas[R2].api_url, "https://gpu02.internal:8444/r2");
    assert_eq!(
        replicas[R2].api_token.as_ref().map(Secret::expose),
        Some("engine-api-secret")
    );
    let debug = format!("{config:?}");
    assert!(!debug.contains("engine-api-secret"), "{debug}");
    assert_eq!(url::origin("http://[::1]:8080/health"), "http://[::1]:8080");
    assert_eq!(url::origin("https://a"), "https://a");
}

#[test]
fn secrets_never_show_in_debug_output() {
    let config = load_text(BASE).unwrap_or_else(|e| panic!("{e}"));
    let debug = format!("{config:?}");
    for secret in [
        "alice-secret",
        "oncall-secret",
        "cm-secret",
        "406GiB",
        "change-me",
    ] {
        assert!(!debug.contains(secret), "{secret} leaked: {debug}");
    }
    assert!(
        debug.contains("GLM53_HICACHE_RAM_BUDGET"),
        "env keys are shown: {debug}"
    );
    assert_eq!(Secret::new("x").to_string(), "***");
}

#[test]
fn optional_settings_are_read() {
    let text = format!(
        "{BASE}retention_days: 90\ncompose:\n  connect_timeout: 2s\n  busy_retry_max: 5m\nhttp:\n  body_read_timeout: 5s\n"
    );
    let text = text.replace(
        "    env_file: env/gpu02.env\n",
        "    env_file: env/gpu02.env\n    project: glm53\n",
    );
    let config = load_text(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.retention_days, Some(90));
    assert_eq!(config.compose.connect_timeout, Duration::from_secs(2));
    assert_eq!(config.compose.busy_retry_max, Duration::from_secs(300));
    assert_eq!(config.compose.request_timeout, Duration::from_secs(30));
    assert_eq!(config.hosts["gpu02"].project, "glm53");
    assert!(
        config.hosts["gpu02"].windows.is_empty(),
        "no window unless configured"
    );
    assert_eq!(config.http.body_read_timeout, Duration::from_secs(5));
    assert_eq!(config.http.header_read_timeout, Duration::from_secs(30));
}

#[test]
#[rustfmt::skip]
fn bad_configs_are_refused_naming_file_line_and_key() {
    // (case, edit of BASE as (from, to), expected text after "<dir>/canaryd.yaml")
    let cases: &[(&str, (&str, &str), &str)] = &[
        ("an unknown top-level key", ("listen:", "colour: blue\nlisten:"), ":1: unknown field `colour`"),
        ("an unknown host key", ("    env_file: env/gpu02.env\n", "    env_file: env/gpu02.env\n    sudo: true\n"), ":13: hosts.gpu02: unknown field `sudo`"),
        ("an unknown replica key", ("{group: glm52,", "{group: glm52, port: 1,"), ":16: hosts.gpu02.replicas.model-sg-glm52-w4a-tp4-r1: unknown field `port`"),
        ("a missing host token", ("GPU02_COMPOSE_MANAGER_TOKEN", "GPU02_MISSING_TOKEN"), ":11: hosts.gpu02.token_env: environment variable GPU02_MISSING_TOKEN is not set"),
        ("a missing api token", ("CANARYD_TOKEN_ONCALL", "NOPE"), ":7: auth.tokens[1].token_env: environment variable NOPE is not set"),
        ("an empty env var", ("CANARYD_TOKEN_ONCALL", "EMPTY_VAR"), ":7: auth.tokens[1].token_env: environment variable EMPTY_VAR is empty"),
        ("an unreadable env file", ("env/gpu02.env", "env/gpu99.env"), ":12: hosts.gpu02.env_file: cannot read"),
        ("an unknown role", ("role: oncall", "role: admin"), ":7: auth.tokens[1].role: unknown variant `admin`, expected one of `viewer`, `oncall`, `operator`"),
        ("a duplicate token name", ("name: oncall,", "name: ops-alice,"), ":7: auth.tokens[1].name: duplicate token name `ops-alice`"),
        ("a shared token secret", ("CANARYD_TOKEN_ONCALL", "CANARYD_TOKEN_OPS_ALICE"), ":7: auth.tokens[1].token_env: token `oncall` has the same secret as token `ops-alice`"),
        ("a bad listen address", ("127.0.0.1:7878", "localhost"), ":1: listen: \"localhost\" is not an IP:port address"),
        ("a compose-manager URL without scheme", ("http://gpu02.internal:8080", "gpu02.internal:8080"), ":10: hosts.gpu02.compose_manager_url: \"gpu02.internal:8080\" is not an http(s)://host[:port] URL: the scheme"),
        ("a compose-manager URL with a path", ("http://gpu02.internal:8080", "http://gpu02.internal:8080/api"), ":10: hosts.gpu02.compose_manager_url: \"http://gpu02.internal:8080/api\" is not an http(s)://host[:port] URL: no path expected"),
        ("a compose-manager URL with a bad port", ("gpu02.internal:8080", "gpu02.internal:99999"), ":10: hosts.gpu02.compose_manager_url: \"http://gpu02.internal:99999\" is not an http(s)://host[:port] URL: the port"),
        ("a URL with credentials", ("http://gpu02.internal:8080", "http://u:p@gpu02.internal:8080"), ":10: hosts.gpu02.compose_manager_url: \"http://u:p@gpu02.internal:8080\" is not an http(s)://host[:port] URL: credentials"),
        ("a bad health URL", ("http://gpu02.internal:18002/health", "ftp://gpu02/health"), ":15: hosts.gpu02.replicas.model-sg-glm53-w4afp8-tp4-r2.health_url: \"ftp://gpu02/health\" is not an http(s)://host[:port]/path URL"),
        ("a health URL with a space", ("18002/health", "18002/he alth"), ":15: hosts.gpu02.replicas.model-sg-glm53-w4afp8-tp4-r2.health_url"),
        ("a missing runbooks folder", ("runbooks_dir: runbooks", "runbooks_dir: nowhere"), ":3: runbooks_dir: "),
        ("a reserved project", ("    env_file: env/gpu02.env\n", "    env_file: env/gpu02.env\n    project: dstack\n"), ":13: hosts.gpu02.project: \"dstack\" is not a usable compose project"),
        ("a project with capitals", ("    env_file: env/gpu02.env\n", "    env_file: env/gpu02.env\n    project: Work\n"), ":13: hosts.gpu02.project: \"Work\""),
        ("a bad api URL", ("{group: glm52,", "{group: glm52, api_url: \"gpu02:8000\","), ":16: hosts.gpu02.replicas.model-sg-glm52-w4a-tp4-r1.api_url: \"gpu02:8000\" is not an http(s)://host[:port]/path URL: the scheme"),
        ("an api URL ending in /v1", ("{group: glm52,", "{group: glm52, api_url: \"http://gpu02:8000/v1/\","), ":16: hosts.gpu02.replicas.model-sg-glm52-w4a-tp4-r1.api_url: leave out the trailing `/v1`"),
        ("a missing api token", ("{group: glm52,", "{group: glm52, api_token_env: GLM52_API_TOKEN,"), ":16: hosts.gpu02.replicas.model-sg-glm52-w4a-tp4-r1.api_token_env: environment variable GLM52_API_TOKEN is not set"),
        ("an empty api token", ("{group: glm52,", "{group: glm52, api_token_env: EMPTY_VAR,"), ":16: hosts.gpu02.replicas.model-sg-glm52-w4a-tp4-r1.api_token_env: environment variable EMPTY_VAR is empty"),
        ("a replica without a group", ("{group: glm52,", "{group: \"\","), ":16: hosts.gpu02.replicas.model-sg-glm52-w4a-tp4-r1.group: must be a non-empty name"),
        ("a missing field", ("listen: 127.0.0.1:7878\n", ""), ":1: missing field `listen`"),
        ("a tab-broken YAML", ("hosts:\n", "hosts:\n\t"), ":9: found character that cannot start any token"),
        ("a window with a bad time", ("    env_file: env/gpu02.env\n", "    env_file: env/gpu02.env\n    windows: [{start: \"02:00\", end: \"25:00\"}]\n"), ":13: hosts.gpu02.windows: `end`: `25:00` is not a time `HH:MM` (UTC, 00:00 to 24:00)"),
        ("a window on no day", ("    env_file: env/gpu02.env\n", "    env_file: env/gpu02.env\n    windows: [{days: [someday], start: \"02:00\", end: \"04:00\"}]\n"), ":13: hosts.gpu02.windows: `days`: `someday` is not a day"),
    ];
    for (case, (from, to), expected) in cases {
        assert!(BASE.contains(from), "{case}: edit does not apply");
        let err = load_text(&BASE.replacen(from, to, 1)).expect_err(case).to_string();
        let after = err.split("canaryd.yaml").nth(1).unwrap_or_else(|| panic!("{case}: no file in {err}"));
        assert!(after.starts_with(expected), "{case}:\n  got:      {err}\n  expected: …canaryd.yaml{expected}");
    }
}

#[test]
fn every_unknown_key_is_reported_at_once_in_file_order() {
    let text = BASE
        .replacen("{group: glm52,", "{group: glm52, port: 1,", 1)
        .replacen("listen:", "colour: blue\nlisten:", 1)
        .replacen(
            "    env_file: env/gpu02.env\n",
            "    env_file: env/gpu02.env\n    sudo: true\n",
            1,
        )
        + "engine:\n  poll_every: 1s\n";
    let err = load_text(&text).expect_err("unknown keys").to_string();
    let last = text.lines().count();
    let expected = [
        "1: unknown field `colour`".to_string(),
        "14: hosts.gpu02: unknown field `sudo`".to_string(),
        "18: hosts.gpu02.replicas.model-sg-glm52-w4a-tp4-r1: unknown field `port`".to_string(),
        format!("{last}: engine: unknown field `poll_every`"),
    ];
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), expected.len(), "{err}");
    for (line, expected) in lines.iter().zip(&expected) {
        let after = line.split("canaryd.yaml:").nth(1).unwrap_or(line);
        assert!(
            after.starts_with(expected.as_str()),
            "got {line}, expected {expected}\n{err}"
        );
    }
}

#[test]
#[rustfmt::skip]
fn bad_optional_settings_are_refused_naming_the_key() {
    let cases: &[(&str, &str, &str)] = &[
        ("a duration without a unit", "compose:\n  connect_timeout: 5\n", "compose.connect_timeout: invalid duration `5`: missing unit"),
        ("a zero duration", "compose:\n  request_timeout: 0s\n", "compose.request_timeout: must be longer than zero"),
        ("backoff that starts above its cap", "compose:\n  busy_retry_initial: 2m\n  busy_retry_max: 1m\n", "compose.busy_retry_initial: must not be longer than busy_retry_max"),
        ("an unknown compose knob", "compose:\n  retries: 3\n", "compose: unknown field `retries`"),
        ("a zero read timeout", "http:\n  header_read_timeout: 0s\n", "http.header_read_timeout: must be longer than zero"),
        ("a zero engine timing", "engine:\n  preempt_wait: 0s\n", "engine.preempt_wait: must be longer than zero"),
        ("an engine timing without a unit", "engine:\n  health_timeout: 3\n", "engine.health_timeout: invalid duration `3`: missing unit"),
        ("no storage tries", "engine:\n  storage_tries: 0\n", "engine.storage_tries: must be at least 1"),
        ("a storage cap below its start", "engine:\n  storage_retry_initial: 2s\n  storage_retry_max: 1s\n", "engine.storage_retry_max: must be at least storage_retry_initial"),
        ("no start concurrency", "engine:\n  start_concurrency: 0\n", "engine.start_concurrency: must be at least 1"),
        ("a poll range upside down", "engine:\n  poll_min: 2s\n  poll_max: 1s\n", "engine.poll_min: must not be longer than poll_max"),
        ("an unknown engine knob", "engine:\n  poll_every: 1s\n", "engine: unknown field `poll_every`"),
        ("zero retention", "retention_days: 0\n", "retention_days: must be at least 1"),
        ("negative retention", "retention_days: -1\n", "retention_days: invalid type: integer `-1`, expected u32"),
    ];
    for (case, extra, expected) in cases {
        let err = load_text(&format!("{BASE}{extra}")).expect_err(case).to_string();
        let after = err.split("canaryd.yaml:").nth(1).unwrap_or_else(|| panic!("{case}: no file:line in {err}"));
        let (line, message) = after.split_once(": ").unwrap_or_else(|| panic!("{case}: {err}"));
        assert!(line.parse::<usize>().is_ok_and(|l| l >= 17), "{case}: line of the key: {err}");
        assert!(message.starts_with(expected), "{case}:\n  got:      {err}\n  expected: {expected}");
    }
}

#[test]
fn a_config_without_hosts_or_replicas_is_refused() {
    let hosts_at = BASE.find("hosts:").expect("hosts");
    let err = load_text(&format!("{}hosts: {{}}\n", &BASE[..hosts_at]))
        .expect_err("no hosts")
        .to_string();
    assert!(
        err.ends_with("canaryd.yaml:8: hosts: at least one host is required"),
        "{err}"
    );
    let replicas_at = BASE.find("    replicas:").expect("replicas");
    let err = load_text(&format!("{}    replicas: {{}}\n", &BASE[..replicas_at]))
        .expect_err("no replicas")
        .to_string();
    assert!(
        err.ends_with("canaryd.yaml:13: hosts.gpu02.replicas: at least one replica is required"),
        "{err}"
    );
}

#[test]
fn a_bad_env_file_line_is_reported_in_the_env_file() {
    let (_dir, path) = write_setup(BASE, "A=1\nthis is not a line\n");
    let err = load_with_env(&path, &fake_env)
        .expect_err("bad env file")
        .to_string();
    assert!(
        err.ends_with("gpu02.env:2: expected KEY=VALUE, a `#` comment or a blank line"),
        "{err}"
    );
}

#[test]
fn a_missing_config_file_is_named() {
    let err =
        load_with_env(Path::new("/nonexistent/canaryd.yaml"), &fake_env).expect_err("missing");
    assert!(
        err.to_string()
            .starts_with("/nonexistent/canaryd.yaml: cannot read the config file"),
        "{err}"
    );
}

#[test]
fn a_non_loopback_listen_needs_tokens() {
    let open = BASE.replace("127.0.0.1:7878", "0.0.0.0:7878");
    let config = load_text(&open).unwrap_or_else(|e| panic!("{e}"));
    assert!(!config.is_loopback_listen());
    assert_eq!(
        config.check_listen_safety(),
        Ok(()),
        "tokens are configured"
    );
    let start = open.find("auth:").expect("auth");
    let end = open.find("hosts:").expect("hosts");
    let no_auth = format!("{}{}", &open[..start], &open[end..]);
    let config = load_text(&no_auth).unwrap_or_else(|e| panic!("{e}"));
    assert!(config.tokens.is_empty());
    let err = config
        .check_listen_safety()
        .expect_err("open without tokens")
        .to_string();
    assert!(
        err.starts_with("listen: refusing to listen on 0.0.0.0:7878 without auth tokens"),
        "{err}"
    );
    let local = load_text(&no_auth.replace("0.0.0.0:7878", "\"[::1]:7878\""))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(local.check_listen_safety(), Ok(()));
}

#[test]
fn roles_grant_what_the_spec_says() {
    let table: Vec<String> = [Role::Viewer, Role::Oncall, Role::Operator]
        .iter()
        .map(|r| {
            format!(
                "{} read={} abort={} rollback={} operate={}",
                r.as_str(),
                r.can_read(),
                r.can_abort(),
                r.can_rollback(),
                r.can_operate()
            )
        })
        .collect();
    assert_eq!(
        table,
        [
            "viewer read=true abort=false rollback=false operate=false",
            "oncall read=true abort=true rollback=true operate=false",
            "operator read=true abort=true rollback=true operate=true",
        ]
    );
}

#[test]
fn urls_are_checked_by_shape() {
    let ok = [
        (
            "http://gpu02.internal:8080",
            false,
            "http://gpu02.internal:8080",
        ),
        ("https://10.0.0.2:8080/", false, "https://10.0.0.2:8080"),
        ("http://[::1]:8080", false, "http://[::1]:8080"),
        (
            "http://gpu02:18002/health",
            true,
            "http://gpu02:18002/health",
        ),
    ];
    for (url, with_path, expected) in ok {
        assert_eq!(
            url::check_url(url, with_path).as_deref(),
            Ok(expected),
            "{url}"
        );
    }
    for url in [
        "http://",
        "http://:80",
        "http://a:0",
        "http://a:b",
        "http://[::1",
        "https://a b",
        "HTTP://a",
    ] {
        assert!(url::check_url(url, true).is_err(), "{url}");
    }
}

#[test]
fn the_shipped_config_loads_with_its_env_vars_set() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/canaryd.yaml");
    let config = load_with_env(&path, &fake_env).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.tokens.len(), 3);
    assert!(config
        .runbooks_dir
        .join("single-replica-canary.yaml")
        .is_file());
    let host = &config.hosts["gpu02"];
    assert_eq!(host.peers(R2), vec![R1]);
    assert_eq!(host.env.expose()["MODEL_PROXY_TOKEN"], "change-me");
    let names: BTreeMap<_, _> = host
        .replicas
        .iter()
        .map(|(k, v)| (k.as_str(), v.group.as_str()))
        .collect();
    assert_eq!(
        names,
        BTreeMap::from([(R1, "glm53-long"), (R2, "glm53-long")])
    );
}

const NOTIFY: &str = "\
notifications:
  retry_initial: 2s
  max_attempts: 7
  webhooks:
    - {name: ops, url: 'http://hooks.internal:9000/canaryd'}
    - {name: chat, url_env: SLACK_WEBHOOK_URL, format: slack, events: [failed, rolled_back]}
";

fn notify_env(key: &str) -> Option<String> {
    match key {
        "SLACK_WEBHOOK_URL" => Some("https://hooks.slack.example/services/T0/B0/secret".into()),
        other => fake_env(other),
    }
}

fn load_notify(extra: &str) -> Result<ResolvedConfig, ConfigError> {
    let (_dir, path) = write_setup(&format!("{BASE}{extra}"), ENV_FILE);
    load_with_env(&path, &notify_env)
}

#[test]
fn webhooks_are_read_with_their_url_from_env_their_format_and_their_events() {
    use crate::domain::notification::NotifyEvent;
    let none = load_text(BASE).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(none.notifications, NotificationsConfig::default());
    let config = load_notify(NOTIFY).unwrap_or_else(|e| panic!("{e}"));
    let n = &config.notifications;
    assert_eq!(n.delivery.retry_initial, Duration::from_secs(2));
    assert_eq!(n.delivery.max_attempts, 7);
    assert_eq!(n.delivery.retry_max, DeliveryTuning::default().retry_max);
    assert_eq!(n.webhooks[0].name, "ops");
    assert_eq!(n.webhooks[0].format, WebhookFormat::Json);
    assert_eq!(
        n.webhooks[0].events.len(),
        NotifyEvent::ALL.len(),
        "every event by default"
    );
    assert_eq!(n.webhooks[1].format, WebhookFormat::Slack);
    assert!(n.webhooks[1].url.expose().ends_with("/secret"));
    assert_eq!(
        n.webhooks[1].events,
        BTreeSet::from([NotifyEvent::Failed, NotifyEvent::RolledBack])
    );
    assert!(
        !format!("{config:?}").contains("/secret"),
        "a webhook URL may hold a token: never in Debug"
    );
}

#[test]
fn bad_webhooks_are_refused_naming_the_key() {
    let cases = [
        (
            "events: [failed, rolled_back]",
            "events: [deployed]",
            "notifications.webhooks[1].events[0]: unknown event `deployed`",
        ),
        (
            "events: [failed, rolled_back]",
            "events: []",
            "notifications.webhooks[1].events: must name at least one event",
        ),
        (
            "url_env: SLACK_WEBHOOK_URL",
            "url_env: MISSING_URL",
            "notifications.webhooks[1].url_env: environment variable MISSING_URL is not set",
        ),
        (
            "{name: ops, url:",
            "{name: ops, url_env: SLACK_WEBHOOK_URL, url:",
            "notifications.webhooks[0]: give exactly one of `url` and `url_env`",
        ),
        (
            "'http://hooks.internal:9000/canaryd'",
            "'ftp://hooks.internal/x'",
            "notifications.webhooks[0].url: is not an http(s)",
        ),
        (
            "{name: chat,",
            "{name: ops,",
            "notifications.webhooks[1].name: duplicate webhook name `ops`",
        ),
        ("format: slack", "format: teams", "unknown variant `teams`"),
        (
            "max_attempts: 7",
            "max_attempts: 0",
            "notifications.max_attempts: must be at least 1",
        ),
        (
            "retry_initial: 2s",
            "retry_initial: 1h",
            "notifications.retry_initial: must not be longer than retry_max",
        ),
        (
            "max_attempts: 7",
            "max_attempt: 7",
            "unknown field `max_attempt`",
        ),
    ];
    for (from, to, expected) in cases {
        let err = load_notify(&NOTIFY.replacen(from, to, 1))
            .expect_err(to)
            .to_string();
        assert!(err.contains(expected), "{to}: {err}");
    }
}

#[test]
fn every_unset_or_empty_secret_is_named_in_one_error() {
    let text = format!(
        "{BASE}notifications:\n  webhooks:\n    - {{name: slack, url_env: SLACK_URL, format: slack}}\n"
    )
    .replace("CANARYD_TOKEN_ONCALL", "EMPTY_VAR");
    let (_dir, path) = write_setup(&text, ENV_FILE);
    let only_alice = |key: &str| {
        if key == "CANARYD_TOKEN_OPS_ALICE" {
            Some("alice-secret".to_owned())
        } else {
            fake_env(key).filter(|v| v.is_empty())
        }
    };
    let err = load_with_env(&path, &only_alice)
        .expect_err("secrets missing")
        .to_string();
    assert!(err.starts_with("3 environment variables"), "{err}");
    for (key, var) in [
        ("auth.tokens[1].token_env", "EMPTY_VAR is empty"),
        (
            "hosts.gpu02.token_env",
            "GPU02_COMPOSE_MANAGER_TOKEN is not set",
        ),
        ("notifications.webhooks[0].url_env", "SLACK_URL is not set"),
    ] {
        let line = err
            .lines()
            .find(|l| l.contains(key))
            .unwrap_or_else(|| panic!("{key} in {err}"));
        assert!(
            line.contains("canaryd.yaml:") && line.contains(var),
            "{line}"
        );
    }
    // One missing variable keeps the one-line `file:line: key: message` form.
    let err = load_with_env(&path, &|key| {
        (key != "SLACK_URL").then(|| format!("secret-{key}"))
    })
    .expect_err("one missing")
    .to_string();
    assert!(
        err.contains(
            "notifications.webhooks[0].url_env: environment variable SLACK_URL is not set"
        ),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn a_replica_metrics_url_defaults_to_the_origin_of_its_health_url() {
    let config = load_text(BASE).unwrap_or_else(|e| panic!("{e}"));
    let host = &config.hosts["gpu02"];
    assert_eq!(
        host.replicas[R2].metrics_url(),
        "http://gpu02.internal:18002/metrics"
    );
    let explicit = BASE.replace(
        "18001/health}",
        "18001/health, metrics_url: http://gpu02.internal:9100/engine/metrics}",
    );
    let config = load_text(&explicit).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        config.hosts["gpu02"].replicas[R1].metrics_url(),
        "http://gpu02.internal:9100/engine/metrics"
    );
    let bad = BASE.replace("18001/health}", "18001/health, metrics_url: ftp://x/m}");
    let err = load_text(&bad).expect_err("a bad metrics_url is refused");
    assert!(err.to_string().contains("metrics_url"), "{err}");
}

const PROMETHEUS: &str = "\
prometheus:
  url: http://prometheus.internal:9090/
  token_env: PROMETHEUS_TOKEN
";

fn prometheus_env(key: &str) -> Option<String> {
    match key {
        "PROMETHEUS_TOKEN" => Some("prom-bearer-secret".into()),
        other => fake_env(other),
    }
}

fn load_prometheus(extra: &str) -> Result<ResolvedConfig, ConfigError> {
    let (_dir, path) = write_setup(&format!("{BASE}{extra}"), ENV_FILE);
    load_with_env(&path, &prometheus_env)
}

#[test]
fn a_prometheus_server_is_read_with_its_token_from_env() {
    let none = load_prometheus("").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(none.prometheus, None, "optional");
    let config = load_prometheus(PROMETHEUS).unwrap_or_else(|e| panic!("{e}"));
    let p = config.prometheus.as_ref().expect("configured");
    assert_eq!(p.url, "http://prometheus.internal:9090");
    assert_eq!(
        p.token.as_ref().map(Secret::expose),
        Some("prom-bearer-secret")
    );
    assert!(!format!("{config:?}").contains("prom-bearer-secret"));
    let open = load_prometheus("prometheus: {url: 'https://metrics.internal/prometheus'}\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let p = open.prometheus.expect("configured");
    assert_eq!(p.url, "https://metrics.internal/prometheus");
    assert_eq!(p.token, None, "a server without auth");
}

#[test]
fn a_bad_prometheus_server_is_refused_naming_file_line_and_key() {
    let line = BASE.lines().count() + 2;
    let cases = [
        (
            "token_env: PROMETHEUS_TOKEN",
            "token_env: PROMETHEUS_TOKN",
            format!("canaryd.yaml:{}: prometheus.token_env: environment variable PROMETHEUS_TOKN is not set", line + 1),
        ),
        (
            "token_env:",
            "token:",
            "unknown field `token`, expected `url` or `token_env`".to_owned(),
        ),
        (
            "http://prometheus.internal:9090/",
            "prometheus.internal:9090",
            format!("canaryd.yaml:{line}: prometheus.url: \"prometheus.internal:9090\" is not an http(s)"),
        ),
        (
            "http://prometheus.internal:9090/",
            "http://user:pw@prometheus.internal:9090",
            "prometheus.url: \"http://user:pw@prometheus.internal:9090\" is not an http(s)://host[:port]/path URL: credentials do not belong in the URL".to_owned(),
        ),
        (
            "http://prometheus.internal:9090/",
            "http://prometheus.internal:9090/api/v1/query",
            "prometheus.url: give the server's base URL: canaryd appends `/api/v1/query`".to_owned(),
        ),
    ];
    for (from, to, expected) in cases {
        let err = load_prometheus(&PROMETHEUS.replacen(from, to, 1))
            .expect_err(to)
            .to_string();
        assert!(
            err.contains(&expected),
            "{to}:\n  got:      {err}\n  expected: {expected}"
        );
    }
    let err = load_prometheus("prometheus: {token_env: PROMETHEUS_TOKEN}\n")
        .expect_err("no url")
        .to_string();
    assert!(err.contains("missing field `url`"), "{err}");
}

#[test]
fn a_runbook_asking_prometheus_is_refused_at_start_without_a_server() {
    let runbook = "\
description: judged by Prometheus
steps:
  - {name: snapshot, kind: snapshot}
  - name: analysis
    kind: analyze
    source: prometheus
    checks:
      - {name: ttft_p95, query: 'histogram_quantile(0.95, sum by (le) (rate(x_bucket{container_name=\"{{service}}\"}[{{window}}])))', max_ratio_to_peers: 1.2}
";
    let (dir, path) = write_setup(BASE, ENV_FILE);
    std::fs::write(dir.path().join("runbooks/judged.yaml"), runbook).expect("write runbook");
    let config = load_with_env(&path, &prometheus_env).unwrap_or_else(|e| panic!("{e}"));
    let runbooks =
        crate::domain::runbook::load_dir(&config.runbooks_dir).unwrap_or_else(|e| panic!("{e}"));
    let err = config
        .check_runbooks(&runbooks)
        .expect_err("no prometheus: configured")
        .to_string();
    let file = dir.path().join("runbooks/judged.yaml");
    let expected = format!(
        "{}:6: step 2 \"analysis\": `source: prometheus` needs a `prometheus:` server in the daemon config",
        file.display()
    );
    assert!(
        err.starts_with(&expected),
        "got:      {err}\nexpected: {expected}"
    );
    std::fs::write(&path, format!("{BASE}{PROMETHEUS}")).expect("write config");
    let config = load_with_env(&path, &prometheus_env).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.check_runbooks(&runbooks), Ok(()));
    let engine_only =
        crate::domain::runbook::load_dir(Path::new("runbooks")).unwrap_or_else(|e| panic!("{e}"));
    let bare = load_text(BASE).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        bare.check_runbooks(&engine_only),
        Ok(()),
        "the shipped runbooks"
    );
}

#[test]
fn the_engine_timings_default_to_what_canaryd_always_used_and_each_can_be_set() {
    let d = EngineTuning::default();
    let s = Duration::from_secs;
    assert_eq!(
        (
            d.health_timeout,
            d.preempt_wait,
            d.storage_retry_initial,
            d.storage_retry_max,
            d.storage_tries
        ),
        (s(3), s(120), Duration::from_millis(200), s(10), 5)
    );
    assert_eq!(
        (d.poll_min, d.poll_max, d.progress_every),
        (Duration::from_millis(50), s(1), s(5))
    );
    assert_eq!((d.scrape_timeout, d.doctor_call_timeout), (s(10), s(10)));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    assert_eq!(
        (d.start_concurrency, d.start_hold),
        ((2 * cores).max(2), s(1))
    );
    let set = "engine:\n  health_timeout: 1s\n  preempt_wait: 5m\n  storage_retry_initial: 1s\n  \
               storage_retry_max: 1m\n  storage_tries: 2\n  poll_min: 10ms\n  poll_max: 10ms\n  progress_every: 30s\n  \
               scrape_timeout: 2s\n  doctor_call_timeout: 20s\n  start_concurrency: 3\n  \
               start_hold: 250ms\n";
    let config = load_text(&format!("{BASE}{set}")).unwrap_or_else(|e| panic!("{e}"));
    let ms = Duration::from_millis;
    assert_eq!(
        config.engine,
        EngineTuning {
            health_timeout: s(1),
            preempt_wait: s(300),
            storage_retry_initial: s(1),
            storage_retry_max: s(60),
            storage_tries: 2,
            poll_min: ms(10),
            poll_max: ms(10),
            progress_every: s(30),
            scrape_timeout: s(2),
            doctor_call_timeout: s(20),
            start_concurrency: 3,
            start_hold: ms(250),
        }
    );
}

#[test]
fn a_runbook_naming_a_replica_as_companion_or_force_recreating_an_unlisted_service_is_refused() {
    let head = "steps:\n  - {kind: peers_healthy}\n";
    let cases = [
        (
            "a replica as a companion",
            format!("{head}  - name: stop-r1\n    kind: down\n    services: [nginx, model-sg-glm53-w4afp8-tp4-r1]\n"),
            ":5: step 2 \"stop-r1\": `services` names `model-sg-glm53-w4afp8-tp4-r1`, a configured replica",
        ),
        (
            "force_recreate of an unlisted service",
            format!("{head}  - name: plan-proxy\n    kind: plan\n    services: [otelcol-contrib, proxy-glm53]\n    force_recreate: true\n"),
            ":6: step 2 \"plan-proxy\": `force_recreate: true` is allowed only when every service is in the config's `compose.force_recreate_allowed` ([\"otelcol-contrib\"]); not [\"proxy-glm53\"]",
        ),
    ];
    for (case, runbook, expected) in cases {
        let (dir, path) = write_setup(BASE, ENV_FILE);
        std::fs::write(dir.path().join("runbooks/c.yaml"), runbook).expect("write runbook");
        let config = load_with_env(&path, &fake_env).unwrap_or_else(|e| panic!("{e}"));
        let runbooks = crate::domain::runbook::load_dir(&config.runbooks_dir)
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        let err = config
            .check_runbooks(&runbooks)
            .expect_err(case)
            .to_string();
        let file = dir.path().join("runbooks/c.yaml");
        let expected = format!("{}{expected}", file.display());
        assert!(
            err.starts_with(&expected),
            "{case}:\n  got:      {err}\n  expected: {expected}"
        );
    }
    // The default list allows the collector; a config may list others, never a replica.
    let (dir, path) = write_setup(BASE, ENV_FILE);
    let ok =
        format!("{head}  - {{kind: plan, services: [otelcol-contrib], force_recreate: true}}\n");
    std::fs::write(dir.path().join("runbooks/c.yaml"), ok).expect("write runbook");
    let config = load_with_env(&path, &fake_env).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.compose.force_recreate_allowed, ["otelcol-contrib"]);
    let runbooks = crate::domain::runbook::load_dir(&config.runbooks_dir).expect("loads");
    assert_eq!(config.check_runbooks(&runbooks), Ok(()));
    let replica = format!("{BASE}compose:\n  force_recreate_allowed: [otelcol-contrib, model-sg-glm53-w4afp8-tp4-r2]\n");
    let err = load_text(&replica)
        .expect_err("a replica listed")
        .to_string();
    assert!(
        err.contains(
            "force_recreate_allowed: `model-sg-glm53-w4afp8-tp4-r2` is a configured replica"
        ),
        "{err}"
    );
}

#[test]
fn a_replica_may_list_former_names_that_stand_for_it_and_no_other() {
    const OLD: &str = "model-sg-glm53-fp8-tp4-r2";
    let with = |aliases: &str| {
        BASE.replace(
            "model-sg-glm53-w4afp8-tp4-r2: {group: glm53-long, health_url: http://gpu02.internal:18002/health}",
            &format!("model-sg-glm53-w4afp8-tp4-r2: {{group: glm53-long, health_url: http://gpu02.internal:18002/health, aliases: {aliases}}}"),
        )
    };
    let config = load_text(&with(&format!("[{OLD}]"))).unwrap_or_else(|e| panic!("{e}"));
    // A former name is a replica for safety rule 15: never a companion service.
    let (dir, path) = write_setup(&with(&format!("[{OLD}]")), ENV_FILE);
    let runbook = format!("steps:\n  - {{kind: peers_healthy}}\n  - {{name: stop, kind: down, services: [nginx, {OLD}]}}\n");
    std::fs::write(dir.path().join("runbooks/c.yaml"), runbook).expect("write runbook");
    let loaded = load_with_env(&path, &fake_env).unwrap_or_else(|e| panic!("{e}"));
    let runbooks = crate::domain::runbook::load_dir(&loaded.runbooks_dir).expect("loads");
    let err = loaded.check_runbooks(&runbooks).expect_err("refused");
    assert!(
        err.to_string()
            .contains(&format!("`services` names `{OLD}`, a configured replica")),
        "{err}"
    );
    let host = &config.hosts["gpu02"];
    assert_eq!(host.replicas[R2].aliases, [OLD]);
    assert_eq!(host.replica(OLD).map(|(slot, _)| slot), Some(R2));
    assert!(host.is_replica_name(OLD) && host.is_replica_name(R1));
    assert!(!host.is_replica_name("proxy-glm53"));
    assert_eq!(
        host.peers(OLD),
        [R1],
        "a former name has its replica's peers"
    );
    assert!(config.replica_names().contains(&OLD.to_string()));
    let known = config.known_targets(&BTreeSet::new());
    assert_eq!(known.aliases["gpu02"][OLD], R2);
    for (aliases, says) in [
        (format!("[{R2}]"), "not its own former name"),
        (format!("[{R1}]"), "already a replica or a former name"),
        ("[\"a b\"]".to_string(), "compose service name"),
    ] {
        let err = load_text(&with(&aliases)).expect_err("refused");
        let text = err.to_string();
        assert!(
            text.contains("aliases[0]") && text.contains(says),
            "{aliases}: {text}"
        );
    }
}

#[test]
fn public_url_is_an_http_url_kept_without_its_trailing_slash() {
    let config = load_text(BASE).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.public_url, None, "none by default");
    let config = load_text(&format!("{BASE}public_url: https://canaryd.example.com/\n"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        config.public_url.as_deref(),
        Some("https://canaryd.example.com")
    );
    let err =
        load_text(&format!("{BASE}public_url: canaryd.example.com\n")).expect_err("no scheme");
    assert!(err.to_string().contains("public_url: "), "{err}");
    assert!(err.to_string().contains("http:// or https://"), "{err}");
}
