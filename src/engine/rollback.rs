//! Rollback (docs/reference.md#rollback): choosing the prior deployment, one-click rollbacks
//! with optional preemption, and the automatic rollback of a canary that failed after touching
//! its replica.

use chrono::Utc;
use serde::Deserialize;

use super::{merged_env_sha256, steps_of, Engine, EngineError, ROLLBACK_RUNBOOK, SYSTEM_ACTOR};
use crate::domain::names::ServiceName;
use crate::domain::plan::Replaces;
use crate::domain::state::{OnFailure, RolloutKind};
use crate::store::{new_id, Deployment, NewRollout, Rollout, RolloutChange, RunningState, Store};

/// `POST /v1/rollbacks`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollbackRequest {
    pub host: String,
    pub service: String,
    pub reason: String,
    #[serde(default)]
    pub to_tag: Option<String>,
    #[serde(default)]
    pub preempt: bool,
}

/// What a rollback of a replica redeploys, and the rollout it undoes.
pub(super) struct Choice {
    pub target: Deployment,
    /// The newest rollout that sent a down or up to the replica (linked both ways).
    pub undoes: Option<String>,
    /// What runs now under which compose service: a rollback to another name takes it down.
    running: Running,
}

/// What the replica runs now and under which compose service.
struct Running {
    state: RunningState,
    name: ServiceName,
}

impl Running {
    fn of_rollout(r: &Rollout) -> Self {
        Self {
            state: RunningState::of_rollout(r),
            name: r.target().clone(),
        }
    }

    /// The rename a rollback to `target` makes: when `target` ran under another compose
    /// service than what runs now, `down` takes what runs now (its file and tag) away first
    /// (docs/reference.md#renamed-replicas).
    fn replaced_by(&self, target: &Deployment) -> Option<Replaces> {
        (self.name != *target.name()).then(|| Replaces {
            service: self.name.clone(),
            file: Some(self.state.file.clone()),
            tag: Some(self.state.tag.clone()),
        })
    }
}

/// What the replica runs as far as canaryd knows, and the rollout that put it there: the
/// newest rollout that touched it (succeeded or not: a failed canary may have left its version
/// running), else its newest recorded deployment (a baseline). `None` when nothing is recorded.
async fn running_state(
    store: &Store,
    host: &str,
    service: &str,
) -> Result<(Option<Running>, Option<String>), EngineError> {
    if let Some(touch) = store.last_touching_rollout(host, service).await? {
        return Ok((Some(Running::of_rollout(&touch)), Some(touch.id)));
    }
    let newest = store.recent_deployments(host, service, 1).await?;
    let running = newest.first().map(|d| Running {
        state: RunningState::of_deployment(d),
        name: d.name().clone(),
    });
    Ok((running, None))
}

/// The prior deployment: the newest recorded deployment whose file, tag or env overrides
/// differ from what the replica runs (only of `to_tag` when given). Never what already runs:
/// its dry run would plan nothing and the rollback would fail at the gate.
pub(super) async fn choose(
    store: &Store,
    host: &str,
    service: &str,
    to_tag: Option<&str>,
) -> Result<Choice, EngineError> {
    let (running, undoes) = running_state(store, host, service).await?;
    let no_prior = |detail: String| EngineError::NoPriorDeployment {
        host: host.to_owned(),
        service: service.to_owned(),
        detail,
    };
    let Some(running) = running else {
        return Err(no_prior(match to_tag {
            Some(t) => format!(" with tag {t} (none at all yet)"),
            None => " (none at all: canaryd records the replica's baseline the first time it \
                     touches the host)"
                .to_owned(),
        }));
    };
    match store
        .prior_deployment(host, service, &running.state, to_tag)
        .await?
    {
        Some(target) => Ok(Choice {
            target,
            undoes,
            running,
        }),
        None => Err(no_prior(match to_tag {
            Some(t) => format!(
                " with tag {t} that differs from what it runs now ({}): every recorded \
                 deployment of that tag, if any, is what it runs",
                running.state
            ),
            None => format!(
                ": every recorded deployment is what it runs now ({}); none differs in \
                 file, tag or env",
                running.state
            ),
        })),
    }
}

/// The runbook a rollback runs: `NAME-rollback` when the rollout it undoes ran a loaded
/// `NAME-rollout` (`long-context-rollout` → `long-context-rollback`, which also brings the
/// companions back), else `single-replica-rollback`.
fn rollback_runbook(engine: &Engine, undone_runbook: Option<&str>) -> String {
    undone_runbook
        .and_then(|name| name.strip_suffix("-rollout"))
        .map(|stem| format!("{stem}-rollback"))
        .filter(|name| engine.runbook(name).is_ok())
        .unwrap_or_else(|| ROLLBACK_RUNBOOK.to_owned())
}

