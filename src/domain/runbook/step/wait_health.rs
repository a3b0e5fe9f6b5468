//! `wait_health`: the target answers `/health` again.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Checked, at_least_one, defaults, interval_within, positive_duration, shown, StepDef};
use crate::domain::duration::serde_duration;

/// Poll `/health` until `consecutive` 200s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitHealth {
    /// Overall deadline.
    #[serde(with = "serde_duration", default = "timeout")]
    pub timeout: Duration,
    /// Time between probes.
    #[serde(with = "serde_duration", default = "interval")]
    pub interval: Duration,
    /// 200s in a row needed.
    #[serde(default = "consecutive")]
    pub consecutive: u32,
}

impl StepDef for WaitHealth {
    const NAME: &'static str = "wait_health";
    const DOC: &'static str = "polls the target's `/health` until `consecutive` 200s in a row";
    const FIELDS: &'static [&'static str] = &["timeout", "interval", "consecutive"];

    fn check(&self) -> Checked {
        positive_duration("timeout", self.timeout)?;
        positive_duration("interval", self.interval)?;
        interval_within(self.interval, self.timeout, "timeout")?;
        at_least_one("consecutive", self.consecutive)
    }

    fn budget(&self) -> Duration {
        self.timeout
    }

    type Evidence = serde_json::Value;

    fn summary(detail: &serde_json::Value) -> Option<String> {
        Some(format!(
            "{} healthy / {} unhealthy samples",
            shown(&detail["healthy_samples"])?,
            shown(&detail["unhealthy_samples"])?
        ))
    }
}

fn timeout() -> Duration {
    defaults::WAIT_HEALTH_TIMEOUT
}

fn interval() -> Duration {
    defaults::WAIT_HEALTH_INTERVAL
}

fn consecutive() -> u32 {
    defaults::WAIT_HEALTH_CONSECUTIVE
}
