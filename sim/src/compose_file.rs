//! A `docker compose` file, read far enough to reason about services: names, containers,
//! images, `depends_on`, profiles, environment and command, plus compose's `${VAR}`
//! interpolation. Pure: text in, values out.
//!
//! YAML anchors are expanded by the YAML parser; merge keys (`<<: *x`) are applied here, nested
//! ones included (serde_yaml 0.9 leaves them in place). Top-level `x-` extension keys are
//! ignored, as compose does.

use std::collections::{BTreeMap, BTreeSet};

use serde_yaml::Value;

/// Why a compose file could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ComposeFileError {
    /// The text is not YAML.
    #[error("not valid YAML: {0}")]
    Yaml(String),
    /// A merge key (`<<`) points at something that is not a mapping, or nests too deep.
    #[error("cannot apply YAML merge keys: {0}")]
    Merge(String),
    /// The document is not a mapping.
    #[error("the top level of a compose file must be a mapping")]
    NotAMapping,
    /// There is no `services` mapping.
    #[error("the compose file has no top-level `services` mapping")]
    NoServices,
    /// One service is malformed.
    #[error("service '{service}': {message}")]
    Service {
        /// The service key.
        service: String,
        /// What is wrong with it.
        message: String,
    },
}

/// The services of a compose file, by service key.
#[derive(Debug, Clone, PartialEq)]
pub struct ComposeFile {
    /// Every service the file defines, profiles or not, keyed by service name.
    pub services: BTreeMap<String, ServiceDef>,
}

/// One service, after merge keys are applied and before interpolation.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceDef {
    /// The service key.
    pub name: String,
    /// `container_name`, if set.
    pub container_name: Option<String>,
    /// `image`, if set (uninterpolated).
    pub image: Option<String>,
    /// Services this one depends on, from the list form or the map form of `depends_on`.
    pub depends_on: Vec<String>,
    /// `profiles`; a service with any profile starts only when named explicitly.
    pub profiles: Vec<String>,
    /// `environment` from the list form (`K=V`; a bare `K` gives an empty value) or the map
    /// form (scalars as text, null as empty). Values are uninterpolated.
    pub environment: BTreeMap<String, String>,
    /// `command`: a string as written, or a list joined with single spaces.
    pub command: Option<String>,
    /// The whole service mapping, merge keys applied.
    pub raw: Value,
}

/// How many nested levels of merge keys are resolved before giving up.
const MAX_MERGE_DEPTH: usize = 16;
/// How deeply `${A:-${B:-...}}` defaults may nest.
const MAX_INTERPOLATION_DEPTH: usize = 8;

/// Parses a compose file.
pub fn parse(yaml: &str) -> Result<ComposeFile, ComposeFileError> {
    let mut doc: Value =
        serde_yaml::from_str(yaml).map_err(|e| ComposeFileError::Yaml(e.to_string()))?;
    apply_all_merges(&mut doc)?;
    let top = doc.as_mapping().ok_or(ComposeFileError::NotAMapping)?;
    let services = top
        .get("services")
        .and_then(Value::as_mapping)
        .ok_or(ComposeFileError::NoServices)?;
    let mut out = BTreeMap::new();
    for (key, value) in services {
        let name = key.as_str().ok_or_else(|| ComposeFileError::Service {
            service: format!("{key:?}"),
            message: "service keys must be strings".into(),
        })?;
        if name.starts_with("x-") {
            continue;
        }
        out.insert(name.to_string(), parse_service(name, value)?);
    }
    Ok(ComposeFile { services: out })
}

/// serde_yaml's `apply_merge` resolves one level per pass: a merged-in mapping that carries
/// its own `<<` leaves that key behind. Repeat until none is left.
fn apply_all_merges(doc: &mut Value) -> Result<(), ComposeFileError> {
    for _ in 0..MAX_MERGE_DEPTH {
        if !has_merge_key(doc) {
            return Ok(());
        }
        doc.apply_merge()
            .map_err(|e| ComposeFileError::Merge(e.to_string()))?;
    }
    if has_merge_key(doc) {
        return Err(ComposeFileError::Merge(format!(
            "merge keys nested more than {MAX_MERGE_DEPTH} levels deep"
        )));
    }
    Ok(())
}

