//! The task of one rollout: start, run each step in order, finish (succeeded, failed with an
//! optional automatic rollback, or aborted). Resumes from whatever SQLite says after a restart.

use std::future::Future;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::step_run::{Evidence, StepEnd, StepRun};
use super::steps;
use super::{admission, rollback, Checkpoint, Engine, SYSTEM_ACTOR};
use crate::config::EngineTuning;
use crate::domain::audit::ChangeDetail;
use crate::domain::error_code::{ErrorCode, StepFailure};
use crate::domain::rollout::{self, Interrupted, Next, Turn, TurnFacts};
use crate::domain::runbook::{Runbook, Step as StepSpec};
use crate::domain::state::{
    DeploymentSource, RolloutEvent, RolloutKind, RolloutStatus, StepEvent, StepStatus,
};
use crate::store::{NewDeployment, Rollout, RolloutChange, Step};

/// Runs a rollout to a terminal state. Errors of the store are logged once, here.
///
/// A write that fails on the storage (a full disk, an I/O error) is tried again in place for
/// as long as it fails (`store::for_rollout`, safety rule 18): the task sends nothing more
/// meanwhile and goes on from what it knows. Any other database error stops the drive; it is
/// resumed from SQLite as after a restart, a few times with backoff, before giving up until
/// next start.
///
/// `abort` is the rollout's abort signal (cancelled by an abort request or a shutdown).
pub(crate) async fn run(engine: &Engine, id: &str, abort: CancellationToken) {
    let drive_once = || {
        let span = tracing::info_span!(
            "rollout",
            rollout.id = %id,
            host = tracing::field::Empty,
            service = tracing::field::Empty
        );
        // On the heap: inline, the drive was copied into each future wrapping it (the
        // retries, the storage scope), about 30 KB a rollout task in all.
        Box::pin(drive(engine, id, abort.clone()).instrument(span))
    };
    let timings = engine.inner.timings;
    let drives = retry_storage_errors(id, &timings, || engine.is_stopping(), drive_once);
    // Boxed: each scope around it would otherwise hold a copy of the whole future.
    let writes = crate::store::for_rollout(
        id,
        timings.storage_retry_initial,
        timings.storage_retry_max,
        Box::pin(drives),
    );
    writes.await;
}

/// Drives until a drive ends without error: `storage_tries` drives at most,
/// `storage_retry_initial` (doubling) apart, none after `stopping()`. True when a drive ended
/// well.
async fn retry_storage_errors<Fut>(
    id: &str,
    timings: &EngineTuning,
    stopping: impl Fn() -> bool,
    mut drive: impl FnMut() -> Fut,
) -> bool
where
    Fut: Future<Output = Result<(), super::EngineError>>,
{
    let tries = timings.storage_tries;
    let mut backoff = timings.storage_retry_initial;
    for n in 1..=tries {
        let Err(e) = drive().await else {
            return true;
        };
        if n == tries || stopping() {
            tracing::error!(rollout.id = %id, error = %e, "rollout {id} stopped on a storage error; it resumes at next start");
            return false;
        }
        tracing::warn!(rollout.id = %id, error = %e, retry_in_ms = backoff.as_millis() as u64, "rollout {id} hit a storage error; resuming it from the database");
        tokio::time::sleep(backoff).await;
        backoff *= 2;
    }
    false
}

