//! Step kinds, each described once in its own module (`step/<kind>.rs`: a struct implementing
//! [`StepDef`]), and the one list that registers them ([`for_each_step_kind!`]). The list
//! generates [`StepKind`] (a runbook step's settings), [`StepKindName`] (the stored kind) and
//! every dispatch on the kind; the engine generates its executor dispatch from the same list.
//!
//! A step mapping is turned into a [`Step`] by hand rather than with serde so that every
//! message names the step (`step 3 "down": unknown field `interval` (a `down` step takes:
//! timeout)`) and the field, which the caller turns into a line number.

use std::time::Duration;

use serde_yaml::{Mapping, Value};

use super::{defaults, Step};
use crate::domain::duration::{format_duration, parse_duration};
use crate::domain::pattern::LogPattern;

/// The one registration list of step kinds, in the order of docs/reference.md#step-kinds:
/// `Variant => module::Type`, where `step/<module>.rs` holds `Type: StepDef`. Calls
/// `$callback!` with the list; [`step_kinds!`] (here) and the engine's executor dispatch are
/// its callbacks. Adding a kind is one line here (see ARCHITECTURE.md, "How to add a step
/// kind").
macro_rules! for_each_step_kind {
    ($callback:ident) => {
        $callback! {
            Snapshot => snapshot::Snapshot,
            PeersHealthy => peers_healthy::PeersHealthy,
            Plan => plan::Plan,
            Down => down::Down,
            Up => up::Up,
            VerifyNeighbours => verify_neighbours::VerifyNeighbours,
            WaitHealth => wait_health::WaitHealth,
            WaitLogs => wait_logs::WaitLogs,
            Soak => soak::Soak,
            Smoke => smoke::Smoke,
            Analyze => analyze::Analyze,
            Approve => approve::Approve,
        }
    };
}
pub(crate) use for_each_step_kind;

/// What a step kind is, said once: its name, settings, defaults and checks, its budget, and
/// how its evidence reads.
pub(crate) trait StepDef: Sized {
    /// The kind's name as written in runbooks and stored in `step.kind` (`wait_health`).
    const NAME: &'static str;
    /// One line: what the step does.
    const DOC: &'static str;
    /// The fields the kind takes besides `name` and `kind`.
    const FIELDS: &'static [&'static str];
    /// Whether the step changes the replica: once one has started, a failed canary with
    /// `on_failure: rollback` rolls back.
    const TOUCHES_REPLICA: bool = false;

    /// Reads the kind's fields (already checked against [`StepDef::FIELDS`]), with defaults.
    fn parse(fields: &Fields<'_>) -> Result<Self, StepError>;

    /// The step's budget, fixed when it starts and persisted as its deadline.
    fn budget(&self) -> Duration;

    /// A one-line rendering of the step's evidence (`detail`); `None` when it has none.
    fn summary(detail: &serde_json::Value) -> Option<String>;
}

/// The budget of a step that should take seconds (a dry run, a snapshot): it bounds 409
/// retries.
pub(crate) const QUICK_STEP_BUDGET: Duration = Duration::from_secs(300);

