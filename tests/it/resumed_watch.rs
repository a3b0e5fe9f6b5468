//! Safety rule 19 (docs/recovery.md): time the daemon was not running is not observation. A
//! `soak` or `analyze` killed part-way and restarted after its deadline watches again at
//! least the part of its window nobody watched; lines printed while the daemon was down are
//! judged; a container replaced meanwhile fails the step.

use std::collections::BTreeMap;
use std::time::Duration;

use canaryd::api::{RolloutOut, StepOut};
use canaryd::domain::runbook::{self, Runbook};
use chrono::{DateTime, Utc};

use crate::helpers::{
    canary_with, fast_runbooks, sim_config, step, TestApp, TestOptions, FAST_CANARY, R2,
};

const TAG: &str = "v0.0.452";
/// The fast canary's soak, and the 6 s one these tests kill.
const FAST_SOAK: &str = "duration: 300ms, interval: 50ms, max_misses: 3";
const LONG_SOAK: &str = "duration: 6s, interval: 100ms, max_misses: 3";

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

fn ms(v: &serde_json::Value) -> i64 {
    v.as_i64().unwrap_or_else(|| panic!("a number of ms: {v}"))
}

/// Starts the canary, lets its step `name` run for `into`, and kills the daemon there;
/// returns the step as it was (its start and deadline) and the crashed daemon.
async fn kill_into(
    app: TestApp,
    name: &str,
    into: Duration,
) -> (String, StepOut, crate::helpers::Crashed) {
    let id = app.start_canary(&TestApp::plan(TAG)).await;
    app.wait_step(&id, name, "running").await;
    tokio::time::sleep(into).await;
    let before = step(&app.rollout(&id).await, name).clone();
    assert_eq!(
        before.status, "running",
        "killed inside the step: {before:#?}"
    );
    (id, before, app.kill().await)
}

/// Sleeps until `at` has passed (bounded: the tests' deadlines are seconds away).
async fn sleep_past(at: DateTime<Utc>) {
    let left = (at - Utc::now()).to_std().unwrap_or_default();
    assert!(left < Duration::from_secs(10), "{left:?}");
    tokio::time::sleep(left + Duration::from_millis(300)).await;
}

/// The reads of the target engine's `path` recorded after `since`.
fn reads_after(app: &TestApp, path: &str, since: DateTime<Utc>) -> Vec<DateTime<Utc>> {
    app.sim
        .engine_reads()
        .into_iter()
        .filter(|r| r.service == R2 && r.path == path && r.at >= since)
        .map(|r| r.at)
        .collect()
}

#[tokio::test]
async fn a_soak_killed_two_seconds_in_and_restarted_after_its_deadline_watches_the_rest_again() {
    let app = app_with(canary_with(&[(FAST_SOAK, LONG_SOAK)])).await;
    let (id, before, crashed) = kill_into(app, "soak", Duration::from_secs(2)).await;
    let killed_at = Utc::now();
    let started = before.started_at.expect("started");
    let deadline = before.deadline_at.expect("a deadline");
    sleep_past(deadline).await;
    let restarted_at = Utc::now();
    let app = crashed.restart().await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let soak = step(&r, "soak");
    assert_eq!(soak.started_at, Some(started), "the same soak, resumed");
    // Nobody watched from the kill on: at least the 4 s of the window after it.
    let nobody = chrono::Duration::milliseconds(6_000) - (killed_at - started);
    assert!(nobody > chrono::Duration::seconds(3), "{nobody}");
    // It ran that long after the restart, past its original deadline, which moved.
    let finished = soak.finished_at.expect("finished");
    assert!(finished >= restarted_at + nobody, "{soak:#?}");
    assert!(soak.deadline_at >= Some(restarted_at + nobody), "{soak:#?}");
    // The engine was probed after the restart until that part was watched.
    let probes = reads_after(&app, "/health", restarted_at);
    assert!(probes.len() >= 2, "{probes:?}");
    assert!(
        probes.last() >= Some(&(restarted_at + nobody)),
        "health probes after the restart: {probes:?}"
    );
    // The evidence says so: what the crash left unsaved counts as unobserved.
    let d = &soak.detail;
    let unobserved = ms(&d["resumed"]["unobserved_ms"]);
    assert!(unobserved >= nobody.num_milliseconds(), "{d:#}");
    assert!(unobserved <= 6_000, "{d:#}");
    assert_eq!(
        ms(&d["resumed"]["observed_before_ms"]) + unobserved,
        6_000,
        "{d:#}"
    );
    assert!(ms(&d["reobserved_ms"]) >= unobserved, "{d:#}");
    assert_eq!(ms(&d["observed_ms"]), 6_000, "{d:#}");
    assert!(finished >= restarted_at + chrono::Duration::milliseconds(unobserved));
    app.stop().await;
}

