//! `wait_health`: the target answers `/health` again.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{defaults, shown, Fields, StepDef, StepError};
use crate::domain::duration::serde_duration;

/// Poll `/health` until `consecutive` 200s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WaitHealth {
    /// Overall deadline.
    #[serde(with = "serde_duration")]
    pub timeout: Duration,
    /// Time between probes.
    #[serde(with = "serde_duration")]
    pub interval: Duration,
    /// 200s in a row needed.
    pub consecutive: u32,
}

impl StepDef for WaitHealth {
    const NAME: &'static str = "wait_health";
    const DOC: &'static str = "polls the target's `/health` until `consecutive` 200s in a row";
    const FIELDS: &'static [&'static str] = &["timeout", "interval", "consecutive"];

    fn parse(fields: &Fields<'_>) -> Result<Self, StepError> {
        let timeout = fields.duration("timeout", defaults::WAIT_HEALTH_TIMEOUT)?;
        let interval = fields.duration("interval", defaults::WAIT_HEALTH_INTERVAL)?;
        fields.interval_within(interval, timeout, "timeout")?;
        Ok(WaitHealth {
            timeout,
            interval,
            consecutive: fields.positive("consecutive", defaults::WAIT_HEALTH_CONSECUTIVE)?,
        })
    }

    fn budget(&self) -> Duration {
        self.timeout
    }

    fn summary(detail: &serde_json::Value) -> Option<String> {
        Some(format!(
            "{} healthy / {} unhealthy samples",
            shown(&detail["healthy_samples"])?,
            shown(&detail["unhealthy_samples"])?
        ))
    }
}