/// One drive of the rollout: loads it, then takes step after step (decided by
/// `domain::rollout`, carried out here) until the rollout ends, the daemon stops or a database
/// error stops it.
async fn drive(
    engine: &Engine,
    id: &str,
    abort: CancellationToken,
) -> Result<(), super::EngineError> {
    let Some(mut drive) = Drive::load(engine, id, abort).await? else {
        return Ok(());
    };
    loop {
        // A step that ended the rollout's work (weights already staged): the rest is skipped.
        let done = drive
            .steps
            .iter()
            .find(|s| s.status == StepStatus::Succeeded && completes_rollout(s.kind, &s.detail));
        if let Some(done) = done {
            let position = done.position;
            skip_rest(engine, &drive.steps, position).await?;
            for s in drive.steps.iter_mut().filter(|s| s.position > position) {
                if s.status == StepStatus::Pending {
                    s.status = StepStatus::Skipped;
                }
            }
        }
        let statuses: Vec<StepStatus> = drive.steps.iter().map(|s| s.status).collect();
        let i = match rollout::next(&statuses) {
            Next::Succeed => {
                let touched = drive.run.touched.load(std::sync::atomic::Ordering::Relaxed);
                return finish_succeeded(engine, &drive.rollout, &drive.steps, touched).await;
            }
            Next::FinishFailed(i) => return drive.finish_recorded_failure(i).await,
            Next::Turn(i) => i,
        };
        let Some((step, spec)) = drive.begin_turn(i).await? else {
            return Ok(());
        };
        let end = drive.run_step(&step, spec).await;
        if !drive.apply(i, step, end).await? {
            return Ok(());
        }
    }
}

/// A drive between steps: the rollout, its steps as stored (and as this drive changed them),
/// and the configuration it runs by.
struct Drive<'e> {
    engine: &'e Engine,
    abort: CancellationToken,
    /// The admission of a canary started with others, released at its first waiting step.
    admitted: Option<admission::Admitted>,
    rollout: Rollout,
    steps: Vec<Step>,
    runbook: &'e Runbook,
    run: StepRun<'e>,
    /// The steps before `restored` are in `run`: restored from their rows, or run by this drive.
    restored: usize,
    /// The step the previous boundary already started, in the transaction that ended the
    /// previous step (`Store::succeed_step_and_start_next`).
    started_next: Option<Step>,
}

