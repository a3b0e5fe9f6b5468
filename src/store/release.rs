//! Release rows: the release, its targets (each linked to its rollout in the transaction that
//! creates the rollout) and its own audit trail (`release_event`).

use chrono::{DateTime, Utc};
use sqlx::Sqlite;

use super::rollout::{insert_rollout, NewRollout, NewStep};
use super::write::Tx;
use super::{fmt_time, parse_opt_time, parse_time, Store, StoreError};
use crate::domain::release::{ReleaseEventKind, ReleaseOnFailure, ReleaseStatus, TargetOutcome};
use crate::domain::state::RolloutStatus;

mod outcome;

/// What `/metrics` counts the targets of unfinished releases by: the target's rollout's
/// status, its newest rollback's, and its outcome without a rollout.
pub type TargetStateKey = (
    Option<RolloutStatus>,
    Option<RolloutStatus>,
    Option<TargetOutcome>,
);

/// A release to create, validated.
#[derive(Debug, Clone)]
pub struct NewRelease {
    pub id: String,
    pub actor: String,
    pub reason: String,
    pub file: String,
    pub tag: String,
    pub runbook: String,
    pub max_parallel_hosts: u32,
    pub on_failure: ReleaseOnFailure,
    pub created_at: DateTime<Utc>,
    /// In release order: the canary first.
    pub targets: Vec<NewReleaseTarget>,
}

/// One target: a replica and its validated canary plan (JSON).
#[derive(Debug, Clone)]
pub struct NewReleaseTarget {
    pub host: String,
    pub service: String,
    pub plan: serde_json::Value,
}

/// A release as read back, with its targets in order.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Release {
    pub id: String,
    pub status: ReleaseStatus,
    pub actor: String,
    pub reason: String,
    pub file: String,
    pub tag: String,
    pub runbook: String,
    pub max_parallel_hosts: u32,
    pub on_failure: ReleaseOnFailure,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub error_message: Option<String>,
    pub targets: Vec<ReleaseTarget>,
}

/// A target with what its rollout (and the newest rollback of it, if any) says now.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReleaseTarget {
    pub position: u32,
    pub host: String,
    pub service: String,
    /// The validated canary plan as stored (JSON text): parsed only when the target starts,
    /// not on each of the coordinator's reads of the release.
    #[serde(skip)]
    pub plan: String,
    pub rollout_id: Option<String>,
    pub rollout_status: Option<RolloutStatus>,
    pub rollout_error: Option<String>,
    pub rollout_started_at: Option<DateTime<Utc>>,
    pub rollout_finished_at: Option<DateTime<Utc>>,
    pub rollback_id: Option<String>,
    pub rollback_status: Option<RolloutStatus>,
    /// The name of the target rollout's running step, if one runs.
    pub current_step: Option<String>,
    /// How it ended without a rollout: `already_current` or `not_started`.
    pub outcome: Option<TargetOutcome>,
    /// Its rollout's replica downtime (ms), once the rollout ended.
    pub downtime_ms: Option<i64>,
}

/// One entry of a release's audit trail.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReleaseEvent {
    pub seq: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub kind: ReleaseEventKind,
    pub from_state: Option<String>,
    pub to_state: Option<String>,
    pub reason: Option<String>,
    pub detail: serde_json::Value,
}

/// A target's rollout, or the rollback of it, ended (from its terminal audit event): what a
/// release's event stream says besides the release's own trail.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TargetEnd {
    /// The audit event's `seq`.
    pub seq: i64,
    pub at: DateTime<Utc>,
    pub position: u32,
    pub host: String,
    pub service: String,
    pub rollout_id: String,
    /// Whether it is the rollback of the target's rollout (automatic, or `rollback_release`'s).
    pub rollback: bool,
    /// `succeeded`, `failed` or `aborted`.
    pub status: String,
    pub error: Option<String>,
}

/// Filters of `list_releases` (AND), newest first.
#[derive(Debug, Clone, Default)]
pub struct ReleaseFilter {
    pub status: Option<ReleaseStatus>,
    pub tag: Option<String>,
    pub actor: Option<String>,
    pub limit: u32,
}

