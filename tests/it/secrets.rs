//! Secrets (the host env file's values, API and compose-manager tokens) never reach SQLite, the
//! logs or an API answer (safety rule 8, docs/safety.md). A secret is planted in each, a canary and
//! a failing canary (with its automatic rollback) run, then the database file, its WAL, every log
//! line and every answer are searched for it.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use canaryd_sim::SimOp;
use serde_json::json;

use crate::helpers::{sim_config, TestApp, TestOptions, HOST, R2};

const ENV_SECRET: &str = "envsecret-7f3a9c1e5b2d";
const OVERRIDE_KEY_SECRET: &str = "hfsecret-0c4e8a2f6b1d";
const OPERATOR: &str = "apisecret-operator-9d8c7b6a";
const ONCALL: &str = "apisecret-oncall-5e4d3c2b";
const VIEWER: &str = "apisecret-viewer-1a2b3c4d";
const COMPOSE_TOKEN: &str = "cmsecret-token-6f5e4d3c";

/// Collects every formatted log line of the test's thread.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut v) = self.0.lock() {
            v.extend_from_slice(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn secrets() -> [&'static str; 6] {
    [
        ENV_SECRET,
        OVERRIDE_KEY_SECRET,
        OPERATOR,
        ONCALL,
        VIEWER,
        COMPOSE_TOKEN,
    ]
}

fn assert_clean(what: &str, bytes: &[u8]) {
    for secret in secrets() {
        let found = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
        assert!(!found, "{secret} leaked into {what}");
    }
}

// One thread: every task (daemon, engine, simulated host) logs into the captured subscriber.
#[tokio::test(flavor = "current_thread")]
async fn a_planted_secret_never_reaches_sqlite_the_logs_or_an_answer() {
    let logs = Captured::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("trace")
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let mut cfg = sim_config();
    cfg.token = COMPOSE_TOKEN.to_owned();
    cfg.initial_env
        .insert("PLANTED_SECRET".to_owned(), ENV_SECRET.to_owned());
    cfg.initial_env.insert(
        "HUGGING_FACE_HUB_TOKEN".to_owned(),
        OVERRIDE_KEY_SECRET.to_owned(),
    );
    let opts = TestOptions::with_tokens(OPERATOR, ONCALL, VIEWER);
    let app = TestApp::spawn_custom(cfg, opts).await;
    let op = format!("Bearer {OPERATOR}");
    let http = reqwest::Client::new();
    let mut answers: Vec<u8> = Vec::new();

    // A canary that succeeds, with an override (the plan's overrides are stored, by contract).
    let mut plan = TestApp::plan("v0.0.452");
    plan["env"] = json!({"GLM53_R2_HICACHE_RAM_BUDGET": "406GiB-override-marker"});
    let ok = app.api.post("/v1/rollouts", &plan).await.expect("created");
    answers.extend(ok.to_string().as_bytes());
    let ok_id = ok["id"].as_str().expect("id").to_owned();
    let r = app.wait_terminal(&ok_id).await;
    assert_eq!(r.status, "succeeded", "{:?}", r.error);

    // A canary that fails after touching r2, so a rollback runs too.
    app.sim.faults().fail_phase(SimOp::Up, Some("up".into()));
    let bad = app
        .api
        .post("/v1/rollouts", &TestApp::plan("v0.0.451"))
        .await
        .expect("created");
    let bad_id = bad["id"].as_str().expect("id").to_owned();
    let failed = app.wait_terminal(&bad_id).await;
    assert_eq!(failed.status, "failed");
    let rb_id = failed.rolled_back_by.clone().expect("a rollback ran");
    app.wait_terminal(&rb_id).await;

    // Every answer the API gives about them.
    let mut paths = vec![
        "/v1/rollouts".to_owned(),
        "/v1/rollouts?format=csv".to_owned(),
        "/v1/replicas".to_owned(),
        format!("/v1/replicas/{HOST}/{R2}/deployments"),
        "/metrics".to_owned(),
    ];
    for id in [&ok_id, &bad_id, &rb_id] {
        paths.push(format!("/v1/rollouts/{id}"));
        paths.push(format!("/v1/rollouts/{id}/audit"));
        paths.push(format!("/v1/rollouts/{id}/events"));
    }
    for path in &paths {
        let res = http
            .get(format!("{}{path}", app.url))
            .header("authorization", &op)
            .send()
            .await
            .expect("answers");
        assert!(res.status().is_success(), "{path}: {}", res.status());
        let mut res = res;
        // Event streams replay the past, then stay open: read what came within a moment.
        let read = async {
            while let Ok(Some(chunk)) = res.chunk().await {
                answers.extend_from_slice(&chunk);
            }
        };
        let _ = tokio::time::timeout(Duration::from_millis(500), read).await;
    }
    // Refusals too.
    for auth in ["Bearer wrong", &format!("Bearer {VIEWER}")] {
        let res = http
            .post(format!("{}/v1/rollouts", app.url))
            .header("authorization", auth)
            .json(&plan)
            .send()
            .await
            .expect("answers");
        answers.extend(res.text().await.unwrap_or_default().as_bytes());
    }
    assert!(answers.len() > 1000, "the answers were read");
    assert_clean("an API answer", &answers);

    let engine = app.engine.clone();
    let stopped = app.stop_gracefully().await;
    engine.store().close().await;
    let db = stopped.db.clone();
    let mut stored = std::fs::read(&db).expect("database file");
    for suffix in ["-wal", "-shm"] {
        let mut path = db.clone().into_os_string();
        path.push(suffix);
        if let Ok(bytes) = std::fs::read(&path) {
            stored.extend(bytes);
        }
    }
    assert!(stored.len() > 10_000, "the database was read");
    assert_clean("the SQLite files", &stored);
    // The plan's override is stored (the contract); the env file's values never are.
    let marker = b"406GiB-override-marker";
    assert!(stored.windows(marker.len()).any(|w| w == marker));

    let logged = logs.0.lock().map(|v| v.clone()).unwrap_or_default();
    let text = String::from_utf8_lossy(&logged);
    assert!(
        text.contains(&ok_id) && text.contains("compose"),
        "the daemon's logs were captured ({} bytes)",
        logged.len()
    );
    assert_clean("the logs", &logged);
    stopped.sim.shutdown().await;
}

/// An engine that prints an env-file value in a line the canary's log step matches: the line
/// is stored (it is the evidence) with the value replaced by `***`, in the API's answer and in
/// the SQLite files.
#[tokio::test]
async fn an_env_value_printed_by_the_engine_is_stored_only_as_stars() {
    const PRINTED: &str = "hf_sim_not_a_real_token";
    let app = TestApp::spawn().await;
    assert_eq!(
        app.env.get("HUGGING_FACE_HUB_TOKEN").map(String::as_str),
        Some(PRINTED),
        "the host's env file holds the value the engine prints"
    );
    let mut logs_step = app.engine.pause_at("step:startup-logs:started");
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    assert!(logs_step.reached(Duration::from_secs(20)).await.is_some());
    app.sim.faults().emit_log_line(
        R2,
        &format!("HUGGING_FACE_HUB_TOKEN={PRINTED} CUDA error 801: operation not supported"),
    );
    logs_step.release();
    let canary = app.wait_terminal(&id).await;
    assert_eq!(
        canary.error.as_ref().map(|e| e.code.as_str()),
        Some("forbidden_log_line"),
        "{canary:#?}"
    );
    let answer = reqwest::get(format!("{}/v1/rollouts/{id}", app.url))
        .await
        .expect("answers")
        .text()
        .await
        .expect("text");
    assert!(
        answer.contains("HUGGING_FACE_HUB_TOKEN=*** CUDA error 801"),
        "the forbidden line is kept, masked: {answer}"
    );
    assert!(!answer.contains(PRINTED), "{answer}");
    if let Some(r) = canary.rolled_back_by.as_deref() {
        app.wait_terminal(r).await;
    }
    let engine = app.engine.clone();
    let stopped = app.stop_gracefully().await;
    engine.store().close().await;
    let mut stored = std::fs::read(&stopped.db).expect("database file");
    for suffix in ["-wal", "-shm"] {
        let mut path = stopped.db.clone().into_os_string();
        path.push(suffix);
        if let Ok(bytes) = std::fs::read(&path) {
            stored.extend(bytes);
        }
    }
    let found = stored
        .windows(PRINTED.len())
        .any(|w| w == PRINTED.as_bytes());
    assert!(!found, "the printed env value reached the SQLite files");
    stopped.sim.shutdown().await;
}
