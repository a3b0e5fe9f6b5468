//! The steps that call compose-manager with side effects (or a dry run): plan, down, up.
//!
//! Each call is written ahead (`step_attempt`) before it is sent. 409 busy is retried with
//! backoff inside the step's deadline. A stream without `done` is never resent: the step waits
//! for the host to be idle and fails `compose_outcome_unknown` (safety rule 5, docs/safety.md).

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::compose::{
    ComposeError, ComposeRequest, ForceRecreate, Services, StreamOutcome, StreamResult,
};
use crate::domain::error_code::ErrorCode;
use crate::domain::plan_gate;
use crate::domain::plan_gate::DryRunPlan;
use crate::domain::runbook::step::plan::{PlanEvidence, PlannedChanges};
use crate::domain::runbook::step::up::{ComposeEvidence, Replaced};
use crate::domain::runbook::step::{evidence, Down, Plan, Scope, Up};
use crate::domain::state::{AttemptOutcome, RolloutKind};
use crate::engine::step_run::{is_service, pause, stored, Execute, Running, StepEnd, StepRun};
use crate::engine::Checkpoint;
use crate::store::Step;

enum Call<T> {
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

/// The request of a step's compose call: the rollout's tag, file and env, and the step's
/// scope — the target alone, or the step's companion services (`services`, narrowed to what the
/// dry run planned for a reconcile). Safety rule 15, checked again here (fail closed): a
/// companion list never names the target nor a configured replica, and `force_recreate`
/// exists only for services of the config's `force_recreate_allowed`.
fn compose_request(
    run: &StepRun<'_>,
    scope: &Scope,
    services: Option<&[String]>,
) -> Result<ComposeRequest, StepEnd> {
    let refuse = |msg: String| {
        StepEnd::failed(
            ErrorCode::InvalidRequest,
            msg,
            json!({"services": scope.services}),
        )
    };
    let services = if scope.is_companion() {
        let names = services.unwrap_or(&scope.services).to_vec();
        let host = &run.ctx.host.config;
        if let Some(replica) = names
            .iter()
            .find(|s| *s == run.rollout.target() || host.is_replica_name(s))
        {
            return Err(refuse(format!(
                "companion services name `{replica}`, a replica: a replica is only ever touched as the rollout's target; nothing sent"
            )));
        }
        Services::list(names).map_err(|e| refuse(e.to_string()))?
    } else {
        Services::one(run.rollout.target())
    };
    let force_recreate = if scope.force_recreate {
        let allowed = &run.ctx.compose.force_recreate_allowed;
        Some(ForceRecreate::allowed(&services, allowed).map_err(|e| refuse(e.to_string()))?)
    } else {
        None
    };
    Ok(ComposeRequest {
        tag: run.rollout.tag.clone(),
        file: run.rollout.file.clone(),
        services,
        env: run.env.clone(),
        force_recreate,
    })
}

/// The dry-run gate: probe support (rule 4), dry run, and check the plan.
async fn plan(
    run: &StepRun<'_>,
    step: &Step,
    spec: &Plan,
    deadline: DateTime<Utc>,
    abort: &CancellationToken,
) -> StepEnd {
    let allow = spec.allow.as_slice();
    let req = match compose_request(run, &spec.scope, None) {
        Ok(req) => req,
        Err(end) => return end,
    };
    let client = &run.ctx.host.client;
    match client.supports_dry_run().await {
        Ok(true) => {}
        Ok(false) => {
            let msg = "compose-manager does not support dry_run (POST /docker/evict answered 404): an older \
                       server would ignore dry_run and deploy for real";
            let detail = PlanEvidence {
                probe: Some("404".to_owned()),
                ..PlanEvidence::default()
            };
            return StepEnd::failed(ErrorCode::ComposeManagerUnsupported, msg, stored(&detail));
        }
        Err(e) => {
            let msg = format!("could not probe compose-manager for dry_run support: {e}");
            let detail = PlanEvidence {
                probe_error: Some(e.code().as_str().to_owned()),
                ..PlanEvidence::default()
            };
            return StepEnd::failed(ErrorCode::ComposeManagerUnsupported, msg, stored(&detail));
        }
    }
    close_dangling_attempts(run, step).await;
    if let Some(end) = settle_before_first_call(run, deadline, abort).await {
        return end;
    }
    let result = match call(
        run,
        step,
        "compose/up?dry_run",
        false,
        deadline,
        abort,
        || client.dry_run(&req),
    )
    .await
    {
        Call::Done { attempt, value } => {
            let outcome = outcome_name(&value.stream.outcome);
            finish(
                run,
                &attempt,
                outcome,
                json!({"plan": value.plan, "tail": value.stream.transcript_tail}),
            )
            .await;
            value
        }
        Call::Error { attempt, error } => return call_error(run, &attempt, error).await,
        Call::Aborted => return StepEnd::Aborted(json!({})),
        Call::OutOfTime { last_error } => return out_of_time("dry run", last_error),
    };
    let tail = result.stream.transcript_tail.clone();
    if result.stream.outcome != StreamOutcome::Succeeded {
        let msg = format!(
            "the dry run did not succeed ({})",
            outcome_name(&result.stream.outcome)
        );
        let detail = PlanEvidence {
            plan: Some(result.plan.map(PlannedChanges::from)),
            tail: Some(tail),
            ..PlanEvidence::default()
        };
        return StepEnd::failed(ErrorCode::DryRunFailed, msg, stored(&detail));
    }
    let Some(dry_plan) = result.plan else {
        let detail = PlanEvidence {
            tail: Some(tail),
            ..PlanEvidence::default()
        };
        return StepEnd::failed(
            ErrorCode::DryRunNoPlan,
            "the dry run answered without a plan event",
            stored(&detail),
        );
    };
    let companion = spec.scope.is_companion();
    let checked = if companion {
        let services = &spec.scope.services;
        let only = spec.scope.only_out_of_date;
        plan_gate::check_companions(&dry_plan, services, allow, only).map(Some)
    } else {
        let (target, replaced) = (run.rollout.target(), run.rollout.replaced());
        plan_gate::check_rename(&dry_plan, target, replaced, allow).map(|()| None)
    };
    let mut detail = PlanEvidence {
        plan: Some(Some(dry_plan.into())),
        allow: Some(allow.to_vec()),
        services: companion.then(|| spec.scope.services.clone()),
        tail: Some(tail),
        ..PlanEvidence::default()
    };
    match checked {
        Ok(apply) => {
            detail.apply = apply;
            StepEnd::Succeeded(stored(&detail))
        }
        Err(violation) => {
            detail.violation = Some(violation.to_string());
            StepEnd::failed(violation.code(), violation.to_string(), stored(&detail))
        }
    }
}

impl Execute for Plan {
    async fn execute(&self, run: &mut StepRun<'_>, at: &mut Running<'_>) -> StepEnd {
        plan(run, at.step, self, at.deadline, at.abort).await
    }

