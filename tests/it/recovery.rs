//! Crash safety (safety rule 9, docs/recovery.md): the daemon is stopped at every step boundary and
//! inside every compose call, restarted on the same database, and each time the rollout finishes,
//! exactly one real `up` per rollout reaches the host, no compose call names another service, and
//! the audit trail is complete.

use std::time::Duration;

use canaryd::api::RolloutOut;
use canaryd::domain::audit::AuditKind;
use canaryd_sim::SimOp;
use serde_json::json;

use crate::helpers::{is_dry_run, TestApp, R2};

const CANARY_TAG: &str = "v0.0.452";
const BASELINE_TAG: &str = "v0.0.450";

/// What the host saw of one tag: (dry runs, downs, real ups).
fn calls_for(app: &TestApp, tag: &str) -> (usize, usize, usize) {
    let calls: Vec<_> = app
        .compose_calls()
        .into_iter()
        .filter(|c| c.body["tag"] == tag)
        .collect();
    let dry = calls.iter().filter(|c| is_dry_run(c)).count();
    let down = calls.iter().filter(|c| c.path == "/compose/down").count();
    let up = calls
        .iter()
        .filter(|c| c.path == "/compose/up" && !is_dry_run(c))
        .count();
    (dry, down, up)
}

/// Checks the invariants every recovery must keep, and returns the canary and its rollback.
async fn assert_recovered(app: &TestApp, id: &str) -> (RolloutOut, Option<RolloutOut>) {
    let canary = app.wait_terminal(id).await;
    let rollback = match &canary.rolled_back_by {
        Some(rb) => Some(app.wait_terminal(rb).await),
        None => None,
    };
    for call in app.compose_calls() {
        assert_eq!(call.body["services"], json!([R2]), "scoped: {}", call.body);
        assert!(call.body.get("force_recreate").is_none(), "{}", call.body);
    }
    let (_, _, canary_ups) = calls_for(app, CANARY_TAG);
    if canary.status == "succeeded" {
        assert_eq!(canary_ups, 1, "exactly one real up of the canary");
    } else {
        assert!(canary_ups <= 1, "never resent: {canary_ups} ups");
    }
    if let Some(rb) = &rollback {
        assert_eq!(rb.status, "succeeded", "{rb:#?}");
        assert_eq!(
            calls_for(app, BASELINE_TAG).2,
            1,
            "one real up of the rollback"
        );
    }
    for r in std::iter::once(&canary).chain(rollback.as_ref()) {
        assert_audit_complete(app, r).await;
    }
    (canary, rollback)
}

/// Every step that left `pending` and the rollout's end have their audit events.
async fn assert_audit_complete(app: &TestApp, r: &RolloutOut) {
    let events = app
        .engine
        .store()
        .audit_events(&r.id, 0)
        .await
        .expect("audit");
    let has = |kind: &str, step: Option<&str>| {
        events
            .iter()
            .any(|e| e.kind.as_str() == kind && (step.is_none() || e.step.as_deref() == step))
    };
    assert!(has("rollout_created", None), "{:?}", kinds(&events));
    assert!(
        has(&format!("rollout_{}", r.status), None),
        "{:?}",
        kinds(&events)
    );
    for s in r.steps.iter().filter(|s| s.status != "pending") {
        assert!(
            has(&format!("step_{}", s.status), Some(&s.name)),
            "step {} {} has no audit event: {:?}",
            s.name,
            s.status,
            kinds(&events)
        );
        if s.started_at.is_some() {
            assert!(has("step_running", Some(&s.name)), "{}", s.name);
        }
    }
}

fn kinds(events: &[canaryd::store::AuditEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| format!("{}:{}", e.kind, e.step.clone().unwrap_or_default()))
        .collect()
}

/// Freezes the canary at `point`, kills the daemon there, restarts it on the same database.
async fn crash_at(point: &str) -> (TestApp, String) {
    let app = TestApp::spawn().await;
    let mut pause = app.engine.pause_at(point);
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    let frozen = pause.reached(Duration::from_secs(10)).await;
    assert_eq!(frozen.as_deref(), Some(id.as_str()), "reached {point}");
    let app = app.kill().await.restart().await;
    let events = app
        .engine
        .store()
        .audit_events(&id, 0)
        .await
        .expect("audit");
    assert!(
        events.iter().any(|e| e.kind == AuditKind::RolloutResumed),
        "the restart is in the audit trail"
    );
    (app, id)
}

