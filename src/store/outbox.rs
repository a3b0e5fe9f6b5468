//! The notification outbox (migration 0006). `enqueue` runs inside the transaction of the audit
//! event that causes a notification; the notifier (`notify/`) routes each row to the
//! webhooks subscribed to it and delivers it, claiming every attempt before it is sent.

use chrono::{DateTime, Utc};
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::json;

use super::record::AuditEntry;
use super::{fmt_time, Store, StoreError};
use crate::domain::notification::{text, DeliveryStatus, NotifyEvent, Subject};
use crate::domain::state::RolloutKind;

/// A notification waiting to be routed to webhooks.
#[derive(Debug, Clone)]
pub struct Unrouted {
    pub outbox_id: String,
    pub event: String,
}

/// One (notification, webhook) delivery that is due.
#[derive(Debug, Clone)]
pub struct DueDelivery {
    pub outbox_id: String,
    pub webhook: String,
    pub attempts: i64,
    pub event: String,
    pub payload: String,
}

/// Writes the notification `entry` causes, if any, in the caller's transaction. `seq` is the
/// audit event's sequence number.
pub(super) fn enqueue(db: &Connection, seq: i64, entry: &AuditEntry) -> Result<(), StoreError> {
    let Some(rollout_id) = entry.rollout_id.as_deref() else {
        return Ok(());
    };
    // Whether the event notifies at all does not depend on the rollout's kind (only its
    // name does): skip the read for the events that never notify.
    if NotifyEvent::from_audit(entry.kind, RolloutKind::Canary).is_none() {
        return Ok(());
    }
    let row = db
        .prepare_cached(
            "select kind, host, service, file, tag, actor, reason, rollback_of, error_code, error_message \
             from rollout where rollout_id = ?",
        )?
        .query_row([rollout_id], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, String>(5)?,
                r.get::<_, String>(6)?,
                r.get::<_, Option<String>>(7)?,
                r.get::<_, Option<String>>(8)?,
                r.get::<_, Option<String>>(9)?,
            ))
        })
        .optional()?;
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
    db.prepare_cached(
        "insert into outbox (outbox_id, audit_seq, event, rollout_id, payload, created_at) \
         values (?, ?, ?, ?, ?, ?)",
    )?
    .execute(params![
        outbox_id,
        seq,
        event.as_str(),
        rollout_id,
        payload.to_string(),
        fmt_time(entry.at),
    ])?;
    Ok(())
}

impl Store {
    /// Notifications not yet routed to webhooks, oldest first (at most `limit`).
    pub async fn unrouted_notifications(&self, limit: i64) -> Result<Vec<Unrouted>, StoreError> {
        self.read_rows(
            "select outbox_id, event from outbox where routed_at is null \
             order by created_at, outbox_id limit ?",
            [limit],
            |r| {
                Ok(Unrouted {
                    outbox_id: r.get(0)?,
                    event: r.get(1)?,
                })
            },
        )
        .await
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
        self.write(|db| {
            let mut deliver = db.prepare_cached(
                "insert or ignore into outbox_delivery (outbox_id, webhook, status, next_attempt_at) \
                 values (?, ?, 'pending', ?)",
            )?;
            let mut routed =
                db.prepare_cached("update outbox set routed_at = ? where outbox_id = ?")?;
            for (outbox_id, webhooks) in routes {
                for webhook in *webhooks {
                    deliver.execute(params![outbox_id, webhook, now])?;
                }
                routed.execute(params![now, outbox_id])?;
            }
            Ok(())
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
        self.read_rows(
            "select d.outbox_id, d.webhook, d.attempts, o.event, o.payload \
             from outbox_delivery d join outbox o on o.outbox_id = d.outbox_id \
             where d.status = 'pending' and d.next_attempt_at <= ? \
             order by o.audit_seq, d.outbox_id, d.webhook limit ?",
            (fmt_time(now), limit),
            |r| {
                Ok(DueDelivery {
                    outbox_id: r.get(0)?,
                    webhook: r.get(1)?,
                    attempts: r.get(2)?,
                    event: r.get(3)?,
                    payload: r.get(4)?,
                })
            },
        )
        .await
    }

    /// When the next pending delivery is due, if any.
    pub async fn next_delivery_at(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let next: Option<String> = self
            .read(|db| {
                Ok(db
                    .prepare_cached(
                        "select min(next_attempt_at) from outbox_delivery where status = 'pending'",
                    )?
                    .query_row([], |r| r.get(0))?)
            })
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
            (fmt_time(now), fmt_time(retry_at), outbox_id, webhook),
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
            (status.as_str(), delivered_at, error, outbox_id, webhook),
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