fn has_merge_key(value: &Value) -> bool {
    match value {
        Value::Mapping(m) => m.contains_key("<<") || m.values().any(has_merge_key),
        Value::Sequence(s) => s.iter().any(has_merge_key),
        Value::Tagged(t) => has_merge_key(&t.value),
        _ => false,
    }
}

fn parse_service(name: &str, value: &Value) -> Result<ServiceDef, ComposeFileError> {
    let bad = |message: String| ComposeFileError::Service {
        service: name.to_string(),
        message,
    };
    let map = value
        .as_mapping()
        .ok_or_else(|| bad("a service must be a mapping".into()))?;
    let text_field = |field: &str| -> Result<Option<String>, ComposeFileError> {
        match map.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => scalar_text(v)
                .map(Some)
                .ok_or_else(|| bad(format!("`{field}` must be a scalar"))),
        }
    };
    let depends_on = match map.get("depends_on") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Sequence(items)) => string_list(items)
            .ok_or_else(|| bad("`depends_on` list items must be strings".into()))?,
        Some(Value::Mapping(m)) => m
            .keys()
            .map(|k| k.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("`depends_on` keys must be strings".into()))?,
        Some(_) => return Err(bad("`depends_on` must be a list or a mapping".into())),
    };
    let profiles = match map.get("profiles") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Sequence(items)) => {
            string_list(items).ok_or_else(|| bad("`profiles` items must be strings".into()))?
        }
        Some(_) => return Err(bad("`profiles` must be a list".into())),
    };
    let environment = match map.get("environment") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(Value::Sequence(items)) => {
            let mut env = BTreeMap::new();
            for item in items {
                let line = scalar_text(item)
                    .ok_or_else(|| bad("`environment` list items must be `K=V` strings".into()))?;
                let (k, v) = line.split_once('=').unwrap_or((line.as_str(), ""));
                env.insert(k.to_string(), v.to_string());
            }
            env
        }
        Some(Value::Mapping(m)) => {
            let mut env = BTreeMap::new();
            for (k, v) in m {
                let k = k
                    .as_str()
                    .ok_or_else(|| bad("`environment` keys must be strings".into()))?;
                let v = scalar_text(v)
                    .ok_or_else(|| bad(format!("`environment` value of {k} must be a scalar")))?;
                env.insert(k.to_string(), v);
            }
            env
        }
        Some(_) => return Err(bad("`environment` must be a list or a mapping".into())),
    };
    let command = match map.get("command") {
        None | Some(Value::Null) => None,
        Some(Value::Sequence(items)) => Some(
            items
                .iter()
                .map(scalar_text)
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad("`command` list items must be scalars".into()))?
                .join(" "),
        ),
        Some(v) => Some(scalar_text(v).ok_or_else(|| bad("`command` must be text".into()))?),
    };
    Ok(ServiceDef {
        name: name.to_string(),
        container_name: text_field("container_name")?,
        image: text_field("image")?,
        depends_on,
        profiles,
        environment,
        command,
        raw: value.clone(),
    })
}

/// A scalar as compose would read it into a string; `None` for sequences and mappings.
fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null => Some(String::new()),
        Value::Tagged(t) => scalar_text(&t.value),
        Value::Sequence(_) | Value::Mapping(_) => None,
    }
}

fn string_list(items: &[Value]) -> Option<Vec<String>> {
    items
        .iter()
        .map(|v| v.as_str().map(str::to_string))
        .collect()
}

impl ServiceDef {
    /// The container's name: `container_name`, or the service key when unset.
    pub fn container(&self) -> &str {
        self.container_name.as_deref().unwrap_or(&self.name)
    }

