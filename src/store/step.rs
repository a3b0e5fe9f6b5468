//! Step rows and the write-ahead attempt records of compose calls.

use chrono::{DateTime, Utc};

use super::audit::append;
use super::record::{AuditEntry, Step, StepAttempt, StepTiming};
use super::write::{Stmt, Tx};
use super::{fmt_time, new_id, parse_opt_time, parse_time, Store, StoreError};
use crate::domain::audit::AuditKind;
use crate::domain::state::{AttemptOutcome, StepEvent, StepStatus};

#[derive(sqlx::FromRow, serde::Deserialize)]
pub(super) struct StepRow {
    step_id: String,
    rollout_id: String,
    position: i64,
    name: String,
    kind: String,
    status: String,
    attempts: i64,
    started_at: Option<String>,
    finished_at: Option<String>,
    deadline_at: Option<String>,
    detail: String,
}

/// A rollout's steps in runbook order; the attempts counted as the larger of the stored
/// counter and the attempt rows.
const SELECT_STEPS: &str = "select step_id, rollout_id, position, name, kind, status, \
     max(attempts, (select count(*) from step_attempt a where a.step_id = step.step_id)) as attempts, \
     started_at, finished_at, deadline_at, detail from step where rollout_id = ? order by position";

impl TryFrom<StepRow> for Step {
    type Error = StoreError;
    fn try_from(r: StepRow) -> Result<Self, StoreError> {
        let corrupt = |m: String| StoreError::Corrupt {
            table: "step",
            message: m,
        };
        Ok(Step {
            status: r
                .status
                .parse::<StepStatus>()
                .map_err(|e| corrupt(e.to_string()))?,
            detail: serde_json::from_str(&r.detail).map_err(|e| corrupt(e.to_string()))?,
            started_at: parse_opt_time("step", r.started_at)?,
            finished_at: parse_opt_time("step", r.finished_at)?,
            deadline_at: parse_opt_time("step", r.deadline_at)?,
            id: r.step_id,
            rollout_id: r.rollout_id,
            position: r.position,
            name: r.name,
            kind: r.kind.parse().map_err(corrupt)?,
            attempts: r.attempts,
        })
    }
}

#[derive(sqlx::FromRow)]
struct AttemptRow {
    attempt_id: String,
    step_id: String,
    rollout_id: String,
    n: i64,
    endpoint: String,
    started_at: String,
    finished_at: Option<String>,
    outcome: Option<String>,
    detail: String,
}

impl Store {
    /// The steps of a rollout in runbook order.
    pub async fn steps(&self, rollout_id: &str) -> Result<Vec<Step>, StoreError> {
        let rows: Vec<StepRow> = sqlx::query_as(SELECT_STEPS)
            .bind(rollout_id)
            .fetch_all(&mut *self.read().await?)
            .await?;
        rows.into_iter().map(Step::try_from).collect()
    }

    /// One step's kind, position and times, without its detail (what the metrics need per
    /// step event: the detail can be a whole `docker ps` snapshot or a dry run's plan).
    pub async fn step_timing(
        &self,
        rollout_id: &str,
        name: &str,
    ) -> Result<Option<StepTiming>, StoreError> {
        let row: Option<(i64, String, Option<String>, Option<String>)> = sqlx::query_as(
            "select position, kind, started_at, finished_at from step \
             where rollout_id = ? and name = ?",
        )
        .bind(rollout_id)
        .bind(name)
        .fetch_optional(&mut *self.read().await?)
        .await?;
        let Some((position, kind, started_at, finished_at)) = row else {
            return Ok(None);
        };
        Ok(Some(StepTiming {
            position,
            kind: kind.parse().map_err(|e: String| StoreError::Corrupt {
                table: "step",
                message: e,
            })?,
            started_at: parse_opt_time("step", started_at)?,
            finished_at: parse_opt_time("step", finished_at)?,
        }))
    }