/// Generates, from [`for_each_step_kind!`]: the kinds' modules, [`StepKind`], [`StepKindName`]
/// and their dispatch.
macro_rules! step_kinds {
    ($($variant:ident => $module:ident :: $ty:ident),+ $(,)?) => {
        $(pub mod $module;)+
        $(pub use $module::$ty;)+

        /// The closed set of step kinds (docs/reference.md#step-kinds) and their settings.
        /// Serialises in the runbook file's shape (`{kind: down, timeout: 10m}`), so a rollout
        /// can store the runbook it ran.
        #[derive(Debug, Clone, PartialEq, ::serde::Serialize, ::serde::Deserialize)]
        #[serde(tag = "kind", rename_all = "snake_case")]
        pub enum StepKind {
            $(
                #[doc = concat!("See [`", stringify!($ty), "`].")]
                $variant($ty),
            )+
        }

        impl StepKind {
            /// Every kind's name, in the order of docs/reference.md#step-kinds.
            pub const NAMES: &'static [&'static str] = &[$(<$ty as StepDef>::NAME),+];

            /// The kind without its settings.
            pub fn kind_name(&self) -> StepKindName {
                match self {
                    $(Self::$variant(_) => StepKindName::$variant),+
                }
            }

            /// The kind's name as written in runbooks (`wait_health`).
            pub fn name(&self) -> &'static str {
                self.kind_name().as_str()
            }

            /// Whether the step changes the replica (`down`, `up`): once one has started, a
            /// failed canary with `on_failure: rollback` rolls back.
            pub fn touches_replica(&self) -> bool {
                self.kind_name().touches_replica()
            }

            /// The step's budget, fixed when it starts and persisted as its deadline.
            pub fn budget(&self) -> Duration {
                match self {
                    $(Self::$variant(k) => k.budget()),+
                }
            }
        }

        /// A step kind without its settings: what `step.kind` stores (its CHECK lists `ALL`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum StepKindName {
            $(
                #[doc = concat!("See [`", stringify!($ty), "`].")]
                $variant,
            )+
        }

        impl StepKindName {
            /// Every kind, in the order of docs/reference.md#step-kinds.
            pub const ALL: &'static [StepKindName] = &[$(StepKindName::$variant),+];

            /// The stable name (runbooks, database, API).
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => <$ty as StepDef>::NAME),+
                }
            }

            /// One line: what the step does.
            pub fn doc(self) -> &'static str {
                match self {
                    $(Self::$variant => <$ty as StepDef>::DOC),+
                }
            }

            /// Whether the step changes the replica.
            pub fn touches_replica(self) -> bool {
                match self {
                    $(Self::$variant => <$ty as StepDef>::TOUCHES_REPLICA),+
                }
            }

            /// A one-line rendering of a step's evidence; `None` when it has none.
            pub fn summary(self, detail: &serde_json::Value) -> Option<String> {
                match self {
                    $(Self::$variant => <$ty as StepDef>::summary(detail)),+
                }
            }

            fn fields(self) -> &'static [&'static str] {
                match self {
                    $(Self::$variant => <$ty as StepDef>::FIELDS),+
                }
            }

            fn parse(self, fields: &Fields<'_>) -> Result<StepKind, StepError> {
                Ok(match self {
                    $(Self::$variant => StepKind::$variant(<$ty as StepDef>::parse(fields)?)),+
                })
            }
        }
    };
}

for_each_step_kind!(step_kinds);

impl StepKind {
    /// The scope of a `plan`, `down` or `up` step; `None` for the other kinds.
    pub fn scope(&self) -> Option<&Scope> {
        match self {
            StepKind::Plan(p) => Some(&p.scope),
            StepKind::Down(d) => Some(&d.scope),
            StepKind::Up(u) => Some(&u.scope),
            _ => None,
        }
    }

    /// The companion services the step names (empty for the target's steps and other kinds).
    pub fn companions(&self) -> &[String] {
        self.scope().map(|s| s.services.as_slice()).unwrap_or(&[])
    }
}

impl std::fmt::Display for StepKindName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for StepKindName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .iter()
            .copied()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown step kind `{s}` (expected one of: {})",
                    StepKind::NAMES.join(", ")
                )
            })
    }
}

impl serde::Serialize for StepKindName {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for StepKindName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// What a `plan`, `down` or `up` step acts on: the rollout's target (no `services`), or the
/// runbook's fixed list of companion services of the compose file (proxy, collector,
/// verification relay, perception check; never a configured replica, which the config's
/// runbook check refuses). Safety rule 15: every compose call carries an explicit non-empty list
/// fixed by the step.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Scope {
    /// Companion services; empty means the target.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<String>,
    /// The reconcile: apply only what the dry run plans out of date (a subset of `services`),
    /// and skip the `up` when nothing is.
    #[serde(default, skip_serializing_if = "is_false")]
    pub only_out_of_date: bool,
    /// `force_recreate: true` on the `up` and its dry run; only for services of the config's
    /// `force_recreate_allowed`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub force_recreate: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Scope {
    /// Whether the step acts on companion services rather than the target.
    pub fn is_companion(&self) -> bool {
        !self.services.is_empty()
    }

    /// `target` or the list, for messages.
    pub fn shown(&self) -> String {
        if self.services.is_empty() {
            "the target".into()
        } else {
            format!("services [{}]", self.services.join(", "))
        }
    }
}

/// `12 stream lines`: the evidence of a compose call (`down`, `up`).
pub(crate) fn compose_summary(detail: &serde_json::Value) -> Option<String> {
    shown(&detail["lines"]).map(|n| format!("{n} stream lines"))
}

