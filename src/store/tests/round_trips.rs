//! Fewer round trips keep the store's answers: a step update that trusts the
//! caller's copy of the row only when the database agrees, and audit events handed to
//! subscribers by the transaction that wrote them, exactly as reading them back would give.

use serde_json::json;

use super::{at, create, rollout, temp_store};
use crate::domain::audit::AuditKind;
use crate::domain::state::{StepEvent, StepStatus};
use crate::store::{AuditEvent, Step, Store, StoreError};

/// The events that take a pending step to `status`.
fn path_to(status: StepStatus) -> &'static [StepEvent] {
    match status {
        StepStatus::Pending => &[],
        StepStatus::Running => &[StepEvent::Start],
        StepStatus::Succeeded => &[StepEvent::Start, StepEvent::Succeed],
        StepStatus::Failed => &[StepEvent::Fail],
        StepStatus::Skipped => &[StepEvent::Skip],
        StepStatus::Aborted => &[StepEvent::Abort],
    }
}

/// The `down` step of `id`, read fresh.
async fn down(store: &Store, id: &str) -> Step {
    store.steps(id).await.expect("steps").remove(1)
}

/// Every status the database holds × every status a caller's copy may say × every event: the
/// outcome is the database's (`StepStatus::apply` from the stored status), the audit event
/// names the stored status as `from`, and a refused transition writes nothing.
#[tokio::test]
async fn a_step_transition_is_judged_from_the_stored_status_whatever_the_callers_copy_says() {
    let (_dir, store) = temp_store().await;
    let mut case = 0;
    for &stored in StepStatus::ALL {
        for &copy in StepStatus::ALL {
            for &event in StepEvent::ALL {
                case += 1;
                let id = format!("ro_{case}");
                create(&store, &rollout(&id, &format!("h{case}"), "r2", 0)).await;
                for (i, &e) in path_to(stored).iter().enumerate() {
                    let fresh = down(&store, &id).await;
                    store
                        .transition_step(&fresh, e, &json!({"path": i}), None, at(1 + i as i64))
                        .await
                        .unwrap_or_else(|err| panic!("{id}: path to {stored}: {err}"));
                }
                let before = down(&store, &id).await;
                assert_eq!(before.status, stored, "{id}");
                let events_before = store.audit_events(&id, 0).await.expect("events").len();
                let mut caller = before.clone();
                caller.status = copy;
                let detail = json!({"case": case});
                let got = store
                    .transition_step(&caller, event, &detail, None, at(50))
                    .await;
                let what = format!("{id}: stored {stored}, copy {copy}, event {event}");
                let after = down(&store, &id).await;
                let events = store.audit_events(&id, 0).await.expect("events");
                match stored.apply(event) {
                    Ok(next) => {
                        assert_eq!(got.ok(), Some(next), "{what}");
                        assert_eq!(after.status, next, "{what}");
                        assert_eq!(after.detail, detail, "{what}");
                        let last = events.last().expect("an event");
                        assert_eq!(events.len(), events_before + 1, "{what}");
                        assert_eq!(last.kind, AuditKind::step(next), "{what}");
                        assert_eq!(
                            (last.from_state.as_deref(), last.to_state.as_deref()),
                            (Some(stored.as_str()), Some(next.as_str())),
                            "{what}"
                        );
                    }
                    Err(_) => {
                        assert!(
                            matches!(got, Err(StoreError::InvalidTransition { .. })),
                            "{what}: {got:?}"
                        );
                        assert_eq!(
                            (
                                after.status,
                                &after.detail,
                                after.attempts,
                                after.started_at,
                                after.finished_at
                            ),
                            (
                                before.status,
                                &before.detail,
                                before.attempts,
                                before.started_at,
                                before.finished_at
                            ),
                            "{what}: nothing written"
                        );
                        assert_eq!(events.len(), events_before, "{what}: no event");
                    }
                }
            }
        }
    }
}