/// A crash where nothing was in flight: the canary resumes and succeeds.
async fn crash_at_boundary_then_succeed(point: &str) {
    let (app, id) = crash_at(point).await;
    let (canary, rollback) = assert_recovered(&app, &id).await;
    assert_eq!(canary.status, "succeeded", "{point}: {canary:#?}");
    assert!(rollback.is_none());
    let (dry, down, up) = calls_for(&app, CANARY_TAG);
    assert_eq!((dry, down, up), (2, 1, 1), "{point}: nothing resent");
    app.stop().await;
}

#[tokio::test]
async fn a_crash_before_the_rollout_starts_is_resumed_to_success() {
    crash_at_boundary_then_succeed("rollout:start").await;
}

#[tokio::test]
async fn a_crash_before_the_snapshot_is_resumed_to_success() {
    crash_at_boundary_then_succeed("step:snapshot:before").await;
}

#[tokio::test]
async fn a_crash_inside_a_started_snapshot_is_resumed_to_success() {
    crash_at_boundary_then_succeed("step:snapshot:started").await;
}

#[tokio::test]
async fn a_crash_before_the_peer_check_is_resumed_to_success() {
    crash_at_boundary_then_succeed("step:peers:before").await;
}

#[tokio::test]
async fn a_crash_inside_a_started_peer_check_is_resumed_to_success() {
    crash_at_boundary_then_succeed("step:peers:started").await;
}

#[tokio::test]
async fn a_crash_before_the_preflight_dry_run_is_resumed_to_success() {
    crash_at_boundary_then_succeed("step:preflight:before").await;
}

#[tokio::test]
async fn a_crash_inside_a_started_preflight_before_its_call_is_resumed_to_success() {
    crash_at_boundary_then_succeed("step:preflight:started").await;
}

#[tokio::test]
async fn a_crash_before_the_down_is_resumed_to_success() {
    crash_at_boundary_then_succeed("step:down:before").await;
}

#[tokio::test]
async fn a_crash_inside_a_started_down_before_its_call_is_resumed_to_success() {
    crash_at_boundary_then_succeed("step:down:started").await;
}

#[tokio::test]
async fn a_crash_after_the_down_succeeded_but_before_its_step_did_does_not_resend_it() {
    crash_at_boundary_then_succeed("step:down:attempt_done").await;
}

#[tokio::test]
async fn a_crash_before_the_second_dry_run_is_resumed_to_success() {
    crash_at_boundary_then_succeed("step:plan:before").await;
}

#[tokio::test]
async fn a_crash_inside_a_started_second_dry_run_before_its_call_is_resumed_to_success() {
    crash_at_boundary_then_succeed("step:plan:started").await;
}

#[tokio::test]
async fn a_crash_before_the_up_is_resumed_to_success() {
    crash_at_boundary_then_succeed("step:up:before").await;
}

#[tokio::test]
async fn a_crash_inside_a_started_up_before_its_call_is_resumed_to_success() {
    crash_at_boundary_then_succeed("step:up:started").await;
}

#[tokio::test]
async fn a_crash_after_the_up_succeeded_but_before_its_step_did_does_not_resend_it() {
    crash_at_boundary_then_succeed("step:up:attempt_done").await;
}

/// A crash after the up ended `done` `success:false` was written, before its step failed: the
/// restart fails the step from the recorded outcome and never sends the up again.
#[tokio::test]
async fn a_crash_after_the_up_failed_but_before_its_step_did_does_not_resend_it() {
    let app = TestApp::spawn().await;
    app.sim.faults().fail_phase(SimOp::Up, Some("up".into()));
    let mut pause = app.engine.pause_at("step:up:attempt_done");
    let mut plan = TestApp::plan(CANARY_TAG);
    plan["on_failure"] = json!("halt");
    let id = app.start_canary(&plan).await;
    let frozen = pause.reached(Duration::from_secs(10)).await;
    assert_eq!(frozen.as_deref(), Some(id.as_str()), "reached attempt_done");
    let app = app.kill().await.restart().await;
    let canary = app.wait_terminal(&id).await;
    assert_eq!(canary.status, "failed", "{canary:#?}");
    assert_left_down_by_failed_up(&canary);
    let (_, down, up) = calls_for(&app, CANARY_TAG);
    assert_eq!((down, up), (1, 1), "the failed up is not sent again");
    app.stop().await;
}