/// A JSON value as shown to a person: strings without quotes, lists as `a, b`; `None` for a
/// missing value, so a summary is left out rather than showing `null`.
pub(crate) fn shown(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(items) => Some(
            items
                .iter()
                .map(|i| shown(i).unwrap_or_default())
                .collect::<Vec<_>>()
                .join(", "),
        ),
        other => Some(other.to_string()),
    }
}

/// A step refusal: the message (already naming the step) and the field it is about.
pub(crate) struct StepError {
    pub field: Option<String>,
    pub message: String,
}

/// Reads the fields of one step mapping, with the step's label for messages.
pub(crate) struct Fields<'a> {
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

    /// An optional compose service name.
    fn service(&self, field: &str) -> Result<Option<String>, StepError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::String(name)) if valid_name(name) => Ok(Some(name.clone())),
            Some(other) => self.fail(
                field,
                format!(
                    "`{field}` must be one compose service name, got {}",
                    show(other)
                ),
            ),
        }
    }

    fn flag(&self, field: &str) -> Result<bool, StepError> {
        match self.get(field) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => self.fail(
                field,
                format!("`{field}` must be `true` or `false`, got {}", show(other)),
            ),
        }
    }

    /// The step's [`Scope`]: `services` (compose service names, no duplicates) and, when
    /// `flags`, `only_out_of_date` and `force_recreate`, which need `services` (never the
    /// target).
    fn scope(&self, flags: bool) -> Result<Scope, StepError> {
        let services = self.strings("services")?;
        if self.get("services").is_some() && services.is_empty() {
            return self.fail(
                "services",
                "`services` is empty: leave it out to act on the target, or name companion services",
            );
        }
        for (i, name) in services.iter().enumerate() {
            if !valid_name(name) {
                return self.fail(
                    "services",
                    format!("`services[{i}]` {name:?} is not a compose service name"),
                );
            }
            if services[..i].contains(name) {
                return self.fail(
                    "services",
                    format!("`services[{i}]` {name:?} is listed twice"),
                );
            }
        }
        let (only_out_of_date, force_recreate) = if flags {
            (self.flag("only_out_of_date")?, self.flag("force_recreate")?)
        } else {
            (false, false)
        };
        for (field, on) in [
            ("only_out_of_date", only_out_of_date),
            ("force_recreate", force_recreate),
        ] {
            if on && services.is_empty() {
                return self.fail(
                    field,
                    format!("`{field}: true` needs `services` (companion services): never on the target replica"),
                );
            }
        }
        Ok(Scope {
            services,
            only_out_of_date,
            force_recreate,
        })
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
    let kind_name = match kind.parse::<StepKindName>() {
        Ok(kind_name) => kind_name,
        Err(_) => {
            return fields.fail(
                "kind",
                format!(
                    "unknown kind `{kind}` (expected one of: {})",
                    StepKind::NAMES.join(", ")
                ),
            )
        }
    };
    if let Some(key) = map.keys().find(|k| k.as_str().is_none()) {
        return Err(plain(
            None,
            format!(
                "{}: field names must be strings, got {}",
                fields.label,
                show(key)
            ),
        ));
    }
    if let Some(unknown) = unknown_fields(index, value).into_iter().next() {
        return Err(unknown);
    }
    let kind = kind_name.parse(&fields)?;
    Ok(Step { name, kind })
}

/// Every key of step number `index` (0-based) that its kind does not take, in file order, each
/// a refusal of its own. Empty when the step is not a mapping of a known `kind`: `from_value`
/// says what is wrong with it then.
pub(super) fn unknown_fields(index: usize, value: &Value) -> Vec<StepError> {
    let Some(map) = value.as_mapping() else {
        return Vec::new();
    };
    let Some(kind) = map.get("kind").and_then(Value::as_str) else {
        return Vec::new();
    };
    let Ok(kind_name) = kind.parse::<StepKindName>() else {
        return Vec::new();
    };
    let name = map.get("name").and_then(Value::as_str).unwrap_or(kind);
    let allowed = kind_name.fields();
    let takes = if allowed.is_empty() {
        "no other fields".to_string()
    } else {
        allowed.join(", ")
    };
    map.keys()
        .filter_map(Value::as_str)
        .filter(|key| *key != "name" && *key != "kind" && !allowed.contains(key))
        .map(|key| StepError {
            field: Some(key.to_string()),
            message: format!(
                "step {} \"{name}\": unknown field `{key}` (a `{kind}` step takes: {takes})",
                index + 1
            ),
        })
        .collect()
}
