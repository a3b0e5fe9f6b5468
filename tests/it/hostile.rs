//! A hostile compose-manager and misbehaving engines: every case ends in a clear terminal
//! state with a precise error code, or in a retry inside the step's budget.

use std::time::Duration;

use canaryd::api::RolloutOut;
use canaryd::compose::{ClientOptions, ComposeClient, ComposeRequest, StreamOutcome};
use canaryd::config::ComposeTuning;
use canaryd_sim::{SimHost, SimOp};

use crate::helpers::step;
use crate::helpers::{canary_with, is_dry_run, sim_config, TestApp, TestOptions, FILE, R2};

fn code(r: &RolloutOut) -> Option<&str> {
    r.error.as_ref().map(|e| e.code.as_str())
}

fn real_ups(app: &TestApp, tag: &str) -> usize {
    app.compose_calls()
        .iter()
        .filter(|c| c.path == "/compose/up" && !is_dry_run(c) && c.body["tag"] == tag)
        .count()
}

/// Starts a canary of r2 to v0.0.452 and waits for its end (and its rollback's, if any).
async fn run_canary(app: &TestApp) -> (RolloutOut, Option<RolloutOut>) {
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = app.wait_terminal(&id).await;
    let rb = match &r.rolled_back_by {
        Some(rb) => Some(app.wait_terminal(rb).await),
        None => None,
    };
    (r, rb)
}

#[tokio::test]
async fn a_5xx_answer_to_the_up_fails_the_step_compose_server_error_and_rolls_back() {
    let app = TestApp::spawn().await;
    app.sim.faults().answer_status(SimOp::Up, 500, 1);
    let (r, rb) = run_canary(&app).await;
    assert_eq!(r.status, "failed");
    assert_eq!(code(&r), Some("compose_server_error"), "{r:#?}");
    assert_eq!(step(&r, "up").status, "failed");
    assert_eq!(real_ups(&app, "v0.0.452"), 1, "a refused up is not resent");
    let rb = rb.expect("the replica was taken down: rolled back");
    assert_eq!(rb.status, "succeeded", "{rb:#?}");
    app.stop().await;
}

#[tokio::test]
async fn a_5xx_answer_to_the_dry_run_fails_before_the_replica_is_touched() {
    let app = TestApp::spawn().await;
    app.sim.faults().answer_status(SimOp::DryRun, 503, 1);
    let (r, rb) = run_canary(&app).await;
    assert_eq!(code(&r), Some("compose_server_error"), "{r:#?}");
    assert_eq!(step(&r, "preflight").status, "failed");
    assert!(rb.is_none(), "nothing was touched, nothing to roll back");
    assert!(app
        .compose_calls()
        .iter()
        .all(|c| c.path != "/compose/down"));
    app.stop().await;
}

fn quick_timeouts() -> TestOptions {
    TestOptions {
        tuning: Some(ComposeTuning {
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(2),
            stream_idle_timeout: Duration::from_millis(500),
            busy_retry_initial: Duration::from_millis(50),
            busy_retry_max: Duration::from_millis(200),
            settle_interval: Duration::from_millis(200),
            ..Default::default()
        }),
        ..TestOptions::default()
    }
}

#[tokio::test]
async fn a_down_that_never_answers_is_an_unknown_outcome_not_a_resend() {
    let app = TestApp::spawn_custom(sim_config(), quick_timeouts()).await;
    app.sim
        .faults()
        .delay_answer(SimOp::Down, Duration::from_secs(2), 1);
    let (r, rb) = run_canary(&app).await;
    assert_eq!(code(&r), Some("compose_outcome_unknown"), "{r:#?}");
    let downs = app
        .compose_calls()
        .iter()
        .filter(|c| c.path == "/compose/down" && c.body["tag"] == "v0.0.452")
        .count();
    assert_eq!(downs, 1, "never resent");
    assert_eq!(step(&r, "down").detail["host_idle"], true);
    // The abandoned down never ran here, so r2 still runs its prior deployment: the
    // rollback's dry run plans nothing for it and the gate refuses, touching nothing.
    let rb = rb.expect("rolled back");
    assert_eq!(code(&rb), Some("plan_gate_failed"), "{rb:#?}");
    assert_eq!(real_ups(&app, "v0.0.450"), 0, "the rollback sent no up");
    app.stop().await;
}

#[tokio::test]
async fn a_slow_stream_that_keeps_talking_succeeds() {
    let app = TestApp::spawn_custom(sim_config(), quick_timeouts()).await;
    // Every line takes 100 ms; the stream is slow but never silent for 500 ms.
    app.sim
        .faults()
        .set_line_delay(Some(Duration::from_millis(100)));
    let (r, _) = run_canary(&app).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    assert_eq!(real_ups(&app, "v0.0.452"), 1);
    app.stop().await;
}

