//! Approvals: asked once per step, given only while a running step waits, read back as given.

use serde_json::json;

use super::{apply, at, create, rollout, temp_store};
use crate::domain::audit::AuditKind;
use crate::domain::state::{RolloutEvent, StepEvent};
use crate::store::{StoreError, AWAITING_APPROVAL};

#[tokio::test]
async fn an_approval_is_given_once_and_only_to_a_running_step_that_waits() {
    let (_dir, store) = temp_store().await;
    create(&store, &rollout("ro_1", "h1", "r2", 0)).await;
    apply(&store, "ro_1", RolloutEvent::Start, 1).await;
    let step = store.steps("ro_1").await.expect("steps").remove(1);
    store
        .transition_step(&step, StepEvent::Start, &json!({}), None, at(2))
        .await
        .expect("running");

    // Running, but not waiting: refused, nothing written.
    let refused = store.approve("ro_1", "alice", "ok", at(3)).await;
    assert!(
        matches!(refused, Err(StoreError::NotAwaitingApproval(_))),
        "{refused:?}"
    );
    assert_eq!(store.approval_of("ro_1", "down").await.expect("read"), None);

    let waiting = json!({AWAITING_APPROVAL: true, "deadline": "2026-01-01T04:00:00Z"});
    for s in [4, 5] {
        store
            .request_approval("ro_1", &step.id, "down", &waiting, at(s))
            .await
            .expect("asked");
    }
    let approval = store.approve("ro_1", "alice", "looks right", at(6)).await;
    let approval = approval.expect("approved");
    assert_eq!(
        (approval.step.as_str(), approval.actor.as_str()),
        ("down", "alice")
    );
    assert_eq!(
        store.approval_of("ro_1", "down").await.expect("read"),
        Some(approval),
        "read back as given"
    );
    let again = store.approve("ro_1", "bob", "me too", at(7)).await;
    assert!(
        matches!(again, Err(StoreError::NotAwaitingApproval(_))),
        "{again:?}"
    );

    let kinds: Vec<AuditKind> = store
        .audit_events("ro_1", 0)
        .await
        .expect("events")
        .into_iter()
        .map(|e| e.kind)
        .collect();
    let count = |k: AuditKind| kinds.iter().filter(|x| **x == k).count();
    assert_eq!(
        count(AuditKind::ApprovalRequested),
        1,
        "asked once: {kinds:?}"
    );
    assert_eq!(count(AuditKind::Approved), 1, "{kinds:?}");

    // A terminal rollout waits for nobody.
    apply(&store, "ro_1", RolloutEvent::Fail, 8).await;
    let late = store.approve("ro_1", "alice", "late", at(9)).await;
    assert!(
        matches!(late, Err(StoreError::NotAwaitingApproval(_))),
        "{late:?}"
    );
}