    /// Whether the service starts without being named (it has no profiles).
    pub fn is_default(&self) -> bool {
        self.profiles.is_empty()
    }

    /// The environment with every value interpolated against `env`.
    pub fn interpolated_environment(
        &self,
        env: &BTreeMap<String, String>,
    ) -> BTreeMap<String, String> {
        self.environment
            .iter()
            .map(|(k, v)| (k.clone(), interpolate(v, env)))
            .collect()
    }
}

impl ComposeFile {
    /// Names of the services that start on an unscoped `up` (those without profiles), sorted.
    pub fn default_services(&self) -> Vec<&str> {
        self.services
            .values()
            .filter(|s| s.is_default())
            .map(|s| s.name.as_str())
            .collect()
    }

    /// The named services plus everything they transitively depend on. Names the file does
    /// not define are kept as given (the caller decides whether that is an error).
    pub fn dependency_closure(&self, services: &[String]) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<String> = services.to_vec();
        while let Some(name) = todo.pop() {
            if !seen.insert(name.clone()) {
                continue;
            }
            if let Some(def) = self.services.get(&name) {
                todo.extend(def.depends_on.iter().cloned());
            }
        }
        seen
    }

    /// Names of replica services (ending in `-r<digits>` with an optional letter), sorted.
    pub fn replica_services(&self) -> Vec<&str> {
        self.services
            .keys()
            .map(String::as_str)
            .filter(|n| is_replica_name(n))
            .collect()
    }
}

/// Whether a service name ends like a replica: `-r1`, `-r2`, `-r2a`.
pub fn is_replica_name(name: &str) -> bool {
    let body = name
        .strip_suffix(|c: char| c.is_ascii_lowercase())
        .unwrap_or(name);
    let without_digits = body.trim_end_matches(|c: char| c.is_ascii_digit());
    without_digits.len() < body.len() && without_digits.ends_with("-r")
}

/// Compose-style interpolation: `${VAR}`, `$VAR`, `${VAR:-default}` (unset or empty),
/// `${VAR-default}` (unset), `${VAR:+alt}` / `${VAR+alt}`, `${VAR:?msg}` / `${VAR?msg}`
/// (the value, or empty), and `$$` for a literal `$`. An unset variable without a default
/// becomes empty, as compose does (with a warning). Anything unparseable is kept as written.
pub fn interpolate(s: &str, env: &BTreeMap<String, String>) -> String {
    interpolate_at(s, env, 0)
}

fn interpolate_at(s: &str, env: &BTreeMap<String, String>, depth: usize) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner_start) = after.strip_prefix('{') {
            match matching_brace(inner_start) {
                Some(end) if depth < MAX_INTERPOLATION_DEPTH => {
                    match expand_braced(&inner_start[..end], env, depth) {
                        Some(value) => out.push_str(&value),
                        None => {
                            out.push('$');
                            out.push('{');
                            out.push_str(&inner_start[..=end]);
                        }
                    }
                    rest = &inner_start[end + 1..];
                }
                _ => {
                    out.push('$');
                    rest = after;
                }
            }
        } else {
            let name_len = var_name_len(after);
            if name_len == 0 {
                out.push('$');
            } else {
                out.push_str(env.get(&after[..name_len]).map_or("", String::as_str));
            }
            rest = &after[name_len..];
        }
    }
    out.push_str(rest);
    out
}

/// Byte index of the `}` closing a `${`, counting nested `${...}`.
fn matching_brace(s: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'$' if bytes.get(i + 1) == Some(&b'{') => {
                depth += 1;
                i += 1;
            }
            b'}' if depth == 0 => return Some(i),
            b'}' => depth -= 1,
            _ => {}
        }
        i += 1;
    }
    None
}

