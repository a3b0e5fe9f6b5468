//! `approve`: wait for an operator's decision (docs/reference.md#approve).

use std::time::Duration;

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

    type Evidence = serde_json::Value;

    /// `approved by alice: "latency looks fine"`, or `waiting for an approval until …`.
    fn summary(detail: &serde_json::Value) -> Option<String> {
        if let Some(by) = detail["approved_by"].as_str() {
            let reason = detail["reason"].as_str().unwrap_or("");
            return Some(format!("approved by {by}: {reason:?}"));
        }
        detail["deadline"]
            .as_str()
            .map(|deadline| format!("waiting for an approval until {deadline}"))
    }
}

fn timeout() -> Duration {
    defaults::APPROVE_TIMEOUT
}
