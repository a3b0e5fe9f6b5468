//! Rollout rows: creation (with its steps), transitions, abort requests, rollback links.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::audit::append;
use super::record::{AuditEntry, Rollout};
use super::write::Tx;
use super::{fmt_time, parse_opt_time, parse_time, Store, StoreError};
use crate::domain::audit::{AuditKind, ChangeDetail, LeftDown};
use crate::domain::names::{ComposeFile, ServiceName, Tag};
use crate::domain::plan::Replaces;
use crate::domain::runbook::StepKindName;
use crate::domain::state::{OnFailure, RolloutEvent, RolloutKind, RolloutStatus};

/// A rollout to create, with everything validated already.
#[derive(Debug, Clone)]
pub struct NewRollout {
    pub id: String,
    pub kind: RolloutKind,
    pub host: String,
    pub file: ComposeFile,
    pub service: ServiceName,
    pub tag: Tag,
    pub runbook: String,
    pub actor: String,
    pub reason: String,
    pub env_overrides: BTreeMap<String, String>,
    pub env_sha256: String,
    pub require_logs: Vec<String>,
    pub on_failure: OnFailure,
    pub rollback_of: Option<String>,
    pub expect_commit: Option<String>,
    pub expect_file_sha256: Option<String>,
    pub created_at: DateTime<Utc>,
    /// The compose service `plan`/`up` act on, when not `service` (the slot's key).
    pub deploy_as: Option<ServiceName>,
    /// The former service `down` acts on (a rename).
    pub replaces: Option<Replaces>,
    /// Low-traffic windows of the plan (the `window` step's, before the host's).
    pub windows: Vec<crate::domain::window::TrafficWindow>,
    /// A weights pre-stage's free space required by its plan (bytes), raising its runbook's.
    pub required_free: Option<u64>,
}

/// One step copied from the runbook.
#[derive(Debug, Clone)]
pub struct NewStep {
    pub name: String,
    pub kind: StepKindName,
}

/// A transition of a rollout's status, with what the audit trail should say about it.
#[derive(Debug, Clone)]
pub struct RolloutChange {
    pub event: RolloutEvent,
    pub actor: String,
    pub error: Option<(String, String)>,
    pub detail: ChangeDetail,
    pub at: DateTime<Utc>,
}

#[derive(sqlx::FromRow, serde::Deserialize)]
pub(super) struct RolloutRow {
    rollout_id: String,
    kind: String,
    status: String,
    host: String,
    file: String,
    service: String,
    tag: String,
    runbook: String,
    actor: String,
    reason: String,
    env_overrides: String,
    env_sha256: String,
    require_logs: String,
    on_failure: String,
    created_at: String,
    started_at: Option<String>,
    finished_at: Option<String>,
    error_code: Option<String>,
    error_message: Option<String>,
    rollback_of: Option<String>,
    expect_commit: Option<String>,
    expect_file_sha256: Option<String>,
    rolled_back_by: Option<String>,
    touched_replica: i64,
    abort_reason: Option<String>,
    deploy_as: Option<String>,
    replaces: Option<String>,
    downtime_ms: Option<i64>,
    windows: Option<String>,
    required_free: Option<i64>,
}

pub(super) fn corrupt(message: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        table: "rollout",
        message: message.to_string(),
    }
}

impl TryFrom<RolloutRow> for Rollout {
    type Error = StoreError;
    fn try_from(r: RolloutRow) -> Result<Self, StoreError> {
        Ok(Rollout {
            kind: r.kind.parse().map_err(corrupt)?,
            status: r.status.parse().map_err(corrupt)?,
            on_failure: r.on_failure.parse().map_err(corrupt)?,
            env_overrides: serde_json::from_str(&r.env_overrides).map_err(corrupt)?,
            require_logs: serde_json::from_str(&r.require_logs).map_err(corrupt)?,
            created_at: parse_time("rollout", &r.created_at)?,
            started_at: parse_opt_time("rollout", r.started_at)?,
            finished_at: parse_opt_time("rollout", r.finished_at)?,
            id: r.rollout_id,
            host: r.host,
            file: r.file.parse().map_err(corrupt)?,
            service: r.service.parse().map_err(corrupt)?,
            tag: r.tag.parse().map_err(corrupt)?,
            runbook: r.runbook,
            actor: r.actor,
            reason: r.reason,
            env_sha256: r.env_sha256,
            error_code: r.error_code,
            error_message: r.error_message,
            rollback_of: r.rollback_of,
            expect_commit: r.expect_commit,
            expect_file_sha256: r.expect_file_sha256,
            rolled_back_by: r.rolled_back_by,
            touched_replica: r.touched_replica != 0,
            abort_reason: r.abort_reason,
            deploy_as: r
                .deploy_as
                .map(|s| s.parse())
                .transpose()
                .map_err(corrupt)?,
            replaces: match r.replaces {
                Some(text) => Some(serde_json::from_str(&text).map_err(corrupt)?),
                None => None,
            },
            downtime_ms: r.downtime_ms,
            required_free: r
                .required_free
                .map(u64::try_from)
                .transpose()
                .map_err(corrupt)?,
            windows: match r.windows {
                Some(text) => serde_json::from_str(&text).map_err(corrupt)?,
                None => Vec::new(),
            },
        })
    }
}