#[tokio::test]
async fn a_stream_that_falls_silent_is_an_unknown_outcome() {
    let app = TestApp::spawn_custom(sim_config(), quick_timeouts()).await;
    let mut pause = app.engine.pause_at("step:up:before");
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    assert!(pause.reached(Duration::from_secs(10)).await.is_some());
    app.sim
        .faults()
        .set_line_delay(Some(Duration::from_millis(800)));
    pause.release();
    let r = app.wait_terminal(&id).await;
    app.sim.faults().set_line_delay(None);
    assert_eq!(code(&r), Some("compose_outcome_unknown"), "{r:#?}");
    assert_eq!(real_ups(&app, "v0.0.452"), 1, "never resent");
    app.stop().await;
}

#[tokio::test]
async fn garbage_in_the_up_stream_is_an_unknown_outcome_never_a_success() {
    let app = TestApp::spawn().await;
    app.sim
        .faults()
        .garbage_line(SimOp::Up, "<html>502 Bad Gateway</html>");
    let (r, rb) = run_canary(&app).await;
    assert_eq!(code(&r), Some("compose_outcome_unknown"), "{r:#?}");
    let call = &step(&r, "up").detail["call"]["error"];
    assert!(
        call.as_str().is_some_and(|e| e.contains("line 2")),
        "names the line: {call}"
    );
    assert_eq!(real_ups(&app, "v0.0.452"), 1, "never resent");
    assert_eq!(rb.expect("rolled back").status, "succeeded");
    app.stop().await;
}

#[tokio::test]
async fn garbage_in_the_dry_run_stream_fails_the_gate_compose_protocol() {
    let app = TestApp::spawn().await;
    app.sim.faults().garbage_line(SimOp::DryRun, "{\"event\":");
    let (r, rb) = run_canary(&app).await;
    assert_eq!(code(&r), Some("compose_protocol"), "{r:#?}");
    assert_eq!(step(&r, "preflight").status, "failed");
    assert!(rb.is_none());
    assert!(
        app.compose_calls().iter().all(is_dry_run),
        "no real down or up: {:?}",
        app.compose_calls()
    );
    app.stop().await;
}

/// The output lines of a scoped up of r2 once it runs that tag (a repeat up changes nothing,
/// so every repeat has the same stream).
async fn up_stream_len(client: &ComposeClient, req: &ComposeRequest) -> usize {
    for _ in 0..2 {
        let normal = client.up(req).await.expect("a normal up");
        assert!(normal.succeeded());
    }
    let steady = client.up(req).await.expect("a repeat up");
    assert!(steady.succeeded());
    steady.n_lines
}