fn corrupt(message: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        table: "release",
        message: message.to_string(),
    }
}

type ReleaseRow = (
    String,
    String,
    String,
    String,
    String,
    String,
    String,
    i64,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
);

const SELECT_RELEASE: &str = "select release_id, status, actor, reason, file, tag, runbook, \
    max_parallel_hosts, on_failure, created_at, started_at, finished_at, error_message from release";

type TargetRow = (
    i64,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<i64>,
);

const SELECT_TARGETS: &str = "select t.position, t.host, t.service, t.plan, t.rollout_id, r.status, \
    r.error_code, r.started_at, r.finished_at, \
    (select b.rollout_id from rollout b where b.rollback_of = t.rollout_id order by b.created_at desc limit 1), \
    (select b.status from rollout b where b.rollback_of = t.rollout_id order by b.created_at desc limit 1), \
    (select s.name from step s where s.rollout_id = t.rollout_id and s.status = 'running' order by s.position limit 1), \
    t.outcome, r.downtime_ms from release_target t left join rollout r on r.rollout_id = t.rollout_id \
    where t.release_id = ? order by t.position";

fn status_of(s: Option<String>) -> Result<Option<RolloutStatus>, StoreError> {
    s.map(|s| s.parse().map_err(corrupt)).transpose()
}

impl Store {
    /// Stores a pending release and its targets, with its `release_created` event.
    pub async fn create_release(&self, new: &NewRelease) -> Result<(), StoreError> {
        self.write(|mut db| async move {
            db.query(
                "insert into release (release_id, status, actor, reason, file, tag, runbook, \
                 max_parallel_hosts, on_failure, created_at) values (?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&new.id)
            .bind(&new.actor)
            .bind(&new.reason)
            .bind(new.file.as_str())
            .bind(new.tag.as_str())
            .bind(&new.runbook)
            .bind(i64::from(new.max_parallel_hosts))
            .bind(new.on_failure.as_str())
            .bind(fmt_time(new.created_at));
            for (i, t) in new.targets.iter().enumerate() {
                db.query(
                    "insert into release_target (release_id, position, host, service, plan) values (?, ?, ?, ?, ?)",
                )
                .bind(&new.id)
                .bind(i as i64)
                .bind(&t.host)
                .bind(t.service.as_str())
                .bind(t.plan.to_string());
            }
            let detail = serde_json::json!({"targets": new.targets.len(), "tag": new.tag});
            event(
                &mut db,
                &new.id,
                new.created_at,
                &new.actor,
                ReleaseEventKind::ReleaseCreated,
                (None, Some(ReleaseStatus::Pending)),
                Some(&new.reason),
                &detail,
            )
            .await?;
            db.commit(()).await
        })
        .await
    }

    /// Reads a release and its targets.
    pub async fn get_release(&self, id: &str) -> Result<Option<Release>, StoreError> {
        let row: Option<ReleaseRow> =
            sqlx::query_as(&format!("{SELECT_RELEASE} where release_id = ?"))
                .bind(id)
                .fetch_optional(self.pool())
                .await?;
        match row {
            Some(row) => Ok(Some(self.release_of(row).await?)),
            None => Ok(None),
        }
    }

    /// Releases newest first, filtered.
    pub async fn list_releases(&self, f: &ReleaseFilter) -> Result<Vec<Release>, StoreError> {
        let mut qb = sqlx::QueryBuilder::<Sqlite>::new(SELECT_RELEASE);
        qb.push(" where 1 = 1");
        let eq = [
            ("status", f.status.map(|s| s.as_str().to_owned())),
            ("tag", f.tag.clone()),
            ("actor", f.actor.clone()),
        ];
        for (column, value) in eq {
            if let Some(v) = value {
                qb.push(format!(" and {column} = ")).push_bind(v);
            }
        }
        qb.push(" order by created_at desc, release_id desc limit ")
            .push_bind(i64::from(f.limit.max(1)));
        let rows: Vec<ReleaseRow> = qb.build_query_as().fetch_all(self.pool()).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            out.push(self.release_of(row).await?);
        }
        Ok(out)
    }