pub(super) const SELECT_ROLLOUT: &str = "select rollout_id, kind, status, host, file, service, tag, runbook, \
    actor, reason, env_overrides, env_sha256, require_logs, on_failure, created_at, started_at, \
    finished_at, error_code, error_message, rollback_of, expect_commit, expect_file_sha256, rolled_back_by, touched_replica, \
    abort_reason, deploy_as, replaces, downtime_ms, windows, required_free from rollout";

impl Store {
    /// Creates a pending rollout and its steps, or fails `HostBusy` if the host has an active one.
    pub async fn create_rollout(
        &self,
        new: &NewRollout,
        steps: &[NewStep],
    ) -> Result<(), StoreError> {
        self.write(|mut db| async move {
            insert_rollout(&mut db, new, steps).await?;
            db.commit(()).await
        })
        .await
    }

    /// Applies a transition to a rollout (and its audit event) in one transaction.
    pub async fn transition_rollout(
        &self,
        id: &str,
        change: &RolloutChange,
    ) -> Result<Rollout, StoreError> {
        self.write(|mut db| async move {
            transition(&mut db, id, change).await?;
            let rollout = get_in(&mut db, id).await?;
            db.commit(rollout).await
        })
        .await
    }

    /// Ends a rollout whose replica was taken down and not brought back (safety rule 14): the
    /// change (error `replica_left_down`) and a `replica_left_down` audit event, which is a
    /// notification of its own, in one transaction.
    pub async fn end_with_replica_left_down(
        &self,
        id: &str,
        change: &RolloutChange,
        evidence: &LeftDown,
    ) -> Result<Rollout, StoreError> {
        self.write(|mut db| async move {
            transition(&mut db, id, change).await?;
            let entry = AuditEntry::new(change.at, &change.actor, AuditKind::ReplicaLeftDown)
                .rollout(id)
                .detail(serde_json::to_value(evidence).unwrap_or_default());
            append(&mut db, &entry).await?;
            let rollout = get_in(&mut db, id).await?;
            db.commit(rollout).await
        })
        .await
    }

