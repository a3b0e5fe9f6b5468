//! The `analyze` step end to end: the simulated engines serve SGLang's /metrics under
//! simulated traffic; a slow or idle canary is judged against its peer, with every number
//! stored; a restart of the target during the soak or the analysis fails `engine_restarted`.

use std::collections::BTreeMap;
use std::time::Duration;

use canaryd::api::RolloutOut;
use canaryd::domain::runbook::{self, Runbook};
use serde_json::Value;

use crate::helpers::{
    canary_with, fast_runbooks, sim_config, TestApp, TestOptions, FAST_CANARY, R1, R2,
};
use crate::helpers::{check, number, step};

const TTFT: &str = "{name: ttft_p95, histogram: \"sglang:time_to_first_token_seconds\", quantile: 0.95, max_ratio_to_peers: 1.2, min_requests: 30";
const ITL: &str = "{name: itl_p95, histogram: \"sglang:inter_token_latency_seconds\", quantile: 0.95, max_ratio_to_peers: 1.2, min_requests: 30";
const TRAFFIC: &str = "{name: took_traffic, counter: \"sglang:num_requests_total\", min: 1}";

/// The fast canary followed by an analysis of `duration` with these checks.
fn with_analysis(duration: &str, checks: &[String]) -> BTreeMap<String, Runbook> {
    let canary = FAST_CANARY.as_str();
    let mut text = format!(
        "{canary}  - name: analysis\n    kind: analyze\n    warmup: 500ms\n    duration: {duration}\n    interval: 250ms\n    checks:\n"
    );
    for check in checks {
        text.push_str(&format!("      - {check}\n"));
    }
    let mut books = fast_runbooks();
    let rb = runbook::parse("single-replica-canary", "test", &text).expect("test runbook");
    books.insert("single-replica-canary".to_owned(), rb);
    books
}

