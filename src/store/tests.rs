//! The store on its own, on a temporary SQLite file: every query and transition, without the
//! engine or the HTTP layer above it.

mod approval;
mod connections;
mod migrate;
mod records;
mod release;
mod round_trips;

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, TimeZone, Utc};
use serde_json::json;

use super::{NewRollout, NewStep, Rollout, RolloutChange, Store, StoreError};
use crate::domain::audit::AuditKind;
use crate::domain::state::{
    AttemptOutcome, OnFailure, RolloutEvent, RolloutKind, RolloutStatus, StepEvent, StepStatus,
};

/// A store on a fresh file; keep the folder alive as long as the store.
pub(crate) async fn temp_store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(&dir.path().join("canaryd.db"))
        .await
        .expect("store opens");
    (dir, store)
}

/// A fixed clock: `s` seconds after a fixed instant.
pub(super) fn at(s: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0)
        .single()
        .expect("valid")
        + Duration::seconds(s)
}

/// A pending canary of `host`/`service` created at `at(created)` (also the fixture of the
/// engine and HTTP unit tests).
pub(crate) fn rollout(id: &str, host: &str, service: &str, created: i64) -> NewRollout {
    NewRollout {
        id: id.into(),
        kind: RolloutKind::Canary,
        host: host.into(),
        file: "prod/a.yaml".parse().expect("a valid name"),
        service: service.parse().expect("a valid name"),
        tag: "v2".parse().expect("a valid name"),
        runbook: "single-replica-canary".into(),
        actor: "alice".into(),
        reason: "test".into(),
        env_overrides: BTreeMap::from([("BUDGET".to_owned(), "1GiB".to_owned())]),
        env_sha256: "sha".into(),
        require_logs: Vec::new(),
        on_failure: OnFailure::Rollback,
        rollback_of: None,
        expect_commit: None,
        expect_file_sha256: None,
        created_at: at(created),
        deploy_as: None,
        replaces: None,
        windows: Vec::new(),
        required_free: None,
    }
}

pub(crate) fn steps() -> Vec<NewStep> {
    use crate::domain::runbook::StepKindName;
    [
        ("snapshot", StepKindName::Snapshot),
        ("down", StepKindName::Down),
        ("up", StepKindName::Up),
    ]
    .into_iter()
    .map(|(name, kind)| NewStep {
        name: name.into(),
        kind,
    })
    .collect()
}

pub(crate) fn change(event: RolloutEvent, s: i64) -> RolloutChange {
    RolloutChange {
        event,
        actor: "canaryd".into(),
        error: None,
        detail: Default::default(),
        at: at(s),
    }
}

/// Creates `new` with the three steps.
pub(super) async fn create(store: &Store, new: &NewRollout) {
    store.create_rollout(new, &steps()).await.expect("created");
}

/// Moves rollout `id` by `event` at `at(s)`.
pub(super) async fn apply(store: &Store, id: &str, event: RolloutEvent, s: i64) -> Rollout {
    store
        .transition_rollout(id, &change(event, s))
        .await
        .unwrap_or_else(|e| panic!("{id} {event}: {e}"))
}

async fn kinds(store: &Store, id: &str) -> Vec<AuditKind> {
    let events = store.audit_events(id, 0).await.expect("events");
    events.into_iter().map(|e| e.kind).collect()
}

