//! The host doctor (docs/oncall.md) end to end: `GET /v1/hosts/{host}/doctor` and `canaryd doctor`
//! against a healthy simulated host and against hosts broken in one way each.

use std::process::Output;
use std::time::Duration;

use canaryd::app::App;
use canaryd::config::sim::dev_config;
use canaryd::config::Secret;
use canaryd_sim::SimHost;
use serde_json::{json, Value};

use crate::helpers::{
    canaryd_async, fast_runbooks, sim_config, TestApp, TestOptions, HOST, R1, R2,
};

/// Every check of the simulated host, in the order the doctor answers them.
fn expected_names() -> Vec<String> {
    [
        "token_accepted".to_owned(),
        "dry_run_supported".to_owned(),
        "version_names_project".to_owned(),
        format!("compose_logs:{R1}"),
        format!("compose_logs:{R2}"),
        format!("health:{R1}"),
        format!("health:{R2}"),
        "peers_healthy:glm53-long".to_owned(),
        "newest_tag_time".to_owned(),
    ]
    .into()
}

/// `GET path` without a token; (status, JSON body).
async fn get(url: &str, path: &str, token: Option<&str>) -> (u16, Value) {
    let mut req = reqwest::Client::new().get(format!("{url}{path}"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let res = req.send().await.expect("the daemon answers");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

async fn doctor(url: &str) -> Value {
    let (status, body) = get(url, &format!("/v1/hosts/{HOST}/doctor"), None).await;
    assert_eq!(status, 200, "{body:#}");
    body
}

fn names(report: &Value) -> Vec<String> {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|c| c["name"].as_str().expect("name").to_owned())
        .collect()
}

fn failing(report: &Value) -> Vec<String> {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["ok"] == false)
        .map(|c| c["name"].as_str().expect("name").to_owned())
        .collect()
}

fn detail<'a>(report: &'a Value, name: &str) -> &'a str {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == name)
        .and_then(|c| c["detail"].as_str())
        .unwrap_or_else(|| panic!("no check {name} in {report:#}"))
}

/// Runs the real binary: `canaryd doctor ARGS` against `server`.
async fn cli(args: &[&str], server: &str) -> Output {
    let args: Vec<&str> = std::iter::once("doctor")
        .chain(args.iter().copied())
        .collect();
    canaryd_async(&args, server).await
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asserts the doctor's answer: exactly `failed` fail, and the CLI exits 1 printing them.
async fn assert_only_failing(app: &TestApp, failed: &[String]) -> Value {
    let report = doctor(&app.url).await;
    assert_eq!(names(&report), expected_names(), "{report:#}");
    assert_eq!(failing(&report), failed, "{report:#}");
    assert_eq!(report["ok"], false);
    let out = cli(&["--host", HOST], &app.url).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    for name in failed {
        assert!(
            text.lines()
                .any(|l| l.contains(" FAIL ") && l.contains(name.as_str())),
            "a FAIL line for {name}: {text}"
        );
    }
    report
}

#[tokio::test]
async fn a_healthy_host_passes_every_check_and_the_cli_exits_zero_with_a_line_per_check() {
    let app = TestApp::spawn().await;
    let report = doctor(&app.url).await;
    assert_eq!(report["host"], HOST);
    assert_eq!(report["ok"], true, "{report:#}");
    assert!(
        chrono::DateTime::parse_from_rfc3339(report["checked_at"].as_str().expect("time")).is_ok()
    );
    assert_eq!(names(&report), expected_names());
    for check in report["checks"].as_array().expect("checks") {
        assert_eq!(check["ok"], true, "{check}");
        let keys: Vec<&String> = check.as_object().expect("object").keys().collect();
        assert_eq!(keys, ["detail", "name", "ok"], "{check}");
    }
    assert!(detail(&report, "dry_run_supported").contains("422"));
    assert!(detail(&report, "version_names_project").contains("project work"));
    assert!(detail(&report, "newest_tag_time").contains("not reported"));

    // Nothing that changes the host was sent: only reads and the refused evict probe.
    for call in app.sim.calls() {
        let allowed = matches!(
            (call.method.as_str(), call.path.as_str()),
            ("GET", "/status") | ("GET", "/version") | ("POST", "/compose/logs")
        ) || (call.path == "/docker/evict" && call.body == json!({}));
        assert!(allowed, "the doctor sent {} {}", call.method, call.path);
    }
    assert!(app.compose_calls().is_empty());

    let out = cli(&["--host", HOST], &app.url).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), expected_names().len(), "{text}");
    for (line, name) in lines.iter().zip(expected_names()) {
        assert!(line.starts_with(&format!("{HOST}  ok ")), "{line}");
        assert!(line.contains(&format!(" {name} ")), "{line}");
    }
    // Without --host: every configured host (the one).
    let out = cli(&[], &app.url).await;
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert_eq!(stdout(&out).lines().count(), expected_names().len());
    app.stop().await;
}

