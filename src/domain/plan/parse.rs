//! Reading a plan body (JSON or YAML) into a [`PlanSpec`], checking its shape and types only.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::{PlanError, PlanSpec, MAX_BODY_BYTES};
use crate::domain::state::OnFailure;

const FIELDS: &[&str] = &[
    "host",
    "file",
    "service",
    "tag",
    "reason",
    "runbook",
    "env",
    "require_logs",
    "on_failure",
    "replaces",
];

/// Parses a JSON plan body. A field given twice is refused (`invalid_body`), not silently
/// resolved to the last one.
pub fn parse_json(body: &[u8]) -> Result<PlanSpec, PlanError> {
    check_size(body.len())?;
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        PlanError::new(
            "invalid_body",
            None,
            format!("the plan is not valid JSON: {e}"),
        )
    })?;
    if value.is_object() {
        check_unique_keys(body).map_err(|e| {
            // A key given twice in `env` is a bad override (422); elsewhere a bad body.
            match e.split('`').nth(1).filter(|path| path.starts_with("env.")) {
                Some(path) => PlanError::new("invalid_env", Some(path), "given twice"),
                None => PlanError::new(
                    "invalid_body",
                    None,
                    format!("the plan is not valid JSON: {e}"),
                ),
            }
        })?;
    }
    let order = json_key_order(body, &value);
    from_value(value, &order)
}

/// The top-level keys of a JSON object in the order the body writes them (serde_json's map
/// sorts them): where each first appears as `"key"` in the body.
pub fn json_key_order(body: &[u8], value: &Value) -> Vec<String> {
    let Value::Object(map) = value else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(body);
    let mut keys: Vec<(usize, &String)> = map
        .keys()
        .map(|k| (text.find(&format!("\"{k}\"")).unwrap_or(usize::MAX), k))
        .collect();
    keys.sort();
    keys.into_iter().map(|(_, k)| k.clone()).collect()
}

