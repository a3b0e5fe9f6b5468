//! `peers_healthy`: someone carries the traffic while the target is out (safety rule 7).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Checked, defaults, shown, positive_duration, StepDef};
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

    type Evidence = serde_json::Value;

    fn summary(detail: &serde_json::Value) -> Option<String> {
        shown(&detail["peers"]).map(|p| format!("peers healthy: {p}"))
    }
}

fn timeout() -> Duration {
    defaults::PEERS_HEALTHY_TIMEOUT
}