    /// The steps of several rollouts (a listing page) in one query, by rollout id. SQLite
    /// hands them over as one JSON array: one value instead of hundreds of rows.
    pub async fn steps_of(
        &self,
        rollout_ids: &[String],
    ) -> Result<std::collections::HashMap<String, Vec<Step>>, StoreError> {
        let ids = serde_json::Value::from(rollout_ids.to_vec()).to_string();
        let (json,): (String,) = sqlx::query_as(
            "select coalesce(json_group_array(json_object('step_id', step_id, 'rollout_id', rollout_id, \
             'position', position, 'name', name, 'kind', kind, 'status', status, \
             'attempts', max(attempts, (select count(*) from step_attempt a where a.step_id = step.step_id)), \
             'started_at', started_at, 'finished_at', finished_at, 'deadline_at', deadline_at, \
             'detail', detail) order by rollout_id, position), '[]') \
             from step where rollout_id in (select value from json_each(?))",
        )
        .bind(ids)
        .fetch_one(self.pool())
        .await?;
        let rows: Vec<StepRow> = serde_json::from_str(&json).map_err(|e| StoreError::Corrupt {
            table: "step",
            message: e.to_string(),
        })?;
        let mut out: std::collections::HashMap<String, Vec<Step>> = Default::default();
        for row in rows {
            let step = Step::try_from(row)?;
            out.entry(step.rollout_id.clone()).or_default().push(step);
        }
        Ok(out)
    }

    /// Moves a step to a new status, writing its detail and an audit event in one transaction.
    /// `deadline` is kept once set (a resumed wait keeps its original deadline).
    pub async fn transition_step(
        &self,
        step: &Step,
        event: StepEvent,
        detail: &serde_json::Value,
        deadline: Option<DateTime<Utc>>,
        at: DateTime<Utc>,
    ) -> Result<StepStatus, StoreError> {
        self.write(|mut db| async move {
            let status = transition_in(&mut db, step, event, detail, deadline, at, false)
                .await?
                // Never `None`: only a start guarded by the abort check answers it.
                .ok_or_else(|| StoreError::Corrupt {
                    table: "step",
                    message: format!("step {}: no transition made", step.name),
                })?;
            db.commit(status).await
        })
        .await
    }

    /// One step boundary in one write transaction: `done` succeeds with `detail`, then, when
    /// `next` is given and its rollout has no abort requested (read in the same transaction),
    /// `next` starts with its deadline. Both changes carry their own audit event, exactly as
    /// two `transition_step` calls would, but the writer lock is taken, and the WAL synced,
    /// once per boundary instead of twice. The abort check rides in `next`'s
    /// update (`transition_in`'s `unless_abort_requested`), read apart only when that update
    /// changed nothing. True when `next` was started.
    pub async fn succeed_step_and_start_next(
        &self,
        done: &Step,
        detail: &serde_json::Value,
        next: Option<(&Step, Option<DateTime<Utc>>)>,
        at: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.write(|mut db| async move {
            transition_in(&mut db, done, StepEvent::Succeed, detail, None, at, false).await?;
            let Some((next, deadline)) = next else {
                return db.commit(false).await;
            };
            let empty = serde_json::json!({});
            let started =
                transition_in(&mut db, next, StepEvent::Start, &empty, deadline, at, true)
                    .await?
                    .is_some();
            db.commit(started).await
        })
        .await
    }

    /// Replaces a running step's evidence (progress of a wait); no state change, no audit.
    pub async fn update_step_detail(
        &self,
        step_id: &str,
        detail: &serde_json::Value,
    ) -> Result<(), StoreError> {
        self.write_one("update step set detail = ? where step_id = ?", |q| {
            q.bind(detail.to_string()).bind(step_id)
        })
        .await?;
        Ok(())
    }

    /// Moves a running step's deadline later (a resumed `soak` or `analyze` that watches again
    /// what nobody watched); an earlier `deadline` changes nothing.
    pub async fn extend_step_deadline(
        &self,
        step_id: &str,
        deadline: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.write_one(
            "update step set deadline_at = ? where step_id = ? and status = 'running' \
             and (deadline_at is null or deadline_at < ?)",
            |q| {
                q.bind(fmt_time(deadline))
                    .bind(step_id)
                    .bind(fmt_time(deadline))
            },
        )
        .await?;
        Ok(())
    }