/// A crash after a step was marked failed but before its rollout was: the restart finishes
/// the rollout from the recorded failure and never runs the step (its `up`) again.
#[tokio::test]
async fn a_crash_after_the_up_failed_but_before_the_rollout_did_does_not_resend_it() {
    let app = TestApp::spawn().await;
    app.sim.faults().fail_phase(SimOp::Up, Some("up".into()));
    let mut pause = app.engine.pause_at("step:up:failed");
    let mut plan = TestApp::plan(CANARY_TAG);
    plan["on_failure"] = json!("halt");
    let id = app.start_canary(&plan).await;
    let frozen = pause.reached(Duration::from_secs(10)).await;
    assert_eq!(
        frozen.as_deref(),
        Some(id.as_str()),
        "reached step:up:failed"
    );
    let app = app.kill().await.restart().await;
    let canary = app.wait_terminal(&id).await;
    assert_eq!(canary.status, "failed", "{canary:#?}");
    assert_left_down_by_failed_up(&canary);
    let (_, down, up) = calls_for(&app, CANARY_TAG);
    assert_eq!((down, up), (1, 1), "the failed up is not sent again");
    app.stop().await;
}

#[tokio::test]
async fn a_crash_before_the_neighbour_check_is_resumed_to_success() {
    crash_at_boundary_then_succeed("step:neighbours:before").await;
}

#[tokio::test]
async fn a_crash_inside_a_started_neighbour_check_is_resumed_to_success() {
    crash_at_boundary_then_succeed("step:neighbours:started").await;
}

#[tokio::test]
async fn a_crash_before_the_health_wait_is_resumed_to_success() {
    crash_at_boundary_then_succeed("step:health:before").await;
}

#[tokio::test]
async fn a_crash_inside_the_health_wait_is_resumed_to_success() {
    crash_at_boundary_then_succeed("step:health:started").await;
}

#[tokio::test]
async fn a_crash_before_the_log_wait_is_resumed_to_success() {
    crash_at_boundary_then_succeed("step:startup-logs:before").await;
}

#[tokio::test]
async fn a_crash_inside_the_log_wait_is_resumed_to_success() {
    crash_at_boundary_then_succeed("step:startup-logs:started").await;
}

#[tokio::test]
async fn a_crash_before_the_soak_is_resumed_to_success() {
    crash_at_boundary_then_succeed("step:soak:before").await;
}

#[tokio::test]
async fn a_crash_inside_the_soak_is_resumed_to_success() {
    crash_at_boundary_then_succeed("step:soak:started").await;
}

/// Holds the next stream of `op` open (once `arm_at` is reached, if given), kills the daemon
/// while the call is in flight, restarts.
async fn crash_mid_call(op: SimOp, arm_at: Option<&str>) -> (TestApp, String) {
    let app = TestApp::spawn().await;
    let faults = app.sim.faults();
    let mut pause = arm_at.map(|p| app.engine.pause_at(p));
    if pause.is_none() {
        faults.stall_stream(op);
    }
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    if let Some(pause) = pause.as_mut() {
        assert!(pause.reached(Duration::from_secs(10)).await.is_some());
        faults.stall_stream(op);
        pause.release();
    }
    for _ in 0..400 {
        if faults.stalled_streams() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(faults.stalled_streams(), 1, "the call is held open");
    let app = app.kill().await.restart().await;
    let kinds = app.audit_kinds(&id).await;
    assert!(kinds.contains(&"rollout_resumed".to_owned()), "{kinds:?}");
    (app, id)
}

#[tokio::test]
async fn a_crash_during_the_preflight_dry_run_resends_only_the_dry_run() {
    let (app, id) = crash_mid_call(SimOp::DryRun, None).await;
    let (canary, _) = assert_recovered(&app, &id).await;
    assert_eq!(canary.status, "succeeded", "{canary:#?}");
    assert_eq!(calls_for(&app, CANARY_TAG), (3, 1, 1), "one dry run resent");
    app.stop().await;
}

#[tokio::test]
async fn a_crash_during_the_second_dry_run_resends_only_the_dry_run() {
    let (app, id) = crash_mid_call(SimOp::DryRun, Some("step:plan:started")).await;
    let (canary, _) = assert_recovered(&app, &id).await;
    assert_eq!(canary.status, "succeeded", "{canary:#?}");
    assert_eq!(calls_for(&app, CANARY_TAG), (3, 1, 1), "one dry run resent");
    app.stop().await;
}

#[tokio::test]
async fn a_crash_during_the_down_is_reconciled_as_unknown_and_never_resent() {
    let _g = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_env_filter("canaryd=debug")
            .with_test_writer()
            .finish(),
    );
    let (app, id) = crash_mid_call(SimOp::Down, None).await;
    let (canary, rollback) = assert_recovered(&app, &id).await;
    assert_eq!(canary.status, "failed");
    assert_eq!(
        canary.error.as_ref().map(|e| e.code.as_str()),
        Some("compose_outcome_unknown"),
        "{canary:#?}"
    );
    let down = canary
        .steps
        .iter()
        .find(|s| s.name == "down")
        .expect("down");
    assert_eq!(down.detail["call"]["reconciled_after_restart"], true);
    assert_eq!(down.detail["host_idle"], true);
    assert_eq!(
        calls_for(&app, CANARY_TAG),
        (1, 1, 0),
        "the down was not resent"
    );
    assert!(rollback.is_some(), "the touched replica is rolled back");
    app.stop().await;
}

