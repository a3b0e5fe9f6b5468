//! `soak`: the target stays healthy and quiet for a while.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{defaults, shown, Fields, StepDef, StepError};
use crate::domain::duration::serde_duration;
use crate::domain::pattern::LogPattern;

/// For `duration`, health may not miss `max_misses` probes in a row, no `forbid` line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Soak {
    /// How long to watch.
    #[serde(with = "serde_duration")]
    pub duration: Duration,
    /// Time between health probes and log polls.
    #[serde(with = "serde_duration")]
    pub interval: Duration,
    /// Consecutive missed probes that fail the soak.
    pub max_misses: u32,
    /// Lines that fail the soak at once.
    pub forbid: Vec<LogPattern>,
    /// Log fetches that may fail in a row before the soak fails `logs_unavailable`.
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

    fn parse(fields: &Fields<'_>) -> Result<Self, StepError> {
        let duration = fields.duration("duration", defaults::SOAK_DURATION)?;
        let interval = fields.duration("interval", defaults::SOAK_INTERVAL)?;
        fields.interval_within(interval, duration, "duration")?;
        Ok(Soak {
            duration,
            interval,
            max_misses: fields.positive("max_misses", defaults::SOAK_MAX_MISSES)?,
            forbid: fields.patterns("forbid")?,
            max_log_failures: fields.positive("max_log_failures", defaults::MAX_LOG_FAILURES)?,
        })
    }

    fn budget(&self) -> Duration {
        self.duration
    }

    fn summary(detail: &serde_json::Value) -> Option<String> {
        Some(format!(
            "{} probes, worst miss streak {}",
            shown(&detail["probes"])?,
            shown(&detail["worst_streak"])?
        ))
    }
}
