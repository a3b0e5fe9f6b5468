//! The steps that call compose-manager with side effects (or a dry run): plan, stage, down, up,
//! each scoped to the target or the step's companions. Every call goes through
//! [`attempt`]: written ahead, retried only where that is safe, never resent when its outcome
//! is unknown.

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::compose::{ComposeRequest, ForceRecreate, Services, StreamOutcome};
use crate::domain::error_code::ErrorCode;
use crate::domain::names::{ComposeFile, ServiceName, Tag};
use crate::domain::plan_gate;
use crate::domain::plan_gate::DryRunPlan;
use crate::domain::runbook::step::call::{CallDetail, CallFailure, TagContent};
use crate::domain::runbook::step::plan::PlanEvidence;
use crate::domain::runbook::step::up::{ComposeEvidence, Replaced, Replaces};
use crate::domain::runbook::step::{evidence, Down, Plan, Scope, Up};
use crate::domain::state::RolloutKind;
use crate::engine::step_run::{Evidence, Execute, Running, StepEnd, StepRun};
use crate::store::Step;

mod attempt;
mod stage;
use attempt::{
    call, call_error, close_dangling_attempts, finish, mutate, out_of_time, outcome_name,
    settle_before_first_call, Call,
};

/// The request of a step's compose call: the rollout's tag, file and env, and the step's
/// scope — the target alone, or the step's companion services (`services`, narrowed to what the
/// dry run planned for a reconcile). Safety rule 15, checked again here (fail closed): a
/// companion list never names the target nor a configured replica, and `force_recreate`
/// exists only for services of the config's `force_recreate_allowed`.
fn compose_request(
    run: &StepRun<'_>,
    scope: &Scope,
    services: Option<&[ServiceName]>,
) -> Result<ComposeRequest, StepEnd> {
    // A refusal keeps the companion list (`services`, as a gate's evidence and an up's do).
    let refuse = |msg: String| {
        let detail = ComposeEvidence {
            services: Some(scope.services.clone()),
            ..ComposeEvidence::default()
        };
        StepEnd::failed(ErrorCode::InvalidRequest, msg, Evidence::of(&detail))
    };
    let services = if scope.is_companion() {
        let names = services.unwrap_or(&scope.services).to_vec();
        let host = &run.ctx.host;
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
        Services::one(run.rollout.target().clone())
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
    let client = run.ctx.calls;
    match client.supports_dry_run().await {
        Ok(true) => {}
        Ok(false) => {
            let msg = "compose-manager does not support dry_run (POST /docker/evict answered 404): an older \
                       server would ignore dry_run and deploy for real";
            let detail = PlanEvidence {
                probe: Some("404".to_owned()),
                ..PlanEvidence::default()
            };
            return StepEnd::failed(
                ErrorCode::ComposeManagerUnsupported,
                msg,
                Evidence::of(&detail),
            );
        }
        Err(e) => {
            let msg = format!("could not probe compose-manager for dry_run support: {e}");
            let detail = PlanEvidence {
                probe_error: Some(e.code().as_str().to_owned()),
                ..PlanEvidence::default()
            };
            return StepEnd::failed(
                ErrorCode::ComposeManagerUnsupported,
                msg,
                Evidence::of(&detail),
            );
        }
    }
    close_dangling_attempts(run, step, "dry run").await;
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
            finish(run, &attempt, outcome, &dry_run_detail(&value)).await;
            value
        }
        Call::Error { attempt, error } => return call_error(run, &attempt, error).await,
        Call::Aborted => return StepEnd::Aborted(Evidence::none()),
        Call::OutOfTime { last_error } => return out_of_time("dry run", last_error),
    };
    let tail = result.stream.transcript_tail.clone();
    if result.stream.outcome != StreamOutcome::Succeeded {
        let msg = format!(
            "the dry run did not succeed ({})",
            outcome_name(&result.stream.outcome)
        );
        let detail = PlanEvidence {
            plan: Some(result.plan),
            tail: Some(tail),
            ..PlanEvidence::default()
        };
        return StepEnd::failed(ErrorCode::DryRunFailed, msg, Evidence::of(&detail));
    }
    let Some(dry_plan) = result.plan else {
        let detail = PlanEvidence {
            tail: Some(tail),
            ..PlanEvidence::default()
        };
        return StepEnd::failed(
            ErrorCode::DryRunNoPlan,
            "the dry run answered without a plan event",
            Evidence::of(&detail),
        );
    };
    let companion = spec.scope.is_companion();
    let checked = if companion {
        let services = &spec.scope.services;
        let only = spec.scope.only_out_of_date;
        plan_gate::check_companions(&dry_plan, services, allow, only).map(Some)
    } else {
        let (target, replaced) = (
            run.rollout.target(),
            run.rollout.replaced().map(|s| s.as_str()),
        );
        plan_gate::check_rename(&dry_plan, target, replaced, allow).map(|()| None)
    };
    let mut detail = PlanEvidence {
        plan: Some(Some(dry_plan)),
        allow: Some(allow.to_vec()),
        services: companion.then(|| spec.scope.services.clone()),
        tail: Some(tail),
        ..PlanEvidence::default()
    };
    match checked {
        Ok(apply) => {
            detail.apply = apply;
            StepEnd::Succeeded(Evidence::of(&detail))
        }
        Err(violation) => {
            detail.violation = Some(violation.to_string());
            let mut message = violation.to_string();
            if violation.missing_target && !companion {
                message.push_str(&unchanged_hint(run).await);
            }
            StepEnd::failed(violation.code(), message, Evidence::of(&detail))
        }
    }
}

