//! `plan`: the dry-run gate before any real `up` (safety rule 4).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Checked, positive_duration, Scope, StepDef, QUICK_STEP_BUDGET};
use crate::domain::duration::serde_duration;
use super::call::CallFailure;
use crate::domain::names::ServiceName;
use crate::domain::plan_gate::DryRunPlan;

/// `compose/up` dry run, then the plan gate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// Services tolerated besides the target (e.g. `model-downloader`).
    #[serde(default)]
    pub allow: Vec<ServiceName>,
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
        self.scope.check()?;
        positive_duration("timeout", self.timeout)
    }

    fn budget(&self) -> Duration {
        self.timeout
    }

    type Evidence = PlanEvidence;

    fn summary(evidence: &PlanEvidence) -> Option<String> {
        let p = evidence.plan.as_ref()?.as_ref()?;
        Some(format!(
            "plan create=[{}] recreate=[{}] remove=[{}]",
            p.create.join(", "),
            p.recreate.join(", "),
            p.remove.join(", ")
        ))
    }
}

/// A dry run's plan as the evidence keeps it (a key missing from stored evidence reads as
/// empty).
pub type PlannedChanges = DryRunPlan;

/// A `plan` step's evidence: the dry run's plan and the gate's verdict, and what a call that
/// did not end with a plain answer adds ([`CallFailure`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PlanEvidence {
    /// The dry run's plan; `null` when it answered without one.
    #[serde(
        default,
        deserialize_with = "super::present",
        skip_serializing_if = "Option::is_none"
    )]
    pub plan: Option<Option<PlannedChanges>>,
    /// The services the step tolerates besides the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<ServiceName>>,
    /// A companion gate's services.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<Vec<ServiceName>>,
    /// What a companion gate lets its `up` apply (what a reconcile applies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apply: Option<Vec<ServiceName>>,
    /// Why the gate refused the plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub violation: Option<String>,
    /// The dry run's last output lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<Vec<String>>,
    /// `404` when compose-manager does not support dry runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<String>,
    /// The error code of a dry-run support probe that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_error: Option<String>,
    /// How a call that did not end with a plain answer went.
    #[serde(flatten)]
    pub failure: CallFailure,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::runbook::step::evidence_tests::same_json_and_summary;

    #[test]
    fn stored_plan_evidence_reads_and_writes_back_the_same_json() {
        let plan = |create: &[&str], recreate: &[&str], remove: &[&str]| {
            json!({"create": create, "recreate": recreate, "remove": remove, "resources": [], "unchanged": ["nginx"]})
        };
        let tail = json!(["stderr:  DRY-RUN MODE -  Container r2 Recreate"]);
        same_json_and_summary::<Plan>(&[
            (json!({}), None),
            (
                json!({"allow": ["model-downloader"], "plan": plan(&["model-downloader"], &["r2"], &[]), "tail": tail}),
                Some("plan create=[model-downloader] recreate=[r2] remove=[]"),
            ),
            (
                json!({"allow": [], "plan": plan(&[], &["r2", "proxy"], &["otel"]), "tail": tail,
                       "violation": "dry-run plan refused: removals"}),
                Some("plan create=[] recreate=[r2, proxy] remove=[otel]"),
            ),
            (
                json!({"allow": [], "apply": ["proxy"], "plan": plan(&[], &["proxy"], &[]),
                       "services": ["nginx", "proxy"], "tail": tail}),
                Some("plan create=[] recreate=[proxy] remove=[]"),
            ),
            (json!({"plan": null, "tail": tail}), None),
            (json!({"tail": tail}), None),
            (json!({"probe": "404"}), None),
            (json!({"probe_error": "compose_unreachable"}), None),
            (json!({"last_error": "compose-manager host is busy"}), None),
            (json!({"call": {"error": "cut"}, "host_idle": true, "waited_ms": 5}), None),
            (json!({"settle": {"host_idle": false, "ps_reads": 0, "settled": false, "target_changes": 0}}), None),
        ]);
    }
}
