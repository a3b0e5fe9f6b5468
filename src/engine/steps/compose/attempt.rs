//! A compose call of a step, written ahead: its `step_attempt` row is committed before it is
//! sent and its outcome after. 409 busy is retried with backoff inside the step's deadline, a
//! missing tag after the tag resolved once is the git host's rate limit, retried too. A stream
//! without `done` is never resent: the step waits for the host to be idle and fails
//! `compose_outcome_unknown` (safety rule 5, docs/safety.md); after a restart, a call left
//! without an outcome is reconciled, never resent.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::compose::{ComposeError, StreamOutcome, StreamResult};
use crate::domain::error_code::ErrorCode;
use crate::domain::names::ServiceName;
use crate::domain::runbook::step::call::{CallDetail, CallFailure, Settled};
use crate::domain::runbook::step::up::ComposeEvidence;
use crate::domain::state::{AttemptOutcome, RolloutKind};
use crate::engine::step_run::{is_service, pause, Evidence, StepEnd, StepRun};
use crate::engine::Checkpoint;
use crate::store::Step;

/// How a call written ahead ended.
pub(super) enum Call<T> {
    Done {
        attempt: String,
        value: T,
    },
    Error {
        attempt: String,
        error: ComposeError,
    },
    Aborted,
    OutOfTime {
        last_error: String,
    },
}

pub(super) async fn mutate<F, Fut>(
    run: &StepRun<'_>,
    step: &Step,
    endpoint: &str,
    watched: &[ServiceName],
    deadline: DateTime<Utc>,
    abort: &CancellationToken,
    send: F,
) -> StepEnd
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<StreamResult, ComposeError>>,
{
    // A step caught mid-call by a restart: the call may have happened. Never resend it.
    if let Some(end) =
        reconcile_previous_attempt(run, step, endpoint, watched, deadline, abort).await
    {
        return end;
    }
    if let Some(end) = settle_before_first_call(run, deadline, abort).await {
        return end;
    }
    // Only a call of the target (or, in a rename, of the former service) touches the replica
    // (a companion call never names one): a rollout that only called companions neither rolls
    // back nor ends `replica_left_down`.
    // The mark is written with the call's attempt (`Store::begin_attempt`), before it is sent.
    let touches = watched == [run.rollout.target().clone()]
        || run
            .rollout
            .replaced()
            .is_some_and(|old| watched.len() == 1 && watched[0] == *old);
    let called = call(run, step, endpoint, touches, deadline, abort, send).await;
    // Known in memory before its outcome is written: while that write waits on a failing
    // disk, the daemon still tells what the call did (`store::health`, safety rule 18).
    let outcome = match &called {
        Call::Done { value, .. } => Some(outcome_name(&value.outcome)),
        Call::Error { error, .. } if is_ambiguous(error) => Some(AttemptOutcome::Unknown),
        Call::Error { .. } => Some(AttemptOutcome::Error),
        Call::Aborted | Call::OutOfTime { .. } => None,
    };
    if let Some(outcome) = outcome {
        crate::store::note_call(crate::store::LastCall {
            endpoint: endpoint.to_owned(),
            services: watched.iter().map(|s| s.to_string()).collect(),
            outcome: outcome.as_str().to_owned(),
            at: run.ctx.now(),
        });
    }
    match called {
        Call::Done { attempt, value } => {
            let call = CallDetail {
                endpoint: Some(endpoint.to_owned()),
                lines: u64::try_from(value.n_lines).ok(),
                pulled_at: value.pulled_at,
                tail: Some(value.transcript_tail),
                ..CallDetail::default()
            };
            let detail = || Evidence::of(&answered(&call));
            match value.outcome {
                StreamOutcome::Succeeded => {
                    finish(run, &attempt, AttemptOutcome::Succeeded, &call).await;
                    run.ctx
                        .checkpoint(&run.rollout.id, Checkpoint::AttemptDone(&step.name))
                        .await;
                    StepEnd::Succeeded(detail())
                }
                StreamOutcome::Failed { exit_code } => {
                    finish(run, &attempt, AttemptOutcome::Failed, &call).await;
                    run.ctx
                        .checkpoint(&run.rollout.id, Checkpoint::AttemptDone(&step.name))
                        .await;
                    let msg = format!(
                        "{endpoint} ended with done success:false (exit code {exit_code:?})"
                    );
                    StepEnd::failed(ErrorCode::ComposeFailed, msg, detail())
                }
                StreamOutcome::Unknown => {
                    finish(run, &attempt, AttemptOutcome::Unknown, &call).await;
                    outcome_unknown(run, endpoint, watched, deadline, call, abort).await
                }
            }
        }
        Call::Error { attempt, error } if is_ambiguous(&error) => {
            let call = CallDetail {
                error: Some(error.to_string()),
                ..CallDetail::default()
            };
            finish(run, &attempt, AttemptOutcome::Unknown, &call).await;
            outcome_unknown(run, endpoint, watched, deadline, call, abort).await
        }
        Call::Error { attempt, error } => call_error(run, &attempt, error).await,
        Call::Aborted => StepEnd::Aborted(Evidence::of(&ComposeEvidence {
            endpoint: Some(endpoint.to_owned()),
            sent: Some(false),
            ..ComposeEvidence::default()
        })),
        Call::OutOfTime { last_error } => out_of_time(endpoint, last_error),
    }
}