impl<'e> Drive<'e> {
    /// Reads the rollout and starts it if pending; `None` when there is nothing to drive (it
    /// has ended, or its runbook or host is gone from the config and it was ended for that).
    async fn load(
        engine: &'e Engine,
        id: &str,
        abort: CancellationToken,
    ) -> Result<Option<Drive<'e>>, super::EngineError> {
        let store = &engine.inner.store;
        let mut rollout = engine.get(id).await?;
        if rollout.status.is_terminal() {
            return Ok(None);
        }
        // Canaries started together take their first steps in arrival order (`admission`);
        // an abort or a shutdown ends the queueing at once, and a rollback never queues.
        let admitted = if rollout.kind == RolloutKind::Canary {
            tokio::select! {
                admitted = engine.inner.start_gate.admit() => Some(admitted),
                _ = abort.cancelled() => None,
            }
        } else {
            None
        };
        tracing::Span::current()
            .record("host", rollout.host.as_str())
            .record("service", rollout.service.as_str());
        crate::store::note_rollout(&rollout.host, &rollout.service, rollout.target());
        if rollout.status == RolloutStatus::Pending {
            engine.checkpoint(id, Checkpoint::RolloutStart).await;
            let now = engine.inner.clock.now();
            let start = change(RolloutEvent::Start, None, ChangeDetail::default(), now);
            rollout = store.transition_rollout(id, &start).await?;
            tracing::info!(rollout.id = %id, host = %rollout.host, service = %rollout.service, "rollout {id} started");
        }
        let steps = store.steps(id).await?;
        // The config may have changed under a resumed rollout: it is then ended clearly
        // rather than guessed at.
        let configured = match (engine.runbook(&rollout.runbook), engine.host(&rollout.host)) {
            (Err(e), _) => Err((ErrorCode::RunbookNotLoaded, e.to_string())),
            (_, Err(e)) => Err((ErrorCode::HostNotConfigured, e.to_string())),
            (Ok(runbook), Ok(_)) => Ok((runbook, StepRun::new(engine, &rollout)?)),
        };
        let (runbook, run) = match configured {
            Ok(configured) => configured,
            Err((code, message)) => {
                // Failed at its first step not ended (pending or running), if any.
                let current = steps.iter().find(|s| !s.status.is_terminal());
                finish_unconfigured(engine, &rollout, &steps, current, code, &message).await?;
                return Ok(None);
            }
        };
        Ok(Some(Drive {
            engine,
            abort,
            admitted,
            rollout,
            steps,
            runbook,
            run,
            restored: 0,
            started_next: None,
        }))
    }

    /// The step at `i` failed, its rollout did not (a restart or a storage error in between):
    /// finishes the rollout from the recorded failure, never running the step again.
    async fn finish_recorded_failure(&self, i: usize) -> Result<(), super::EngineError> {
        let step = &self.steps[i];
        let error = StepFailure::of(&step.detail).unwrap_or_default();
        let code = error
            .code
            .unwrap_or_else(|| ErrorCode::StepFailed.as_str().to_owned());
        let message = error.message.unwrap_or_else(|| "failed".to_owned());
        let detail = Evidence::as_stored(step.detail.clone());
        let (engine, rollout) = (self.engine, &self.rollout);
        finish_failed(engine, rollout, &self.steps, step, &code, &message, detail).await
    }

    /// The turn of the step at `i`: its started row and its runbook entry, or `None` when the
    /// rollout ended (aborted, or failed `runbook_changed`) or the daemon is stopping.
    async fn begin_turn(
        &mut self,
        i: usize,
    ) -> Result<Option<(Step, &'e StepSpec)>, super::EngineError> {
        let (engine, id) = (self.engine, self.rollout.id.as_str());
        for done in &self.steps[self.restored..i] {
            self.run.restore(done);
        }
        let step = &self.steps[i];
        engine.checkpoint(id, Checkpoint::Before(&step.name)).await;
        let pre_started = self.started_next.take().filter(|s| s.id == step.id);
        // A step started with the previous one's end was started where no abort was
        // requested: one came since only if the rollout's abort signal says so.
        let abort_requested = match &pre_started {
            Some(_) => self.abort.is_cancelled() && rollout_abort_requested(engine, id).await?,
            None => rollout_abort_requested(engine, id).await?,
        };
        let spec = self.runbook.steps.get(step.position as usize);
        let facts = TurnFacts {
            abort_requested,
            stopping: engine.is_stopping(),
            in_runbook: spec.is_some(),
            status: step.status,
            started_with_previous: pre_started.is_some(),
        };
        let (resumed, spec) = match (rollout::turn(facts), spec) {
            (Turn::Abort, _) => {
                let current = pre_started.as_ref().unwrap_or(step);
                finish_aborted(engine, &self.rollout, Some(current)).await?;
                return Ok(None);
            }
            (Turn::Pause, _) => {
                tracing::info!(rollout.id = %id, step.name = %step.name, "shutting down: rollout {id} resumes at step {} at next start", step.name);
                return Ok(None);
            }
            (Turn::Run { resumed }, Some(spec)) => (resumed, spec),
            (Turn::NotInRunbook | Turn::Run { .. }, _) => {
                let msg = format!("step {} is not in runbook {}", step.name, self.runbook.name);
                let code = ErrorCode::RunbookChanged.as_str();
                let (rollout, steps) = (&self.rollout, &self.steps);
                finish_failed(engine, rollout, steps, step, code, &msg, Evidence::none()).await?;
                return Ok(None);
            }
        };
        if admission::waits(&spec.kind) {
            if let Some(admitted) = &self.admitted {
                admitted.release();
            }
        }
        self.run.resumed = resumed;
        let step = match pre_started {
            Some(started) => started,
            None => start_step(engine, step, &spec.kind).await?,
        };
        engine.checkpoint(id, Checkpoint::Started(&step.name)).await;
        Ok(Some((step, spec)))
    }

    /// Runs a started step: the signals later steps need first, when it is the first call of
    /// the target (safety rule 20), then its executor.
    async fn run_step(&mut self, step: &Step, spec: &StepSpec) -> StepEnd {
        let span = tracing::info_span!("step", step.name = %step.name, step.kind = %step.kind);
        match super::preflight::look(&self.run, self.runbook, step, &spec.kind).await {
            Err(unavailable) => unavailable,
            Ok(signals) => {
                let end = self.run.execute(step, &spec.kind, &self.abort);
                super::preflight::with_evidence(end.instrument(span).await, signals)
            }
        }
    }

    /// Records how the step at `i` ended; true when the drive goes on to the next step.
    async fn apply(
        &mut self,
        i: usize,
        step: Step,
        end: StepEnd,
    ) -> Result<bool, super::EngineError> {
        let (engine, id) = (self.engine, self.rollout.id.clone());
        let store = &engine.inner.store;
        match end {
            StepEnd::Succeeded(detail) => {
                let detail = detail.into_json();
                // The next step starts in the same transaction, unless the daemon is stopping
                // (it resumes there at next start) or the runbook no longer has it (its turn
                // fails it `runbook_changed`).
                let now = engine.inner.clock.now();
                let completes = completes_rollout(step.kind, &detail);
                let next = self
                    .steps
                    .get(i + 1)
                    .filter(|n| n.status == StepStatus::Pending && !engine.is_stopping())
                    .filter(|_| !completes)
                    .and_then(|n| {
                        let spec = self.runbook.steps.get(n.position as usize)?;
                        Some((n, steps::timeout_of(&spec.kind).map(|t| now + t)))
                    });
                let started = store
                    .succeed_step_and_start_next(&step, &detail, next, now)
                    .await?;
                tracing::info!(rollout.id = %id, step.name = %step.name, "step {} of {id} succeeded", step.name);
                self.run.after_success(&step, &detail);
                self.started_next = next
                    .filter(|_| started)
                    .map(|(n, deadline)| started_row(n, deadline, now));
                self.steps[i] = Step {
                    status: StepStatus::Succeeded,
                    detail,
                    ..step
                };
                if let Some(started) = &self.started_next {
                    self.steps[i + 1] = started.clone();
                }
                self.restored = i + 1;
                Ok(true)
            }
            StepEnd::Failed {
                code,
                message,
                detail,
            } => {
                tracing::warn!(rollout.id = %id, step.name = %step.name, code = %code, "step {} of {id} failed: {message}", step.name);
                let rollout = engine.get(&id).await?;
                let code = code.as_str();
                finish_failed(engine, &rollout, &self.steps, &step, code, &message, detail).await?;
                Ok(false)
            }
            StepEnd::Aborted(detail) => {
                // Only an interruption during a shutdown asks whether it was an abort after all.
                let stopping = engine.is_stopping();
                let abort_requested = stopping && rollout_abort_requested(engine, &id).await?;
                match rollout::interrupted(stopping, abort_requested) {
                    Interrupted::Pause => {
                        // The step stays running and resumes with its original deadline.
                        tracing::info!(rollout.id = %id, step.name = %step.name, "shutting down: step {} of {id} resumes at next start", step.name);
                    }
                    Interrupted::Abort => {
                        let now = engine.inner.clock.now();
                        store
                            .transition_step(&step, StepEvent::Abort, detail.json(), None, now)
                            .await?;
                        finish_aborted(engine, &self.rollout, None).await?;
                    }
                }
                Ok(false)
            }
        }
    }
}

