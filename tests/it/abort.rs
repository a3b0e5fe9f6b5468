//! Abort from every non-terminal state (docs/recovery.md#abort): effective before the next side
//! effect, waits interrupted at once; graceful shutdown leaves rollouts resumable.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use canaryd::domain::runbook::{self, Runbook};
use canaryd_sim::SimOp;
use serde_json::json;

use crate::helpers::{fast_runbooks, sim_config, TestApp, TestOptions, R2};

async fn abort(app: &TestApp, id: &str) {
    let (status, body) = app
        .post(
            &format!("/v1/rollouts/{id}/abort"),
            &json!({"reason": "operator said stop"}),
        )
        .await;
    assert_eq!(status, 200, "abort accepted: {body}");
}

/// From the committed `abort_requested` to the committed `rollout_aborted`: how long the
/// daemon took to act on the abort (test polling not included). Tests bound it well below the
/// wait's 30 s poll (proof the wait was interrupted) rather than at 1 s: a tight wall-clock
/// bound would flake on a shared 2-core runner. Typical values are a few milliseconds.
async fn abort_reaction(app: &TestApp, id: &str) -> chrono::Duration {
    let events = app
        .engine
        .store()
        .audit_events(id, 0)
        .await
        .expect("audit events");
    let at = |kind: &str| {
        events
            .iter()
            .find(|e| e.kind.as_str() == kind)
            .unwrap_or_else(|| panic!("no {kind} event"))
            .occurred_at
    };
    at("rollout_aborted") - at("abort_requested")
}

/// Freezes the canary at `point`, aborts it, lets it go on: it must end `aborted` without one
/// more compose call. Its error is `aborted`, or `replica_left_down` once the target was
/// taken down (safety rule 14: an abort between the down and the up leaves it down).
async fn abort_at(point: &str) {
    abort_at_expecting(point, "aborted").await;
}

async fn abort_at_expecting(point: &str, code: &str) {
    let app = TestApp::spawn().await;
    let mut pause = app.engine.pause_at(point);
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    assert!(pause.reached(Duration::from_secs(10)).await.is_some());
    let before = app.compose_calls().len();
    abort(&app, &id).await;
    pause.release();
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "aborted", "{point}: {r:#?}");
    assert_eq!(
        r.error.as_ref().map(|e| e.code.as_str()),
        Some(code),
        "{point}"
    );
    let left_down = app.rollout(&id).await;
    if code == "replica_left_down" {
        let message = &left_down.error.as_ref().expect("error").message;
        assert!(message.contains("aborted"), "the cause is kept: {message}");
        let running = app
            .sim
            .containers()
            .iter()
            .any(|c| c.service == R2 && c.state == "running");
        assert!(!running, "{point}: r2 has no running container");
    }
    assert_eq!(
        app.compose_calls().len(),
        before,
        "{point}: no compose call after the abort"
    );
    assert!(
        r.steps
            .iter()
            .all(|s| matches!(s.status.as_str(), "succeeded" | "aborted" | "skipped")),
        "{point}: {:#?}",
        r.steps
    );
    assert!(r.rolled_back_by.is_none(), "an abort is not a failure");
    let kinds = app.audit_kinds(&id).await;
    assert!(kinds.contains(&"abort_requested".to_owned()), "{kinds:?}");
    assert!(kinds.contains(&"rollout_aborted".to_owned()), "{kinds:?}");
    assert_eq!(
        kinds.contains(&"replica_left_down".to_owned()),
        code == "replica_left_down",
        "{point}: {kinds:?}"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_pending_rollout_aborts_before_anything_is_sent() {
    abort_at("rollout:start").await;
}

#[tokio::test]
async fn an_abort_during_the_snapshot_stops_before_the_peer_check() {
    abort_at("step:snapshot:started").await;
}

#[tokio::test]
async fn an_abort_during_the_peer_check_stops_it() {
    abort_at("step:peers:started").await;
}

#[tokio::test]
async fn an_abort_during_the_preflight_stops_before_the_dry_run_is_sent() {
    abort_at("step:preflight:started").await;
}

#[tokio::test]
async fn an_abort_during_the_down_step_stops_before_the_down_is_sent() {
    abort_at("step:down:started").await;
}

/// An abort that lands while the down's attempt row is written: the call is never sent, and
/// the row says so (`not_sent`), so a restart can never read it as "may have been sent".
/// The replica was never taken down: the rollout ends plainly `aborted`.
#[tokio::test]
async fn an_abort_while_the_down_attempt_is_written_records_the_call_not_sent() {
    abort_at("step:down:attempt_written").await;
    let app = TestApp::spawn().await;
    let mut pause = app.engine.pause_at("step:down:attempt_written");
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    assert!(pause.reached(Duration::from_secs(10)).await.is_some());
    abort(&app, &id).await;
    pause.release();
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "aborted");
    let attempts = app.engine.store().attempts(&id).await.expect("attempts");
    let down = attempts
        .iter()
        .find(|a| a.endpoint == "compose/down")
        .expect("the down's attempt row");
    assert_eq!(
        down.outcome,
        Some(canaryd::domain::state::AttemptOutcome::NotSent),
        "{down:?}"
    );
    assert!(
        app.compose_calls()
            .iter()
            .all(|c| !c.path.starts_with("/compose/down")),
        "no down reached the host"
    );
    app.stop().await;
}

