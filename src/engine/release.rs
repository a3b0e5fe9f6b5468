//! Releases (docs/reference.md#releases): one coordinator task per release, above the rollout
//! machinery. Every tick it reads the release and its targets' rollouts from SQLite, asks
//! `domain::release::decide` what may start, and creates those rollouts (each linked to its
//! target in the same transaction) or, with `rollback_release`, the rollbacks. A target whose
//! replica already runs the release's file, tag and env ends `already_current` instead: no
//! rollout, no call (the next tick follows at once). It holds no state
//! of its own that matters: after a restart it picks up exactly where the database says.
//!
//! A tick happens when something that can change `decide`'s answer is committed: a rollout's
//! own event (a burst of them is one tick), or a pause, resume or abort (`control_release`
//! wakes the coordinator directly). [`TICK`] is only the backstop (a lagged or closed bus, a
//! failed tick's retry).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use super::{Engine, EngineError, RollbackRequest};
use crate::domain::plan::CanaryPlan;
use crate::domain::release::{
    decide, ReleaseControl, ReleaseStatus, RollbackPhase, TargetPhase, TargetView, SYSTEM_ACTOR,
};
use crate::domain::state::RolloutStatus;
use crate::store::{AuditEvent, NewRelease, Release, ReleaseTarget, StoreError};

/// The longest a coordinator sleeps between ticks when nothing wakes it: a backstop only (every
/// change that matters wakes it at once).
const TICK: Duration = Duration::from_secs(5);

/// The most queued events one wake drops unread.
const DRAIN_MAX: usize = 4096;

/// The releases whose coordinator runs (one task per release, with the `Notify` that
/// `control_release` wakes it by), and their tasks' handles for `Engine::kill`.
#[derive(Default)]
pub(crate) struct Coordinators(Mutex<HashMap<String, Arc<Notify>>>, Mutex<Vec<AbortHandle>>);

impl Coordinators {
    /// Wakes the coordinator of release `id`, if it runs (a stored permit: a wake between two
    /// ticks is not lost).
    fn wake(&self, id: &str) {
        if let Ok(running) = self.0.lock() {
            if let Some(n) = running.get(id) {
                n.notify_one();
            }
        }
    }

    /// Stops every coordinator task dead (`Engine::kill`).
    pub(crate) fn kill(&self) {
        if let Ok(mut tasks) = self.1.lock() {
            for task in tasks.drain(..) {
                task.abort();
            }
        }
    }
}

impl Engine {
    /// Stores a release (pending) and starts its coordinator.
    pub async fn submit_release(&self, new: NewRelease) -> Result<Release, EngineError> {
        self.inner.store.create_release(&new).await?;
        tracing::info!(release.id = %new.id, targets = new.targets.len(), tag = %new.tag, "release {} created", new.id);
        self.spawn_release(new.id.clone());
        self.get_release(&new.id).await
    }

    /// Reads a release.
    pub async fn get_release(&self, id: &str) -> Result<Release, EngineError> {
        self.inner
            .store
            .get_release(id)
            .await?
            .ok_or_else(|| EngineError::ReleaseNotFound(id.to_owned()))
    }

