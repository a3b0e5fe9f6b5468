//! `wait_health`: the target answers `/health` again.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Checked, at_least_one, defaults, interval_within, positive_duration, StepDef};
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

    type Evidence = WaitHealthEvidence;

    fn summary(d: &WaitHealthEvidence) -> Option<String> {
        Some(format!(
            "{} healthy / {} unhealthy samples",
            d.healthy_samples, d.unhealthy_samples
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

/// A `wait_health` step's evidence, saved after every probe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WaitHealthEvidence {
    /// Probes answered 200.
    pub healthy_samples: u64,
    /// Probes that were not.
    pub unhealthy_samples: u64,
    /// 200s in a row, up to the last probe.
    pub streak: u32,
    /// The last `/health` sample, as the prober read it (`status`, `error`).
    pub last: serde_json::Value,
    /// When the current streak of 200s began: the replica's first healthy answer, once the
    /// step passed (the end of its downtime, `crate::domain::downtime`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_since: Option<chrono::DateTime<chrono::Utc>>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::runbook::step::evidence_tests::same_json_and_summary;

    #[test]
    fn stored_wait_health_evidence_reads_and_writes_back_the_same_json() {
        same_json_and_summary::<WaitHealth>(&[
            (json!({}), None),
            (
                json!({"healthy_samples": 0, "unhealthy_samples": 1, "streak": 0,
                       "last": {"error": null, "status": 503}}),
                Some("0 healthy / 1 unhealthy samples"),
            ),
            (
                json!({"healthy_samples": 3, "unhealthy_samples": 2, "streak": 3,
                       "last": {"error": "connection refused", "status": null}}),
                Some("3 healthy / 2 unhealthy samples"),
            ),
            (
                json!({"healthy_samples": 3, "unhealthy_samples": 2, "streak": 3,
                       "last": {"error": null, "status": 200},
                       "healthy_since": "2026-12-06T03:40:00Z"}),
                Some("3 healthy / 2 unhealthy samples"),
            ),
        ]);
    }
}
