//! `soak`: the target stays healthy and quiet for a while.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Checked, at_least_one, defaults, interval_within, positive_duration, shown, StepDef};
use crate::domain::duration::serde_duration;
use crate::domain::pattern::LogPattern;

/// For `duration`, health may not miss `max_misses` probes in a row, no `forbid` line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Soak {
    /// How long to watch.
    #[serde(with = "serde_duration", default = "duration")]
    pub duration: Duration,
    /// Time between health probes and log polls.
    #[serde(with = "serde_duration", default = "interval")]
    pub interval: Duration,
    /// Consecutive missed probes that fail the soak.
    #[serde(default = "max_misses")]
    pub max_misses: u32,
    /// Lines that fail the soak at once.
    #[serde(default)]
    pub forbid: Vec<LogPattern>,
    /// Log fetches that may fail in a row before the soak fails `logs_unavailable`.
    #[serde(default = "max_log_failures")]
    pub max_log_failures: u32,
}

impl StepDef for Soak {
    const NAME: &'static str = "soak";
    const DOC: &'static str =
        "for `duration`, `/health` may not miss `max_misses` probes in a row and no `forbid` line appears";
    const FIELDS: &'static [&'static str] = &[
        "duration",
        "interval",
        "max_misses",
        "forbid",
        "max_log_failures",
    ];

    fn check(&self) -> Checked {
        positive_duration("duration", self.duration)?;
        positive_duration("interval", self.interval)?;
        interval_within(self.interval, self.duration, "duration")?;
        at_least_one("max_misses", self.max_misses)?;
        at_least_one("max_log_failures", self.max_log_failures)
    }

    fn budget(&self) -> Duration {
        self.duration
    }

    type Evidence = serde_json::Value;

    fn summary(detail: &serde_json::Value) -> Option<String> {
        Some(format!(
            "{} probes, worst miss streak {}",
            shown(&detail["probes"])?,
            shown(&detail["worst_streak"])?
        ))
    }
}

fn duration() -> Duration {
    defaults::SOAK_DURATION
}

fn interval() -> Duration {
    defaults::SOAK_INTERVAL
}

fn max_misses() -> u32 {
    defaults::SOAK_MAX_MISSES
}

fn max_log_failures() -> u32 {
    defaults::MAX_LOG_FAILURES
}
