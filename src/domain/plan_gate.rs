//! The dry-run plan and the gate that decides whether a real `compose/up` may follow.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::domain::error_code::ErrorCode;
use crate::domain::names::ServiceName;

/// What a `compose/up` dry run says it would do, with names normalised to compose services
/// (a key missing from stored evidence reads as empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DryRunPlan {
    /// Services the up would create (no container yet).
    pub create: Vec<String>,
    /// Services the up would recreate (definition changed).
    pub recreate: Vec<String>,
    /// Containers the up would remove (`--remove-orphans`).
    pub remove: Vec<String>,
    /// Services the plan mentions as running and unchanged.
    pub unchanged: Vec<String>,
    /// Networks and volumes the plan mentions (`Network work_default`): not services.
    pub resources: Vec<String>,
}

/// Why a dry-run plan does not allow the real `compose/up`.
///
/// The gate is strict on purpose (docs/safety.md#rules-a-runbook-must-keep): the real `up` is only
/// sent when the dry run changes exactly the target, removes nothing, and touches no other service
/// except those a runbook step explicitly `allow`s.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateViolation {
    /// The target is not among the services the plan creates or recreates: it is already at
    /// that configuration (a canary that changes nothing is a mistake) or the plan is about
    /// something else. Reported as `target_not_planned`.
    pub missing_target: bool,
    /// Services other than the target the plan would recreate, or create without being in
    /// `allow`.
    pub extra: Vec<String>,
    /// Services or containers the plan would remove (orphan removal); never allowed.
    pub removals: Vec<String>,
    /// A companion step's services the plan would neither create nor recreate (the gate of a
    /// companion step without `only_out_of_date` wants exactly its list). Reported as
    /// `services_not_planned`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
}

impl GateViolation {
    /// The stable error code of a failed gate.
    pub fn code(&self) -> ErrorCode {
        ErrorCode::PlanGateFailed
    }

    /// One stable snake_case reason per problem found: `target_not_planned`,
    /// `extra_services`, `removals`.
    pub fn reasons(&self) -> Vec<&'static str> {
        let mut reasons = Vec::new();
        if self.missing_target {
            reasons.push("target_not_planned");
        }
        if !self.extra.is_empty() {
            reasons.push("extra_services");
        }
        if !self.removals.is_empty() {
            reasons.push("removals");
        }
        if !self.missing.is_empty() {
            reasons.push("services_not_planned");
        }
        reasons
    }
}

impl std::fmt::Display for GateViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if self.missing_target {
            parts.push(
                "target_not_planned: the dry run would neither create nor recreate the target"
                    .to_string(),
            );
        }
        if !self.extra.is_empty() {
            parts.push(format!(
                "extra_services: it would also create or recreate {} (`allow` excuses only a \
                 one-shot dependency planned as create)",
                quote_list(&self.extra)
            ));
        }
        if !self.removals.is_empty() {
            parts.push(format!(
                "removals: it would remove {}",
                quote_list(&self.removals)
            ));
        }
        if !self.missing.is_empty() {
            parts.push(format!(
                "services_not_planned: it would neither create nor recreate {}",
                quote_list(&self.missing)
            ));
        }
        write!(f, "dry-run plan refused: {}", parts.join("; "))
    }
}

impl std::error::Error for GateViolation {}