#[tokio::test]
async fn a_forbidden_line_printed_while_the_daemon_was_down_fails_the_resumed_soak() {
    let app = app_with(canary_with(&[(FAST_SOAK, LONG_SOAK)])).await;
    let (id, _, crashed) = kill_into(app, "soak", Duration::from_secs(1)).await;
    crashed
        .sim
        .faults()
        .emit_log_line(R2, "CUDA error: an illegal memory access was encountered");
    let app = crashed.restart().await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(code(&r), Some("forbidden_log_line"), "{r:#?}");
    let soak = step(&r, "soak");
    assert!(
        soak.detail["forbidden"]["line"]
            .as_str()
            .is_some_and(|l| l.contains("illegal memory access")),
        "{:#}",
        soak.detail
    );
    assert!(r.rolled_back_by.is_some(), "rolled back");
    app.stop().await;
}

#[tokio::test]
async fn a_container_replaced_while_the_daemon_was_down_fails_the_resumed_soak_engine_restarted() {
    let app = app_with(canary_with(&[(FAST_SOAK, LONG_SOAK)])).await;
    let (id, before, crashed) = kill_into(app, "soak", Duration::from_secs(1)).await;
    let watched = crashed
        .sim
        .containers()
        .into_iter()
        .find(|c| c.service == R2)
        .map(|c| c.id)
        .expect("r2 ran");
    crashed.sim.faults().recreate_container(R2);
    let app = crashed.restart().await;
    let now = app.container_id(R2).expect("r2 runs");
    assert_ne!(now, watched, "another container");
    let r = app.wait_terminal(&id).await;
    assert_eq!(code(&r), Some("engine_restarted"), "{r:#?}");
    let soak = step(&r, "soak");
    let seen = soak.detail["restart"]["now"]["id"].as_str().unwrap_or("-");
    assert!(now.starts_with(seen), "the new container: {seen} of {now}");
    // Replaced, not restarted in place: the container it watched before the restart is named
    // (`docker ps` shows ids 12 characters long).
    let message = &r.error.as_ref().expect("error").message;
    assert!(
        message.contains("container changed") && message.contains(&watched[..12]),
        "{message}"
    );
    assert_eq!(
        before.detail["container_id"],
        &watched[..12],
        "saved as evidence"
    );
    assert!(r.rolled_back_by.is_some(), "rolled back");
    app.stop().await;
}

/// The fast canary followed by a 4 s analysis that needs the target to take traffic.
fn with_analysis() -> BTreeMap<String, Runbook> {
    let text = format!(
        "{}  - name: analysis\n    kind: analyze\n    warmup: 500ms\n    duration: 4s\n    interval: 250ms\n    checks:\n      - {{name: took_traffic, counter: \"sglang:num_requests_total\", min: 1}}\n",
        FAST_CANARY.as_str()
    );
    let mut books = fast_runbooks();
    let rb = runbook::parse("single-replica-canary", "test", &text).expect("test runbook");
    books.insert("single-replica-canary".to_owned(), rb);
    books
}

#[tokio::test]
async fn an_analysis_resumed_after_its_window_ended_gathers_again_before_judging() {
    let app = app_with(with_analysis()).await;
    let (id, before, crashed) = kill_into(app, "analysis", Duration::from_secs(2)).await;
    let ends_at: DateTime<Utc> = serde_json::from_value(before.detail["ends_at"].clone())
        .expect("the window's end was saved");
    sleep_past(ends_at).await;
    let restarted_at = Utc::now();
    let app = crashed.restart().await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let analysis = step(&r, "analysis");
    let d = &analysis.detail;
    let unobserved = ms(&d["resumed"]["unobserved_ms"]);
    assert!(unobserved > 0 && unobserved <= 4_000, "{d:#}");
    assert!(ms(&d["reobserved_ms"]) >= unobserved, "{d:#}");
    // The window it judged is the one it gathered after the restart.
    assert!(
        d["replicas"][R2]["window_scrapes"].as_u64() >= Some(2),
        "{d:#}"
    );
    assert_eq!(d["checks"][0]["verdict"], "pass", "{d:#}");
    let unobserved = chrono::Duration::milliseconds(unobserved);
    let scrapes = reads_after(&app, "/metrics", restarted_at);
    assert!(scrapes.len() >= 2, "{scrapes:?}");
    assert!(
        scrapes.last() >= Some(&(restarted_at + unobserved)),
        "scrapes after the restart: {scrapes:?}"
    );
    let finished = analysis.finished_at.expect("finished");
    assert!(finished >= restarted_at + unobserved, "{analysis:#?}");
    app.stop().await;
}

