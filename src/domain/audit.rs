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

/// The detail of a rollout's change (its audit event's `detail`): what each kind of end keeps.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct ChangeDetail {
    /// Why it was aborted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The step that failed, and its code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// What a succeeded rollout deployed: its tag, the commit and the image (`null` when the
    /// host did not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<Option<String>>,
    /// `false`: a failed canary with nothing to roll back to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolled_back: Option<bool>,
    /// Its target taken down and not brought back (safety rule 14).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_left_down: Option<LeftDown>,
    /// How long its replica was out, in ms (`domain::downtime`), when it took it down and the
    /// replica answered healthy again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downtime_ms: Option<i64>,
}

/// How a rollout was seen to leave its target down, and the end it restates.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct LeftDown {
    /// `docker ps`, or `compose attempts` when the host could not be read.
    pub seen_by: String,
    /// The target's container as `docker ps` showed it (`null`: absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<Option<serde_json::Value>>,
    /// Why `docker ps` could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ps_error: Option<String>,
    /// The `down` attempt that may have run, with no successful `up` after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down_attempt: Option<String>,
    /// The rollout's own end, restated as `replica_left_down`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
}

/// The detail of a rollout picked up again after a restart: the step it was at (`null`:
/// none unfinished) and that step's status.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct Resumed {
    pub step: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_status: Option<String>,
}

/// An error's code and message.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Cause {
    pub code: String,
    pub message: String,
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

    /// Each change detail as the `json!` that built it before these types wrote it.
    #[test]
    fn change_details_keep_their_stored_shapes() {
        use serde_json::json;

        use super::{Cause, ChangeDetail, LeftDown, Resumed};
        fn shown<T: serde::Serialize>(detail: T) -> serde_json::Value {
            serde_json::to_value(detail).expect("serialises")
        }
        let cases = [
            (shown(ChangeDetail::default()), json!({})),
            (
                shown(ChangeDetail {
                    tag: Some("v0.0.452".into()),
                    commit: Some(None),
                    image: Some(Some("sglang:v452".into())),
                    ..ChangeDetail::default()
                }),
                json!({"tag": "v0.0.452", "commit": null, "image": "sglang:v452"}),
            ),
            (
                shown(ChangeDetail {
                    step: Some("up".into()),
                    code: Some("compose_failed".into()),
                    rolled_back: Some(false),
                    ..ChangeDetail::default()
                }),
                json!({"step": "up", "code": "compose_failed", "rolled_back": false}),
            ),
            (
                shown(ChangeDetail {
                    reason: Some("operator".into()),
                    ..ChangeDetail::default()
                }),
                json!({"reason": "operator"}),
            ),
            (
                shown(LeftDown {
                    seen_by: "docker ps".into(),
                    container: Some(None),
                    cause: Some(Cause {
                        code: "health_timeout".into(),
                        message: "m".into(),
                    }),
                    ..LeftDown::default()
                }),
                json!({"seen_by": "docker ps", "container": null,
                       "cause": {"code": "health_timeout", "message": "m"}}),
            ),
            (shown(Resumed::default()), json!({"step": null})),
            (
                shown(Resumed {
                    step: Some("soak".into()),
                    step_status: Some("running".into()),
                }),
                json!({"step": "soak", "step_status": "running"}),
            ),
        ];
        for (written, stored) in cases {
            assert_eq!(written, stored);
        }
    }
}
