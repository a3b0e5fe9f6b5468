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
    pub replaces: Option<Replaces>,
}

/// A renamed replica's former service: `down` acts on it with the file and tag that deployed
/// it; `plan` and `up` on the plan's `service`. `file` and `tag` default to its recorded
/// deployment (or the host's baseline), looked up when the rollout takes it down.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replaces {
    /// The old compose service (a configured alias of the target's slot).
    pub service: String,
    /// The compose file that deployed it (default: its recorded deployment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The tag that deployed it (default: its recorded deployment's).
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
    pub file: String,
    /// A configured replica of `host`.
    pub service: String,
    /// A tag of `[A-Za-z0-9._/-]` characters.
    pub tag: String,
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
    check_service("service", "invalid_service", &spec.service)?;
    if !replicas.contains(&spec.service) {
        let names: Vec<&str> = replicas.iter().map(String::as_str).collect();
        return Err(PlanError::new(
            "unknown_service",
            Some("service"),
            format!(
                "\"{}\" is not a configured replica of {} (replicas: {})",
                spec.service,
                spec.host,
                names.join(", ")
            ),
        ));
    }
    check_file(&spec.file)?;
    check_tag(&spec.tag)?;
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
        Some(r) => Some(check_replaces(r, &spec.host, &spec.service, known)?),
        None => None,
    };
    Ok(CanaryPlan {
        replaces,
        host: spec.host,
        file: spec.file,
        service: spec.service,
        tag: spec.tag,
        reason: spec.reason.trim().to_string(),
        runbook,
        env,
        require_logs,
        on_failure: spec.on_failure.unwrap_or(OnFailure::Rollback),
    })
}

/// `replaces` (docs/reference.md#renamed-replicas): a service name other than the target,
/// configured as one of the target's former names (`aliases:`), never another replica or
/// another replica's former name; its `file` and `tag`, when given, checked like the plan's.
fn check_replaces(
    r: Replaces,
    host: &str,
    target: &str,
    known: &KnownTargets,
) -> Result<Replaces, PlanError> {
    const CODE: &str = "invalid_replaces";
    check_service("replaces.service", CODE, &r.service)?;
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
    if let Some(file) = &r.file {
        check_file(file).map_err(|e| e.under("replaces"))?;
    }
    if let Some(tag) = &r.tag {
        check_tag(tag).map_err(|e| e.under("replaces"))?;
    }
    Ok(r)
}

impl PlanError {
    /// The same refusal about `prefix.<field>` (`replaces.file`), with code
    /// `invalid_replaces`.
    fn under(self, prefix: &str) -> Self {
        let field = self.field.unwrap_or_default();
        let why = self
            .message
            .strip_prefix(&format!("{field}: "))
            .unwrap_or(&self.message)
            .to_string();
        PlanError::new("invalid_replaces", Some(&format!("{prefix}.{field}")), why)
    }
}

fn check_service(field: &str, code: &'static str, service: &str) -> Result<(), PlanError> {
    let fail = |why: &str| {
        Err(PlanError::new(
            code,
            Some(field),
            format!("{why}, got \"{service}\""),
        ))
    };
    if service.trim().is_empty() {
        return fail("must name one replica");
    }
    if service.contains(',') || service.chars().any(char::is_whitespace) {
        return fail(
            "must be exactly one replica name (no commas or spaces: a plan rolls one replica)",
        );
    }
    if !service
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return fail("must be a compose service name ([A-Za-z0-9._-])");
    }
    Ok(())
}

fn check_file(file: &str) -> Result<(), PlanError> {
    let Some(why) = file_problem(file) else {
        return Ok(());
    };
    let shown: String = file.escape_debug().take(160).collect();
    Err(PlanError::new(
        "invalid_file",
        Some("file"),
        format!("{why}, got \"{shown}\""),
    ))
}

/// Why `file` is not a compose file canaryd names to compose-manager: a relative path under
/// `prod/` of the compose repo, in `[A-Za-z0-9._/-]`, with no `..`, empty or `.` segment,
/// ending `.yaml` or `.yml`; `None` when it is one. compose-manager builds the raw-file URL of
/// the git host from it, and a URL parser decodes `%2e` and resolves the dots: so no `%` at
/// all, nor a backslash (a slash to some parsers), nor any character outside the set (a
/// full-width dot, NUL, a control character), and `..` in no spelling (safety rule 24). The
/// one rule: plans, releases, rollbacks' `replaces` and every compose call check it.
pub fn file_problem(file: &str) -> Option<&'static str> {
    if file.is_empty() {
        return Some("must be a compose file path such as prod/NAME.yaml");
    }
    if file.starts_with('/') || file.starts_with('\\') || file.starts_with('~') {
        return Some("must be a path relative to the compose repo (not absolute)");
    }
    if file.contains('%') {
        return Some("must not be percent-encoded (`%`): compose-manager's URL would decode it");
    }
    if file.contains('\\') {
        return Some("must not contain backslashes");
    }
    if file.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Some("must not contain spaces, NUL or control characters");
    }
    if file.contains("..") {
        return Some("must not contain `..`");
    }
    if !file
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-'))
    {
        return Some("may only contain letters, digits and `._/-`");
    }
    if !file.starts_with("prod/") {
        return Some("must be under prod/");
    }
    if file.split('/').any(|seg| seg.is_empty() || seg == ".") {
        return Some("must not contain empty or `.` path segments");
    }
    if !(file.ends_with(".yaml") || file.ends_with(".yml")) {
        return Some("must be a .yaml or .yml file");
    }
    None
}

/// The longest tag accepted: git allows more, but no release tag comes close, and a tag ends
/// up in compose-manager's URLs to the git host.
pub const MAX_TAG_BYTES: usize = 128;

/// The longest `reason` accepted (it is kept in every audit row of the rollout).
pub const MAX_REASON_BYTES: usize = 1024;

/// Why `tag` is not a git tag name canaryd forwards (`git check-ref-format` for
/// `refs/tags/<tag>`, in the letters compose-manager accepts, not starting with `-`, at most
/// [`MAX_TAG_BYTES`]); `None` when it is one.
pub fn tag_problem(tag: &str) -> Option<&'static str> {
    if tag.is_empty() {
        return Some("must be a git tag of the compose repo such as v0.0.452");
    }
    if tag.len() > MAX_TAG_BYTES {
        return Some("must be at most 128 bytes");
    }
    if !tag
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-'))
    {
        return Some("may only contain letters, digits and `._/-`");
    }
    if tag.starts_with('-') {
        return Some("must not start with `-`");
    }
    if tag.starts_with('/') || tag.ends_with('/') || tag.contains("//") {
        return Some("must not start or end with `/` or contain `//` (git ref rules)");
    }
    if tag.contains("..") {
        return Some("must not contain `..` (git ref rules)");
    }
    if tag.ends_with('.') {
        return Some("must not end with `.` (git ref rules)");
    }
    for part in tag.split('/') {
        if part.starts_with('.') {
            return Some("no `/`-separated part may start with `.` (git ref rules)");
        }
        if part.ends_with(".lock") {
            return Some("no `/`-separated part may end with `.lock` (git ref rules)");
        }
    }
    None
}

fn check_tag(tag: &str) -> Result<(), PlanError> {
    let Some(why) = tag_problem(tag) else {
        return Ok(());
    };
    let shown: String = tag.chars().take(64).collect();
    let more = if shown.len() < tag.len() { "..." } else { "" };
    Err(PlanError::new(
        "invalid_tag",
        Some("tag"),
        format!("{why}, got \"{shown}{more}\""),
    ))
}

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