fn quote_list(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Passes only when create ∪ recreate is exactly `{target}` plus allowed one-shot
/// dependencies, and `remove` is empty. compose-manager never passes `--no-deps`, so a scoped
/// dry run also plans the target's `depends_on` one-shots (the exited `model-downloader`
/// shows as `create`): `allow` tolerates those names in `create` only, never in `recreate`
/// (a changed dependency would really be recreated) and never in `remove`. `unchanged` and
/// `resources` are ignored. The target counts as planned even if a runbook also lists it in
/// `allow`.
pub fn check(plan: &DryRunPlan, target: &str, allow: &[ServiceName]) -> Result<(), GateViolation> {
    check_rename(plan, target, None, allow)
}

/// [`check`] for a rollout that renames its replica (docs/reference.md#renamed-replicas):
/// the new file no longer defines the former service `replaced`, so while it runs compose
/// plans it as an orphan to remove. That one removal is accepted (the `down` of the former
/// service comes first, so the real `up` never removes it); any other is not. After the down,
/// the same gate wants exactly the target created.
pub fn check_rename(
    plan: &DryRunPlan,
    target: &str,
    replaced: Option<&str>,
    allow: &[ServiceName],
) -> Result<(), GateViolation> {
    let (changed, extra) = changed_and_extra(plan, |name| name == target, allow);
    let mut removals = sorted_removals(plan);
    removals.retain(|name| Some(name.as_str()) != replaced);
    let violation = GateViolation {
        missing_target: !changed.contains(target),
        extra: extra.iter().map(|name| name.to_string()).collect(),
        removals,
        missing: Vec::new(),
    };
    if violation.reasons().is_empty() {
        Ok(())
    } else {
        Err(violation)
    }
}

/// What the plan creates or recreates, and what of it is not `planned`: a name outside
/// `planned` is excused only as an `allow`ed one-shot in `create`, never in `recreate`.
fn changed_and_extra<'p>(
    plan: &'p DryRunPlan,
    planned: impl Fn(&str) -> bool,
    allow: &[ServiceName],
) -> (BTreeSet<&'p str>, BTreeSet<&'p str>) {
    let allowed = |name: &str| allow.iter().any(|a| a == name);
    let changed = plan
        .create
        .iter()
        .chain(&plan.recreate)
        .map(String::as_str)
        .collect();
    let extra = plan
        .create
        .iter()
        .map(String::as_str)
        .filter(|name| !planned(name) && !allowed(name))
        .chain(
            plan.recreate
                .iter()
                .map(String::as_str)
                .filter(|name| !planned(name)),
        )
        .collect();
    (changed, extra)
}

fn sorted_removals(plan: &DryRunPlan) -> Vec<String> {
    let mut removals = plan.remove.clone();
    removals.sort();
    removals.dedup();
    removals
}

