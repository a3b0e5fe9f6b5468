//! Manual judgement end to end: an `approve` step waits for an operator's approval (API),
//! recorded with actor and reason; nobody approving fails it `not_approved` and the canary is
//! rolled back; an approval is refused when nothing waits; a wait survives a restart.

use serde_json::json;

use crate::helpers::step;
use crate::helpers::{canary_with, sim_config, TestApp, TestOptions, R2};

const HEALTH: &str =
    "  - {name: health, kind: wait_health, timeout: 3s, interval: 50ms, consecutive: 2}\n";
const CANARY_TAG: &str = "v0.0.452";
/// What the example host runs at start, and so what a failed canary's rollback restores.
const PRIOR_TAG: &str = "v0.0.450";

fn options(timeout: &str) -> TestOptions {
    let approve = format!("{HEALTH}  - {{name: judgement, kind: approve, timeout: {timeout}}}\n");
    TestOptions {
        runbooks: Some(canary_with(&[(HEALTH, &approve)])),
        ..TestOptions::default()
    }
}

async fn spawn(timeout: &str) -> TestApp {
    TestApp::spawn_custom(sim_config(), options(timeout)).await
}

fn image_of(app: &TestApp, service: &str) -> String {
    app.sim
        .containers()
        .into_iter()
        .find(|c| c.service == service)
        .map(|c| c.image)
        .unwrap_or_default()
}

#[tokio::test]
async fn an_approve_step_waits_for_an_operator_and_goes_on_once_approved() {
    let app = spawn("30s").await;
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    let r = app.wait_step(&id, "judgement", "running").await;
    // The wait is visible before anyone acts: the evidence says so, with its deadline.
    let mut waiting = step(&r, "judgement").detail.clone();
    for _ in 0..100 {
        if waiting["awaiting_approval"] == json!(true) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        waiting = step(&app.rollout(&id).await, "judgement").detail.clone();
    }
    assert_eq!(waiting["awaiting_approval"], json!(true), "{waiting:#}");
    assert!(waiting["deadline"].is_string(), "{waiting:#}");

    // A blank reason is refused and approves nothing.
    let path = format!("/v1/rollouts/{id}/approve");
    let (status, body) = app.post(&path, &json!({"reason": " "})).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (422, &json!("missing_reason"))
    );
    assert_eq!(app.rollout(&id).await.status, "running");

    let (status, body) = app
        .post(&path, &json!({"reason": "latency and outputs look right"}))
        .await;
    assert_eq!(status, 200, "{body}");
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let d = &step(&r, "judgement").detail;
    assert_eq!(d["approved_by"], "local", "the dev-mode operator: {d:#}");
    assert_eq!(d["reason"], "latency and outputs look right");
    assert!(d.get("awaiting_approval").is_none(), "{d:#}");
    // The steps after the judgement ran after it.
    assert_eq!(step(&r, "soak").status, "succeeded");
    let kinds = app.audit_kinds(&id).await;
    let asked = kinds.iter().position(|k| k == "approval_requested");
    let approved = kinds.iter().position(|k| k == "approved");
    assert!(asked.is_some() && asked < approved, "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| *k == "approved").count(), 1);

    // Nothing waits any more.
    let (status, body) = app.post(&path, &json!({"reason": "again"})).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (409, &json!("rollout_terminal"))
    );
    app.stop().await;
}

#[tokio::test]
async fn nobody_approving_fails_not_approved_and_the_canary_is_rolled_back() {
    let app = spawn("500ms").await;
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "failed", "{r:#?}");
    assert_eq!(
        r.error.as_ref().map(|e| e.code.as_str()),
        Some("not_approved")
    );
    let judgement = step(&r, "judgement");
    assert_eq!(judgement.status, "failed");
    assert_eq!(judgement.detail["error"]["code"], "not_approved");
    // The automatic rollback put the prior tag back on the one replica.
    let rollback = r.rolled_back_by.clone().expect("an automatic rollback");
    let rb = app.wait_terminal(&rollback).await;
    assert_eq!(rb.status, "succeeded", "{rb:#?}");
    assert_eq!(rb.tag, PRIOR_TAG);
    assert_eq!(image_of(&app, R2), "lmsysorg/sglang:glm53-v450");
    for call in app.compose_calls() {
        assert_eq!(
            call.body["services"],
            json!([R2]),
            "r2 alone: {}",
            call.path
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn an_approval_is_refused_when_nothing_waits_and_for_unknown_rollouts() {
    let app = spawn("30s").await;
    let (status, body) = app
        .post("/v1/rollouts/ro_nope/approve", &json!({"reason": "x"}))
        .await;
    assert_eq!((status, &body["error"]["code"]), (404, &json!("not_found")));

    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    app.wait_step(&id, "judgement", "running").await;
    let path = format!("/v1/rollouts/{id}/approve");
    // Retry while the step has not yet marked itself waiting (bounded).
    let mut answer = (0, json!(null));
    for _ in 0..100 {
        answer = app.post(&path, &json!({"reason": "ok"})).await;
        if answer.0 == 200 {
            break;
        }
        assert_eq!(
            answer.1["error"]["code"], "not_awaiting_approval",
            "{answer:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(answer.0, 200, "{answer:?}");
    // Approved once; the soak that follows does not wait for anyone.
    app.wait_step(&id, "soak", "running").await;
    let (status, body) = app.post(&path, &json!({"reason": "twice"})).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (409, &json!("not_awaiting_approval")),
        "{body}"
    );
    assert_eq!(app.wait_terminal(&id).await.status, "succeeded");
    app.stop().await;
}

#[tokio::test]
async fn a_wait_for_an_approval_survives_a_restart_and_asks_once() {
    let app = spawn("30s").await;
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    app.wait_step(&id, "judgement", "running").await;
    for _ in 0..100 {
        if app
            .audit_kinds(&id)
            .await
            .iter()
            .any(|k| k == "approval_requested")
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let app = app.kill().await.restart().await;
    let path = format!("/v1/rollouts/{id}/approve");
    let mut answer = (0, json!(null));
    for _ in 0..100 {
        answer = app
            .post(&path, &json!({"reason": "after the restart"}))
            .await;
        if answer.0 == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(answer.0, 200, "{answer:?}");
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    assert_eq!(step(&r, "judgement").detail["reason"], "after the restart");
    let kinds = app.audit_kinds(&id).await;
    assert_eq!(
        kinds.iter().filter(|k| *k == "approval_requested").count(),
        1,
        "{kinds:?}"
    );
    app.stop().await;
}

#[tokio::test]
async fn rollout_approve_on_the_command_line_approves_the_waiting_step() {
    let app = spawn("30s").await;
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    app.wait_step(&id, "judgement", "running").await;
    let mut out = None;
    for _ in 0..100 {
        let (url, rollout) = (app.url.clone(), id.clone());
        let run = tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_canaryd"))
                .args([
                    "rollout",
                    "approve",
                    &rollout,
                    "--reason",
                    "checked by hand",
                ])
                .env("CANARYD_SERVER", url)
                .env_remove("CANARYD_TOKEN")
                .output()
                .expect("the canaryd binary runs")
        })
        .await
        .expect("join");
        if run.status.success() {
            out = Some(run);
            break;
        }
        // Until the step has marked itself waiting, the daemon answers not_awaiting_approval.
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(stderr.contains("not_awaiting_approval"), "{stderr}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let out = out.expect("the approval was accepted");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(&format!("{id} approved")), "{stdout}");
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    assert_eq!(step(&r, "judgement").detail["reason"], "checked by hand");
    app.stop().await;
}
