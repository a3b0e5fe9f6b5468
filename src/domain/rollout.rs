//! What a rollout's task does next, decided from what is stored: the policy of
//! `engine::runner`, which only carries it out.
//!
//! A task asks three times around each step. [`next`]: whose turn it is, from the rollout's
//! status and its steps' (or that there is nothing left to run). [`turn`]: what that step's
//! turn is, once the task has read whether an abort was requested (the crash matrix pauses
//! between the two, so an abort sent meanwhile is seen). [`after`]: what the step's end means.

use super::state::{RolloutStatus, StepStatus};

/// What the task does, from the rollout's status and its steps' statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The rollout has ended: nothing to do.
    Done,
    /// Mark the rollout running (it is pending).
    Start,
    /// The runbook or the host is no longer configured: abort it if an abort was requested,
    /// else fail the step at `current` (or the rollout itself, when no step is unfinished).
    Unconfigured {
        /// The first unfinished step.
        current: Option<usize>,
    },
    /// The step at this index failed, its rollout did not: finish from the recorded
    /// failure, never running the step again.
    FinishFailed(usize),
    /// The step at this index is the next to run (pending, or running when resumed).
    Turn(usize),
    /// Every step succeeded or was skipped: finish the rollout succeeded.
    Succeed,
}

/// What the task does next. `configured` is false when the rollout's runbook or host is no
/// longer in the config.
pub fn next(status: RolloutStatus, steps: &[StepStatus], configured: bool) -> Next {
    if status.is_terminal() {
        return Next::Done;
    }
    if status == RolloutStatus::Pending {
        return Next::Start;
    }
    let current = steps.iter().position(|s| !s.is_terminal());
    if !configured {
        return Next::Unconfigured { current };
    }
    let unfinished = steps
        .iter()
        .position(|s| !matches!(s, StepStatus::Succeeded | StepStatus::Skipped));
    match unfinished {
        None => Next::Succeed,
        Some(i) if steps[i] == StepStatus::Failed => Next::FinishFailed(i),
        Some(i) => Next::Turn(i),
    }
}

/// What a step's turn is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// An abort was requested: the rollout ends aborted, the step with it.
    Abort,
    /// The daemon is stopping: leave the step as it is; it resumes at next start.
    Pause,
    /// The runbook no longer has the step: fail it `runbook_changed`.
    NotInRunbook,
    /// Run the step; `resumed` when it was already running before this task (a restart).
    Run {
        /// The step was running when the task found it (not started by this task).
        resumed: bool,
    },
}

/// The facts a step's turn depends on, read by the task when the turn comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnFacts {
    /// The rollout's abort was requested (`abort_reason` is set).
    pub abort_requested: bool,
    /// The daemon is shutting down.
    pub stopping: bool,
    /// The runbook still has a step at the step's position.
    pub in_runbook: bool,
    /// The step's stored status.
    pub status: StepStatus,
    /// The step was started by the end of the previous one, in the same transaction.
    pub started_with_previous: bool,
}

/// What the step's turn is: an abort first, then a shutdown, then a runbook that lost the step.
pub fn turn(facts: TurnFacts) -> Turn {
    if facts.abort_requested {
        Turn::Abort
    } else if facts.stopping {
        Turn::Pause
    } else if !facts.in_runbook {
        Turn::NotInRunbook
    } else {
        Turn::Run {
            resumed: !facts.started_with_previous && facts.status == StepStatus::Running,
        }
    }
}

/// How a step's executor ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The step passed.
    Succeeded,
    /// The step failed.
    Failed,
    /// The step's wait was cut short by the rollout's abort signal (an abort or a shutdown).
    Interrupted,
}

/// What a step's end means for its rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// Record the success (starting the next step in the same transaction) and go on.
    Continue,
    /// Finish the rollout failed (with its automatic rollback, if the canary asks for one).
    Fail,
    /// A shutdown, not an abort, interrupted the step: it stays running and resumes with its
    /// original deadline at next start.
    Pause,
    /// Mark the step aborted and the rollout with it.
    Abort,
}

/// What `ended` means. `stopping` and `abort_requested` matter only to an interruption.
pub fn after(ended: Ended, stopping: bool, abort_requested: bool) -> After {
    match ended {
        Ended::Succeeded => After::Continue,
        Ended::Failed => After::Fail,
        Ended::Interrupted if stopping && !abort_requested => After::Pause,
        Ended::Interrupted => After::Abort,
    }
}

#[cfg(test)]
mod tests;