/// Why a dry run may not plan the target, when the replica's recorded deployment is already
/// this rollout's file and tag: `; r2 runs v0.0.452 with overrides {K}; this rollout sets
/// none`. Empty when nothing is recorded or the file or tag differ.
async fn unchanged_hint(run: &StepRun<'_>) -> String {
    let r = &run.rollout;
    let Ok(newest) = run
        .ctx
        .store
        .recent_deployments(&r.host, &r.service, 1)
        .await
    else {
        return String::new();
    };
    let Some(d) = newest
        .first()
        .filter(|d| d.file == r.file && d.tag == r.tag)
    else {
        return String::new();
    };
    let keys =
        |env: &std::collections::BTreeMap<String, String>| match env.keys().collect::<Vec<_>>() {
            keys if keys.is_empty() => "none".to_owned(),
            keys => format!(
                "{{{}}}",
                keys.iter()
                    .map(|k| k.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
    if d.env_overrides == r.env_overrides {
        format!(
            "; {} already runs {} with the same overrides ({}): there is nothing to deploy",
            r.service,
            r.tag,
            keys(&d.env_overrides)
        )
    } else {
        format!(
            "; {} runs {} with overrides {}; this rollout sets {}: give it the same env (a \
             release: the canary's `env`) or a new tag",
            r.service,
            r.tag,
            keys(&d.env_overrides),
            keys(&r.env_overrides)
        )
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
async fn replaced_deployment(
    run: &StepRun<'_>,
    replaces: &crate::domain::plan::Replaces,
) -> Result<(ComposeFile, Tag), StepEnd> {
    let old = &replaces.service;
    if let (Some(file), Some(tag)) = (&replaces.file, &replaces.tag) {
        return Ok((file.clone(), tag.clone()));
    }
    let store = run.ctx.store;
    let recorded = store
        .deployment_named(&run.rollout.host, &run.rollout.service, old)
        .await
        .map_err(|e| StepEnd::failed(ErrorCode::StorageError, e.to_string(), Evidence::none()))?;
    let Some(d) = recorded else {
        let msg = format!(
            "no deployment of `{old}` is recorded for {} on {} (nor a baseline): give replaces.file and replaces.tag; nothing sent",
            run.rollout.service, run.rollout.host
        );
        let detail = ComposeEvidence {
            replaces: Some(Replaces::Named(old.to_string())),
            ..ComposeEvidence::default()
        };
        return Err(StepEnd::failed(
            ErrorCode::InvalidRequest,
            msg,
            Evidence::of(&detail),
        ));
    };
    let file = replaces.file.clone().unwrap_or(d.file);
    Ok((file, replaces.tag.clone().unwrap_or(d.tag)))
}

/// The `down` of a rename (docs/reference.md#renamed-replicas): the former service, scoped
/// alone, with the file and tag that deployed it. compose-manager's down runs against the file
/// on disk, which the gate's dry run of the new tag overwrote (a file that no longer defines
/// the former service): a dry run of the former service at its own tag, read-only, puts its
/// file back first, and must plan no recreate and no removal. Never resent after a restart:
/// once a down attempt exists, it is reconciled like any other.
async fn rename_down(run: &StepRun<'_>, at: &mut Running<'_>) -> StepEnd {
    let Some(replaced) = &run.rollout.replaces else {
        return StepEnd::failed(ErrorCode::InvalidRequest, "no replaces", Evidence::none());
    };
    let old = &replaced.service;
    let (file, tag) = match replaced_deployment(run, replaced).await {
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
            return StepEnd::failed(ErrorCode::StorageError, msg, Evidence::none());
        }
    };
    let replaces = Replaced {
        service: old.to_string(),
        file: file.to_string(),
        tag: tag.to_string(),
    };
    let mut restored = None;
    if !down_sent {
        match materialize(run, at, &req).await {
            Ok(plan) => restored = Some(plan),
            Err(end) => return end,
        }
    }
    match scoped(run, at, Scoped::Down, req).await {
        StepEnd::Succeeded(detail) => {
            let mut detail = evidence::<Down>(detail.json()).unwrap_or_default();
            detail.replaces = Some(Replaces::Deployed(replaces));
            detail.file_restored_by_dry_run = restored;
            StepEnd::Succeeded(Evidence::of(&detail))
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
    let client = run.ctx.calls;
    if client.supports_dry_run().await != Ok(true) {
        let msg = "compose-manager does not answer the dry_run probe: the former service's file cannot be put back without a deploy; nothing sent";
        return Err(StepEnd::failed(
            ErrorCode::ComposeManagerUnsupported,
            msg,
            Evidence::none(),
        ));
    }
    close_dangling_attempts(run, at.step, "dry run").await;
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
            finish(run, &attempt, outcome, &dry_run_detail(&value)).await;
            value
        }
        Call::Error { attempt, error } => return Err(call_error(run, &attempt, error).await),
        Call::Aborted => {
            let detail = ComposeEvidence {
                sent: Some(false),
                ..ComposeEvidence::default()
            };
            return Err(StepEnd::Aborted(Evidence::of(&detail)));
        }
        Call::OutOfTime { last_error } => return Err(out_of_time("dry run", last_error)),
    };
    let tail = result.stream.transcript_tail.clone();
    let refused = |plan: Option<DryRunPlan>| {
        Evidence::of(&ComposeEvidence {
            plan: Some(plan),
            tail: Some(tail.clone()),
            ..ComposeEvidence::default()
        })
    };
    let plan = match (&result.stream.outcome, result.plan) {
        (StreamOutcome::Succeeded, Some(plan)) => plan,
        (_, plan) => {
            let msg = format!(
                "the dry run of `{}` at {} {} did not succeed: that file and tag do not deploy it as it runs; no down sent",
                req.services.names().join(", "),
                req.file,
                req.tag
            );
            return Err(StepEnd::failed(ErrorCode::DryRunFailed, msg, refused(plan)));
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
            refused(Some(plan)),
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
                    return StepEnd::Succeeded(Evidence::of(&detail));
                }
                Some(apply) => Some(apply.clone()),
                None => {
                    let msg = format!(
                        "no passing dry run of {} in this rollout to reconcile from: nothing sent",
                        scope.shown()
                    );
                    let detail = ComposeEvidence {
                        services: Some(scope.services.clone()),
                        ..ComposeEvidence::default()
                    };
                    return StepEnd::failed(ErrorCode::InvalidRequest, msg, Evidence::of(&detail));
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
    let client = run.ctx.calls;
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
    let companions = (req.services.names() != [run.rollout.target().clone()])
        .then(|| req.services.names().to_vec());
    let watched = req.services.names();
    match mutate(run, at.step, endpoint, watched, at.deadline, at.abort, send).await {
        StepEnd::Succeeded(detail) if companions.is_some() => {
            let mut detail = evidence::<Up>(detail.json()).unwrap_or_default();
            detail.services = companions;
            StepEnd::Succeeded(Evidence::of(&detail))
        }
        other => other,
    }
}

async fn check_tag(run: &StepRun<'_>, detail: Evidence) -> StepEnd {
    let (Some(commit), Some(sha)) = (&run.rollout.expect_commit, &run.rollout.expect_file_sha256)
    else {
        return StepEnd::Succeeded(detail);
    };
    let version = match run.ctx.calls.version().await {
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
        .get(&run.ctx.host.project)
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
    let failure = CallFailure {
        call: serde_json::from_value(detail.into_json()).ok(),
        expected: Some(TagContent {
            commit: Some(commit.clone()),
            file_sha256: Some(sha.clone()),
        }),
        got: Some(TagContent {
            commit: got_commit,
            file_sha256: got_sha,
        }),
        ..CallFailure::default()
    };
    StepEnd::failed(ErrorCode::TagMoved, msg, Evidence::of(&failure))
}

/// A dry run's attempt detail: its plan (`null` without one) and its last lines.
fn dry_run_detail(result: &crate::compose::DryRunResult) -> CallDetail {
    CallDetail {
        plan: Some(result.plan.clone()),
        tail: Some(result.stream.transcript_tail.clone()),
        ..CallDetail::default()
    }
}

#[cfg(test)]
pub(crate) mod tests;
