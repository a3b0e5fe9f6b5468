//! Releases (docs/reference.md#releases): the statuses, and the one scheduling function that
//! decides, from what every target's rollout says now, which targets start next. Pure: the
//! engine's coordinator reads the state, asks [`decide`], acts, and asks again.

use std::collections::BTreeSet;

use super::state::string_enum;

string_enum!(
    /// A release's status (`release.status`).
    ReleaseStatus {
        /// Stored, its coordinator not yet started.
        Pending => "pending",
        /// Starting targets as the ordering rules allow.
        Running => "running",
        /// Starts nothing; running targets finish.
        Paused => "paused",
        /// Every target succeeded.
        Succeeded => "succeeded",
        /// A target failed (and, with `rollback_release`, the changed ones were rolled back).
        Failed => "failed",
        /// Stopped by an operator.
        Aborted => "aborted",
    }
);

impl ReleaseStatus {
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Aborted)
    }

    /// The status after `control`, or `None` when the control does not apply now.
    pub fn after(self, control: ReleaseControl) -> Option<Self> {
        match (self, control) {
            (Self::Pending | Self::Running, ReleaseControl::Pause) => Some(Self::Paused),
            (Self::Paused, ReleaseControl::Resume) => Some(Self::Running),
            (s, ReleaseControl::Abort) if !s.is_terminal() => Some(Self::Aborted),
            _ => None,
        }
    }
}

string_enum!(
    /// What a release does after its first failed target (`release.on_failure`).
    ReleaseOnFailure {
        /// Start nothing more; end `failed`.
        Halt => "halt",
        /// Then roll every target it changed back, in reverse order.
        RollbackRelease => "rollback_release",
    }
);

string_enum!(
    /// An operator's request on a release.
    ReleaseControl {
        Pause => "pause",
        Resume => "resume",
        Abort => "abort",
    }
);

string_enum!(
    /// The kind of one release event (`release_event.kind`).
    ReleaseEventKind {
        ReleaseCreated => "release_created",
        ReleaseRunning => "release_running",
        ReleasePaused => "release_paused",
        ReleaseResumed => "release_resumed",
        ReleaseSucceeded => "release_succeeded",
        ReleaseFailed => "release_failed",
        ReleaseAborted => "release_aborted",
        /// A target's rollout was created.
        TargetStarted => "target_started",
        /// A changed target's rollback was created (`rollback_release`).
        TargetRollbackStarted => "target_rollback_started",
        /// A target found already at the release's file, tag and env: done, nothing sent.
        TargetAlreadyCurrent => "target_already_current",
    }
);

string_enum!(
    /// How a target ended without a rollout of its own (`release_target.outcome`).
    TargetOutcome {
        /// Its replica's current recorded deployment is already the release's file, tag and
        /// env: counted done, no rollout created, no call sent.
        AlreadyCurrent => "already_current",
        /// Its release ended `failed` or `aborted` before its turn.
        NotStarted => "not_started",
    }
);

impl ReleaseEventKind {
    /// The event of a move to `status` (`Running` from `Paused` is `ReleaseResumed`).
    pub fn of(from: ReleaseStatus, to: ReleaseStatus) -> Self {
        match to {
            ReleaseStatus::Pending => Self::ReleaseCreated,
            ReleaseStatus::Running if from == ReleaseStatus::Paused => Self::ReleaseResumed,
            ReleaseStatus::Running => Self::ReleaseRunning,
            ReleaseStatus::Paused => Self::ReleasePaused,
            ReleaseStatus::Succeeded => Self::ReleaseSucceeded,
            ReleaseStatus::Failed => Self::ReleaseFailed,
            ReleaseStatus::Aborted => Self::ReleaseAborted,
        }
    }
}

/// Where a target is, from its rollout (or its absence).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetPhase {
    /// No rollout yet.
    Waiting,
    /// Its rollout is pending or running.
    Running,
    Succeeded,
    /// Its rollout failed or was aborted.
    Failed,
    /// Already at the release's file, tag and env: done without a rollout.
    AlreadyCurrent,
    /// Ended with its release before its turn (only under an ended release).
    NotStarted,
}

