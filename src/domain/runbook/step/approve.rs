//! `approve`: wait for an operator's decision (docs/reference.md#approve).

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

use super::{Checked, defaults, positive_duration, StepDef};
use crate::domain::duration::serde_duration;

/// Wait until an operator approves (`POST /v1/rollouts/{id}/approve`), or fail `not_approved`
/// at the timeout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Approve {
    /// How long to wait for the approval.
    #[serde(with = "serde_duration", default = "timeout")]
    pub timeout: Duration,
}

impl StepDef for Approve {
    const NAME: &'static str = "approve";
    const DOC: &'static str = "waits until an operator approves the rollout";
    const FIELDS: &'static [&'static str] = &["timeout"];

    fn check(&self) -> Checked {
        positive_duration("timeout", self.timeout)
    }

    fn budget(&self) -> Duration {
        self.timeout
    }

    type Evidence = ApproveEvidence;

    /// `approved by alice: "latency looks fine"`, or `waiting for an approval until …`.
    fn summary(d: &ApproveEvidence) -> Option<String> {
        if let Some(by) = &d.approved_by {
            let reason = d.reason.as_deref().unwrap_or("");
            return Some(format!("approved by {by}: {reason:?}"));
        }
        d.deadline.map(|deadline| {
            let deadline = deadline.to_rfc3339_opts(SecondsFormat::AutoSi, true);
            format!("waiting for an approval until {deadline}")
        })
    }
}

/// An `approve` step's evidence: while it waits, since when and until when; once approved,
/// who approved, why and when.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ApproveEvidence {
    /// When the step began to wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_since: Option<DateTime<Utc>>,
    /// `true` while the step waits (what `POST /approve` looks for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub awaiting_approval: Option<bool>,
    /// The end of the wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DateTime<Utc>>,
    /// The operator who approved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
    /// The operator's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the approval was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_at: Option<DateTime<Utc>>,
    /// Seconds from the start of the wait to the approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waited_s: Option<i64>,
}

fn timeout() -> Duration {
    defaults::APPROVE_TIMEOUT
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::runbook::step::evidence_tests::same_json_and_summary;

    #[test]
    fn stored_approve_evidence_reads_and_writes_back_the_same_json() {
        same_json_and_summary::<Approve>(&[
            (json!({}), None),
            (json!({"waiting_since": "2026-12-04T20:46:44.005545079Z"}), None),
            (
                json!({"awaiting_approval": true, "deadline": "2026-12-04T20:47:11.150110276Z",
                       "waiting_since": "2026-12-04T20:46:41.150110276Z"}),
                Some("waiting for an approval until 2026-12-04T20:47:11.150110276Z"),
            ),
            (
                json!({"awaiting_approval": true, "deadline": "2026-12-04T20:47:11Z",
                       "waiting_since": "2026-12-04T20:46:41.150Z"}),
                Some("waiting for an approval until 2026-12-04T20:47:11Z"),
            ),
            (
                json!({"approved_at": "2026-12-04T20:46:41.204Z", "approved_by": "local",
                       "reason": "after the restart", "waited_s": 0}),
                Some("approved by local: \"after the restart\""),
            ),
        ]);
    }
}
