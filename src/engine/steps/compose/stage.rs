//! `stage`: the target's image pulled and built at the rollout's tag while its old container
//! serves, so that the `up` after the `down` finds it on the host. Sent only to a server the
//! capability probe shows to honour `materialize_only` (an older one would deploy for real);
//! scoped to the target alone, never an empty list (which would pull every service).

use crate::compose::StreamOutcome;
use crate::domain::error_code::ErrorCode;
use crate::domain::runbook::step::call::CallDetail;
use crate::domain::runbook::step::up::ComposeEvidence;
use crate::domain::runbook::step::{Scope, Stage};
use crate::engine::step_run::{Evidence, Execute, Running, StepEnd, StepRun};

use super::attempt::{
    call, call_error, close_dangling_attempts, finish, out_of_time, outcome_name,
    settle_before_first_call, Call,
};
use super::compose_request;

const ENDPOINT: &str = "compose/up?materialize_only";

/// Why a stage sends nothing to an older server (kept in its evidence).
const NO_STAGE: &str = "compose-manager does not support materialize_only (POST /docker/evict answered 404): an older server would ignore the flag and deploy for real, so nothing was staged; the up pulls the image after the down";

impl Execute for Stage {
    async fn execute(&self, run: &mut StepRun<'_>, at: &mut Running<'_>) -> StepEnd {
        let req = match compose_request(run, &Scope::default(), None) {
            Ok(req) => req,
            Err(end) => return end,
        };
        let client = run.ctx.calls;
        match client.supports_dry_run().await {
            Ok(true) => {}
            Ok(false) => {
                let detail = ComposeEvidence {
                    skipped: Some(true),
                    reason: Some(NO_STAGE.to_owned()),
                    ..ComposeEvidence::default()
                };
                return StepEnd::Succeeded(Evidence::of(&detail));
            }
            Err(e) => {
                let msg = format!(
                    "could not probe compose-manager for materialize_only support: {e}; nothing sent"
                );
                let code = ErrorCode::ComposeManagerUnsupported;
                return StepEnd::failed(code, msg, Evidence::none());
            }
        }
        close_dangling_attempts(run, at.step, "stage").await;
        if let Some(end) = settle_before_first_call(run, at.deadline, at.abort).await {
            return end;
        }
        let send = || client.stage(&req);
        let result = match call(run, at.step, ENDPOINT, false, at.deadline, at.abort, send).await {
            Call::Done { attempt, value } => {
                let detail = CallDetail {
                    endpoint: Some(ENDPOINT.to_owned()),
                    lines: u64::try_from(value.stream.n_lines).ok(),
                    tail: Some(value.stream.transcript_tail.clone()),
                    ..CallDetail::default()
                };
                finish(run, &attempt, outcome_name(&value.stream.outcome), &detail).await;
                value
            }
            Call::Error { attempt, error } => return call_error(run, &attempt, error).await,
            Call::Aborted => {
                let detail = ComposeEvidence {
                    endpoint: Some(ENDPOINT.to_owned()),
                    sent: Some(false),
                    ..ComposeEvidence::default()
                };
                return StepEnd::Aborted(Evidence::of(&detail));
            }
            Call::OutOfTime { last_error } => return out_of_time("the stage", last_error),
        };
        let mut detail = ComposeEvidence {
            endpoint: Some(ENDPOINT.to_owned()),
            lines: u64::try_from(result.stream.n_lines).ok(),
            tail: Some(result.stream.transcript_tail),
            ..ComposeEvidence::default()
        };
        let of = format!("the image of `{}` at {}", run.rollout.target(), req.tag);
        let (code, msg) = match (result.stream.outcome, result.staged) {
            (StreamOutcome::Succeeded, Some(staged))
                if staged.tag == req.tag.as_str() && staged.file == req.file.as_str() =>
            {
                detail.staged = Some(staged);
                return StepEnd::Succeeded(Evidence::of(&detail));
            }
            (StreamOutcome::Succeeded, Some(staged)) => {
                let msg = format!(
                    "the stage was sent for {} {} but the server staged {} {}; the replica was not touched",
                    req.file, req.tag, staged.file, staged.tag
                );
                detail.staged = Some(staged);
                (ErrorCode::ComposeProtocol, msg)
            }
            (StreamOutcome::Succeeded, None) => (
                ErrorCode::ComposeProtocol,
                format!("the stage ended `done` without its `staged` event: {of} is not known to be on the host; the replica was not touched"),
            ),
            (StreamOutcome::Failed { exit_code }, _) => (
                ErrorCode::ComposeFailed,
                format!("{ENDPOINT} ended with done success:false (exit code {exit_code:?}): {of} could not be pulled or built; the replica was not touched"),
            ),
            (StreamOutcome::Unknown, _) => (
                ErrorCode::ComposeOutcomeUnknown,
                format!("the stage's stream ended without `done`: compose may still be pulling {of} on the host; the replica was not touched and nothing is resent"),
            ),
        };
        StepEnd::failed(code, msg, Evidence::of(&detail))
    }
}
