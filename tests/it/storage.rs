//! A full disk in the middle of a `down` (safety rule 18): the down succeeds on the host, the
//! daemon cannot record it. It must say so while it lasts (`/readyz` 503, metrics, the
//! replica shown down, one alert), send nothing more to the host, and when the disk has room
//! again record what it knows and go on, with no restart and nothing resent.
//!
//! The fault is injected where the disk would fill (`Store::inject_storage_fault`: every
//! write fails `SQLITE_FULL` and keeps nothing), at the moment the down is on the wire (the
//! crash matrix's checkpoint `step:down:attempt_written`).

use std::time::Duration;

use canaryd::config::{EngineTuning, NotificationsConfig, Secret, WebhookConfig, WebhookFormat};
use canaryd::domain::notification::NotifyEvent;
use serde_json::Value;
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::helpers::{sim_config, TestApp, TestOptions, R2};

async fn get(app: &TestApp, path: &str) -> (u16, String) {
    let res = reqwest::get(format!("{}{path}", app.url))
        .await
        .expect("daemon answers");
    let status = res.status().as_u16();
    (status, res.text().await.unwrap_or_default())
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} in /metrics:\n{text}"))
}

fn compose_calls(app: &TestApp) -> Vec<(String, bool)> {
    app.sim
        .calls()
        .iter()
        .filter(|c| c.path.starts_with("/compose/") && c.path != "/compose/logs")
        .map(|c| (c.path.clone(), c.body.get("dry_run").is_some()))
        .collect()
}

async fn r2_left_down(app: &TestApp) -> bool {
    let (_, body) = get(app, "/v1/replicas").await;
    let replicas: Vec<Value> = serde_json::from_str(&body).expect("replicas");
    replicas
        .iter()
        .find(|r| r["service"] == R2)
        .map(|r| r["left_down"] == true)
        .expect("r2 listed")
}

