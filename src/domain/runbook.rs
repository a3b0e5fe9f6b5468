//! Runbooks: a named list of steps from a closed set of kinds (docs/reference.md#runbooks), parsed
//! and checked once at start so that a rollout never meets a malformed step.
//!
//! A runbook file is `runbooks/<name>.yaml` with `description` and `steps`. Every refusal is
//! reported as `file:line: step N "name": message`. Omitted optional fields take the defaults
//! in [`defaults`], which are the timings operators use in production today.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::domain::yaml_line::{locate, read, Seg};

pub mod step;

pub use step::{Scope, StepKind, StepKindName};

/// The runbook a canary plan uses when it names none.
pub const DEFAULT_CANARY: &str = "single-replica-canary";
/// The runbook every rollback (one-click or automatic) uses.
pub const ROLLBACK: &str = "single-replica-rollback";

/// Defaults for omitted step fields.
pub use super::defaults;

/// A validated runbook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Runbook {
    /// The file name without `.yaml`.
    pub name: String,
    /// What it is for (optional in the file; empty when absent).
    pub description: String,
    /// At least one step; names are unique.
    pub steps: Vec<Step>,
}

/// One step of a runbook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Unique within the runbook; defaults to the kind's name.
    pub name: String,
    /// What the step does, with its settings.
    #[serde(flatten)]
    pub kind: StepKind,
}

/// A runbook that cannot be loaded. Displays as `file:line: message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct RunbookError {
    /// The file (or directory) as given to the loader.
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// What is wrong, naming the step (`step 3 "down": unknown field `interval``).
    pub message: String,
}

impl Runbook {
    /// The step called `name`.
    pub fn step_named(&self, name: &str) -> Option<&Step> {
        self.steps.iter().find(|s| s.name == name)
    }

    /// The safety rules as far as a runbook can break them
    /// (docs/safety.md#rules-a-runbook-must-keep): a `plan` step (the dry-run gate) before the
    /// first `up`, `peers_healthy` before any `down` or `up` (rule 7), a `snapshot` before
    /// `verify_neighbours`, and no `down` without a later `up` (the replica would stay down).
    /// `parse` already refuses runbooks that fail this.
    pub fn ensure_safe(&self) -> Result<(), String> {
        match safety_violation(&self.steps) {
            Some((_, message)) => Err(message),
            None => Ok(()),
        }
    }
}

/// The first unsafe step: its index and a message naming it. Companion steps (`services`)
/// follow the same rules with their own scope: an `up` needs an earlier `plan` of exactly the
/// same scope (services, `only_out_of_date`, `force_recreate`); only the target's `down` needs
/// a later `up` of the target (a companion may be taken down at the end).
fn safety_violation(steps: &[Step]) -> Option<(usize, String)> {
    let (mut peers_checked, mut snapshotted) = (false, false);
    let mut planned: Vec<&step::Scope> = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        match &step.kind {
            StepKind::Plan(p) => planned.push(&p.scope),
            StepKind::PeersHealthy(_) => peers_checked = true,
            StepKind::Snapshot(_) => snapshotted = true,
            _ => {}
        }
        let up = match &step.kind {
            StepKind::Up(u) => Some(&u.scope),
            _ => None,
        };
        let down = match &step.kind {
            StepKind::Down(d) => Some(&d.scope),
            _ => None,
        };
        let (is_up, is_down) = (up.is_some(), down.is_some());
        let target_up_later = || {
            steps[i..]
                .iter()
                .any(|s| matches!(&s.kind, StepKind::Up(u) if !u.scope.is_companion()))
        };
        let problem = if (is_up || is_down) && !peers_checked {
            Some("needs a `peers_healthy` step before it (the peer must carry the traffic while the replica is out)".to_string())
        } else if up.is_some_and(|scope| !planned.contains(&scope)) {
            let scope = up.map(step::Scope::shown).unwrap_or_default();
            Some(format!("needs a `plan` step before it (the dry-run gate) with the same scope ({scope}, `only_out_of_date` and `force_recreate`)"))
        } else if matches!(step.kind, StepKind::VerifyNeighbours(_)) && !snapshotted {
            Some("needs a `snapshot` step before it".to_string())
        } else if down.is_some_and(|scope| !scope.is_companion()) && !target_up_later() {
            Some("needs an `up` step after it (the replica would be left down)".to_string())
        } else {
            None
        };
        if let Some(problem) = problem {
            let kind = step.kind.name();
            let article = if is_up { "an" } else { "a" };
            let message = format!(
                "step {} \"{}\": {article} `{kind}` step {problem}",
                i + 1,
                step.name
            );
            return Some((i, message));
        }
    }
    None
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRunbook {
    #[serde(default)]
    description: Option<String>,
    steps: Option<Vec<serde_yaml::Value>>,
}

/// A runbook's steps alone, read when its top level has unknown keys, so that the unknown
/// keys of its steps are reported with them.
#[derive(Deserialize)]
struct StepsOnly {
    #[serde(default)]
    steps: Vec<serde_yaml::Value>,
}

