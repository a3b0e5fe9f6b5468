//! What `docker compose up -d --remove-orphans [services]` would do, as pure functions: the
//! scope, the per-container changes, compose's progress lines, and compose-manager's plan
//! parser (docs/compose-manager.md) that turns those lines into the `plan` event.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::compose_file::{interpolate, ComposeFile, ServiceDef};
use super::state::sha256_hex;

/// The configuration compose would give a service's container at a tag with an env map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Desired {
    pub container: String,
    pub image: String,
    pub env: BTreeMap<String, String>,
    pub command: String,
    /// Changes whenever any of the above does (compose's config hash).
    pub fingerprint: String,
}

/// A container that exists now, as far as planning cares.
#[derive(Debug, Clone)]
pub(crate) struct Existing {
    pub container: String,
    pub fingerprint: String,
    pub running: bool,
}

/// What happens to one container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// No container yet: `Creating`, `Created`, then started.
    Create,
    /// Config changed: `Recreate`, `Recreated`, then started (new id).
    Recreate,
    /// Running with the same config: `Running`.
    Keep,
    /// Exited with the same config (a finished one-shot): started again, same id.
    Start,
    /// Its service is not in the file: removed by `--remove-orphans`.
    RemoveOrphan,
}

/// One planned change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Step {
    pub service: String,
    pub container: String,
    pub change: Change,
}

/// The effective config of `def`: the tag's image pin or the file's image, and the
/// environment and command interpolated with the request's env.
pub(crate) fn desired(
    def: &ServiceDef,
    image_pin: Option<&String>,
    env: &BTreeMap<String, String>,
) -> Desired {
    let image = match image_pin {
        Some(pin) => pin.clone(),
        None => interpolate(def.image.as_deref().unwrap_or_default(), env),
    };
    let env_map = def.interpolated_environment(env);
    let command = interpolate(def.command.as_deref().unwrap_or_default(), env);
    let mut canonical = format!("image={image}\ncommand={command}\n");
    for (k, v) in &env_map {
        canonical.push_str(&format!("env {k}={v}\n"));
    }
    Desired {
        container: def.container().to_string(),
        image,
        env: env_map,
        command,
        fingerprint: sha256_hex(canonical.as_bytes()),
    }
}

/// The services an up touches, dependencies first: every default service for `[]`, else the
/// named ones plus their `depends_on` closure (there is no `--no-deps`). An unknown name is
/// compose's `no such service: <name>`.
pub(crate) fn scope(file: &ComposeFile, services: &[String]) -> Result<Vec<String>, String> {
    if let Some(unknown) = services.iter().find(|s| !file.services.contains_key(*s)) {
        return Err(format!("no such service: {unknown}"));
    }
    let set: BTreeSet<String> = if services.is_empty() {
        file.default_services()
            .into_iter()
            .map(str::to_string)
            .collect()
    } else {
        file.dependency_closure(services)
    };
    let mut order = Vec::new();
    let mut done = BTreeSet::new();
    for name in &set {
        visit(file, name, &mut done, &mut order, 0);
    }
    Ok(order)
}

fn visit(
    file: &ComposeFile,
    name: &str,
    done: &mut BTreeSet<String>,
    order: &mut Vec<String>,
    depth: usize,
) {
    if depth > file.services.len() || !done.insert(name.to_string()) {
        return;
    }
    if let Some(def) = file.services.get(name) {
        let mut deps = def.depends_on.clone();
        deps.sort();
        for dep in &deps {
            visit(file, dep, done, order, depth + 1);
        }
    }
    order.push(name.to_string());
}