#[tokio::test]
async fn a_full_disk_during_a_down_is_told_waited_out_and_recorded_without_resending() {
    let receiver = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&receiver)
        .await;
    let engine = EngineTuning {
        storage_retry_initial: Duration::from_millis(50),
        storage_retry_max: Duration::from_millis(200),
        ..EngineTuning::default()
    };
    let notifications = NotificationsConfig {
        webhooks: vec![WebhookConfig {
            name: "oncall-chat".to_owned(),
            url: Secret::new(format!("{}/hook", receiver.uri())),
            format: WebhookFormat::Json,
            events: [NotifyEvent::Failed].into_iter().collect(),
        }],
        delivery: Default::default(),
    };
    let opts = TestOptions {
        engine: Some(engine),
        notifications: Some(notifications),
        ..TestOptions::default()
    };
    let app = TestApp::spawn_custom(sim_config(), opts).await;
    let store = app.engine.store().clone();
    let mut on_the_wire = app.engine.pause_at("step:down:attempt_written");
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    on_the_wire
        .reached(Duration::from_secs(20))
        .await
        .expect("the down's attempt is written");
    store.inject_storage_fault(true);
    on_the_wire.release();

    // The down ran on the host; its outcome cannot be written.
    let mut waiting = Vec::new();
    for _ in 0..200 {
        waiting = store.health().waiting();
        if waiting.iter().any(|w| w.last_call.is_some()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    let call = waiting[0]
        .last_call
        .clone()
        .expect("the down's outcome is known");
    assert_eq!(
        (call.endpoint.as_str(), call.outcome.as_str()),
        ("compose/down", "succeeded")
    );

    // While it lasts, the daemon says so.
    let (status, body) = get(&app, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("database or disk is full"), "{body}");
    assert!(body.contains("1 rollout(s) wait"), "{body}");
    let (_, metrics) = get(&app, "/metrics").await;
    assert!(metric(&metrics, "canaryd_storage_errors_total") >= 1.0);
    assert_eq!(metric(&metrics, "canaryd_rollouts_waiting_on_storage"), 1.0);
    assert_eq!(metric(&metrics, "canaryd_replicas_down"), 1.0);
    assert!(r2_left_down(&app).await, "r2 is shown down");
    let mut alerts = Vec::new();
    for _ in 0..100 {
        alerts = receiver.received_requests().await.unwrap_or_default();
        if !alerts.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(alerts.len(), 1, "one alert, from memory");
    let alert: Value = serde_json::from_slice(&alerts[0].body).expect("json alert");
    assert_eq!(alert["event"], "storage_failing");
    assert_eq!(alert["rollout_id"], id.as_str());
    assert_eq!(alert["last_call"]["endpoint"], "compose/down");
    assert_eq!(alert["last_call"]["outcome"], "succeeded");
    assert_eq!(alert["replica_down"], true);
    assert!(
        alert["text"]
            .as_str()
            .is_some_and(|t| t.contains("is DOWN")),
        "{alert}"
    );

    // Several retries later: nothing more was sent to the host, the rollout did not move.
    let sent = compose_calls(&app);
    assert_eq!(sent.last(), Some(&("/compose/down".to_owned(), false)));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        compose_calls(&app),
        sent,
        "nothing sent while the disk is full"
    );
    assert_eq!(app.rollout(&id).await.status, "running");
    assert_eq!(
        receiver.received_requests().await.unwrap_or_default().len(),
        1,
        "one alert per rollout, not one per retry"
    );

    // Room again: the task records the down and goes on, without a restart.
    store.inject_storage_fault(false);
    let done = app.wait_terminal(&id).await;
    assert_eq!(done.status, "succeeded", "{done:#?}");
    let real = |path: &str| {
        compose_calls(&app)
            .iter()
            .filter(|(p, dry)| p == path && !dry)
            .count()
    };
    assert_eq!((real("/compose/down"), real("/compose/up")), (1, 1));
    let attempts = store.attempts(&id).await.expect("attempts");
    let down = attempts
        .iter()
        .find(|a| a.endpoint == "compose/down")
        .expect("the down's attempt");
    assert_eq!(
        down.outcome.map(|o| o.as_str()),
        Some("succeeded"),
        "the known outcome is recorded, not reconciled as unknown"
    );
    let (status, body) = get(&app, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert!(!r2_left_down(&app).await);
    let (_, metrics) = get(&app, "/metrics").await;
    assert_eq!(metric(&metrics, "canaryd_rollouts_waiting_on_storage"), 0.0);
}

/// On an idle daemon, one API write that fails on a full disk makes `/readyz` answer 503;
/// once the disk has room again, readiness comes back by itself within seconds, with no
/// other write sent to the daemon.
#[tokio::test]
async fn readiness_comes_back_by_itself_once_the_disk_has_room_with_no_other_write() {
    let app = TestApp::spawn().await;
    let store = app.engine.store().clone();
    store.inject_storage_fault(true);
    let (status, body) = app.post_plan(&TestApp::plan("v0.0.452")).await;
    assert!(status >= 500, "the write fails: {status} {body}");
    let (status, body) = get(&app, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("cannot be written"), "{body}");
    // Still full: the daemon's own probes keep it unready, without counting as errors.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let (status, _) = get(&app, "/readyz").await;
    assert_eq!(status, 503);
    assert_eq!(
        store.health().errors_total(),
        1,
        "probes are not counted as errors"
    );

    store.inject_storage_fault(false);
    let mut ready = false;
    for _ in 0..100 {
        let (status, _) = get(&app, "/readyz").await;
        if status == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "ready again within 10 s of the disk having room");
    let (_, list) = get(&app, "/v1/rollouts").await;
    assert!(
        list.contains("\"items\":[]"),
        "no other write was made: {list}"
    );
    assert!(app.sim.calls().is_empty(), "nothing sent to the host");
}