/// Length of a variable name at the start of `s` (`[A-Za-z_][A-Za-z0-9_]*`), 0 if none.
fn var_name_len(s: &str) -> usize {
    let mut len = 0;
    for (i, c) in s.char_indices() {
        let ok = c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit());
        if !ok {
            break;
        }
        len = i + c.len_utf8();
    }
    len
}

fn expand_braced(inner: &str, env: &BTreeMap<String, String>, depth: usize) -> Option<String> {
    let name_len = var_name_len(inner);
    if name_len == 0 {
        return None;
    }
    let (name, op) = inner.split_at(name_len);
    let value = env.get(name);
    let set_non_empty = value.is_some_and(|v| !v.is_empty());
    let nested = |text: &str| interpolate_at(text, env, depth + 1);
    let own = || value.cloned().unwrap_or_default();
    if op.is_empty() {
        return Some(own());
    }
    let result = if let Some(default) = op.strip_prefix(":-") {
        if set_non_empty {
            own()
        } else {
            nested(default)
        }
    } else if let Some(default) = op.strip_prefix('-') {
        if value.is_some() {
            own()
        } else {
            nested(default)
        }
    } else if let Some(alt) = op.strip_prefix(":+") {
        if set_non_empty {
            nested(alt)
        } else {
            String::new()
        }
    } else if let Some(alt) = op.strip_prefix('+') {
        if value.is_some() {
            nested(alt)
        } else {
            String::new()
        }
    } else if op.starts_with(":?") || op.starts_with('?') {
        own()
    } else {
        return None;
    };
    Some(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn fixture(name: &str) -> ComposeFile {
        let path = format!(
            "{}/../tests/fixtures/real-compose/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("the real fixture {path} must exist: {e}"));
        parse(&text).unwrap_or_else(|e| panic!("{path} must parse: {e}"))
    }

    #[test]
    fn interpolation_follows_compose_rules() {
        let vars = env(&[("SET", "v"), ("EMPTY", ""), ("B", "406GiB")]);
        let cases = [
            ("plain text", "plain text"),
            ("${SET}", "v"),
            ("$SET/x", "v/x"),
            ("${UNSET}", ""),
            ("${UNSET:-d}", "d"),
            ("${EMPTY:-d}", "d"),
            ("${EMPTY-d}", ""),
            ("${UNSET-d}", "d"),
            ("${SET:-d}", "v"),
            ("${SET:+alt}", "alt"),
            ("${EMPTY:+alt}", ""),
            ("${EMPTY+alt}", "alt"),
            ("${SET:?must be set}", "v"),
            ("${UNSET:-${B}}", "406GiB"),
            ("${UNSET:-${ALSO_UNSET:-650GiB}}", "650GiB"),
            ("$$HOME and $${X}", "$HOME and ${X}"),
            ("cost $5", "cost $5"),
            ("${", "${"),
            ("${}", "${}"),
            ("${1BAD}", "${1BAD}"),
            ("a${SET}b${SET}c", "avbvc"),
            ("${GLM53_HICACHE_RAM_BUDGET:-406GiB}", "406GiB"),
        ];
        for (input, want) in cases {
            assert_eq!(interpolate(input, &vars), want, "input {input:?}");
        }
    }

    #[test]
    fn replica_names_end_in_r_digits_and_an_optional_letter() {
        let cases = [
            ("model-sg-glm53-w4afp8-tp4-r1", true),
            ("model-sg-glm53-w4afp8-tp2-r2a", true),
            ("svc-r12", true),
            ("model-downloader", false),
            ("proxy-glm53", false),
            ("svc-r", false),
            ("svc-ra", false),
            ("svcr1", false),
            ("svc-r1ab", false),
        ];
        for (name, want) in cases {
            assert_eq!(is_replica_name(name), want, "{name}");
        }
    }

    const SMALL: &str = r#"
x-common: &common
  image: engine:1
  environment: &env
    A: "1"
    N: 2
x-grand: &grand
  <<: *common
  restart: unless-stopped
services:
  dl:
    image: dl
    restart: "no"
  proxy:
    image: proxy
    environment:
      - URLS=http://a-r1:8000
      - BARE
  a-r1:
    <<: *grand
    container_name: a-r1
    depends_on:
      dl:
        condition: service_completed_successfully
    command: ["serve", "--tp", 4]
  a-r2:
    <<: *common
    environment:
      <<: *env
      A: "override"
    depends_on: [dl]
    command: >
      serve --tp 2
  web:
    image: web
    depends_on: [proxy]
  check:
    image: check
    profiles: ["verification"]
    depends_on: [a-r1]
"#;

    #[test]
    fn services_are_read_with_list_and_map_forms_and_nested_merges() {
        let file = parse(SMALL).expect("parses");
        assert_eq!(
            file.services.keys().collect::<Vec<_>>(),
            ["a-r1", "a-r2", "check", "dl", "proxy", "web"]
        );
        let r1 = &file.services["a-r1"];
        assert_eq!(r1.image.as_deref(), Some("engine:1"));
        assert_eq!(r1.depends_on, ["dl"]);
        assert_eq!(r1.command.as_deref(), Some("serve --tp 4"));
        assert_eq!(r1.environment, env(&[("A", "1"), ("N", "2")]));
        assert_eq!(r1.raw["restart"].as_str(), Some("unless-stopped"));
        assert!(r1.raw.get("<<").is_none());
        let r2 = &file.services["a-r2"];
        assert_eq!(r2.environment, env(&[("A", "override"), ("N", "2")]));
        assert_eq!(r2.command.as_deref(), Some("serve --tp 2\n"));
        assert_eq!(r2.container(), "a-r2");
        assert_eq!(
            file.services["proxy"].environment,
            env(&[("BARE", ""), ("URLS", "http://a-r1:8000")])
        );
        assert_eq!(file.services["check"].profiles, ["verification"]);
    }

    #[test]
    fn helpers_answer_scope_questions() {
        let file = parse(SMALL).expect("parses");
        assert_eq!(
            file.default_services(),
            ["a-r1", "a-r2", "dl", "proxy", "web"]
        );
        assert_eq!(file.replica_services(), ["a-r1", "a-r2"]);
        let closure = |names: &[&str]| {
            let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
            file.dependency_closure(&names)
                .into_iter()
                .collect::<Vec<_>>()
        };
        assert_eq!(closure(&["a-r2"]), ["a-r2", "dl"]);
        assert_eq!(closure(&["check"]), ["a-r1", "check", "dl"]);
        assert_eq!(closure(&["web"]), ["proxy", "web"]);
        assert_eq!(closure(&["nope"]), ["nope"]);
        assert!(closure(&[]).is_empty());
    }

    #[test]
    fn malformed_files_are_refused_with_a_reason() {
        type Check = fn(&ComposeFileError) -> bool;
        let cases: [(&str, Check); 6] = [
            ("services: [", |e| matches!(e, ComposeFileError::Yaml(_))),
            ("- a\n- b\n", |e| *e == ComposeFileError::NotAMapping),
            ("version: '3'\n", |e| *e == ComposeFileError::NoServices),
            (
                "services:\n  a: 3\n",
                |e| matches!(e, ComposeFileError::Service { service, .. } if service == "a"),
            ),
            ("services:\n  a:\n    depends_on: 3\n", |e| {
                matches!(e, ComposeFileError::Service { .. })
            }),
            ("x: &x 1\nservices:\n  a:\n    <<: *x\n", |e| {
                matches!(e, ComposeFileError::Merge(_))
            }),
        ];
        for (text, check) in cases {
            let err = parse(text).expect_err(text);
            assert!(check(&err), "{text:?} gave {err:?}");
        }
    }

    #[test]
    fn the_real_glm53_long_context_file_has_two_tp4_replicas_behind_the_downloader() {
        let file = fixture("GLM-5.3-Flash-SGL-TP4-W4AFP8-LongContext.yaml");
        for name in [
            "model-sg-glm53-w4afp8-tp4-r1",
            "model-sg-glm53-w4afp8-tp4-r2",
        ] {
            let svc = &file.services[name];
            assert_eq!(svc.container(), name);
            assert_eq!(svc.depends_on, ["model-downloader"]);
            assert!(svc.is_default());
            let command = svc.command.as_deref().expect("engines have a command");
            assert!(command.contains("--tp-size 4"), "{name}: merged command");
            assert!(svc.image.as_deref().is_some_and(|i| i.contains("sglang")));
        }
        let none = BTreeMap::new();
        let budget = |name: &str| {
            file.services[name].interpolated_environment(&none)["SGLANG_HICACHE_RAM_BUDGET"].clone()
        };
        assert_eq!(budget("model-sg-glm53-w4afp8-tp4-r1"), "406GiB");
        assert_eq!(budget("model-sg-glm53-w4afp8-tp4-r2"), "650GiB");
        assert_eq!(
            file.replica_services(),
            [
                "model-sg-glm53-w4afp8-tp2-r2a",
                "model-sg-glm53-w4afp8-tp2-r2b",
                "model-sg-glm53-w4afp8-tp4-r1",
                "model-sg-glm53-w4afp8-tp4-r2",
            ]
        );
        let defaults = file.default_services();
        for dormant in ["hf-cleanup", "glm53-perception-check", "glm53-soak-relay"] {
            assert!(file.services.contains_key(dormant));
            assert!(!defaults.contains(&dormant), "{dormant} has a profile");
        }
        assert!(!file.services.keys().any(|k| k.starts_with("x-")));
        let proxy = &file.services["proxy-glm53"];
        assert!(proxy
            .image
            .as_deref()
            .is_some_and(|i| i.starts_with("nearaidev/vllm-proxy-rs@")));
        assert_eq!(
            proxy.raw["runtime"].as_str(),
            Some("nvidia"),
            "nested merge applied"
        );
        assert!(
            proxy.environment["VLLM_BACKEND_URLS"].contains("model-sg-glm53-w4afp8-tp4-r2:8000")
        );
        let scope = file.dependency_closure(&["model-sg-glm53-w4afp8-tp4-r2".to_string()]);
        assert_eq!(
            scope.into_iter().collect::<Vec<_>>(),
            ["model-downloader", "model-sg-glm53-w4afp8-tp4-r2"]
        );
        let nginx = file.dependency_closure(&["nginx".to_string()]);
        assert_eq!(
            nginx.into_iter().collect::<Vec<_>>(),
            ["nginx", "proxy-glm53"]
        );
    }

    #[test]
    fn the_real_glm52_file_has_two_tp4_replicas_with_map_environments() {
        let file = fixture("GLM-5.2-W4AFP8-SGL-2xTP4.yaml");
        assert_eq!(
            file.replica_services(),
            ["model-sg-glm52-w4a-tp4-r1", "model-sg-glm52-w4a-tp4-r2"]
        );
        for name in file.replica_services() {
            let svc = &file.services[name];
            assert_eq!(svc.container(), name);
            assert_eq!(svc.depends_on, ["model-downloader"]);
            assert!(svc.command.as_deref().is_some_and(|c| c.contains("--tp 4")));
            assert_eq!(svc.environment["OPENBLAS_L2_SIZE"], "2097152");
            assert_eq!(svc.raw["runtime"].as_str(), Some("nvidia"));
        }
        let downloader = &file.services["model-downloader"];
        assert_eq!(downloader.raw["restart"].as_str(), Some("no"));
        assert!(downloader
            .image
            .as_deref()
            .is_some_and(|i| i.starts_with("ghcr.io/astral-sh/uv")));
        assert!(file.services["proxy-glm52"].raw.get("<<").is_none());
        assert_eq!(
            file.default_services().len(),
            file.services.len(),
            "no profiles"
        );
    }
}