    /// Ids of the releases that are not terminal (restart recovery).
    pub async fn unfinished_releases(&self) -> Result<Vec<String>, StoreError> {
        let rows: Vec<(String,)> = sqlx::query_as(
            "select release_id from release where status not in ('succeeded', 'failed', 'aborted') \
             order by created_at",
        )
        .fetch_all(self.pool())
        .await?;
        Ok(rows.into_iter().map(|r| r.0).collect())
    }

    /// Moves a release to `to` if its status is one of `from` (else `InvalidTransition`), with
    /// its event, in one transaction. `error` is kept as the release's error message. A move to
    /// `failed` or `aborted` ends every target without a rollout `not_started` (the event's
    /// `not_started` counts them).
    #[allow(clippy::too_many_arguments)]
    pub async fn move_release(
        &self,
        id: &str,
        from: &[ReleaseStatus],
        to: ReleaseStatus,
        actor: &str,
        reason: Option<&str>,
        error: Option<&str>,
        at: DateTime<Utc>,
    ) -> Result<Release, StoreError> {
        self.write(|mut db| async move {
            let current: Option<(String,)> =
                db.query("select status from release where release_id = ?")
                    .bind(id)
                    .fetch_optional()
                    .await?;
            let Some((current,)) = current else {
                return Err(StoreError::NotFound(id.to_owned()));
            };
            let current: ReleaseStatus = current.parse().map_err(corrupt)?;
            if !from.contains(&current) {
                return Err(StoreError::InvalidTransition {
                    id: id.to_owned(),
                    message: format!("release {id} is {current}, not {to}-able"),
                });
            }
            db.query(
                "update release set status = ?, \
                 started_at = case when ? = 'running' then coalesce(started_at, ?) else started_at end, \
                 finished_at = case when ? in ('succeeded', 'failed', 'aborted') then ? else finished_at end, \
                 error_message = coalesce(?, error_message) where release_id = ?",
            )
            .bind(to.as_str())
            .bind(to.as_str())
            .bind(fmt_time(at))
            .bind(to.as_str())
            .bind(fmt_time(at))
            .bind(error)
            .bind(id);
            let mut detail = match error {
                Some(e) => serde_json::json!({"error": e}),
                None => serde_json::json!({}),
            };
            // Ended: nothing it has not started stays waiting.
            if matches!(to, ReleaseStatus::Failed | ReleaseStatus::Aborted) {
                detail["not_started"] = outcome::not_started(&mut db, id).await?.into();
            }
            event(
                &mut db,
                id,
                at,
                actor,
                ReleaseEventKind::of(current, to),
                (Some(current), Some(to)),
                reason,
                &detail,
            )
            .await?;
            db.commit(()).await
        })
        .await?;
        self.get_release(id)
            .await?
            .ok_or_else(|| StoreError::NotFound(id.to_owned()))
    }

    /// Creates a target's rollout and links it, in one transaction, only while the release is
    /// `running` and the target has no rollout yet (else `InvalidTransition`, nothing
    /// written): a target is started at most once, and never after a pause or abort committed.
    pub async fn start_release_target(
        &self,
        release_id: &str,
        position: u32,
        new: &NewRollout,
        steps: &[NewStep],
    ) -> Result<(), StoreError> {
        self.write(|mut db| async move {
            let open: Option<(i64,)> = db.query(
                "select 1 from release r join release_target t on t.release_id = r.release_id \
                 where r.release_id = ? and r.status = 'running' and t.position = ? and t.rollout_id is null \
                 and t.outcome is null",
            )
            .bind(release_id)
            .bind(i64::from(position))
            .fetch_optional()
            .await?;
            if open.is_none() {
                return Err(StoreError::InvalidTransition {
                    id: release_id.to_owned(),
                    message: format!(
                        "target {position} of release {release_id} is started or the release is not running"
                    ),
                });
            }
            insert_rollout(&mut db, new, steps).await?;
            db.query(
                "update release_target set rollout_id = ? where release_id = ? and position = ?",
            )
            .bind(&new.id)
            .bind(release_id)
            .bind(i64::from(position));
            let detail = serde_json::json!({"position": position, "host": new.host, "service": new.service, "rollout_id": new.id});
            event(
                &mut db,
                release_id,
                new.created_at,
                &new.actor,
                ReleaseEventKind::TargetStarted,
                (None, None),
                None,
                &detail,
            )
            .await?;
            db.commit(()).await
        })
        .await
    }