    /// The replicas (host, service) whose latest finished rollout left them down, and that no
    /// rollout has brought back since; and those a rollout took down while it waits for the
    /// database to be writable again.
    pub async fn replicas_left_down(&self) -> Result<Vec<(String, String)>, StoreError> {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "select distinct r.host, r.service from rollout r \
             where r.error_code = 'replica_left_down' and not exists ( \
               select 1 from rollout n where n.host = r.host and n.service = r.service \
               and n.status = 'succeeded' and n.finished_at > r.finished_at) \
             order by r.host, r.service",
        )
        .fetch_all(self.pool())
        .await?;
        // A rollout waiting on a failing disk whose last call took its replica down: the
        // replica is down though nothing of it could be recorded yet (safety rule 18).
        let mut rows = rows;
        rows.extend(self.health().unrecorded_downs());
        rows.sort();
        rows.dedup();
        Ok(rows)
    }

    /// Fails a canary and creates the rollback that undoes it, linked both ways, atomically.
    pub async fn fail_and_roll_back(
        &self,
        canary_id: &str,
        change: &RolloutChange,
        rollback: &NewRollout,
        steps: &[NewStep],
    ) -> Result<(), StoreError> {
        self.write(|mut db| async move {
            transition(&mut db, canary_id, change).await?;
            insert_rollout(&mut db, rollback, steps).await?;
            db.query("update rollout set rolled_back_by = ? where rollout_id = ?")
                .bind(&rollback.id)
                .bind(canary_id);
            db.commit(()).await
        })
        .await
    }

    /// Links an existing rollout to the rollback created for it (manual rollback). The audit
    /// event (`rollback_linked`, on the rolled-back rollout) carries the rollback's actor, reason
    /// and request time.
    pub async fn link_rollback(&self, rolled_back: &str, rollback: &str) -> Result<(), StoreError> {
        self.write(|mut db| async move {
            let linked = db.query(
                "update rollout set rolled_back_by = ? where rollout_id = ? and rolled_back_by is null",
            )
            .bind(rollback)
            .bind(rolled_back)
            .execute()
            .await?
            .rows_affected();
            if linked > 0 {
                let by = get_in(&mut db, rollback).await?;
                let entry = AuditEntry::new(by.created_at, &by.actor, AuditKind::RollbackLinked)
                    .rollout(rolled_back)
                    .detail(serde_json::json!({"rolled_back_by": rollback, "reason": by.reason}));
                append(&mut db, &entry).await?;
            }
            db.commit(()).await
        })
        .await
    }

    /// Reads one rollout.
    pub async fn get_rollout(&self, id: &str) -> Result<Option<Rollout>, StoreError> {
        let row: Option<RolloutRow> =
            sqlx::query_as(&format!("{SELECT_ROLLOUT} where rollout_id = ?"))
                .bind(id)
                .fetch_optional(&mut *self.read().await?)
                .await?;
        row.map(Rollout::try_from).transpose()
    }

    /// The active (non-terminal) rollout of a host, if any.
    pub async fn active_rollout_on(&self, host: &str) -> Result<Option<Rollout>, StoreError> {
        let row: Option<RolloutRow> =
            sqlx::query_as(&format!("{SELECT_ROLLOUT} where active_host = ?"))
                .bind(host)
                .fetch_optional(self.pool())
                .await?;
        row.map(Rollout::try_from).transpose()
    }

    /// Every rollout that is not terminal, oldest first (restart recovery).
    pub async fn unfinished_rollouts(&self) -> Result<Vec<Rollout>, StoreError> {
        let rows: Vec<RolloutRow> = sqlx::query_as(&format!(
            "{SELECT_ROLLOUT} where active_host is not null order by created_at, rollout_id"
        ))
        .fetch_all(self.pool())
        .await?;
        rows.into_iter().map(Rollout::try_from).collect()
    }

    /// Records an abort request (the engine acts on it before its next side effect).
    pub async fn request_abort(
        &self,
        id: &str,
        actor: &str,
        reason: &str,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.write(|mut db| async move {
            let marked = db
                .query(
                    "update rollout set abort_reason = ?, abort_actor = ? \
                 where rollout_id = ? and active_host is not null",
                )
                .bind(reason)
                .bind(actor)
                .bind(id)
                .execute()
                .await?
                .rows_affected();
            if marked == 0 {
                return Err(StoreError::InvalidTransition {
                    id: id.to_owned(),
                    message: "rollout is already terminal".into(),
                });
            }
            let entry = AuditEntry::new(at, actor, AuditKind::AbortRequested)
                .rollout(id)
                .detail(serde_json::json!({"reason": reason}));
            append(&mut db, &entry).await?;
            db.commit(()).await
        })
        .await
    }

    /// The newest rollout that sent a down or up to this replica, whatever its status: what a
    /// rollback of the replica undoes. A rollout refused before its first down or up is not it.
    /// One indexed read, `limit 1`.
    pub async fn last_touching_rollout(
        &self,
        host: &str,
        service: &str,
    ) -> Result<Option<Rollout>, StoreError> {
        let row: Option<RolloutRow> = sqlx::query_as(&format!(
            "{SELECT_ROLLOUT} where host = ? and service = ? and touched_replica = 1 \
             order by created_at desc, rollout_id desc limit 1"
        ))
        .bind(host)
        .bind(service)
        .fetch_optional(self.pool())
        .await?;
        row.map(Rollout::try_from).transpose()
    }
}

/// One rollout, read inside a write transaction.
pub(super) async fn get_in(db: &mut Tx, id: &str) -> Result<Rollout, StoreError> {
    let row: Option<RolloutRow> = db
        .query(&format!("{SELECT_ROLLOUT} where rollout_id = ?"))
        .bind(id)
        .fetch_optional()
        .await?;
    row.map(Rollout::try_from)
        .transpose()?
        .ok_or_else(|| StoreError::NotFound(id.to_owned()))
}