    /// Pause, resume or abort, persisted with actor and reason. Abort also aborts the target
    /// rollouts that are running.
    pub async fn control_release(
        &self,
        id: &str,
        control: ReleaseControl,
        actor: &str,
        reason: &str,
    ) -> Result<Release, EngineError> {
        let release = self.get_release(id).await?;
        let refused = || {
            EngineError::ReleaseState(format!(
                "release {id} is {}: it cannot {control} now",
                release.status
            ))
        };
        let to = release.status.after(control).ok_or_else(refused)?;
        let moved = self
            .inner
            .store
            .move_release(
                id,
                &[release.status],
                to,
                actor,
                Some(reason),
                None,
                Utc::now(),
            )
            .await;
        let moved = match moved {
            Err(StoreError::InvalidTransition { .. }) => return Err(refused()),
            other => other?,
        };
        tracing::info!(release.id = %id, actor, "release {id}: {control} ({reason})");
        self.inner.releases.wake(id);
        if to == ReleaseStatus::Aborted {
            let why = format!("release {id} aborted: {reason}");
            for t in &moved.targets {
                let (Some(rollout), Some(status)) = (&t.rollout_id, t.rollout_status) else {
                    continue;
                };
                if !status.is_terminal() {
                    match self.abort(rollout, actor, &why).await {
                        Ok(_) | Err(EngineError::Terminal(_)) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        self.get_release(id).await
    }

    /// Starts the coordinator of every unfinished release (after `recover`).
    pub async fn recover_releases(&self) -> Result<usize, EngineError> {
        let ids = self.inner.store.unfinished_releases().await?;
        for id in &ids {
            tracing::info!(release.id = %id, "resuming release {id} after restart");
            self.spawn_release(id.clone());
        }
        Ok(ids.len())
    }

    fn spawn_release(&self, id: String) {
        if self.is_stopping() {
            return;
        }
        let wake = Arc::new(Notify::new());
        {
            let Ok(mut running) = self.inner.releases.0.lock() else {
                return;
            };
            if running.contains_key(&id) {
                return;
            }
            running.insert(id.clone(), Arc::clone(&wake));
        }
        let engine = self.clone();
        // On the tracker, so a shutdown waits for it like for a rollout's task.
        let task = self.inner.tasks.spawn(async move {
            coordinate(&engine, &id, &wake).await;
            if let Ok(mut running) = engine.inner.releases.0.lock() {
                running.remove(&id);
            }
        });
        if let Ok(mut tasks) = self.inner.releases.1.lock() {
            tasks.retain(|t| !t.is_finished());
            tasks.push(task.abort_handle());
        }
    }
}

/// The coordinator: ticks until the release is terminal or the daemon stops.
async fn coordinate(engine: &Engine, id: &str, wake: &Notify) {
    let mut events = engine.store().subscribe();
    // Targets whose rollback cannot be created (nothing recorded to go back to): not retried.
    let mut no_rollback: HashSet<u32> = HashSet::new();
    loop {
        if engine.is_stopping() {
            return;
        }
        match tick(engine, id, &mut no_rollback).await {
            Ok(Next::Ended) => return,
            // A target ended already current: that changes the decision, and no rollout's
            // event will say so.
            Ok(Next::Again) => continue,
            Ok(Next::Wait) => {}
            Err(e) => {
                tracing::warn!(release.id = %id, error = %e, "release {id}: tick failed; retrying")
            }
        }
        tokio::select! {
            _ = tokio::time::timeout(TICK, rollout_moved(&mut events)) => {}
            _ = wake.notified() => {}
        }
        // The events already queued (a wave's targets ending together) are all committed: the
        // next tick sees them, so they need no tick of their own.
        drain(&mut events);
    }
}

/// Drops the events already received, without waiting.
fn drain<T: Clone>(events: &mut broadcast::Receiver<T>) {
    // Bounded (a bus that never empties is left for the next wake).
    for _ in 0..DRAIN_MAX {
        match events.try_recv() {
            Ok(_) | Err(TryRecvError::Lagged(_)) => {}
            Err(TryRecvError::Empty | TryRecvError::Closed) => return,
        }
    }
}

/// Waits for a rollout's own event (a status change, not a step's): only those change what
/// `decide` says, and each wake reads the whole release. A lag wakes too; a closed bus never
/// does (the tick still paces the coordinator).
async fn rollout_moved(events: &mut broadcast::Receiver<AuditEvent>) {
    loop {
        match events.recv().await {
            Ok(e) if e.step.is_none() => return,
            Ok(_) => {}
            Err(RecvError::Lagged(_)) => return,
            Err(RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}

fn view(t: &ReleaseTarget, no_rollback: &HashSet<u32>) -> TargetView {
    let phase = match t.rollout_status {
        None => t
            .outcome
            .map_or(TargetPhase::Waiting, TargetPhase::of_outcome),
        Some(RolloutStatus::Pending | RolloutStatus::Running) => TargetPhase::Running,
        Some(RolloutStatus::Succeeded) => TargetPhase::Succeeded,
        Some(RolloutStatus::Failed | RolloutStatus::Aborted) => TargetPhase::Failed,
    };
    let rollback = match t.rollback_status {
        _ if no_rollback.contains(&t.position) => RollbackPhase::Done,
        None => RollbackPhase::None,
        Some(s) if s.is_terminal() => RollbackPhase::Done,
        Some(_) => RollbackPhase::Running,
    };
    TargetView {
        host: t.host.clone(),
        phase,
        rollback,
    }
}

/// What the coordinator does after a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// The release is terminal: the coordinator ends.
    Ended,
    /// Look again at once (a target ended already current).
    Again,
    /// Wait for a rollout's event, a control or the backstop tick.
    Wait,
}

/// One look at the release.
async fn tick(
    engine: &Engine,
    id: &str,
    no_rollback: &mut HashSet<u32>,
) -> Result<Next, EngineError> {
    let store = engine.store();
    let mut release = engine.get_release(id).await?;
    if release.status.is_terminal() {
        // Ended by a daemon that left targets waiting: none stays so.
        let unstarted = release
            .targets
            .iter()
            .any(|t| t.rollout_id.is_none() && t.outcome.is_none());
        if unstarted && release.status != ReleaseStatus::Succeeded {
            store.end_unstarted_targets(id).await?;
        }
        return Ok(Next::Ended);
    }
    if release.status == ReleaseStatus::Pending {
        release = store
            .move_release(
                id,
                &[ReleaseStatus::Pending],
                ReleaseStatus::Running,
                SYSTEM_ACTOR,
                None,
                None,
                Utc::now(),
            )
            .await?;
    }
    let views: Vec<TargetView> = release
        .targets
        .iter()
        .map(|t| view(t, no_rollback))
        .collect();
    let d = decide(
        &views,
        release.max_parallel_hosts as usize,
        release.on_failure,
        release.status == ReleaseStatus::Paused,
    );
    if let Some(end) = d.finish {
        let error = (end == ReleaseStatus::Failed).then(|| failure_message(&release));
        let moved = store
            .move_release(
                id,
                &[ReleaseStatus::Running, ReleaseStatus::Paused],
                end,
                SYSTEM_ACTOR,
                None,
                error.as_deref(),
                Utc::now(),
            )
            .await;
        return match moved {
            Ok(_) => {
                tracing::info!(release.id = %id, status = end.as_str(), "release {id} ended {end}");
                Ok(Next::Ended)
            }
            // Paused, resumed or aborted meanwhile: look again.
            Err(StoreError::InvalidTransition { .. }) => Ok(Next::Wait),
            Err(e) => Err(e.into()),
        };
    }
    let mut next = Next::Wait;
    for i in d.start {
        if start_target(engine, &release, &release.targets[i]).await? == Started::AlreadyCurrent {
            next = Next::Again;
        }
    }
    for i in d.roll_back {
        roll_back_target(engine, &release, &release.targets[i], no_rollback).await?;
    }
    Ok(next)
}

/// What `start_target` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Started {
    /// Created its rollout, or left it for a later tick (busy host, paused meanwhile).
    Rollout,
    /// Ended it `already_current`.
    AlreadyCurrent,
}

fn failure_message(release: &Release) -> String {
    let failed: Vec<String> = release
        .targets
        .iter()
        .filter(|t| {
            matches!(
                t.rollout_status,
                Some(RolloutStatus::Failed | RolloutStatus::Aborted)
            )
        })
        .map(|t| {
            format!(
                "{}/{} ({}: {})",
                t.host,
                t.service,
                t.rollout_id.as_deref().unwrap_or("-"),
                t.rollout_error.as_deref().unwrap_or("aborted")
            )
        })
        .collect();
    format!("target failed: {}", failed.join(", "))
}

async fn start_target(
    engine: &Engine,
    release: &Release,
    target: &ReleaseTarget,
) -> Result<Started, EngineError> {
    let plan: CanaryPlan = serde_json::from_str(&target.plan).map_err(|e| {
        EngineError::Store(StoreError::Corrupt {
            table: "release_target",
            message: e.to_string(),
        })
    })?;
    let (new, steps) = engine.canary_rollout(plan, &release.actor)?;
    // Already at the release's file, tag and env (safety rule 21): done, with nothing sent. The
    // rollout built above only says what would be deployed; it is not stored.
    if let Some(by) = engine
        .store()
        .end_target_if_current(&release.id, target.position, &new, Utc::now())
        .await?
    {
        tracing::info!(release.id = %release.id, host = %new.host, service = %new.service, "release {}: target {}/{} already runs {} (deployed by {by}): done, nothing sent", release.id, new.host, new.service, new.tag);
        return Ok(Started::AlreadyCurrent);
    }
    match engine
        .store()
        .start_release_target(&release.id, target.position, &new, &steps)
        .await
    {
        Ok(()) => {
            tracing::info!(release.id = %release.id, rollout.id = %new.id, host = %new.host, service = %new.service, "release {}: target {}/{} started as {}", release.id, new.host, new.service, new.id);
            engine.spawn(new.id);
            Ok(Started::Rollout)
        }
        // Another rollout holds the host: wait for it (the next tick tries again).
        Err(StoreError::HostBusy { rollout_id, .. }) => {
            tracing::debug!(release.id = %release.id, host = %target.host, "release {}: host {} busy with {rollout_id}; waiting", release.id, target.host);
            Ok(Started::Rollout)
        }
        // Paused or aborted meanwhile, or already started: nothing to do.
        Err(StoreError::InvalidTransition { .. }) => Ok(Started::Rollout),
        Err(e) => Err(e.into()),
    }
}

async fn roll_back_target(
    engine: &Engine,
    release: &Release,
    target: &ReleaseTarget,
    no_rollback: &mut HashSet<u32>,
) -> Result<(), EngineError> {
    let req = RollbackRequest {
        host: target.host.clone(),
        service: target.service.clone(),
        reason: format!(
            "release {} failed: rolling back {} (rollback_release)",
            release.id,
            target.rollout_id.as_deref().unwrap_or("-")
        ),
        to_tag: None,
        preempt: false,
    };
    match engine.submit_rollback(req, SYSTEM_ACTOR).await {
        Ok(rb) => {
            tracing::warn!(release.id = %release.id, rollout.id = %rb.id, "release {}: target {}/{} rolled back by {}", release.id, target.host, target.service, rb.id);
            engine
                .store()
                .release_target_rolled_back(&release.id, target.position, &rb.id, Utc::now())
                .await?;
            Ok(())
        }
        Err(EngineError::HostBusy { .. }) => Ok(()),
        Err(e @ EngineError::NoPriorDeployment { .. }) => {
            tracing::error!(release.id = %release.id, error = %e, "release {}: cannot roll back {}/{}", release.id, target.host, target.service);
            no_rollback.insert(target.position);
            Ok(())
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    #[test]
    fn drain_drops_what_is_queued_and_returns() {
        let (tx, mut rx) = broadcast::channel(4);
        for i in 0..6 {
            tx.send(i).expect("a receiver");
        }
        // Lagged (2 overwritten), then 4 queued: all dropped.
        drain(&mut rx);
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
        tx.send(7).expect("a receiver");
        assert_eq!(rx.try_recv().ok(), Some(7));
        drop(tx);
        drain(&mut rx);
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Closed)));
    }

    #[test]
    fn wake_reaches_the_running_coordinator_only_and_is_not_lost() {
        let c = Coordinators::default();
        let a = Arc::new(Notify::new());
        c.0.lock()
            .expect("not poisoned")
            .insert("rel_a".to_owned(), Arc::clone(&a));
        c.wake("rel_b");
        assert!(a.notified().now_or_never().is_none());
        // Woken before it waits: the permit is kept for its next wait.
        c.wake("rel_a");
        assert!(a.notified().now_or_never().is_some());
        assert!(a.notified().now_or_never().is_none());
    }
}