/// The changes of an up: orphans first, then each service in scope order.
pub(crate) fn plan(
    file: &ComposeFile,
    order: &[String],
    desired: &BTreeMap<String, Desired>,
    existing: &BTreeMap<String, Existing>,
    force_recreate: bool,
) -> Vec<Step> {
    let mut steps: Vec<Step> = existing
        .iter()
        .filter(|(service, _)| !file.services.contains_key(*service))
        .map(|(service, e)| Step {
            service: service.clone(),
            container: e.container.clone(),
            change: Change::RemoveOrphan,
        })
        .collect();
    for service in order {
        let Some(want) = desired.get(service) else {
            continue;
        };
        let change = match existing.get(service) {
            None => Change::Create,
            Some(e) if force_recreate || e.fingerprint != want.fingerprint => Change::Recreate,
            Some(e) if e.running => Change::Keep,
            Some(_) => Change::Start,
        };
        steps.push(Step {
            service: service.clone(),
            container: want.container.clone(),
            change,
        });
    }
    steps
}

/// compose's plain progress lines for `steps`; with `dry`, each carries the
/// ` DRY-RUN MODE - ` prefix. `one_shot` tells which services run to completion (the
/// downloader), which an up waits for.
pub(crate) fn up_lines(steps: &[Step], one_shot: &dyn Fn(&str) -> bool, dry: bool) -> Vec<String> {
    let prefix = if dry { " DRY-RUN MODE - " } else { "" };
    let line = |name: &str, verb: &str| format!("{prefix} Container {name}  {verb}");
    let mut out = Vec::new();
    for s in steps.iter().filter(|s| s.change == Change::RemoveOrphan) {
        for verb in ["Stopping", "Stopped", "Removing", "Removed"] {
            out.push(line(&s.container, verb));
        }
    }
    for s in steps {
        let verbs: &[&str] = match s.change {
            Change::Create => &["Creating", "Created"],
            Change::Recreate => &["Recreate", "Recreated"],
            Change::Keep => &["Running"],
            // An exited one-shot with an unchanged config: compose still reports it as
            // `Created`, so compose-manager's plan lists it under `create`.
            Change::Start => &["Created"],
            Change::RemoveOrphan => &[],
        };
        out.extend(verbs.iter().map(|v| line(&s.container, v)));
    }
    for s in steps {
        if matches!(s.change, Change::Keep | Change::RemoveOrphan) {
            continue;
        }
        out.push(line(&s.container, "Starting"));
        out.push(line(&s.container, "Started"));
        if !dry && one_shot(&s.service) {
            out.push(line(&s.container, "Waiting"));
            out.push(line(&s.container, "Exited"));
        }
    }
    out
}

/// The `plan` object: four sorted, de-duplicated name lists, keys in alphabetical order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct PlanBody {
    pub create: Vec<String>,
    pub recreate: Vec<String>,
    pub remove: Vec<String>,
    pub unchanged: Vec<String>,
}

/// compose-manager's advisory plan parser (docs/compose-manager.md): keep the text after `DRY-RUN MODE -`,
/// split at the last whitespace into name and verb, bucket the verb, and keep each name's
/// strongest verb (recreate > create > remove > unchanged).
pub(crate) fn parse_plan(lines: &[String]) -> PlanBody {
    let mut best: BTreeMap<String, u8> = BTreeMap::new();
    for raw in lines {
        let text = match raw.find("DRY-RUN MODE -") {
            Some(i) => &raw[i + "DRY-RUN MODE -".len()..],
            None => raw.as_str(),
        }
        .trim();
        let Some((name, verb)) = text.rsplit_once(char::is_whitespace) else {
            continue;
        };
        let rank = match verb {
            "Recreate" | "Recreated" => 3,
            "Creating" | "Created" => 2,
            "Removing" | "Removed" => 1,
            "Running" | "Started" | "Skipped" => 0,
            _ => continue,
        };
        let name = name.trim();
        if name.is_empty() {
            continue;
        }
        let slot = best.entry(name.to_string()).or_insert(rank);
        *slot = (*slot).max(rank);
    }
    let mut plan = PlanBody::default();
    for (name, rank) in best {
        match rank {
            3 => plan.recreate.push(name),
            2 => plan.create.push(name),
            1 => plan.remove.push(name),
            _ => plan.unchanged.push(name),
        }
    }
    plan
}