pub(super) async fn insert_rollout(
    db: &mut Tx,
    new: &NewRollout,
    steps: &[NewStep],
) -> Result<(), StoreError> {
    let busy: Option<(String,)> = db
        .query("select rollout_id from rollout where active_host = ?")
        .bind(&new.host)
        .fetch_optional()
        .await?;
    if let Some((rollout_id,)) = busy {
        return Err(StoreError::HostBusy {
            host: new.host.clone(),
            rollout_id,
        });
    }
    let env = serde_json::to_string(&new.env_overrides).map_err(corrupt)?;
    let logs = serde_json::to_string(&new.require_logs).map_err(corrupt)?;
    let replaces = match &new.replaces {
        Some(r) => Some(serde_json::to_string(r).map_err(corrupt)?),
        None => None,
    };
    let windows = match new.windows.as_slice() {
        [] => None,
        w => Some(serde_json::to_string(w).map_err(corrupt)?),
    };
    db.query(
        "insert into rollout (rollout_id, kind, status, host, file, service, tag, runbook, actor, reason, \
         env_overrides, env_sha256, require_logs, on_failure, created_at, rollback_of, expect_commit, \
         expect_file_sha256, active_host, deploy_as, replaces, windows, required_free) \
         values (?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&new.id)
    .bind(new.kind.as_str())
    .bind(&new.host)
    .bind(new.file.as_str())
    .bind(new.service.as_str())
    .bind(new.tag.as_str())
    .bind(&new.runbook)
    .bind(&new.actor)
    .bind(&new.reason)
    .bind(env)
    .bind(&new.env_sha256)
    .bind(logs)
    .bind(new.on_failure.as_str())
    .bind(fmt_time(new.created_at))
    .bind(&new.rollback_of)
    .bind(&new.expect_commit)
    .bind(&new.expect_file_sha256)
    .bind(&new.host)
    .bind(new.deploy_as.as_deref())
    .bind(replaces)
    .bind(windows)
    .bind(new.required_free.and_then(|b| i64::try_from(b).ok()));
    for (position, step) in steps.iter().enumerate() {
        db.query(
            "insert into step (step_id, rollout_id, position, name, kind, status) values (?, ?, ?, ?, ?, 'pending')",
        )
        .bind(super::new_id("st"))
        .bind(&new.id)
        .bind(position as i64)
        .bind(&step.name)
        .bind(step.kind.as_str());
    }
    let detail = serde_json::json!({
        "kind": new.kind.as_str(), "host": new.host, "service": new.service, "file": new.file,
        "tag": new.tag, "runbook": new.runbook, "reason": new.reason,
        "env_overrides": new.env_overrides.keys().collect::<Vec<_>>(), "rollback_of": new.rollback_of,
    });
    let entry = AuditEntry::new(new.created_at, &new.actor, AuditKind::RolloutCreated)
        .rollout(&new.id)
        .states(None, Some(RolloutStatus::Pending.as_str()))
        .detail(detail);
    append(db, &entry).await
}

pub(super) async fn transition(
    db: &mut Tx,
    id: &str,
    change: &RolloutChange,
) -> Result<(), StoreError> {
    let current = get_in(db, id).await?;
    let next = current
        .status
        .apply(change.event)
        .map_err(|e| StoreError::InvalidTransition {
            id: id.to_owned(),
            message: e.to_string(),
        })?;
    let at = fmt_time(change.at);
    let (code, message) = match &change.error {
        Some((c, m)) => (Some(c.clone()), Some(m.clone())),
        None => (None, None),
    };
    db.query(
        "update rollout set status = ?, \
         started_at = coalesce(started_at, case when ? = 'running' then ? end), \
         finished_at = case when ? then ? else finished_at end, \
         active_host = case when ? then null else active_host end, \
         error_code = coalesce(?, error_code), error_message = coalesce(?, error_message), \
         downtime_ms = coalesce(?, downtime_ms) \
         where rollout_id = ?",
    )
    .bind(next.as_str())
    .bind(next.as_str())
    .bind(&at)
    .bind(next.is_terminal())
    .bind(&at)
    .bind(next.is_terminal())
    .bind(code)
    .bind(message)
    .bind(change.detail.downtime_ms)
    .bind(id);
    // An abort is carried out by canaryd but caused by whoever asked for it: the audit event
    // names them, with their reason.
    let mut actor = change.actor.clone();
    let mut detail = change.detail.clone();
    if next == RolloutStatus::Aborted {
        let (by,): (Option<String>,) = db
            .query("select abort_actor from rollout where rollout_id = ?")
            .bind(id)
            .fetch_one()
            .await?;
        if let Some(by) = by {
            actor = by;
        }
        if detail.reason.is_none() {
            detail.reason = current.abort_reason.clone();
        }
    }
    let entry = AuditEntry::new(change.at, &actor, AuditKind::rollout(next))
        .rollout(id)
        .states(Some(current.status.as_str()), Some(next.as_str()))
        .detail(serde_json::to_value(&detail).unwrap_or_default());
    append(db, &entry).await
}
