//! `window`: passes at once inside a low-traffic window, without one configured and in a
//! rollback; otherwise waits (recorded as an approval wait) until the window opens or an
//! operator starts the rollout now, and fails `window_closed` at its deadline.

use std::time::Duration;

use chrono::{Timelike, Utc};

use super::{ended, message, Bench};
use crate::domain::state::RolloutKind;
use crate::domain::window::TrafficWindow;
use crate::store::Approval;

const STEP: &str = "  - {name: window, kind: window, timeout: 12h}\n";

/// A daily window from `from` to `to` hours after the start of the current UTC hour.
fn hours_from_now(from: u32, to: u32) -> TrafficWindow {
    let h = Utc::now().hour();
    let yaml = format!(
        "{{start: '{:02}:00', end: '{:02}:00'}}",
        (h + from) % 24,
        (h + to) % 24
    );
    serde_yaml::from_str(&yaml).expect("a window")
}

fn bench(windows: Vec<TrafficWindow>) -> Bench {
    let mut bench = Bench::new(STEP);
    bench.config.windows = windows;
    bench
}

#[tokio::test]
async fn a_window_step_passes_at_once_inside_a_window_without_one_and_in_a_rollback() {
    let open = bench(vec![hours_from_now(0, 2)]);
    let end = open.run(0, None).await;
    let (status, _, detail) = ended(&end);
    assert_eq!(status, "succeeded", "{detail}");
    assert!(detail["opened_at"].is_string(), "open now: {detail}");

    let none = bench(Vec::new());
    let end = none.run(0, None).await;
    let (status, _, detail) = ended(&end);
    assert_eq!(status, "succeeded", "{detail}");
    assert!(
        detail["skipped"]
            .as_str()
            .is_some_and(|s| s.contains("no low-traffic window")),
        "{detail}"
    );

    let mut rollback = bench(vec![hours_from_now(2, 3)]);
    rollback.rollout.kind = RolloutKind::Rollback;
    let end = rollback.run(0, None).await;
    let (status, _, detail) = ended(&end);
    assert_eq!(status, "succeeded", "{detail}");
    assert!(
        detail["skipped"]
            .as_str()
            .is_some_and(|s| s.contains("rollback never waits")),
        "{detail}"
    );
    for b in [&open, &none, &rollback] {
        assert!(b
            .store
            .approval_requests
            .lock()
            .expect("requests")
            .is_empty());
        assert!(b.host.journal().is_empty(), "a window step calls no host");
    }
}

#[tokio::test]
async fn a_closed_window_holds_the_step_until_it_opens() {
    let closed = bench(vec![hours_from_now(2, 3)]);
    // The clock moves past the opening once the step waits.
    closed.clock_ahead_after(Duration::from_millis(150), Duration::from_secs(3 * 3600));
    let end = closed.run(0, None).await;
    let (status, _, detail) = ended(&end);
    assert_eq!(status, "succeeded", "{detail}");
    assert!(detail["opened_at"].is_string(), "{detail}");
    assert_eq!(
        *closed.store.approval_requests.lock().expect("requests"),
        ["window"],
        "the wait was recorded (and notified) first"
    );
    let saved = closed.store.saves.lock().expect("saves").clone();
    let waiting = saved.last().cloned().unwrap_or_default();
    assert!(waiting["next_opening"].is_string(), "{waiting}");
    assert!(
        waiting["waiting_for"]
            .as_str()
            .is_some_and(|w| w.contains("low-traffic window")),
        "{waiting}"
    );
}

#[tokio::test]
async fn an_operator_starts_a_waiting_rollout_now_with_a_reason() {
    let closed = bench(vec![hours_from_now(2, 3)]);
    let (end, ()) = tokio::join!(closed.run(0, None), async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        closed.store.approvals.lock().expect("approvals").insert(
            "window".to_owned(),
            Approval {
                step: "window".to_owned(),
                actor: "alice".to_owned(),
                reason: "the fix cannot wait for the night".to_owned(),
                at: Utc::now(),
            },
        );
    });
    let (status, _, detail) = ended(&end);
    assert_eq!(status, "succeeded", "{detail}");
    assert_eq!(detail["approved_by"], "alice", "{detail}");
    assert_eq!(detail["reason"], "the fix cannot wait for the night");
    assert!(detail["opened_at"].is_null(), "it did not open: {detail}");
}

#[tokio::test]
async fn a_window_that_does_not_open_before_the_deadline_fails_window_closed() {
    let mut closed = Bench::new("  - {name: window, kind: window, timeout: 1h}\n");
    closed.config.windows = vec![hours_from_now(3, 4)];
    closed.clock_ahead_after(Duration::from_millis(150), Duration::from_secs(3600 + 60));
    let end = closed.run(0, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!(
        (status, code.as_deref()),
        ("failed", Some("window_closed")),
        "{detail}"
    );
    assert!(message(&end).contains("not touched"), "{}", message(&end));
    assert!(detail["next_opening"].is_string(), "{detail}");
}
