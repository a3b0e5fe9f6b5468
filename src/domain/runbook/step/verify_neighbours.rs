//! `verify_neighbours`: the rollout touched nothing but its target.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{shown, StepDef, QUICK_STEP_BUDGET};

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

    type Evidence = serde_json::Value;

    fn summary(detail: &serde_json::Value) -> Option<String> {
        shown(&detail["checked"]).map(|n| format!("{n} neighbours unchanged"))
    }
}
