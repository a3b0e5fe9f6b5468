//! Low-traffic windows (issue: prepared before the down): a canary whose host's window is
//! closed waits at its `window` step, visibly (the step's evidence, an `approval_requested`
//! event naming the window), sending nothing to the host, until an operator starts it now with
//! a reason (audited); a rollback never waits, even with a `window` step in its runbook.

use std::time::Duration;

use chrono::{Timelike, Utc};
use serde_json::json;

use crate::helpers::{canary_with, sim_config, TestApp, TestOptions, FAST_ROLLBACK, HOST, R2};
use canaryd::domain::runbook;

const SNAPSHOT: &str = "  - {name: snapshot, kind: snapshot}\n";

/// A daily window from `from` to `to` hours after the start of the current UTC hour.
fn hours_from_now(from: u32, to: u32) -> canaryd::domain::window::TrafficWindow {
    let h = Utc::now().hour();
    let yaml = format!(
        "{{start: '{:02}:00', end: '{:02}:00'}}",
        (h + from) % 24,
        (h + to) % 24
    );
    serde_yaml::from_str(&yaml).expect("a window")
}

#[tokio::test]
async fn a_closed_window_holds_a_canary_until_an_operator_starts_it_and_a_rollback_never_waits() {
    let window = format!("  - {{name: window, kind: window, timeout: 1h}}\n{SNAPSHOT}");
    let mut books = canary_with(&[(SNAPSHOT, window.as_str())]);
    let rollback_text = FAST_ROLLBACK.replacen(SNAPSHOT, &window, 1);
    let rollback = runbook::parse("single-replica-rollback", "t", &rollback_text).expect("parses");
    books.insert("single-replica-rollback".to_owned(), rollback);
    let opts = TestOptions {
        runbooks: Some(books),
        windows: vec![hours_from_now(2, 3)],
        ..TestOptions::default()
    };
    let app = TestApp::spawn_custom(sim_config(), opts).await;
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;

    // It waits, visibly, and nothing reaches the host.
    let mut waiting = None;
    for _ in 0..100 {
        let r = app.rollout(&id).await;
        let step = r.steps.iter().find(|s| s.name == "window").cloned();
        if let Some(step) = step.filter(|s| s.detail["awaiting_approval"] == json!(true)) {
            waiting = Some((r, step));
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (r, step) = waiting.expect("the window step waits");
    assert_eq!(
        (r.status.as_str(), step.status.as_str()),
        ("running", "running")
    );
    let opens = step.detail["next_opening"]
        .as_str()
        .expect("the next opening");
    assert!(opens.parse::<chrono::DateTime<Utc>>().expect("a time") > Utc::now());
    assert!(
        step.detail["waiting_for"]
            .as_str()
            .is_some_and(|w| w.contains("low-traffic window")),
        "{step:#?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        app.compose_calls(),
        [],
        "nothing sent while the window is closed"
    );
    assert!(app
        .audit_kinds(&id)
        .await
        .contains(&"approval_requested".to_owned()));

    // The operator starts it now, with a reason.
    let (status, body) = app
        .post(
            &format!("/v1/rollouts/{id}/approve"),
            &json!({"reason": "the fix cannot wait for the night"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let step = r.steps.iter().find(|s| s.name == "window").expect("step");
    assert_eq!(step.detail["reason"], "the fix cannot wait for the night");
    assert!(
        step.summary
            .as_deref()
            .is_some_and(|s| s.contains("started outside the window")),
        "{step:#?}"
    );
    assert!(app.audit_kinds(&id).await.contains(&"approved".to_owned()));
    assert!(!app.compose_calls().is_empty(), "then it ran");

    // A rollback of it, with the same closed window and a window step, does not wait.
    let (status, body) = app
        .post(
            "/v1/rollbacks",
            &json!({"host": HOST, "service": R2, "reason": "regression"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let rb = body["id"].as_str().expect("id").to_owned();
    let r = app.wait_terminal(&rb).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let step = r.steps.iter().find(|s| s.name == "window").expect("step");
    assert!(
        step.detail["skipped"]
            .as_str()
            .is_some_and(|s| s.contains("rollback never waits")),
        "{:#}",
        step.detail
    );
    assert!(!app
        .audit_kinds(&rb)
        .await
        .contains(&"approval_requested".to_owned()));
}

#[tokio::test]
async fn an_open_window_or_none_lets_a_canary_through_at_once() {
    let window = format!("  - {{name: window, kind: window, timeout: 1h}}\n{SNAPSHOT}");
    for windows in [vec![hours_from_now(0, 2)], Vec::new()] {
        let opts = TestOptions {
            runbooks: Some(canary_with(&[(SNAPSHOT, window.as_str())])),
            windows: windows.clone(),
            ..TestOptions::default()
        };
        let app = TestApp::spawn_custom(sim_config(), opts).await;
        let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
        let r = app.wait_terminal(&id).await;
        assert_eq!(r.status, "succeeded", "{windows:?}: {r:#?}");
        let step = r.steps.iter().find(|s| s.name == "window").expect("step");
        assert!(
            step.detail["awaiting_approval"].is_null(),
            "{:#}",
            step.detail
        );
        assert!(!app
            .audit_kinds(&id)
            .await
            .contains(&"approval_requested".to_owned()));
    }
}

#[tokio::test]
async fn a_plans_own_windows_come_before_the_hosts_and_a_bad_one_is_refused() {
    let window = format!("  - {{name: window, kind: window, timeout: 1h}}\n{SNAPSHOT}");
    let opts = TestOptions {
        runbooks: Some(canary_with(&[(SNAPSHOT, window.as_str())])),
        windows: vec![hours_from_now(2, 3)],
        ..TestOptions::default()
    };
    let app = TestApp::spawn_custom(sim_config(), opts).await;
    let open = serde_json::to_value(vec![hours_from_now(0, 2)]).expect("json");
    let mut plan = TestApp::plan("v0.0.452");
    plan["windows"] = open;
    let id = app.start_canary(&plan).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(
        r.status, "succeeded",
        "the plan's open window, not the host's closed one: {r:#?}"
    );
    let step = r.steps.iter().find(|s| s.name == "window").expect("step");
    assert!(step.detail["opened_at"].is_string(), "{:#}", step.detail);

    let mut bad = TestApp::plan("v0.0.452");
    bad["windows"] = json!([{"start": "02:00", "end": "25:00"}]);
    let (status, body) = app.post_plan(&bad).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_body", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("windows[0]: `end`: `25:00`"), "{body}");
}

/// Polls `GET /v1/releases/{id}` until target `position` runs its `window` step; its rollout.
async fn waiting_at_window(app: &TestApp, id: &str, position: usize) -> String {
    for _ in 0..200 {
        let r: serde_json::Value = reqwest::get(format!("{}/v1/releases/{id}", app.url))
            .await
            .expect("answers")
            .json()
            .await
            .expect("json");
        let t = &r["targets"][position];
        if t["current_step"] == "window" {
            return t["rollout_id"].as_str().expect("a rollout").to_owned();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("target {position} of {id} never waited at its window");
}

#[tokio::test]
async fn a_release_waits_for_the_window_before_each_target() {
    let window = format!("  - {{name: window, kind: window, timeout: 1h}}\n{SNAPSHOT}");
    let opts = TestOptions {
        runbooks: Some(canary_with(&[(SNAPSHOT, window.as_str())])),
        windows: vec![hours_from_now(2, 3)],
        ..TestOptions::default()
    };
    let app = TestApp::spawn_custom(sim_config(), opts).await;
    let body = json!({"file": crate::helpers::FILE, "tag": "v0.0.452", "reason": "release in the window",
        "targets": [{"host": HOST, "service": R2}, {"host": HOST, "service": crate::helpers::R1}]});
    let (status, out) = app.post("/v1/releases", &body).await;
    assert_eq!(status, 201, "{out}");
    let id = out["id"].as_str().expect("id").to_owned();
    let start_now = |rollout: String| {
        let app = &app;
        async move {
            let path = format!("/v1/rollouts/{rollout}/approve");
            let (status, body) = app
                .post(&path, &json!({"reason": "on call is watching"}))
                .await;
            assert_eq!(status, 200, "{body}");
        }
    };
    let first = waiting_at_window(&app, &id, 0).await;
    assert_eq!(
        app.compose_calls(),
        [],
        "the first target waits, nothing sent"
    );
    start_now(first).await;
    // The second target waits for its own window, after the first is done.
    let second = waiting_at_window(&app, &id, 1).await;
    let sent_to_r1 = app
        .compose_calls()
        .iter()
        .filter(|c| c.body["services"] == json!([crate::helpers::R1]))
        .count();
    assert_eq!(sent_to_r1, 0, "r1 waits at its window");
    start_now(second).await;
    let mut ended = String::new();
    for _ in 0..200 {
        let r: serde_json::Value = reqwest::get(format!("{}/v1/releases/{id}", app.url))
            .await
            .expect("answers")
            .json()
            .await
            .expect("json");
        ended = r["status"].as_str().unwrap_or_default().to_owned();
        if ended == "succeeded" || ended == "failed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(ended, "succeeded");
}
