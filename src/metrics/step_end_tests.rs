//! A step's end observed from what its running event kept.

use chrono::TimeZone;
use serde_json::json;

use super::*;
use crate::domain::state::{RolloutEvent, StepEvent};
use crate::store::tests::{change, rollout, steps, temp_store};

fn ms(n: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0)
        .single()
        .expect("valid")
        + chrono::Duration::milliseconds(n)
}

/// A step's end observed from what its running event kept gives the very values
/// the store's read gives (as after a restart, or a lag, when nothing was kept), and
/// nothing stays kept once the rollout ends.
#[tokio::test]
async fn a_step_end_observed_from_its_start_event_matches_the_stores_read() {
    let (_dir, store) = temp_store().await;
    let steps = steps();
    store
        .create_rollout(&rollout("ro_1", "h1", "r2", 0), &steps)
        .await
        .expect("created");
    store
        .transition_rollout("ro_1", &change(RolloutEvent::Start, 1))
        .await
        .expect("started");
    let rows = store.steps("ro_1").await.expect("steps");
    let moves = [
        (0, StepEvent::Start, 1_000),
        (0, StepEvent::Succeed, 1_250),
        (1, StepEvent::Start, 1_250),
        (1, StepEvent::Fail, 3_517),
        (2, StepEvent::Skip, 3_600),
    ];
    for (i, event, at) in moves {
        store
            .transition_step(&rows[i], event, &json!({}), None, ms(at))
            .await
            .expect("moved");
    }
    store
        .transition_rollout("ro_1", &change(RolloutEvent::Fail, 4))
        .await
        .expect("failed");
    let events = store.audit_events("ro_1", 0).await.expect("events");

    let kept = Metrics::new();
    let read = Metrics::new();
    for e in &events {
        kept.on_event(&store, e).await;
        read.running_steps().clear();
        read.on_event(&store, e).await;
    }
    let text = kept.encode(0, 0);
    // The same lines (a family's label sets come out in no fixed order).
    let lines = |t: &str| {
        let mut v: Vec<String> = t.lines().map(str::to_owned).collect();
        v.sort();
        v
    };
    assert_eq!(lines(&text), lines(&read.encode(0, 0)));
    assert!(
        text.contains(
            "canaryd_step_duration_seconds_sum{kind=\"snapshot\",outcome=\"succeeded\"} 0.25\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "canaryd_step_duration_seconds_sum{kind=\"down\",outcome=\"failed\"} 2.267\n"
        ),
        "{text}"
    );
    assert!(
        kept.running_steps().is_empty(),
        "nothing kept after the end"
    );
}
