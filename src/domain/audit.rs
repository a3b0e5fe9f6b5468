//! What an audit event records: its kind, one closed list. The database, the API, the SSE
//! `event:` field, the outbox and the metrics all see the same snake_case names.

use super::state::{string_enum, RolloutStatus, StepStatus};

string_enum!(
    /// The kind of one audit event (`audit_event.kind`).
    AuditKind {
        /// A rollout was accepted and stored (`pending`).
        RolloutCreated => "rollout_created",
        /// A rollout's status became `pending` (no transition leads there; kept so every
        /// status has its event).
        RolloutPending => "rollout_pending",
        /// A rollout began its first step.
        RolloutRunning => "rollout_running",
        /// A rollout's every step passed.
        RolloutSucceeded => "rollout_succeeded",
        /// A rollout failed.
        RolloutFailed => "rollout_failed",
        /// A rollout was aborted.
        RolloutAborted => "rollout_aborted",
        /// An unfinished rollout was picked up again after a restart.
        RolloutResumed => "rollout_resumed",
        /// A step's status became `pending` (no transition leads there).
        StepPending => "step_pending",
        /// A step started.
        StepRunning => "step_running",
        /// A step passed.
        StepSucceeded => "step_succeeded",
        /// A step failed.
        StepFailed => "step_failed",
        /// A step never ran.
        StepSkipped => "step_skipped",
        /// A step was interrupted by an abort.
        StepAborted => "step_aborted",
        /// Someone asked for a rollout to be aborted.
        AbortRequested => "abort_requested",
        /// A step began waiting for an operator's approval (`approve`, or an `analyze` check
        /// with `on_inconclusive: ask`).
        ApprovalRequested => "approval_requested",
        /// An operator approved the step a rollout was waiting on.
        Approved => "approved",
        /// A rollback was linked to the canary it undoes.
        RollbackLinked => "rollback_linked",
        /// A rollout ended with its target taken down and not brought back (safety rule 14).
        ReplicaLeftDown => "replica_left_down",
        /// What runs on a replica was recorded.
        DeploymentRecorded => "deployment_recorded",
        /// Old terminal rollouts were purged.
        RetentionPurged => "retention_purged",
    }
);

impl AuditKind {
    /// The event of a rollout's move to `status`.
    pub fn rollout(status: RolloutStatus) -> Self {
        match status {
            RolloutStatus::Pending => Self::RolloutPending,
            RolloutStatus::Running => Self::RolloutRunning,
            RolloutStatus::Succeeded => Self::RolloutSucceeded,
            RolloutStatus::Failed => Self::RolloutFailed,
            RolloutStatus::Aborted => Self::RolloutAborted,
        }
    }

    /// The event of a step's move to `status`.
    pub fn step(status: StepStatus) -> Self {
        match status {
            StepStatus::Pending => Self::StepPending,
            StepStatus::Running => Self::StepRunning,
            StepStatus::Succeeded => Self::StepSucceeded,
            StepStatus::Failed => Self::StepFailed,
            StepStatus::Skipped => Self::StepSkipped,
            StepStatus::Aborted => Self::StepAborted,
        }
    }

    /// The status a rollout moved to, if this is a rollout's status change.
    pub fn rollout_status(self) -> Option<RolloutStatus> {
        RolloutStatus::ALL
            .iter()
            .copied()
            .find(|s| Self::rollout(*s) == self)
    }

    /// The status a step moved to, if this is a step's status change.
    pub fn step_status(self) -> Option<StepStatus> {
        StepStatus::ALL
            .iter()
            .copied()
            .find(|s| Self::step(*s) == self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_change_has_its_kind_named_after_the_status_and_back() {
        for s in RolloutStatus::ALL.iter().copied() {
            let kind = AuditKind::rollout(s);
            assert_eq!(kind.as_str(), format!("rollout_{s}"));
            assert_eq!(kind.rollout_status(), Some(s));
            assert_eq!(kind.step_status(), None);
        }
        for s in StepStatus::ALL.iter().copied() {
            let kind = AuditKind::step(s);
            assert_eq!(kind.as_str(), format!("step_{s}"));
            assert_eq!(kind.step_status(), Some(s));
            assert_eq!(kind.rollout_status(), None);
        }
    }

    #[test]
    fn kinds_that_are_no_status_change_map_to_no_status() {
        for kind in [
            AuditKind::RolloutCreated,
            AuditKind::RolloutResumed,
            AuditKind::AbortRequested,
            AuditKind::RollbackLinked,
            AuditKind::ReplicaLeftDown,
            AuditKind::DeploymentRecorded,
            AuditKind::RetentionPurged,
        ] {
            assert_eq!(kind.rollout_status(), None, "{kind}");
            assert_eq!(kind.step_status(), None, "{kind}");
        }
    }

    #[test]
    fn the_wire_name_is_the_serde_name_and_parses_back() {
        for kind in AuditKind::ALL.iter().copied() {
            assert_eq!(
                serde_json::to_value(kind).expect("serialises"),
                serde_json::json!(kind.as_str())
            );
            assert_eq!(kind.as_str().parse::<AuditKind>(), Ok(kind));
        }
    }
}