#[tokio::test]
async fn a_transition_of_a_step_not_in_the_database_fails_and_writes_nothing() {
    let (_dir, store) = temp_store().await;
    create(&store, &rollout("ro_1", "h1", "r2", 0)).await;
    let mut ghost = down(&store, "ro_1").await;
    ghost.id = "st_missing".into();
    let got = store
        .transition_step(&ghost, StepEvent::Start, &json!({}), None, at(1))
        .await;
    assert!(
        matches!(got, Err(StoreError::Sqlx(sqlx::Error::RowNotFound))),
        "{got:?}"
    );
    let events = store.audit_events("ro_1", 0).await.expect("events");
    assert!(
        events.iter().all(|e| e.step.is_none()),
        "no step event: {events:?}"
    );
}

/// Every event `rx` holds now.
fn drain(rx: &mut tokio::sync::broadcast::Receiver<AuditEvent>) -> Vec<AuditEvent> {
    let mut out = Vec::new();
    while let Ok(e) = rx.try_recv() {
        out.push(e);
    }
    out
}

/// An event as the API shows it (what reading it back gives; the step timing is not shown).
fn shown(e: &AuditEvent) -> serde_json::Value {
    serde_json::to_value(e).expect("serializes")
}

/// A rollout's life through the store (created, a step started, a stale copy's transition
/// rerun carefully, a boundary, a refused transition): subscribers get, at each commit, the
/// events it wrote, with the numbers SQLite gave them, in order, equal to reading them back;
/// a rolled-back transaction hands over nothing.
#[tokio::test]
async fn committed_audit_events_reach_subscribers_as_stored_and_in_order() {
    let (_dir, store) = temp_store().await;
    let mut rx = store.subscribe();
    create(&store, &rollout("ro_1", "h1", "r2", 0)).await;
    let all = store.steps("ro_1").await.expect("steps");
    store
        .transition_step(&all[0], StepEvent::Start, &json!({}), None, at(1))
        .await
        .expect("running");
    // A stale copy (pending, stored running): the first try's guard fails, the careful
    // rerun writes the event once.
    store
        .transition_step(&all[0], StepEvent::Fail, &json!({}), None, at(2))
        .await
        .expect("failed");
    let done = down(&store, "ro_1").await;
    let mut running = done.clone();
    store
        .transition_step(&done, StepEvent::Start, &json!({}), None, at(3))
        .await
        .expect("down running");
    running.status = StepStatus::Running;
    running.started_at = Some(at(3));
    store
        .succeed_step_and_start_next(&running, &json!({}), Some((&all[2], None)), at(4))
        .await
        .expect("boundary");
    let refused = store
        .transition_step(&all[0], StepEvent::Start, &json!({}), None, at(5))
        .await;
    assert!(refused.is_err(), "{refused:?}");
    let handed = drain(&mut rx);
    let stored = store.audit_events_after(0).await.expect("read back");
    assert_eq!(
        handed.iter().map(shown).collect::<Vec<_>>(),
        stored.iter().map(shown).collect::<Vec<_>>()
    );
    assert!(handed.windows(2).all(|w| w[0].seq < w[1].seq));
    // The boundary's end carries the step's times as stored, for the metrics.
    let end = handed
        .iter()
        .find(|e| {
            e.step.as_deref() == Some(running.name.as_str()) && e.kind == AuditKind::StepSucceeded
        })
        .expect("the boundary's end");
    let timing = end.step_timing.clone().expect("handed with its timing");
    let read = store
        .step_timing("ro_1", &running.name)
        .await
        .expect("read")
        .expect("the step");
    assert_eq!(timing, read);
}

