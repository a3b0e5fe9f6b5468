//! Turns one YAML step mapping into a [`Step`], checking its fields against its kind.
//!
//! Done by hand rather than with serde so that every message names the step (`step 3
//! "down": unknown field `interval` (a `down` step takes: timeout)`) and the field, which the
//! caller turns into a line number.

use std::time::Duration;

use serde_yaml::{Mapping, Value};

use super::{defaults, Step, StepKind};
use crate::domain::duration::{format_duration, parse_duration};
use crate::domain::pattern::LogPattern;

mod analyze;

/// A step refusal: the message (already naming the step) and the field it is about.
pub(super) struct StepError {
    pub field: Option<String>,
    pub message: String,
}

/// The fields each kind takes besides `name` and `kind`.
fn allowed_fields(kind: &str) -> &'static [&'static str] {
    match kind {
        "peers_healthy" | "down" | "up" | "approve" => &["timeout"],
        "plan" => &["allow"],
        "wait_health" => &["timeout", "interval", "consecutive"],
        "wait_logs" => &[
            "timeout",
            "interval",
            "require",
            "forbid",
            "max_log_failures",
        ],
        "soak" => &[
            "duration",
            "interval",
            "max_misses",
            "forbid",
            "max_log_failures",
        ],
        "smoke" => &[
            "model",
            "prompt",
            "max_tokens",
            "expect",
            "repeat",
            "timeout",
        ],
        "analyze" => &["source", "warmup", "duration", "interval", "checks"],
        _ => &[],
    }
}

/// Reads the fields of one step mapping, with the step's label for messages.
struct Fields<'a> {
    map: &'a Mapping,
    label: String,
}

impl Fields<'_> {
    fn fail<T>(&self, field: &str, message: impl std::fmt::Display) -> Result<T, StepError> {
        Err(StepError {
            field: Some(field.to_string()),
            message: format!("{}: {message}", self.label),
        })
    }

    fn get(&self, field: &str) -> Option<&Value> {
        self.map.get(field).filter(|v| !v.is_null())
    }

    fn duration(&self, field: &str, default: Duration) -> Result<Duration, StepError> {
        let Some(value) = self.get(field) else {
            return Ok(default);
        };
        let Some(text) = value.as_str() else {
            return self.fail(
                field,
                format!(
                    "`{field}` must be a duration such as `5s` or `45m`, got {}",
                    show(value)
                ),
            );
        };
        match parse_duration(text) {
            Ok(d) if d.is_zero() => self.fail(field, format!("`{field}` must be longer than zero")),
            Ok(d) => Ok(d),
            Err(e) => self.fail(field, format!("`{field}`: {e}")),
        }
    }

    fn positive(&self, field: &str, default: u32) -> Result<u32, StepError> {
        let Some(value) = self.get(field) else {
            return Ok(default);
        };
        match value.as_u64().map(u32::try_from) {
            Some(Ok(n)) if n > 0 => Ok(n),
            _ => self.fail(
                field,
                format!(
                    "`{field}` must be a whole number of at least 1, got {}",
                    show(value)
                ),
            ),
        }
    }

    fn strings(&self, field: &str) -> Result<Vec<String>, StepError> {
        let Some(value) = self.get(field) else {
            return Ok(Vec::new());
        };
        let Some(items) = value.as_sequence() else {
            return self.fail(
                field,
                format!("`{field}` must be a list of strings, got {}", show(value)),
            );
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match item.as_str() {
                Some(text) => out.push(text.to_string()),
                None => {
                    return self.fail(
                        field,
                        format!("`{field}[{i}]` must be a string, got {}", show(item)),
                    )
                }
            }
        }
        Ok(out)
    }

    /// A required, non-blank string; `what` says what it is for.
    fn required_text(&self, field: &str, what: &str) -> Result<String, StepError> {
        match self.get(field) {
            None => Err(StepError {
                field: None,
                message: format!("{}: missing field `{field}` ({what})", self.label),
            }),
            Some(Value::String(text)) if !text.trim().is_empty() => Ok(text.clone()),
            Some(other) => self.fail(
                field,
                format!(
                    "`{field}` must be a non-empty string ({what}), got {}",
                    show(other)
                ),
            ),
        }
    }

    fn patterns(&self, field: &str) -> Result<Vec<LogPattern>, StepError> {
        let mut out = Vec::new();
        for (i, text) in self.strings(field)?.iter().enumerate() {
            match LogPattern::parse(text) {
                Ok(p) => out.push(p),
                Err(e) => return self.fail(field, format!("`{field}[{i}]`: {e}")),
            }
        }
        Ok(out)
    }

    fn interval_within(
        &self,
        interval: Duration,
        limit: Duration,
        limit_field: &str,
    ) -> Result<(), StepError> {
        if interval > limit {
            return self.fail(
                "interval",
                format!(
                    "`interval` ({}) is longer than `{limit_field}` ({})",
                    format_duration(interval),
                    format_duration(limit)
                ),
            );
        }
        Ok(())
    }
}

