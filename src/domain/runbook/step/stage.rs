//! `stage`: the target's image pulled and built at the new tag before its `down`, while the old
//! container still serves (`compose/up` with `materialize_only`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{compose_summary, defaults, positive_duration, Checked, StepDef};
use crate::domain::duration::serde_duration;

/// `compose/up` of the target alone with `materialize_only: true`: compose pulls and builds,
/// runs nothing. Skipped, with why in its evidence, on a server without `materialize_only`
/// (an older compose-manager ignores the flag and would deploy for real).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    /// Deadline for the stream (the pull of a multi-GB image).
    #[serde(with = "serde_duration", default = "timeout")]
    pub timeout: Duration,
}

impl StepDef for Stage {
    const NAME: &'static str = "stage";
    const DOC: &'static str = "pulls and builds the target's image at the new tag (`materialize_only`) while the old container serves; skipped on a server without it";
    const FIELDS: &'static [&'static str] = &["timeout"];

    fn check(&self) -> Checked {
        positive_duration("timeout", self.timeout)
    }

    fn budget(&self) -> Duration {
        self.timeout
    }

    type Evidence = super::up::ComposeEvidence;

    fn summary(evidence: &super::up::ComposeEvidence) -> Option<String> {
        match (&evidence.staged, evidence.skipped) {
            (Some(staged), _) => Some(format!("staged {} of {}", staged.tag, staged.file)),
            (None, Some(true)) => Some("skipped: the server cannot stage".to_owned()),
            _ => compose_summary(evidence),
        }
    }
}

fn timeout() -> Duration {
    defaults::STAGE_TIMEOUT
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::runbook::step::evidence_tests::same_json_and_summary;

    #[test]
    fn stored_stage_evidence_reads_and_writes_back_the_same_json() {
        let tail = json!(["stderr:  r2 Pulled"]);
        let staged = json!({"file": "prod/glm.yaml", "file_sha256": "9df5", "tag": "v0.0.452"});
        let cases = [
            (json!({}), None),
            (
                json!({"endpoint": "compose/up?materialize_only", "lines": 2, "tail": tail,
                       "staged": staged}),
                Some("staged v0.0.452 of prod/glm.yaml"),
            ),
            (
                json!({"skipped": true, "reason": "compose-manager does not support materialize_only"}),
                Some("skipped: the server cannot stage"),
            ),
            (
                json!({"endpoint": "compose/up?materialize_only", "lines": 3, "tail": tail}),
                Some("3 stream lines"),
            ),
        ];
        same_json_and_summary::<Stage>(&cases);
    }

    #[test]
    fn a_stage_takes_a_timeout_longer_than_zero() {
        let stage: Stage = serde_yaml::from_str("{}").expect("defaults");
        assert_eq!(stage.timeout, defaults::STAGE_TIMEOUT);
        assert!(stage.check().is_ok());
        let zero = Stage {
            timeout: Duration::ZERO,
        };
        assert_eq!(zero.check().map_err(|(f, _)| f), Err("timeout"));
    }
}