#[tokio::test]
async fn an_abort_during_the_second_dry_run_step_stops_before_it_is_sent() {
    abort_at_expecting("step:plan:started", "replica_left_down").await;
}

#[tokio::test]
async fn an_abort_during_the_up_step_stops_before_the_up_is_sent() {
    abort_at_expecting("step:up:started", "replica_left_down").await;
}

/// An abort that lands after the up's attempt row is written (a write that can wait seconds on
/// a busy database) but before the up is sent still stops it.
#[tokio::test]
async fn an_abort_after_the_up_attempt_is_written_stops_before_the_up_is_sent() {
    abort_at_expecting("step:up:attempt_written", "replica_left_down").await;
}

#[tokio::test]
async fn an_abort_during_the_neighbour_check_stops_before_the_health_wait() {
    abort_at("step:neighbours:started").await;
}

#[tokio::test]
async fn an_abort_during_the_health_wait_stops_it() {
    abort_at("step:health:started").await;
}

#[tokio::test]
async fn an_abort_during_the_log_wait_stops_it() {
    abort_at("step:startup-logs:started").await;
}

#[tokio::test]
async fn an_abort_during_the_soak_stops_it() {
    abort_at("step:soak:started").await;
}

/// The fast canary with one slow wait (30 s polls, minutes of budget).
fn slow_runbooks(step: &str) -> BTreeMap<String, Runbook> {
    let mut books = fast_runbooks();
    let text = crate::helpers::FAST_CANARY.replace(
        match step {
            "health" => {
                "{name: health, kind: wait_health, timeout: 3s, interval: 50ms, consecutive: 2}"
            }
            _ => {
                "{name: soak, kind: soak, duration: 300ms, interval: 50ms, max_misses: 3, forbid: [\"[event-loop-stall]\", \"CUDA error\"]}"
            }
        },
        match step {
            "health" => {
                "{name: health, kind: wait_health, timeout: 10m, interval: 30s, consecutive: 2}"
            }
            _ => {
                "{name: soak, kind: soak, duration: 10m, interval: 30s, max_misses: 3, forbid: [\"CUDA error\"]}"
            }
        },
    );
    assert_ne!(text, *crate::helpers::FAST_CANARY, "the step was replaced");
    let rb = runbook::parse("single-replica-canary", "slow", &text).expect("slow runbook");
    books.insert("single-replica-canary".to_owned(), rb);
    books
}

async fn abort_interrupts_wait(step: &str) {
    let opts = TestOptions {
        runbooks: Some(slow_runbooks(step)),
        ..TestOptions::default()
    };
    let app = TestApp::spawn_custom(sim_config(), opts).await;
    if step == "health" {
        app.sim.faults().set_health_never(R2, true);
    }
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    app.wait_step(&id, step, "running").await;
    // Let the wait settle into its 30 s pause.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let asked = Instant::now();
    abort(&app, &id).await;
    let r = app.wait_terminal(&id).await;
    let took = asked.elapsed();
    assert_eq!(r.status, "aborted");
    let s = r.steps.iter().find(|s| s.name == step).expect("step");
    assert_eq!(s.status, "aborted", "{s:#?}");
    let (finished, deadline) = (
        s.finished_at.expect("end"),
        s.deadline_at.expect("deadline"),
    );
    assert!(finished < deadline, "interrupted long before its deadline");
    // The wait polls every 30 s; an abort that waited for the next poll would take that long.
    assert!(
        took < Duration::from_secs(10),
        "interrupted at once, took {took:?}"
    );
    let reaction = abort_reaction(&app, &id).await;
    assert!(
        reaction < chrono::Duration::seconds(5),
        "the wait is interrupted long before its next 30 s poll, took {reaction}"
    );
    app.stop().await;
}

#[tokio::test]
async fn an_abort_interrupts_a_health_wait_between_two_polls() {
    abort_interrupts_wait("health").await;
}

#[tokio::test]
async fn an_abort_interrupts_a_soak_between_two_polls() {
    abort_interrupts_wait("soak").await;
}