    /// Write-ahead: records that a compose call is about to be sent, and commits, before the call.
    /// The attempt's number (`n`, from 1 per step) is counted by the insert itself. With
    /// `touches` (the call names the rollout's replica), the same transaction marks the
    /// rollout as having touched it (`touched_replica`, what decides a rollback or
    /// `replica_left_down` at its end): the mark is never missing for a call written ahead.
    pub async fn begin_attempt(
        &self,
        step: &Step,
        endpoint: &str,
        at: DateTime<Utc>,
        touches: bool,
    ) -> Result<String, StoreError> {
        let id = new_id("att");
        let id_ref = &id;
        self.write(|mut db| async move {
            if touches {
                db.query("update rollout set touched_replica = 1 where rollout_id = ?")
                    .bind(&step.rollout_id);
            }
            db.query(
                "insert into step_attempt (attempt_id, step_id, rollout_id, n, endpoint, started_at) \
                 select ?, ?, ?, count(*) + 1, ?, ? from step_attempt where step_id = ?",
            )
            .bind(id_ref)
            .bind(&step.id)
            .bind(&step.rollout_id)
            .bind(endpoint)
            .bind(fmt_time(at))
            .bind(&step.id);
            db.commit(()).await
        })
        .await?;
        Ok(id)
    }

    /// Records the outcome of a compose call.
    pub async fn finish_attempt(
        &self,
        attempt_id: &str,
        outcome: AttemptOutcome,
        detail: &serde_json::Value,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.write_one(
            "update step_attempt set outcome = ?, detail = ?, finished_at = ? where attempt_id = ?",
            |q| {
                q.bind(outcome.as_str())
                    .bind(detail.to_string())
                    .bind(fmt_time(at))
                    .bind(attempt_id)
            },
        )
        .await?;
        Ok(())
    }

    /// Every attempt of a rollout, oldest first.
    pub async fn attempts(&self, rollout_id: &str) -> Result<Vec<StepAttempt>, StoreError> {
        let rows: Vec<AttemptRow> = sqlx::query_as(
            "select attempt_id, step_id, rollout_id, n, endpoint, started_at, finished_at, \
             outcome, detail from step_attempt where rollout_id = ? order by started_at, n",
        )
        .bind(rollout_id)
        .fetch_all(&mut *self.read().await?)
        .await?;
        rows.into_iter()
            .map(|r| {
                Ok(StepAttempt {
                    started_at: parse_time("step_attempt", &r.started_at)?,
                    finished_at: parse_opt_time("step_attempt", r.finished_at)?,
                    detail: serde_json::from_str(&r.detail).unwrap_or(serde_json::Value::Null),
                    id: r.attempt_id,
                    step_id: r.step_id,
                    rollout_id: r.rollout_id,
                    n: r.n,
                    endpoint: r.endpoint,
                    outcome: r
                        .outcome
                        .map(|o| o.parse::<AttemptOutcome>())
                        .transpose()
                        .map_err(|message| StoreError::Corrupt {
                            table: "step_attempt",
                            message,
                        })?,
                })
            })
            .collect()
    }
}

