//! `GET /v1/releases/{id}/events`: a release's events as Server-Sent Events, like a rollout's
//! (`http/event.rs`): the past replayed (after `Last-Event-ID`), then live ones until the
//! release has ended and none of its target rollouts (nor their rollbacks) still runs.
//!
//! Two sources make one stream: the release's own trail (`release_event`: created, running,
//! paused, resumed, aborted, succeeded, failed, `target_started`, `target_rollback_started`,
//! `target_already_current`)
//! and the ends of its targets' rollouts and their rollbacks (`target_ended`,
//! `target_rollback_ended`, read from their terminal audit events). An event's id is the pair
//! of cursors `RELEASE_SEQ:AUDIT_SEQ`, so a reconnecting client resumes both. The stream is
//! woken by the store's bus (every committed audit event) and at least every [`TICK`]: a
//! release's own events are not on the bus.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, Sse};
use chrono::{DateTime, Utc};
use futures_util::Stream;
use serde::Serialize;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;

use super::super::{Actor, ApiError, AppState};
use crate::store::{AuditEvent, ReleaseEvent, Store, StoreError, TargetEnd};

/// The longest the stream waits before reading the release again when no audit event wakes
/// it: a release's own events (pause, resume, abort) are not on the bus.
const TICK: Duration = Duration::from_millis(250);

/// Where a client is in the two sources: the last `release_event.seq` and the last
/// `audit_event.seq` it was sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Cursor {
    release: i64,
    audit: i64,
}

impl Cursor {
    fn parse(s: &str) -> Option<Cursor> {
        let (release, audit) = s.trim().split_once(':')?;
        Some(Cursor {
            release: release.parse().ok().filter(|n| *n >= 0)?,
            audit: audit.parse().ok().filter(|n| *n >= 0)?,
        })
    }

    fn id(self) -> String {
        format!("{}:{}", self.release, self.audit)
    }
}

/// One event of the stream, as its `data` (JSON).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StreamEvent {
    pub release_id: String,
    pub at: DateTime<Utc>,
    pub kind: String,
    /// The release's own events: who, and why (pause, resume, abort).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_state: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to_state: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `target_ended` / `target_rollback_ended`: the target, its rollout, how it ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<TargetEnd>,
    pub detail: serde_json::Value,
    #[serde(skip)]
    cursor: Cursor,
}

fn of_release(id: &str, e: ReleaseEvent, cursor: Cursor) -> StreamEvent {
    StreamEvent {
        release_id: id.to_owned(),
        at: e.at,
        kind: e.kind.as_str().to_owned(),
        actor: Some(e.actor),
        from_state: e.from_state,
        to_state: e.to_state,
        reason: e.reason,
        target: None,
        detail: e.detail,
        cursor: Cursor {
            release: e.seq,
            ..cursor
        },
    }
}

fn of_target(id: &str, t: TargetEnd, cursor: Cursor) -> StreamEvent {
    let kind = if t.rollback {
        "target_rollback_ended"
    } else {
        "target_ended"
    };
    StreamEvent {
        release_id: id.to_owned(),
        at: t.at,
        kind: kind.to_owned(),
        actor: None,
        from_state: None,
        to_state: None,
        reason: None,
        cursor: Cursor {
            audit: t.seq,
            ..cursor
        },
        target: Some(t),
        detail: serde_json::json!({}),
    }
}

/// Everything after `cursor`, both sources merged by time (a release's event first on a
/// tie); each event's cursor covers everything sent before it.
pub(crate) async fn events_after(
    store: &Store,
    id: &str,
    cursor: Cursor,
) -> Result<Vec<StreamEvent>, StoreError> {
    let mut own = store
        .release_events_after(id, cursor.release)
        .await?
        .into_iter()
        .peekable();
    let mut ends = store
        .release_target_ends(id, cursor.audit)
        .await?
        .into_iter()
        .peekable();
    let mut out = Vec::new();
    let mut at = cursor;
    loop {
        let own_first = match (own.peek(), ends.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(a), Some(b)) => a.at <= b.at,
        };
        let e = if own_first {
            own.next().map(|e| of_release(id, e, at))
        } else {
            ends.next().map(|t| of_target(id, t, at))
        };
        if let Some(e) = e {
            at = e.cursor;
            out.push(e);
        }
    }
    Ok(out)
}

