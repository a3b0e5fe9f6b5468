//! Companion steps end to end against the simulated host (docs/reference.md#companion-services): `plan`/`up`/`down`
//! with `services: [...]`, the reconcile (`only_out_of_date`), `force_recreate` of the
//! collector, and safety rule 15 restated over every call they make.

use std::collections::BTreeMap;

use canaryd::domain::runbook::{self, Runbook};
use serde_json::{json, Value};

use crate::helpers::step;
use crate::helpers::{
    fast_runbooks, is_dry_run, sim_config, TestApp, TestOptions, FAST_CANARY, FILE, R1, R2,
};

const CHECK: &str = "glm53-perception-check";
const OTEL: &str = "otelcol-contrib";
const PROXY: &str = "proxy-glm53";
const NGINX: &str = "nginx";

/// The canary, then the companions around the new engine: the perception check up, the
/// reconcile of the proxy pool, the collector force-recreated, the check taken down.
const COMPANIONS: &str = r#"
  - {name: plan-check, kind: plan, services: [glm53-perception-check]}
  - {name: up-check, kind: up, services: [glm53-perception-check], timeout: 5s}
  - {name: plan-infra, kind: plan, services: [nginx, proxy-glm53], only_out_of_date: true}
  - {name: up-infra, kind: up, services: [nginx, proxy-glm53], only_out_of_date: true, timeout: 5s}
  - {name: plan-otel, kind: plan, services: [otelcol-contrib], force_recreate: true}
  - {name: up-otel, kind: up, services: [otelcol-contrib], force_recreate: true, timeout: 5s}
  - {name: down-check, kind: down, services: [glm53-perception-check], timeout: 5s}
"#;

fn runbooks_with(name: &str, extra: &str) -> BTreeMap<String, Runbook> {
    let text = format!(
        "{}\n{}",
        FAST_CANARY.trim_end(),
        extra.trim_start_matches('\n')
    );
    let mut books = fast_runbooks();
    let rb = runbook::parse(name, name, &text).expect("companion runbook parses");
    books.insert(name.to_owned(), rb);
    books
}

fn services(call: &canaryd_sim::RecordedCall) -> Vec<String> {
    serde_json::from_value(call.body["services"].clone()).expect("services is a list")
}

/// Safety rules 1–3 with rule 15 (docs/safety.md): every call carries an explicit non-empty list, the target
/// alone or companions that are never a replica; `force_recreate` only on the allowed
/// collector; the host's full env; the plan's tag and file.
fn assert_safe(app: &TestApp, calls: &[canaryd_sim::RecordedCall]) {
    for call in calls {
        let names = services(call);
        assert!(!names.is_empty(), "never unscoped: {}", call.body);
        let target_alone = names == [R2];
        assert!(
            target_alone || !names.iter().any(|n| n == R1 || n == R2),
            "a replica only ever as the target alone: {}",
            call.body
        );
        if call.body.get("force_recreate").is_some() {
            assert_eq!(call.body["force_recreate"], json!(true));
            assert_eq!(names, [OTEL], "force_recreate only on the collector");
            assert_eq!(call.path, "/compose/up");
        }
        assert_eq!(call.body["tag"], "v0.0.452");
        assert_eq!(call.body["file"], FILE);
        let env: BTreeMap<String, String> =
            serde_json::from_value(call.body["env"].clone()).expect("env map");
        assert_eq!(env, app.env, "the host's full env map");
    }
}

