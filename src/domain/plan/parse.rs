//! Reading a plan body (JSON or YAML) into a [`PlanSpec`] with serde, checking its shape and
//! types only: every refusal keeps its code and the field at fault.

use std::collections::BTreeSet;

use serde_yaml::Value as Doc;

use super::{PlanError, PlanSpec, MAX_BODY_BYTES};
use crate::domain::unknown_keys::refused_keys;
use crate::domain::yaml_line::read;

/// Parses a JSON plan body. A field given twice is refused (`invalid_body`), not silently
/// resolved to the last one.
pub fn parse_json(body: &[u8]) -> Result<PlanSpec, PlanError> {
    check_size(body.len())?;
    let not_json = |e: &dyn std::fmt::Display| {
        PlanError::new(
            "invalid_body",
            None,
            format!("the plan is not valid JSON: {e}"),
        )
    };
    check_unique_keys(body).map_err(|e| {
        // A key given twice in `env` is a bad override (422); elsewhere a bad body.
        match e.split('`').nth(1).filter(|path| path.starts_with("env.")) {
            Some(path) => PlanError::new("invalid_env", Some(path), "given twice"),
            None => not_json(&e),
        }
    })?;
    // Read as a YAML value, which keeps the keys in the body's order (serde_json sorts them).
    let doc: Doc = serde_json::from_slice(body).map_err(|e| not_json(&e))?;
    from_doc(doc)
}

/// Parses a YAML plan body (`Content-Type: application/yaml`, `canaryd rollout start PLAN.yaml`).
pub fn parse_yaml(body: &str) -> Result<PlanSpec, PlanError> {
    check_size(body.len())?;
    // Through serde_yaml's own value first: it refuses duplicate keys.
    let doc: Doc = read(body).map_err(|errors| {
        // `curl -d @plan.yaml` sends the file with its newlines removed.
        let flattened = !body.trim().contains('\n') && body.matches(": ").count() > 1;
        let hint = if flattened {
            " (the plan arrived on one line: `curl -d` strips newlines, send the file with `--data-binary @plan.yaml`)"
        } else {
            ""
        };
        let e = &errors[0];
        let at = e.line.map(|l| format!(" at line {l}")).unwrap_or_default();
        PlanError::new(
            "invalid_body",
            None,
            format!("the plan is not valid YAML: {}{at}{hint}", e.message),
        )
    })?;
    from_doc(doc)
}

/// Refuses a JSON document in which any object, at any depth, has a key twice (serde_json
/// keeps the last one silently); the message names the key and where it is (`env.TOKEN`).
pub fn check_unique_keys(body: &[u8]) -> Result<(), String> {
    let mut de = serde_json::Deserializer::from_slice(body);
    serde::de::DeserializeSeed::deserialize(UniqueKeys(String::new()), &mut de)
        .map_err(|e| e.to_string())
}

/// A JSON value whose objects are checked for duplicate keys; the path of the value so far.
struct UniqueKeys(String);

impl<'de> serde::de::DeserializeSeed<'de> for UniqueKeys {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for UniqueKeys {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = BTreeSet::new();
        while let Some(key) = map.next_key::<String>()? {
            let path = if self.0.is_empty() {
                key.clone()
            } else {
                format!("{}.{key}", self.0)
            };
            if !seen.insert(key) {
                return Err(serde::de::Error::custom(format!(
                    "duplicate field `{path}`"
                )));
            }
            map.next_value_seed(UniqueKeys(path))?;
        }
        Ok(())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        while seq
            .next_element_seed(UniqueKeys(format!("{}[{i}]", self.0)))?
            .is_some()
        {
            i += 1;
        }
        Ok(())
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

fn check_size(len: usize) -> Result<(), PlanError> {
    if len > MAX_BODY_BYTES {
        return Err(PlanError::new(
            "body_too_large",
            None,
            format!("the plan is {len} bytes; the limit is {MAX_BODY_BYTES}"),
        ));
    }
    Ok(())
}

/// Reads the plan mapping: every unknown key named at once, in the body's order; an empty
/// field (`runbook: null`) is an absent one.
fn from_doc(mut doc: Doc) -> Result<PlanSpec, PlanError> {
    let Doc::Mapping(map) = &mut doc else {
        let got = match doc {
            Doc::Null => "null",
            Doc::Sequence(_) => "a list",
            _ => "a single value",
        };
        return Err(PlanError::new(
            "invalid_body",
            None,
            format!("the plan must be an object with fields host, file, service, tag, reason, ..., got {got}"),
        ));
    };
    let unknown: Vec<_> = refused_keys::<PlanSpec>(Doc::Mapping(map.clone()))
        .into_iter()
        .filter(|r| r.parent_shown().is_empty())
        .collect();
    if let Some(first) = unknown.first() {
        let names: Vec<&str> = unknown.iter().map(|r| r.key.as_str()).collect();
        let s = if names.len() > 1 { "s" } else { "" };
        // serde's "unknown field `x`, expected one of `host`, ...": what it expects.
        let expected = first.message.split_once(", ").map_or("", |(_, e)| e);
        return Err(PlanError {
            code: "unknown_field",
            field: Some(first.key.clone()),
            message: format!("{}: unknown field{s} ({expected})", names.join(", ")),
        });
    }
    map.retain(|_, v| !v.is_null());
    serde_path_to_error::deserialize(doc).map_err(|e| {
        let path = e.path().to_string();
        refusal(&path, e.into_inner().to_string())
    })
}

/// The code and field of serde's `message` about the plan's `path` (`.` for the plan itself).
fn refusal(path: &str, message: String) -> PlanError {
    if path == "." {
        let missing = message.strip_prefix("missing field `");
        return match missing.and_then(|rest| rest.split('`').next()) {
            Some(field) => {
                let code = match field {
                    "host" => "unknown_host",
                    "file" => "invalid_file",
                    "service" => "invalid_service",
                    "tag" => "invalid_tag",
                    "reason" => "missing_reason",
                    _ => "invalid_body",
                };
                PlanError::new(code, Some(field), "is required")
            }
            None => PlanError::new("invalid_body", None, message),
        };
    }
    let (code, field) = match path.split(['.', '[']).next().unwrap_or_default() {
        "service" => ("invalid_service", path),
        "env" if path != "env" => ("invalid_env", path),
        "on_failure" => ("invalid_on_failure", path),
        "replaces" => ("invalid_body", "replaces"),
        _ => ("invalid_body", path),
    };
    let scalar = ["integer", "floating point", "boolean"]
        .iter()
        .any(|t| message.starts_with(&format!("invalid type: {t}")));
    let hint = if scalar && message.ends_with("expected a string") {
        " (quote it in YAML)"
    } else if field == "service" && message.starts_with("invalid type: sequence") {
        " (one replica name, not a list: a plan rolls exactly one replica)"
    } else {
        ""
    };
    PlanError::new(code, Some(field), format!("{message}{hint}"))
}