#[tokio::test]
async fn a_viewer_may_run_the_doctor_and_the_last_report_is_listed_with_the_hosts() {
    let app = TestApp::spawn_custom(
        sim_config(),
        TestOptions::with_tokens("op-secret", "oncall-secret", "viewer-secret"),
    )
    .await;
    let (status, hosts) = get(&app.url, "/v1/hosts", Some("viewer-secret")).await;
    assert_eq!(status, 200, "{hosts}");
    assert_eq!(
        hosts,
        json!([{"host": HOST, "project": "work", "replicas": [R1, R2], "last_doctor": null}])
    );
    let (status, _) = get(&app.url, &format!("/v1/hosts/{HOST}/doctor"), None).await;
    assert_eq!(status, 401, "a token is needed");
    let (status, report) = get(
        &app.url,
        &format!("/v1/hosts/{HOST}/doctor"),
        Some("viewer-secret"),
    )
    .await;
    assert_eq!(status, 200, "{report}");
    let (_, hosts) = get(&app.url, "/v1/hosts", Some("viewer-secret")).await;
    assert_eq!(
        hosts[0]["last_doctor"], report,
        "the last report is remembered"
    );
    app.stop().await;
}

#[tokio::test]
async fn an_unknown_host_is_a_json_404_and_the_cli_exits_two() {
    let app = TestApp::spawn().await;
    let (status, body) = get(&app.url, "/v1/hosts/gpu99/doctor", None).await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "unknown_host", "{body}");
    let out = cli(&["--host", "gpu99"], &app.url).await;
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown_host"));
    app.stop().await;

    let out = cli(&[], "http://127.0.0.1:9").await;
    assert_eq!(out.status.code(), Some(2), "no daemon there");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach canaryd"));
}

#[tokio::test]
async fn a_legacy_host_fails_only_dry_run_support() {
    let app = TestApp::spawn().await;
    app.sim.faults().set_legacy(true);
    let report = assert_only_failing(&app, &["dry_run_supported".to_owned()]).await;
    let detail = detail(&report, "dry_run_supported");
    assert!(detail.contains("404"), "{detail}");
    assert!(detail.contains("compose_manager_unsupported"), "{detail}");
    app.stop().await;
}