/// Ends a rollout whose runbook or host is no longer configured: aborted when an abort was
/// requested, else failed with `code` at its first unfinished step (or, without one, the
/// rollout alone).
async fn finish_unconfigured(
    engine: &Engine,
    rollout: &Rollout,
    steps: &[Step],
    current: Option<&Step>,
    code: ErrorCode,
    message: &str,
) -> Result<(), super::EngineError> {
    let id = &rollout.id;
    if rollout_abort_requested(engine, id).await? {
        return finish_aborted(engine, rollout, current).await;
    }
    let Some(step) = current else {
        let ch = change(
            RolloutEvent::Fail,
            Some((code.as_str(), message)),
            ChangeDetail::default(),
            engine.inner.clock.now(),
        );
        engine.inner.store.transition_rollout(id, &ch).await?;
        return Ok(());
    };
    tracing::error!(rollout.id = %id, code = %code, "rollout {id} cannot go on: {message}");
    finish_failed(
        engine,
        rollout,
        steps,
        step,
        code.as_str(),
        message,
        Evidence::none(),
    )
    .await
}

async fn start_step(
    engine: &Engine,
    step: &Step,
    kind: &crate::domain::runbook::StepKind,
) -> Result<Step, super::EngineError> {
    let store = &engine.inner.store;
    if step.status != StepStatus::Pending {
        // Resumed: the row already holds its start time and original deadline.
        return Ok(step.clone());
    }
    let now = engine.inner.clock.now();
    let deadline = steps::timeout_of(kind).map(|t| now + t);
    store
        .transition_step(
            step,
            StepEvent::Start,
            Evidence::none().json(),
            deadline,
            now,
        )
        .await?;
    Ok(started_row(step, deadline, now))
}

