//! `window`: wait for a low-traffic window before the replica is taken out
//! (docs/reference.md#low-traffic-windows).

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

use super::approve::ApproveEvidence;
use super::{defaults, positive_duration, Checked, StepDef};
use crate::domain::duration::serde_duration;
use crate::domain::window::TrafficWindow;

/// Waits until one of the host's low-traffic windows (or the step's own `windows`) is open, or
/// an operator starts the rollout now with a reason (an approval); fails `window_closed` at
/// its timeout. A rollback never waits, nor a host without windows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Window {
    /// How long to wait for a window.
    #[serde(with = "serde_duration", default = "timeout")]
    pub timeout: Duration,
    /// Windows of this runbook, instead of the host's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<TrafficWindow>,
}

impl StepDef for Window {
    const NAME: &'static str = "window";
    const DOC: &'static str = "waits for a low-traffic window of the host (or its own `windows`), unless an operator starts the rollout now";
    const FIELDS: &'static [&'static str] = &["timeout", "windows"];

    fn check(&self) -> Checked {
        positive_duration("timeout", self.timeout)
    }

    fn budget(&self) -> Duration {
        self.timeout
    }

    type Evidence = WindowEvidence;

    fn summary(d: &WindowEvidence) -> Option<String> {
        let time = |t: &DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::Secs, true);
        if let Some(why) = &d.skipped {
            return Some(format!("did not wait: {why}"));
        }
        if let Some(by) = &d.approval.approved_by {
            let reason = d.approval.reason.as_deref().unwrap_or("");
            return Some(format!("started outside the window by {by}: {reason:?}"));
        }
        if let Some(at) = &d.opened_at {
            return Some(format!("window open at {}", time(at)));
        }
        d.next_opening
            .as_ref()
            .map(|at| format!("waiting for the window opening at {}", time(at)))
    }
}

/// A `window` step's evidence: the windows it read; why it did not wait; while it waits, the
/// next opening (with the approval wait's own keys, as an `approve` step keeps them); how the
/// wait ended (the window opened, or who started the rollout early and why).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct WindowEvidence {
    /// The windows, as one line (`sat,sun 02:00-06:00 UTC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows: Option<String>,
    /// Why the step did not wait (a rollback, no window configured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// When the next window opens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_opening: Option<DateTime<Utc>>,
    /// What the step waits for, as a notification says it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// When the step found a window open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opened_at: Option<DateTime<Utc>>,
    /// The wait, and an operator's start-now, as an approval.
    #[serde(flatten)]
    pub approval: ApproveEvidence,
}

fn timeout() -> Duration {
    defaults::WINDOW_TIMEOUT
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::runbook::step::evidence_tests::same_json_and_summary;

    #[test]
    fn stored_window_evidence_reads_and_writes_back_the_same_json() {
        let w = "sat,sun 02:00-06:00 UTC";
        let cases = [
            (json!({}), None),
            (
                json!({"skipped": "a rollback never waits for a low-traffic window"}),
                Some("did not wait: a rollback never waits for a low-traffic window"),
            ),
            (
                json!({"windows": w, "opened_at": "2026-12-05T02:00:00Z"}),
                Some("window open at 2026-12-05T02:00:00Z"),
            ),
            (
                json!({"windows": w, "next_opening": "2026-12-05T02:00:00Z",
                       "waiting_for": "the low-traffic window", "awaiting_approval": true,
                       "deadline": "2026-12-06T00:00:00Z", "waiting_since": "2026-12-05T00:00:00Z"}),
                Some("waiting for the window opening at 2026-12-05T02:00:00Z"),
            ),
            (
                json!({"windows": w, "next_opening": "2026-12-05T02:00:00Z",
                       "approved_by": "alice", "reason": "incident fix", "waited_s": 60,
                       "approved_at": "2026-12-05T00:01:00Z"}),
                Some("started outside the window by alice: \"incident fix\""),
            ),
        ];
        same_json_and_summary::<Window>(&cases);
    }

    #[test]
    fn a_window_step_takes_its_own_windows_and_a_timeout_longer_than_zero() {
        let step: Window =
            serde_yaml::from_str("{windows: [{start: '02:00', end: '06:00'}]}").expect("reads");
        assert_eq!(step.timeout, defaults::WINDOW_TIMEOUT);
        assert_eq!(step.windows.len(), 1);
        let zero: Window = serde_yaml::from_str("{timeout: 0s}").expect("reads");
        assert_eq!(zero.check().map_err(|(f, _)| f), Err("timeout"));
    }
}
