//! Waiting for an operator (docs/reference.md#approve): the `approve` step, and an `analyze`
//! check with `on_inconclusive: ask`. The wait is recorded in the store (the step's evidence
//! says `awaiting_approval`, an `approval_requested` event notifies), and the approval is read
//! back from the store, so a restart neither loses an approval nor asks twice.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::domain::error_code::ErrorCode;
use crate::domain::runbook::step::approve::ApproveEvidence;
use crate::domain::runbook::step::Approve;
use crate::engine::step_run::{pause, Evidence, Execute, Running, StepEnd, StepRun};
use crate::store::{Approval, Step};

/// How a wait for an approval ended.
pub(crate) enum Waited {
    Approved(Approval),
    TimedOut,
    Aborted,
}

/// Marks `step` as waiting (`waiting`: its evidence, which says `awaiting_approval` and the
/// deadline), then polls for an approval until `deadline` or an abort.
pub(crate) async fn wait(
    run: &StepRun<'_>,
    step: &Step,
    waiting: &Evidence,
    deadline: DateTime<Utc>,
    abort: &CancellationToken,
) -> Waited {
    let store = run.ctx.store;
    if let Err(e) = store
        .request_approval(step, waiting.json(), run.ctx.now())
        .await
    {
        // The wait goes on: an approval is still read back below, and a store that stays
        // broken ends the wait at its deadline.
        tracing::warn!(error = %e, "could not record that step {} waits for an approval", step.name);
    }
    loop {
        match store.approval_of(&step.rollout_id, &step.name).await {
            Ok(Some(approval)) => return Waited::Approved(approval),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "could not read the approval of step {}", step.name)
            }
        }
        if run.ctx.now() >= deadline {
            return Waited::TimedOut;
        }
        if pause(
            run.ctx.poll_interval(deadline).min(Duration::from_secs(1)),
            abort,
        )
        .await
        {
            return Waited::Aborted;
        }
    }
}

/// The evidence of an approval, merged into a step's detail.
pub(crate) fn evidence(approval: &Approval, waited_since: DateTime<Utc>) -> ApproveEvidence {
    ApproveEvidence {
        approved_by: Some(approval.actor.clone()),
        reason: Some(approval.reason.clone()),
        approved_at: Some(approval.at),
        waited_s: Some((approval.at - waited_since).num_seconds().max(0)),
        ..ApproveEvidence::default()
    }
}

impl Execute for Approve {
    /// Waits for an operator's approval until the step's deadline.
    async fn execute(&self, run: &mut StepRun<'_>, at: &mut Running<'_>) -> StepEnd {
        let step = at.step;
        let since = step.started_at.unwrap_or_else(|| run.ctx.now());
        let base = ApproveEvidence {
            waiting_since: Some(since),
            ..ApproveEvidence::default()
        };
        let waiting = ApproveEvidence {
            awaiting_approval: Some(true),
            deadline: Some(at.deadline),
            ..base.clone()
        };
        let base = Evidence::of(&base);
        match wait(run, step, &Evidence::of(&waiting), at.deadline, at.abort).await {
            Waited::Approved(a) => StepEnd::Succeeded(Evidence::of(&evidence(&a, since))),
            Waited::TimedOut => StepEnd::failed(
                ErrorCode::NotApproved,
                format!(
                    "no operator approved step {} before its deadline {}",
                    step.name, at.deadline
                ),
                base,
            ),
            Waited::Aborted => StepEnd::Aborted(base),
        }
    }
}
