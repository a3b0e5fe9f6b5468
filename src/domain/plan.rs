//! The canary plan (docs/reference.md#canary-plans): what an operator submits, and its validation
//! into a [`CanaryPlan`] the engine can run.
//!
//! Two stages, two kinds of refusal:
//! - `parse_json` / `parse_yaml` check the body's shape (an object with known fields of the right
//!   types). Problems there are *syntax or type* problems: HTTP 400 (`invalid_body`,
//!   `unknown_field`, `body_too_large`), except a `service` that is not one string, which is
//!   `invalid_service` so the operator sees which field is wrong.
//! - `validate` checks the values against the configuration (known host and replica, safe file
//!   path, tag, env, runbook, reason, patterns). Those are *semantic* problems: HTTP 422.
//!
//! Every message starts with the field it is about (`service: ...`, `env.BAD-KEY: ...`).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::domain::names::{ComposeFile, InvalidName, ServiceName, Tag};
use crate::domain::pattern::LogPattern;
use crate::domain::runbook::DEFAULT_CANARY;
use crate::domain::state::OnFailure;

/// Plans larger than this are refused (`body_too_large`).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// A plan as submitted (JSON or YAML body, or built by the CLI from flags).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanSpec {
    /// The host (`gpu02`).
    pub host: String,
    /// The compose file inside the compose repo (`prod/...yaml`).
    pub file: String,
    /// The one replica to roll (`model-sg-glm53-w4afp8-tp4-r2`).
    pub service: String,
    /// The compose repo's git tag.
    pub tag: String,
    /// Why, for the audit trail.
    pub reason: String,
    /// Runbook name; `single-replica-canary` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runbook: Option<String>,
    /// Env overrides merged over the host's env file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    /// Log patterns added to the runbook's required lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_logs: Option<Vec<String>>,
    /// `rollback` (default) or `halt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<OnFailure>,
    /// The replica's former service, which the new file renames (docs/reference.md#renamed-replicas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaces: Option<ReplacesSpec>,
    /// Low-traffic windows (UTC) for this rollout, instead of the host's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows: Option<Vec<crate::domain::window::TrafficWindow>>,
    /// A weights pre-stage's free space required (`300GiB`), when more than its runbook's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_free: Option<String>,
}

/// A renamed replica's former service: `down` acts on it with the file and tag that deployed
/// it; `plan` and `up` on the plan's `service`. `file` and `tag` default to its recorded
/// deployment (or the host's baseline), looked up when the rollout takes it down.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replaces {
    /// The old compose service (a configured alias of the target's slot).
    pub service: ServiceName,
    /// The compose file that deployed it (default: its recorded deployment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<ComposeFile>,
    /// The tag that deployed it (default: its recorded deployment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<Tag>,
}

/// `replaces` as a plan's body gives it, checked into [`Replaces`] (`invalid_replaces`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplacesSpec {
    pub service: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// What the configuration knows: the hosts and their replicas, and the loaded runbooks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KnownTargets {
    /// host name → its configured replicas (compose services).
    pub replicas: BTreeMap<String, BTreeSet<String>>,
    /// Names of the loaded runbooks.
    pub runbooks: BTreeSet<String>,
    /// host name → a replica's former name (`aliases:` in the config) → the replica.
    pub aliases: BTreeMap<String, BTreeMap<String, String>>,
}

/// A validated plan, with defaults applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CanaryPlan {
    /// A configured host.
    pub host: String,
    /// A relative `prod/*.yaml` path without `..`.
    pub file: ComposeFile,
    /// A configured replica of `host`.
    pub service: ServiceName,
    /// A git tag of the compose repo.
    pub tag: Tag,
    /// Non-empty, trimmed.
    pub reason: String,
    /// A loaded runbook (default `single-replica-canary`).
    pub runbook: String,
    /// Env overrides (keys `[A-Za-z_][A-Za-z0-9_]*`, values without newlines).
    pub env: BTreeMap<String, String>,
    /// Extra required log lines.
    pub require_logs: Vec<LogPattern>,
    /// What a failure after the replica was touched does (default `rollback`).
    pub on_failure: OnFailure,
    /// The former service a rename takes down (checked: a configured alias of `service`).
    pub replaces: Option<Replaces>,
    /// Low-traffic windows for this rollout, instead of the host's; empty: the host's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<crate::domain::window::TrafficWindow>,
    /// A weights pre-stage's free space required (bytes), raising its runbook's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_free: Option<u64>,
}

