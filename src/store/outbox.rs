//! The notification outbox (migration 0006). `enqueue` runs inside the transaction of the audit
//! event that causes a notification; the notifier (`notify/`) routes each row to the
//! webhooks subscribed to it and delivers it, claiming every attempt before it is sent.

use chrono::{DateTime, Utc};
use serde_json::json;

use super::record::AuditEntry;
use super::write::Tx;
use super::{fmt_time, Store, StoreError};
use crate::domain::notification::{text, DeliveryStatus, NotifyEvent, Subject};
use crate::domain::state::RolloutKind;

/// A notification waiting to be routed to webhooks.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Unrouted {
    pub outbox_id: String,
    pub event: String,
}

/// One (notification, webhook) delivery that is due.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct DueDelivery {
    pub outbox_id: String,
    pub webhook: String,
    pub attempts: i64,
    pub event: String,
    pub payload: String,
}

/// Writes the notification `entry` causes, if any, in the caller's transaction, right after
/// `entry`'s own insert (the outbox row takes the audit event's sequence number from
/// `last_insert_rowid()`).
pub(super) async fn enqueue(db: &mut Tx, entry: &AuditEntry) -> Result<(), StoreError> {
    let Some(rollout_id) = entry.rollout_id.as_deref() else {
        return Ok(());
    };
    // Whether the event notifies at all does not depend on the rollout's kind (only its
    // name does): skip the read for the events that never notify.
    if NotifyEvent::from_audit(entry.kind, RolloutKind::Canary).is_none() {
        return Ok(());
    }
    type Row = (
        String,
        String,
        String,
        String,
        String,
        String,
        String,
        Option<String>,
        Option<String>,
        Option<String>,
    );
    let row: Option<Row> = db.query(
        "select kind, host, service, file, tag, actor, reason, rollback_of, error_code, error_message \
         from rollout where rollout_id = ?",
    )
    .bind(rollout_id)
    .fetch_optional()
    .await?;
    let Some((kind, host, service, file, tag, actor, reason, rollback_of, code, message)) = row
    else {
        return Ok(());
    };
    let rollout_kind: RolloutKind = kind.parse().map_err(|e: String| StoreError::Corrupt {
        table: "rollout",
        message: e,
    })?;
    let Some(event) = NotifyEvent::from_audit(entry.kind, rollout_kind) else {
        return Ok(());
    };
    let error = if event == NotifyEvent::StepFailed {
        let e = &entry.detail["error"];
        e["code"]
            .as_str()
            .map(|c| json!({"code": c, "message": e["message"].as_str().unwrap_or_default()}))
    } else {
        code.map(|c| json!({"code": c, "message": message.unwrap_or_default()}))
    };
    let error_line = error.as_ref().map(|e| {
        format!(
            "{}: {}",
            e["code"].as_str().unwrap_or_default(),
            e["message"].as_str().unwrap_or_default()
        )
    });
    let subject = Subject {
        rollout_id,
        kind: &kind,
        host: &host,
        service: &service,
        tag: &tag,
        actor: &actor,
        reason: &reason,
        step: entry.step.as_deref(),
        error: error_line.as_deref(),
        waiting_for: entry.detail["waiting_for"].as_str(),
    };
    let outbox_id = super::new_id("ob");
    let payload = json!({
        "id": outbox_id,
        "event": event.as_str(),
        "occurred_at": fmt_time(entry.at),
        "rollout": {
            "id": rollout_id, "kind": kind, "status": entry.to_state, "host": host,
            "service": service, "file": file, "tag": tag, "actor": actor, "reason": reason,
            "rollback_of": rollback_of,
        },
        "step": entry.step,
        "error": error,
        "text": text(event, &subject),
    });
    db.query(
        "insert into outbox (outbox_id, audit_seq, event, rollout_id, payload, created_at) \
         values (?, last_insert_rowid(), ?, ?, ?, ?)",
    )
    .bind(outbox_id)
    .bind(event.as_str())
    .bind(rollout_id)
    .bind(payload.to_string())
    .bind(fmt_time(entry.at));
    db.notified();
    Ok(())
}

impl Store {
    /// Notifications not yet routed to webhooks, oldest first (at most `limit`).
    pub async fn unrouted_notifications(&self, limit: i64) -> Result<Vec<Unrouted>, StoreError> {
        let rows = sqlx::query_as(
            "select outbox_id, event from outbox where routed_at is null \
             order by created_at, outbox_id limit ?",
        )
        .bind(limit)
        .fetch_all(&mut *self.read().await?)
        .await?;
        Ok(rows)
    }