/// A short rendering of a YAML value for messages.
fn show(value: &Value) -> String {
    match value {
        Value::Null => "nothing".into(),
        Value::Bool(b) => format!("`{b}`"),
        Value::Number(n) => format!("`{n}`"),
        Value::String(s) => format!("\"{s}\""),
        Value::Sequence(_) => "a list".into(),
        Value::Mapping(_) => "a mapping".into(),
        Value::Tagged(t) => format!("a `{}` tagged value", t.tag),
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Converts step number `index` (0-based) of a runbook.
pub(super) fn from_value(index: usize, value: &Value) -> Result<Step, StepError> {
    let number = index + 1;
    let plain = |field: Option<&str>, message: String| StepError {
        field: field.map(str::to_string),
        message,
    };
    let Some(map) = value.as_mapping() else {
        return Err(plain(
            None,
            format!(
                "step {number}: expected a mapping such as `{{name: up, kind: up}}`, got {}",
                show(value)
            ),
        ));
    };
    let kind = match map.get("kind") {
        Some(Value::String(kind)) => kind.as_str(),
        Some(other) => {
            return Err(plain(
                Some("kind"),
                format!(
                    "step {number}: `kind` must be a string, got {}",
                    show(other)
                ),
            ))
        }
        None => {
            return Err(plain(
                None,
                format!(
                    "step {number}: missing field `kind` (one of: {})",
                    StepKind::NAMES.join(", ")
                ),
            ))
        }
    };
    let name = match map.get("name") {
        None | Some(Value::Null) => kind.to_string(),
        Some(Value::String(name)) if valid_name(name) => name.clone(),
        Some(other) => {
            return Err(plain(Some("name"), format!("step {number}: `name` must be 1 to 64 letters, digits, `-`, `_` or `.`, got {}", show(other))));
        }
    };
    let fields = Fields {
        map,
        label: format!("step {number} \"{name}\""),
    };
    if !StepKind::NAMES.contains(&kind) {
        return fields.fail(
            "kind",
            format!(
                "unknown kind `{kind}` (expected one of: {})",
                StepKind::NAMES.join(", ")
            ),
        );
    }
    let allowed = allowed_fields(kind);
    for key in map.keys() {
        let Some(key) = key.as_str() else {
            return Err(plain(
                None,
                format!(
                    "{}: field names must be strings, got {}",
                    fields.label,
                    show(key)
                ),
            ));
        };
        if key != "name" && key != "kind" && !allowed.contains(&key) {
            let takes = if allowed.is_empty() {
                "no other fields".to_string()
            } else {
                allowed.join(", ")
            };
            return fields.fail(
                key,
                format!("unknown field `{key}` (a `{kind}` step takes: {takes})"),
            );
        }
    }
    let kind = match kind {
        "snapshot" => StepKind::Snapshot,
        "peers_healthy" => StepKind::PeersHealthy {
            timeout: fields.duration("timeout", defaults::PEERS_HEALTHY_TIMEOUT)?,
        },
        "plan" => {
            let allow = fields.strings("allow")?;
            if allow.iter().any(|a| a.trim().is_empty()) {
                return fields.fail("allow", "`allow` entries must be service names, not empty");
            }
            StepKind::Plan { allow }
        }
        "down" => StepKind::Down {
            timeout: fields.duration("timeout", defaults::DOWN_TIMEOUT)?,
        },
        "up" => StepKind::Up {
            timeout: fields.duration("timeout", defaults::UP_TIMEOUT)?,
        },
        "verify_neighbours" => StepKind::VerifyNeighbours,
        "wait_health" => {
            let timeout = fields.duration("timeout", defaults::WAIT_HEALTH_TIMEOUT)?;
            let interval = fields.duration("interval", defaults::WAIT_HEALTH_INTERVAL)?;
            fields.interval_within(interval, timeout, "timeout")?;
            StepKind::WaitHealth {
                timeout,
                interval,
                consecutive: fields.positive("consecutive", defaults::WAIT_HEALTH_CONSECUTIVE)?,
            }
        }
        "wait_logs" => {
            let timeout = fields.duration("timeout", defaults::WAIT_LOGS_TIMEOUT)?;
            let interval = fields.duration("interval", defaults::WAIT_LOGS_INTERVAL)?;
            fields.interval_within(interval, timeout, "timeout")?;
            StepKind::WaitLogs {
                timeout,
                interval,
                require: fields.patterns("require")?,
                forbid: fields.patterns("forbid")?,
                max_log_failures: fields
                    .positive("max_log_failures", defaults::MAX_LOG_FAILURES)?,
            }
        }
        "soak" => {
            let duration = fields.duration("duration", defaults::SOAK_DURATION)?;
            let interval = fields.duration("interval", defaults::SOAK_INTERVAL)?;
            fields.interval_within(interval, duration, "duration")?;
            StepKind::Soak {
                duration,
                interval,
                max_misses: fields.positive("max_misses", defaults::SOAK_MAX_MISSES)?,
                forbid: fields.patterns("forbid")?,
                max_log_failures: fields
                    .positive("max_log_failures", defaults::MAX_LOG_FAILURES)?,
            }
        }
        "smoke" => StepKind::Smoke {
            model: fields.required_text(
                "model",
                "the model id the engine serves, e.g. `z-ai/glm-5.3-flash`",
            )?,
            prompt: fields.required_text("prompt", "the message sent to the engine")?,
            max_tokens: fields.positive("max_tokens", defaults::SMOKE_MAX_TOKENS)?,
            expect: fields.patterns("expect")?,
            repeat: fields.positive("repeat", defaults::SMOKE_REPEAT)?,
            timeout: fields.duration("timeout", defaults::SMOKE_TIMEOUT)?,
        },
        "analyze" => StepKind::Analyze(analyze::parse(&fields)?),
        "approve" => StepKind::Approve {
            timeout: fields.duration("timeout", defaults::APPROVE_TIMEOUT)?,
        },
        other => return fields.fail("kind", format!("unknown kind `{other}`")),
    };
    Ok(Step { name, kind })
}
