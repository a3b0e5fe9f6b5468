//! Rollback (SPEC §6): choosing the prior deployment, one-click rollbacks with optional
//! preemption, and the automatic rollback of a canary that failed after touching its replica.

use std::time::Duration;

use chrono::Utc;
use serde::Deserialize;
use serde_json::json;

use super::{merged_env_sha256, steps_of, Engine, EngineError, ROLLBACK_RUNBOOK, SYSTEM_ACTOR};
use crate::domain::state::{OnFailure, RolloutKind, RolloutStatus};
use crate::store::{new_id, Deployment, NewRollout, Rollout, RolloutChange, RolloutFilter};

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

/// Picks what a rollback redeploys, from the replica's deployments (newest first).
///
/// The replica currently runs `deployments[0]`, unless the last rollout that touched it did not
/// succeed (`last_touch_succeeded == false`): then it runs something unrecorded and
/// `deployments[0]` is the last good state. `to_tag` picks the newest recorded deployment of
/// that tag instead.
pub fn choose_rollback_target<'a>(
    deployments: &'a [Deployment],
    last_touch_succeeded: bool,
    to_tag: Option<&str>,
) -> Option<&'a Deployment> {
    if let Some(tag) = to_tag {
        return deployments.iter().find(|d| d.tag == tag);
    }
    if last_touch_succeeded {
        deployments.get(1)
    } else {
        deployments.first()
    }
}

/// Whether the replica runs its newest recorded deployment (no failed touch since).
async fn last_touch_succeeded(
    engine: &Engine,
    host: &str,
    service: &str,
) -> Result<bool, EngineError> {
    let last = engine.inner.store.last_touch_status(host, service).await?;
    Ok(last.is_none_or(|s| s == RolloutStatus::Succeeded))
}

fn rollback_rollout(
    engine: &Engine,
    target: &Deployment,
    actor: &str,
    reason: &str,
    of: Option<&str>,
) -> Result<NewRollout, EngineError> {
    let host = engine.host(&target.host)?;
    Ok(NewRollout {
        id: new_id("ro"),
        kind: RolloutKind::Rollback,
        host: target.host.clone(),
        file: target.file.clone(),
        service: target.service.clone(),
        tag: target.tag.clone(),
        runbook: ROLLBACK_RUNBOOK.to_owned(),
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
    if !host.config.replicas.contains_key(&req.service) {
        return Err(EngineError::UnknownTarget(format!(
            "{} is not a configured replica of {}",
            req.service, req.host
        )));
    }
    let runbook = engine.runbook(ROLLBACK_RUNBOOK)?.clone();
    let store = &engine.inner.store;
    // Bounded reads: the newest two deployments (current and prior), or the tag asked for.
    let deployments = match &req.to_tag {
        Some(tag) => store
            .deployment_with_tag(&req.host, &req.service, tag)
            .await?
            .into_iter()
            .collect(),
        None => store.recent_deployments(&req.host, &req.service, 2).await?,
    };
    let good = last_touch_succeeded(engine, &req.host, &req.service).await?;
    let Some(target) = choose_rollback_target(&deployments, good, req.to_tag.as_deref()) else {
        let detail = match &req.to_tag {
            Some(t) => format!(" with tag {t}"),
            None if deployments.is_empty() => " (none at all)".to_owned(),
            None => " before its current one".to_owned(),
        };
        return Err(EngineError::NoPriorDeployment {
            host: req.host,
            service: req.service,
            detail,
        });
    };
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
        engine
            .wait_terminal(&active.id, Duration::from_secs(120))
            .await?;
    }
    // The replica's latest rollout is what this rollback undoes (linked both ways).
    let undone = latest_rollout_of(engine, &req.host, &req.service).await?;
    let new = rollback_rollout(engine, target, actor, &req.reason, undone.as_deref())?;
    store.create_rollout(&new, &steps_of(&runbook)).await?;
    if let Some(undone) = &undone {
        store.link_rollback(undone, &new.id).await?;
    }
    tracing::info!(rollout.id = %new.id, host = %new.host, service = %new.service, tag = %new.tag, "rollback {} created", new.id);
    engine.spawn(new.id.clone());
    engine.get(&new.id).await
}

async fn latest_rollout_of(
    engine: &Engine,
    host: &str,
    service: &str,
) -> Result<Option<String>, EngineError> {
    let filter = RolloutFilter {
        host: Some(host.to_owned()),
        service: Some(service.to_owned()),
        limit: 1,
        ..Default::default()
    };
    Ok(engine
        .inner
        .store
        .list_rollouts(&filter)
        .await?
        .into_iter()
        .next()
        .map(|r| r.id))
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
        let deployments = store
            .recent_deployments(&fresh.host, &fresh.service, 1)
            .await?;
        // The failed canary recorded no deployment: the newest one is the state to go back to.
        if let (Some(target), Ok(runbook)) = (deployments.first(), engine.runbook(ROLLBACK_RUNBOOK))
        {
            let reason = format!(
                "automatic rollback of {}: {}",
                fresh.id,
                ch.error.as_ref().map(|e| e.1.as_str()).unwrap_or("failed")
            );
            let new = rollback_rollout(engine, target, SYSTEM_ACTOR, &reason, Some(&fresh.id))?;
            store
                .fail_and_roll_back(&fresh.id, &ch, &new, &steps_of(runbook))
                .await?;
            tracing::warn!(rollout.id = %fresh.id, rollback.id = %new.id, "canary {} failed; rollback {} started", fresh.id, new.id);
            engine.spawn(new.id);
            return Ok(());
        }
        tracing::warn!(rollout.id = %fresh.id, "canary {} failed and no prior deployment is recorded: nothing to roll back to", fresh.id);
    }
    let mut ch = ch;
    if ch.detail.is_object() {
        ch.detail["rolled_back"] = json!(false);
    }
    super::left_down::end(engine, &fresh, ch).await
}