#[tokio::test]
async fn a_created_rollout_is_pending_with_its_steps_in_order_and_one_audit_event() {
    let (_dir, store) = temp_store().await;
    create(&store, &rollout("ro_1", "h1", "r2", 0)).await;
    let r = store
        .get_rollout("ro_1")
        .await
        .expect("read")
        .expect("found");
    assert_eq!(r.status, RolloutStatus::Pending);
    assert_eq!(r.env_overrides["BUDGET"], "1GiB");
    assert!(!r.touched_replica);
    let names: Vec<(i64, String, StepStatus)> = store
        .steps("ro_1")
        .await
        .expect("steps")
        .into_iter()
        .map(|s| (s.position, s.name, s.status))
        .collect();
    assert_eq!(
        names,
        [
            (0, "snapshot".to_owned(), StepStatus::Pending),
            (1, "down".to_owned(), StepStatus::Pending),
            (2, "up".to_owned(), StepStatus::Pending),
        ]
    );
    assert_eq!(kinds(&store, "ro_1").await, [AuditKind::RolloutCreated]);
    assert!(store.get_rollout("ro_x").await.expect("read").is_none());
}

#[tokio::test]
async fn a_host_holds_one_active_rollout_until_it_ends() {
    let (_dir, store) = temp_store().await;
    create(&store, &rollout("ro_1", "h1", "r2", 0)).await;
    let busy = store
        .create_rollout(&rollout("ro_2", "h1", "r1", 1), &steps())
        .await;
    assert!(
        matches!(busy, Err(StoreError::HostBusy { ref rollout_id, .. }) if rollout_id == "ro_1"),
        "{busy:?}"
    );
    create(&store, &rollout("ro_3", "h2", "r2", 1)).await;
    let active = store.active_rollout_on("h1").await.expect("read");
    assert_eq!(active.map(|r| r.id).as_deref(), Some("ro_1"));
    apply(&store, "ro_1", RolloutEvent::Fail, 2).await;
    assert!(store.active_rollout_on("h1").await.expect("read").is_none());
    create(&store, &rollout("ro_2", "h1", "r1", 3)).await;
    let unfinished: Vec<String> = store
        .unfinished_rollouts()
        .await
        .expect("read")
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(unfinished, ["ro_3", "ro_2"], "oldest first");
    assert_eq!(store.count_active_rollouts().await.expect("count"), 2);
}

#[tokio::test]
async fn rollout_transitions_follow_the_state_machine_and_write_their_event() {
    let cases = [
        (
            vec![RolloutEvent::Start, RolloutEvent::Succeed],
            Ok(RolloutStatus::Succeeded),
        ),
        (
            vec![RolloutEvent::Start, RolloutEvent::Fail],
            Ok(RolloutStatus::Failed),
        ),
        (vec![RolloutEvent::Abort], Ok(RolloutStatus::Aborted)),
        (vec![RolloutEvent::Succeed], Err(())),
        (vec![RolloutEvent::Fail, RolloutEvent::Start], Err(())),
    ];
    for (events, expected) in cases {
        let (_dir, store) = temp_store().await;
        create(&store, &rollout("ro_1", "h1", "r2", 0)).await;
        let mut got = Ok(RolloutStatus::Pending);
        for (n, event) in events.iter().enumerate() {
            got = match store
                .transition_rollout("ro_1", &change(*event, n as i64 + 1))
                .await
            {
                Ok(r) => Ok(r.status),
                Err(StoreError::InvalidTransition { .. }) => Err(()),
                Err(e) => panic!("{e}"),
            };
        }
        assert_eq!(got, expected, "{events:?}");
        let r = store
            .get_rollout("ro_1")
            .await
            .expect("read")
            .expect("found");
        let last = *kinds(&store, "ro_1").await.last().expect("events");
        let expected_event = match r.status {
            RolloutStatus::Pending => AuditKind::RolloutCreated,
            status => AuditKind::rollout(status),
        };
        assert_eq!(
            last, expected_event,
            "a refused transition writes nothing: {events:?}"
        );
        assert_eq!(
            r.finished_at.is_some(),
            r.status.is_terminal(),
            "{events:?}"
        );
    }
}