/// A refused plan: a stable code, the field at fault, and a message that names it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct PlanError {
    /// `unknown_host`, `unknown_service`, `invalid_service`, `invalid_file`, `invalid_tag`,
    /// `invalid_env`, `unknown_runbook`, `missing_reason`, `invalid_pattern`,
    /// `invalid_on_failure`, `invalid_replaces`, `unknown_field`, `invalid_body` or
    /// `body_too_large`.
    pub code: &'static str,
    /// The field at fault (`service`, `env.KEY`, `require_logs[1]`), when there is one.
    pub field: Option<String>,
    /// Human-readable, starting with the field.
    pub message: String,
}

impl PlanError {
    fn new(code: &'static str, field: Option<&str>, message: impl Into<String>) -> Self {
        let message = message.into();
        Self {
            code,
            message: match field {
                Some(f) => format!("{f}: {message}"),
                None => message,
            },
            field: field.map(str::to_string),
        }
    }

    /// `true` for semantic refusals (HTTP 422); `false` for malformed bodies (HTTP 400:
    /// `invalid_body`, `unknown_field`, `body_too_large`).
    pub fn is_unprocessable(&self) -> bool {
        !matches!(
            self.code,
            "invalid_body" | "unknown_field" | "body_too_large"
        )
    }
}

mod parse;

pub use parse::{check_unique_keys, parse_json, parse_yaml};

/// Checks a plan against the configuration and applies defaults.
pub fn validate(spec: PlanSpec, known: &KnownTargets) -> Result<CanaryPlan, PlanError> {
    let Some(replicas) = known.replicas.get(&spec.host) else {
        let hosts: Vec<&str> = known.replicas.keys().map(String::as_str).collect();
        return Err(PlanError::new(
            "unknown_host",
            Some("host"),
            format!(
                "\"{}\" is not a configured host (configured: {})",
                spec.host,
                hosts.join(", ")
            ),
        ));
    };
    let service = parsed(
        "service",
        "invalid_service",
        spec.service,
        ServiceName::parse,
    )?;
    if !replicas.contains(service.as_str()) {
        let names: Vec<&str> = replicas.iter().map(String::as_str).collect();
        return Err(PlanError::new(
            "unknown_service",
            Some("service"),
            format!(
                "\"{}\" is not a configured replica of {} (replicas: {})",
                service,
                spec.host,
                names.join(", ")
            ),
        ));
    }
    let file = parsed("file", "invalid_file", spec.file, ComposeFile::parse)?;
    let tag = parsed("tag", "invalid_tag", spec.tag, Tag::parse)?;
    if spec.reason.len() > MAX_REASON_BYTES {
        return Err(PlanError::new(
            "invalid_body",
            Some("reason"),
            format!("must be at most {MAX_REASON_BYTES} bytes"),
        ));
    }
    if spec.reason.trim().is_empty() {
        return Err(PlanError::new(
            "missing_reason",
            Some("reason"),
            "must say why (it is kept in the audit trail)",
        ));
    }
    let runbook = spec.runbook.unwrap_or_else(|| DEFAULT_CANARY.to_string());
    if !known.runbooks.contains(&runbook) {
        let names: Vec<&str> = known.runbooks.iter().map(String::as_str).collect();
        return Err(PlanError::new(
            "unknown_runbook",
            Some("runbook"),
            format!(
                "\"{runbook}\" is not a loaded runbook (loaded: {})",
                names.join(", ")
            ),
        ));
    }
    let env = spec.env.unwrap_or_default();
    for (key, value) in &env {
        check_env(key, value)?;
    }
    let mut require_logs = Vec::new();
    for (i, text) in spec.require_logs.unwrap_or_default().iter().enumerate() {
        let pattern = LogPattern::parse(text).map_err(|e| {
            PlanError::new("invalid_pattern", Some(&format!("require_logs[{i}]")), e)
        })?;
        require_logs.push(pattern);
    }
    let replaces = match spec.replaces {
        Some(r) => Some(check_replaces(r, &spec.host, &service, known)?),
        None => None,
    };
    let required_free = match &spec.required_free {
        Some(text) => Some(
            crate::domain::staging::parse_size(text)
                .map_err(|e| PlanError::new("invalid_size", Some("required_free"), e))?,
        ),
        None => None,
    };
    Ok(CanaryPlan {
        replaces,
        host: spec.host,
        file,
        service,
        tag,
        reason: spec.reason.trim().to_string(),
        runbook,
        env,
        require_logs,
        on_failure: spec.on_failure.unwrap_or(OnFailure::Rollback),
        windows: spec.windows.unwrap_or_default(),
        required_free,
    })
}

