//! `approve`: the step asks for an approval, waits for one, and fails `not_approved` at its
//! deadline.

use std::time::Duration;

use chrono::Utc;

use super::{ended, message, Bench};
use crate::store::Approval;

#[tokio::test]
async fn an_approval_given_while_the_step_waits_ends_it_with_who_and_why() {
    let bench = Bench::new("  - {name: go, kind: approve, timeout: 10s}\n");
    let (end, ()) = tokio::join!(bench.run(0, None), async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        bench.store.approvals.lock().expect("approvals").insert(
            "go".to_owned(),
            Approval {
                step: "go".to_owned(),
                actor: "bob".to_owned(),
                reason: "dashboards look fine".to_owned(),
                at: Utc::now(),
            },
        );
    });
    let (status, code, detail) = ended(&end);
    assert_eq!((status, code), ("succeeded", None), "{detail}");
    assert_eq!(detail["approved_by"], "bob", "{detail}");
    assert_eq!(detail["reason"], "dashboards look fine", "{detail}");
    assert_eq!(
        *bench.store.approval_requests.lock().expect("requests"),
        ["go"],
        "the wait was recorded first"
    );
}

#[tokio::test]
async fn an_approval_that_never_comes_times_out_not_approved() {
    let bench = Bench::new("  - {name: go, kind: approve, timeout: 1h}\n");
    bench.clock_ahead_after(Duration::from_millis(100), Duration::from_secs(7200));
    // Bounded by `Bench::run` (30 s): without the clock the step would wait its hour.
    let end = bench.run(0, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!(status, "failed", "{detail}");
    assert_eq!(code.as_deref(), Some("not_approved"), "{detail}");
    assert!(message(&end).contains("go"), "{}", message(&end));
    assert!(bench.host.journal().is_empty(), "an approval calls no host");
}

#[tokio::test]
async fn an_abort_ends_the_wait_for_an_approval() {
    let bench = Bench::new("  - {name: go, kind: approve, timeout: 1h}\n");
    let end = bench.run(0, Some(Duration::from_millis(100))).await;
    assert_eq!(ended(&end).0, "aborted");
}