/// Sends a call, writing an attempt row before each try; retries 409 and refused connections
/// (nothing was sent) with backoff until the deadline. A call that `touches` the rollout's
/// replica marks the rollout touched with its first attempt row, if not marked yet.
pub(super) async fn call<T, F, Fut>(
    run: &StepRun<'_>,
    step: &Step,
    endpoint: &str,
    touches: bool,
    deadline: DateTime<Utc>,
    abort: &CancellationToken,
    send: F,
) -> Call<T>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, ComposeError>>,
{
    let store = run.ctx.store;
    let tuning = &run.ctx.compose;
    let mut backoff = tuning.busy_retry_initial;
    loop {
        if abort.is_cancelled() {
            return Call::Aborted;
        }
        let touch = touches && !run.touched.load(std::sync::atomic::Ordering::Relaxed);
        let attempt = match store
            .begin_attempt(step, endpoint, run.ctx.now(), touch)
            .await
        {
            Ok(id) => {
                if touch {
                    run.touched
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
                id
            }
            Err(e) => {
                return Call::OutOfTime {
                    last_error: format!("storage error: {e}"),
                }
            }
        };
        run.ctx
            .checkpoint(&run.rollout.id, Checkpoint::AttemptWritten(&step.name))
            .await;
        // The attempt write may have waited on the database: an abort that came meanwhile
        // still stops the call (an abort acts before the next side effect).
        if abort.is_cancelled() {
            let detail = CallDetail {
                aborted: Some(true),
                ..CallDetail::default()
            };
            finish(run, &attempt, AttemptOutcome::NotSent, &detail).await;
            return Call::Aborted;
        }
        let error = match send().await {
            Ok(value) => return Call::Done { attempt, value },
            Err(error) => error,
        };
        let transient = match error {
            ComposeError::Busy { .. } | ComposeError::Connect { .. } => true,
            ComposeError::TagNotFound { .. } | ComposeError::FileNotFound { .. } => {
                tag_resolved(run).await
            }
            _ => false,
        };
        if !transient {
            return Call::Error { attempt, error };
        }
        let outcome = if matches!(error, ComposeError::Busy { .. }) {
            AttemptOutcome::Busy
        } else {
            AttemptOutcome::Error
        };
        let detail = CallDetail {
            error: Some(error.to_string()),
            code: Some(error.code().as_str().to_owned()),
            retried: Some(true),
            ..CallDetail::default()
        };
        finish(run, &attempt, outcome, &detail).await;
        let left = (deadline - run.ctx.now()).to_std().unwrap_or_default();
        if left < backoff {
            return Call::OutOfTime {
                last_error: error.to_string(),
            };
        }
        tracing::info!(rollout.id = %run.rollout.id, endpoint, backoff_ms = backoff.as_millis() as u64, "{endpoint} refused ({}), retrying", error.code());
        if pause(backoff, abort).await {
            return Call::Aborted;
        }
        backoff = (backoff * 2).min(tuning.busy_retry_max);
    }
}

/// Safety rule 12: whether this rollout's tag already resolved on the host, so that a later
/// `tag not found` / `file not found` is the git host's rate limit (which compose-manager
/// reports as a missing tag), to be retried. It resolved when a compose stream of this
/// rollout got past the tag check (any attempt that ended `succeeded`, `failed` or
/// `unknown`). A rollback's tag is a recorded deployment of this host: it resolved before.
async fn tag_resolved(run: &StepRun<'_>) -> bool {
    if run.rollout.kind == RolloutKind::Rollback {
        return true;
    }
    match run.ctx.store.attempts(&run.rollout.id).await {
        Ok(attempts) => attempts
            .iter()
            .any(|a| a.outcome.is_some_and(AttemptOutcome::reached_the_stream)),
        Err(_) => false,
    }
}

/// A timeout or a garbled stream after the request went out: the host may be acting on it.
fn is_ambiguous(e: &ComposeError) -> bool {
    matches!(
        e,
        ComposeError::Timeout { .. } | ComposeError::Protocol { .. }
    )
}

/// A dry run or a stage (`what`) caught mid-call by a restart changed no container; its
/// attempt is closed as `unknown` and the call is simply sent again.
pub(super) async fn close_dangling_attempts(run: &StepRun<'_>, step: &Step, what: &str) {
    let store = run.ctx.store;
    let Ok(attempts) = store.attempts(&run.rollout.id).await else {
        return;
    };
    for a in attempts
        .iter()
        .filter(|a| a.step_id == step.id && a.outcome.is_none())
    {
        tracing::info!(rollout.id = %run.rollout.id, step.name = %step.name, "a {what} was in flight at the restart; sending it again (it changes no container)");
        let detail = CallDetail {
            reconciled: Some(true),
            resent: Some(what.to_owned()),
            ..CallDetail::default()
        };
        finish(run, &a.id, AttemptOutcome::Unknown, &detail).await;
    }
}

async fn reconcile_previous_attempt(
    run: &StepRun<'_>,
    step: &Step,
    endpoint: &str,
    watched: &[ServiceName],
    deadline: DateTime<Utc>,
    abort: &CancellationToken,
) -> Option<StepEnd> {
    let store = run.ctx.store;
    let attempts = match store.attempts(&run.rollout.id).await {
        Ok(attempts) => attempts,
        // Whether a call is in flight is unknown: never send (safety rule 5, docs/safety.md).
        Err(e) => {
            let msg = format!("could not read this step's compose attempts, so not sending: {e}");
            return Some(StepEnd::failed(
                ErrorCode::StorageError,
                msg,
                Evidence::none(),
            ));
        }
    };
    // Only this call's attempts: a rename's down step also holds its read-only dry run.
    let last = attempts
        .into_iter()
        .rfind(|a| a.step_id == step.id && a.endpoint == endpoint)?;
    match last.outcome {
        None => {
            tracing::warn!(rollout.id = %run.rollout.id, step.name = %step.name, "{} was in flight at the restart; reconciling, not resending", last.endpoint);
            let reconciled = CallDetail {
                reconciled: Some(true),
                ..CallDetail::default()
            };
            finish(run, &last.id, AttemptOutcome::Unknown, &reconciled).await;
            let detail = CallDetail {
                attempt: Some(last.id),
                reconciled_after_restart: Some(true),
                ..CallDetail::default()
            };
            Some(outcome_unknown(run, &last.endpoint, watched, deadline, detail, abort).await)
        }
        Some(AttemptOutcome::Succeeded) => {
            Some(StepEnd::Succeeded(Evidence::as_stored(last.detail)))
        }
        // It ended `done` `success:false` before the restart: that is the step's outcome.
        Some(AttemptOutcome::Failed) => {
            let msg = format!(
                "{} ended with done success:false (before the restart)",
                last.endpoint
            );
            let detail = Evidence::as_stored(last.detail);
            Some(StepEnd::failed(ErrorCode::ComposeFailed, msg, detail))
        }
        Some(AttemptOutcome::Unknown) => {
            let call = serde_json::from_value(last.detail).unwrap_or_default();
            Some(outcome_unknown(run, &last.endpoint, watched, deadline, call, abort).await)
        }
        Some(_) => None,
    }
}

/// Waits for the host to settle (safety rule 13), within the step's own deadline, then fails
/// `compose_outcome_unknown`: the outcome is for a human to judge from `docker ps`, never a
/// blind resend. A call cut at the deadline gets one read of the host (its evidence) and no
/// wait past it: what comes next (the automatic rollback) waits for the host to settle
/// before its first call (`settle_before_first_call`), inside its own step's time.
async fn outcome_unknown(
    run: &StepRun<'_>,
    endpoint: &str,
    watched: &[ServiceName],
    deadline: DateTime<Utc>,
    call: CallDetail,
    abort: &CancellationToken,
) -> StepEnd {
    let client = run.ctx.calls;
    let started = run.ctx.now();
    let settle = settle(run, watched, deadline, abort).await;
    run.settle_checked
        .store(true, std::sync::atomic::Ordering::Relaxed);
    if settle.aborted {
        // Nothing is sent either way; the outcome stays for a human to judge.
        let failure = CallFailure {
            call: Some(call),
            outcome: Some("unknown".to_owned()),
            host_idle: Some(settle.host_idle),
            target_settled: Some(false),
            waited_ms: Some((run.ctx.now() - started).num_milliseconds()),
            ..CallFailure::default()
        };
        return StepEnd::Aborted(Evidence::of(&failure));
    }
    let idle = settle.host_idle;
    let waited_ms = (run.ctx.now() - started).num_milliseconds();
    let ps = client.ps().await.ok();
    let target = ps.as_ref().and_then(|ps| {
        ps.iter()
            .find(|c| is_service(c, run.rollout.target()))
            .cloned()
    });
    // `docker ps` evidence for the human who judges: did the target change since the snapshot?
    let before = run.snapshot.as_ref().and_then(|ps| {
        ps.iter()
            .find(|c| is_service(c, run.rollout.target()))
            .cloned()
    });
    let changed = match (&before, &target) {
        (Some(b), Some(t)) => Some(b.id != t.id || b.image != t.image),
        (Some(_), None) | (None, Some(_)) => Some(true),
        (None, None) => None,
    };
    let state = match (idle, settle.settled) {
        (_, true) => "the host is idle and the target's container is stable now",
        (true, false) => "the target's container was still changing at the deadline",
        (false, false) => "the host is still busy",
    };
    let msg = format!("{endpoint} ended without `done`; {state}; not resent");
    let container = |c: Option<crate::compose::PsEntry>| {
        Some(c.map(|c| serde_json::to_value(c).unwrap_or_default()))
    };
    let failure = CallFailure {
        call: Some(call),
        host_idle: Some(idle),
        target_settled: Some(settle.settled),
        settle: Some(settle.evidence()),
        waited_ms: Some(waited_ms),
        target_container: container(target),
        target_before: container(before),
        target_changed_since_snapshot: Some(changed),
        ..CallFailure::default()
    };
    StepEnd::failed(
        ErrorCode::ComposeOutcomeUnknown,
        msg,
        Evidence::of(&failure),
    )
}

/// A `down` or `up` step's evidence of its call: the attempt's.
fn answered(call: &CallDetail) -> ComposeEvidence {
    ComposeEvidence {
        endpoint: call.endpoint.clone(),
        lines: call.lines,
        tail: call.tail.clone(),
        ..ComposeEvidence::default()
    }
}

/// How a wait for the host to settle ended.
#[derive(Debug, Default)]
struct Settle {
    settled: bool,
    aborted: bool,
    host_idle: bool,
    /// `GET /docker/ps` reads taken, and how often the target's container differed.
    reads: u32,
    changes: u32,
}

impl Settle {
    fn evidence(&self) -> Settled {
        Settled {
            settled: self.settled,
            host_idle: self.host_idle,
            ps_reads: self.reads,
            target_changes: self.changes,
        }
    }
}

/// Safety rule 13: waits until `GET /status` reads idle **and** the containers of `watched`
/// (the call's services: the target, or a companion step's list) are the same (id, image,
/// state) in two `GET /docker/ps` reads `settle_interval` apart, or until `limit`.
/// compose-manager frees its lock with the HTTP stream, not with the `docker compose` child:
/// after a stream that ended early, idle alone does not mean done.
async fn settle(
    run: &StepRun<'_>,
    watched: &[ServiceName],
    limit: DateTime<Utc>,
    abort: &CancellationToken,
) -> Settle {
    let client = run.ctx.calls;
    let interval = run.ctx.compose.settle_interval;
    let mut out = Settle::default();
    // Each watched service's (id, image, state), and since when they have been seen unchanged.
    type Seen = Vec<Option<(String, String, String)>>;
    let mut last: Option<(std::time::Instant, Seen)> = None;
    loop {
        out.host_idle = matches!(client.status().await, Ok(s) if s.in_flight.is_none());
        let read = if out.host_idle {
            client.ps().await.ok()
        } else {
            None
        };
        match read {
            Some(ps) => {
                out.reads += 1;
                let now: Seen = watched
                    .iter()
                    .map(|service| {
                        ps.iter()
                            .find(|c| is_service(c, service))
                            .map(|c| (c.id.clone(), c.image.clone(), c.state.clone()))
                    })
                    .collect();
                match &last {
                    Some((since, seen)) if *seen == now => {
                        if since.elapsed() >= interval {
                            out.settled = true;
                            return out;
                        }
                    }
                    Some(_) => {
                        out.changes += 1;
                        last = Some((std::time::Instant::now(), now));
                    }
                    None => last = Some((std::time::Instant::now(), now)),
                }
            }
            None => last = None,
        }
        if run.ctx.now() >= limit {
            return out;
        }
        let wait = match &last {
            Some(_) => interval,
            None => run.ctx.poll_interval(limit).min(Duration::from_millis(500)),
        };
        if pause(wait, abort).await {
            out.aborted = true;
            return out;
        }
    }
}

/// Before a rollback's first compose call: when the rollout it undoes ended with a `down` or
/// `up` of unknown outcome, the host must settle first (safety rule 13). `Some` ends the step
/// without sending anything.
pub(super) async fn settle_before_first_call(
    run: &StepRun<'_>,
    deadline: DateTime<Utc>,
    abort: &CancellationToken,
) -> Option<StepEnd> {
    use std::sync::atomic::Ordering;
    if run.settle_checked.swap(true, Ordering::Relaxed) {
        return None;
    }
    let of = run.rollout.rollback_of.as_deref()?;
    if run.rollout.kind != RolloutKind::Rollback {
        return None;
    }
    let attempts = run.ctx.store.attempts(of).await.ok();
    let unknown = attempts.is_none_or(|attempts| {
        attempts.iter().any(|a| {
            matches!(a.endpoint.as_str(), "compose/up" | "compose/down")
                && matches!(a.outcome, None | Some(AttemptOutcome::Unknown))
        })
    });
    if !unknown {
        return None;
    }
    tracing::info!(rollout.id = %run.rollout.id, rollback_of = %of, "the rollout this rollback undoes ended with an unknown compose outcome; waiting for the host to settle");
    let target = [run.rollout.target().clone()];
    let settle = settle(run, &target, deadline, abort).await;
    let evidence = Evidence::of(&CallFailure {
        settle: Some(settle.evidence()),
        ..CallFailure::default()
    });
    if settle.aborted {
        return Some(StepEnd::Aborted(evidence));
    }
    if !settle.settled {
        let msg = format!(
            "{of} ended with a compose call of unknown outcome and the host did not settle before the deadline (idle and {} unchanged across two docker ps reads): nothing sent",
            run.rollout.target()
        );
        return Some(StepEnd::failed(ErrorCode::HostUnsettled, msg, evidence));
    }
    None
}

pub(super) async fn call_error(run: &StepRun<'_>, attempt: &str, error: ComposeError) -> StepEnd {
    let detail = CallDetail {
        error: Some(error.to_string()),
        ..CallDetail::default()
    };
    finish(run, attempt, AttemptOutcome::Error, &detail).await;
    let mut message = error.to_string();
    let touched = run.touched.load(std::sync::atomic::Ordering::Relaxed);
    match &error {
        ComposeError::TagNotFound { tag, .. } if !touched => message.push_str(&format!(
            ": nothing on the host was touched. Check that the tag {tag} exists in the compose \
             repo (`git ls-remote --tags`) and is older than the host's minimum tag age; the git \
             host's rate limit reads the same, so a tag that exists may resolve on a retry"
        )),
        _ => {}
    }
    StepEnd::failed(error.code(), message, Evidence::none())
}

pub(super) fn out_of_time(what: &str, last_error: String) -> StepEnd {
    let msg = format!("{what} could not be sent before the step deadline: {last_error}");
    let evidence = CallFailure {
        last_error: Some(last_error),
        ..CallFailure::default()
    };
    StepEnd::failed(ErrorCode::StepTimeout, msg, Evidence::of(&evidence))
}

/// Records how an attempt ended, with its detail.
pub(super) async fn finish(
    run: &StepRun<'_>,
    attempt: &str,
    outcome: AttemptOutcome,
    detail: &CallDetail,
) {
    let detail = serde_json::to_value(detail).unwrap_or_default();
    if let Err(e) = run
        .ctx
        .store
        .finish_attempt(attempt, outcome, &detail, run.ctx.now())
        .await
    {
        tracing::error!(rollout.id = %run.rollout.id, error = %e, "could not record the outcome of attempt {attempt}");
    }
}

pub(super) fn outcome_name(o: &StreamOutcome) -> AttemptOutcome {
    match o {
        StreamOutcome::Succeeded => AttemptOutcome::Succeeded,
        StreamOutcome::Failed { .. } => AttemptOutcome::Failed,
        StreamOutcome::Unknown => AttemptOutcome::Unknown,
    }
}