/// A write transaction hands over audit events only when it wrote some and committed, and
/// wakes the notifier only when it also wrote a notification: one that wrote none, or whose
/// events were rolled back, hands over nothing.
#[tokio::test]
async fn only_a_committed_transaction_hands_over_its_events_and_wakes_the_notifier() {
    let (_dir, store) = temp_store().await;
    create(&store, &rollout("ro_1", "h1", "r2", 0)).await;
    let mut rx = store.subscribe();
    let mut outbox = store.outbox_writes();
    let entry = |kind| crate::store::AuditEntry::new(at(0), "test", kind).rollout("ro_1");
    let cases: [(&str, Option<AuditKind>, bool); 5] = [
        // (case, the audit event appended, the closure fails after it)
        ("writes nothing", None, false),
        (
            "appends and commits",
            Some(AuditKind::AbortRequested),
            false,
        ),
        (
            "appends a notifying event and commits",
            Some(AuditKind::RolloutFailed),
            false,
        ),
        (
            "appends a notifying event, then fails",
            Some(AuditKind::RolloutFailed),
            true,
        ),
        ("fails without appending", None, true),
    ];
    for (case, appends, fails) in cases {
        let out = store
            .write(|mut db| async move {
                if let Some(kind) = appends {
                    crate::store::audit::append(&mut db, &entry(kind)).await?;
                }
                if fails {
                    return Err(StoreError::NotFound(case.to_owned()));
                }
                db.commit(()).await
            })
            .await;
        assert_eq!(out.is_err(), fails, "{case}");
        let handed = drain(&mut rx);
        assert_eq!(
            handed.len(),
            usize::from(appends.is_some() && !fails),
            "{case}"
        );
        let notifies = appends == Some(AuditKind::RolloutFailed) && !fails;
        assert_eq!(
            outbox.has_changed().expect("open"),
            notifies,
            "{case}: notifier woken"
        );
        outbox.mark_unchanged();
    }
    let (n,): (i64,) = sqlx::query_as("select count(*) from audit_event where actor = 'test'")
        .fetch_one(store.pool())
        .await
        .expect("count");
    assert_eq!(n, 2, "only the committed appends are kept");
}

/// A boundary's start of the next step, whose abort check rides in the update: for the next
/// step stored pending or skipped, a caller's copy right or stale, and an abort requested or
/// not, the outcome is the one of reading the abort first and then judging the stored status:
/// an abort wins (nothing started, no error), otherwise the stored status decides, and a
/// refusal writes nothing, not even the first step's success.
#[tokio::test]
async fn a_boundary_reads_the_abort_before_the_next_steps_status_whatever_the_copy_says() {
    let (_dir, store) = temp_store().await;
    let mut case = 0;
    for stored in [StepStatus::Pending, StepStatus::Skipped] {
        for copy in [StepStatus::Pending, StepStatus::Running] {
            for abort in [false, true] {
                case += 1;
                let id = format!("ro_{case}");
                let what = format!("{id}: next stored {stored}, copy {copy}, abort {abort}");
                create(&store, &rollout(&id, &format!("h{case}"), "r2", 0)).await;
                let all = store.steps(&id).await.expect("steps");
                store
                    .transition_step(&all[1], StepEvent::Start, &json!({}), None, at(1))
                    .await
                    .expect("running");
                if stored == StepStatus::Skipped {
                    store
                        .transition_step(&all[2], StepEvent::Skip, &json!({}), None, at(2))
                        .await
                        .expect("skipped");
                }
                if abort {
                    store
                        .request_abort(&id, "bob", "stop", at(3))
                        .await
                        .expect("abort requested");
                }
                let done = down(&store, &id).await;
                let mut next = all[2].clone();
                next.status = copy;
                let events_before = store.audit_events(&id, 0).await.expect("events").len();
                let got = store
                    .succeed_step_and_start_next(&done, &json!({}), Some((&next, None)), at(4))
                    .await;
                let read = store.steps(&id).await.expect("steps");
                let events = store.audit_events(&id, 0).await.expect("events").len();
                if abort {
                    assert!(matches!(got, Ok(false)), "{what}: {got:?}");
                    assert_eq!(read[1].status, StepStatus::Succeeded, "{what}");
                    assert_eq!(read[2].status, stored, "{what}");
                    assert_eq!(events, events_before + 1, "{what}");
                } else if stored == StepStatus::Pending {
                    assert!(matches!(got, Ok(true)), "{what}: {got:?}");
                    assert_eq!(read[2].status, StepStatus::Running, "{what}");
                    assert_eq!(events, events_before + 2, "{what}");
                } else {
                    assert!(
                        matches!(got, Err(StoreError::InvalidTransition { .. })),
                        "{what}: {got:?}"
                    );
                    assert_eq!(read[1].status, StepStatus::Running, "{what}: rolled back");
                    assert_eq!(read[2].status, stored, "{what}");
                    assert_eq!(events, events_before, "{what}");
                }
            }
        }
    }
}