#[tokio::test]
async fn an_abort_request_is_audited_with_its_actor_and_refused_once_terminal() {
    let (_dir, store) = temp_store().await;
    create(&store, &rollout("ro_1", "h1", "r2", 0)).await;
    store
        .request_abort("ro_1", "bob", "wrong tag", at(1))
        .await
        .expect("requested");
    let r = store
        .transition_rollout("ro_1", &change(RolloutEvent::Abort, 2))
        .await
        .expect("aborted");
    assert_eq!(r.abort_reason.as_deref(), Some("wrong tag"));
    let events = store.audit_events("ro_1", 0).await.expect("events");
    let aborted = events.last().expect("events");
    assert_eq!(aborted.kind, AuditKind::RolloutAborted);
    assert_eq!(aborted.actor, "bob", "the abort names who asked");
    assert_eq!(aborted.detail["reason"], "wrong tag");
    assert!(events.iter().any(|e| e.kind == AuditKind::AbortRequested));
    let again = store.request_abort("ro_1", "bob", "again", at(3)).await;
    assert!(
        matches!(again, Err(StoreError::InvalidTransition { .. })),
        "{again:?}"
    );
}

#[tokio::test]
async fn a_failed_canary_and_its_rollback_are_created_and_linked_in_one_step() {
    let (_dir, store) = temp_store().await;
    create(&store, &rollout("ro_c", "h1", "r2", 0)).await;
    apply(&store, "ro_c", RolloutEvent::Start, 1).await;
    let mut back = rollout("ro_b", "h1", "r2", 2);
    back.kind = RolloutKind::Rollback;
    back.rollback_of = Some("ro_c".into());
    let mut failed = change(RolloutEvent::Fail, 2);
    failed.error = Some(("compose_failed".into(), "exit 1".into()));
    store
        .fail_and_roll_back("ro_c", &failed, &back, &steps())
        .await
        .expect("rolled back");
    let canary = store
        .get_rollout("ro_c")
        .await
        .expect("read")
        .expect("found");
    assert_eq!(canary.status, RolloutStatus::Failed);
    assert_eq!(canary.error_code.as_deref(), Some("compose_failed"));
    assert_eq!(canary.rolled_back_by.as_deref(), Some("ro_b"));
    let rollback = store
        .active_rollout_on("h1")
        .await
        .expect("read")
        .expect("active");
    assert_eq!(rollback.id, "ro_b");
    assert_eq!(rollback.rollback_of.as_deref(), Some("ro_c"));
}

#[tokio::test]
async fn a_manual_rollback_is_linked_once_with_its_reason() {
    let (_dir, store) = temp_store().await;
    create(&store, &rollout("ro_c", "h1", "r2", 0)).await;
    apply(&store, "ro_c", RolloutEvent::Fail, 1).await;
    let mut back = rollout("ro_b", "h1", "r2", 2);
    back.kind = RolloutKind::Rollback;
    back.reason = "pager".into();
    store
        .create_rollout(&back, &steps())
        .await
        .expect("created");
    store.link_rollback("ro_c", "ro_b").await.expect("linked");
    store
        .link_rollback("ro_c", "ro_b")
        .await
        .expect("idempotent");
    let linked: Vec<_> = store
        .audit_events("ro_c", 0)
        .await
        .expect("events")
        .into_iter()
        .filter(|e| e.kind == AuditKind::RollbackLinked)
        .collect();
    assert_eq!(linked.len(), 1, "linked once");
    assert_eq!(linked[0].detail["reason"], "pager");
    assert_eq!(linked[0].actor, "alice");
}

#[tokio::test]
async fn the_last_touching_rollout_is_the_newest_that_sent_a_down_or_up() {
    let (_dir, store) = temp_store().await;
    for (id, s) in [("ro_1", 0), ("ro_2", 10), ("ro_3", 20)] {
        create(&store, &rollout(id, "h1", "r2", s)).await;
        if id != "ro_3" {
            let down = &store.steps(id).await.expect("steps")[1];
            store
                .begin_attempt(down, "compose/down", at(s), true)
                .await
                .expect("touched");
        }
        apply(&store, id, RolloutEvent::Fail, s + 1).await;
    }
    let last = store.last_touching_rollout("h1", "r2").await.expect("read");
    assert_eq!(last.map(|r| r.id).as_deref(), Some("ro_2"));
    assert!(store
        .last_touching_rollout("h1", "r1")
        .await
        .expect("read")
        .is_none());
}

