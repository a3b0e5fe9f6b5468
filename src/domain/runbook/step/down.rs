//! `down`: the scoped `compose/down` of the target.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{compose_summary, defaults, Fields, Scope, StepDef, StepError};
use crate::domain::duration::serde_duration;

/// Scoped `compose/down` of the target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Down {
    /// Deadline for the stream.
    #[serde(with = "serde_duration")]
    pub timeout: Duration,
    /// The target, or the runbook's companion services.
    #[serde(flatten)]
    pub scope: Scope,
}

impl StepDef for Down {
    const NAME: &'static str = "down";
    const DOC: &'static str = "scoped `compose/down` of the target, or of the step's companion `services`";
    const FIELDS: &'static [&'static str] = &["timeout", "services"];
    const TOUCHES_REPLICA: bool = true;

    fn parse(fields: &Fields<'_>) -> Result<Self, StepError> {
        Ok(Down {
            timeout: fields.duration("timeout", defaults::DOWN_TIMEOUT)?,
            scope: fields.scope(false)?,
        })
    }

    fn budget(&self) -> Duration {
        self.timeout
    }

    fn summary(detail: &serde_json::Value) -> Option<String> {
        compose_summary(detail)
    }
}
