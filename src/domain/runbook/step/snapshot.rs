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

    type Evidence = serde_json::Value;

    fn summary(detail: &serde_json::Value) -> Option<String> {
        detail["ps"]
            .as_array()
            .map(|ps| format!("{} containers recorded", ps.len()))
    }
}
