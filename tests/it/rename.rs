//! Renamed replicas (docs/reference.md#renamed-replicas): the simulated host serving a compose
//! file per tag (the real long-context file, r2 renamed between tags), a canary that renames
//! r2, its one-click rollback, the shipped `long-context-rollout` runbook end to end, a failing
//! perception check, and the refusals of a bad `replaces`.

use std::collections::BTreeMap;
use std::time::Duration;

use canaryd::compose::{ClientOptions, ComposeClient, ComposeRequest, Services};
use canaryd_sim::{
    SimConfig, SimHost, EXAMPLE_FILE, LONG_CONTEXT_NEW_R2 as NEW, LONG_CONTEXT_OLD_R2 as OLD,
    LONG_CONTEXT_R1 as R1,
};

const DOWNLOADER: &str = "model-downloader";

fn long_context() -> SimConfig {
    let mut cfg = SimConfig::long_context();
    cfg.cold_start = Duration::from_millis(300);
    cfg.stream_line_delay = Duration::from_millis(1);
    cfg
}

fn request(env: &BTreeMap<String, String>, tag: &str, service: &str) -> ComposeRequest {
    ComposeRequest {
        tag: tag.parse().expect("a valid name"),
        file: EXAMPLE_FILE.parse().expect("a valid name"),
        services: Services::one(service.parse().expect("a valid name")),
        env: env.clone(),
        force_recreate: None,
    }
}

fn running(sim: &SimHost) -> Vec<String> {
    sim.containers()
        .into_iter()
        .filter(|c| c.state == "running")
        .map(|c| c.service)
        .collect()
}

#[tokio::test]
async fn the_long_context_host_serves_each_tag_its_own_file_so_a_tag_renames_r2() {
    let cfg = long_context();
    let env = cfg.initial_env.clone();
    let sim = SimHost::start(cfg)
        .await
        .expect("the simulated host starts");
    let client =
        ComposeClient::new(&sim.url(), sim.token(), ClientOptions::default()).expect("client");
    // v0.0.451 deployed: every default service of the old file, none of the profiles.
    let up = running(&sim);
    for service in [
        R1,
        OLD,
        "model-sg-glm53-w4afp8-tp2-r2a",
        "model-sg-glm53-w4afp8-tp2-r2b",
        "proxy-glm53",
        "nginx",
        "model-proxy-registrar",
        "dcgm-glm53",
        "otelcol-contrib",
    ] {
        assert!(up.contains(&service.to_string()), "{service} runs: {up:?}");
    }
    for absent in [
        NEW,
        "glm53-perception-check",
        "glm53-soak-relay",
        "hf-cleanup",
    ] {
        assert!(
            sim.containers().iter().all(|c| c.service != absent),
            "{absent}"
        );
    }
    let old_health = sim.health_url(OLD).expect("old r2 has a port");
    assert_eq!(
        Some(old_health.clone()),
        sim.health_url(NEW),
        "a renamed replica keeps its host port"
    );
    assert_eq!(
        reqwest::get(&old_health).await.expect("health").status(),
        200
    );

    // The new tag's file does not define the old name: compose sees it as an orphan.
    let dry = client
        .dry_run(&request(&env, "v0.0.452", NEW))
        .await
        .expect("dry run");
    let plan = dry.plan.expect("plan");
    assert_eq!(plan.create, [DOWNLOADER, NEW], "{plan:?}");
    assert_eq!(plan.remove, [OLD], "{plan:?}");
    assert!(plan.recreate.is_empty(), "{plan:?}");
    // That dry run wrote the new file to disk: a down of the old name now fails…
    let down = client
        .down(&request(&env, "v0.0.451", OLD))
        .await
        .expect("down");
    assert!(!down.succeeded(), "no such service in the file on disk");
    assert!(
        up.iter().all(|s| running(&sim).contains(s)),
        "nothing was stopped"
    );
    // …until a dry run at the old tag puts the old file back (read-only: it plans nothing).
    let dry = client
        .dry_run(&request(&env, "v0.0.451", OLD))
        .await
        .expect("dry run");
    let plan = dry.plan.expect("plan");
    assert!(
        plan.recreate.is_empty() && plan.remove.is_empty(),
        "{plan:?}"
    );
    assert_eq!(plan.unchanged, [OLD], "{plan:?}");
    let down = client
        .down(&request(&env, "v0.0.451", OLD))
        .await
        .expect("down");
    assert!(down.succeeded(), "{down:?}");
    assert!(sim.containers().iter().all(|c| c.service != OLD));
    let up = client
        .up(&request(&env, "v0.0.452", NEW))
        .await
        .expect("up");
    assert!(up.succeeded(), "{up:?}");
    let new = sim
        .containers()
        .into_iter()
        .find(|c| c.service == NEW)
        .expect("new r2");
    assert_eq!(new.tag, "v0.0.452");
    sim.shutdown().await;
}