/// The gate of a companion step (docs/reference.md#companion-services): create ∪ recreate may hold only the step's
/// `services` (plus `allow`ed one-shots as create), nothing is removed, and every listed
/// service is planned. With `only_out_of_date` (the reconcile) a subset is accepted: the
/// answer is what the `up` applies, in the step's order, and an empty answer means nothing
/// is out of date (the `up` is skipped).
pub fn check_companions(
    plan: &DryRunPlan,
    services: &[ServiceName],
    allow: &[ServiceName],
    only_out_of_date: bool,
) -> Result<Vec<ServiceName>, GateViolation> {
    let listed = |name: &str| services.iter().any(|s| s == name);
    let (changed, extra) = changed_and_extra(plan, listed, allow);
    let missing = if only_out_of_date {
        Vec::new()
    } else {
        services
            .iter()
            .filter(|s| !changed.contains(s.as_str()))
            .map(|s| s.to_string())
            .collect()
    };
    let violation = GateViolation {
        missing_target: false,
        extra: extra.iter().map(|name| name.to_string()).collect(),
        removals: sorted_removals(plan),
        missing,
    };
    if !violation.reasons().is_empty() {
        return Err(violation);
    }
    Ok(services
        .iter()
        .filter(|s| changed.contains(s.as_str()))
        .cloned()
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const R2: &str = "model-sg-glm53-w4afp8-tp4-r2";

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn services(list: &[&str]) -> Vec<ServiceName> {
        list.iter()
            .map(|s| ServiceName::parse(*s).expect("a service name"))
            .collect()
    }

    fn plan(create: &[&str], recreate: &[&str], remove: &[&str], unchanged: &[&str]) -> DryRunPlan {
        DryRunPlan {
            create: names(create),
            recreate: names(recreate),
            remove: names(remove),
            unchanged: names(unchanged),
            resources: names(&["Network work_default"]),
        }
    }

    #[test]
    fn a_rename_gate_accepts_the_former_service_as_the_one_removal_and_nothing_else() {
        const OLD: &str = "model-sg-glm53-fp8-tp4-r2";
        let dl = services(&["model-downloader"]);
        // (case, plan, replaced, expected reasons)
        let cases: Vec<(&str, DryRunPlan, Option<&str>, Vec<&str>)> = vec![
            (
                "before the down: create new, remove old",
                plan(&["model-downloader", R2], &[], &[OLD], &[]),
                Some(OLD),
                vec![],
            ),
            (
                "after the down: exactly create new",
                plan(&["model-downloader", R2], &[], &[], &[]),
                Some(OLD),
                vec![],
            ),
            (
                "without replaces the orphan is refused",
                plan(&[R2], &[], &[OLD], &[]),
                None,
                vec!["removals"],
            ),
            (
                "another removal is refused",
                plan(&[R2], &[], &[OLD, "nginx"], &[]),
                Some(OLD),
                vec!["removals"],
            ),
            (
                "the former service recreated is refused",
                plan(&[R2], &[OLD], &[], &[]),
                Some(OLD),
                vec!["extra_services"],
            ),
            (
                "the target not planned",
                plan(&[], &[], &[OLD], &[R2]),
                Some(OLD),
                vec!["target_not_planned"],
            ),
        ];
        for (case, p, replaced, want) in cases {
            let got = check_rename(&p, R2, replaced, &dl)
                .err()
                .map(|e| e.reasons())
                .unwrap_or_default();
            assert_eq!(got, want, "{case}");
        }
        let err = check_rename(&plan(&[R2], &[], &[OLD, "nginx"], &[]), R2, Some(OLD), &dl)
            .expect_err("refused");
        assert_eq!(
            err.removals,
            names(&["nginx"]),
            "only the other removal is reported"
        );
    }

    #[test]
    fn the_companion_gate_wants_exactly_its_list_or_a_subset_when_reconciling() {
        let infra = services(&["nginx", "proxy-glm53", "otelcol-contrib"]);
        // Exactly the list: passes, applies the list.
        let all = plan(&[], &["nginx", "proxy-glm53", "otelcol-contrib"], &[], &[]);
        assert_eq!(
            check_companions(&all, &infra, &[], false),
            Ok(infra.clone())
        );
        // A subset without only_out_of_date: the rest is reported missing.
        let some = plan(&[], &["proxy-glm53"], &[], &["nginx", "otelcol-contrib"]);
        let err = check_companions(&some, &infra, &[], false).expect_err("missing");
        assert_eq!(err.reasons(), ["services_not_planned"]);
        assert_eq!(err.missing, names(&["nginx", "otelcol-contrib"]));
        assert!(
            err.to_string().contains("`nginx`, `otelcol-contrib`"),
            "{err}"
        );
        // The reconcile applies only what is out of date, and nothing when nothing is.
        assert_eq!(
            check_companions(&some, &infra, &[], true),
            Ok(services(&["proxy-glm53"]))
        );
        let none = plan(&[], &[], &[], &["nginx", "proxy-glm53", "otelcol-contrib"]);
        assert_eq!(check_companions(&none, &infra, &[], true), Ok(vec![]));
        // A replica (or anything else) planned besides the list, or a removal: refused.
        let replica = plan(&[], &["proxy-glm53", R2], &[], &[]);
        let err = check_companions(&replica, &infra, &[], true).expect_err("extra");
        assert_eq!(err.extra, names(&[R2]));
        let orphan = plan(&[], &["proxy-glm53"], &["old-r2"], &[]);
        let err = check_companions(&orphan, &infra, &[], true).expect_err("removal");
        assert_eq!(err.reasons(), ["removals"]);
        // An allowed one-shot may be created, never recreated.
        let dl = plan(&["model-downloader"], &["proxy-glm53"], &[], &[]);
        let proxy = services(&["proxy-glm53"]);
        assert!(check_companions(&dl, &proxy, &services(&["model-downloader"]), false).is_ok());
        assert!(check_companions(&dl, &proxy, &[], false).is_err());
    }

    #[test]
    fn the_gate_passes_only_a_plan_that_changes_exactly_the_target() {
        // (case, plan, allow, expected reasons, words the message must contain)
        type Case = (
            &'static str,
            DryRunPlan,
            Vec<String>,
            Vec<&'static str>,
            Vec<&'static str>,
        );
        let cases: Vec<Case> = vec![
            (
                "recreate of the target alone",
                plan(&[], &[R2], &[], &["nginx"]),
                vec![],
                vec![],
                vec![],
            ),
            (
                "create of the target after a down",
                plan(&[R2], &[], &[], &[]),
                vec![],
                vec![],
                vec![],
            ),
            (
                "target listed twice",
                plan(&[R2], &[R2], &[], &[]),
                vec![],
                vec![],
                vec![],
            ),
            (
                "an allowed downloader rerun",
                plan(&["model-downloader"], &[R2], &[], &[]),
                names(&["model-downloader"]),
                vec![],
                vec![],
            ),
            (
                "an allowed downloader whose config changed is recreated: refused",
                plan(&[], &[R2, "model-downloader"], &[], &[]),
                names(&["model-downloader"]),
                vec!["extra_services"],
                vec![
                    "`model-downloader`",
                    "only a one-shot dependency planned as create",
                ],
            ),
            (
                "the real server's plan after a down: downloader and target both create",
                plan(&["model-downloader", R2], &[], &[], &[]),
                names(&["model-downloader"]),
                vec![],
                vec![],
            ),
            (
                "an allowed downloader alone, the target unchanged",
                plan(&["model-downloader"], &[], &[], &[R2]),
                names(&["model-downloader"]),
                vec!["target_not_planned"],
                vec!["neither create nor recreate the target"],
            ),
            (
                "the target already at this config",
                plan(&[], &[], &[], &[R2, "nginx"]),
                vec![],
                vec!["target_not_planned"],
                vec!["neither create nor recreate the target"],
            ),
            (
                "a downloader rerun that is not allowed",
                plan(&["model-downloader"], &[R2], &[], &[]),
                vec![],
                vec!["extra_services"],
                vec!["`model-downloader`"],
            ),
            (
                "the peer recreated too",
                plan(&[], &[R2, "model-sg-glm53-w4afp8-tp4-r1"], &[], &[]),
                vec![],
                vec!["extra_services"],
                vec!["`model-sg-glm53-w4afp8-tp4-r1`"],
            ),
            (
                "an orphan removal even if allowed",
                plan(&[], &[R2], &["model-sg-glm53-fp8-tp4-r2"], &[]),
                names(&["model-sg-glm53-fp8-tp4-r2"]),
                vec!["removals"],
                vec!["would remove `model-sg-glm53-fp8-tp4-r2`"],
            ),
            (
                "everything wrong at once",
                plan(&["proxy-glm53"], &["nginx"], &["old"], &[R2]),
                vec![],
                vec!["target_not_planned", "extra_services", "removals"],
                vec!["`nginx`, `proxy-glm53`", "`old`", "target_not_planned"],
            ),
            (
                "an empty plan",
                plan(&[], &[], &[], &[]),
                vec![],
                vec!["target_not_planned"],
                vec![],
            ),
        ];
        for (case, plan, allow, reasons, words) in cases {
            let allow: Vec<&str> = allow.iter().map(String::as_str).collect();
            match check(&plan, R2, &services(&allow)) {
                Ok(()) => assert!(reasons.is_empty(), "{case}: passed, expected {reasons:?}"),
                Err(v) => {
                    assert_eq!(v.reasons(), reasons, "{case}");
                    assert_eq!(v.code(), "plan_gate_failed");
                    let message = v.to_string();
                    for word in words {
                        assert!(message.contains(word), "{case}: {message}");
                    }
                }
            }
        }
    }
}