#[tokio::test]
async fn companion_steps_call_exactly_their_services_and_a_reconcile_with_nothing_out_of_date_sends_no_up(
) {
    let opts = TestOptions {
        runbooks: Some(runbooks_with("companions", COMPANIONS)),
        ..TestOptions::default()
    };
    let app = TestApp::spawn_custom(sim_config(), opts).await;
    let before: BTreeMap<&str, Option<String>> = [R1, NGINX, PROXY, OTEL]
        .into_iter()
        .map(|s| (s, app.container_id(s)))
        .collect();
    assert!(before.values().all(Option::is_some), "{before:?}");
    let mut plan = TestApp::plan("v0.0.452");
    plan["runbook"] = json!("companions");
    let id = app.start_canary(&plan).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");

    let calls = app.compose_calls();
    let shape: Vec<(&str, bool, Vec<String>)> = calls
        .iter()
        .map(|c| (c.path.as_str(), is_dry_run(c), services(c)))
        .collect();
    let list = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        shape,
        [
            ("/compose/up", true, list(&[R2])),
            ("/compose/down", false, list(&[R2])),
            ("/compose/up", true, list(&[R2])),
            ("/compose/up", false, list(&[R2])),
            ("/compose/up", true, list(&[CHECK])),
            ("/compose/up", false, list(&[CHECK])),
            // The reconcile: a dry run, and no real up (nothing is out of date).
            ("/compose/up", true, list(&[NGINX, PROXY])),
            ("/compose/up", true, list(&[OTEL])),
            ("/compose/up", false, list(&[OTEL])),
            ("/compose/down", false, list(&[CHECK])),
        ]
    );
    assert_safe(&app, &calls);
    let forced: Vec<bool> = calls
        .iter()
        .map(|c| c.body.get("force_recreate") == Some(&json!(true)))
        .collect();
    assert_eq!(
        forced,
        [false, false, false, false, false, false, false, true, true, false],
        "the collector's dry run carries the same force_recreate as its up"
    );
    let infra = step(&r, "up-infra");
    assert_eq!(infra.status, "succeeded");
    assert_eq!(infra.detail["skipped"], json!(true), "{:#?}", infra.detail);
    assert_eq!(step(&r, "plan-infra").detail["apply"], json!([]));
    assert_eq!(
        step(&r, "up-otel").detail["services"],
        json!([OTEL]),
        "a companion call's evidence names its services"
    );
    // Only the collector was recreated; r1, nginx and the proxy kept their containers.
    for service in [R1, NGINX, PROXY] {
        assert_eq!(app.container_id(service), before[service], "{service}");
    }
    assert_ne!(
        app.container_id(OTEL),
        before[OTEL],
        "the collector recreated"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_reconcile_applies_only_the_services_its_dry_run_plans_out_of_date() {
    let mut cfg = sim_config();
    for tag in &mut cfg.tags {
        if tag.name == "v0.0.452" {
            tag.images
                .insert(PROXY.to_owned(), "nearaidev/vllm-proxy-rs:next".to_owned());
        }
    }
    let extra = r#"
  - {name: plan-infra, kind: plan, services: [nginx, proxy-glm53], only_out_of_date: true}
  - {name: up-infra, kind: up, services: [nginx, proxy-glm53], only_out_of_date: true, timeout: 5s}
"#;
    let opts = TestOptions {
        runbooks: Some(runbooks_with("reconcile", extra)),
        ..TestOptions::default()
    };
    let app = TestApp::spawn_custom(cfg, opts).await;
    let nginx = app.container_id(NGINX);
    let proxy = app.container_id(PROXY);
    let mut plan = TestApp::plan("v0.0.452");
    plan["runbook"] = json!("reconcile");
    let id = app.start_canary(&plan).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let calls = app.compose_calls();
    assert_safe(&app, &calls);
    let tail: Vec<(bool, Vec<String>)> = calls[4..]
        .iter()
        .map(|c| (is_dry_run(c), services(c)))
        .collect();
    assert_eq!(
        tail,
        [
            (true, vec![NGINX.to_owned(), PROXY.to_owned()]),
            (false, vec![PROXY.to_owned()]),
        ],
        "the up carries only what the dry run planned"
    );
    assert_eq!(step(&r, "plan-infra").detail["apply"], json!([PROXY]));
    assert_eq!(app.container_id(NGINX), nginx, "nginx untouched");
    assert_ne!(app.container_id(PROXY), proxy, "the proxy recreated");
    app.stop().await;
}

#[tokio::test]
async fn a_companion_gate_without_only_out_of_date_refuses_a_plan_missing_its_services() {
    let extra = r#"
  - {name: plan-infra, kind: plan, services: [nginx, proxy-glm53]}
  - {name: up-infra, kind: up, services: [nginx, proxy-glm53], timeout: 5s}
"#;
    let opts = TestOptions {
        runbooks: Some(runbooks_with("strict", extra)),
        ..TestOptions::default()
    };
    let app = TestApp::spawn_custom(sim_config(), opts).await;
    let mut plan = TestApp::plan("v0.0.452");
    plan["runbook"] = json!("strict");
    plan["on_failure"] = json!("halt");
    let id = app.start_canary(&plan).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "failed", "{r:#?}");
    let gate = step(&r, "plan-infra");
    assert_eq!(gate.status, "failed");
    let error = r.error.as_ref().expect("the rollout's error");
    assert_eq!(error.code, "plan_gate_failed", "{error:?}");
    let violation = gate.detail["violation"].as_str().unwrap_or_default();
    assert!(
        violation.contains("services_not_planned") && violation.contains("`nginx`, `proxy-glm53`"),
        "{violation}"
    );
    let real_companion_ups = app
        .compose_calls()
        .iter()
        .filter(|c| !is_dry_run(c) && services(c) != [R2])
        .count();
    assert_eq!(real_companion_ups, 0, "nothing sent past a refused gate");
    app.stop().await;
}

#[tokio::test]
async fn a_runbook_whose_companion_names_a_replica_is_refused_through_the_api_with_no_call() {
    for (name, replica) in [("names-peer", R1), ("names-target", R2)] {
        let extra = format!(
            "  - {{name: plan-x, kind: plan, services: [nginx, {replica}]}}\n  - {{name: up-x, kind: up, services: [nginx, {replica}], timeout: 5s}}\n"
        );
        let opts = TestOptions {
            runbooks: Some(runbooks_with(name, &extra)),
            ..TestOptions::default()
        };
        let app = TestApp::spawn_custom(sim_config(), opts).await;
        let mut plan = TestApp::plan("v0.0.452");
        plan["runbook"] = json!(name);
        let (status, body) = app.post_plan(&plan).await;
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["error"]["code"], "companion_is_replica", "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("step 11 \"plan-x\" names `{replica}`")),
            "{message}"
        );
        let listed: Value = app.api.get("/v1/rollouts").await.expect("list");
        assert_eq!(listed["items"], json!([]), "nothing stored: {listed}");
        assert!(app.compose_calls().is_empty(), "no compose call");
        app.stop().await;
    }
}