// ---- canaryd against the long-context host ---------------------------------------------

use canaryd::domain::runbook::{self, Runbook};
use canaryd_sim::RecordedCall;
use serde_json::{json, Value};

use crate::helpers::{fast_runbooks, is_dry_run, TestApp, TestOptions, HOST};

const CHECK: &str = "glm53-perception-check";
const RELAY: &str = "glm53-soak-relay";
const PROXY: &str = "proxy-glm53";
const DCGM: &str = "dcgm-glm53";
const OTEL: &str = "otelcol-contrib";

/// A shipped runbook with test timings: waits of seconds, polls of 50 ms, a 300 ms soak, and
/// its analysis judged over 2 s after a 500 ms warm-up, on 30 requests (the sim's traffic
/// gives that in 2 s; the shipped 50-request windows need minutes).
fn fast_shipped(name: &str) -> Runbook {
    let path = format!("{}/runbooks/{name}.yaml", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("shipped runbook");
    let mut doc: serde_yaml::Value = serde_yaml::from_str(&text).expect("yaml");
    let steps = doc["steps"].as_sequence_mut().expect("steps");
    for step in steps.iter_mut() {
        let map = step.as_mapping_mut().expect("step is a mapping");
        if map.get("kind").and_then(|k| k.as_str()) == Some("analyze") {
            for (key, value) in [
                ("warmup", "500ms"),
                ("duration", "2s"),
                ("interval", "250ms"),
            ] {
                map.insert(key.into(), value.into());
            }
            let checks = map.get_mut("checks").and_then(|c| c.as_sequence_mut());
            for check in checks.expect("an analysis has checks") {
                let check = check.as_mapping_mut().expect("check is a mapping");
                if check.contains_key("min_requests") {
                    check.insert("min_requests".into(), 30.into());
                }
            }
            continue;
        }
        for (key, value) in [
            ("timeout", "5s"),
            ("interval", "50ms"),
            ("duration", "300ms"),
        ] {
            if map.contains_key(key) {
                map.insert(key.into(), value.into());
            }
        }
        if map.contains_key("consecutive") {
            map.insert("consecutive".into(), 2.into());
        }
    }
    let fast = serde_yaml::to_string(&doc).expect("yaml");
    runbook::parse(name, &path, &fast).unwrap_or_else(|e| panic!("{e}"))
}

fn runbooks() -> BTreeMap<String, Runbook> {
    let mut books = fast_runbooks();
    for name in ["long-context-rollout", "long-context-rollback"] {
        books.insert(name.to_owned(), fast_shipped(name));
    }
    books
}

/// The daemon over the long-context host, r2's slot configured under its new name with the
/// old one as a former name.
async fn app() -> TestApp {
    let opts = TestOptions {
        runbooks: Some(runbooks()),
        aliases: vec![(NEW.to_owned(), vec![OLD.to_owned()])],
        ..TestOptions::default()
    };
    TestApp::spawn_custom(long_context(), opts).await
}

fn plan(runbook: &str) -> Value {
    json!({"host": HOST, "file": EXAMPLE_FILE, "service": NEW, "tag": "v0.0.452",
           "reason": "w4afp8 on r2", "runbook": runbook, "replaces": {"service": OLD}})
}

fn services(call: &RecordedCall) -> Vec<String> {
    serde_json::from_value(call.body["services"].clone()).expect("services is a list")
}

/// (path, dry run, tag, services) of each compose call.
fn shape(calls: &[RecordedCall]) -> Vec<(String, bool, String, Vec<String>)> {
    calls
        .iter()
        .map(|c| {
            (
                c.path.clone(),
                is_dry_run(c),
                c.body["tag"].as_str().unwrap_or_default().to_owned(),
                services(c),
            )
        })
        .collect()
}

fn call(path: &str, dry: bool, tag: &str, names: &[&str]) -> (String, bool, String, Vec<String>) {
    (
        path.to_owned(),
        dry,
        tag.to_owned(),
        names.iter().map(|s| s.to_string()).collect(),
    )
}

/// Safety rules 1–3 and 15 (docs/safety.md) over every call: an explicit non-empty list; a
/// replica name (either of r2's, r1, r2a/r2b) only ever alone; `force_recreate` only on the
/// collector; the host's full env; the one file.
fn assert_safe(app: &TestApp, calls: &[RecordedCall]) {
    let replicas = [
        R1,
        NEW,
        OLD,
        "model-sg-glm53-w4afp8-tp2-r2a",
        "model-sg-glm53-w4afp8-tp2-r2b",
    ];
    for call in calls {
        let names = services(call);
        assert!(!names.is_empty(), "never unscoped: {}", call.body);
        if names.iter().any(|n| replicas.contains(&n.as_str())) {
            assert_eq!(names.len(), 1, "a replica only ever alone: {}", call.body);
            assert!(
                names == [NEW] || names == [OLD],
                "only r2, under one of its names: {}",
                call.body
            );
        }
        if call.body.get("force_recreate") == Some(&json!(true)) {
            assert_eq!(names, [OTEL], "force_recreate only on the collector");
        }
        assert_eq!(call.body["file"], EXAMPLE_FILE);
        let env: BTreeMap<String, String> =
            serde_json::from_value(call.body["env"].clone()).expect("env map");
        assert_eq!(env, app.env, "the host's full env map");
    }
}

/// Container ids of every service but r2's two names (and the verification services, which a
/// long-context rollout brings up and takes down).
fn others(app: &TestApp) -> BTreeMap<String, String> {
    app.sim
        .containers()
        .into_iter()
        .filter(|c| ![NEW, OLD, CHECK, RELAY].contains(&c.service.as_str()))
        .map(|c| (c.service, c.id))
        .collect()
}

fn container(app: &TestApp, service: &str) -> Option<canaryd_sim::SimContainer> {
    app.sim
        .containers()
        .into_iter()
        .find(|c| c.service == service)
}

async fn get(app: &TestApp, path: &str) -> Value {
    reqwest::get(format!("{}{path}", app.url))
        .await
        .expect("daemon answers")
        .json()
        .await
        .expect("json")
}

#[tokio::test]
async fn a_renamed_canary_downs_the_old_name_on_its_own_tag_and_ups_the_new_one_and_its_rollback_reverses_it(
) {
    let app = app().await;
    let before = others(&app);
    let id = app.start_canary(&plan("single-replica-canary")).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    assert_eq!(r.service, NEW, "the rollout belongs to the slot");
    assert_eq!(r.replaces.as_ref().map(|x| x.service.as_str()), Some(OLD));
    let calls = app.compose_calls();
    assert_eq!(
        shape(&calls),
        [
            // The gate before the down: create [new] and the old name as an orphan.
            call("/compose/up", true, "v0.0.452", &[NEW]),
            // The old file back on disk (read-only), then the old name down on its tag.
            call("/compose/up", true, "v0.0.451", &[OLD]),
            call("/compose/down", false, "v0.0.451", &[OLD]),
            // The gate proper, then the identical payload for real.
            call("/compose/up", true, "v0.0.452", &[NEW]),
            call("/compose/up", false, "v0.0.452", &[NEW]),
        ]
    );
    assert_safe(&app, &calls);
    let preflight = r
        .steps
        .iter()
        .find(|s| s.name == "preflight")
        .expect("step");
    assert_eq!(
        preflight.detail["plan"]["remove"],
        json!([OLD]),
        "{:#?}",
        preflight.detail
    );
    let gate = r.steps.iter().find(|s| s.name == "plan").expect("step");
    assert_eq!(
        gate.detail["plan"]["create"],
        json!(["model-downloader", NEW])
    );
    assert_eq!(gate.detail["plan"]["remove"], json!([]));
    let down = r.steps.iter().find(|s| s.name == "down").expect("step");
    assert_eq!(
        down.detail["replaces"],
        json!({"service": OLD, "file": EXAMPLE_FILE, "tag": "v0.0.451"}),
        "file and tag defaulted to the old name's baseline"
    );
    assert!(container(&app, OLD).is_none(), "the old name is gone");
    let new = container(&app, NEW).expect("the new name runs");
    assert_eq!(
        (new.state.as_str(), new.tag.as_str()),
        ("running", "v0.0.452")
    );
    assert_eq!(others(&app), before, "no other container changed");
    // History follows the slot and shows both names.
    let history = get(&app, &format!("/v1/replicas/{HOST}/{NEW}/deployments")).await;
    let rows: Vec<(Value, Value, Value)> = history
        .as_array()
        .expect("list")
        .iter()
        .map(|d| {
            (
                d["deployed_as"].clone(),
                d["tag"].clone(),
                d["source"].clone(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (Value::Null, json!("v0.0.452"), json!("rollout")),
            (json!(OLD), json!("v0.0.451"), json!("baseline")),
        ]
    );
    let by_alias = get(&app, &format!("/v1/replicas/{HOST}/{OLD}/deployments")).await;
    assert_eq!(
        by_alias, history,
        "the former name reads the slot's history"
    );

    // One-click rollback: the new name down, the old name back on its old file and tag.
    let before = others(&app);
    let n = app.compose_calls().len();
    let (status, body) = app
        .post(
            "/v1/rollbacks",
            &json!({"host": HOST, "service": NEW, "reason": "back to fp8"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let rb = app.wait_terminal(body["id"].as_str().expect("id")).await;
    assert_eq!(rb.status, "succeeded", "{rb:#?}");
    assert_eq!(rb.deploy_as.as_deref(), Some(OLD));
    assert_eq!(rb.tag, "v0.0.451");
    let calls = app.compose_calls();
    assert_eq!(
        shape(&calls[n..]),
        [
            call("/compose/up", true, "v0.0.451", &[OLD]),
            call("/compose/up", true, "v0.0.452", &[NEW]),
            call("/compose/down", false, "v0.0.452", &[NEW]),
            call("/compose/up", true, "v0.0.451", &[OLD]),
            call("/compose/up", false, "v0.0.451", &[OLD]),
        ]
    );
    assert_safe(&app, &calls);
    assert!(container(&app, NEW).is_none(), "the new name is gone");
    let old = container(&app, OLD).expect("the old name runs again");
    assert_eq!(
        (old.state.as_str(), old.tag.as_str()),
        ("running", "v0.0.451")
    );
    assert_eq!(others(&app), before, "no other container changed");
    let history = get(&app, &format!("/v1/replicas/{HOST}/{NEW}/deployments")).await;
    assert_eq!(history[0]["deployed_as"], json!(OLD));
    assert_eq!(history[0]["tag"], json!("v0.0.451"));
    app.stop().await;
}

#[tokio::test]
async fn the_long_context_runbook_runs_procedure_a_end_to_end_on_the_sim() {
    let app = app().await;
    let before = others(&app);
    let mut p = plan("long-context-rollout");
    p["require_logs"] = json!(["rank_budget_bytes=108984795136"]);
    let id = app.start_canary(&p).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let calls = app.compose_calls();
    let new = "v0.0.452";
    assert_eq!(
        shape(&calls),
        [
            // The stage: the new name's image pulled while the old name serves.
            call("/compose/up", false, new, &[NEW]),
            call("/compose/up", true, new, &[NEW]),
            call("/compose/up", true, "v0.0.451", &[OLD]),
            call("/compose/down", false, "v0.0.451", &[OLD]),
            call("/compose/up", true, new, &[NEW]),
            call("/compose/up", false, new, &[NEW]),
            call("/compose/up", true, new, &[RELAY]),
            call("/compose/up", false, new, &[RELAY]),
            call("/compose/up", true, new, &[CHECK]),
            call("/compose/up", false, new, &[CHECK]),
            // The reconcile: the proxy's backends name the new engine; DCGM is up to date.
            call("/compose/up", true, new, &[PROXY, DCGM]),
            call("/compose/up", false, new, &[PROXY]),
            call("/compose/up", true, new, &[OTEL]),
            call("/compose/up", false, new, &[OTEL]),
            call("/compose/down", false, new, &[RELAY, CHECK]),
        ]
    );
    let staged: Vec<usize> = (0..calls.len())
        .filter(|i| calls[*i].body["materialize_only"] == json!(true))
        .collect();
    assert_eq!(staged, [0], "the first call, and only it, stages");
    assert_safe(&app, &calls);
    let verdict = r
        .steps
        .iter()
        .find(|s| s.name == "perception")
        .expect("step");
    assert_eq!(verdict.status, "succeeded");
    assert_eq!(
        verdict.detail["service"],
        json!(CHECK),
        "{:#?}",
        verdict.detail
    );
    // The new r2 was judged against its peers on every check, with the numbers kept.
    let analysis = crate::helpers::step(&r, "analysis");
    assert_eq!(analysis.status, "succeeded", "{:#?}", analysis.detail);
    let checks = analysis.detail["checks"].as_array().expect("checks");
    let verdicts: Vec<(&str, &str)> = checks
        .iter()
        .map(|c| {
            (
                c["name"].as_str().expect("name"),
                c["verdict"].as_str().expect("verdict"),
            )
        })
        .collect();
    assert_eq!(
        verdicts,
        [
            ("ttft_p95", "pass"),
            ("itl_p95", "pass"),
            ("took_traffic", "pass")
        ]
    );
    assert!(
        checks[0]["target"]["value"].as_f64().is_some(),
        "{checks:#?}"
    );
    assert!(container(&app, OLD).is_none());
    assert_eq!(
        container(&app, NEW).map(|c| c.state),
        Some("running".into())
    );
    assert!(container(&app, CHECK).is_none() && container(&app, RELAY).is_none());
    // Only the proxy and the collector changed beside r2, as Procedure A step 5 says.
    let after = others(&app);
    let changed: Vec<&String> = before
        .iter()
        .filter(|(s, id)| after.get(*s) != Some(*id))
        .map(|(s, _)| s)
        .collect();
    assert_eq!(changed, [OTEL, PROXY]);
    app.stop().await;
}

#[tokio::test]
async fn a_failing_perception_check_fails_the_rollout_and_the_long_context_rollback_restores_the_old_name(
) {
    let app = app().await;
    let before = others(&app);
    app.sim.faults().set_logs_on_start(
        CHECK,
        Some(vec![
            r#"{"event": "replica", "replica": 2}"#.into(),
            r#"{"event": "qualification_finished", "ok": false}"#.into(),
        ]),
    );
    let id = app.start_canary(&plan("long-context-rollout")).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "failed", "{r:#?}");
    let verdict = r
        .steps
        .iter()
        .find(|s| s.name == "perception")
        .expect("step");
    assert_eq!(verdict.status, "failed", "{:#?}", verdict.detail);
    assert_eq!(
        r.error.as_ref().map(|e| e.code.as_str()),
        Some("forbidden_log_line")
    );
    let rb_id = r.rolled_back_by.clone().expect("rolled back automatically");
    let rb = app.wait_terminal(&rb_id).await;
    assert_eq!(rb.status, "succeeded", "{rb:#?}");
    assert_eq!(rb.runbook, "long-context-rollback");
    assert_eq!(rb.deploy_as.as_deref(), Some(OLD));
    let replaces = rb.replaces.clone().expect("the rename carried back");
    assert_eq!(
        (replaces.service.as_str(), replaces.tag.as_deref()),
        (NEW, Some("v0.0.452"))
    );
    assert!(container(&app, NEW).is_none(), "the new name is gone");
    let old = container(&app, OLD).expect("the old name runs again");
    assert_eq!(
        (old.state.as_str(), old.tag.as_str()),
        ("running", "v0.0.451")
    );
    assert!(
        container(&app, CHECK).is_none() && container(&app, RELAY).is_none(),
        "the rollback took the verification services down"
    );
    let calls = app.compose_calls();
    assert_safe(&app, &calls);
    // The rollback's own calls: the rename back, then the companions on the old tag.
    let start = calls
        .iter()
        .rposition(|c| is_dry_run(c) && services(c) == [OLD] && c.body["tag"] == "v0.0.451")
        .and_then(|last_gate| {
            calls[..last_gate]
                .iter()
                .rposition(|c| is_dry_run(c) && services(c) == [OLD])
        })
        .expect("the rollback's preflight");
    let rollback: Vec<_> = shape(&calls[start..]);
    let old_tag = "v0.0.451";
    assert_eq!(
        rollback,
        [
            call("/compose/up", true, old_tag, &[OLD]),
            call("/compose/up", true, "v0.0.452", &[NEW]),
            call("/compose/down", false, "v0.0.452", &[NEW]),
            call("/compose/up", true, old_tag, &[OLD]),
            call("/compose/up", false, old_tag, &[OLD]),
            // The canary failed before its proxy step: nothing out of date, no real up.
            call("/compose/up", true, old_tag, &[PROXY, DCGM]),
            call("/compose/up", true, old_tag, &[OTEL]),
            call("/compose/up", false, old_tag, &[OTEL]),
            call("/compose/down", false, old_tag, &[RELAY, CHECK]),
        ]
    );
    let after = others(&app);
    let changed: Vec<&String> = before
        .iter()
        .filter(|(s, id)| after.get(*s) != Some(*id))
        .map(|(s, _)| s)
        .collect();
    assert_eq!(
        changed,
        [OTEL],
        "only the collector's recreate, r1 and the rest untouched"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_bad_replaces_is_refused_with_the_field_named_and_nothing_sent() {
    let app = app().await;
    let cases = [
        (
            json!({"service": NEW}),
            "invalid_replaces",
            "replaces.service",
            "the target itself",
        ),
        (
            json!({"service": R1}),
            "invalid_replaces",
            "replaces.service",
            "another replica",
        ),
        (
            json!({"service": "model-x"}),
            "invalid_replaces",
            "replaces.service",
            "not a configured former name",
        ),
        (
            json!({"service": OLD, "tag": "v 1"}),
            "invalid_replaces",
            "replaces.tag",
            "letters",
        ),
        (
            json!({"service": OLD, "extra": true}),
            "invalid_body",
            "replaces",
            "unknown field",
        ),
    ];
    for (replaces, code, field, says) in cases {
        let mut p = plan("single-replica-canary");
        p["replaces"] = replaces.clone();
        let (status, body) = app.post_plan(&p).await;
        let want = if code == "invalid_body" { 400 } else { 422 };
        assert_eq!(status, want, "{replaces}: {body}");
        assert_eq!(body["error"]["code"], code, "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with(field) && message.contains(says),
            "{replaces}: {message}"
        );
    }
    // A runbook without a down of the target would leave the switch to orphan removal.
    let (status, body) = app.post_plan(&plan("recreate-in-place")).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "invalid_replaces");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("orphan")),
        "{body}"
    );
    let listed = get(&app, "/v1/rollouts").await;
    assert_eq!(listed["items"], json!([]), "nothing stored");
    assert!(app.compose_calls().is_empty(), "nothing sent");
    app.stop().await;
}

/// A crash inside a rename's `down` step, at `point`: after the restart the rollout finishes
/// with every call sent once: the read-only dry run again only if it had not gone out, the
/// down never twice.
async fn crash_in_the_rename_down_at(point: &str) {
    let app = app().await;
    let mut pause = app.engine.pause_at(point);
    let id = app.start_canary(&plan("single-replica-canary")).await;
    let frozen = pause.reached(Duration::from_secs(10)).await;
    assert_eq!(frozen.as_deref(), Some(id.as_str()), "reached {point}");
    let app = app.kill().await.restart().await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{point}: {r:#?}");
    assert_eq!(
        shape(&app.compose_calls()),
        [
            call("/compose/up", true, "v0.0.452", &[NEW]),
            call("/compose/up", true, "v0.0.451", &[OLD]),
            call("/compose/down", false, "v0.0.451", &[OLD]),
            call("/compose/up", true, "v0.0.452", &[NEW]),
            call("/compose/up", false, "v0.0.452", &[NEW]),
        ],
        "{point}: nothing sent twice"
    );
    assert!(container(&app, OLD).is_none());
    assert_eq!(
        container(&app, NEW).map(|c| c.state),
        Some("running".into())
    );
    app.stop().await;
}

#[tokio::test]
async fn a_crash_before_the_rename_dry_run_went_out_sends_it_once_after_the_restart() {
    // The down step's first attempt is its read-only dry run: written, not sent.
    crash_in_the_rename_down_at("step:down:attempt_written").await;
}

#[tokio::test]
async fn a_crash_after_the_rename_down_is_reconciled_and_neither_call_is_resent() {
    crash_in_the_rename_down_at("step:down:attempt_done").await;
}

#[tokio::test]
async fn the_doctor_reads_the_logs_of_a_replica_under_the_former_name_it_runs_as() {
    let app = app().await;
    let report = get(&app, &format!("/v1/hosts/{HOST}/doctor")).await;
    let checks = report["checks"].as_array().expect("checks");
    let logs: Vec<(&str, bool)> = checks
        .iter()
        .filter_map(|c| {
            let name = c["name"].as_str()?;
            name.starts_with("compose_logs:")
                .then(|| (name, c["ok"].as_bool().unwrap_or(false)))
        })
        .collect();
    let old = format!("compose_logs:{OLD}");
    let r1 = format!("compose_logs:{R1}");
    assert_eq!(
        logs,
        [(r1.as_str(), true), (old.as_str(), true)],
        "{report:#}"
    );
    app.stop().await;
}