#[tokio::test]
async fn a_crash_during_the_up_is_reconciled_as_unknown_and_never_resent() {
    let (app, id) = crash_mid_call(SimOp::Up, None).await;
    let (canary, rollback) = assert_recovered(&app, &id).await;
    assert_eq!(canary.status, "failed");
    assert_eq!(
        canary.error.as_ref().map(|e| e.code.as_str()),
        Some("compose_outcome_unknown"),
        "{canary:#?}"
    );
    let up = canary.steps.iter().find(|s| s.name == "up").expect("up");
    assert!(
        up.detail["target_container"].is_object(),
        "ps evidence: {}",
        up.detail
    );
    assert_eq!(
        calls_for(&app, CANARY_TAG),
        (2, 1, 1),
        "the up was not resent"
    );
    assert!(rollback.is_some(), "the touched replica is rolled back");
    app.stop().await;
}

/// The attempts of a step caught mid-`up` cannot be read back after the restart: whether the
/// `up` was sent is unknown, so it is not sent again (the step fails instead).
#[tokio::test]
async fn an_unreadable_attempt_record_after_a_crash_mid_up_never_resends_it() {
    let app = TestApp::spawn().await;
    let faults = app.sim.faults();
    faults.stall_stream(SimOp::Up);
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    for _ in 0..400 {
        if faults.stalled_streams() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(faults.stalled_streams(), 1, "the up is held open");
    let crashed = app.kill().await;
    let url = format!("sqlite://{}", crashed.db.display());
    let pool = sqlx::SqlitePool::connect(&url).await.expect("open db");
    sqlx::query("update step_attempt set started_at = 'not a time' where outcome is null")
        .execute(&pool)
        .await
        .expect("damage the in-flight attempt");
    pool.close().await;
    let app = crashed.restart().await;
    let canary = app.wait_terminal(&id).await;
    assert_eq!(canary.status, "failed", "{canary:#?}");
    assert_eq!(
        canary.error.as_ref().map(|e| e.code.as_str()),
        Some("storage_error"),
        "{canary:#?}"
    );
    let (_, _, up) = calls_for(&app, CANARY_TAG);
    assert_eq!(up, 1, "the up was not resent");
    app.stop().await;
}

#[tokio::test]
async fn readyz_answers_only_once_the_unfinished_rollouts_are_resumed() {
    let (app, id) = crash_at("step:health:started").await;
    let res = reqwest::get(format!("{}/readyz", app.url))
        .await
        .expect("readyz");
    assert_eq!(res.status(), 200);
    // By the time the listener answers, the rollout's task is already running again.
    let kinds = app.audit_kinds(&id).await;
    assert!(kinds.contains(&"rollout_resumed".to_owned()), "{kinds:?}");
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded");
    app.stop().await;
}

#[tokio::test]
async fn a_resumed_wait_keeps_its_original_deadline() {
    let app = TestApp::spawn().await;
    app.sim.faults().set_health_never(R2, true);
    let mut pause = app.engine.pause_at("step:health:started");
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    assert!(pause.reached(Duration::from_secs(10)).await.is_some());
    let step = |r: &RolloutOut| {
        r.steps
            .iter()
            .find(|s| s.name == "health")
            .cloned()
            .expect("health step")
    };
    let before = step(&app.rollout(&id).await);
    let deadline: chrono::DateTime<chrono::Utc> = app
        .engine
        .store()
        .steps(&id)
        .await
        .expect("steps")
        .into_iter()
        .find(|s| s.name == "health")
        .and_then(|s| s.deadline_at)
        .expect("a deadline was written when the wait started");
    let app = app.kill().await.restart().await;
    let r = app.wait_terminal(&id).await;
    let after = step(&r);
    assert_eq!(after.status, "failed");
    assert_eq!(
        after.started_at, before.started_at,
        "the same wait, resumed"
    );
    let kept = app
        .engine
        .store()
        .steps(&id)
        .await
        .expect("steps")
        .into_iter()
        .find(|s| s.name == "health")
        .and_then(|s| s.deadline_at);
    assert_eq!(
        kept,
        Some(deadline),
        "the deadline is not reset by the restart"
    );
    let finished = after.finished_at.expect("finished");
    assert!(finished >= deadline, "it ran until its deadline");
    app.stop().await;
}

/// A succeeded canary of r2, then a one-click rollback whose task is frozen at `point`, a
/// crash there and a restart.
async fn crash_rollback_at(point: &str, stall_up: bool) -> (TestApp, String) {
    let app = TestApp::spawn().await;
    let canary = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    assert_eq!(app.wait_terminal(&canary).await.status, "succeeded");
    let mut pause = app.engine.pause_at(point);
    let (status, body) = app
        .post(
            "/v1/rollbacks",
            &json!({"host": crate::helpers::HOST, "service": R2, "reason": "TTFT regression"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_str().expect("id").to_owned();
    assert_eq!(
        pause.reached(Duration::from_secs(10)).await.as_deref(),
        Some(id.as_str())
    );
    if stall_up {
        app.sim.faults().stall_stream(SimOp::Up);
    }
    pause.release();
    if stall_up {
        for _ in 0..400 {
            if app.sim.faults().stalled_streams() > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(app.sim.faults().stalled_streams(), 1);
    }
    let app = app.kill().await.restart().await;
    (app, id)
}

#[tokio::test]
async fn a_rollback_killed_between_its_steps_resumes_and_redeploys_once() {
    let (app, id) = crash_rollback_at("step:health:before", false).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    assert_audit_complete(&app, &r).await;
    assert_eq!(calls_for(&app, BASELINE_TAG).2, 1, "one up of the rollback");
    app.stop().await;
}

#[tokio::test]
async fn a_rollback_killed_during_its_up_is_reconciled_and_never_resent() {
    let (app, id) = crash_rollback_at("step:up:before", true).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "failed", "{r:#?}");
    assert_eq!(
        r.error.as_ref().map(|e| e.code.as_str()),
        Some("compose_outcome_unknown")
    );
    assert!(
        r.rolled_back_by.is_none(),
        "a rollback does not roll itself back"
    );
    assert_audit_complete(&app, &r).await;
    assert_eq!(calls_for(&app, BASELINE_TAG).2, 1, "the up was not resent");
    app.stop().await;
}

#[tokio::test]
async fn a_rollout_whose_runbook_is_gone_after_a_restart_fails_runbook_not_loaded() {
    let app = TestApp::spawn().await;
    let mut pause = app.engine.pause_at("step:health:before");
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    assert!(pause.reached(Duration::from_secs(10)).await.is_some());
    let mut books = crate::helpers::fast_runbooks();
    books.remove("single-replica-canary");
    let app = app.kill().await.restart_with_runbooks(books).await;
    let (canary, rollback) = assert_recovered(&app, &id).await;
    assert_eq!(canary.status, "failed");
    assert_eq!(
        canary.error.as_ref().map(|e| e.code.as_str()),
        Some("runbook_not_loaded"),
        "{canary:#?}"
    );
    assert!(rollback.is_some(), "the touched replica is rolled back");
    app.stop().await;
}

/// on_failure: halt after the down and a failed up: the replica is left down, and says so
/// (safety rule 14), keeping the cause.
fn assert_left_down_by_failed_up(canary: &canaryd::api::RolloutOut) {
    assert_eq!(
        canary.error.as_ref().map(|e| e.code.as_str()),
        Some("replica_left_down"),
        "{canary:#?}"
    );
    assert!(
        canary
            .error
            .as_ref()
            .is_some_and(|e| e.message.contains("compose_failed")),
        "the cause is kept: {canary:#?}"
    );
}
