//! `verify_neighbours`: the rollout touched nothing but its target.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{StepDef, QUICK_STEP_BUDGET};

/// Every other container's ID and image unchanged since `snapshot`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyNeighbours {}

impl StepDef for VerifyNeighbours {
    const NAME: &'static str = "verify_neighbours";
    const DOC: &'static str = "every other container kept the id and image it had at `snapshot`";
    const FIELDS: &'static [&'static str] = &[];

    fn budget(&self) -> Duration {
        QUICK_STEP_BUDGET
    }

    type Evidence = VerifyNeighboursEvidence;

    fn summary(d: &VerifyNeighboursEvidence) -> Option<String> {
        d.checked.map(|n| format!("{n} neighbours unchanged"))
    }
}

/// A `verify_neighbours` step's evidence.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct VerifyNeighboursEvidence {
    /// Containers compared with the snapshot (every one but the target's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked: Option<usize>,
    /// The ones that changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed: Option<Vec<NeighbourChange>>,
}

/// A neighbouring container that is not what the snapshot recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NeighbourChange {
    /// Its name.
    pub container: String,
    /// At the snapshot.
    pub before: ContainerIdentity,
    /// Now; `null` when it is gone.
    pub after: Option<ContainerIdentity>,
}

/// What `verify_neighbours` compares of a container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerIdentity {
    /// The container ID.
    pub id: String,
    /// Its image.
    pub image: String,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::runbook::step::evidence_tests::same_json_and_summary;

    #[test]
    fn stored_verify_neighbours_evidence_reads_and_writes_back_the_same_json() {
        same_json_and_summary::<VerifyNeighbours>(&[
            (json!({}), None),
            (json!({"checked": 5}), Some("5 neighbours unchanged")),
            (
                json!({"checked": 5, "changed": [
                    {"container": "nginx", "before": {"id": "a1", "image": "nginx:1.27"},
                     "after": {"id": "b2", "image": "nginx:1.27"}},
                    {"container": "otel", "before": {"id": "c3", "image": "otel:1"}, "after": null}
                ]}),
                Some("5 neighbours unchanged"),
            ),
        ]);
    }
}
