//! `up`: the scoped `compose/up` of the target.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Checked, compose_summary, defaults, positive_duration, Scope, StepDef};
use crate::domain::duration::serde_duration;
use crate::domain::names::ServiceName;
use super::call::CallFailure;
use super::plan::PlannedChanges;
use super::signals::Signals;

/// Scoped `compose/up` of the target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Up {
    /// Deadline for the stream.
    #[serde(with = "serde_duration", default = "timeout")]
    pub timeout: Duration,
    /// The target, or the runbook's companion services.
    #[serde(flatten)]
    pub scope: Scope,
}

impl StepDef for Up {
    const NAME: &'static str = "up";
    const DOC: &'static str = "scoped `compose/up` of the target, or of the step's companion `services`";
    const FIELDS: &'static [&'static str] =
        &["timeout", "services", "only_out_of_date", "force_recreate"];
    const TOUCHES_REPLICA: bool = true;

    fn check(&self) -> Checked {
        positive_duration("timeout", self.timeout)?;
        self.scope.check()
    }

    fn budget(&self) -> Duration {
        self.timeout
    }

    type Evidence = ComposeEvidence;

    fn summary(evidence: &ComposeEvidence) -> Option<String> {
        compose_summary(evidence)
    }
}

/// The evidence of a `down` or `up` step: its compose call, and what the step adds around it
/// (the signals read before the first touch, how an unknown outcome was settled, a rollback's
/// tag check: [`CallFailure`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ComposeEvidence {
    /// `compose/down` or `compose/up`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Output lines the stream carried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lines: Option<u64>,
    /// The last output lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<Vec<String>>,
    /// `false` when the step ended before its call was sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent: Option<bool>,
    /// The companion services the call acted on; absent for the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<Vec<ServiceName>>,
    /// A reconcile `up` that sent nothing: `true`, with why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<bool>,
    /// Why the reconcile sent nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What the reconcile applied (empty when it sent nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apply: Option<Vec<ServiceName>>,
    /// The former service a rename's `down` acted on, with its file and tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaces: Option<Replaces>,
    /// The plan of the read-only dry run that put the former service's file back first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_restored_by_dry_run: Option<PlannedChanges>,
    /// The plan of that dry run when it refused the down (`null`: it answered without one).
    #[serde(
        default,
        deserialize_with = "super::present",
        skip_serializing_if = "Option::is_none"
    )]
    pub plan: Option<Option<PlannedChanges>>,
    /// The signals read before the rollout's first call of its target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signals: Option<Signals>,
    /// A `stage`'s `staged` event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staged: Option<Staged>,
    /// How a call that did not end with a plain answer went.
    #[serde(flatten)]
    pub failure: CallFailure,
}

/// The `staged` event of a `materialize_only` up: the file and tag compose pulled and built
/// for. Its `images` list is not kept: the server reports `[]` whenever `env` is set, and
/// otherwise the images of the containers that exist, not the ones pulled.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Staged {
    pub file: String,
    pub file_sha256: String,
    pub tag: String,
}

/// The former service of a rename: as its `down` acted on it, or only its name when no
/// deployment of it is recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Replaces {
    Deployed(Replaced),
    Named(String),
}

/// The former service of a rename, as its `down` acted on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replaced {
    /// Its compose service name.
    pub service: String,
    /// The compose file that deployed it.
    pub file: String,
    /// The tag that deployed it.
    pub tag: String,
}

fn timeout() -> Duration {
    defaults::UP_TIMEOUT
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::runbook::step::evidence_tests::same_json_and_summary;
    use crate::domain::runbook::step::Down;

    #[test]
    fn stored_down_and_up_evidence_reads_and_writes_back_the_same_json() {
        let tail = json!(["stderr:  Container r2 Stopped"]);
        let container = json!({"id": "293c4a1c682a", "image": "sglang:v450", "labels": "", "names": "r2",
                               "state": "running", "status": "Up About an hour"});
        let cases = [
            (json!({}), None),
            (json!({"endpoint": "compose/down", "lines": 4, "tail": tail}), Some("4 stream lines")),
            (json!({"endpoint": "compose/up", "lines": 0, "tail": []}), Some("0 stream lines")),
            (json!({"endpoint": "compose/up", "sent": false}), None),
            (json!({"sent": false}), None),
            (
                json!({"endpoint": "compose/up", "lines": 8, "services": ["perception"], "tail": tail}),
                Some("8 stream lines"),
            ),
            (
                json!({"apply": [], "reason": "the dry run found nothing out of date",
                       "services": ["nginx", "proxy"], "skipped": true}),
                None,
            ),
            (
                json!({"endpoint": "compose/down", "lines": 9, "services": ["r2-old"], "tail": tail,
                       "replaces": {"file": "prod/old.yaml", "service": "r2-old", "tag": "v0.0.451"},
                       "file_restored_by_dry_run": {"create": [], "recreate": [], "remove": [],
                                                    "resources": [], "unchanged": ["r2-old"]}}),
                Some("9 stream lines"),
            ),
            (
                json!({"call": {"endpoint": "compose/up", "lines": 13, "tail": tail}, "host_idle": true,
                       "settle": {"host_idle": true, "ps_reads": 2, "settled": true, "target_changes": 0},
                       "target_before": container, "target_changed_since_snapshot": true,
                       "target_container": null, "target_settled": true, "waited_ms": 537}),
                None,
            ),
            (
                json!({"call": {"endpoint": "compose/down", "lines": 0, "tail": tail}, "host_idle": false,
                       "outcome": "unknown", "target_settled": false, "waited_ms": 546}),
                None,
            ),
            (
                json!({"call": {"endpoint": "compose/up", "lines": 13, "tail": tail},
                       "expected": {"commit": "9100", "file_sha256": "9df5"},
                       "got": {"commit": "ffff", "file_sha256": "2772"}}),
                None,
            ),
            (json!({"last_error": "compose-manager host is busy"}), None),
            (json!({"replaces": "r2-old"}), None),
            (
                json!({"plan": {"create": [], "recreate": ["r2-old"], "remove": [], "resources": [],
                                "unchanged": []}, "tail": tail}),
                None,
            ),
            (
                json!({"sent": false, "signals": {"blocking": true, "read_at": "2026-12-06T03:00:00Z",
                       "sources": [{"source": "logs", "service": "r2", "lines": null, "ok": false,
                                    "error": "logs of r2: 500"},
                                   {"source": "metrics", "replica": "r2", "role": "target",
                                    "skipped": "not serving"}]}}),
                None,
            ),
        ];
        same_json_and_summary::<Up>(&cases);
        same_json_and_summary::<Down>(&cases);
    }
}
