//! What the real compose-manager does that a kind simulator would not: dependencies
//! in every plan, logs that cannot be read, a rate limit that looks like a missing tag, a lock
//! that is released with the stream while compose still works, and busy refusals. The
//! simulated host reproduces each; each test failed before canaryd handled it.

use std::path::Path;
use std::time::Duration;

use canaryd::domain::runbook::{self, StepKind};
use canaryd_sim::SimOp;
use serde_json::{json, Value};

use crate::helpers::{is_dry_run, sim_config, TestApp, TestOptions, R2};

const CANARY_TAG: &str = "v0.0.452";

fn repo(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// (runbook, step, allow) of every plan step of the target in a runbook folder (a companion
/// step's gate is about other services).
fn plan_gates(dir: &str) -> Vec<(String, String, Vec<String>)> {
    let books = runbook::load_dir(&repo(dir)).expect("runbooks load");
    let mut gates = Vec::new();
    for (name, book) in books {
        for step in book.steps {
            if let StepKind::Plan(plan) = step.kind {
                if !plan.scope.is_companion() {
                    let allow = plan.allow.iter().map(|a| a.to_string()).collect();
                    gates.push((name.clone(), step.name, allow));
                }
            }
        }
    }
    gates
}

#[tokio::test]
async fn the_shipped_runbooks_canary_and_roll_back_on_a_host_that_plans_the_one_shot_dependency() {
    // The production runbooks and their fast dev copies gate alike, and tolerate the exited
    // downloader that compose plans for every scoped up.
    let shipped = plan_gates("runbooks");
    let dev_gates = plan_gates("config/dev/runbooks");
    let same: Vec<_> = shipped
        .iter()
        .filter(|(book, _, _)| dev_gates.iter().any(|(b, _, _)| b == book))
        .cloned()
        .collect();
    assert_eq!(same, dev_gates);
    assert_eq!(same.len(), 5, "{shipped:?}");
    // The long-context runbooks (no dev copy) gate their target alike.
    assert_eq!(shipped.len(), 9, "{shipped:?}");
    for (book, step, allow) in &shipped {
        assert_eq!(allow, &["model-downloader"], "{book}/{step}");
    }

    let dev = runbook::load_dir(&repo("config/dev/runbooks")).expect("dev runbooks");
    let opts = TestOptions {
        runbooks: Some(dev),
        ..TestOptions::default()
    };
    let app = TestApp::spawn_custom(sim_config(), opts).await;
    let r1 = app.container_id(crate::helpers::R1);
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    let canary = app.wait_terminal(&id).await;
    assert_eq!(canary.status, "succeeded", "{canary:#?}");
    let plan_of = |r: &canaryd::api::RolloutOut, step: &str| {
        r.steps.iter().find(|s| s.name == step).expect(step).detail["plan"].clone()
    };
    // The real server's plans: the downloader is `create` in both dry runs.
    assert_eq!(
        plan_of(&canary, "preflight"),
        json!({"create": ["model-downloader"], "recreate": [R2], "remove": [], "unchanged": [], "resources": []})
    );
    assert_eq!(
        plan_of(&canary, "plan")["create"],
        json!(["model-downloader", R2])
    );

    let (status, rollback) = app
        .post(
            "/v1/rollbacks",
            &json!({"host": "gpu02", "service": R2, "reason": "back"}),
        )
        .await;
    assert_eq!(status, 201, "{rollback}");
    let rollback = app
        .wait_terminal(rollback["id"].as_str().expect("id"))
        .await;
    assert_eq!(rollback.status, "succeeded", "{rollback:#?}");
    assert_eq!(rollback.tag, "v0.0.450");
    assert_eq!(app.container_id(crate::helpers::R1), r1, "r1 untouched");
    for call in app.compose_calls() {
        assert_eq!(call.body["services"], json!([R2]), "{call:?}");
    }
    app.stop().await;
}

/// The step's error as (code, message).
fn step_error(r: &canaryd::api::RolloutOut, step: &str) -> (String, String) {
    let s = r.steps.iter().find(|s| s.name == step).expect(step);
    let e = &s.detail["error"];
    (
        e["code"].as_str().unwrap_or_default().to_owned(),
        e["message"].as_str().unwrap_or_default().to_owned(),
    )
}

#[tokio::test]
async fn a_forbidden_line_printed_while_the_logs_cannot_be_read_never_lets_the_canary_succeed() {
    let app = TestApp::spawn().await;
    let mut soak = app.engine.pause_at("step:soak:started");
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    assert!(soak.reached(Duration::from_secs(20)).await.is_some());
    // The host's env files lose PROXY_TOKEN: every logs call answers 500 from now on, and the
    // engine prints a line the soak forbids.
    app.sim.faults().set_host_env("PROXY_TOKEN", None);
    app.sim
        .faults()
        .emit_log_line(R2, "CUDA error: an illegal memory access was encountered");
    soak.release();
    let canary = app.wait_terminal(&id).await;
    assert_eq!(canary.status, "failed", "{canary:#?}");
    assert_eq!(
        canary.error.as_ref().map(|e| e.code.as_str()),
        Some("logs_unavailable")
    );
    let (code, message) = step_error(&canary, "soak");
    assert_eq!(code, "logs_unavailable");
    assert!(
        message.contains("required variable PROXY_TOKEN is missing a value"),
        "{message}"
    );
    let soak = canary
        .steps
        .iter()
        .find(|s| s.name == "soak")
        .expect("soak");
    assert_eq!(
        soak.detail["log_fetch_failures_in_a_row"], 3,
        "{:#}",
        soak.detail
    );
    assert!(canary.rolled_back_by.is_some(), "the canary is rolled back");
    app.stop().await;
}

#[tokio::test]
async fn a_wait_for_startup_lines_says_why_the_logs_could_not_be_read() {
    let app = TestApp::spawn().await;
    let mut plan = TestApp::plan(CANARY_TAG);
    plan["on_failure"] = json!("halt");
    // Once the target is down: logs unreadable from the start are caught before it
    // (`signal_unavailable`, tests/it/preflight.rs).
    let mut up = app.engine.pause_at("step:up:started");
    let id = app.start_canary(&plan).await;
    assert!(up.reached(Duration::from_secs(20)).await.is_some());
    app.sim.faults().set_host_env("PROXY_TOKEN", None);
    up.release();
    let canary = app.wait_terminal(&id).await;
    assert_eq!(canary.status, "failed", "{canary:#?}");
    let (code, message) = step_error(&canary, "startup-logs");
    assert_eq!(code, "logs_unavailable", "not logs_timeout: {message}");
    assert!(message.contains("(500)"), "the status: {message}");
    assert!(
        message.contains("PROXY_TOKEN"),
        "the server's message: {message}"
    );
    let step = canary
        .steps
        .iter()
        .find(|s| s.name == "startup-logs")
        .expect("step");
    assert_eq!(
        step.detail["last_log_error"]["code"],
        "compose_server_error"
    );
    assert!(step.detail["last_log_error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("PROXY_TOKEN")));
    app.stop().await;
}

#[tokio::test]
async fn a_rate_limited_tag_after_the_down_is_retried_and_the_replica_ends_up_serving() {
    let app = TestApp::spawn().await;
    let mut after_down = app.engine.pause_at("step:plan:started");
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    assert!(after_down.reached(Duration::from_secs(20)).await.is_some());
    // The git host's rate limit: the next three calls answer `400 tag not found`.
    app.sim.faults().rate_limit_tags(3);
    after_down.release();
    let canary = app.wait_terminal(&id).await;
    assert_eq!(canary.status, "succeeded", "{canary:#?}");
    let plan = canary
        .steps
        .iter()
        .find(|s| s.name == "plan")
        .expect("plan");
    let outcomes: Vec<&str> = plan
        .calls
        .iter()
        .map(|c| c.outcome.map_or("in flight", |o| o.as_str()))
        .collect();
    assert_eq!(
        outcomes,
        ["error", "error", "error", "succeeded"],
        "{plan:#?}"
    );
    assert!(plan.calls[0]
        .error
        .as_deref()
        .is_some_and(|e| e.contains("does not know tag")));
    assert_eq!(plan.attempts, 4);
    let r2 = app
        .sim
        .containers()
        .into_iter()
        .find(|c| c.service == R2)
        .expect("r2 has a container");
    assert_eq!(
        (r2.state.as_str(), r2.tag.as_str()),
        ("running", CANARY_TAG)
    );
    app.stop().await;
}

#[tokio::test]
async fn a_tag_unknown_before_anything_changed_still_fails_at_once() {
    let app = TestApp::spawn().await;
    app.sim.faults().rate_limit_tags(1);
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    let canary = app.wait_terminal(&id).await;
    assert_eq!(canary.status, "failed");
    assert_eq!(
        canary.error.as_ref().map(|e| e.code.as_str()),
        Some("tag_not_found"),
        "the tag never resolved in this rollout: not retried"
    );
    let message = canary
        .error
        .as_ref()
        .map(|e| e.message.clone())
        .unwrap_or_default();
    for says in [
        "nothing on the host was touched",
        "exists in the compose repo",
        "older than the host's minimum tag age",
    ] {
        assert!(
            message.contains(says),
            "the message says what to check: {message}"
        );
    }
    app.stop().await;
}

/// Counts `replica_left_down` notifications in the outbox.
async fn left_down_notifications(app: &TestApp) -> Vec<Value> {
    let url = format!("sqlite://{}", app.db.display());
    let pool = sqlx::SqlitePool::connect(&url).await.expect("open db");
    let rows: Vec<(String,)> =
        sqlx::query_as("select payload from outbox where event = 'replica_left_down'")
            .fetch_all(&pool)
            .await
            .expect("outbox");
    pool.close().await;
    rows.into_iter()
        .map(|(p,)| serde_json::from_str(&p).expect("payload"))
        .collect()
}

async fn metric(app: &TestApp, name: &str) -> String {
    let text = reqwest::get(format!("{}/metrics", app.url))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    text.lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn a_rollback_that_cannot_bring_the_replica_back_ends_replica_left_down_loudly() {
    let app = TestApp::spawn().await;
    let faults = app.sim.faults();
    // The canary's up fails; so does its automatic rollback's up: r2 stays without a
    // running container.
    faults.fail_phase(SimOp::Up, Some("up".into()));
    let mut canary_up = app.engine.pause_at("step:up:started");
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    assert!(canary_up.reached(Duration::from_secs(20)).await.is_some());
    let mut rollback_up = app.engine.pause_at("step:up:started");
    canary_up.release();
    let rollback_id = rollback_up
        .reached(Duration::from_secs(20))
        .await
        .expect("the automatic rollback reaches its up");
    assert_ne!(rollback_id, id);
    faults.fail_phase(SimOp::Up, Some("up".into()));
    rollback_up.release();
    let canary = app.wait_terminal(&id).await;
    assert_eq!(canary.status, "failed");
    assert_eq!(canary.rolled_back_by.as_deref(), Some(rollback_id.as_str()));
    let canary_error = canary.error.clone().expect("error");
    assert_eq!(
        canary_error.code, "compose_failed",
        "the canary was rolled back, not left down"
    );
    let rollback = app.wait_terminal(&rollback_id).await;
    assert_eq!(rollback.status, "failed", "{rollback:#?}");
    let error = rollback.error.clone().expect("error");
    assert_eq!(error.code, "replica_left_down");
    assert!(
        error.message.contains("compose_failed"),
        "the cause: {}",
        error.message
    );
    assert!(app
        .audit_kinds(&rollback_id)
        .await
        .contains(&"replica_left_down".to_owned()));
    let sent = left_down_notifications(&app).await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["rollout"]["id"], json!(rollback_id));
    assert_eq!(sent[0]["error"]["code"], "replica_left_down");
    assert_eq!(
        metric(&app, "canaryd_replicas_down").await,
        "canaryd_replicas_down 1"
    );
    let (_, replicas) = get(&app, "/v1/replicas").await;
    let r2 = replicas
        .as_array()
        .and_then(|l| l.iter().find(|r| r["service"] == R2))
        .expect("r2 listed")
        .clone();
    assert_eq!(r2["left_down"], true, "{r2}");

    // A later rollout that brings r2 back clears it.
    let id = app.start_canary(&TestApp::plan("v0.0.451")).await;
    let again = app.wait_terminal(&id).await;
    assert_eq!(again.status, "succeeded", "{again:#?}");
    assert_eq!(
        metric(&app, "canaryd_replicas_down").await,
        "canaryd_replicas_down 0"
    );
    app.stop().await;
}

async fn get(app: &TestApp, path: &str) -> (u16, Value) {
    let res = reqwest::get(format!("{}{path}", app.url))
        .await
        .expect("request");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn no_compose_call_is_sent_while_an_abandoned_up_still_changes_the_target() {
    let app = TestApp::spawn().await;
    // The up's stream ends early and the lock goes with it; compose goes on: it creates and
    // starts r2 (taken down before) 400 ms after the cut. /status reads idle all along.
    // (The tests' settle interval is 500 ms.)
    let work = Duration::from_millis(1200);
    app.sim.faults().abandon_up(work);
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    let canary = app.wait_terminal(&id).await;
    assert_eq!(canary.status, "failed", "{canary:#?}");
    assert_eq!(
        canary.error.as_ref().map(|e| e.code.as_str()),
        Some("compose_outcome_unknown")
    );
    let up = canary.steps.iter().find(|s| s.name == "up").expect("up");
    assert_eq!(up.detail["target_settled"], true, "{:#}", up.detail);
    assert!(
        up.detail["settle"]["target_changes"].as_u64() >= Some(1),
        "the settle wait saw the target change: {:#}",
        up.detail
    );
    let rollback_id = canary.rolled_back_by.clone().expect("automatic rollback");
    app.wait_terminal(&rollback_id).await;
    // The real up that was cut, and the next compose call (the rollback's dry run).
    let calls = app.compose_calls();
    let cut = calls
        .iter()
        .position(|c| !is_dry_run(c) && c.path == "/compose/up" && c.body["tag"] == CANARY_TAG)
        .expect("the canary's up");
    let next = calls.get(cut + 1).expect("a later call");
    let gap = (next.at - calls[cut].at).to_std().expect("later");
    let last_change = work / 3;
    assert!(
        gap >= last_change,
        "the next compose call came {gap:?} after the cut up; compose changed r2 until {last_change:?} after it"
    );
    app.stop().await;
}

#[tokio::test]
async fn every_busy_refusal_is_a_call_in_the_api_with_its_time() {
    let app = TestApp::spawn().await;
    let mut down = app.engine.pause_at("step:down:started");
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    assert!(down.reached(Duration::from_secs(20)).await.is_some());
    app.sim.faults().busy_for(Duration::from_millis(500));
    down.release();
    let canary = app.wait_terminal(&id).await;
    assert_eq!(canary.status, "succeeded", "{canary:#?}");
    let (status, raw) = get(&app, &format!("/v1/rollouts/{id}")).await;
    assert_eq!(status, 200);
    let step = raw["steps"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "down"))
        .expect("down step")
        .clone();
    let calls = step["calls"].as_array().expect("calls listed").clone();
    assert!(calls.len() >= 2, "{step:#}");
    assert_eq!(step["attempts"], json!(calls.len()), "{step:#}");
    let (last, refused) = calls.split_last().expect("calls");
    assert_eq!(last["outcome"], "succeeded");
    for c in refused {
        assert_eq!(c["outcome"], "busy", "{c}");
        assert!(
            c["error"].as_str().is_some_and(|e| e.contains("(409)")),
            "{c}"
        );
        assert!(
            c["started_at"].is_string() && c["finished_at"].is_string(),
            "{c}"
        );
    }
    // Compared as times, not text: a time on a whole second is printed without a fraction
    // (`…:50Z` sorts after `…:50.109Z` as text).
    let times: Vec<chrono::DateTime<chrono::Utc>> = calls
        .iter()
        .filter_map(|c| c["started_at"].as_str())
        .filter_map(|t| t.parse().ok())
        .collect();
    assert_eq!(times.len(), calls.len(), "every call has a start time");
    assert!(times.windows(2).all(|w| w[0] < w[1]), "in order: {times:?}");
    app.stop().await;
}

/// A call whose stream ends without `done` while the host stays busy ends its step at the
/// step's deadline, not 30 s after the cut: the step's settle wait is bounded by its timeout,
/// and the automatic rollback waits for the host itself before its first call, sending
/// nothing while the host is busy (safety rule 13).
#[tokio::test]
async fn an_unknown_outcome_ends_its_step_by_the_deadline_and_the_rollback_sends_nothing_while_busy(
) {
    let app = TestApp::spawn().await;
    let faults = app.sim.faults();
    // The up's lines come slowly, and its stream ends without `done`.
    faults.cut_stream(Some(canaryd_sim::SimOp::Up));
    faults.set_line_delay(Some(Duration::from_millis(100)));
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    let real_up = |app: &TestApp| {
        app.compose_calls()
            .iter()
            .any(|c| !is_dry_run(c) && c.path == "/compose/up" && c.body["tag"] == CANARY_TAG)
    };
    for _ in 0..500 {
        if real_up(&app) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(real_up(&app), "the up is in flight");
    // From now on the host reads busy (another operation, or the abandoned child).
    let busy = Duration::from_secs(12);
    let busy_until = chrono::Utc::now() + busy;
    faults.busy_for(busy);
    let canary = app.wait_terminal(&id).await;
    assert_eq!(
        canary.error.as_ref().map(|e| e.code.as_str()),
        Some("compose_outcome_unknown"),
        "{canary:#?}"
    );
    let up = canary.steps.iter().find(|s| s.name == "up").expect("up");
    let (Some(deadline), Some(finished)) = (up.deadline_at, up.finished_at) else {
        panic!("the up has a deadline and an end: {up:#?}");
    };
    let past = (finished - deadline).num_milliseconds();
    // Before, the wait ran at least 30 s past the cut (25 s past this 5 s up's deadline); it
    // now ends at the deadline (what is left is one read of the host and the write).
    assert!(
        past < 10_000,
        "the up ended {past} ms past its deadline: {up:#?}"
    );
    assert_eq!(up.detail["host_idle"], false, "{:#}", up.detail);
    let rollback_id = canary.rolled_back_by.clone().expect("automatic rollback");
    tokio::time::sleep(busy).await;
    let rollback = app.wait_terminal(&rollback_id).await;
    assert_eq!(rollback.status, "succeeded", "{rollback:#?}");
    let calls = app.compose_calls();
    let cut = calls
        .iter()
        .position(|c| !is_dry_run(c) && c.path == "/compose/up" && c.body["tag"] == CANARY_TAG)
        .expect("the canary's up");
    let early: Vec<_> = calls[cut + 1..]
        .iter()
        .filter(|c| c.at < busy_until)
        .map(|c| c.path.as_str())
        .collect();
    assert!(
        early.is_empty(),
        "nothing sent while the host is busy: {early:?}"
    );
    assert!(
        calls.len() > cut + 1,
        "the rollback sent its calls once the host was idle"
    );
    app.stop().await;
}