/// The times (the `time` parameter, when it arrived) of the queries a fake Prometheus was
/// asked; it answers every query with the scalar 5.
type Asked = std::sync::Arc<std::sync::Mutex<Vec<(DateTime<Utc>, DateTime<Utc>)>>>;

/// A stand-in for Prometheus on a loopback port: enough to see when, and at what time, the
/// analysis evaluates its queries.
async fn fake_prometheus() -> (String, Asked) {
    use axum::extract::{Query, State};
    async fn query(
        State(asked): State<Asked>,
        Query(q): Query<BTreeMap<String, String>>,
    ) -> axum::Json<serde_json::Value> {
        let secs: f64 = q.get("time").and_then(|t| t.parse().ok()).unwrap_or(0.0);
        let at =
            DateTime::from_timestamp_millis((secs * 1000.0).round() as i64).unwrap_or_default();
        asked.lock().expect("asked").push((at, Utc::now()));
        axum::Json(serde_json::json!({
            "status": "success",
            "data": {"resultType": "scalar", "result": [secs, "5"]},
        }))
    }
    let asked = Asked::default();
    let app = axum::Router::new()
        .route("/api/v1/query", axum::routing::get(query))
        .with_state(asked.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let url = format!("http://{}", listener.local_addr().expect("bound"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, asked)
}

#[tokio::test]
async fn a_prometheus_analysis_resumed_after_its_window_ended_evaluates_after_watching_again() {
    let (url, asked) = fake_prometheus().await;
    let text = format!(
        "{}  - name: analysis\n    kind: analyze\n    source: prometheus\n    warmup: 500ms\n    duration: 4s\n    interval: 250ms\n    checks:\n      - {{name: took_traffic, query: 'sum(increase(sglang:num_requests_total{{container_name=\"{{{{service}}}}\"}}[{{{{window}}}}]))', min: 1}}\n",
        FAST_CANARY.as_str()
    );
    let mut books = fast_runbooks();
    let rb = runbook::parse("single-replica-canary", "test", &text).expect("test runbook");
    books.insert("single-replica-canary".to_owned(), rb);
    let opts = TestOptions {
        runbooks: Some(books),
        prometheus: Some(canaryd::config::PrometheusConfig { url, token: None }),
        ..TestOptions::default()
    };
    let app = TestApp::spawn_custom(sim_config(), opts).await;
    let (id, before, crashed) = kill_into(app, "analysis", Duration::from_secs(2)).await;
    let ends_at: DateTime<Utc> = serde_json::from_value(before.detail["ends_at"].clone())
        .expect("the window's end was saved");
    sleep_past(ends_at).await;
    let restarted_at = Utc::now();
    let app = crashed.restart().await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    // Unwatched from the kill on: at least the 2 s of the window after it.
    let analysis = step(&r, "analysis");
    let killed = before.detail["observed_ms"].as_i64().unwrap_or(0);
    let nobody = chrono::Duration::milliseconds(4_000 - killed.min(4_000));
    assert!(nobody >= chrono::Duration::seconds(2), "{nobody}");
    // The queries were evaluated at a time after the restart's watch, not at the old end.
    let evaluated: Vec<_> = asked
        .lock()
        .expect("asked")
        .iter()
        .filter(|(_, arrived)| *arrived >= restarted_at)
        .map(|(at, _)| *at)
        .collect();
    assert!(!evaluated.is_empty(), "asked after the restart");
    for at in &evaluated {
        assert!(*at > ends_at, "evaluated at {at}, the old end is {ends_at}");
        assert!(
            *at >= restarted_at + nobody - chrono::Duration::milliseconds(1),
            "at {at}"
        );
    }
    let d = &analysis.detail;
    assert!(
        ms(&d["reobserved_ms"]) >= ms(&d["resumed"]["unobserved_ms"]),
        "{d:#}"
    );
    assert_eq!(
        d["resumed"]["unobserved_ms"],
        nobody.num_milliseconds(),
        "{d:#}"
    );
    app.stop().await;
}
