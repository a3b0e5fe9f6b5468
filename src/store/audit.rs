//! The append-only audit trail. Entries are only ever inserted, inside the transaction of the
//! change they describe; the notification an entry causes (if any) is written to the outbox in
//! that same transaction (`outbox::enqueue`).

use super::record::{AuditEntry, AuditEvent};
use super::write::Tx;
use super::{fmt_time, parse_time, Store, StoreError};

/// Inserts `e` and the notification it causes (`outbox::enqueue`) in the caller's transaction,
/// which hands the event (with the sequence number SQLite gave it) to subscribers once it
/// commits.
pub(super) async fn append(db: &mut Tx, e: &AuditEntry) -> Result<(), StoreError> {
    db.query(
        "insert into audit_event (occurred_at, rollout_id, step_name, actor, kind, from_state, to_state, detail) \
         values (?, ?, ?, ?, ?, ?, ?, ?) returning seq",
    )
    .bind(fmt_time(e.at))
    .bind(&e.rollout_id)
    .bind(&e.step)
    .bind(&e.actor)
    .bind(e.kind.as_str())
    .bind(&e.from_state)
    .bind(&e.to_state)
    .bind(e.detail.to_string());
    db.audited(e);
    super::outbox::enqueue(db, e).await
}

#[derive(sqlx::FromRow)]
struct AuditRow {
    seq: i64,
    occurred_at: String,
    rollout_id: Option<String>,
    step_name: Option<String>,
    actor: String,
    kind: String,
    from_state: Option<String>,
    to_state: Option<String>,
    detail: String,
}

/// The most events [`Store::audit_events_after`] answers at once.
pub const AUDIT_BATCH: usize = 10_000;

impl Store {
    /// Appends a standalone audit entry (a request that changed no state, e.g. a refused one).
    pub async fn audit(&self, entry: &AuditEntry) -> Result<(), StoreError> {
        self.write(|mut db| async move {
            append(&mut db, entry).await?;
            db.commit(()).await
        })
        .await
    }

    /// A rollout's audit events after `after_seq`, in order.
    pub async fn audit_events(
        &self,
        rollout_id: &str,
        after_seq: i64,
    ) -> Result<Vec<AuditEvent>, StoreError> {
        let rows: Vec<AuditRow> = sqlx::query_as(
            "select seq, occurred_at, rollout_id, step_name, actor, kind, from_state, to_state, detail \
             from audit_event where rollout_id = ? and seq > ? order by seq",
        )
        .bind(rollout_id)
        .bind(after_seq)
        .fetch_all(self.pool())
        .await?;
        to_events(rows)
    }

    /// The sequence number of the newest audit event (0 when there is none).
    pub async fn last_audit_seq(&self) -> Result<i64, StoreError> {
        let (last,): (i64,) = sqlx::query_as("select coalesce(max(seq), 0) from audit_event")
            .fetch_one(self.pool())
            .await?;
        Ok(last)
    }

    /// Every audit event after `after_seq`, in order (at most [`AUDIT_BATCH`] at a time).
    pub async fn audit_events_after(&self, after_seq: i64) -> Result<Vec<AuditEvent>, StoreError> {
        let rows: Vec<AuditRow> = sqlx::query_as(
            "select seq, occurred_at, rollout_id, step_name, actor, kind, from_state, \
             to_state, detail from audit_event where seq > ? order by seq limit ?",
        )
        .bind(after_seq)
        .bind(AUDIT_BATCH as i64)
        .fetch_all(&mut *self.read().await?)
        .await?;
        to_events(rows)
    }
}

fn to_events(rows: Vec<AuditRow>) -> Result<Vec<AuditEvent>, StoreError> {
    rows.into_iter()
        .map(|r| {
            Ok(AuditEvent {
                seq: r.seq,
                occurred_at: parse_time("audit_event", &r.occurred_at)?,
                rollout_id: r.rollout_id,
                step: r.step_name,
                actor: r.actor,
                kind: r.kind.parse().map_err(|message| StoreError::Corrupt {
                    table: "audit_event",
                    message,
                })?,
                from_state: r.from_state,
                to_state: r.to_state,
                detail: serde_json::from_str(&r.detail).unwrap_or(serde_json::Value::Null),
                step_timing: None,
            })
        })
        .collect()
}