/// Parses and validates one runbook. `name` is the runbook's name (the file stem);
/// `source_label` is what errors print as the file.
pub fn parse(name: &str, source_label: &str, yaml: &str) -> Result<Runbook, RunbookError> {
    let error = |line: Option<usize>, message: String| RunbookError {
        file: source_label.to_string(),
        line,
        message,
    };
    if yaml.trim().is_empty() {
        return Err(error(
            None,
            "empty runbook: expected `description` and `steps`".into(),
        ));
    }
    // Every unknown key, at the top and in the steps, is reported at once, in file order.
    let (raw, mut unknown) = match read::<RawRunbook>(yaml) {
        Ok(raw) => (raw, Vec::new()),
        Err(errors) if errors.iter().all(|e| e.unknown.is_some()) => {
            let steps = read::<StepsOnly>(yaml).map(|s| s.steps).unwrap_or_default();
            let raw = RawRunbook {
                description: None,
                steps: Some(steps),
            };
            (
                raw,
                errors.into_iter().map(|e| (e.line, e.message)).collect(),
            )
        }
        Err(errors) => {
            return Err(RunbookError::all(
                errors.into_iter().map(|e| error(e.line, e.message)),
            ))
        }
    };
    let missing = raw.steps.is_none();
    let raw_steps = raw.steps.unwrap_or_default();
    let mut steps: Vec<Step> = Vec::with_capacity(raw_steps.len());
    let mut first_error = None;
    for (index, value) in raw_steps.iter().enumerate() {
        match step::read(yaml, index, value) {
            // Until the first error every step so far is in `steps`, at its index.
            Ok(step) if first_error.is_none() => {
                match steps.iter().position(|s| s.name == step.name) {
                    Some(first) => {
                        first_error = Some(step::StepError {
                            line: locate(yaml, &[Seg::Key("steps"), Seg::Index(index)]),
                            message: format!(
                                "step {} \"{}\": duplicate step name (also step {})",
                                index + 1,
                                step.name,
                                first + 1
                            ),
                            unknown: false,
                        })
                    }
                    None => steps.push(step),
                }
            }
            Ok(_) => {}
            Err(errors) if errors.iter().all(|e| e.unknown) => {
                unknown.extend(errors.into_iter().map(|e| (e.line, e.message)));
            }
            Err(mut errors) => {
                first_error.get_or_insert_with(|| errors.remove(0));
            }
        }
    }
    if !unknown.is_empty() {
        unknown.sort_by_key(|(line, _)| line.unwrap_or(usize::MAX));
        return Err(RunbookError::all(
            unknown
                .into_iter()
                .map(|(line, message)| error(line, message)),
        ));
    }
    if let Some(e) = first_error {
        return Err(error(e.line, e.message));
    }
    if missing {
        return Err(error(Some(1), "missing field `steps`".into()));
    }
    if steps.is_empty() {
        let line = locate(yaml, &[Seg::Key("steps")]);
        let message = "`steps` is empty: a runbook needs at least one step";
        return Err(error(line, message.into()));
    }
    if let Some((index, message)) = safety_violation(&steps) {
        return Err(error(
            locate(yaml, &[Seg::Key("steps"), Seg::Index(index)]),
            message,
        ));
    }
    Ok(Runbook {
        name: name.to_string(),
        description: raw.description.unwrap_or_default(),
        steps,
    })
}

impl RunbookError {
    /// Several errors as one: the first, then every other on a line of its own.
    pub fn all(errors: impl IntoIterator<Item = RunbookError>) -> RunbookError {
        let mut errors = errors.into_iter();
        let mut first = errors.next().expect("at least one error");
        for other in errors {
            first.message.push_str(&format!("\n{other}"));
        }
        first
    }
}

/// Reads and parses one runbook file; its name is the file stem.
pub fn load_file(path: &Path) -> Result<Runbook, RunbookError> {
    let label = path.display().to_string();
    let name = path
        .file_stem()
        .and_then(|s| s.to_str())
        .ok_or_else(|| RunbookError {
            file: label.clone(),
            line: None,
            message: "runbook file name is not valid UTF-8".into(),
        })?;
    let text = std::fs::read_to_string(path).map_err(|e| RunbookError {
        file: label.clone(),
        line: None,
        message: format!("cannot read runbook: {e}"),
    })?;
    parse(name, &label, &text)
}

/// Loads every `*.yaml` in `dir` (not recursive), keyed by name. The first bad file stops
/// the load.
pub fn load_dir(dir: &Path) -> Result<BTreeMap<String, Runbook>, RunbookError> {
    let dir_error = |e: std::io::Error| RunbookError {
        file: dir.display().to_string(),
        line: None,
        message: format!("cannot read runbooks directory: {e}"),
    };
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(dir_error)? {
        let path = entry.map_err(dir_error)?.path();
        if path.extension().is_some_and(|ext| ext == "yaml") && path.is_file() {
            paths.push(path);
        }
    }
    paths.sort();
    let mut runbooks = BTreeMap::new();
    for path in paths {
        let runbook = load_file(&path)?;
        runbooks.insert(runbook.name.clone(), runbook);
    }
    Ok(runbooks)
}

#[cfg(test)]
mod tests;
