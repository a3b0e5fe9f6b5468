//! `GET /v1/rollouts/{id}/events`: a rollout's audit events as Server-Sent Events. Past events
//! are replayed (after `Last-Event-ID`, when the client reconnects), then live ones follow from
//! the store's bus until the rollout is terminal, when the stream ends.
//! `GET /v1/rollouts/{id}/audit`: the same events as one JSON answer (`canaryd show`).

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::get;
use axum::{Json, Router};
use futures_util::Stream;
use serde::Serialize;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;

use super::{Actor, ApiError, AppState};
use crate::domain::state::RolloutStatus;
use crate::store::{AuditEvent, Store, StoreError};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/rollouts/{id}/events", get(rollout_events))
        .route("/v1/rollouts/{id}/audit", get(rollout_audit))
}

#[derive(Debug, Serialize)]
struct AuditOut {
    items: Vec<AuditEvent>,
}

async fn rollout_audit(
    State(state): State<AppState>,
    _actor: Actor,
    Path(id): Path<String>,
) -> Result<Json<AuditOut>, ApiError> {
    state.engine.get(&id).await?;
    let items = state
        .engine
        .store()
        .audit_events(&id, 0)
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(Json(AuditOut { items }))
}

async fn rollout_events(
    State(state): State<AppState>,
    _actor: Actor,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let after = match headers.get("last-event-id") {
        None => 0,
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .ok_or_else(|| {
                ApiError::bad_request(
                    "invalid_header",
                    "Last-Event-ID must be the integer id of an event",
                )
            })?,
    };
    state.engine.get(&id).await?;
    let store = state.engine.store().clone();
    // Subscribe before the replay reads the database: nothing committed in between is lost
    // (it arrives on the bus too, and `seq` drops the duplicates).
    let bus = store.subscribe();
    let (tx, rx) = mpsc::channel::<AuditEvent>(64);
    tokio::spawn(async move {
        if let Err(e) = pump(&store, &id, after, bus, &tx).await {
            tracing::warn!(rollout.id = %id, error = %e, "event stream of {id} ended early");
        }
    });
    Ok(sse_of(rx, to_sse))
}

/// An event stream of what a pump task sends on `rx`, each item turned into an SSE event by
/// `to_sse`, with a keep-alive comment every 15 s (the rollout's and the release's streams).
pub(super) fn sse_of<T: Send + 'static>(
    mut rx: mpsc::Receiver<T>,
    to_sse: fn(&T) -> Event,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let stream = futures_util::stream::poll_fn(move |cx| {
        rx.poll_recv(cx).map(|e| e.map(|e| Ok(to_sse(&e))))
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// Whether an event ends its rollout (the rollout's own move to a terminal status).
fn is_terminal(e: &AuditEvent) -> bool {
    e.step.is_none()
        && e.kind
            .rollout_status()
            .is_some_and(RolloutStatus::is_terminal)
}

fn to_sse(e: &AuditEvent) -> Event {
    let data = serde_json::to_string(e).unwrap_or_else(|_| "{}".to_owned());
    Event::default()
        .id(e.seq.to_string())
        .event(e.kind.as_str())
        .data(data)
}

enum Sent {
    Open,
    Terminal,
    ClientGone,
}

/// Sends events with `seq > *last`, in order; tells whether the rollout ended.
async fn send_all(events: Vec<AuditEvent>, last: &mut i64, tx: &mpsc::Sender<AuditEvent>) -> Sent {
    for e in events {
        if e.seq <= *last {
            continue;
        }
        *last = e.seq;
        let terminal = is_terminal(&e);
        if tx.send(e).await.is_err() {
            return Sent::ClientGone;
        }
        if terminal {
            return Sent::Terminal;
        }
    }
    Sent::Open
}

async fn pump(
    store: &Store,
    id: &str,
    after: i64,
    mut bus: tokio::sync::broadcast::Receiver<AuditEvent>,
    tx: &mpsc::Sender<AuditEvent>,
) -> Result<(), StoreError> {
    let mut last = after;
    match send_all(store.audit_events(id, last).await?, &mut last, tx).await {
        Sent::Open => {}
        Sent::Terminal | Sent::ClientGone => return Ok(()),
    }
    // Reconnected after the end (Last-Event-ID past the terminal event): nothing will follow.
    let terminal = store
        .get_rollout(id)
        .await?
        .is_none_or(|r| r.status.is_terminal());
    if terminal {
        send_all(store.audit_events(id, last).await?, &mut last, tx).await;
        return Ok(());
    }
    loop {
        let batch = tokio::select! {
            _ = tx.closed() => return Ok(()),
            received = bus.recv() => match received {
                Ok(e) if e.rollout_id.as_deref() == Some(id) => vec![e],
                Ok(_) => continue,
                // Missed some: the database has them all.
                Err(RecvError::Lagged(_)) => store.audit_events(id, last).await?,
                Err(RecvError::Closed) => return Ok(()),
            },
        };
        match send_all(batch, &mut last, tx).await {
            Sent::Open => {}
            Sent::Terminal | Sent::ClientGone => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {

    use chrono::Utc;

    use super::*;
    use crate::domain::audit::AuditKind;
    use crate::domain::state::RolloutEvent;
    use crate::store::tests::{change, rollout};
    use crate::store::{new_id, AuditEntry};

    #[tokio::test]
    async fn a_client_that_falls_behind_the_bus_still_gets_every_event_once_in_order() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open(&dir.path().join("e.db")).await.expect("store");
        let id = new_id("ro");
        let new = rollout(&id, "h", "s", 0);
        store.create_rollout(&new, &[]).await.expect("created");
        // A reader that does not read yet: 64 events fill its channel, the bus (1024) overflows.
        let (tx, mut rx) = mpsc::channel::<AuditEvent>(64);
        let bus = store.subscribe();
        let pumping = {
            let (store, id) = (store.clone(), id.clone());
            tokio::spawn(async move { pump(&store, &id, 0, bus, &tx).await })
        };
        for n in 0..1500 {
            let note = AuditEntry::new(Utc::now(), "ops", AuditKind::RolloutResumed)
                .rollout(&id)
                .detail(serde_json::json!({"n": n}));
            store.audit(&note).await.expect("appended");
        }
        store
            .transition_rollout(&id, &change(RolloutEvent::Start, 1))
            .await
            .expect("running");
        store
            .transition_rollout(&id, &change(RolloutEvent::Succeed, 2))
            .await
            .expect("succeeded");
        let mut seqs = Vec::new();
        let mut kinds = Vec::new();
        for _ in 0..2000 {
            match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
                Ok(Some(e)) => {
                    seqs.push(e.seq);
                    kinds.push(e.kind);
                }
                Ok(None) => break,
                Err(_) => panic!("the stream stalled after {} events", seqs.len()),
            }
        }
        pumping.await.expect("join").expect("pump ends cleanly");
        assert_eq!(seqs.len(), 1 + 1500 + 2, "every event once");
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in order");
        assert_eq!(kinds.first(), Some(&AuditKind::RolloutCreated));
        assert_eq!(kinds.last(), Some(&AuditKind::RolloutSucceeded));
    }
}