#[tokio::test]
async fn an_abort_during_a_compose_stream_lets_it_finish_then_sends_nothing_more() {
    let app = TestApp::spawn().await;
    let faults = app.sim.faults();
    faults.stall_stream(SimOp::Down);
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    for _ in 0..400 {
        if faults.stalled_streams() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(faults.stalled_streams(), 1);
    let before = app.compose_calls().len();
    abort(&app, &id).await;
    // The stream is not cut (that would free compose-manager's lock while docker runs on).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(app.rollout(&id).await.status, "running");
    faults.release_stalls();
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "aborted", "{r:#?}");
    let down = r.steps.iter().find(|s| s.name == "down").expect("down");
    assert_eq!(down.status, "succeeded", "the call in flight finished");
    assert_eq!(app.compose_calls().len(), before, "nothing sent after it");
    app.stop().await;
}

#[tokio::test]
async fn a_graceful_shutdown_leaves_a_rollout_resumable_and_it_finishes_after_restart() {
    let app = TestApp::spawn().await;
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    app.wait_step(&id, "health", "running").await;
    let crashed = app.stop_gracefully().await;
    let app = crashed.restart().await;
    let kinds = app.audit_kinds(&id).await;
    assert!(
        !kinds
            .iter()
            .any(|k| k == "rollout_failed" || k == "rollout_aborted"),
        "a shutdown marks nothing failed: {kinds:?}"
    );
    assert!(kinds.contains(&"rollout_resumed".to_owned()), "{kinds:?}");
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let ups = app
        .compose_calls()
        .iter()
        .filter(|c| c.path == "/compose/up" && !crate::helpers::is_dry_run(c))
        .count();
    assert_eq!(ups, 1);
    app.stop().await;
}

/// `shutdown` waits for the rollout tasks up to its grace, then stops the ones still busy
/// where they are and says how many; their rollout stays resumable (that `wait_terminal` does
/// not wait for a rollout without a task is `engine::wait`'s test, on the paused clock).
#[tokio::test]
async fn a_shutdown_stops_a_task_still_busy_after_its_grace_and_counts_it() {
    let app = TestApp::spawn().await;
    let mut pause = app.engine.pause_at("step:down:before");
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    assert!(pause.reached(Duration::from_secs(10)).await.is_some());
    assert_eq!(app.engine.active_tasks(), 1);
    // Frozen at a checkpoint, the task never reads its abort signal: the grace runs out.
    assert_eq!(app.engine.shutdown(Duration::from_millis(200)).await, 1);
    assert_eq!(app.engine.active_tasks(), 0);
    assert!(app.engine.is_stopping());
    let r = app
        .engine
        .wait_terminal(&id, Duration::from_secs(30))
        .await
        .expect("read");
    assert_eq!(r.status.as_str(), "running", "left resumable: {r:#?}");
    pause.release();
    let downs = app
        .compose_calls()
        .iter()
        .filter(|c| c.path == "/compose/down")
        .count();
    assert_eq!(downs, 0);
    app.stop().await;
}

#[tokio::test]
async fn an_abort_interrupts_the_wait_for_an_idle_host_after_an_unknown_outcome() {
    let opts = TestOptions {
        tuning: Some(canaryd::config::ComposeTuning {
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(2),
            stream_idle_timeout: Duration::from_millis(300),
            busy_retry_initial: Duration::from_millis(50),
            busy_retry_max: Duration::from_millis(200),
            settle_interval: Duration::from_millis(200),
            ..Default::default()
        }),
        ..TestOptions::default()
    };
    let app = TestApp::spawn_custom(sim_config(), opts).await;
    let faults = app.sim.faults();
    let mut pause = app.engine.pause_at("step:down:started");
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    assert!(pause.reached(Duration::from_secs(10)).await.is_some());
    // The down gets no answer in time (unknown outcome) and the host then stays busy: canary
    // waits for it to be idle (up to 30 s) before it may judge.
    faults.delay_answer(SimOp::Down, Duration::from_millis(600), 1);
    faults.busy_for(Duration::from_secs(60));
    pause.release();
    let mut waiting_for_idle = false;
    for _ in 0..200 {
        let calls = app.sim.calls();
        if calls.iter().filter(|c| c.path == "/status").count() >= 2 {
            waiting_for_idle = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        waiting_for_idle,
        "the canary never polled /status for an idle host"
    );
    let asked = Instant::now();
    abort(&app, &id).await;
    let r = app.wait_terminal(&id).await;
    let took = asked.elapsed();
    faults.busy_for(Duration::ZERO);
    assert_eq!(r.status, "aborted", "{r:#?}");
    let down = r.steps.iter().find(|s| s.name == "down").expect("down");
    assert_eq!(down.status, "aborted");
    assert_eq!(down.detail["outcome"], "unknown", "{}", down.detail);
    assert!(
        took < Duration::from_secs(10),
        "interrupted at once, took {took:?}"
    );
    let reaction = abort_reaction(&app, &id).await;
    assert!(
        reaction < chrono::Duration::seconds(5),
        "the idle wait is interrupted long before its next 30 s poll, took {reaction}"
    );
    let downs = app
        .compose_calls()
        .iter()
        .filter(|c| c.path == "/compose/down")
        .count();
    assert_eq!(downs, 1, "never resent");
    app.stop().await;
}
