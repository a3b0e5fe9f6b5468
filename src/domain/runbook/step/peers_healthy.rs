//! `peers_healthy`: someone carries the traffic while the target is out (safety rule 7).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Checked, defaults, positive_duration, StepDef};
use crate::domain::duration::serde_duration;

/// Every peer's `/health` answers 200.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeersHealthy {
    /// How long to wait for all peers.
    #[serde(with = "serde_duration", default = "timeout")]
    pub timeout: Duration,
}

impl StepDef for PeersHealthy {
    const NAME: &'static str = "peers_healthy";
    const DOC: &'static str = "every peer answers `/health` with 200";
    const FIELDS: &'static [&'static str] = &["timeout"];

    fn check(&self) -> Checked {
        positive_duration("timeout", self.timeout)
    }

    fn budget(&self) -> Duration {
        self.timeout
    }

    type Evidence = PeersHealthyEvidence;

    fn summary(d: &PeersHealthyEvidence) -> Option<String> {
        let peers = d.peers.as_ref()?;
        Some(format!("peers healthy: {}", peers.join(", ")))
    }
}

/// A `peers_healthy` step's evidence.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PeersHealthyEvidence {
    /// The target's peers (the other replicas of its group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peers: Option<Vec<String>>,
    /// The peers not healthy at the last look, with their `/health` sample as the prober read
    /// it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy: Option<BTreeMap<String, serde_json::Value>>,
}

fn timeout() -> Duration {
    defaults::PEERS_HEALTHY_TIMEOUT
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::runbook::step::evidence_tests::same_json_and_summary;

    #[test]
    fn stored_peers_healthy_evidence_reads_and_writes_back_the_same_json() {
        same_json_and_summary::<PeersHealthy>(&[
            (json!({}), None),
            (json!({"peers": ["r1", "r3"]}), Some("peers healthy: r1, r3")),
            (json!({"peers": []}), Some("peers healthy: ")),
            (
                json!({"peers": ["r1"], "unhealthy": {"r1": {"error": null, "status": 503}}}),
                Some("peers healthy: r1"),
            ),
            (json!({"unhealthy": {"r1": {"error": "refused", "status": null}}}), None),
        ]);
    }
}
