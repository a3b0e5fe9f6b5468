//! What a rollout's task does next, decided from what is stored: the policy of
//! `engine::runner`, which only carries it out.
//!
//! A task asks, around each step of a running rollout, [`next`]: whose turn it is, from the
//! steps' statuses (or that there is nothing left to run); [`turn`]: what that step's turn
//! is, once the task has read whether an abort was requested (the crash matrix pauses between the two, so an abort
//! sent meanwhile is seen); and, when the step's wait was cut short, [`interrupted`]: whether
//! that was a shutdown or an abort.

use super::state::StepStatus;

/// What the task does next, from a running rollout's step statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The step at this index failed, its rollout did not: finish from the recorded
    /// failure, never running the step again.
    FinishFailed(usize),
    /// The step at this index is the next to run (pending, or running when resumed).
    Turn(usize),
    /// Every step succeeded or was skipped: finish the rollout succeeded.
    Succeed,
}

/// What the task does next with a running rollout.
pub fn next(steps: &[StepStatus]) -> Next {
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

/// What a step's wait cut short by the rollout's abort signal means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupted {
    /// A shutdown, not an abort: the step stays running and resumes with its original
    /// deadline at next start.
    Pause,
    /// Mark the step aborted and the rollout with it.
    Abort,
}

/// What an interruption means: a pause only when the daemon is stopping and no abort was
/// requested.
pub fn interrupted(stopping: bool, abort_requested: bool) -> Interrupted {
    if stopping && !abort_requested {
        Interrupted::Pause
    } else {
        Interrupted::Abort
    }
}

#[cfg(test)]
mod tests;
