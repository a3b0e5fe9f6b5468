//! `/metrics` values move as rollouts run.

use serde_json::json;

use crate::helpers::{TestApp, HOST, R2};

async fn scrape(app: &TestApp) -> String {
    let res = reqwest::get(format!("{}/metrics", app.url))
        .await
        .expect("metrics answer");
    assert_eq!(res.status(), 200);
    res.text().await.expect("text")
}

/// The value of the first sample line starting with `prefix` (name plus labels).
fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn metrics_count_rollouts_steps_compose_requests_and_rollback_initiation() {
    let app = TestApp::spawn().await;
    let before = scrape(&app).await;
    assert_eq!(
        sample(&before, "canaryd_active_rollouts"),
        Some(0.0),
        "{before}"
    );
    assert!(
        sample(&before, "canaryd_rollouts_total{").is_none(),
        "no rollout yet"
    );

    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    app.wait_step(&id, "up", "succeeded").await;
    let during = scrape(&app).await;
    assert_eq!(
        sample(&during, "canaryd_active_rollouts"),
        Some(1.0),
        "{during}"
    );
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded");

    let (status, body) = app
        .post(
            "/v1/rollbacks",
            &json!({"host": HOST, "service": R2, "reason": "metrics"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    app.wait_terminal(body["id"].as_str().expect("id")).await;

    // The metrics task follows committed events; give it a bounded moment to catch up.
    let mut after = String::new();
    for _ in 0..50 {
        after = scrape(&app).await;
        if sample(
            &after,
            r#"canaryd_rollouts_total{kind="rollback",outcome="succeeded"}"#,
        ) == Some(1.0)
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        sample(
            &after,
            r#"canaryd_rollouts_total{kind="canary",outcome="succeeded"}"#
        ),
        Some(1.0),
        "{after}"
    );
    assert_eq!(
        sample(
            &after,
            r#"canaryd_rollouts_total{kind="rollback",outcome="succeeded"}"#
        ),
        Some(1.0),
        "{after}"
    );
    assert_eq!(
        sample(
            &after,
            r#"canaryd_rollout_duration_seconds_count{kind="canary",outcome="succeeded"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &after,
            r#"canaryd_step_duration_seconds_count{kind="wait_health",outcome="succeeded"}"#
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(&after, "canaryd_rollback_initiation_seconds_count"),
        Some(1.0),
        "{after}"
    );
    let ups = sample(
        &after,
        r#"canaryd_compose_manager_requests_total{host="gpu02",endpoint="/compose/up",code="200"}"#,
    );
    assert_eq!(
        ups,
        Some(6.0),
        "two dry runs and one up per rollout: {after}"
    );
    assert_eq!(sample(&after, "canaryd_active_rollouts"), Some(0.0));
    app.stop().await;
}
