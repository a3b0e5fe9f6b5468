//! The `plan` event of a dry run, and its names normalised to compose services.
//!
//! compose-manager builds the plan from compose's progress lines, so on a real host the names
//! look like `Container model-sg-glm53-w4afp8-tp4-r2` (a `container_name`), `Container
//! work-nginx-1` (`<project>-<service>-<n>`) or `Network work_default`. Tests and fakes send
//! bare names. Anything of an unknown shape is kept verbatim as a service, so the plan gate
//! sees it and refuses, rather than hiding it among the resources.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use crate::domain::plan_gate::DryRunPlan;

/// The four lists of a `plan` event, as sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RawPlan {
    pub(crate) create: Vec<String>,
    pub(crate) recreate: Vec<String>,
    pub(crate) remove: Vec<String>,
    pub(crate) unchanged: Vec<String>,
}

/// What one plan entry names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PlanName {
    /// A compose service (normalised from a container name when possible).
    Service(String),
    /// A network or volume, kept as `Network work_default`.
    Resource(String),
}

/// Reads the `plan` object of a `plan` event (keys in any order; a missing list is empty).
pub(crate) fn raw_plan_from_event(event: &Map<String, Value>) -> Result<(Value, RawPlan), String> {
    let plan = event
        .get("plan")
        .ok_or_else(|| "plan event without a `plan` object".to_owned())?;
    let Value::Object(map) = plan else {
        return Err("`plan` is not an object".to_owned());
    };
    let raw = RawPlan {
        create: list(map, "create")?,
        recreate: list(map, "recreate")?,
        remove: list(map, "remove")?,
        unchanged: list(map, "unchanged")?,
    };
    Ok((plan.clone(), raw))
}

fn list(map: &Map<String, Value>, key: &str) -> Result<Vec<String>, String> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                item.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| format!("`plan.{key}` has a non-string entry"))
            })
            .collect(),
        Some(_) => Err(format!("`plan.{key}` is not an array")),
    }
}

/// Classifies one plan entry; `None` for a blank one.
pub(crate) fn classify(entry: &str, project: &str) -> Option<PlanName> {
    let entry = entry.trim();
    if entry.is_empty() {
        return None;
    }
    let Some((kind, rest)) = entry.split_once(char::is_whitespace) else {
        return Some(PlanName::Service(container_to_service(entry, project)));
    };
    let name = rest.trim();
    let single = !name.contains(char::is_whitespace);
    Some(match kind {
        "Container" if single => PlanName::Service(container_to_service(name, project)),
        "Network" | "Volume" if single => PlanName::Resource(format!("{kind} {name}")),
        _ => PlanName::Service(entry.to_owned()),
    })
}

/// `work-nginx-1` → `nginx` when the project is `work`; other names unchanged.
fn container_to_service(name: &str, project: &str) -> String {
    if project.is_empty() {
        return name.to_owned();
    }
    let scoped = name
        .strip_prefix(project)
        .and_then(|rest| rest.strip_prefix('-'))
        .and_then(|rest| rest.rsplit_once('-'));
    match scoped {
        Some((service, n))
            if !service.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) =>
        {
            service.to_owned()
        }
        _ => name.to_owned(),
    }
}