/// `replaces` (docs/reference.md#renamed-replicas): a service name other than the target,
/// configured as one of the target's former names (`aliases:`), never another replica or
/// another replica's former name; its `file` and `tag`, when given, checked like the plan's.
fn check_replaces(
    r: ReplacesSpec,
    host: &str,
    target: &str,
    known: &KnownTargets,
) -> Result<Replaces, PlanError> {
    const CODE: &str = "invalid_replaces";
    let service = parsed(
        "replaces.service",
        CODE,
        r.service.clone(),
        ServiceName::parse,
    )?;
    let fail = |why: String| Err(PlanError::new(CODE, Some("replaces.service"), why));
    let aliases = known.aliases.get(host);
    let slot = aliases.and_then(|a| a.get(&r.service));
    if r.service == target {
        return fail(format!(
            "\"{target}\" is the target itself: a rename takes down the replica's former name"
        ));
    }
    if known
        .replicas
        .get(host)
        .is_some_and(|replicas| replicas.contains(&r.service))
    {
        return fail(format!(
            "\"{}\" is another replica of {host}, not a former name of {target}: a rename never touches another replica",
            r.service
        ));
    }
    match slot {
        Some(slot) if slot == target => {}
        Some(slot) => {
            return fail(format!(
                "\"{}\" is a former name of {slot}, another replica of {host}, not of {target}",
                r.service
            ))
        }
        None => {
            let mine: Vec<&str> = aliases
                .into_iter()
                .flatten()
                .filter(|(_, s)| *s == target)
                .map(|(a, _)| a.as_str())
                .collect();
            return fail(format!(
                "\"{}\" is not a configured former name of {target} (its `aliases` in the config: [{}])",
                r.service,
                mine.join(", ")
            ));
        }
    }
    let file = r
        .file
        .map(|file| parsed("replaces.file", CODE, file, ComposeFile::parse));
    let tag = r
        .tag
        .map(|tag| parsed("replaces.tag", CODE, tag, Tag::parse));
    Ok(Replaces {
        service,
        file: file.transpose()?,
        tag: tag.transpose()?,
    })
}

/// `value` as a `T` ([`crate::domain::names`]), or the plan's refusal of `field` with `code`.
fn parsed<T>(
    field: &str,
    code: &'static str,
    value: String,
    parse: fn(String) -> Result<T, InvalidName>,
) -> Result<T, PlanError> {
    parse(value)
        .map_err(|e| PlanError::new(code, Some(field), format!("{}, got \"{}\"", e.why, e.shown)))
}

/// The longest `reason` accepted (it is kept in every audit row of the rollout).
pub const MAX_REASON_BYTES: usize = 1024;

/// Whether `key` is a valid env var name (`[A-Za-z_][A-Za-z0-9_]*`), as compose-manager checks.
pub fn is_env_key(key: &str) -> bool {
    let mut chars = key.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn check_env(key: &str, value: &str) -> Result<(), PlanError> {
    let field = format!("env.{key}");
    if !is_env_key(key) {
        return Err(PlanError::new(
            "invalid_env",
            Some(&field),
            "key must match [A-Za-z_][A-Za-z0-9_]*",
        ));
    }
    if value.contains(['\n', '\r', '\0']) {
        return Err(PlanError::new(
            "invalid_env",
            Some(&field),
            "value must not contain a newline, carriage return or NUL",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