    /// A companion gate leaves what its `up` may apply (a reconcile applies only that).
    fn carry(run: &mut StepRun<'_>, _step: &Step, detail: &serde_json::Value) {
        if let Some(PlanEvidence {
            services: Some(services),
            apply: Some(apply),
            ..
        }) = evidence::<Plan>(detail)
        {
            run.companion_plans.insert(services, apply);
        }
    }
}

/// The two compose calls that change the target.
#[derive(Clone, Copy)]
enum Scoped {
    Down,
    Up,
}

impl Execute for Down {
    /// In a rename, the target's `down` acts on the former service, with its file and tag.
    async fn execute(&self, run: &mut StepRun<'_>, at: &mut Running<'_>) -> StepEnd {
        if !self.scope.is_companion() && run.rollout.replaces.is_some() {
            return rename_down(run, at).await;
        }
        match compose_request(run, &self.scope, None) {
            Ok(req) => scoped(run, at, Scoped::Down, req).await,
            Err(end) => end,
        }
    }
}

/// The former service's file and tag: the plan's `replaces.file`/`tag`, else its newest
/// recorded deployment under that name (the baseline the snapshot recorded, at least).
async fn replaced_deployment(run: &StepRun<'_>, old: &str) -> Result<(String, String), StepEnd> {
    let Some(replaces) = &run.rollout.replaces else {
        return Err(StepEnd::failed(
            ErrorCode::InvalidRequest,
            "no replaces",
            json!({}),
        ));
    };
    if let (Some(file), Some(tag)) = (&replaces.file, &replaces.tag) {
        return Ok((file.clone(), tag.clone()));
    }
    let store = run.ctx.store;
    let recorded = store
        .deployment_named(&run.rollout.host, &run.rollout.service, old)
        .await
        .map_err(|e| StepEnd::failed(ErrorCode::StorageError, e.to_string(), json!({})))?;
    match recorded {
        Some(d) => Ok((
            replaces.file.clone().unwrap_or(d.file),
            replaces.tag.clone().unwrap_or(d.tag),
        )),
        None => {
            let msg = format!(
                "no deployment of `{old}` is recorded for {} on {} (nor a baseline): give replaces.file and replaces.tag; nothing sent",
                run.rollout.service, run.rollout.host
            );
            Err(StepEnd::failed(
                ErrorCode::InvalidRequest,
                msg,
                json!({"replaces": old}),
            ))
        }
    }
}

/// The `down` of a rename (docs/reference.md#renamed-replicas): the former service, scoped
/// alone, with the file and tag that deployed it. compose-manager's down runs against the file
/// on disk, which the gate's dry run of the new tag overwrote (a file that no longer defines
/// the former service): a dry run of the former service at its own tag, read-only, puts its
/// file back first, and must plan no recreate and no removal. Never resent after a restart:
/// once a down attempt exists, it is reconciled like any other.
async fn rename_down(run: &StepRun<'_>, at: &mut Running<'_>) -> StepEnd {
    let Some(old) = run.rollout.replaced().map(str::to_owned) else {
        return StepEnd::failed(ErrorCode::InvalidRequest, "no replaces", json!({}));
    };
    let (file, tag) = match replaced_deployment(run, &old).await {
        Ok(found) => found,
        Err(end) => return end,
    };
    let req = ComposeRequest {
        tag: tag.clone(),
        file: file.clone(),
        services: Services::one(old.clone()),
        env: run.env.clone(),
        force_recreate: None,
    };
    let store = run.ctx.store;
    let down_sent = match store.attempts(&run.rollout.id).await {
        Ok(attempts) => attempts
            .iter()
            .any(|a| a.step_id == at.step.id && a.endpoint == "compose/down"),
        Err(e) => {
            let msg = format!("could not read this step's compose attempts, so not sending: {e}");
            return StepEnd::failed(ErrorCode::StorageError, msg, json!({}));
        }
    };
    let replaces = Replaced {
        service: old,
        file,
        tag,
    };
    let mut restored = None;
    if !down_sent {
        match materialize(run, at, &req).await {
            Ok(plan) => restored = Some(plan.into()),
            Err(end) => return end,
        }
    }
    match scoped(run, at, Scoped::Down, req).await {
        StepEnd::Succeeded(detail) => {
            let mut detail = evidence::<Down>(&detail).unwrap_or_default();
            detail.replaces = Some(replaces);
            detail.file_restored_by_dry_run = restored;
            StepEnd::Succeeded(stored(&detail))
        }
        other => other,
    }
}

/// The read-only dry run that writes the former service's file back on disk before its down:
/// it must succeed and plan neither a recreate nor a removal (the former service is what runs).
async fn materialize(
    run: &StepRun<'_>,
    at: &mut Running<'_>,
    req: &ComposeRequest,
) -> Result<DryRunPlan, StepEnd> {
    let client = &run.ctx.host.client;
    if client.supports_dry_run().await != Ok(true) {
        let msg = "compose-manager does not answer the dry_run probe: the former service's file cannot be put back without a deploy; nothing sent";
        return Err(StepEnd::failed(
            ErrorCode::ComposeManagerUnsupported,
            msg,
            json!({}),
        ));
    }
    close_dangling_attempts(run, at.step).await;
    if let Some(end) = settle_before_first_call(run, at.deadline, at.abort).await {
        return Err(end);
    }
    let endpoint = "compose/up?dry_run";
    let result = match call(run, at.step, endpoint, false, at.deadline, at.abort, || {
        client.dry_run(req)
    })
    .await
    {
        Call::Done { attempt, value } => {
            let outcome = outcome_name(&value.stream.outcome);
            let detail = json!({"plan": value.plan, "tail": value.stream.transcript_tail});
            finish(run, &attempt, outcome, detail).await;
            value
        }
        Call::Error { attempt, error } => return Err(call_error(run, &attempt, error).await),
        Call::Aborted => return Err(StepEnd::Aborted(json!({"sent": false}))),
        Call::OutOfTime { last_error } => return Err(out_of_time("dry run", last_error)),
    };
    let tail = result.stream.transcript_tail.clone();
    let plan = match (&result.stream.outcome, result.plan) {
        (StreamOutcome::Succeeded, Some(plan)) => plan,
        (_, plan) => {
            let msg = format!(
                "the dry run of `{}` at {} {} did not succeed: that file and tag do not deploy it as it runs; no down sent",
                req.services.names().join(", "),
                req.file,
                req.tag
            );
            return Err(StepEnd::failed(
                ErrorCode::DryRunFailed,
                msg,
                json!({"plan": plan, "tail": tail}),
            ));
        }
    };
    if !plan.recreate.is_empty() || !plan.remove.is_empty() {
        let msg = format!(
            "the dry run of `{}` at {} {} would recreate {:?} and remove {:?}: that file and tag are not what runs; no down sent",
            req.services.names().join(", "),
            req.file,
            req.tag,
            plan.recreate,
            plan.remove
        );
        return Err(StepEnd::failed(
            ErrorCode::PlanGateFailed,
            msg,
            json!({"plan": plan, "tail": tail}),
        ));
    }
    Ok(plan)
}

impl Execute for Up {
    /// A rollback then checks the tag still means the same. A reconcile (`only_out_of_date`)
    /// applies only what its gate planned, and sends nothing when nothing is out of date.
    async fn execute(&self, run: &mut StepRun<'_>, at: &mut Running<'_>) -> StepEnd {
        let scope = &self.scope;
        let apply = if scope.only_out_of_date {
            match run.companion_plans.get(&scope.services) {
                Some(apply) if apply.is_empty() => {
                    let detail = ComposeEvidence {
                        skipped: Some(true),
                        reason: Some("the dry run found nothing out of date".to_owned()),
                        services: Some(scope.services.clone()),
                        apply: Some(Vec::new()),
                        ..ComposeEvidence::default()
                    };
                    return StepEnd::Succeeded(stored(&detail));
                }
                Some(apply) => Some(apply.clone()),
                None => {
                    let msg = format!(
                        "no passing dry run of {} in this rollout to reconcile from: nothing sent",
                        scope.shown()
                    );
                    return StepEnd::failed(
                        ErrorCode::InvalidRequest,
                        msg,
                        json!({"services": scope.services}),
                    );
                }
            }
        } else {
            None
        };
        let req = match compose_request(run, scope, apply.as_deref()) {
            Ok(req) => req,
            Err(end) => return end,
        };
        match scoped(run, at, Scoped::Up, req).await {
            StepEnd::Succeeded(detail)
                if run.rollout.kind == RolloutKind::Rollback && !scope.is_companion() =>
            {
                check_tag(run, detail).await
            }
            other => other,
        }
    }

