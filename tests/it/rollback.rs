//! One-click and automatic single-replica rollback (docs/reference.md#rollback).

use serde_json::json;

use crate::helpers::{canary_with, is_dry_run, sim_config, TestApp, TestOptions, HOST, R1, R2};

async fn canary(app: &TestApp, tag: &str) -> canaryd::api::RolloutOut {
    let id = app.start_canary(&TestApp::plan(tag)).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "canary to {tag}: {r:#?}");
    r
}

async fn rollback(app: &TestApp, body: serde_json::Value) -> (u16, serde_json::Value) {
    app.post("/v1/rollbacks", &body).await
}

#[tokio::test]
async fn a_rollback_redeploys_the_prior_tag_to_r2_alone() {
    let app = TestApp::spawn().await;
    canary(&app, "v0.0.451").await;
    let b = canary(&app, "v0.0.452").await;
    let r1 = app.container_id(R1).expect("r1");
    let calls_before = app.compose_calls().len();

    let (status, body) = rollback(
        &app,
        json!({"host": HOST, "service": R2, "reason": "TTFT regression"}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["kind"], "rollback");
    assert_eq!(body["tag"], "v0.0.451", "the prior deployment");
    assert_eq!(body["rollback_of"], json!(b.id));
    let id = body["id"].as_str().expect("id").to_owned();
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    assert_eq!(r.runbook, "single-replica-rollback");
    // The canary it undid says so, in the CLI's history and its timeline.
    let said = format!("succeeded · rolled back by {id}");
    let history = crate::helpers::canaryd_async(&["history", "--kind", "canary"], &app.url).await;
    let history = String::from_utf8_lossy(&history.stdout).into_owned();
    let line = history
        .lines()
        .find(|l| l.starts_with(&b.id))
        .unwrap_or_else(|| panic!("{history}"));
    assert!(line.contains(&said), "{history}");
    let show = crate::helpers::canaryd_async(&["show", &b.id], &app.url).await;
    assert!(
        String::from_utf8_lossy(&show.stdout).contains(&said),
        "{show:?}"
    );
    assert_eq!(
        app.rollout(&b.id).await.rolled_back_by.as_deref(),
        Some(id.as_str())
    );

    let calls = &app.compose_calls()[calls_before..];
    assert!(!calls.is_empty());
    for c in calls {
        assert_eq!(c.body["services"], json!([R2]), "r2 alone: {}", c.body);
        assert_eq!(c.body["tag"], "v0.0.451");
        assert!(c.body.get("force_recreate").is_none());
    }
    assert_eq!(
        calls
            .iter()
            .filter(|c| c.path == "/compose/up" && !is_dry_run(c))
            .count(),
        1
    );
    assert_eq!(
        app.container_id(R1),
        Some(r1),
        "r1's container is untouched"
    );
    let image = app
        .sim
        .containers()
        .into_iter()
        .find(|c| c.service == R2)
        .map(|c| c.image)
        .unwrap_or_default();
    assert!(
        image.contains("451"),
        "r2 runs the v0.0.451 image again: {image}"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_rollback_of_a_rollback_goes_forward_again() {
    let app = TestApp::spawn().await;
    canary(&app, "v0.0.451").await;
    canary(&app, "v0.0.452").await;
    let (_, first) = rollback(
        &app,
        json!({"host": HOST, "service": R2, "reason": "regression"}),
    )
    .await;
    let first = app.wait_terminal(first["id"].as_str().expect("id")).await;
    assert_eq!(
        (first.status.as_str(), first.tag.as_str()),
        ("succeeded", "v0.0.451")
    );
    let (status, second) = rollback(
        &app,
        json!({"host": HOST, "service": R2, "reason": "false alarm"}),
    )
    .await;
    assert_eq!(status, 201, "{second}");
    assert_eq!(
        second["tag"], "v0.0.452",
        "the deployment before the rollback's"
    );
    assert_eq!(second["rollback_of"], json!(first.id));
    let second = app.wait_terminal(second["id"].as_str().expect("id")).await;
    assert_eq!(second.status, "succeeded");
    app.stop().await;
}

#[tokio::test]
async fn a_replica_with_only_its_baseline_has_no_prior_deployment() {
    let app = TestApp::spawn().await;
    let (status, body) = rollback(
        &app,
        json!({"host": HOST, "service": R2, "reason": "nothing yet"}),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "no_prior_deployment");
    canary(&app, "v0.0.451").await;
    let (status, body) = rollback(
        &app,
        json!({"host": HOST, "service": R2, "reason": "x", "to_tag": "v0.0.449"}),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap_or("")
        .contains("v0.0.449"));
    app.stop().await;
}

#[tokio::test]
async fn the_first_canary_rolls_back_to_the_recorded_baseline() {
    let app = TestApp::spawn().await;
    canary(&app, "v0.0.452").await;
    let (status, body) = rollback(
        &app,
        json!({"host": HOST, "service": R2, "reason": "back to what ran"}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        body["tag"], "v0.0.450",
        "the host's baseline from GET /version"
    );
    let r = app.wait_terminal(body["id"].as_str().expect("id")).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    app.stop().await;
}

#[tokio::test]
async fn a_canary_that_fails_after_touching_r2_rolls_itself_back() {
    let app = TestApp::spawn().await;
    canary(&app, "v0.0.451").await;
    let r1 = app.container_id(R1).expect("r1");
    app.sim.faults().set_logs_on_start(
        R2,
        Some(vec!["CUDA error 801: operation not supported".into()]),
    );
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let failed = app.wait_terminal(&id).await;
    assert_eq!(failed.status, "failed");
    assert_eq!(
        failed.error.as_ref().map(|e| e.code.as_str()),
        Some("forbidden_log_line"),
        "{failed:#?}"
    );
    let rb_id = failed
        .rolled_back_by
        .clone()
        .expect("an automatic rollback was started");
    app.sim.faults().set_logs_on_start(R2, None);
    let rb = app.wait_terminal(&rb_id).await;
    assert_eq!(rb.kind, "rollback");
    assert_eq!(rb.rollback_of.as_deref(), Some(id.as_str()));
    assert_eq!(rb.actor, "canaryd");
    assert_eq!(rb.tag, "v0.0.451");
    assert_eq!(rb.status, "succeeded", "{rb:#?}");
    let rollback_ups = app
        .compose_calls()
        .iter()
        .filter(|c| c.path == "/compose/up" && !is_dry_run(c) && c.body["tag"] == "v0.0.451")
        .count();
    assert_eq!(rollback_ups, 2, "the first canary's up and the rollback's");
    for c in app.compose_calls() {
        assert_eq!(c.body["services"], json!([R2]), "r2 alone: {}", c.body);
    }
    assert_eq!(
        app.container_id(R1),
        Some(r1),
        "r1's container is untouched"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_canary_that_fails_before_touching_anything_does_not_roll_back() {
    let app = TestApp::spawn().await;
    canary(&app, "v0.0.451").await;
    app.sim.faults().set_dry_run_extra(Some("nginx".into()));
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "failed");
    assert!(r.rolled_back_by.is_none());
    let list = app
        .api
        .get("/v1/rollouts?kind=rollback")
        .await
        .expect("list");
    assert_eq!(list["items"], json!([]));
    app.stop().await;
}

#[tokio::test]
async fn a_rollback_while_a_canary_waits_on_health_needs_preempt() {
    let app = TestApp::spawn().await;
    canary(&app, "v0.0.451").await;
    app.sim.faults().set_health_never(R2, true);
    let mut plan = TestApp::plan("v0.0.452");
    plan["on_failure"] = json!("halt");
    let id = app.start_canary(&plan).await;
    app.wait_step(&id, "health", "running").await;

    let (status, body) = rollback(
        &app,
        json!({"host": HOST, "service": R2, "reason": "stuck"}),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "host_busy");

    app.sim.faults().set_health_never(R2, false);
    let (status, body) = rollback(
        &app,
        json!({"host": HOST, "service": R2, "reason": "stuck", "preempt": true}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let canary = app.rollout(&id).await;
    assert_eq!(canary.status, "aborted", "the canary was aborted first");
    assert_eq!(
        canary
            .steps
            .iter()
            .find(|s| s.name == "health")
            .map(|s| s.status.as_str()),
        Some("aborted")
    );
    assert_eq!(
        body["tag"], "v0.0.451",
        "the failed canary's tag is not a deployment"
    );
    let rb = app.wait_terminal(body["id"].as_str().expect("id")).await;
    assert_eq!(rb.status, "succeeded", "{rb:#?}");
    app.stop().await;
}

#[tokio::test]
async fn a_rollback_to_a_tag_that_moved_fails_tag_moved() {
    let app = TestApp::spawn().await;
    canary(&app, "v0.0.451").await;
    canary(&app, "v0.0.452").await;
    app.sim.faults().move_tag("v0.0.451", &"f".repeat(40));
    let (status, body) = rollback(
        &app,
        json!({"host": HOST, "service": R2, "reason": "regression"}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let r = app.wait_terminal(body["id"].as_str().expect("id")).await;
    assert_eq!(r.status, "failed");
    assert_eq!(
        r.error.as_ref().map(|e| e.code.as_str()),
        Some("tag_moved"),
        "{r:#?}"
    );
    let up = r.steps.iter().find(|s| s.name == "up").expect("up step");
    assert_eq!(up.detail["got"]["commit"], json!("f".repeat(40)));
    assert!(up.detail["expected"]["commit"]
        .as_str()
        .is_some_and(|c| c.len() == 40 && !c.starts_with("ffff")));
    app.stop().await;
}

/// A daemon whose canary runbook has no dry run before its `down` (a runbook may gate only the
/// `up`): a canary of what already runs then succeeds, recording a second identical deployment.
async fn spawn_without_preflight() -> TestApp {
    let opts = TestOptions {
        runbooks: Some(canary_with(&[(
            "  - {name: preflight, kind: plan, allow: [model-downloader]}\n",
            "",
        )])),
        ..TestOptions::default()
    };
    TestApp::spawn_custom(sim_config(), opts).await
}

#[tokio::test]
async fn after_two_canaries_of_the_same_tag_a_rollback_goes_back_to_the_tag_before_them() {
    let app = spawn_without_preflight().await;
    canary(&app, "v0.0.451").await;
    canary(&app, "v0.0.452").await;
    let again = canary(&app, "v0.0.452").await;
    // A canary refused at the gate touched nothing: it is not what a rollback undoes.
    app.sim.faults().set_dry_run_extra(Some("nginx".into()));
    let mut plan = TestApp::plan("v0.0.453");
    plan["runbook"] = json!("recreate-in-place"); // its dry run comes before any down or up
    let refused = app.start_canary(&plan).await;
    let refused = app.wait_terminal(&refused).await;
    assert_eq!(refused.status, "failed", "{refused:#?}");
    assert!(refused.rolled_back_by.is_none());
    app.sim.faults().set_dry_run_extra(None);
    let r1 = app.container_id(R1).expect("r1");

    let (status, body) = rollback(
        &app,
        json!({"host": HOST, "service": R2, "reason": "TTFT regression"}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        body["tag"], "v0.0.451",
        "the newest deployment that differs from what runs"
    );
    assert_eq!(
        body["rollback_of"],
        json!(again.id),
        "the newest rollout that touched r2, not the refused canary"
    );
    let rb = app.wait_terminal(body["id"].as_str().expect("id")).await;
    assert_eq!(rb.status, "succeeded", "{rb:#?}");
    assert!(app.rollout(&refused.id).await.rolled_back_by.is_none());
    assert_eq!(
        app.rollout(&again.id).await.rolled_back_by.as_deref(),
        Some(rb.id.as_str())
    );
    assert_eq!(app.container_id(R1), Some(r1), "r1 is untouched");
    app.stop().await;
}

#[tokio::test]
async fn a_replica_whose_every_deployment_is_what_it_runs_has_no_prior_deployment() {
    let app = spawn_without_preflight().await;
    // The first canary records the baseline (v0.0.450) and deploys the same tag again: every
    // recorded deployment is what r2 runs now.
    canary(&app, "v0.0.450").await;
    let (status, body) = rollback(
        &app,
        json!({"host": HOST, "service": R2, "reason": "nothing else ran"}),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "no_prior_deployment");
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("v0.0.450"), "names what runs: {message}");
    assert!(
        message.contains("differs"),
        "says why none qualifies: {message}"
    );
    let (status, body) = rollback(
        &app,
        json!({"host": HOST, "service": R2, "reason": "x", "to_tag": "v0.0.450"}),
    )
    .await;
    assert_eq!(status, 404, "to_tag of what runs: {body}");
    assert_eq!(body["error"]["code"], "no_prior_deployment");
    app.stop().await;
}
