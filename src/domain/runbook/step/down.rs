//! `down`: the scoped `compose/down` of the target.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Checked, compose_summary, defaults, positive_duration, Scope, StepDef};
use crate::domain::duration::serde_duration;

/// Scoped `compose/down` of the target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Down {
    /// Deadline for the stream.
    #[serde(with = "serde_duration", default = "timeout")]
    pub timeout: Duration,
    /// The target, or the runbook's companion services.
    #[serde(flatten, deserialize_with = "super::services_only")]
    pub scope: Scope,
}

impl StepDef for Down {
    const NAME: &'static str = "down";
    const DOC: &'static str = "scoped `compose/down` of the target, or of the step's companion `services`";
    const FIELDS: &'static [&'static str] = &["timeout", "services"];
    const TOUCHES_REPLICA: bool = true;

    fn check(&self) -> Checked {
        positive_duration("timeout", self.timeout)?;
        self.scope.check()
    }

    fn budget(&self) -> Duration {
        self.timeout
    }

    type Evidence = super::up::ComposeEvidence;

    fn summary(evidence: &super::up::ComposeEvidence) -> Option<String> {
        compose_summary(evidence)
    }
}

fn timeout() -> Duration {
    defaults::DOWN_TIMEOUT
}
