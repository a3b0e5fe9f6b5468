//! `up`: the scoped `compose/up` of the target.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Checked, compose_summary, defaults, positive_duration, Scope, StepDef};
use crate::domain::duration::serde_duration;

/// Scoped `compose/up` of the target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Up {
    /// Deadline for the stream.
    #[serde(with = "serde_duration", default = "timeout")]
    pub timeout: Duration,
    /// The target, or the runbook's companion services.
    #[serde(flatten)]
    pub scope: Scope,
}

impl StepDef for Up {
    const NAME: &'static str = "up";
    const DOC: &'static str = "scoped `compose/up` of the target, or of the step's companion `services`";
    const FIELDS: &'static [&'static str] =
        &["timeout", "services", "only_out_of_date", "force_recreate"];
    const TOUCHES_REPLICA: bool = true;

    fn check(&self) -> Checked {
        positive_duration("timeout", self.timeout)?;
        self.scope.check()
    }

    fn budget(&self) -> Duration {
        self.timeout
    }

    type Evidence = serde_json::Value;

    fn summary(detail: &serde_json::Value) -> Option<String> {
        compose_summary(detail)
    }
}

fn timeout() -> Duration {
    defaults::UP_TIMEOUT
}