#[tokio::test]
async fn an_engine_whose_health_never_comes_fails_its_health_and_its_group() {
    let app = TestApp::spawn().await;
    app.sim.faults().set_health_never(R2, true);
    let report = assert_only_failing(
        &app,
        &[
            format!("health:{R2}"),
            "peers_healthy:glm53-long".to_owned(),
        ],
    )
    .await;
    assert!(detail(&report, &format!("health:{R2}")).contains("503"));
    let peers = detail(&report, "peers_healthy:glm53-long");
    assert!(
        peers.contains(&format!("a rollout of {R1} fails peers_unhealthy")),
        "{peers}"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_host_whose_env_files_lack_a_required_variable_fails_every_logs_check_with_the_server_message(
) {
    let app = TestApp::spawn().await;
    app.sim.faults().set_host_env("PROXY_TOKEN", None);
    let report = assert_only_failing(
        &app,
        &[format!("compose_logs:{R1}"), format!("compose_logs:{R2}")],
    )
    .await;
    for service in [R1, R2] {
        let detail = detail(&report, &format!("compose_logs:{service}"));
        assert!(
            detail.contains("(500)"),
            "the HTTP status is kept: {detail}"
        );
        assert!(
            detail.contains("docker compose failed (exit 1)"),
            "the server's message is kept: {detail}"
        );
        assert!(detail.contains("PROXY_TOKEN"), "{detail}");
    }
    let out = cli(&["--host", HOST], &app.url).await;
    let line = stdout(&out)
        .lines()
        .find(|l| l.contains(&format!("compose_logs:{R1}")))
        .map(str::to_owned)
        .expect("a line for r1's logs");
    assert!(
        line.contains("FAIL") && line.contains("PROXY_TOKEN"),
        "one line with the server's message: {line}"
    );

    // The variable is back in the host's env files: the doctor is happy again.
    app.sim
        .faults()
        .set_host_env("PROXY_TOKEN", Some("restored-proxy-token"));
    let report = doctor(&app.url).await;
    assert_eq!(report["ok"], true, "{report:#}");
    app.stop().await;
}

/// A daemon whose config holds a compose-manager token the host does not accept.
struct WrongToken {
    sim: SimHost,
    url: String,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    _dir: tempfile::TempDir,
}

impl WrongToken {
    async fn start() -> WrongToken {
        let cfg = sim_config();
        let env = cfg.initial_env.clone();
        let sim = SimHost::start(cfg).await.expect("sim");
        let dir = tempfile::tempdir().expect("temp dir");
        let listen = "127.0.0.1:0".parse().expect("addr");
        let mut config = dev_config(&sim, listen, dir.path().join("canaryd.db"), env);
        let host = config.hosts.get_mut(HOST).expect("the dev host");
        host.token = Secret::new("rotated-away-token");
        host.token_env = Some("GPU02_COMPOSE_MANAGER_TOKEN".to_owned());
        let app = App::build(config, fast_runbooks())
            .await
            .expect("daemon builds");
        let url = format!("http://{}", app.local_addr().expect("bound"));
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(app.run_until_stopped(async {
            let _ = rx.await;
        }));
        WrongToken {
            sim,
            url,
            stop,
            server,
            _dir: dir,
        }
    }
}

#[tokio::test]
async fn a_refused_compose_manager_token_fails_the_token_check_and_the_logs_it_blocks() {
    let daemon = WrongToken::start().await;
    let report = doctor(&daemon.url).await;
    assert_eq!(names(&report), expected_names());
    assert_eq!(
        failing(&report),
        [
            "token_accepted".to_owned(),
            format!("compose_logs:{R1}"),
            format!("compose_logs:{R2}")
        ]
    );
    let token = detail(&report, "token_accepted");
    assert!(token.contains("401"), "{token}");
    assert!(
        token.contains("the env var GPU02_COMPOSE_MANAGER_TOKEN (hosts.gpu02.token_env)"),
        "{token}"
    );
    assert!(!token.contains("rotated-away-token"), "no secret: {token}");
    assert!(detail(&report, &format!("compose_logs:{R1}")).contains("token_accepted"));
    let logs_calls = daemon
        .sim
        .calls()
        .iter()
        .filter(|c| c.path == "/compose/logs")
        .count();
    assert_eq!(logs_calls, 0, "no logs call is sent with a refused token");

    let out = cli(&[], &daemon.url).await;
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("FAIL  token_accepted"),
        "{}",
        stdout(&out)
    );
    // A canary sent anyway fails at its first call, naming the env var to fix.
    let created: serde_json::Value = reqwest::Client::new()
        .post(format!("{}/v1/rollouts", daemon.url))
        .json(&crate::helpers::TestApp::plan("v0.0.452"))
        .send()
        .await
        .expect("posted")
        .json()
        .await
        .expect("json");
    let id = created["id"].as_str().expect("id").to_owned();
    let mut ended = serde_json::Value::Null;
    for _ in 0..300 {
        ended = reqwest::get(format!("{}/v1/rollouts/{id}", daemon.url))
            .await
            .expect("answers")
            .json()
            .await
            .expect("json");
        if ended["status"] == "failed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(ended["error"]["code"], "compose_unauthorized", "{ended:#}");
    let message = ended["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("the env var GPU02_COMPOSE_MANAGER_TOKEN (hosts.gpu02.token_env)"),
        "{message}"
    );
    let _ = daemon.stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), daemon.server).await;
    daemon.sim.shutdown().await;
}
