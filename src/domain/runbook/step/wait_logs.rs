//! `wait_logs`: the target's startup lines appeared, and no forbidden one.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Checked, at_least_one, defaults, interval_within, positive_duration, StepDef};
use crate::domain::duration::serde_duration;
use crate::domain::names::ServiceName;
use crate::domain::pattern::{LogPattern, SeenLine};

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
    pub service: Option<ServiceName>,
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
        at_least_one("max_log_failures", self.max_log_failures)
    }

    fn budget(&self) -> Duration {
        self.timeout
    }

    type Evidence = WaitLogsEvidence;

    fn summary(d: &WaitLogsEvidence) -> Option<String> {
        let seen: Vec<&str> = d.seen.iter().map(|s| s.pattern.as_str()).collect();
        Some(format!("seen {seen:?}"))
    }
}

/// A `wait_logs` step's evidence, saved after every read of the logs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WaitLogsEvidence {
    /// The required patterns seen, with their first matching line.
    pub seen: Vec<SeenLine>,
    /// The required patterns not seen yet.
    pub missing: Vec<String>,
    /// How the reads of the logs went.
    #[serde(flatten)]
    pub reads: LogReadsEvidence,
    /// The companion whose logs were read; absent for the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceName>,
    /// The forbidden line that failed the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forbidden: Option<ForbiddenLine>,
}

/// How a log-watching step's reads of `compose/logs` went (`wait_logs`, `soak`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LogReadsEvidence {
    /// Failed reads in all.
    pub log_fetch_errors: u64,
    /// Failed reads since the last one that succeeded.
    pub log_fetch_failures_in_a_row: u32,
    /// The last failure; `null` when none failed.
    pub last_log_error: Option<LogReadError>,
}

/// A failed read of `compose/logs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogReadError {
    /// The error's code (`compose_server_error`).
    pub code: String,
    /// Its message: the status and compose-manager's text.
    pub message: String,
}

/// A line that matched a `forbid` pattern.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForbiddenLine {
    /// The pattern as written.
    pub pattern: String,
    /// The line.
    pub line: String,
    /// The whole multi-line block the line begins (a stall dump's stacks), when it has more
    /// than the line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<Vec<String>>,
    /// A soak's watched companion's lines naming the target, read when the line was found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub companion_lines: Option<Vec<String>>,
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::runbook::step::evidence_tests::{merged, same_json_and_summary};

    #[test]
    fn stored_wait_logs_evidence_reads_and_writes_back_the_same_json() {
        let reads = json!({"last_log_error": null, "log_fetch_errors": 0, "log_fetch_failures_in_a_row": 0});
        let with = |more: serde_json::Value| merged(&reads, more);
        let seen = json!([{"first_seen_at": "2026-12-04T20:46:20.855824049Z",
            "line": "[TP0] event-loop stall dump armed: stall=30s", "pattern": "event-loop stall dump armed"}]);
        same_json_and_summary::<WaitLogs>(&[
            (json!({}), None),
            (with(json!({"missing": [], "seen": seen})), Some("seen [\"event-loop stall dump armed\"]")),
            (with(json!({"missing": ["armed"], "seen": []})), Some("seen []")),
            (
                with(json!({"missing": [], "seen": seen, "service": "glm53-perception-check"})),
                Some("seen [\"event-loop stall dump armed\"]"),
            ),
            (
                with(json!({"missing": [], "seen": seen, "forbidden":
                    {"line": "TOKEN=*** CUDA error 801: operation not supported", "pattern": "CUDA error 801"}})),
                Some("seen [\"event-loop stall dump armed\"]"),
            ),
            (
                json!({"missing": ["armed"], "seen": [], "log_fetch_errors": 1, "log_fetch_failures_in_a_row": 1,
                       "last_log_error": {"code": "compose_server_error", "message": "compose-manager failed on /compose/logs (500)"}}),
                Some("seen []"),
            ),
        ]);
    }
}