#[allow(clippy::too_many_arguments)]
fn rollback_rollout(
    engine: &Engine,
    target: &Deployment,
    actor: &str,
    reason: &str,
    of: Option<&str>,
    running: &Running,
    runbook: &str,
) -> Result<NewRollout, EngineError> {
    let host = engine.host(&target.host)?;
    Ok(NewRollout {
        deploy_as: target.deployed_as.clone(),
        replaces: running.replaced_by(target),
        // A rollback never waits for a window.
        windows: Vec::new(),
        required_free: None,
        id: new_id("ro"),
        kind: RolloutKind::Rollback,
        host: target.host.clone(),
        file: target.file.clone(),
        service: target.service.clone(),
        tag: target.tag.clone(),
        runbook: runbook.to_owned(),
        actor: actor.to_owned(),
        reason: reason.to_owned(),
        env_sha256: merged_env_sha256(&host.config, &target.env_overrides),
        env_overrides: target.env_overrides.clone(),
        require_logs: Vec::new(),
        on_failure: OnFailure::Halt,
        rollback_of: of.map(str::to_owned),
        expect_commit: target.commit.clone(),
        expect_file_sha256: target.file_sha256.clone(),
        created_at: Utc::now(),
    })
}

pub(super) async fn submit(
    engine: &Engine,
    req: RollbackRequest,
    actor: &str,
) -> Result<Rollout, EngineError> {
    let host = engine.host(&req.host)?;
    // A former name (`aliases`) stands for its replica: the rollback follows the slot.
    let Some((slot, _)) = host.config.replica(&req.service) else {
        return Err(EngineError::UnknownTarget(format!(
            "{} is not a configured replica of {}",
            req.service, req.host
        )));
    };
    let req = RollbackRequest {
        service: slot.to_owned(),
        ..req
    };
    engine.runbook(ROLLBACK_RUNBOOK)?;
    let store = &engine.inner.store;
    // Chosen before any preemption: a rollback that has nowhere to go aborts nothing.
    let mut choice = choose(
        &engine.inner.store,
        &req.host,
        &req.service,
        req.to_tag.as_deref(),
    )
    .await?;
    if let Some(active) = store.active_rollout_on(&req.host).await? {
        if !req.preempt {
            return Err(EngineError::HostBusy {
                host: req.host,
                rollout_id: active.id,
            });
        }
        let why = format!("preempted by a rollback: {}", req.reason);
        match engine.abort(&active.id, actor, &why).await {
            Ok(_) | Err(EngineError::Terminal(_)) => {}
            Err(e) => return Err(e),
        }
        // The aborted rollout finishes its current call first (never cut a compose stream).
        // How long: `engine.preempt_wait`; after it, the rollback is refused `host_busy`.
        let wait = engine.inner.timings.preempt_wait;
        engine.wait_terminal(&active.id, wait).await?;
        // It may have touched the replica meanwhile: choose again from what runs now.
        choice = choose(
            &engine.inner.store,
            &req.host,
            &req.service,
            req.to_tag.as_deref(),
        )
        .await?;
    }
    let Choice {
        target,
        undoes: undone,
        running,
    } = choice;
    let undone_runbook = match &undone {
        Some(id) => Some(engine.get(id).await?.runbook),
        None => None,
    };
    let name = rollback_runbook(engine, undone_runbook.as_deref());
    let runbook = engine.runbook(&name)?.clone();
    let new = rollback_rollout(
        engine,
        &target,
        actor,
        &req.reason,
        undone.as_deref(),
        &running,
        &name,
    )?;
    store.create_rollout(&new, &steps_of(&runbook)).await?;
    if let Some(undone) = &undone {
        store.link_rollback(undone, &new.id).await?;
    }
    tracing::info!(rollout.id = %new.id, host = %new.host, service = %new.service, tag = %new.tag, "rollback {} created", new.id);
    engine.spawn(new.id.clone());
    engine.get(&new.id).await
}

/// Fails a rollout; a canary that touched its replica with `on_failure: rollback` starts its
/// rollback in the same transaction.
pub(super) async fn finish_failed_canary(
    engine: &Engine,
    rollout: &Rollout,
    ch: RolloutChange,
) -> Result<(), EngineError> {
    let store = &engine.inner.store;
    let fresh = engine.get(&rollout.id).await?;
    let wants_rollback = fresh.kind == RolloutKind::Canary
        && fresh.on_failure == OnFailure::Rollback
        && fresh.touched_replica;
    if wants_rollback {
        // The same choice as a one-click rollback: the failed canary's file, tag and env are
        // what may run now, so the newest deployment that differs from them.
        let target = store
            .prior_deployment(
                &fresh.host,
                &fresh.service,
                &RunningState::of_rollout(&fresh),
                None,
            )
            .await?;
        let name = rollback_runbook(engine, Some(&fresh.runbook));
        if let (Some(target), Ok(runbook)) = (target.as_ref(), engine.runbook(&name)) {
            let reason = format!(
                "automatic rollback of {}: {}",
                fresh.id,
                ch.error.as_ref().map(|e| e.1.as_str()).unwrap_or("failed")
            );
            let running = Running::of_rollout(&fresh);
            let new = rollback_rollout(
                engine,
                target,
                SYSTEM_ACTOR,
                &reason,
                Some(&fresh.id),
                &running,
                &name,
            )?;
            store
                .fail_and_roll_back(&fresh.id, &ch, &new, &steps_of(runbook))
                .await?;
            tracing::warn!(rollout.id = %fresh.id, rollback.id = %new.id, "canary {} failed; rollback {} started", fresh.id, new.id);
            engine.spawn(new.id);
            return Ok(());
        }
        tracing::warn!(rollout.id = %fresh.id, "canary {} failed and no recorded deployment differs from it: nothing to roll back to", fresh.id);
    }
    let mut ch = ch;
    ch.detail.rolled_back = Some(false);
    super::left_down::end(engine, &fresh, ch).await
}

#[cfg(test)]
mod tests;