#[tokio::test]
async fn an_up_or_down_stream_cut_at_any_line_is_never_taken_for_a_success() {
    let sim = SimHost::start(sim_config()).await.expect("sim");
    let opts = ClientOptions {
        stream_idle_timeout: Duration::from_secs(2),
        ..ClientOptions::default()
    };
    let client = ComposeClient::new(&sim.url(), sim.token(), opts).expect("client");
    let req = ComposeRequest {
        tag: "v0.0.452".parse().expect("a valid name"),
        file: FILE.parse().expect("a valid name"),
        services: canaryd::compose::Services::one(R2.parse().expect("a valid name")),
        env: sim_config().initial_env,
        force_recreate: None,
    };
    let total = up_stream_len(&client, &req).await;
    assert!(total >= 2, "a real stream has lines: {total}");
    // Cut after 0, 1, … every output line: `done` (line total + 1) never arrives.
    for cut in 0..=total {
        sim.faults().cut_after_lines(SimOp::Up, cut);
        let got = client.up(&req).await;
        match got {
            Ok(res) => assert_eq!(res.outcome, StreamOutcome::Unknown, "cut after {cut}"),
            Err(e) => panic!("cut after {cut}: {e}"),
        }
    }
    let down = canaryd::compose::ComposeRequest {
        tag: req.tag.clone(),
        file: req.file.clone(),
        services: req.services.clone(),
        env: req.env.clone(),
        force_recreate: None,
    };
    let _first = client.down(&down).await.expect("a normal down");
    let full = client.down(&down).await.expect("a repeat down");
    assert!(full.succeeded());
    for cut in 0..=full.n_lines {
        sim.faults().cut_after_lines(SimOp::Down, cut);
        let res = client.down(&down).await.expect("a cut down");
        assert_eq!(res.outcome, StreamOutcome::Unknown, "down cut after {cut}");
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn a_cut_up_stream_fails_compose_outcome_unknown_after_the_host_is_idle() {
    let app = TestApp::spawn().await;
    app.sim.faults().cut_after_lines(SimOp::Up, 2);
    let (r, rb) = run_canary(&app).await;
    assert_eq!(code(&r), Some("compose_outcome_unknown"), "{r:#?}");
    assert_eq!(step(&r, "up").detail["host_idle"], true);
    assert_eq!(real_ups(&app, "v0.0.452"), 1, "never resent");
    assert_eq!(rb.expect("rolled back").status, "succeeded");
    app.stop().await;
}

#[tokio::test]
async fn a_409_storm_longer_than_the_step_budget_fails_step_timeout() {
    let opts = TestOptions {
        runbooks: Some(canary_with(&[(
            "{name: down, kind: down, timeout: 5s}",
            "{name: down, kind: down, timeout: 800ms}",
        )])),
        ..quick_timeouts()
    };
    let app = TestApp::spawn_custom(sim_config(), opts).await;
    let mut pause = app.engine.pause_at("step:down:before");
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    assert!(pause.reached(Duration::from_secs(10)).await.is_some());
    app.sim.faults().busy_for(Duration::from_millis(1500));
    pause.release();
    let r = app.wait_terminal(&id).await;
    assert_eq!(code(&r), Some("step_timeout"), "{r:#?}");
    let down = step(&r, "down");
    assert!(
        down.detail["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("409")),
        "{:#}",
        down.detail
    );
    let tries = app
        .sim
        .calls()
        .iter()
        .filter(|c| c.path == "/compose/down")
        .count();
    assert!(tries >= 2, "409 was retried with backoff ({tries} tries)");
    app.stop().await;
}

#[tokio::test]
async fn a_409_storm_inside_the_step_budget_is_retried_and_the_canary_succeeds() {
    let app = TestApp::spawn_custom(sim_config(), quick_timeouts()).await;
    let mut pause = app.engine.pause_at("step:down:before");
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    assert!(pause.reached(Duration::from_secs(10)).await.is_some());
    app.sim.faults().busy_for(Duration::from_millis(400));
    pause.release();
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let downs = app
        .sim
        .calls()
        .iter()
        .filter(|c| c.path == "/compose/down")
        .count();
    assert!(downs >= 2, "retried ({downs} tries)");
    app.stop().await;
}

#[tokio::test]
async fn a_flapping_health_never_passes_the_health_wait() {
    let opts = TestOptions {
        runbooks: Some(canary_with(&[(
            "{name: health, kind: wait_health, timeout: 3s, interval: 50ms, consecutive: 2}",
            "{name: health, kind: wait_health, timeout: 1500ms, interval: 50ms, consecutive: 2}",
        )])),
        ..TestOptions::default()
    };
    let app = TestApp::spawn_custom(sim_config(), opts).await;
    let mut pause = app.engine.pause_at("step:health:before");
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    assert!(pause.reached(Duration::from_secs(10)).await.is_some());
    app.sim.faults().set_health_flap(R2, true);
    pause.release();
    let r = app.wait_terminal(&id).await;
    assert_eq!(code(&r), Some("health_timeout"), "{r:#?}");
    let health = step(&r, "health");
    assert!(
        health.detail["healthy_samples"].as_u64() > Some(0),
        "it flapped"
    );
    assert!(r.rolled_back_by.is_some(), "rolled back");
    app.sim.faults().set_health_flap(R2, false);
    app.stop().await;
}

#[tokio::test]
async fn an_engine_that_restarts_during_the_soak_fails_soak_health() {
    let opts = TestOptions {
        runbooks: Some(canary_with(&[(
            "duration: 300ms, interval: 50ms, max_misses: 3",
            "duration: 3s, interval: 50ms, max_misses: 3",
        )])),
        ..TestOptions::default()
    };
    let app = TestApp::spawn_custom(sim_config(), opts).await;
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    app.wait_step(&id, "soak", "running").await;
    app.sim.faults().restart_engine(R2, Duration::from_secs(2));
    let r = app.wait_terminal(&id).await;
    // Right after the up, docker's rounded uptime cannot tell a restart from the first
    // start, so the missed probes fail the soak; on a machine slow enough that the soak
    // starts seconds after the up, the restart itself is seen first (tests/it/analyze.rs).
    assert!(
        matches!(code(&r), Some("soak_health" | "engine_restarted")),
        "{r:#?}"
    );
    assert_eq!(step(&r, "soak").status, "failed");
    app.stop().await;
}