/// Whether nothing more can happen: the release ended and none of its targets' rollouts or
/// rollbacks still runs.
async fn finished(store: &Store, id: &str) -> Result<bool, StoreError> {
    let Some(r) = store.get_release(id).await? else {
        return Ok(true);
    };
    let open = |s: Option<crate::domain::state::RolloutStatus>| s.is_some_and(|s| !s.is_terminal());
    Ok(r.status.is_terminal()
        && !r
            .targets
            .iter()
            .any(|t| open(t.rollout_status) || open(t.rollback_status)))
}

pub(super) async fn release_events(
    State(state): State<AppState>,
    _actor: Actor,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let after = match headers.get("last-event-id") {
        None => Cursor::default(),
        Some(v) => v.to_str().ok().and_then(Cursor::parse).ok_or_else(|| {
            ApiError::bad_request(
                "invalid_header",
                "Last-Event-ID must be the id of an event of this stream (RELEASE_SEQ:AUDIT_SEQ)",
            )
        })?,
    };
    state.engine.get_release(&id).await?;
    let store = state.engine.store().clone();
    let (tx, rx) = mpsc::channel::<StreamEvent>(64);
    tokio::spawn(async move {
        if let Err(e) = pump(&store, &id, after, &tx).await {
            tracing::warn!(release.id = %id, error = %e, "event stream of {id} ended early");
        }
    });
    Ok(super::super::event::sse_of(rx, to_sse))
}

fn to_sse(e: &StreamEvent) -> Event {
    let data = serde_json::to_string(e).unwrap_or_else(|_| "{}".to_owned());
    Event::default()
        .id(e.cursor.id())
        .event(e.kind.as_str())
        .data(data)
}

/// Waits for a rollout's own event (not a step's): only those end a target. A closed bus
/// never wakes (the tick paces the stream).
async fn rollout_moved(bus: &mut broadcast::Receiver<AuditEvent>) {
    loop {
        match bus.recv().await {
            Ok(e) if e.step.is_none() => return,
            Ok(_) => {}
            Err(RecvError::Lagged(_)) => return,
            Err(RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}

pub(crate) async fn pump(
    store: &Store,
    id: &str,
    after: Cursor,
    tx: &mpsc::Sender<StreamEvent>,
) -> Result<(), StoreError> {
    // Subscribe before the first read: nothing committed in between is missed.
    let mut bus = store.subscribe();
    let mut cursor = after;
    loop {
        // The state first, then the events: when it says finished, every event that made it
        // so is committed and read below.
        let done = finished(store, id).await?;
        for e in events_after(store, id, cursor).await? {
            cursor = e.cursor;
            if tx.send(e).await.is_err() {
                return Ok(());
            }
        }
        if done {
            return Ok(());
        }
        // A rollout's own event (a status change; or a lag) means "look again"; so does time.
        tokio::select! {
            _ = tx.closed() => return Ok(()),
            _ = tokio::time::timeout(TICK, rollout_moved(&mut bus)) => {},
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Cursor;

    #[test]
    fn an_event_id_is_the_pair_of_cursors_and_nothing_else_parses() {
        let c = Cursor {
            release: 3,
            audit: 70,
        };
        assert_eq!(c.id(), "3:70");
        assert_eq!(Cursor::parse(&c.id()), Some(c));
        assert_eq!(Cursor::parse(" 0:0 "), Some(Cursor::default()));
        for bad in ["70", "3:", ":70", "-1:70", "3:x", "3:70:1", ""] {
            assert_eq!(Cursor::parse(bad), None, "{bad:?}");
        }
    }
}
