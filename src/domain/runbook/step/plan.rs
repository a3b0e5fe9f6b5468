//! `plan`: the dry-run gate before any real `up` (safety rule 4).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Checked, positive_duration, shown, Scope, StepDef, QUICK_STEP_BUDGET};
use crate::domain::duration::serde_duration;

/// `compose/up` dry run, then the plan gate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// Services tolerated besides the target (e.g. `model-downloader`).
    #[serde(default)]
    pub allow: Vec<String>,
    /// The target, or the companion services of the `up` it gates (the same `services`,
    /// `only_out_of_date` and `force_recreate`, so the dry run sees the up's payload).
    #[serde(flatten)]
    pub scope: Scope,
    /// The step's deadline (default 5m): its 409 retries and, in a rollback of a rollout
    /// whose compose call had an unknown outcome, the wait for the host to settle before the
    /// first call (`host_unsettled` after it).
    #[serde(with = "serde_duration", default = "quick_budget")]
    pub timeout: Duration,
}

fn quick_budget() -> Duration {
    QUICK_STEP_BUDGET
}

impl StepDef for Plan {
    const NAME: &'static str = "plan";
    const DOC: &'static str = "the capability probe, then a `compose/up` dry run and the plan gate";
    const FIELDS: &'static [&'static str] =
        &["allow", "services", "only_out_of_date", "force_recreate", "timeout"];

    fn check(&self) -> Checked {
        if self.allow.iter().any(|a| a.trim().is_empty()) {
            let message = "`allow` entries must be service names, not empty";
            return Err(("allow", message.to_string()));
        }
        self.scope.check()?;
        positive_duration("timeout", self.timeout)
    }

    fn budget(&self) -> Duration {
        self.timeout
    }

    type Evidence = serde_json::Value;

    fn summary(detail: &serde_json::Value) -> Option<String> {
        let p = &detail["plan"];
        Some(format!(
            "plan create=[{}] recreate=[{}] remove=[{}]",
            shown(&p["create"])?,
            shown(&p["recreate"])?,
            shown(&p["remove"])?
        ))
    }
}