impl TargetPhase {
    /// The phase of a target that ended without a rollout.
    pub fn of_outcome(outcome: TargetOutcome) -> Self {
        match outcome {
            TargetOutcome::AlreadyCurrent => Self::AlreadyCurrent,
            TargetOutcome::NotStarted => Self::NotStarted,
        }
    }

    /// Counted done: it succeeded, or it was already current.
    pub fn is_done(self) -> bool {
        matches!(self, Self::Succeeded | Self::AlreadyCurrent)
    }
}

/// Where the rollback of a target (by `rollback_release`) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RollbackPhase {
    None,
    Running,
    Done,
}

/// One target as the scheduler sees it, in release order (the canary is position 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetView {
    pub host: String,
    pub phase: TargetPhase,
    pub rollback: RollbackPhase,
}

/// What the coordinator does next.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Decision {
    /// Targets (indexes) whose rollout to create now.
    pub start: Vec<usize>,
    /// Succeeded targets (indexes) whose rollback to create now.
    pub roll_back: Vec<usize>,
    /// The status to end with, when the release is done.
    pub finish: Option<ReleaseStatus>,
}

/// The ordering rules: the canary (index 0) alone first; after it succeeded (or was already
/// current: `AlreadyCurrent` counts as succeeded everywhere but in a rollback, as the release
/// changed nothing there), hosts in parallel
/// up to `max_parallel_hosts`, one target at a time per host, in release order; after a
/// failure nothing starts, and once nothing runs the release ends `failed` (with
/// `rollback_release`, after rolling back every succeeded target, newest first, one per host
/// at a time). `paused` starts nothing (it still ends a release that is done).
pub fn decide(
    targets: &[TargetView],
    max_parallel_hosts: usize,
    on_failure: ReleaseOnFailure,
    paused: bool,
) -> Decision {
    let mut d = Decision::default();
    let max = max_parallel_hosts.max(1);
    let mut busy: BTreeSet<&str> = targets
        .iter()
        .filter(|t| t.phase == TargetPhase::Running || t.rollback == RollbackPhase::Running)
        .map(|t| t.host.as_str())
        .collect();
    let failed = targets.iter().any(|t| t.phase == TargetPhase::Failed);
    if failed {
        if targets.iter().any(|t| t.phase == TargetPhase::Running) {
            return d;
        }
        // A failed target's own automatic rollback finishes before the release ends.
        let rolling = targets.iter().any(|t| t.rollback == RollbackPhase::Running);
        if on_failure == ReleaseOnFailure::Halt {
            if !rolling {
                d.finish = Some(ReleaseStatus::Failed);
            }
            return d;
        }
        let changed: Vec<usize> = (0..targets.len())
            .rev()
            .filter(|&i| targets[i].phase == TargetPhase::Succeeded)
            .collect();
        if !rolling
            && changed
                .iter()
                .all(|&i| targets[i].rollback == RollbackPhase::Done)
        {
            d.finish = Some(ReleaseStatus::Failed);
            return d;
        }
        if paused {
            return d;
        }
        let mut claimed: BTreeSet<&str> = BTreeSet::new();
        for i in changed {
            let t = &targets[i];
            if t.rollback != RollbackPhase::None || !claimed.insert(t.host.as_str()) {
                continue;
            }
            if !busy.contains(t.host.as_str()) && busy.len() < max {
                busy.insert(t.host.as_str());
                d.roll_back.push(i);
            }
        }
        return d;
    }
    if targets.iter().all(|t| t.phase.is_done()) {
        d.finish = Some(ReleaseStatus::Succeeded);
        return d;
    }
    if paused {
        return d;
    }
    match targets.first().map(|t| t.phase) {
        Some(TargetPhase::Waiting) => {
            d.start.push(0);
            return d;
        }
        Some(TargetPhase::Running) => return d,
        _ => {}
    }
    let mut claimed: BTreeSet<&str> = busy.clone();
    for (i, t) in targets.iter().enumerate().skip(1) {
        if t.phase != TargetPhase::Waiting || !claimed.insert(t.host.as_str()) {
            continue;
        }
        if busy.len() < max {
            busy.insert(t.host.as_str());
            d.start.push(i);
        }
    }
    d
}

#[cfg(test)]
mod tests;

/// The actor recorded for what a release's coordinator does by itself.
pub const SYSTEM_ACTOR: &str = "canaryd";
