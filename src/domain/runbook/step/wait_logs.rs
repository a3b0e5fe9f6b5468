//! `wait_logs`: the target's startup lines appeared, and no forbidden one.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Checked, at_least_one, defaults, interval_within, positive_duration, valid_name, StepDef};
use crate::domain::duration::serde_duration;
use crate::domain::pattern::LogPattern;

/// Poll `compose/logs` until every `require` line appeared; fail on any `forbid` line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitLogs {
    /// Overall deadline.
    #[serde(with = "serde_duration", default = "timeout")]
    pub timeout: Duration,
    /// Time between polls.
    #[serde(with = "serde_duration", default = "interval")]
    pub interval: Duration,
    /// Lines that must appear (the plan's `require_logs` are added to them).
    #[serde(default)]
    pub require: Vec<LogPattern>,
    /// Lines that fail the step at once.
    #[serde(default)]
    pub forbid: Vec<LogPattern>,
    /// Log fetches that may fail in a row before the step fails `logs_unavailable`.
    #[serde(default = "max_log_failures")]
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

    fn check(&self) -> Checked {
        positive_duration("timeout", self.timeout)?;
        positive_duration("interval", self.interval)?;
        interval_within(self.interval, self.timeout, "timeout")?;
        at_least_one("max_log_failures", self.max_log_failures)?;
        match &self.service {
            Some(name) if !valid_name(name) => Err((
                "service",
                format!("`service` must be one compose service name, got \"{name}\""),
            )),
            _ => Ok(()),
        }
    }

    fn budget(&self) -> Duration {
        self.timeout
    }

    type Evidence = serde_json::Value;

    fn summary(detail: &serde_json::Value) -> Option<String> {
        detail["seen"].as_array().map(|seen| {
            let seen: Vec<&str> = seen.iter().filter_map(|x| x["pattern"].as_str()).collect();
            format!("seen {seen:?}")
        })
    }
}

fn timeout() -> Duration {
    defaults::WAIT_LOGS_TIMEOUT
}

fn interval() -> Duration {
    defaults::WAIT_LOGS_INTERVAL
}

fn max_log_failures() -> u32 {
    defaults::MAX_LOG_FAILURES
}