#[tokio::test]
async fn a_running_steps_deadline_moves_only_later_and_a_finished_ones_never() {
    let (_dir, store) = temp_store().await;
    create(&store, &rollout("ro_1", "h1", "r2", 0)).await;
    let step = store.steps("ro_1").await.expect("steps").remove(1);
    store
        .transition_step(&step, StepEvent::Start, &json!({}), Some(at(100)), at(1))
        .await
        .expect("running");
    let deadline = || async { store.steps("ro_1").await.expect("steps")[1].deadline_at };
    // (moved to, then read)
    for (to, read) in [(50, 100), (100, 100), (160, 160), (120, 160)] {
        store
            .extend_step_deadline(&step.id, at(to))
            .await
            .expect("written");
        assert_eq!(deadline().await, Some(at(read)), "moved to {to}");
    }
    let running = store.steps("ro_1").await.expect("steps").remove(1);
    store
        .transition_step(&running, StepEvent::Succeed, &json!({}), None, at(2))
        .await
        .expect("succeeded");
    store
        .extend_step_deadline(&step.id, at(900))
        .await
        .expect("written");
    assert_eq!(deadline().await, Some(at(160)), "a finished step keeps it");
}

#[tokio::test]
async fn step_transitions_count_attempts_keep_the_first_deadline_and_audit_failures() {
    let (_dir, store) = temp_store().await;
    create(&store, &rollout("ro_1", "h1", "r2", 0)).await;
    let step = store.steps("ro_1").await.expect("steps").remove(1);
    let deadline = Some(at(100));
    let next = store
        .transition_step(&step, StepEvent::Start, &json!({}), deadline, at(1))
        .await
        .expect("running");
    assert_eq!(next, StepStatus::Running);
    store
        .update_step_detail(&step.id, &json!({"progress": 1}))
        .await
        .expect("detail");
    let detail = json!({"error": {"code": "compose_failed", "message": "exit 1"}});
    store
        .transition_step(&step, StepEvent::Fail, &detail, Some(at(500)), at(2))
        .await
        .expect("failed");
    let read = store.steps("ro_1").await.expect("steps").remove(1);
    assert_eq!(read.status, StepStatus::Failed);
    assert_eq!(read.attempts, 1);
    assert_eq!(read.deadline_at, deadline, "the first deadline is kept");
    assert_eq!(
        (read.started_at, read.finished_at),
        (Some(at(1)), Some(at(2)))
    );
    assert_eq!(read.detail, detail);
    let events = store.audit_events("ro_1", 0).await.expect("events");
    let failed = events.last().expect("events");
    assert_eq!(failed.kind, AuditKind::StepFailed);
    assert_eq!(failed.step.as_deref(), Some("down"));
    assert_eq!(
        failed.detail, detail,
        "a failure's audit event carries its error"
    );
    let refused = store
        .transition_step(&step, StepEvent::Start, &json!({}), None, at(3))
        .await;
    assert!(
        matches!(refused, Err(StoreError::InvalidTransition { .. })),
        "{refused:?}"
    );
    let by_rollout = store
        .steps_of(&["ro_1".to_owned()])
        .await
        .expect("steps of");
    assert_eq!(by_rollout["ro_1"].len(), 3);
}

