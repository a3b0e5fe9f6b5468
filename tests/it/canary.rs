//! Canary rollouts end to end against the simulated host (issue: canary rollouts).

use std::time::Duration;

use canaryd_sim::SimOp;
use serde_json::{json, Value};

use crate::helpers::step;
use crate::helpers::{is_dry_run, TestApp, FILE, HOST, R1, R2};

#[tokio::test]
async fn a_canary_of_r2_runs_every_step_and_leaves_r1_untouched() {
    let app = TestApp::spawn().await;
    let r1_before = app.container_id(R1).expect("r1 runs");
    let r2_before = app.container_id(R2).expect("r2 runs");
    let mut plan = TestApp::plan("v0.0.452");
    plan["env"] = json!({"GLM53_R2_HICACHE_RAM_BUDGET": "406GiB"});
    plan["require_logs"] = json!(["rank_budget_bytes=108984795136"]);
    let id = app.start_canary(&plan).await;
    let r = app.wait_terminal(&id).await;

    assert_eq!(r.status, "succeeded", "{r:#?}");
    assert!(
        r.steps.iter().all(|s| s.status == "succeeded"),
        "{:#?}",
        r.steps
    );
    let kinds: Vec<&str> = r.steps.iter().map(|s| s.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "snapshot",
            "peers_healthy",
            "plan",
            "down",
            "plan",
            "up",
            "verify_neighbours",
            "wait_health",
            "wait_logs",
            "soak"
        ]
    );
    // Every succeeded step carries its kind's one-line summary (the dashboard shows it as is).
    let up = step(&r, "up");
    let lines = up.detail["lines"]
        .as_u64()
        .expect("up counts its stream lines");
    assert_eq!(
        up.summary.as_deref(),
        Some(format!("{lines} stream lines").as_str())
    );
    assert!(
        r.steps.iter().all(|s| s.summary.is_some()),
        "{:#?}",
        r.steps
    );

    // The compose calls with side effects: dry run, scoped down, dry run, up, in that order.
    let calls = app.compose_calls();
    let shape: Vec<(String, bool)> = calls
        .iter()
        .map(|c| (c.path.clone(), is_dry_run(c)))
        .collect();
    assert_eq!(
        shape,
        [
            ("/compose/up".into(), true),
            ("/compose/down".into(), false),
            ("/compose/up".into(), true),
            ("/compose/up".into(), false)
        ]
    );
    let mut expected_env = app.env.clone();
    expected_env.insert("GLM53_R2_HICACHE_RAM_BUDGET".into(), "406GiB".into());
    for call in &calls {
        assert_eq!(
            call.body["services"],
            json!([R2]),
            "scoped to the target: {}",
            call.body
        );
        assert!(
            call.body.get("force_recreate").is_none(),
            "never force_recreate: {}",
            call.body
        );
        assert_eq!(call.body["tag"], "v0.0.452");
        assert_eq!(call.body["file"], FILE);
        let env: std::collections::BTreeMap<String, String> =
            serde_json::from_value(call.body["env"].clone()).expect("env map");
        assert_eq!(
            env, expected_env,
            "the host's full env map merged with the overrides"
        );
    }
    // The snapshot read the host before anything was changed.
    let paths: Vec<String> = app.sim.calls().iter().map(|c| c.path.clone()).collect();
    let first_mutation = paths
        .iter()
        .position(|p| p.starts_with("/compose/"))
        .expect("compose calls");
    assert!(paths[..first_mutation].contains(&"/docker/ps".to_owned()));
    assert!(paths[..first_mutation].contains(&"/version".to_owned()));

    assert_eq!(
        app.container_id(R1).as_deref(),
        Some(r1_before.as_str()),
        "the peer's container is untouched"
    );
    assert_ne!(
        app.container_id(R2).as_deref(),
        Some(r2_before.as_str()),
        "r2 was recreated"
    );

    // Evidence: the plan the gate saw and the log lines with when they were seen.
    // The real server's plan: compose never gets --no-deps, so the exited one-shot
    // dependency is planned as `create` beside the target, and the runbook allows it there.
    assert_eq!(
        step(&r, "plan").detail["plan"]["create"],
        json!(["model-downloader", R2])
    );
    assert_eq!(step(&r, "plan").detail["plan"]["recreate"], json!([]));
    assert_eq!(
        step(&r, "preflight").detail["plan"]["create"],
        json!(["model-downloader"])
    );
    assert_eq!(
        step(&r, "preflight").detail["plan"]["recreate"],
        json!([R2])
    );
    let seen = step(&r, "startup-logs").detail["seen"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        seen.iter().any(|s| s["line"]
            .as_str()
            .is_some_and(|l| l.contains("rank_budget_bytes=108984795136"))),
        "{seen:?}"
    );
    assert!(seen.iter().all(|s| s["first_seen_at"].is_string()));

    let deployments = app
        .api
        .get(&format!("/v1/replicas/{HOST}/{R2}/deployments"))
        .await
        .expect("deployments");
    let newest = &deployments[0];
    assert_eq!(newest["tag"], "v0.0.452");
    assert_eq!(newest["source"], "rollout");
    assert_eq!(
        newest["env_overrides"],
        json!({"GLM53_R2_HICACHE_RAM_BUDGET": "406GiB"})
    );
    assert!(
        newest["commit"].as_str().is_some_and(|c| c.len() == 40),
        "{newest}"
    );
    assert!(
        newest["image"].as_str().is_some_and(|i| i.contains("452")),
        "{newest}"
    );
    assert_eq!(
        deployments[1]["source"], "baseline",
        "the first rollout recorded the host's baseline"
    );
    app.stop().await;
}

