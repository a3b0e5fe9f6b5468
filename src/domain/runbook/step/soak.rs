//! `soak`: the target stays healthy and quiet for a while.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::wait_logs::{ForbiddenLine, LogReadsEvidence};
use super::{Checked, at_least_one, defaults, interval_within, positive_duration, StepDef};
use crate::domain::duration::serde_duration;
use crate::domain::pattern::LogPattern;
use crate::domain::uptime::ContainerRead;

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
    /// Another compose service's log watched for lines naming the target (the proxy's view).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch: Option<crate::domain::pattern::CompanionWatch>,
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
        "watch",
    ];

    fn check(&self) -> Checked {
        positive_duration("duration", self.duration)?;
        positive_duration("interval", self.interval)?;
        interval_within(self.interval, self.duration, "duration")?;
        at_least_one("max_misses", self.max_misses)?;
        if self.watch.as_ref().is_some_and(|w| w.patterns.is_empty()) {
            let msg = "`watch.patterns` must name at least one line to count".to_owned();
            return Err(("watch", msg));
        }
        at_least_one("max_log_failures", self.max_log_failures)
    }

    fn budget(&self) -> Duration {
        self.duration
    }

    type Evidence = SoakEvidence;

    fn summary(d: &SoakEvidence) -> Option<String> {
        let p = d.probes.as_ref()?;
        Some(format!(
            "{} probes, worst miss streak {}",
            p.probes, p.worst_streak
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

/// A `soak` step's evidence, saved as it goes: the probes, how much of the window was watched,
/// the log reads, and what failed it. A restart of the target fails it with the `restart`
/// reads alone.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SoakEvidence {
    /// The health probes.
    #[serde(flatten)]
    pub probes: Option<SoakProbes>,
    /// How much of the window was watched.
    #[serde(flatten)]
    pub watched: Option<WatchedEvidence>,
    /// How the reads of the logs went.
    #[serde(flatten)]
    pub reads: Option<LogReadsEvidence>,
    /// The forbidden line that failed the soak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forbidden: Option<ForbiddenLine>,
    /// The reads of the target's container, when it restarted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<RestartEvidence>,
    /// The watched companion's lines naming the target (`watch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub companion: Option<CompanionLines>,
}

/// What a soak's `watch` saw: the lines counted, each with when canaryd first read it (the
/// first 50 kept), how many, and where the next read of the log starts.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CompanionLines {
    pub service: String,
    pub count: u64,
    pub lines: Vec<SeenLine>,
    /// The last line read: lines after it are new (absent before the first read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    /// Whether the log was read once (its lines then were before the soak).
    #[serde(default)]
    pub read: bool,
}

/// A line of a companion's log, with when canaryd first read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeenLine {
    pub at: DateTime<Utc>,
    pub line: String,
}

/// A soak's health probes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SoakProbes {
    /// Probes sent.
    pub probes: u64,
    /// Missed probes in a row, up to the last one.
    pub misses_in_a_row: u32,
    /// The longest run of missed probes.
    pub worst_streak: u32,
    /// The last `/health` sample, as the prober read it (`status`, `error`).
    pub last: serde_json::Value,
    /// The target's container the soak holds it to; `null` before the first read.
    pub container_id: Option<String>,
}

/// How much of a watching step's window (`soak`, `analyze`) was watched (safety rule 19).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchedEvidence {
    /// The part of the window the probes covered, over every drive of the step.
    pub observed_ms: i64,
    /// For a drive that resumed the step: what it watches again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed: Option<ResumedWatch>,
    /// For a drive that resumed the step: how much of the window it watched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reobserved_ms: Option<i64>,
}

/// What a resumed drive of a watching step watches again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumedWatch {
    /// Observed by earlier drives, as last saved.
    pub observed_before_ms: i64,
    /// The part of the window nobody watched.
    pub unobserved_ms: i64,
    /// Where this drive's watch begins.
    pub watch_from: DateTime<Utc>,
    /// Until when it watches.
    pub watch_until: DateTime<Utc>,
}

/// The reads of the target's container of a watching step (`soak`, `analyze`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartEvidence {
    /// The first read: the container the step holds the target to.
    pub first: Option<ContainerRead>,
    /// The last read before the restart was seen.
    pub last: Option<ContainerRead>,
    /// Reads that answered.
    pub ps_reads: u64,
    /// Reads that failed.
    pub ps_read_errors: u64,
    /// The last failed read's error.
    pub last_ps_error: Option<String>,
    /// The read that saw the restart; `null` when the container was gone.
    #[serde(
        default,
        deserialize_with = "super::present",
        skip_serializing_if = "Option::is_none"
    )]
    pub now: Option<Option<ContainerRead>>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::runbook::step::evidence_tests::{merged, same_json_and_summary};

    #[test]
    fn stored_soak_evidence_reads_and_writes_back_the_same_json() {
        let probes = json!({"container_id": "e48fd366ca0f", "last": {"error": null, "status": 200},
                            "misses_in_a_row": 0, "observed_ms": 4, "probes": 1, "worst_streak": 0});
        let with = |more: serde_json::Value| merged(&probes, more);
        let reads = json!({"last_log_error": null, "log_fetch_errors": 0, "log_fetch_failures_in_a_row": 0});
        let read = |id: &str| json!({"at": "2026-12-04T20:46:32.740318758Z", "id": id, "status": "Up 2 seconds"});
        same_json_and_summary::<Soak>(&[
            (json!({}), None),
            (with(reads.clone()), Some("1 probes, worst miss streak 0")),
            (
                json!({"container_id": null, "last": {"error": null, "status": 503}, "misses_in_a_row": 3,
                       "observed_ms": 153, "probes": 4, "worst_streak": 3}),
                Some("4 probes, worst miss streak 3"),
            ),
            (
                with(json!({"last_log_error": {"code": "compose_server_error", "message": "(500)"},
                            "log_fetch_errors": 1, "log_fetch_failures_in_a_row": 1})),
                Some("1 probes, worst miss streak 0"),
            ),
            (
                with(json!({"last_log_error": null, "log_fetch_errors": 0, "log_fetch_failures_in_a_row": 0,
                            "reobserved_ms": 5, "resumed": {"observed_before_ms": 0, "unobserved_ms": 300,
                            "watch_from": "2026-12-04T20:49:01.660720535Z", "watch_until": "2026-12-04T20:49:01.960720535Z"}})),
                Some("1 probes, worst miss streak 0"),
            ),
            (
                with(json!({"forbidden": {"line": "CUDA error: an illegal memory access", "pattern": "CUDA error"}})),
                Some("1 probes, worst miss streak 0"),
            ),
            (
                json!({"restart": {"first": read("89ec98ad7f04"), "last": read("89ec98ad7f04"), "last_ps_error": null,
                                   "now": read("1234"), "ps_read_errors": 0, "ps_reads": 52}}),
                None,
            ),
            (
                json!({"restart": {"first": null, "last": null, "last_ps_error": "refused",
                                   "now": null, "ps_read_errors": 1, "ps_reads": 1}}),
                None,
            ),
            (
                json!({"restart": {"first": read("89ec98ad7f04"), "last": null, "last_ps_error": null,
                                   "ps_read_errors": 0, "ps_reads": 1}}),
                None,
            ),
        ]);
    }
}