    /// For each `(outbox_id, webhooks)` of a batch, creates a pending delivery of the
    /// notification to each of its webhooks (none: nobody listens) and marks it routed, all in
    /// one transaction (one commit for a notifier pass, not one per notification).
    pub async fn route_notifications(
        &self,
        routes: &[(&str, &[&str])],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        if routes.is_empty() {
            return Ok(());
        }
        let now = fmt_time(now);
        let now = &now;
        self.write(|mut db| async move {
            for (outbox_id, webhooks) in routes {
                for webhook in *webhooks {
                    db.query(
                        "insert or ignore into outbox_delivery (outbox_id, webhook, status, next_attempt_at) \
                         values (?, ?, 'pending', ?)",
                    )
                    .bind(outbox_id)
                    .bind(webhook)
                    .bind(now);
                }
                db.query("update outbox set routed_at = ? where outbox_id = ?")
                    .bind(now)
                    .bind(outbox_id);
            }
            db.commit(()).await
        })
        .await
    }

    /// Pending deliveries due at `now`, in the order of their audit events (at most `limit`):
    /// a rollout's notifications reach a webhook in the order they happened. Not by their
    /// time: a step's failure and its rollout's failure are often stamped the same
    /// millisecond, and ids within one millisecond are random.
    pub async fn due_deliveries(
        &self,
        now: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<DueDelivery>, StoreError> {
        let rows = sqlx::query_as(
            "select d.outbox_id, d.webhook, d.attempts, o.event, o.payload \
             from outbox_delivery d join outbox o on o.outbox_id = d.outbox_id \
             where d.status = 'pending' and d.next_attempt_at <= ? \
             order by o.audit_seq, d.outbox_id, d.webhook limit ?",
        )
        .bind(fmt_time(now))
        .bind(limit)
        .fetch_all(&mut *self.read().await?)
        .await?;
        Ok(rows)
    }

    /// When the next pending delivery is due, if any.
    pub async fn next_delivery_at(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let (next,): (Option<String>,) = sqlx::query_as(
            "select min(next_attempt_at) from outbox_delivery where status = 'pending'",
        )
        .fetch_one(&mut *self.read().await?)
        .await?;
        super::parse_opt_time("outbox_delivery", next)
    }

    /// Claims an attempt before it is sent: counts it and sets when it is retried if it is not
    /// confirmed (a crash after the send resends it then, with the same key).
    pub async fn claim_delivery(
        &self,
        outbox_id: &str,
        webhook: &str,
        now: DateTime<Utc>,
        retry_at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.write_one(
            "update outbox_delivery set attempts = attempts + 1, last_attempt_at = ?, \
             next_attempt_at = ? where outbox_id = ? and webhook = ? and status = 'pending'",
            |q| {
                q.bind(fmt_time(now))
                    .bind(fmt_time(retry_at))
                    .bind(outbox_id)
                    .bind(webhook)
            },
        )
        .await?;
        Ok(())
    }

    /// Records the outcome of an attempt: delivered (a 2xx), or the error, and whether to give up.
    pub async fn finish_delivery(
        &self,
        outbox_id: &str,
        webhook: &str,
        now: DateTime<Utc>,
        outcome: Result<(), (String, bool)>,
    ) -> Result<(), StoreError> {
        let (status, delivered_at, error) = match outcome {
            Ok(()) => (DeliveryStatus::Delivered, Some(fmt_time(now)), None),
            Err((error, true)) => (DeliveryStatus::Failed, None, Some(error)),
            Err((error, false)) => (DeliveryStatus::Pending, None, Some(error)),
        };
        self.write_one(
            "update outbox_delivery set status = ?, delivered_at = ?, last_error = ? \
             where outbox_id = ? and webhook = ? and status = 'pending'",
            |q| {
                q.bind(status.as_str())
                    .bind(delivered_at.clone())
                    .bind(error.clone())
                    .bind(outbox_id)
                    .bind(webhook)
            },
        )
        .await?;
        Ok(())
    }

    /// Deliveries by status (`pending`, `delivered`, `failed`), for checks and tests.
    pub async fn delivery_counts(&self) -> Result<Vec<(String, i64)>, StoreError> {
        let rows = sqlx::query_as(
            "select status, count(*) from outbox_delivery group by status order by status",
        )
        .fetch_all(self.pool())
        .await?;
        Ok(rows)
    }
}