fn fleet_checks(on_inconclusive: &str) -> Vec<String> {
    vec![
        format!("{TTFT}{on_inconclusive}}}"),
        format!("{ITL}{on_inconclusive}}}"),
    ]
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

#[tokio::test]
async fn a_canary_twice_as_slow_as_its_peer_fails_the_analysis_with_the_numbers_and_is_rolled_back()
{
    let mut checks = fleet_checks("");
    checks.push(TRAFFIC.to_owned());
    let app = app_with(with_analysis("2s", &checks)).await;
    app.sim.faults().set_engine_slowdown(R2, 2.0);
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(code(&r), Some("analysis_failed"), "{r:#?}");
    let message = &r.error.as_ref().expect("error").message;
    assert!(
        message.contains("ttft_p95") && message.contains("itl_p95"),
        "{message}"
    );
    assert!(
        !message.contains("took_traffic"),
        "it took traffic: {message}"
    );
    for name in ["ttft_p95", "itl_p95"] {
        let c = check(&r, name);
        assert_eq!(c["verdict"], "fail", "{c:#}");
        assert_eq!(c["fails_step"], true);
        let target = number(&c["target"]["value"]);
        let peer = number(&c["peers"][R1]["value"]);
        let median = number(&c["peer_median"]);
        assert_eq!(peer, median, "one peer: its value is the median");
        let ratio = number(&c["ratio"]);
        assert!((ratio - target / median).abs() < 1e-9, "{c:#}");
        assert!(ratio > 1.4, "{name}: 2x slower reads {ratio}");
        assert_eq!(number(&c["max_ratio_to_peers"]), 1.2);
        assert!(number(&c["target"]["requests"]) >= 30.0, "{c:#}");
        assert!(number(&c["peers"][R1]["requests"]) >= 30.0, "{c:#}");
    }
    assert_eq!(check(&r, "took_traffic")["verdict"], "pass");
    let detail = &step(&r, "analysis").detail;
    assert_eq!(detail["replicas"][R2]["role"], "target");
    assert_eq!(detail["replicas"][R1]["role"], "peer");
    assert!(number(&detail["replicas"][R2]["window_scrapes"]) >= 2.0);
    // Each check's value per interval, per replica, warm-up included, for the page's charts.
    for name in ["ttft_p95", "itl_p95", "took_traffic"] {
        for replica in [R1, R2] {
            let points = detail["series"][name]["points"][replica]
                .as_array()
                .expect("a series");
            assert!(
                (4..=240).contains(&points.len()),
                "{name} {replica}: {} points",
                points.len()
            );
            assert!(points.iter().all(|p| p[0].is_i64()), "{points:?}");
        }
    }
    let rb = app
        .wait_terminal(r.rolled_back_by.as_deref().expect("rolled back"))
        .await;
    assert_eq!(rb.status, "succeeded", "{rb:#?}");
    let r2 = app.sim.containers().into_iter().find(|c| c.service == R2);
    assert_eq!(
        r2.map(|c| c.tag).as_deref(),
        Some("v0.0.450"),
        "the prior tag"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_canary_a_tenth_slower_than_its_peer_passes() {
    let mut checks = fleet_checks("");
    checks.push(TRAFFIC.to_owned());
    let app = app_with(with_analysis("2s", &checks)).await;
    app.sim.faults().set_engine_slowdown(R2, 1.1);
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    for name in ["ttft_p95", "itl_p95"] {
        let c = check(&r, name);
        assert_eq!(c["verdict"], "pass", "{c:#}");
        let ratio = number(&c["ratio"]);
        assert!((1.0..=1.2).contains(&ratio), "{name}: 1.1x reads {ratio}");
    }
    assert!(number(&check(&r, "took_traffic")["target"]["value"]) >= 1.0);
    // The event stream carries the verdict on the analysis's `step_succeeded` event.
    let stream = reqwest::get(format!("{}/v1/rollouts/{id}/events", app.url))
        .await
        .expect("the event stream answers")
        .text()
        .await
        .expect("the stream ends with the rollout");
    let event = stream
        .split("\n\n")
        .find(|e| e.contains("event: step_succeeded") && e.contains("\"step\":\"analysis\""))
        .unwrap_or_else(|| panic!("no step_succeeded event of the analysis in:\n{stream}"));
    let data: Value = event
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .and_then(|d| serde_json::from_str(d).ok())
        .unwrap_or_else(|| panic!("no JSON data in {event}"));
    assert_eq!(
        data["detail"]["checks"],
        step(&r, "analysis").detail["checks"],
        "the stored verdict, on the event: {data:#}"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_canary_without_traffic_is_inconclusive_and_fails_by_default() {
    let app = app_with(with_analysis("1s", &fleet_checks(""))).await;
    app.sim.faults().set_engine_traffic(R2, false);
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(code(&r), Some("analysis_failed"), "{r:#?}");
    for name in ["ttft_p95", "itl_p95"] {
        let c = check(&r, name);
        assert_eq!(c["verdict"], "inconclusive", "{c:#}");
        assert_eq!(c["fails_step"], true);
        assert_eq!(c["on_inconclusive"], "fail");
        assert_eq!(number(&c["target"]["requests"]), 0.0);
        assert!(
            number(&c["peers"][R1]["requests"]) >= 30.0,
            "the peer served"
        );
    }
    assert!(r.rolled_back_by.is_some(), "rolled back");
    app.stop().await;
}

#[tokio::test]
async fn an_inconclusive_check_passes_when_the_runbook_says_so() {
    let app = app_with(with_analysis(
        "1s",
        &fleet_checks(", on_inconclusive: pass"),
    ))
    .await;
    app.sim.faults().set_engine_traffic(R2, false);
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let c = check(&r, "ttft_p95");
    assert_eq!(c["verdict"], "inconclusive", "{c:#}");
    assert_eq!(c["fails_step"], false);
    app.stop().await;
}

#[tokio::test]
async fn an_idle_canary_fails_took_traffic_outright() {
    let app = app_with(with_analysis("1s", &[TRAFFIC.to_owned()])).await;
    app.sim.faults().set_engine_traffic(R2, false);
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(code(&r), Some("analysis_failed"), "{r:#?}");
    let c = check(&r, "took_traffic");
    assert_eq!(c["verdict"], "fail", "{c:#}");
    assert_eq!(number(&c["target"]["value"]), 0.0);
    assert_eq!(number(&c["min"]), 1.0);
    app.stop().await;
}

/// Waits until the target has run long enough since its up that a restart cannot be
/// mistaken for docker's rounding of a fresh start.
async fn settle_after_up() {
    tokio::time::sleep(Duration::from_millis(2_500)).await;
}

#[tokio::test]
async fn an_engine_that_restarts_mid_soak_fails_engine_restarted_at_once() {
    let app = app_with(canary_with(&[(
        "duration: 300ms, interval: 50ms, max_misses: 3",
        "duration: 20s, interval: 50ms, max_misses: 100",
    )]))
    .await;
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    app.wait_step(&id, "soak", "running").await;
    settle_after_up().await;
    app.sim
        .faults()
        .restart_engine(R2, Duration::from_millis(200));
    let r = app.wait_terminal(&id).await;
    assert_eq!(code(&r), Some("engine_restarted"), "{r:#?}");
    let soak = step(&r, "soak");
    assert_eq!(soak.status, "failed");
    let restart = &soak.detail["restart"];
    assert_eq!(
        restart["first"]["id"], restart["now"]["id"],
        "in place: same id"
    );
    assert!(
        restart["now"]["status"]
            .as_str()
            .is_some_and(|s| s.contains("second")),
        "{restart:#}"
    );
    let finished = r.finished_at.expect("finished");
    let started = soak.started_at.expect("started");
    assert!(
        (finished - started).num_seconds() < 15,
        "at once, not at the end of the 20s soak"
    );
    assert!(r.rolled_back_by.is_some(), "rolled back");
    app.stop().await;
}

#[tokio::test]
async fn an_engine_that_restarts_mid_analysis_fails_engine_restarted() {
    let app = app_with(with_analysis("20s", &[TRAFFIC.to_owned()])).await;
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    app.wait_step(&id, "analysis", "running").await;
    settle_after_up().await;
    app.sim
        .faults()
        .restart_engine(R2, Duration::from_millis(200));
    let r = app.wait_terminal(&id).await;
    assert_eq!(code(&r), Some("engine_restarted"), "{r:#?}");
    let analysis = step(&r, "analysis");
    assert!(analysis.detail["replicas"][R2]["scrapes"].as_u64() > Some(0));
    assert!(analysis.detail["restart"]["now"]["id"].is_string());
    app.stop().await;
}

#[tokio::test]
async fn an_abort_interrupts_the_analysis_between_two_scrapes() {
    let mut text = FAST_CANARY.to_owned();
    text.push_str("  - {name: analysis, kind: analyze, warmup: 0s, duration: 10m, interval: 30s, checks: [{name: took_traffic, counter: \"sglang:num_requests_total\", min: 1}]}\n");
    let mut books = fast_runbooks();
    let rb = runbook::parse("single-replica-canary", "test", &text).expect("test runbook");
    books.insert("single-replica-canary".to_owned(), rb);
    let app = app_with(books).await;
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    app.wait_step(&id, "analysis", "running").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, body) = app
        .post(
            &format!("/v1/rollouts/{id}/abort"),
            &serde_json::json!({"reason": "operator said stop"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "aborted", "{r:#?}");
    let analysis = step(&r, "analysis");
    assert_eq!(analysis.status, "aborted");
    let (started, finished) = (
        analysis.started_at.expect("started"),
        analysis.finished_at.expect("finished"),
    );
    assert!(
        (finished - started).num_seconds() < 20,
        "interrupted long before its next 30 s scrape"
    );
    app.stop().await;
}

/// `with_analysis` of the fleet checks asking when inconclusive, with this `approve_timeout`.
fn asking_analysis(approve_timeout: &str) -> BTreeMap<String, Runbook> {
    let checks = fleet_checks(", on_inconclusive: ask");
    let mut text = format!(
        "{}  - name: analysis\n    kind: analyze\n    warmup: 500ms\n    duration: 1s\n    interval: 250ms\n    approve_timeout: {approve_timeout}\n    checks:\n",
        FAST_CANARY.as_str()
    );
    for check in checks {
        text.push_str(&format!("      - {check}\n"));
    }
    let mut books = fast_runbooks();
    let rb = runbook::parse("single-replica-canary", "test", &text).expect("test runbook");
    books.insert("single-replica-canary".to_owned(), rb);
    books
}

#[tokio::test]
async fn an_inconclusive_check_that_asks_waits_for_an_operator_and_goes_on_when_approved() {
    let app = app_with(asking_analysis("30s")).await;
    app.sim.faults().set_engine_traffic(R2, false);
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    // The window ends inconclusive; the step then waits, saying so in its evidence.
    let mut waiting = Value::Null;
    for _ in 0..200 {
        let r = app.rollout(&id).await;
        assert!(matches!(r.status.as_str(), "pending" | "running"), "{r:#?}");
        waiting = step(&r, "analysis").detail.clone();
        if waiting["awaiting_approval"] == true {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(waiting["awaiting_approval"], true, "{waiting:#}");
    assert_eq!(
        waiting["asking"],
        serde_json::json!(["ttft_p95", "itl_p95"])
    );
    let (status, body) = app
        .post(
            &format!("/v1/rollouts/{id}/approve"),
            &serde_json::json!({"reason": "r2 gets no traffic on purpose: drained for a test"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let c = check(&r, "ttft_p95");
    assert_eq!(c["verdict"], "inconclusive", "{c:#}");
    assert_eq!(
        (c["fails_step"].clone(), c["asks"].clone()),
        (Value::Bool(false), Value::Bool(true))
    );
    let approval = &step(&r, "analysis").detail["approval"];
    assert_eq!(approval["approved_by"], "local", "{approval:#}");
    let kinds = app.audit_kinds(&id).await;
    assert!(kinds.iter().any(|k| k == "approval_requested"), "{kinds:?}");
    app.stop().await;
}

#[tokio::test]
async fn an_inconclusive_check_that_asks_fails_not_approved_when_nobody_answers() {
    let app = app_with(asking_analysis("300ms")).await;
    app.sim.faults().set_engine_traffic(R2, false);
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(code(&r), Some("not_approved"), "{r:#?}");
    let message = &r.error.as_ref().expect("error").message;
    assert!(message.contains("ttft_p95"), "{message}");
    assert!(r.rolled_back_by.is_some(), "rolled back");
    app.stop().await;
}

#[tokio::test]
async fn a_failed_check_fails_at_once_even_when_another_asks() {
    let mut checks = fleet_checks(", on_inconclusive: ask");
    checks.push(TRAFFIC.to_owned());
    let app = app_with(with_analysis("1s", &checks)).await;
    app.sim.faults().set_engine_traffic(R2, false);
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(code(&r), Some("analysis_failed"), "{r:#?}");
    assert!(
        !app.audit_kinds(&id)
            .await
            .iter()
            .any(|k| k == "approval_requested"),
        "nobody is asked about a canary that already failed"
    );
    app.stop().await;
}
