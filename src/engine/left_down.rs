//! Safety rule 14: a rollout that ends with its target taken down and not brought back says
//! so loudly. Its error becomes `replica_left_down` (the cause kept in the message and the
//! audit detail), a `replica_left_down` audit event notifies, and `canaryd_replicas_down`
//! counts the replica until a later rollout of it succeeds.

use super::seams::{HostCalls, StepStore};
use super::step_run::is_service;
use super::Engine;
use crate::domain::audit::{Cause, LeftDown};
use crate::domain::error_code::ErrorCode;
use crate::domain::state::AttemptOutcome;
use crate::store::{Rollout, RolloutChange};

/// Whether `rollout`, now ending without bringing its target back, left it down: its
/// container is absent or not running in `GET /docker/ps`. When the host cannot be read, the
/// rollout's own calls decide: a `down` that may have run and no successful `up` after it.
/// `None` when the replica was never touched or is running.
pub(super) async fn check(
    calls: &dyn HostCalls,
    store: &dyn StepStore,
    rollout: &Rollout,
) -> Option<LeftDown> {
    if !rollout.touched_replica {
        return None;
    }
    match calls.ps().await {
        Ok(ps) => {
            // The target, or in a rename the former service it was to replace: either one
            // running serves the slot.
            let container = ps.iter().find(|c| is_service(c, rollout.target()));
            let former = rollout
                .replaced()
                .and_then(|old| ps.iter().find(|c| is_service(c, old)));
            match container {
                Some(c) if c.state == "running" => None,
                _ if former.is_some_and(|c| c.state == "running") => None,
                other => Some(LeftDown {
                    seen_by: "docker ps".to_owned(),
                    container: Some(other.map(|c| serde_json::to_value(c).unwrap_or_default())),
                    ..LeftDown::default()
                }),
            }
        }
        Err(e) => {
            let attempts = store.attempts(&rollout.id).await.ok()?;
            let last_down = attempts.iter().rposition(|a| {
                a.endpoint == "compose/down"
                    && a.outcome.is_none_or(AttemptOutcome::reached_the_stream)
            })?;
            let up_after = attempts[last_down..].iter().any(|a| {
                a.endpoint == "compose/up" && a.outcome == Some(AttemptOutcome::Succeeded)
            });
            (!up_after).then(|| LeftDown {
                seen_by: "compose attempts".to_owned(),
                ps_error: Some(e.to_string()),
                down_attempt: Some(attempts[last_down].id.clone()),
                ..LeftDown::default()
            })
        }
    }
}

/// The rollout's ending change, restated as `replica_left_down` with its cause.
pub(super) fn restate(
    mut change: RolloutChange,
    rollout: &Rollout,
    evidence: &mut LeftDown,
) -> RolloutChange {
    let (cause_code, cause_message) = change
        .error
        .take()
        .unwrap_or_else(|| ("failed".to_owned(), "failed".to_owned()));
    let message = format!(
        "{} on {} was taken down and not brought back ({cause_code}: {cause_message})",
        rollout.service, rollout.host
    );
    evidence.cause = Some(Cause {
        code: cause_code,
        message: cause_message,
    });
    change.detail.replica_left_down = Some(evidence.clone());
    change.error = Some((ErrorCode::ReplicaLeftDown.to_string(), message));
    change
}

/// Ends `rollout` with `change`, or as `replica_left_down` when it left its target down.
pub(super) async fn end(
    engine: &Engine,
    rollout: &Rollout,
    change: RolloutChange,
) -> Result<(), super::EngineError> {
    let store = &engine.inner.store;
    // An unconfigured host cannot be read: the rollout's own calls are all there is.
    let found = match engine.host(&rollout.host) {
        Ok(host) => check(&host.client, store, rollout).await,
        Err(_) => None,
    };
    let Some(mut evidence) = found else {
        store.transition_rollout(&rollout.id, &change).await?;
        return Ok(());
    };
    let change = restate(change, rollout, &mut evidence);
    store
        .end_with_replica_left_down(&rollout.id, &change, &evidence)
        .await?;
    tracing::error!(rollout.id = %rollout.id, host = %rollout.host, service = %rollout.service, "rollout {} ended with {} on {} left down: no running container", rollout.id, rollout.service, rollout.host);
    Ok(())
}