    /// For `/metrics`: ended releases per status, and the targets of unfinished releases per
    /// (rollout status, newest rollback's status, outcome).
    pub async fn release_metrics(
        &self,
    ) -> Result<(Vec<(String, u64)>, Vec<(TargetStateKey, i64)>), StoreError> {
        let ended: Vec<(String, i64)> = sqlx::query_as(
            "select status, count(*) from release where status in ('succeeded', 'failed', 'aborted') group by status",
        )
        .fetch_all(self.pool())
        .await?;
        // (rollout status, newest rollback's status, outcome, count)
        type Row = (Option<String>, Option<String>, Option<String>, i64);
        let rows: Vec<Row> = sqlx::query_as(
            "select r.status, (select b.status from rollout b where b.rollback_of = t.rollout_id              order by b.created_at desc limit 1) as rb, t.outcome, count(*) from release_target t              join release x on x.release_id = t.release_id              left join rollout r on r.rollout_id = t.rollout_id              where x.status not in ('succeeded', 'failed', 'aborted') group by r.status, rb, t.outcome",
        )
        .fetch_all(self.pool())
        .await?;
        let mut targets = Vec::with_capacity(rows.len());
        for (status, rollback, outcome, n) in rows {
            let key = (
                status_of(status)?,
                status_of(rollback)?,
                outcome::outcome_of(outcome)?,
            );
            targets.push((key, n));
        }
        let ended = ended
            .into_iter()
            .map(|(s, n)| (s, u64::try_from(n).unwrap_or(0)))
            .collect();
        Ok((ended, targets))
    }

    /// Records that the rollback of a target was created (`rollback_release`).
    pub async fn release_target_rolled_back(
        &self,
        release_id: &str,
        position: u32,
        rollback_id: &str,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let detail = &serde_json::json!({"position": position, "rollout_id": rollback_id});
        self.write(|mut db| async move {
            event(
                &mut db,
                release_id,
                at,
                crate::domain::release::SYSTEM_ACTOR,
                ReleaseEventKind::TargetRollbackStarted,
                (None, None),
                None,
                detail,
            )
            .await?;
            db.commit(()).await
        })
        .await
    }

    /// A release's audit trail, oldest first.
    pub async fn release_events(&self, id: &str) -> Result<Vec<ReleaseEvent>, StoreError> {
        self.release_events_after(id, 0).await
    }

    /// The ends of a release's target rollouts and of their rollbacks whose audit event's `seq`
    /// is above `after_seq`, in `seq` order.
    pub async fn release_target_ends(
        &self,
        id: &str,
        after_seq: i64,
    ) -> Result<Vec<TargetEnd>, StoreError> {
        type Row = (
            i64,
            String,
            i64,
            String,
            String,
            String,
            i64,
            String,
            Option<String>,
        );
        // Two arms (the rollout, its rollbacks) so each joins through an index.
        let rows: Vec<Row> = sqlx::query_as(
            "select a.seq, a.occurred_at, t.position, t.host, t.service, r.rollout_id, 0, a.to_state, r.error_code \
             from release_target t join rollout r on r.rollout_id = t.rollout_id \
             join audit_event a on a.rollout_id = r.rollout_id \
             where t.release_id = ?1 and a.seq > ?2 and a.step_name is null \
             and a.to_state in ('succeeded', 'failed', 'aborted') \
             union all \
             select a.seq, a.occurred_at, t.position, t.host, t.service, r.rollout_id, 1, a.to_state, r.error_code \
             from release_target t join rollout r on r.rollback_of = t.rollout_id \
             join audit_event a on a.rollout_id = r.rollout_id \
             where t.release_id = ?1 and a.seq > ?2 and a.step_name is null \
             and a.to_state in ('succeeded', 'failed', 'aborted') \
             order by 1",
        )
        .bind(id)
        .bind(after_seq)
        .fetch_all(self.pool())
        .await?;
        rows.into_iter()
            .map(|r| {
                Ok(TargetEnd {
                    seq: r.0,
                    at: parse_time("audit_event", &r.1)?,
                    position: u32::try_from(r.2).map_err(corrupt)?,
                    host: r.3,
                    service: r.4,
                    rollout_id: r.5,
                    rollback: r.6 != 0,
                    status: r.7,
                    error: r.8,
                })
            })
            .collect()
    }