/// A step boundary is one transaction; the next step starts only while no abort is
/// requested, and each change keeps its own audit event.
#[tokio::test]
async fn a_boundary_succeeds_a_step_and_starts_the_next_unless_an_abort_was_requested() {
    let (_dir, store) = temp_store().await;
    create(&store, &rollout("ro_1", "h1", "r2", 0)).await;
    let all = store.steps("ro_1").await.expect("steps");
    store
        .transition_step(&all[0], StepEvent::Start, &json!({}), None, at(1))
        .await
        .expect("running");
    let started = store
        .succeed_step_and_start_next(
            &all[0],
            &json!({"ok": 1}),
            Some((&all[1], Some(at(90)))),
            at(2),
        )
        .await
        .expect("boundary");
    assert!(started);
    let read = store.steps("ro_1").await.expect("steps");
    assert_eq!(read[0].status, StepStatus::Succeeded);
    assert_eq!(read[0].detail, json!({"ok": 1}));
    assert_eq!(read[0].finished_at, Some(at(2)));
    assert_eq!(read[1].status, StepStatus::Running);
    assert_eq!(
        (read[1].started_at, read[1].deadline_at),
        (Some(at(2)), Some(at(90)))
    );
    let kinds: Vec<(AuditKind, Option<String>)> = store
        .audit_events("ro_1", 0)
        .await
        .expect("events")
        .into_iter()
        .map(|e| (e.kind, e.step))
        .collect();
    let tail = &kinds[kinds.len() - 2..];
    assert_eq!(
        tail,
        [
            (AuditKind::StepSucceeded, Some(all[0].name.clone())),
            (AuditKind::StepRunning, Some(all[1].name.clone()))
        ]
    );
    store
        .request_abort("ro_1", "bob", "stop", at(3))
        .await
        .expect("abort requested");
    let started = store
        .succeed_step_and_start_next(&all[1], &json!({}), Some((&all[2], None)), at(4))
        .await
        .expect("boundary");
    assert!(!started, "an abort requested first wins");
    let read = store.steps("ro_1").await.expect("steps");
    assert_eq!(read[1].status, StepStatus::Succeeded);
    assert_eq!(read[2].status, StepStatus::Pending);
    // The last step's boundary has no next step.
    let refused = store
        .succeed_step_and_start_next(&all[2], &json!({}), None, at(5))
        .await;
    assert!(
        matches!(refused, Err(StoreError::InvalidTransition { .. })),
        "a pending step cannot succeed: {refused:?}"
    );
    assert_eq!(
        store.steps("ro_1").await.expect("steps")[2].status,
        StepStatus::Pending,
        "nothing half-written"
    );
}

#[tokio::test]
async fn attempts_are_written_ahead_numbered_per_step_and_read_in_order() {
    let (_dir, store) = temp_store().await;
    create(&store, &rollout("ro_1", "h1", "r2", 0)).await;
    let all = store.steps("ro_1").await.expect("steps");
    let (down, up) = (&all[1], &all[2]);
    let a1 = store
        .begin_attempt(down, "compose/down", at(1), false)
        .await
        .expect("begun");
    store
        .finish_attempt(&a1, AttemptOutcome::Busy, &json!({"status": 409}), at(2))
        .await
        .expect("finished");
    let a2 = store
        .begin_attempt(down, "compose/down", at(3), false)
        .await
        .expect("begun");
    store
        .finish_attempt(&a2, AttemptOutcome::Succeeded, &json!({}), at(4))
        .await
        .expect("finished");
    store
        .begin_attempt(up, "compose/up", at(5), false)
        .await
        .expect("begun");
    let read: Vec<(String, i64, Option<AttemptOutcome>)> = store
        .attempts("ro_1")
        .await
        .expect("attempts")
        .into_iter()
        .map(|a| (a.endpoint, a.n, a.outcome))
        .collect();
    assert_eq!(
        read,
        [
            ("compose/down".to_owned(), 1, Some(AttemptOutcome::Busy)),
            (
                "compose/down".to_owned(),
                2,
                Some(AttemptOutcome::Succeeded)
            ),
            ("compose/up".to_owned(), 1, None),
        ],
        "an attempt without outcome is one that may be in flight"
    );
}