/// The perception check brought up after the canary and judged from its own logs.
const PERCEPTION: &str = r#"
  - {name: plan-check, kind: plan, services: [glm53-perception-check]}
  - {name: up-check, kind: up, services: [glm53-perception-check], timeout: 5s}
  - name: perception
    kind: wait_logs
    service: glm53-perception-check
    timeout: 3s
    interval: 50ms
    require: ['"event": "qualification_finished", "ok": true']
    forbid: ['"ok": false']
  - {name: down-check, kind: down, services: [glm53-perception-check], timeout: 5s}
"#;

#[tokio::test]
async fn the_perception_check_is_judged_from_its_own_logs() {
    let opts = TestOptions {
        runbooks: Some(runbooks_with("perception", PERCEPTION)),
        ..TestOptions::default()
    };
    let app = TestApp::spawn_custom(sim_config(), opts).await;
    let mut plan = TestApp::plan("v0.0.452");
    plan["runbook"] = json!("perception");
    let id = app.start_canary(&plan).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let verdict = step(&r, "perception");
    assert_eq!(
        verdict.detail["service"],
        json!(CHECK),
        "{:#?}",
        verdict.detail
    );
    let logs: Vec<Value> = app
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.path == "/compose/logs")
        .map(|c| c.body["services"].clone())
        .collect();
    assert!(
        logs.contains(&json!([CHECK])),
        "the check's logs were read: {logs:?}"
    );
    assert_safe(&app, &app.compose_calls());
    app.stop().await;
}

#[tokio::test]
async fn a_failing_perception_check_fails_the_rollout_and_rolls_back() {
    let opts = TestOptions {
        runbooks: Some(runbooks_with("perception", PERCEPTION)),
        ..TestOptions::default()
    };
    let app = TestApp::spawn_custom(sim_config(), opts).await;
    app.sim.faults().set_logs_on_start(
        CHECK,
        Some(vec![
            r#"{"event": "qualification_finished", "ok": false, "failed": "model-sg-glm53-w4afp8-tp4-r2"}"#.to_string(),
        ]),
    );
    let mut plan = TestApp::plan("v0.0.452");
    plan["runbook"] = json!("perception");
    let id = app.start_canary(&plan).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "failed", "{r:#?}");
    assert_eq!(step(&r, "perception").status, "failed");
    let error = r.error.as_ref().expect("error");
    assert_eq!(error.code, "forbidden_log_line", "{error:?}");
    let rollback = r.rolled_back_by.as_deref().expect("rolled back");
    let rb = app.wait_terminal(rollback).await;
    assert_eq!(rb.status, "succeeded", "{rb:#?}");
    app.stop().await;
}

#[tokio::test]
async fn an_abandoned_companion_up_settles_on_the_companion_and_is_never_resent() {
    // Companion steps only: the target is never called, so nothing rolls it back.
    let text = r#"
description: the collector alone
steps:
  - {name: snapshot, kind: snapshot}
  - {name: peers, kind: peers_healthy, timeout: 3s}
  - {name: plan-otel, kind: plan, services: [otelcol-contrib], force_recreate: true}
  - {name: up-otel, kind: up, services: [otelcol-contrib], force_recreate: true, timeout: 5s}
"#;
    let mut books = fast_runbooks();
    let rb = runbook::parse("otel-only", "otel-only", text).expect("parses");
    books.insert("otel-only".to_owned(), rb);
    let opts = TestOptions {
        runbooks: Some(books),
        ..TestOptions::default()
    };
    let app = TestApp::spawn_custom(sim_config(), opts).await;
    // The up's stream ends early; compose goes on: the collector stops 400 ms later and comes
    // back with a new id at 800 ms, while /status reads idle. The settle wait must watch the
    // collector's container, not the target's.
    app.sim
        .faults()
        .abandon_up(std::time::Duration::from_millis(1200));
    let mut plan = TestApp::plan("v0.0.452");
    plan["runbook"] = json!("otel-only");
    let id = app.start_canary(&plan).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "failed", "{r:#?}");
    let error = r.error.as_ref().expect("error");
    assert_eq!(error.code, "compose_outcome_unknown", "{error:?}");
    let up = step(&r, "up-otel");
    assert_eq!(up.detail["target_settled"], true, "{:#}", up.detail);
    assert!(
        up.detail["settle"]["target_changes"].as_u64() >= Some(1),
        "the settle wait saw the companion change: {:#}",
        up.detail
    );
    let real_ups = app
        .compose_calls()
        .iter()
        .filter(|c| c.path == "/compose/up" && !is_dry_run(c))
        .count();
    assert_eq!(real_ups, 1, "sent once, never again");
    assert!(r.rolled_back_by.is_none(), "the replica was never touched");
    assert_safe(&app, &app.compose_calls());
    app.stop().await;
}
