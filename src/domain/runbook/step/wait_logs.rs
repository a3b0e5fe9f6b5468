//! `wait_logs`: the target's startup lines appeared, and no forbidden one.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{defaults, Fields, StepDef, StepError};
use crate::domain::duration::serde_duration;
use crate::domain::pattern::LogPattern;

/// Poll `compose/logs` until every `require` line appeared; fail on any `forbid` line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WaitLogs {
    /// Overall deadline.
    #[serde(with = "serde_duration")]
    pub timeout: Duration,
    /// Time between polls.
    #[serde(with = "serde_duration")]
    pub interval: Duration,
    /// Lines that must appear (the plan's `require_logs` are added to them).
    pub require: Vec<LogPattern>,
    /// Lines that fail the step at once.
    pub forbid: Vec<LogPattern>,
    /// Log fetches that may fail in a row before the step fails `logs_unavailable`.
    pub max_log_failures: u32,
    /// The compose service whose logs are read (a companion such as the perception check);
    /// `None` is the rollout's target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
}

impl StepDef for WaitLogs {
    const NAME: &'static str = "wait_logs";
    const DOC: &'static str =
        "polls the target's (or `service`'s) logs until every `require` pattern appeared; fails on a `forbid` one";
    const FIELDS: &'static [&'static str] = &[
        "timeout",
        "interval",
        "require",
        "forbid",
        "max_log_failures",
        "service",
    ];

    fn parse(fields: &Fields<'_>) -> Result<Self, StepError> {
        let timeout = fields.duration("timeout", defaults::WAIT_LOGS_TIMEOUT)?;
        let interval = fields.duration("interval", defaults::WAIT_LOGS_INTERVAL)?;
        fields.interval_within(interval, timeout, "timeout")?;
        Ok(WaitLogs {
            timeout,
            interval,
            require: fields.patterns("require")?,
            forbid: fields.patterns("forbid")?,
            max_log_failures: fields.positive("max_log_failures", defaults::MAX_LOG_FAILURES)?,
            service: fields.service("service")?,
        })
    }

    fn budget(&self) -> Duration {
        self.timeout
    }

    fn summary(detail: &serde_json::Value) -> Option<String> {
        detail["seen"].as_array().map(|seen| {
            let seen: Vec<&str> = seen.iter().filter_map(|x| x["pattern"].as_str()).collect();
            format!("seen {seen:?}")
        })
    }
}
