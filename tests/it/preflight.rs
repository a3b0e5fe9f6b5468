//! Look before you touch (safety rule 20): before the first `down` or `up` of the target, the
//! signals the later steps need are read once; one that cannot be read fails a canary
//! `signal_unavailable` with nothing sent to the target, hence no rollback. A rollback is
//! never blocked by them.

use std::collections::BTreeMap;
use std::time::Duration;

use canaryd::api::RolloutOut;
use canaryd::domain::runbook::{self, Runbook};
use serde_json::{json, Value};

use crate::helpers::{fast_runbooks, is_dry_run, step, with_smoke, FAST_CANARY, FAST_SMOKE};
use crate::helpers::{sim_config, TestApp, TestOptions, HOST, R1, R2};

const CANARY_TAG: &str = "v0.0.452";

/// The fast canary followed by a smoke step and a short analysis.
fn with_smoke_and_analysis() -> BTreeMap<String, Runbook> {
    let canary = FAST_CANARY.as_str();
    let text = format!(
        "{canary}{FAST_SMOKE}\n  - name: analysis\n    kind: analyze\n    warmup: 200ms\n    duration: 600ms\n    interval: 200ms\n    checks:\n      - {{name: took_traffic, counter: \"sglang:num_requests_total\", min: 1}}\n"
    );
    let mut books = fast_runbooks();
    let rb = runbook::parse("single-replica-canary", "test", &text).expect("test runbook");
    books.insert("single-replica-canary".to_owned(), rb);
    books
}

async fn app_with(runbooks: BTreeMap<String, Runbook>) -> TestApp {
    let opts = TestOptions {
        runbooks: Some(runbooks),
        ..TestOptions::default()
    };
    TestApp::spawn_custom(sim_config(), opts).await
}

fn code(r: &RolloutOut) -> Option<&str> {
    r.error.as_ref().map(|e| e.code.as_str())
}

/// The signals a step's detail records, by source.
fn sources<'a>(r: &'a RolloutOut, name: &str, source: &str) -> Vec<&'a Value> {
    step(r, name).detail["signals"]["sources"]
        .as_array()
        .map(|all| all.iter().filter(|s| s["source"] == source).collect())
        .unwrap_or_default()
}

/// Runs a canary that must fail `signal_unavailable` before touching r2: its `down` step
/// failed with nothing sent, r2's container untouched, only dry runs on the host and no
/// rollback. Returns the canary and the error message.
async fn blocked(app: &TestApp) -> (RolloutOut, String) {
    let r2_before = app.container_id(R2).expect("r2 runs");
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "failed", "{r:#?}");
    assert_eq!(code(&r), Some("signal_unavailable"), "{r:#?}");
    let down = step(&r, "down");
    assert_eq!(down.status, "failed");
    assert_eq!(down.detail["error"]["code"], "signal_unavailable");
    assert_eq!(down.detail["sent"], false);
    assert_eq!(down.detail["signals"]["blocking"], true);
    let calls = app.compose_calls();
    assert!(!calls.is_empty(), "the preflight dry run ran");
    assert!(
        calls.iter().all(is_dry_run),
        "nothing but dry runs: {:?}",
        calls.iter().map(|c| &c.path).collect::<Vec<_>>()
    );
    assert_eq!(app.container_id(R2), Some(r2_before), "r2 untouched");
    assert!(r.rolled_back_by.is_none(), "nothing to roll back");
    let list = app
        .api
        .get("/v1/rollouts?kind=rollback")
        .await
        .expect("list");
    assert_eq!(list["items"], json!([]), "no rollback rollout");
    let message = r.error.as_ref().map(|e| e.message.clone());
    (r, message.unwrap_or_default())
}

#[tokio::test]
async fn a_canary_whose_target_logs_cannot_be_read_fails_before_any_down_or_up() {
    let app = TestApp::spawn().await;
    // The host's env files lose PROXY_TOKEN: every compose/logs call answers 500.
    app.sim.faults().set_host_env("PROXY_TOKEN", None);
    let (r, message) = blocked(&app).await;
    assert!(
        message.contains(&format!("logs of {R2}")) && message.contains("500"),
        "names the source and the cause: {message}"
    );
    let logs = sources(&r, "down", "logs");
    assert_eq!(logs.len(), 1, "{logs:?}");
    assert_eq!(logs[0]["ok"], false);
    assert!(
        logs[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("PROXY_TOKEN")),
        "compose-manager's own words: {}",
        logs[0]
    );
    for later in ["plan", "up", "health", "startup-logs", "soak"] {
        assert_eq!(step(&r, later).status, "skipped", "{later}");
    }
    app.stop().await;
}

