//! `snapshot`: the host as it was before the rollout touched it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{StepDef, QUICK_STEP_BUDGET};

/// Record `GET /docker/ps` and `GET /version` of the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {}

impl StepDef for Snapshot {
    const NAME: &'static str = "snapshot";
    const DOC: &'static str = "records the host's `GET /docker/ps` and `GET /version`";
    const FIELDS: &'static [&'static str] = &[];

    fn budget(&self) -> Duration {
        QUICK_STEP_BUDGET
    }

    type Evidence = SnapshotEvidence;

    fn summary(d: &SnapshotEvidence) -> Option<String> {
        d.ps.as_ref()
            .map(|ps| format!("{} containers recorded", ps.len()))
    }
}

/// A `snapshot` step's evidence: the host's `GET /docker/ps` and `GET /version` answers.
/// `C` is how a container is read: the compose client's entry in the engine (which compares
/// with it in `verify_neighbours`), any JSON here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotEvidence<C = serde_json::Value> {
    /// `docker ps`, as the host answered it.
    #[serde(default = "Option::default", skip_serializing_if = "Option::is_none")]
    pub ps: Option<Vec<C>>,
    /// `GET /version`, as the host answered it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<serde_json::Value>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::runbook::step::evidence_tests::same_json_and_summary;

    #[test]
    fn stored_snapshot_evidence_reads_and_writes_back_the_same_json() {
        let ps = json!([
            {"id": "f583198cc30f", "image": "nginx:1.27", "labels": "com.docker.compose.service=nginx",
             "names": "nginx", "state": "running", "status": "Up About an hour"},
            {"id": "58b10b2eacfd", "image": "lmsysorg/sglang:glm53-v450", "labels": "",
             "names": "model-sg-glm53-w4afp8-tp4-r1", "state": "running", "status": "Up 2 days"}
        ]);
        let version = json!({"commit": "dd2be99", "file": "prod/glm.yaml", "tag": "v0.0.450",
            "projects": {"work": {"current": {"tag": "v0.0.450", "file": "prod/glm.yaml"}, "previous": null}}});
        same_json_and_summary::<Snapshot>(&[
            (json!({}), None),
            (json!({"ps": ps}), Some("2 containers recorded")),
            (json!({"ps": ps, "version": version}), Some("2 containers recorded")),
            (json!({"ps": []}), Some("0 containers recorded")),
        ]);
    }
}