    /// The target's engine has run since the target's `up` ended (restart detection); a
    /// companion `up` (its detail names `services`) changes nothing of the target.
    fn carry(run: &mut StepRun<'_>, step: &Step, detail: &serde_json::Value) {
        if evidence::<Up>(detail).is_none_or(|d| d.services.is_none()) {
            run.up_done_at = Some(step.finished_at.unwrap_or_else(|| run.ctx.now()));
        }
    }
}

/// Scoped `compose/down` or `compose/up` of the target or of a step's companion services.
async fn scoped(
    run: &StepRun<'_>,
    at: &mut Running<'_>,
    which: Scoped,
    req: ComposeRequest,
) -> StepEnd {
    let client = &run.ctx.host.client;
    let endpoint = match which {
        Scoped::Down => "compose/down",
        Scoped::Up => "compose/up",
    };
    let send = || async {
        match which {
            Scoped::Down => client.down(&req).await,
            Scoped::Up => client.up(&req).await,
        }
    };
    let companions =
        (req.services.names() != [run.rollout.target()]).then(|| req.services.names().to_vec());
    let watched = req.services.names();
    match mutate(run, at.step, endpoint, watched, at.deadline, at.abort, send).await {
        StepEnd::Succeeded(detail) if companions.is_some() => {
            let mut detail = evidence::<Up>(&detail).unwrap_or_default();
            detail.services = companions;
            StepEnd::Succeeded(stored(&detail))
        }
        other => other,
    }
}

async fn mutate<F, Fut>(
    run: &StepRun<'_>,
    step: &Step,
    endpoint: &str,
    watched: &[String],
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
    let touches = watched == [run.rollout.target()]
        || run.rollout.replaced().is_some_and(|old| watched == [old]);
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
            services: watched.to_vec(),
            outcome: outcome.as_str().to_owned(),
            at: run.ctx.now(),
        });
    }
    match called {
        Call::Done { attempt, value } => {
            let detail = stored(&ComposeEvidence {
                endpoint: Some(endpoint.to_owned()),
                lines: u64::try_from(value.n_lines).ok(),
                tail: Some(value.transcript_tail),
                ..ComposeEvidence::default()
            });
            match value.outcome {
                StreamOutcome::Succeeded => {
                    finish(run, &attempt, AttemptOutcome::Succeeded, detail.clone()).await;
                    run.ctx
                        .checkpoint(&run.rollout.id, Checkpoint::AttemptDone(&step.name))
                        .await;
                    StepEnd::Succeeded(detail)
                }
                StreamOutcome::Failed { exit_code } => {
                    finish(run, &attempt, AttemptOutcome::Failed, detail.clone()).await;
                    run.ctx
                        .checkpoint(&run.rollout.id, Checkpoint::AttemptDone(&step.name))
                        .await;
                    let msg = format!(
                        "{endpoint} ended with done success:false (exit code {exit_code:?})"
                    );
                    StepEnd::failed(ErrorCode::ComposeFailed, msg, detail)
                }
                StreamOutcome::Unknown => {
                    finish(run, &attempt, AttemptOutcome::Unknown, detail.clone()).await;
                    outcome_unknown(run, endpoint, watched, deadline, detail, abort).await
                }
            }
        }
        Call::Error { attempt, error } if is_ambiguous(&error) => {
            finish(
                run,
                &attempt,
                AttemptOutcome::Unknown,
                json!({"error": error.to_string()}),
            )
            .await;
            let detail = json!({"error": error.to_string()});
            outcome_unknown(run, endpoint, watched, deadline, detail, abort).await
        }
        Call::Error { attempt, error } => call_error(run, &attempt, error).await,
        Call::Aborted => StepEnd::Aborted(stored(&ComposeEvidence {
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
async fn call<T, F, Fut>(
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
            finish(
                run,
                &attempt,
                AttemptOutcome::NotSent,
                json!({"aborted": true}),
            )
            .await;
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
        let detail = json!({"error": error.to_string(), "code": error.code(), "retried": true});
        finish(run, &attempt, outcome, detail).await;
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

/// A dry run caught mid-call by a restart had no side effect; its attempt is closed as
/// `unknown` and the dry run is simply sent again.
async fn close_dangling_attempts(run: &StepRun<'_>, step: &Step) {
    let store = run.ctx.store;
    let Ok(attempts) = store.attempts(&run.rollout.id).await else {
        return;
    };
    for a in attempts
        .iter()
        .filter(|a| a.step_id == step.id && a.outcome.is_none())
    {
        tracing::info!(rollout.id = %run.rollout.id, step.name = %step.name, "a dry run was in flight at the restart; sending it again (no side effect)");
        let detail = json!({"reconciled": true, "resent": "dry run"});
        finish(run, &a.id, AttemptOutcome::Unknown, detail).await;
    }
}

async fn reconcile_previous_attempt(
    run: &StepRun<'_>,
    step: &Step,
    endpoint: &str,
    watched: &[String],
    deadline: DateTime<Utc>,
    abort: &CancellationToken,
) -> Option<StepEnd> {
    let store = run.ctx.store;
    let attempts = match store.attempts(&run.rollout.id).await {
        Ok(attempts) => attempts,
        // Whether a call is in flight is unknown: never send (safety rule 5, docs/safety.md).
        Err(e) => {
            let msg = format!("could not read this step's compose attempts, so not sending: {e}");
            return Some(StepEnd::failed(ErrorCode::StorageError, msg, json!({})));
        }
    };
    // Only this call's attempts: a rename's down step also holds its read-only dry run.
    let last = attempts
        .into_iter()
        .rfind(|a| a.step_id == step.id && a.endpoint == endpoint)?;
    match last.outcome {
        None => {
            tracing::warn!(rollout.id = %run.rollout.id, step.name = %step.name, "{} was in flight at the restart; reconciling, not resending", last.endpoint);
            let _ = store
                .finish_attempt(
                    &last.id,
                    AttemptOutcome::Unknown,
                    &json!({"reconciled": true}),
                    run.ctx.now(),
                )
                .await;
            let detail = json!({"attempt": last.id, "reconciled_after_restart": true});
            Some(outcome_unknown(run, &last.endpoint, watched, deadline, detail, abort).await)
        }
        Some(AttemptOutcome::Succeeded) => Some(StepEnd::Succeeded(last.detail)),
        // It ended `done` `success:false` before the restart: that is the step's outcome.
        Some(AttemptOutcome::Failed) => {
            let msg = format!(
                "{} ended with done success:false (before the restart)",
                last.endpoint
            );
            Some(StepEnd::failed(ErrorCode::ComposeFailed, msg, last.detail))
        }
        Some(AttemptOutcome::Unknown) => {
            Some(outcome_unknown(run, &last.endpoint, watched, deadline, last.detail, abort).await)
        }
        Some(_) => None,
    }
}

/// Waits for the host to settle (safety rule 13), then fails `compose_outcome_unknown`: the
/// outcome is for a human to judge from `docker ps`, never a blind resend.
async fn outcome_unknown(
    run: &StepRun<'_>,
    endpoint: &str,
    watched: &[String],
    deadline: DateTime<Utc>,
    detail: serde_json::Value,
    abort: &CancellationToken,
) -> StepEnd {
    let client = &run.ctx.host.client;
    let started = run.ctx.now();
    let limit = deadline.max(started + chrono::Duration::seconds(30));
    let settle = settle(run, watched, limit, abort).await;
    run.settle_checked
        .store(true, std::sync::atomic::Ordering::Relaxed);
    if settle.aborted {
        // Nothing is sent either way; the outcome stays for a human to judge.
        let waited_ms = (run.ctx.now() - started).num_milliseconds();
        return StepEnd::Aborted(
            json!({"call": detail, "outcome": "unknown", "host_idle": settle.host_idle, "target_settled": false, "waited_ms": waited_ms}),
        );
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
    StepEnd::failed(
        ErrorCode::ComposeOutcomeUnknown,
        msg,
        json!({"call": detail, "host_idle": idle, "target_settled": settle.settled, "settle": settle.evidence(), "waited_ms": waited_ms, "target_container": target, "target_before": before, "target_changed_since_snapshot": changed}),
    )
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
    fn evidence(&self) -> serde_json::Value {
        json!({"settled": self.settled, "host_idle": self.host_idle, "ps_reads": self.reads, "target_changes": self.changes})
    }
}

/// Safety rule 13: waits until `GET /status` reads idle **and** the containers of `watched`
/// (the call's services: the target, or a companion step's list) are the same (id, image,
/// state) in two `GET /docker/ps` reads `settle_interval` apart, or until `limit`.
/// compose-manager frees its lock with the HTTP stream, not with the `docker compose` child:
/// after a stream that ended early, idle alone does not mean done.
async fn settle(
    run: &StepRun<'_>,
    watched: &[String],
    limit: DateTime<Utc>,
    abort: &CancellationToken,
) -> Settle {
    let client = &run.ctx.host.client;
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
async fn settle_before_first_call(
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
    let target = [run.rollout.target().to_owned()];
    let settle = settle(run, &target, deadline, abort).await;
    if settle.aborted {
        return Some(StepEnd::Aborted(json!({"settle": settle.evidence()})));
    }
    if !settle.settled {
        let msg = format!(
            "{of} ended with a compose call of unknown outcome and the host did not settle before the deadline (idle and {} unchanged across two docker ps reads): nothing sent",
            run.rollout.target()
        );
        return Some(StepEnd::failed(
            ErrorCode::HostUnsettled,
            msg,
            json!({"settle": settle.evidence()}),
        ));
    }
    None
}

async fn check_tag(run: &StepRun<'_>, detail: serde_json::Value) -> StepEnd {
    let (Some(commit), Some(sha)) = (&run.rollout.expect_commit, &run.rollout.expect_file_sha256)
    else {
        return StepEnd::Succeeded(detail);
    };
    let version = match run.ctx.host.client.version().await {
        Ok(v) => v,
        Err(e) => {
            return StepEnd::failed(
                e.code(),
                format!("could not read /version after the up: {e}"),
                detail,
            )
        }
    };
    let current = version
        .projects
        .get(&run.ctx.host.config.project)
        .and_then(|p| p.current.clone());
    let (got_commit, got_sha) = match &current {
        Some(c) => (c.commit.clone(), c.file_sha256.clone()),
        None => (version.commit.clone(), version.file_sha256.clone()),
    };
    if got_commit.as_deref() == Some(commit.as_str()) && got_sha.as_deref() == Some(sha.as_str()) {
        return StepEnd::Succeeded(detail);
    }
    let msg = format!(
        "tag {} now points at other content: expected commit {commit} and file sha256 {sha}, host reports {got_commit:?} / {got_sha:?}",
        run.rollout.tag
    );
    StepEnd::failed(
        ErrorCode::TagMoved,
        msg,
        json!({"call": detail, "expected": {"commit": commit, "file_sha256": sha}, "got": {"commit": got_commit, "file_sha256": got_sha}}),
    )
}

async fn call_error(run: &StepRun<'_>, attempt: &str, error: ComposeError) -> StepEnd {
    finish(
        run,
        attempt,
        AttemptOutcome::Error,
        json!({"error": error.to_string()}),
    )
    .await;
    let mut message = error.to_string();
    if matches!(error, ComposeError::Unauthorized { .. }) {
        // Where the token comes from, as `canaryd doctor` says it.
        message.push_str(&format!(
            " (canaryd sends the token in the env var named by hosts.{}.token_env: set it to \
             this host's compose-manager token and restart canaryd; `canaryd doctor` checks it)",
            run.rollout.host
        ));
    }
    StepEnd::failed(error.code(), message, json!({}))
}

fn out_of_time(what: &str, last_error: String) -> StepEnd {
    let msg = format!("{what} could not be sent before the step deadline: {last_error}");
    StepEnd::failed(
        ErrorCode::StepTimeout,
        msg,
        json!({"last_error": last_error}),
    )
}

async fn finish(
    run: &StepRun<'_>,
    attempt: &str,
    outcome: AttemptOutcome,
    detail: serde_json::Value,
) {
    if let Err(e) = run
        .ctx
        .store
        .finish_attempt(attempt, outcome, &detail, run.ctx.now())
        .await
    {
        tracing::error!(rollout.id = %run.rollout.id, error = %e, "could not record the outcome of attempt {attempt}");
    }
}

fn outcome_name(o: &StreamOutcome) -> AttemptOutcome {
    match o {
        StreamOutcome::Succeeded => AttemptOutcome::Succeeded,
        StreamOutcome::Failed { .. } => AttemptOutcome::Failed,
        StreamOutcome::Unknown => AttemptOutcome::Unknown,
    }
}

#[cfg(test)]
pub(crate) mod tests;