/// Runs a canary against a dry run that plans something besides r2 (`named`): the preflight
/// gate refuses it, nothing but dry runs reaches the host, and nothing is rolled back.
async fn assert_gate_refuses(app: TestApp, named: &str) {
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "failed");
    assert_eq!(
        r.error.as_ref().map(|e| e.code.as_str()),
        Some("plan_gate_failed")
    );
    let preflight = step(&r, "preflight");
    assert_eq!(preflight.status, "failed");
    assert!(
        preflight.detail["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains(named),
        "{}",
        preflight.detail
    );
    assert!(
        app.compose_calls().iter().all(is_dry_run),
        "no real up or down: {:?}",
        app.compose_calls()
    );
    assert!(
        r.rolled_back_by.is_none(),
        "nothing was touched, nothing to roll back"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_dry_run_that_plans_an_extra_service_fails_with_no_real_up() {
    let app = TestApp::spawn().await;
    app.sim
        .faults()
        .set_dry_run_extra(Some("proxy-glm53".to_owned()));
    assert_gate_refuses(app, "proxy-glm53").await;
}

#[tokio::test]
async fn a_dry_run_that_plans_a_removal_fails_with_no_real_up() {
    let app = TestApp::spawn().await;
    app.sim
        .faults()
        .set_dry_run_removal(Some("otelcol-contrib".to_owned()));
    assert_gate_refuses(app, "otelcol-contrib").await;
}

async fn failing_canary(app: &TestApp) -> canaryd::api::RolloutOut {
    let mut plan = TestApp::plan("v0.0.452");
    plan["on_failure"] = json!("halt");
    let id = app.start_canary(&plan).await;
    app.wait_terminal(&id).await
}

#[tokio::test]
async fn a_forbidden_startup_line_fails_the_canary_at_once() {
    let app = TestApp::spawn().await;
    let faults = app.sim.faults();
    let mut lines: Vec<String> = vec![
        "HiCache startup RAM allocated".into(),
        "CUDA error 801: operation not supported".into(),
    ];
    lines.push("event-loop stall dump armed: path=/tmp/stall threshold_s=5".into());
    faults.set_logs_on_start(R2, Some(lines));
    let r = failing_canary(&app).await;
    assert_eq!(r.status, "failed");
    let logs = step(&r, "startup-logs");
    assert_eq!(
        logs.detail["error"]["code"], "forbidden_log_line",
        "{}",
        logs.detail
    );
    assert!(logs.detail["forbidden"]["line"]
        .as_str()
        .unwrap_or("")
        .contains("CUDA error 801"));
    // At once, on the line: a timeout would have failed `logs_timeout` (asserted above).
    assert_eq!(step(&r, "soak").status, "skipped");
    app.stop().await;
}

#[tokio::test]
async fn a_required_line_that_never_appears_times_out_naming_it() {
    let app = TestApp::spawn().await;
    app.sim
        .faults()
        .set_logs_on_start(R2, Some(vec!["HiCache startup RAM allocated".into()]));
    let r = failing_canary(&app).await;
    assert_eq!(r.status, "failed", "{r:#?}");
    assert_eq!(
        r.error.as_ref().map(|e| e.code.as_str()),
        Some("logs_timeout")
    );
    let logs = step(&r, "startup-logs");
    assert_eq!(logs.status, "failed");
    assert_eq!(
        logs.detail["error"]["code"], "logs_timeout",
        "{}",
        logs.detail
    );
    assert!(logs.detail["error"]["message"]
        .as_str()
        .unwrap_or("")
        .contains("event-loop stall dump armed"));
    assert_eq!(
        logs.detail["missing"],
        json!(["event-loop stall dump armed"])
    );
    app.stop().await;
}

#[tokio::test]
async fn health_that_never_comes_fails_the_canary() {
    let app = TestApp::spawn().await;
    app.sim.faults().set_health_never(R2, true);
    let r = failing_canary(&app).await;
    assert_eq!(r.status, "failed", "{r:#?}");
    assert_eq!(
        r.error.as_ref().map(|e| e.code.as_str()),
        Some("health_timeout")
    );
    let health = step(&r, "health");
    assert_eq!(health.status, "failed");
    assert_eq!(health.detail["error"]["code"], "health_timeout");
    assert!(health.detail["unhealthy_samples"].as_u64().unwrap_or(0) > 0);
    assert_eq!(health.detail["healthy_samples"], 0);
    app.stop().await;
}

#[tokio::test]
async fn a_busy_host_is_retried_inside_the_step_timeout() {
    let app = TestApp::spawn().await;
    app.sim.faults().busy_for(Duration::from_millis(700));
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let preflight = step(&r, "preflight");
    assert!(preflight.status == "succeeded");
    let attempts = app.engine.store().attempts(&id).await.expect("attempts");
    let busy = attempts
        .iter()
        .filter(|a| a.outcome == Some(canaryd::domain::state::AttemptOutcome::Busy))
        .count();
    assert!(
        busy >= 1,
        "409s were recorded as attempts and retried: {attempts:#?}"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_stream_cut_before_done_is_never_resent() {
    let app = TestApp::spawn().await;
    app.sim.faults().cut_stream(Some(SimOp::Up));
    let r = failing_canary(&app).await;
    assert_eq!(r.status, "failed");
    let up = step(&r, "up");
    assert_eq!(
        up.detail["error"]["code"], "compose_outcome_unknown",
        "{}",
        up.detail
    );
    assert_eq!(up.detail["host_idle"], true);
    let real_ups = app
        .compose_calls()
        .iter()
        .filter(|c| c.path == "/compose/up" && !is_dry_run(c))
        .count();
    assert_eq!(real_ups, 1, "the up was sent once and never again");
    app.stop().await;
}

#[tokio::test]
async fn an_older_compose_manager_fails_before_any_dry_run_is_sent() {
    let mut cfg = crate::helpers::sim_config();
    cfg.legacy = true;
    let app = TestApp::spawn_with(cfg).await;
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "failed");
    assert_eq!(
        r.error.as_ref().map(|e| e.code.as_str()),
        Some("compose_manager_unsupported")
    );
    assert!(
        app.compose_calls().is_empty(),
        "no compose call at all: {:?}",
        app.compose_calls()
    );
    assert!(
        app.sim.calls().iter().any(|c| c.path == "/docker/evict"),
        "the probe was sent"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_second_plan_for_a_busy_host_is_refused_naming_the_active_rollout() {
    let app = TestApp::spawn().await;
    app.sim.faults().set_health_never(R2, true);
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let mut other = TestApp::plan("v0.0.451");
    other["service"] = json!(R1);
    let (status, body) = app.post_plan(&other).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "host_busy");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap_or("")
        .contains(&id));
    let (status, _) = app
        .post(
            &format!("/v1/rollouts/{id}/abort"),
            &json!({"reason": "test over"}),
        )
        .await;
    assert_eq!(status, 200);
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "aborted");
    app.stop().await;
}

#[tokio::test]
async fn every_bad_plan_is_refused_with_nothing_stored_and_no_compose_call() {
    let app = TestApp::spawn().await;
    let base = TestApp::plan("v0.0.452");
    let with = |k: &str, v: Value| {
        let mut p = base.clone();
        p[k] = v;
        p
    };
    let without = |k: &str| {
        let mut p = base.clone();
        p.as_object_mut().map(|o| o.remove(k));
        p
    };
    let cases: Vec<(&str, Value, &str)> = vec![
        ("unknown host", with("host", json!("gpu99")), "unknown_host"),
        (
            "unknown service",
            with("service", json!("model-sg-other-r9")),
            "unknown_service",
        ),
        (
            "not a replica",
            with("service", json!("proxy-glm53")),
            "unknown_service",
        ),
        (
            "empty service",
            with("service", json!("")),
            "invalid_service",
        ),
        (
            "whitespace service",
            with("service", json!("   ")),
            "invalid_service",
        ),
        (
            "list service",
            with("service", json!([R1, R2])),
            "invalid_service",
        ),
        (
            "absolute file",
            with("file", json!("/etc/passwd")),
            "invalid_file",
        ),
        (
            "file outside prod",
            with("file", json!("dev/x.yaml")),
            "invalid_file",
        ),
        (
            "dotdot file",
            with("file", json!("prod/../x.yaml")),
            "invalid_file",
        ),
        ("empty tag", with("tag", json!("")), "invalid_tag"),
        ("bad tag", with("tag", json!("v1;rm -rf")), "invalid_tag"),
        (
            "bad env key",
            with("env", json!({"1BAD": "x"})),
            "invalid_env",
        ),
        (
            "env newline",
            with("env", json!({"GOOD": "a\nb"})),
            "invalid_env",
        ),
        (
            "unknown runbook",
            with("runbook", json!("yolo")),
            "unknown_runbook",
        ),
        ("missing reason", without("reason"), "missing_reason"),
        (
            "unknown field",
            with("force_recreate", json!(true)),
            "unknown_field",
        ),
    ];
    for (what, plan, code) in cases {
        let (status, body) = app.post_plan(&plan).await;
        assert!(
            status == 400 || status == 422,
            "{what}: status {status} {body}"
        );
        assert_eq!(body["error"]["code"], code, "{what}: {body}");
        assert!(
            !body["error"]["message"].as_str().unwrap_or("").is_empty(),
            "{what}: a message"
        );
    }
    let big = with("reason", json!("x".repeat(70 * 1024)));
    let (status, body) = app.post_plan(&big).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], "body_too_large");

    let list = app.api.get("/v1/rollouts").await.expect("list");
    assert_eq!(list["items"], json!([]), "nothing stored");
    assert!(app.compose_calls().is_empty(), "no compose call");
    app.stop().await;
}