/// A step's status change, its detail and its audit event, inside the caller's transaction.
///
/// The status the caller's row says (`step.status`) is tried first, in the update's `where`:
/// when the database agrees, the change costs one statement instead of a read and a write.
/// When it does not (a caller holding an older copy of the row), nothing was
/// written and the status is read, as the only source of truth: the transition is judged from
/// it, exactly as strictly (`InvalidTransition`, `Corrupt`, a missing row's error), and the
/// update is made from it.
///
/// In a transaction's first try the status the caller's row says is taken as the database's
/// without waiting for the update's answer: the update is queued with a check that it changed
/// the row ([`Tx::expect_one_changed`]), and the audit event after it, so a step boundary goes
/// to the database in one send with its `COMMIT`. When the check fails, the transaction is
/// rolled back and run again, carefully ([`Tx::careful`]): the update's answer is awaited and
/// the status read as above.
///
/// With `unless_abort_requested`, the update also requires that the step's rollout has no
/// abort requested, and `None` (nothing written) answers a rollout that has one: when the
/// update changes nothing, the abort request is read before the status, so a requested
/// abort wins over the status check, as when it was read first. `None` never answers
/// without it.
async fn transition_in(
    db: &mut Tx,
    step: &Step,
    event: StepEvent,
    detail: &serde_json::Value,
    deadline: Option<DateTime<Utc>>,
    at: DateTime<Utc>,
    unless_abort_requested: bool,
) -> Result<Option<StepStatus>, StoreError> {
    let detail_s = detail.to_string();
    let at_s = fmt_time(at);
    let deadline_s = deadline.map(fmt_time);
    let mut changed = None;
    if let Ok(next) = step.status.apply(event) {
        let careful = db.careful();
        let update = update_step(
            db,
            step,
            step.status,
            next,
            &detail_s,
            &at_s,
            &deadline_s,
            unless_abort_requested,
        );
        if careful {
            if update.execute().await?.rows_affected() == 1 {
                changed = Some((step.status, next));
            }
        } else {
            // Left queued: the guard after it fails the transaction if it changed nothing.
            db.expect_one_changed();
            append(db, &step_entry(step, step.status, next, detail, at)).await?;
            return Ok(Some(next));
        }
    }
    let (current, next) = match changed {
        Some(change) => change,
        None => {
            if unless_abort_requested {
                let (abort_requested,): (bool,) = db
                    .query("select abort_reason is not null from rollout where rollout_id = ?")
                    .bind(&step.rollout_id)
                    .fetch_one()
                    .await?;
                if abort_requested {
                    return Ok(None);
                }
            }
            let (status,): (String,) = db
                .query("select status from step where step_id = ?")
                .bind(&step.id)
                .fetch_one()
                .await?;
            let current = status
                .parse::<StepStatus>()
                .map_err(|e| StoreError::Corrupt {
                    table: "step",
                    message: e.to_string(),
                })?;
            let next = current
                .apply(event)
                .map_err(|e| StoreError::InvalidTransition {
                    id: step.id.clone(),
                    message: format!("step {}: {e}", step.name),
                })?;
            update_step(
                db,
                step,
                current,
                next,
                &detail_s,
                &at_s,
                &deadline_s,
                unless_abort_requested,
            )
            .execute()
            .await?;
            (current, next)
        }
    };
    append(db, &step_entry(step, current, next, detail, at)).await?;
    Ok(Some(next))
}

/// The audit event of `step`'s change from `current` to `next`.
fn step_entry(
    step: &Step,
    current: StepStatus,
    next: StepStatus,
    detail: &serde_json::Value,
    at: DateTime<Utc>,
) -> AuditEntry {
    let audit_detail = match next {
        StepStatus::Failed | StepStatus::Aborted => detail.clone(),
        // An analysis's verdict rides on its `step_succeeded` event (SSE).
        StepStatus::Succeeded => crate::domain::analysis::verdict_event(detail),
        _ => serde_json::json!({}),
    };
    // The step as the update leaves it: a start keeps a start already stored (a copy that
    // agrees on the status agrees on it), an end is at `at`.
    let timing = StepTiming {
        position: step.position,
        kind: step.kind,
        started_at: step
            .started_at
            .or((next == StepStatus::Running).then_some(at)),
        finished_at: if next.is_terminal() {
            Some(at)
        } else {
            step.finished_at
        },
    };
    AuditEntry::new(at, "canaryd", AuditKind::step(next))
        .rollout(&step.rollout_id)
        .step(&step.name)
        .states(Some(current.as_str()), Some(next.as_str()))
        .detail(audit_detail)
        .step_timing(timing)
}

/// `transition_in`'s update, queued: `step` from `current` to `next` (and the abort check
/// when `unless_abort_requested`).
#[allow(clippy::too_many_arguments)]
fn update_step<'t>(
    db: &'t mut Tx,
    step: &Step,
    current: StepStatus,
    next: StepStatus,
    detail: &str,
    at: &str,
    deadline: &Option<String>,
    unless_abort_requested: bool,
) -> Stmt<'t> {
    db.query(
        "update step set status = ?, detail = ?, \
         attempts = attempts + case when ? then 1 else 0 end, \
         started_at = coalesce(started_at, case when ? then ? end), \
         finished_at = case when ? then ? else finished_at end, \
         deadline_at = coalesce(deadline_at, ?) where step_id = ? and status = ? \
         and not (? and exists (select 1 from rollout r \
         where r.rollout_id = step.rollout_id and r.abort_reason is not null))",
    )
    .bind(next.as_str())
    .bind(detail)
    .bind(next == StepStatus::Running)
    .bind(next == StepStatus::Running)
    .bind(at)
    .bind(next.is_terminal())
    .bind(at)
    .bind(deadline)
    .bind(&step.id)
    .bind(current.as_str())
    .bind(unless_abort_requested)
}
