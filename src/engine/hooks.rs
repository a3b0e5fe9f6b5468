//! Test hooks: named checkpoints in a rollout's task where a test can freeze it, to stop the
//! daemon there (crash matrix) or act while it is frozen (abort from every state).
//!
//! Checkpoints: `rollout:start` (before the rollout is marked running), `step:<name>:before`
//! (the previous step's end is committed, the step has not run: still pending when it is the
//! first or a resumed one, already running when the previous step's end started it in the same
//! transaction), `step:<name>:started` (after it is),
//! `step:<name>:attempt_written` (a compose call's attempt is written, the call not sent),
//! `step:<name>:attempt_done` (a compose call's outcome is written, the step's is not), and
//! `step:<name>:failed` (the step is marked failed, its rollout is not yet). Unarmed,
//! a checkpoint costs one mutex lock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::Checkpoint;

impl Checkpoint<'_> {
    /// The name a test arms (`step:up:attempt_written`).
    pub(crate) fn name(&self) -> String {
        match self {
            Checkpoint::RolloutStart => "rollout:start".to_owned(),
            Checkpoint::Before(step) => format!("step:{step}:before"),
            Checkpoint::Started(step) => format!("step:{step}:started"),
            Checkpoint::AttemptWritten(step) => format!("step:{step}:attempt_written"),
            Checkpoint::AttemptDone(step) => format!("step:{step}:attempt_done"),
            Checkpoint::Failed(step) => format!("step:{step}:failed"),
        }
    }
}

/// One armed checkpoint; fires once.
pub(crate) struct Hook {
    point: String,
    /// Set to the rollout id once a task reached the point.
    reached: watch::Sender<Option<String>>,
    /// Set to true to let the frozen task go on.
    release: watch::Sender<bool>,
}

/// The armed checkpoint of an engine, if any.
#[derive(Default)]
pub(crate) struct Hooks {
    armed: Mutex<Option<Arc<Hook>>>,
}

impl Hooks {
    pub(crate) fn arm(&self, point: &str) -> PauseHandle {
        let (reached, reached_rx) = watch::channel(None);
        let (release, _) = watch::channel(false);
        let hook = Arc::new(Hook {
            point: point.to_owned(),
            reached,
            release,
        });
        if let Ok(mut armed) = self.armed.lock() {
            *armed = Some(hook.clone());
        }
        PauseHandle {
            hook,
            reached: reached_rx,
        }
    }

    /// Freezes the calling task if `point` is armed, until the test releases it (or kills it).
    pub(crate) async fn checkpoint(&self, rollout_id: &str, point: Checkpoint<'_>) {
        let point = point.name();
        let point = point.as_str();
        let hook = {
            let Ok(mut armed) = self.armed.lock() else {
                return;
            };
            match armed.as_ref() {
                Some(h) if h.point == point => armed.take(),
                _ => None,
            }
        };
        let Some(hook) = hook else { return };
        let mut release = hook.release.subscribe();
        let _ = hook.reached.send(Some(rollout_id.to_owned()));
        tracing::warn!(rollout.id = %rollout_id, point, "test hook: rollout {rollout_id} frozen at {point}");
        let _ = release.wait_for(|go| *go).await;
    }
}

/// What a test holds on an armed checkpoint.
#[doc(hidden)]
pub struct PauseHandle {
    hook: Arc<Hook>,
    reached: watch::Receiver<Option<String>>,
}

impl PauseHandle {
    /// Waits (at most `timeout`) until a rollout's task is frozen at the point; its id.
    pub async fn reached(&mut self, timeout: Duration) -> Option<String> {
        let got = tokio::time::timeout(timeout, self.reached.wait_for(Option::is_some)).await;
        match got {
            Ok(Ok(id)) => id.clone(),
            _ => None,
        }
    }

    /// Lets the frozen task go on.
    pub fn release(&self) {
        let _ = self.hook.release.send(true);
    }
}