    /// A release's audit trail after `after_seq`, oldest first.
    pub async fn release_events_after(
        &self,
        id: &str,
        after_seq: i64,
    ) -> Result<Vec<ReleaseEvent>, StoreError> {
        type Row = (
            i64,
            String,
            String,
            String,
            Option<String>,
            Option<String>,
            Option<String>,
            String,
        );
        let rows: Vec<Row> = sqlx::query_as(
            "select seq, occurred_at, actor, kind, from_state, to_state, reason, detail \
             from release_event where release_id = ? and seq > ? order by seq",
        )
        .bind(id)
        .bind(after_seq)
        .fetch_all(self.pool())
        .await?;
        rows.into_iter()
            .map(|r| {
                Ok(ReleaseEvent {
                    seq: r.0,
                    at: parse_time("release_event", &r.1)?,
                    actor: r.2,
                    kind: r.3.parse().map_err(corrupt)?,
                    from_state: r.4,
                    to_state: r.5,
                    reason: r.6,
                    detail: serde_json::from_str(&r.7).map_err(corrupt)?,
                })
            })
            .collect()
    }

    async fn release_of(&self, r: ReleaseRow) -> Result<Release, StoreError> {
        let rows: Vec<TargetRow> = sqlx::query_as(SELECT_TARGETS)
            .bind(&r.0)
            .fetch_all(self.pool())
            .await?;
        let mut targets = Vec::with_capacity(rows.len());
        for t in rows {
            targets.push(ReleaseTarget {
                position: u32::try_from(t.0).map_err(corrupt)?,
                host: t.1,
                service: t.2,
                plan: t.3,
                rollout_id: t.4,
                rollout_status: status_of(t.5)?,
                rollout_error: t.6,
                rollout_started_at: parse_opt_time("rollout", t.7)?,
                rollout_finished_at: parse_opt_time("rollout", t.8)?,
                rollback_id: t.9,
                rollback_status: status_of(t.10)?,
                current_step: t.11,
                outcome: outcome::outcome_of(t.12)?,
                downtime_ms: t.13,
            });
        }
        Ok(Release {
            status: r.1.parse().map_err(corrupt)?,
            max_parallel_hosts: u32::try_from(r.7).map_err(corrupt)?,
            on_failure: r.8.parse().map_err(corrupt)?,
            created_at: parse_time("release", &r.9)?,
            started_at: parse_opt_time("release", r.10)?,
            finished_at: parse_opt_time("release", r.11)?,
            error_message: r.12,
            id: r.0,
            actor: r.2,
            reason: r.3,
            file: r.4,
            tag: r.5,
            runbook: r.6,
            targets,
        })
    }
}

#[allow(clippy::too_many_arguments)]
async fn event(
    db: &mut Tx,
    release_id: &str,
    at: DateTime<Utc>,
    actor: &str,
    kind: ReleaseEventKind,
    states: (Option<ReleaseStatus>, Option<ReleaseStatus>),
    reason: Option<&str>,
    detail: &serde_json::Value,
) -> Result<(), StoreError> {
    db.query(
        "insert into release_event (release_id, occurred_at, actor, kind, from_state, to_state, reason, detail) \
         values (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(release_id)
    .bind(fmt_time(at))
    .bind(actor)
    .bind(kind.as_str())
    .bind(states.0.map(ReleaseStatus::as_str))
    .bind(states.1.map(ReleaseStatus::as_str))
    .bind(reason)
    .bind(detail.to_string());
    Ok(())
}
