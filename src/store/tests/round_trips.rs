//! Fewer round trips keep the store's answers: a step update that trusts the
//! caller's copy of the row only when the database agrees, and a publisher that stops reading
//! at a short batch without losing an event committed meanwhile.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use super::{at, create, rollout, temp_store};
use crate::domain::audit::AuditKind;
use crate::domain::state::{StepEvent, StepStatus};
use crate::store::audit::AUDIT_BATCH;
use crate::store::{publish_committed, AuditEvent, EventBus, Step, Store, StoreError};

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

fn event(seq: i64) -> AuditEvent {
    AuditEvent {
        seq,
        occurred_at: at(seq),
        rollout_id: Some("ro_1".into()),
        step: None,
        actor: "canaryd".into(),
        kind: AuditKind::RolloutCreated,
        from_state: None,
        to_state: None,
        detail: json!({}),
    }
}

fn bus(capacity: usize) -> Arc<EventBus> {
    let (tx, _) = tokio::sync::broadcast::channel(capacity);
    Arc::new(EventBus {
        tx,
        wake: tokio::sync::Notify::new(),
        rings: Default::default(),
    })
}

/// The next event published, or a failure after 10 s (a lost event would wait forever).
async fn next_seq(rx: &mut tokio::sync::broadcast::Receiver<AuditEvent>) -> i64 {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("an event is published")
        .expect("the bus is open")
        .seq
}

/// Event 1 is committed; while the publisher reads it (a batch shorter than the limit, so it
/// stops reading there), event 2 commits and its writer rings the publisher: event 2 is
/// published too, from the ring kept while nobody waited.
#[tokio::test]
async fn an_event_committed_while_the_publisher_reads_a_batch_is_still_published() {
    let bus = bus(16);
    let mut rx = bus.tx.subscribe();
    let table = Arc::new(Mutex::new(vec![event(1)]));
    let reads = Arc::new(AtomicUsize::new(0));
    let publisher = {
        let (bus, table, reads) = (Arc::clone(&bus), Arc::clone(&table), Arc::clone(&reads));
        tokio::spawn(async move {
            let read = |after: i64| {
                let n = reads.fetch_add(1, Ordering::SeqCst);
                let mut rows = table.lock().expect("table");
                let batch: Vec<AuditEvent> =
                    rows.iter().filter(|e| e.seq > after).cloned().collect();
                if n == 0 {
                    // A commit after this read's snapshot, and its writer's ring.
                    rows.push(event(2));
                    bus.wake.notify_one();
                }
                std::future::ready(Ok::<_, StoreError>(batch))
            };
            publish_committed(&bus, 0, read, || false).await
        })
    };
    bus.wake.notify_one();
    assert_eq!(next_seq(&mut rx).await, 1);
    assert_eq!(next_seq(&mut rx).await, 2);
    assert_eq!(
        reads.load(Ordering::SeqCst),
        2,
        "one read per ring: a short batch is the end"
    );
    publisher.abort();
}

/// A batch as long as the limit may not be all: the publisher reads on without a new ring.
#[tokio::test]
async fn a_full_batch_is_read_past_without_another_ring() {
    let bus = bus(AUDIT_BATCH + 8);
    let mut rx = bus.tx.subscribe();
    let total = AUDIT_BATCH as i64 + 3;
    let reads = Arc::new(AtomicUsize::new(0));
    let publisher = {
        let (bus, reads) = (Arc::clone(&bus), Arc::clone(&reads));
        tokio::spawn(async move {
            let read = |after: i64| {
                reads.fetch_add(1, Ordering::SeqCst);
                let end = (after + AUDIT_BATCH as i64).min(total);
                std::future::ready(Ok::<_, StoreError>(
                    (after + 1..=end).map(event).collect::<Vec<_>>(),
                ))
            };
            publish_committed(&bus, 0, read, || false).await
        })
    };
    bus.wake.notify_one();
    for seq in 1..=total {
        assert_eq!(next_seq(&mut rx).await, seq);
    }
    assert_eq!(reads.load(Ordering::SeqCst), 2);
    publisher.abort();
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

/// A write transaction rings the publisher only when it wrote an audit event and committed:
/// one that wrote none, or whose audit event was rolled back, has nothing to publish.
#[tokio::test]
async fn only_a_committed_transaction_with_audit_events_rings_the_publisher() {
    let (_dir, store) = temp_store().await;
    let rings = |s: &Store| s.bus.rings.load(Ordering::Relaxed);
    let entry = || crate::store::AuditEntry::new(at(0), "test", AuditKind::RolloutCreated);
    let cases: [(&str, bool, bool); 4] = [
        // (case, appends an audit event, the closure fails after it)
        ("writes nothing", false, false),
        ("appends and commits", true, false),
        ("appends, then fails", true, true),
        ("fails without appending", false, true),
    ];
    for (case, appends, fails) in cases {
        let before = rings(&store);
        let out = store
            .write(|mut db| async move {
                if appends {
                    crate::store::audit::append(&mut db, &entry()).await?;
                }
                if fails {
                    return Err(StoreError::NotFound(case.to_owned()));
                }
                db.commit(()).await
            })
            .await;
        assert_eq!(out.is_err(), fails, "{case}");
        let rang = rings(&store) - before;
        assert_eq!(rang, u64::from(appends && !fails), "{case}: rings");
    }
    let (n,): (i64,) = sqlx::query_as("select count(*) from audit_event")
        .fetch_one(store.pool())
        .await
        .expect("count");
    assert_eq!(n, 1, "only the committed append is kept");
}