/// compose's warnings for `${VAR}` references (no default) that the env map leaves unset.
pub(crate) fn unset_variable_warnings(text: &str, env: &BTreeMap<String, String>) -> Vec<String> {
    let mut names = BTreeSet::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
        let mut rest = line;
        while let Some(i) = rest.find("${") {
            let escaped = i > 0 && rest.as_bytes()[i - 1] == b'$';
            let after = &rest[i + 2..];
            let len = after
                .find(|c: char| !(c == '_' || c.is_ascii_alphanumeric()))
                .unwrap_or(after.len());
            if !escaped && len > 0 && after[len..].starts_with('}') {
                let name = &after[..len];
                if !env.contains_key(name) {
                    names.insert(name.to_string());
                }
            }
            rest = after;
        }
    }
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ");
    names
        .into_iter()
        .map(|n| {
            format!(
                "time=\"{now}\" level=warning msg=\"The \\\"{n}\\\" variable is not set. \
                 Defaulting to a blank string.\""
            )
        })
        .collect()
}

/// compose's interpolation error for the first `${VAR:?message}` (unset or empty) or
/// `${VAR?message}` (unset) that `env` does not satisfy, as the real server reports it.
pub(crate) fn missing_required_variable(
    text: &str,
    env: &BTreeMap<String, String>,
) -> Option<String> {
    for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
        let mut rest = line;
        while let Some(i) = rest.find("${") {
            let escaped = i > 0 && rest.as_bytes()[i - 1] == b'$';
            let after = &rest[i + 2..];
            rest = after;
            if escaped {
                continue;
            }
            let len = after
                .find(|c: char| !(c == '_' || c.is_ascii_alphanumeric()))
                .unwrap_or(after.len());
            let (name, op) = after.split_at(len);
            let (empty_counts, message) = if let Some(m) = op.strip_prefix(":?") {
                (true, m)
            } else if let Some(m) = op.strip_prefix('?') {
                (false, m)
            } else {
                continue;
            };
            let missing = match env.get(name) {
                None => true,
                Some(v) => empty_counts && v.is_empty(),
            };
            if name.is_empty() || !missing {
                continue;
            }
            let message = message.split('}').next().unwrap_or_default();
            return Some(format!(
                "error while interpolating: required variable {name} is missing a value: {message}"
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compose_file::parse;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_plan_parser_buckets_verbs_and_keeps_the_strongest() {
        let lines = strings(&[
            " DRY-RUN MODE -  Container r2  Recreate",
            " DRY-RUN MODE -  Container r2  Recreated",
            " DRY-RUN MODE -  Container r2  Started",
            " DRY-RUN MODE -  Container dl  Started",
            " DRY-RUN MODE -  glm-vllm-1  Creating",
            " DRY-RUN MODE -  Container old  Removed",
            " DRY-RUN MODE -  Network work_default  Creating",
            " Container nginx  Running",
            " Container nginx  Waiting",
            "time=\"x\" level=warning msg=\"blank string.\"",
            "",
            "Recreate",
        ]);
        let plan = parse_plan(&lines);
        assert_eq!(plan.recreate, ["Container r2"]);
        assert_eq!(plan.create, ["Network work_default", "glm-vllm-1"]);
        assert_eq!(plan.remove, ["Container old"]);
        assert_eq!(plan.unchanged, ["Container dl", "Container nginx"]);
    }

    #[test]
    fn the_plan_event_keys_are_alphabetical_and_all_present() {
        let json = serde_json::to_string(&PlanBody::default()).expect("serialises");
        assert_eq!(
            json,
            r#"{"create":[],"recreate":[],"remove":[],"unchanged":[]}"#
        );
    }

    #[test]
    fn a_scoped_up_pulls_in_dependencies_first_and_an_empty_list_means_every_default() {
        let file = parse(super::super::EXAMPLE_YAML).expect("example parses");
        let r2 = "model-sg-glm53-w4afp8-tp4-r2".to_string();
        assert_eq!(
            scope(&file, std::slice::from_ref(&r2)).expect("known"),
            ["model-downloader", r2.as_str()]
        );
        let all = scope(&file, &[]).expect("all");
        assert!(!all.contains(&"glm53-perception-check".to_string()));
        let pos = |n: &str| all.iter().position(|s| s == n).expect("in scope");
        assert!(pos("proxy-glm53") < pos("nginx"));
        assert!(pos("model-downloader") < pos("model-sg-glm53-w4afp8-tp4-r1"));
        assert_eq!(
            scope(&file, &strings(&["nope"])),
            Err("no such service: nope".to_string())
        );
    }

    #[test]
    fn changes_follow_the_effective_config() {
        let file = parse(super::super::EXAMPLE_YAML).expect("example parses");
        let env = BTreeMap::new();
        let order = scope(&file, &[]).expect("all");
        let want: BTreeMap<String, Desired> = order
            .iter()
            .map(|s| (s.clone(), desired(&file.services[s], None, &env)))
            .collect();
        let mut existing: BTreeMap<String, Existing> = want
            .iter()
            .map(|(s, d)| {
                let e = Existing {
                    container: d.container.clone(),
                    fingerprint: d.fingerprint.clone(),
                    running: s != "model-downloader",
                };
                (s.clone(), e)
            })
            .collect();
        existing.remove("nginx");
        existing.insert(
            "model-sg-old-r9".into(),
            Existing {
                container: "model-sg-old-r9".into(),
                fingerprint: "x".into(),
                running: true,
            },
        );
        let mut pinned = want.clone();
        let r1 = "model-sg-glm53-w4afp8-tp4-r1";
        pinned.insert(
            r1.into(),
            desired(&file.services[r1], Some(&"img:new".into()), &env),
        );
        let steps = plan(&file, &order, &pinned, &existing, false);
        let change = |s: &str| steps.iter().find(|x| x.service == s).map(|x| x.change);
        assert_eq!(change("model-sg-old-r9"), Some(Change::RemoveOrphan));
        assert_eq!(change("nginx"), Some(Change::Create));
        assert_eq!(change(r1), Some(Change::Recreate));
        assert_eq!(change("model-sg-glm53-w4afp8-tp4-r2"), Some(Change::Keep));
        assert_eq!(change("model-downloader"), Some(Change::Start));
        let lines = up_lines(&steps, &|s| s == "model-downloader", true);
        let plan = parse_plan(&lines);
        assert_eq!(plan.recreate, [format!("Container {r1}")]);
        assert_eq!(plan.remove, ["Container model-sg-old-r9"]);
        // The real server's plan: an exited, unchanged one-shot is `create`.
        assert_eq!(
            plan.create,
            ["Container model-downloader", "Container nginx"]
        );
        assert!(!plan
            .unchanged
            .contains(&"Container model-downloader".to_string()));
    }

    #[test]
    fn a_required_variable_the_env_lacks_is_compose_s_interpolation_error() {
        let text =
            "a: ${SET:?set it}\nb: $${ESC:?x}\n# ${COMMENT:?x}\nc: ${TOKEN:?TOKEN required}\n";
        let mut env = BTreeMap::from([("SET".to_string(), "1".to_string())]);
        assert_eq!(
            missing_required_variable(text, &env).as_deref(),
            Some("error while interpolating: required variable TOKEN is missing a value: TOKEN required")
        );
        env.insert("TOKEN".into(), String::new());
        assert!(
            missing_required_variable(text, &env).is_some(),
            "`:?` refuses an empty value"
        );
        env.insert("TOKEN".into(), "t".into());
        assert_eq!(missing_required_variable(text, &env), None);
        let bare = BTreeMap::from([("T".to_string(), String::new())]);
        assert_eq!(
            missing_required_variable("x: ${T?need}", &bare),
            None,
            "`?` accepts empty"
        );
    }

    #[test]
    fn unset_variables_without_defaults_are_warned_about_once() {
        let text = "a: ${SET}\nb: ${UNSET}\nc: ${UNSET}\nd: ${D:-x}\ne: $${ESC}\n# ${COMMENT}\n";
        let env = BTreeMap::from([("SET".to_string(), "1".to_string())]);
        let warnings = unset_variable_warnings(text, &env);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains(r#"The \"UNSET\" variable is not set"#));
    }
}
