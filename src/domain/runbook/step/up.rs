//! `up`: the scoped `compose/up` of the target.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{compose_summary, defaults, Fields, StepDef, StepError};
use crate::domain::duration::serde_duration;

/// Scoped `compose/up` of the target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Up {
    /// Deadline for the stream.
    #[serde(with = "serde_duration")]
    pub timeout: Duration,
}

impl StepDef for Up {
    const NAME: &'static str = "up";
    const DOC: &'static str = "scoped `compose/up` of the target";
    const FIELDS: &'static [&'static str] = &["timeout"];
    const TOUCHES_REPLICA: bool = true;

    fn parse(fields: &Fields<'_>) -> Result<Self, StepError> {
        Ok(Up {
            timeout: fields.duration("timeout", defaults::UP_TIMEOUT)?,
        })
    }

    fn budget(&self) -> Duration {
        self.timeout
    }

    fn summary(detail: &serde_json::Value) -> Option<String> {
        compose_summary(detail)
    }
}
