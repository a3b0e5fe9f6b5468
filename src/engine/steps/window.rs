//! The `window` step (docs/reference.md#low-traffic-windows): before the replica is taken
//! out, wait until a low-traffic window of the plan (or of the step, or of the host) is open. The wait is an
//! approval wait (`approve.rs`): it is in the step's evidence and notified once, it survives a
//! restart, and an operator's approval (with a reason, audited) starts the rollout now. A
//! rollback never waits, nor a host without windows.

use chrono::{DateTime, SecondsFormat, Utc};

use super::approve::{self, Waited};
use crate::domain::error_code::ErrorCode;
use crate::domain::runbook::step::approve::ApproveEvidence;
use crate::domain::runbook::step::window::WindowEvidence;
use crate::domain::runbook::step::Window;
use crate::domain::state::RolloutKind;
use crate::domain::window;
use crate::engine::step_run::{Evidence, Execute, Running, StepEnd, StepRun};

impl Execute for Window {
    async fn execute(&self, run: &mut StepRun<'_>, at: &mut Running<'_>) -> StepEnd {
        // The plan's windows, else the step's, else the host's.
        let windows = [&run.rollout.windows, &self.windows, &run.ctx.host.windows]
            .into_iter()
            .find(|w| !w.is_empty())
            .unwrap_or(&run.ctx.host.windows);
        let shown = (!windows.is_empty()).then(|| window::shown(windows));
        let skipped = |why: &str| {
            let detail = WindowEvidence {
                windows: shown.clone(),
                skipped: Some(why.to_owned()),
                ..WindowEvidence::default()
            };
            StepEnd::Succeeded(Evidence::of(&detail))
        };
        if run.rollout.kind == RolloutKind::Rollback {
            return skipped("a rollback never waits for a low-traffic window");
        }
        if windows.is_empty() {
            return skipped("no low-traffic window is configured for this plan, runbook or host");
        }
        let now = run.ctx.now();
        let opened = |at: DateTime<Utc>| {
            let detail = WindowEvidence {
                windows: shown.clone(),
                opened_at: Some(at),
                ..WindowEvidence::default()
            };
            StepEnd::Succeeded(Evidence::of(&detail))
        };
        if window::open_at(windows, now) {
            return opened(now);
        }
        let Some(opens) = window::next_opening(windows, now) else {
            return skipped("no window of the configured ones opens within a week");
        };
        let step = at.step;
        let since = step.started_at.unwrap_or(now);
        let base = WindowEvidence {
            windows: shown.clone(),
            next_opening: Some(opens),
            approval: ApproveEvidence {
                waiting_since: Some(since),
                ..ApproveEvidence::default()
            },
            ..WindowEvidence::default()
        };
        let mut waiting = base.clone();
        waiting.waiting_for = Some(format!(
            "the low-traffic window ({}) opening at {}",
            shown.as_deref().unwrap_or_default(),
            opens.to_rfc3339_opts(SecondsFormat::Secs, true)
        ));
        waiting.approval.awaiting_approval = Some(true);
        waiting.approval.deadline = Some(at.deadline);
        tracing::info!(rollout.id = %run.rollout.id, next_opening = %opens, "the low-traffic window is closed; waiting for it (or an operator's approval)");
        let until = opens.min(at.deadline);
        match approve::wait(run, step, &Evidence::of(&waiting), until, at.abort).await {
            Waited::Approved(a) => {
                let mut detail = base;
                detail.approval = approve::evidence(&a, since);
                StepEnd::Succeeded(Evidence::of(&detail))
            }
            Waited::TimedOut if run.ctx.now() >= opens => opened(run.ctx.now()),
            Waited::TimedOut => StepEnd::failed(
                ErrorCode::WindowClosed,
                format!(
                    "no low-traffic window ({}) opened before step {}'s deadline {} (the next opens at {opens}), and nobody started the rollout; the replica was not touched",
                    shown.as_deref().unwrap_or_default(),
                    step.name,
                    at.deadline
                ),
                Evidence::of(&base),
            ),
            Waited::Aborted => StepEnd::Aborted(Evidence::of(&base)),
        }
    }
}
