//! Approvals (docs/reference.md#approve): a step that waits for an operator marks itself
//! awaiting in its evidence and with an `approval_requested` event; an operator's approval is
//! an `approved` audit event naming the step, with actor and reason. The waiting step reads it
//! back, so an approval given before a restart is still there after it.

use chrono::{DateTime, Utc};

use super::audit::append;
use super::record::AuditEntry;
use super::{parse_time, Store, StoreError};
use crate::domain::audit::AuditKind;

/// An operator's approval of one step.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Approval {
    /// The step that was waiting.
    pub step: String,
    /// Who approved.
    pub actor: String,
    /// Why (never empty).
    pub reason: String,
    /// When.
    pub at: DateTime<Utc>,
}

/// The key of a step's evidence that says it is waiting for an approval.
pub const AWAITING_APPROVAL: &str = "awaiting_approval";

/// The `approval_requested` event's detail: the wait's deadline and, for a `window` step,
/// what it waits for (the notification says it).
fn approval_request(detail: &serde_json::Value) -> serde_json::Value {
    let mut event = serde_json::json!({"deadline": detail.get("deadline")});
    if let Some(waiting_for) = detail.get("waiting_for") {
        event["waiting_for"] = waiting_for.clone();
    }
    event
}

impl Store {
    /// Marks a running step as waiting for an approval: its evidence (which must carry
    /// `"awaiting_approval": true`) and an `approval_requested` event, in one transaction.
    /// Only the first call per step writes the event (a wait resumed after a restart does not
    /// ask twice).
    pub async fn request_approval(
        &self,
        rollout_id: &str,
        step_id: &str,
        step_name: &str,
        detail: &serde_json::Value,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.write(|mut db| async move {
            let (asked,): (i64,) = db.query(
                "select count(*) from audit_event where rollout_id = ? and step_name = ? and kind = ?",
            )
            .bind(rollout_id)
            .bind(step_name)
            .bind(AuditKind::ApprovalRequested.as_str())
            .fetch_one()
            .await?;
            db.query("update step set detail = ? where step_id = ? and status = 'running'")
                .bind(detail.to_string())
                .bind(step_id);
            if asked == 0 {
                let entry = AuditEntry::new(at, "canaryd", AuditKind::ApprovalRequested)
                    .rollout(rollout_id)
                    .step(step_name)
                    .detail(approval_request(detail));
                append(&mut db, &entry).await?;
            }
            db.commit(()).await
        })
        .await
    }

    /// Records an operator's approval of the step `rollout_id` is waiting on. Refused with
    /// `NotAwaitingApproval` when no running step of the rollout waits (a terminal rollout, a
    /// step that does not ask, or one already approved).
    pub async fn approve(
        &self,
        rollout_id: &str,
        actor: &str,
        reason: &str,
        at: DateTime<Utc>,
    ) -> Result<Approval, StoreError> {
        let step = self
            .write(|mut db| async move {
                let waiting: Option<(String,)> = db
                    .query(
                        "select s.name from step s join rollout r on r.rollout_id = s.rollout_id \
                     where s.rollout_id = ? and s.status = 'running' and r.active_host is not null \
                     and json_extract(s.detail, '$.awaiting_approval') = 1 \
                     and not exists (select 1 from audit_event a where a.rollout_id = s.rollout_id \
                                     and a.step_name = s.name and a.kind = ?)",
                    )
                    .bind(rollout_id)
                    .bind(AuditKind::Approved.as_str())
                    .fetch_optional()
                    .await?;
                let Some((step,)) = waiting else {
                    return Err(StoreError::NotAwaitingApproval(rollout_id.to_owned()));
                };
                let entry = AuditEntry::new(at, actor, AuditKind::Approved)
                    .rollout(rollout_id)
                    .step(&step)
                    .detail(serde_json::json!({"reason": reason}));
                append(&mut db, &entry).await?;
                db.commit(step).await
            })
            .await?;
        Ok(Approval {
            step,
            actor: actor.to_owned(),
            reason: reason.to_owned(),
            at,
        })
    }

    /// The approval of a rollout's step, if one was given.
    pub async fn approval_of(
        &self,
        rollout_id: &str,
        step_name: &str,
    ) -> Result<Option<Approval>, StoreError> {
        let row: Option<(String, String, String)> = sqlx::query_as(
            "select actor, occurred_at, coalesce(json_extract(detail, '$.reason'), '') \
             from audit_event where rollout_id = ? and step_name = ? and kind = ? \
             order by seq limit 1",
        )
        .bind(rollout_id)
        .bind(step_name)
        .bind(AuditKind::Approved.as_str())
        .fetch_optional(self.pool())
        .await?;
        row.map(|(actor, at, reason)| {
            Ok(Approval {
                step: step_name.to_owned(),
                actor,
                reason,
                at: parse_time("audit_event", &at)?,
            })
        })
        .transpose()
    }
}