#[tokio::test]
async fn a_peer_metrics_page_that_cannot_be_read_fails_a_canary_with_an_analysis_before_any_down() {
    let app = app_with(with_smoke_and_analysis()).await;
    app.sim.faults().set_metrics_status(R1, Some(500));
    let (r, message) = blocked(&app).await;
    assert!(
        message.contains(&format!("metrics page of {R1}")) && message.contains("HTTP 500"),
        "{message}"
    );
    let pages = sources(&r, "down", "metrics");
    let of = |name: &str| pages.iter().find(|p| p["replica"] == name).copied();
    assert_eq!(of(R1).map(|p| &p["ok"]), Some(&json!(false)), "{pages:?}");
    assert_eq!(of(R2).map(|p| &p["ok"]), Some(&json!(true)), "{pages:?}");
    app.stop().await;
}

#[tokio::test]
async fn an_engine_api_that_refuses_canaryd_fails_a_canary_with_a_smoke_before_any_down() {
    let app = app_with(with_smoke(FAST_SMOKE)).await;
    // The engines want a token the config does not give: every API call answers 401.
    app.sim
        .faults()
        .require_api_token(Some("the-engine-wants-this"));
    let (r, message) = blocked(&app).await;
    assert!(
        message.contains(&format!("engine API of {R2}")) && message.contains("401"),
        "{message}"
    );
    assert!(message.contains("/v1/models"), "{message}");
    assert_eq!(sources(&r, "down", "engine_api")[0]["ok"], false);
    app.stop().await;
}

#[tokio::test]
async fn a_canary_reads_every_signal_once_before_its_down_and_records_them() {
    let app = app_with(with_smoke_and_analysis()).await;
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let signals = &step(&r, "down").detail["signals"];
    assert_eq!(signals["blocking"], true, "{signals:#}");
    let read: Vec<(String, String)> = signals["sources"]
        .as_array()
        .expect("sources")
        .iter()
        .map(|s| {
            assert_eq!(s["ok"], true, "{s}");
            let of = s["service"].as_str().or(s["replica"].as_str());
            (
                s["source"].as_str().unwrap_or_default().to_owned(),
                of.unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let pair = |s: &str, of: &str| (s.to_owned(), of.to_owned());
    assert_eq!(
        read,
        [
            pair("logs", R2),
            pair("engine_api", R2),
            pair("metrics", R2),
            pair("metrics", R1)
        ]
    );
    // Read once: the up that follows the down reads nothing again.
    assert!(step(&r, "up").detail.get("signals").is_none());
    app.stop().await;
}

#[tokio::test]
async fn a_target_that_does_not_serve_is_not_read_and_does_not_block_its_canary() {
    let app = app_with(with_smoke_and_analysis()).await;
    let mut down = app.engine.pause_at("step:down:started");
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    assert!(down.reached(Duration::from_secs(20)).await.is_some());
    // The old engine fails: /health, its API and its page answer 503 until the new one runs.
    app.sim.faults().set_health_never(R2, true);
    let mut up = app.engine.pause_at("step:up:started");
    down.release();
    assert!(up.reached(Duration::from_secs(20)).await.is_some());
    app.sim.faults().set_health_never(R2, false);
    up.release();
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let api = sources(&r, "down", "engine_api");
    assert!(
        api[0]["skipped"]
            .as_str()
            .is_some_and(|why| why.contains("does not serve") && why.contains("503")),
        "{api:?}"
    );
    let pages = sources(&r, "down", "metrics");
    let target = pages.iter().find(|p| p["replica"] == R2).expect("target");
    assert!(target["skipped"].is_string(), "{target}");
    let peer = pages.iter().find(|p| p["replica"] == R1).expect("peer");
    assert_eq!(peer["ok"], true, "the peer's page is read: {peer}");
    assert_eq!(sources(&r, "down", "logs")[0]["ok"], true);
    app.stop().await;
}

#[tokio::test]
async fn a_rollback_is_not_blocked_by_a_signal_it_cannot_read() {
    let app = TestApp::spawn().await;
    let id = app.start_canary(&TestApp::plan("v0.0.451")).await;
    assert_eq!(app.wait_terminal(&id).await.status, "succeeded");
    app.sim.faults().set_host_env("PROXY_TOKEN", None);
    let calls_before = app.compose_calls().len();
    let (status, body) = app
        .post(
            "/v1/rollbacks",
            &json!({"host": HOST, "service": R2, "reason": "logs broken"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let rb = app.wait_terminal(body["id"].as_str().expect("id")).await;
    // It restored the replica; its own log step then could not read the logs.
    assert_eq!(step(&rb, "down").status, "succeeded", "{rb:#?}");
    assert_eq!(step(&rb, "up").status, "succeeded", "{rb:#?}");
    assert_eq!(code(&rb), Some("logs_unavailable"), "{rb:#?}");
    let signals = &step(&rb, "down").detail["signals"];
    assert_eq!(signals["blocking"], false, "{signals:#}");
    assert_eq!(sources(&rb, "down", "logs")[0]["ok"], false);
    let sent = &app.compose_calls()[calls_before..];
    assert!(
        sent.iter().any(|c| c.path == "/compose/down"),
        "the rollback's down was sent"
    );
    app.stop().await;
}