/// Parses a YAML plan body (`Content-Type: application/yaml`, `canaryd rollout start PLAN.yaml`).
pub fn parse_yaml(body: &str) -> Result<PlanSpec, PlanError> {
    check_size(body.len())?;
    // Through serde_yaml's own Value first: it refuses duplicate keys.
    let yaml: serde_yaml::Value = serde_yaml::from_str(body).map_err(|e| {
        // `curl -d @plan.yaml` sends the file with its newlines removed.
        let flattened = !body.trim().contains('\n') && body.matches(": ").count() > 1;
        let hint = if flattened {
            " (the plan arrived on one line: `curl -d` strips newlines, send the file with `--data-binary @plan.yaml`)"
        } else {
            ""
        };
        PlanError::new(
            "invalid_body",
            None,
            format!("the plan is not valid YAML: {e}{hint}"),
        )
    })?;
    let order: Vec<String> = match &yaml {
        serde_yaml::Value::Mapping(map) => map
            .keys()
            .filter_map(|k| k.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    };
    let value = serde_json::to_value(yaml).map_err(|e| {
        PlanError::new(
            "invalid_body",
            None,
            format!("the plan is not a plain YAML mapping: {e}"),
        )
    })?;
    from_value(value, &order)
}

/// The keys of `keys` not in `fields`, in the order of `order` (the body's), any key `order`
/// lacks last.
pub fn unknown_keys<'a>(
    order: &[String],
    keys: impl Iterator<Item = &'a String>,
    fields: &[&str],
) -> Vec<String> {
    let mut unknown: Vec<&String> = keys.filter(|k| !fields.contains(&k.as_str())).collect();
    unknown.sort_by_key(|k| order.iter().position(|o| o == *k).unwrap_or(usize::MAX));
    unknown.into_iter().cloned().collect()
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

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Reads the plan object; `order` is its keys in the body's order, so that every unknown key is
/// named at once, as written.
fn from_value(value: Value, order: &[String]) -> Result<PlanSpec, PlanError> {
    let Value::Object(map) = value else {
        return Err(PlanError::new(
            "invalid_body",
            None,
            format!(
                "the plan must be an object with fields {}, got {}",
                FIELDS.join(", "),
                type_name(&value)
            ),
        ));
    };
    let unknown = unknown_keys(order, map.keys(), FIELDS);
    if let Some(first) = unknown.first() {
        let (s, names) = (if unknown.len() > 1 { "s" } else { "" }, unknown.join(", "));
        return Err(PlanError {
            code: "unknown_field",
            field: Some(first.clone()),
            message: format!(
                "{names}: unknown field{s} (expected one of: {})",
                FIELDS.join(", ")
            ),
        });
    }
    let text = |field: &str, missing: Option<&'static str>| -> Result<Option<String>, PlanError> {
        match map.get(field) {
            None | Some(Value::Null) => match missing {
                Some(code) => Err(PlanError::new(code, Some(field), "is required")),
                None => Ok(None),
            },
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Array(_)) if field == "service" => Err(PlanError::new(
                "invalid_service",
                Some(field),
                "must be one replica name, not a list: a plan rolls exactly one replica",
            )),
            Some(other) if field == "service" => Err(PlanError::new(
                "invalid_service",
                Some(field),
                format!(
                    "must be one replica name (a string), got {}",
                    type_name(other)
                ),
            )),
            Some(other) => Err(PlanError::new(
                "invalid_body",
                Some(field),
                format!(
                    "must be a string, got {} (quote it in YAML)",
                    type_name(other)
                ),
            )),
        }
    };
    let env = match map.get("env") {
        None | Some(Value::Null) => None,
        Some(Value::Object(env)) => {
            let mut out = BTreeMap::new();
            for (key, value) in env {
                let Value::String(value) = value else {
                    return Err(PlanError::new(
                        "invalid_env",
                        Some(&format!("env.{key}")),
                        format!(
                            "value must be a string, got {} (quote it in YAML)",
                            type_name(value)
                        ),
                    ));
                };
                out.insert(key.clone(), value.clone());
            }
            Some(out)
        }
        Some(other) => {
            return Err(PlanError::new(
                "invalid_body",
                Some("env"),
                format!(
                    "must be an object of KEY: value strings, got {}",
                    type_name(other)
                ),
            ))
        }
    };
    let require_logs = match map.get("require_logs") {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let Value::String(s) = item else {
                    return Err(PlanError::new(
                        "invalid_body",
                        Some(&format!("require_logs[{i}]")),
                        format!("must be a string, got {}", type_name(item)),
                    ));
                };
                out.push(s.clone());
            }
            Some(out)
        }
        Some(other) => {
            return Err(PlanError::new(
                "invalid_body",
                Some("require_logs"),
                format!("must be a list of strings, got {}", type_name(other)),
            ))
        }
    };
    let on_failure = match text("on_failure", None)? {
        None => None,
        Some(s) => Some(s.parse::<OnFailure>().map_err(|_| {
            PlanError::new(
                "invalid_on_failure",
                Some("on_failure"),
                format!("must be `rollback` or `halt`, got \"{s}\""),
            )
        })?),
    };
    let replaces = match map.get("replaces") {
        None | Some(Value::Null) => None,
        Some(v @ Value::Object(_)) => Some(serde_json::from_value(v.clone()).map_err(|e| {
            PlanError::new(
                "invalid_body",
                Some("replaces"),
                format!("must be {{service, file?, tag?}} with string values: {e}"),
            )
        })?),
        Some(other) => {
            return Err(PlanError::new(
                "invalid_body",
                Some("replaces"),
                format!(
                    "must be an object {{service, file?, tag?}}, got {}",
                    type_name(other)
                ),
            ))
        }
    };
    Ok(PlanSpec {
        replaces,
        host: text("host", Some("unknown_host"))?.unwrap_or_default(),
        file: text("file", Some("invalid_file"))?.unwrap_or_default(),
        service: text("service", Some("invalid_service"))?.unwrap_or_default(),
        tag: text("tag", Some("invalid_tag"))?.unwrap_or_default(),
        reason: text("reason", Some("missing_reason"))?.unwrap_or_default(),
        runbook: text("runbook", None)?,
        env,
        require_logs,
        on_failure,
    })
}