#[tokio::test]
async fn a_yaml_plan_is_accepted_like_json() {
    let app = TestApp::spawn().await;
    let yaml =
        format!("host: {HOST}\nfile: {FILE}\nservice: {R2}\ntag: v0.0.452\nreason: yaml plan\n");
    let out = app
        .api
        .post_raw("/v1/rollouts", "application/yaml", yaml)
        .await
        .expect("accepted");
    let id = out["id"].as_str().expect("id").to_owned();
    assert_eq!(
        out["status"]
            .as_str()
            .map(|s| s == "pending" || s == "running"),
        Some(true)
    );
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded");
    app.stop().await;
}

#[tokio::test]
async fn a_replica_without_a_peer_in_its_group_is_never_taken_down() {
    let opts = crate::helpers::TestOptions {
        groups: vec![(R2.to_owned(), "glm53-alone".to_owned())],
        ..Default::default()
    };
    let app = TestApp::spawn_custom(crate::helpers::sim_config(), opts).await;
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "failed");
    assert_eq!(
        r.error.as_ref().map(|e| e.code.as_str()),
        Some("no_peers"),
        "{r:#?}"
    );
    assert!(
        app.compose_calls().is_empty(),
        "nothing was sent: {:?}",
        app.compose_calls()
    );
    app.stop().await;
}

