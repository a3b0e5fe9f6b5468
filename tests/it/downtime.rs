//! A replica's downtime: from the down sent to it to its first healthy answer after the up,
//! with its parts, in `GET /v1/rollouts/{id}` and the `canaryd_replica_downtime_seconds`
//! histogram (issue: prepared before the down).

use std::time::Duration;

use crate::helpers::{sim_config, TestApp, R2};

/// The count of the downtime histogram of `kind` rollouts that ended `outcome`.
async fn observed(app: &TestApp, kind: &str, outcome: &str) -> Option<f64> {
    let text = reqwest::get(format!("{}/metrics", app.url))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("text");
    let prefix =
        format!("canaryd_replica_downtime_seconds_count{{kind=\"{kind}\",outcome=\"{outcome}\"}}");
    text.lines()
        .find(|l| l.starts_with(&prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn a_canary_shows_how_long_its_replica_was_out_and_its_cold_start_bounds_it_from_below() {
    let mut cfg = sim_config();
    let cold = Duration::from_millis(600);
    cfg.cold_start = cold;
    let app = TestApp::spawn_with(cfg).await;
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");

    let d = r
        .downtime
        .clone()
        .expect("the canary took r2 down: a downtime");
    let call = |name: &str, endpoint: &str| {
        let step = r.steps.iter().find(|s| s.name == name).expect("step");
        step.calls
            .iter()
            .find(|c| c.endpoint == endpoint)
            .cloned()
            .unwrap_or_else(|| panic!("{name} sent {endpoint}"))
    };
    let (down, up) = (call("down", "compose/down"), call("up", "compose/up"));
    assert_eq!(
        d.down_at, down.started_at,
        "it starts when the down is sent"
    );
    let back = d.back_at.expect("r2 answered healthy again");
    let health = r
        .steps
        .iter()
        .find(|s| s.kind == "wait_health")
        .expect("wait_health");
    assert_eq!(
        health.detail["healthy_since"]
            .as_str()
            .map(|t| t.parse().expect("a time")),
        Some(back),
        "it ends at the first healthy answer of the streak that passed wait_health"
    );
    assert!(back <= health.finished_at.expect("ended"), "{d:?}");
    let total = d.total_ms.expect("a total");
    assert_eq!(total, (back - d.down_at).num_milliseconds(), "{d:?}");
    let p = &d.parts;
    let parts = [p.down_ms, p.between_ms, p.up_ms, p.cold_start_ms];
    assert!(
        parts.iter().all(Option::is_some),
        "every part is known: {d:?}"
    );
    assert_eq!(
        parts.iter().flatten().sum::<i64>(),
        total,
        "the parts add up: {d:?}"
    );
    let span = |c: &canaryd::api::CallOut| {
        (c.finished_at.expect("ended") - c.started_at).num_milliseconds()
    };
    assert_eq!(p.down_ms, Some(span(&down)), "{d:?}");
    assert_eq!(p.up_ms, Some(span(&up)), "{d:?}");
    // The engine's cold start is the floor of the cold-start part (the simulated engine is
    // healthy `cold` after its container started, which the up's stream ends with).
    let cold_ms = cold.as_millis() as i64;
    assert!(
        p.cold_start_ms.is_some_and(|c| c + 100 >= cold_ms),
        "cold start {:?} ms, engine's {cold_ms} ms: {d:?}",
        p.cold_start_ms
    );
    assert!(total >= cold_ms, "{d:?}");

    // The histogram counts it once the metrics task caught up (bounded).
    let mut seen = None;
    for _ in 0..50 {
        seen = observed(&app, "canary", "succeeded").await;
        if seen == Some(1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen, Some(1.0), "one canary's downtime observed");

    // Written with the rollout's end: in the history list and its CSV export too.
    assert_eq!(r.downtime_ms, Some(total), "{r:#?}");
    let list: serde_json::Value = reqwest::get(format!("{}/v1/rollouts?service={R2}", app.url))
        .await
        .expect("list answers")
        .json()
        .await
        .expect("json");
    let item = list["items"]
        .as_array()
        .and_then(|items| items.iter().find(|i| i["id"] == id.as_str()))
        .unwrap_or_else(|| panic!("{list:#}"));
    assert_eq!(item["downtime_ms"], total, "{item:#}");
    let csv = reqwest::get(format!("{}/v1/rollouts?format=csv", app.url))
        .await
        .expect("csv answers")
        .text()
        .await
        .expect("text");
    let header: Vec<&str> = csv.lines().next().unwrap_or_default().split(',').collect();
    let at = header
        .iter()
        .position(|h| *h == "downtime_ms")
        .unwrap_or_else(|| panic!("{csv}"));
    let row = csv
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_else(|| panic!("{csv}"));
    assert_eq!(
        row.split(',').nth(at),
        Some(total.to_string().as_str()),
        "{csv}"
    );
}

#[tokio::test]
async fn a_rollout_that_never_took_its_replica_down_has_no_downtime() {
    let app = TestApp::spawn().await;
    // A tag the host does not have: the plan's dry run fails, nothing is taken down.
    let id = app.start_canary(&TestApp::plan("v9.9.999")).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "failed", "{r:#?}");
    assert!(r.downtime.is_none(), "{:?}", r.downtime);
    assert_eq!(r.downtime_ms, None);
    assert!(app.container_id(R2).is_some(), "r2 still runs");
}