/// What a pending step's row says once started at `now`, without reading every step back.
fn started_row(step: &Step, deadline: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Step {
    let mut started = step.clone();
    started.status = StepStatus::Running;
    started.attempts += 1;
    started.started_at = started.started_at.or(Some(now));
    started.deadline_at = started.deadline_at.or(deadline);
    started.detail = Evidence::none().into_json();
    started
}

/// A change of the rollout's status by canaryd itself, at `at` (the engine's clock).
pub(super) fn change(
    event: RolloutEvent,
    error: Option<(&str, &str)>,
    detail: ChangeDetail,
    at: DateTime<Utc>,
) -> RolloutChange {
    RolloutChange {
        event,
        actor: SYSTEM_ACTOR.to_owned(),
        error: error.map(|(c, m)| (c.to_owned(), m.to_owned())),
        detail,
        at,
    }
}

async fn rollout_abort_requested(engine: &Engine, id: &str) -> Result<bool, super::EngineError> {
    Ok(engine.get(id).await?.abort_reason.is_some())
}

/// Whether a step of `kind` that succeeded with `detail` found nothing left to do: a weights
/// pre-stage's gate that found the weights cached (`already_staged`). The steps after it are
/// skipped.
fn completes_rollout(
    kind: crate::domain::runbook::StepKindName,
    detail: &serde_json::Value,
) -> bool {
    use crate::domain::runbook::step::{evidence, FreeSpace};
    kind == crate::domain::runbook::StepKindName::FreeSpace
        && evidence::<FreeSpace>(detail).is_some_and(|e| e.already_staged == Some(true))
}

/// Marks every step after `from` (exclusive) that never ran as skipped.
async fn skip_rest(
    engine: &Engine,
    steps: &[Step],
    from_position: i64,
) -> Result<(), super::EngineError> {
    for step in steps
        .iter()
        .filter(|s| s.position > from_position && s.status == StepStatus::Pending)
    {
        engine
            .inner
            .store
            .transition_step(
                step,
                StepEvent::Skip,
                Evidence::none().json(),
                None,
                engine.inner.clock.now(),
            )
            .await?;
    }
    Ok(())
}

/// `touched`: whether the rollout touched its replica (the drive's `StepRun` knows it, this
/// drive's calls included).
async fn finish_succeeded(
    engine: &Engine,
    rollout: &Rollout,
    steps: &[Step],
    touched: bool,
) -> Result<(), super::EngineError> {
    // A rollout that never touched its replica (a weights pre-stage) deployed nothing to it.
    if !touched {
        let ch = change(
            RolloutEvent::Succeed,
            None,
            ChangeDetail::default(),
            engine.inner.clock.now(),
        );
        engine
            .inner
            .store
            .transition_rollout(&rollout.id, &ch)
            .await?;
        tracing::info!(rollout.id = %rollout.id, "rollout {} succeeded without touching {}", rollout.id, rollout.service);
        return Ok(());
    }
    let host = engine.host(&rollout.host)?;
    // What the host reports now: the commit and file hash of the tag, the replica's image.
    let version = host.client.version().await.ok();
    let current = version
        .as_ref()
        .and_then(|v| v.projects.get(&host.config.project))
        .and_then(|p| p.current.clone());
    let image = match host.client.ps().await {
        Ok(ps) => ps
            .into_iter()
            .find(|c| c.names == rollout.target().as_str())
            .map(|c| c.image),
        Err(_) => None,
    };
    let deployment = NewDeployment {
        host: rollout.host.clone(),
        service: rollout.service.clone(),
        file: rollout.file.clone(),
        tag: rollout.tag.clone(),
        env_overrides: rollout.env_overrides.clone(),
        env_sha256: Some(rollout.env_sha256.clone()),
        commit: current.as_ref().and_then(|c| c.commit.clone()),
        file_sha256: current.as_ref().and_then(|c| c.file_sha256.clone()),
        image,
        source: DeploymentSource::Rollout,
        rollout_id: Some(rollout.id.clone()),
        deployed_at: engine.inner.clock.now(),
        deployed_as: rollout.deploy_as.clone(),
    };
    let detail = ChangeDetail {
        tag: Some(rollout.tag.to_string()),
        commit: Some(deployment.commit.clone()),
        image: Some(deployment.image.clone()),
        downtime_ms: downtime_ms(engine, rollout, steps).await,
        ..ChangeDetail::default()
    };
    engine
        .inner
        .store
        .succeed_rollout(
            &rollout.id,
            &change(
                RolloutEvent::Succeed,
                None,
                detail,
                engine.inner.clock.now(),
            ),
            &deployment,
        )
        .await?;
    tracing::info!(rollout.id = %rollout.id, service = %rollout.service, tag = %rollout.tag, "rollout {} succeeded", rollout.id);
    Ok(())
}

async fn finish_failed(
    engine: &Engine,
    rollout: &Rollout,
    steps: &[Step],
    failed: &Step,
    code: &str,
    message: &str,
    detail: Evidence,
) -> Result<(), super::EngineError> {
    let store = &engine.inner.store;
    let mut step_detail = merge_error(detail, code, message);
    if !failed.status.is_terminal() && rollout.touched_replica {
        if let (Some(lines), Some(map)) = (
            target_logs(engine, rollout).await,
            step_detail.as_object_mut(),
        ) {
            map.insert("target_logs".to_owned(), lines.into());
        }
    }
    if !failed.status.is_terminal() {
        store
            .transition_step(
                failed,
                StepEvent::Fail,
                &step_detail,
                None,
                engine.inner.clock.now(),
            )
            .await?;
        engine
            .checkpoint(&rollout.id, Checkpoint::Failed(&failed.name))
            .await;
    }
    skip_rest(engine, steps, failed.position).await?;
    let msg = format!("step {} failed: {message}", failed.name);
    let ch = change(
        RolloutEvent::Fail,
        Some((code, &msg)),
        ChangeDetail {
            step: Some(failed.name.clone()),
            code: Some(code.to_owned()),
            downtime_ms: downtime_ms(engine, rollout, steps).await,
            ..ChangeDetail::default()
        },
        engine.inner.clock.now(),
    );
    rollback::finish_failed_canary(engine, rollout, ch).await
}

/// How long the rollout's replica was out (ms), from its `steps` (as the caller holds them)
/// and its stored calls, written with its end; `None` when it was not taken down or did not
/// answer healthy again.
async fn downtime_ms(engine: &Engine, rollout: &Rollout, steps: &[Step]) -> Option<i64> {
    let attempts = engine.inner.store.attempts(&rollout.id).await.ok()?;
    let runbook = engine.runbook(&rollout.runbook);
    crate::store::downtime::of_rollout(steps, &attempts, runbook.ok())?.total_ms
}

/// The evidence operators keep when a step fails after the target was touched: the target's
/// last 500 log lines, every env value of 8+ characters masked. `None` when they cannot be
/// read (the failure itself may be that).
async fn target_logs(engine: &Engine, rollout: &Rollout) -> Option<Vec<String>> {
    let host = engine.host(&rollout.host).ok()?;
    let req = crate::compose::LogsRequest {
        file: rollout.file.clone(),
        service: rollout.target().clone(),
        tail: 500,
    };
    let text = match host.client.logs(&req).await {
        Ok(text) => text,
        Err(e) => {
            tracing::warn!(rollout.id = %rollout.id, error = %e, "could not keep the target's logs as evidence");
            return None;
        }
    };
    let secrets: Vec<String> = super::merged_env(&host.config, &rollout.env_overrides)
        .into_values()
        .collect();
    let lines = text
        .lines()
        .map(|l| crate::domain::mask::mask(l, &secrets))
        .collect();
    Some(lines)
}

async fn finish_aborted(
    engine: &Engine,
    rollout: &Rollout,
    current: Option<&Step>,
) -> Result<(), super::EngineError> {
    let store = &engine.inner.store;
    let fresh = engine.get(&rollout.id).await?;
    let reason = fresh
        .abort_reason
        .clone()
        .unwrap_or_else(|| "abort requested".to_owned());
    if let Some(step) = current.filter(|s| s.status == StepStatus::Running) {
        let detail = merge_error(Evidence::none(), ErrorCode::Aborted.as_str(), &reason);
        store
            .transition_step(
                step,
                StepEvent::Abort,
                &detail,
                None,
                engine.inner.clock.now(),
            )
            .await?;
    }
    let steps = store.steps(&rollout.id).await?;
    skip_rest(engine, &steps, -1).await?;
    let ch = change(
        RolloutEvent::Abort,
        Some((ErrorCode::Aborted.as_str(), &reason)),
        ChangeDetail {
            reason: Some(reason.clone()),
            downtime_ms: downtime_ms(engine, rollout, &steps).await,
            ..ChangeDetail::default()
        },
        engine.inner.clock.now(),
    );
    super::left_down::end(engine, &fresh, ch).await?;
    tracing::info!(rollout.id = %rollout.id, "rollout {} aborted: {reason}", rollout.id);
    Ok(())
}

/// A failed or aborted step's detail: its evidence, with how it ended (`error`).
fn merge_error(detail: Evidence, code: &str, message: &str) -> serde_json::Value {
    let mut detail = match detail.into_json() {
        serde_json::Value::Object(m) => m,
        serde_json::Value::Null => serde_json::Map::new(),
        other => {
            let mut m = serde_json::Map::new();
            m.insert("evidence".into(), other);
            m
        }
    };
    let failure = StepFailure {
        code: Some(code.to_owned()),
        message: Some(message.to_owned()),
    };
    detail.insert(
        "error".into(),
        serde_json::to_value(&failure).unwrap_or_default(),
    );
    serde_json::Value::Object(detail)
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use tokio::time::Instant;

    use super::*;
    use crate::engine::EngineError;

    /// Runs `retry_storage_errors` with drives that fail until the `ok_at`-th (1-based; never
    /// when `None`); returns whether it ended well and the waits between the drives, in ms.
    async fn retried(ok_at: Option<usize>, stopping: bool) -> (bool, Vec<u128>) {
        let drives = RefCell::new(Vec::new());
        let ended_well = retry_storage_errors(
            "ro_1",
            &EngineTuning::default(),
            || stopping,
            || {
                let n = {
                    let mut drives = drives.borrow_mut();
                    drives.push(Instant::now());
                    drives.len()
                };
                async move {
                    if Some(n) == ok_at {
                        Ok(())
                    } else {
                        Err(EngineError::NotFound("ro_1".into()))
                    }
                }
            },
        )
        .await;
        let drives = drives.into_inner();
        let gaps = drives
            .windows(2)
            .map(|w| (w[1] - w[0]).as_millis())
            .collect();
        (ended_well, gaps)
    }

    #[tokio::test(start_paused = true)]
    async fn a_storage_error_is_retried_200_ms_later_doubling_five_drives_at_most() {
        assert_eq!(
            retried(None, false).await,
            (false, vec![200, 400, 800, 1600])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_retries_end_at_the_first_drive_that_ends_well() {
        assert_eq!(retried(Some(3), false).await, (true, vec![200, 400]));
        assert_eq!(retried(Some(1), false).await, (true, vec![]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stopping_daemon_does_not_retry() {
        assert_eq!(retried(None, true).await, (false, vec![]));
    }
}