/// A step that fails after the target was touched keeps the target's last log lines as
/// evidence ("keep the candidate's logs"); one that fails before keeps none.
#[tokio::test]
async fn a_step_failing_after_the_target_was_touched_keeps_its_last_log_lines() {
    let app = TestApp::spawn().await;
    app.sim.faults().set_health_never(R2, true);
    let mut plan = TestApp::plan("v0.0.452");
    plan["on_failure"] = json!("halt");
    let id = app.start_canary(&plan).await;
    let canary = app.wait_terminal(&id).await;
    let health = canary
        .steps
        .iter()
        .find(|s| s.name == "health")
        .expect("health step");
    assert_eq!(health.status, "failed", "{canary:#?}");
    let lines = health.detail["target_logs"]
        .as_array()
        .unwrap_or_else(|| panic!("no target_logs: {:#}", health.detail));
    assert!(
        lines.iter().any(|l| l
            .as_str()
            .is_some_and(|l| l.contains("event-loop stall dump armed"))),
        "the engine's startup lines are kept: {lines:?}"
    );
    app.stop().await;

    let app = TestApp::spawn().await;
    app.sim.faults().set_health_never(R1, true);
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let canary = app.wait_terminal(&id).await;
    let peers = canary
        .steps
        .iter()
        .find(|s| s.name == "peers")
        .expect("peers");
    assert_eq!(peers.status, "failed");
    assert!(
        peers.detail.get("target_logs").is_none(),
        "nothing was touched"
    );
    app.stop().await;
}