/// Normalises a plan: services keep their strongest bucket (recreate > create > remove >
/// unchanged, compose-manager's own rule), networks and volumes go to `resources`; every list
/// is de-duplicated and sorted.
pub(crate) fn normalise_plan(raw: &RawPlan, project: &str) -> DryRunPlan {
    // Rank per bucket: 3 recreate, 2 create, 1 remove, 0 unchanged.
    let buckets: [(&Vec<String>, u8); 4] = [
        (&raw.recreate, 3),
        (&raw.create, 2),
        (&raw.remove, 1),
        (&raw.unchanged, 0),
    ];
    let mut services: BTreeMap<String, u8> = BTreeMap::new();
    let mut resources: BTreeSet<String> = BTreeSet::new();
    for (entries, rank) in buckets {
        for entry in entries {
            match classify(entry, project) {
                Some(PlanName::Service(name)) => {
                    let best = services.entry(name).or_insert(rank);
                    *best = (*best).max(rank);
                }
                Some(PlanName::Resource(name)) => {
                    resources.insert(name);
                }
                None => {}
            }
        }
    }
    let mut plan = DryRunPlan {
        resources: resources.into_iter().collect(),
        ..DryRunPlan::default()
    };
    for (name, rank) in services {
        match rank {
            3 => plan.recreate.push(name),
            2 => plan.create.push(name),
            1 => plan.remove.push(name),
            _ => plan.unchanged.push(name),
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn plan_entries_are_normalised_to_service_names() {
        use PlanName::{Resource, Service};
        let s = |x: &str| Some(Service(x.to_owned()));
        let r = |x: &str| Some(Resource(x.to_owned()));
        let cases: &[(&str, Option<PlanName>)] = &[
            (
                "Container model-sg-glm53-w4afp8-tp4-r2",
                s("model-sg-glm53-w4afp8-tp4-r2"),
            ),
            (
                "model-sg-glm53-w4afp8-tp4-r2",
                s("model-sg-glm53-w4afp8-tp4-r2"),
            ),
            ("work-nginx-1", s("nginx")),
            ("Container work-model-downloader-1", s("model-downloader")),
            ("Container  work-nginx-12 ", s("nginx")),
            ("glm-vllm-1", s("glm-vllm-1")),
            ("work-nginx", s("work-nginx")),
            ("work-nginx-x1", s("work-nginx-x1")),
            ("other-nginx-1", s("other-nginx-1")),
            ("Network work_default", r("Network work_default")),
            ("Volume huggingface_cache", r("Volume huggingface_cache")),
            ("Image nginx:1", s("Image nginx:1")),
            ("Container a b", s("Container a b")),
            ("   ", None),
        ];
        for (entry, want) in cases {
            assert_eq!(&classify(entry, "work"), want, "{entry:?}");
        }
    }

    #[test]
    fn a_plan_is_deduped_sorted_and_networks_are_not_services() {
        let raw = RawPlan {
            create: vec![
                "Container work-model-downloader-1".into(),
                "Network work_default".into(),
            ],
            recreate: vec![
                "Container model-sg-glm53-w4afp8-tp4-r2".into(),
                "model-sg-glm53-w4afp8-tp4-r2".into(),
            ],
            remove: vec!["Network work_default".into()],
            unchanged: vec![
                "work-nginx-1".into(),
                "Container model-sg-glm53-w4afp8-tp4-r1".into(),
                "model-sg-glm53-w4afp8-tp4-r2".into(),
            ],
        };
        let plan = normalise_plan(&raw, "work");
        assert_eq!(
            plan,
            DryRunPlan {
                create: vec!["model-downloader".into()],
                recreate: vec!["model-sg-glm53-w4afp8-tp4-r2".into()],
                remove: vec![],
                unchanged: vec!["model-sg-glm53-w4afp8-tp4-r1".into(), "nginx".into()],
                resources: vec!["Network work_default".into()],
            }
        );
    }

    #[test]
    fn plan_event_keys_in_any_order_and_missing_lists_are_empty() {
        let event = json!({"success": true, "plan": {"unchanged": ["b"], "create": ["a"]},
                           "exit_code": null, "event": "plan"});
        let map = event.as_object().expect("object");
        let (raw_value, raw) = raw_plan_from_event(map).expect("parses");
        assert_eq!(raw.create, vec!["a".to_owned()]);
        assert!(raw.recreate.is_empty() && raw.remove.is_empty());
        assert_eq!(raw_value["unchanged"], json!(["b"]));
        let bad = json!({"event": "plan", "plan": {"create": [1]}});
        assert!(raw_plan_from_event(bad.as_object().expect("object")).is_err());
        let missing = json!({"event": "plan"});
        assert!(raw_plan_from_event(missing.as_object().expect("object")).is_err());
    }
}
