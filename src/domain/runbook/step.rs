//! Step kinds, each described once in its own module (`step/<kind>.rs`: a struct implementing
//! [`StepDef`]), and the one list that registers them ([`for_each_step_kind!`]). The list
//! generates [`StepKind`] (a runbook step's settings), [`StepKindName`] (the stored kind) and
//! every dispatch on the kind; the engine generates its executor dispatch from the same list.
//!
//! A step mapping is read by serde into its kind's struct (`deny_unknown_fields`, defaults
//! from [`super::defaults`]), then held to the kind's [`StepDef::check`]; [`read`] reads its
//! `name` and `kind` and puts the `step 3 "down":` prefix and the line on every message.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_yaml::{Mapping, Value};

use super::{defaults, Step};
use crate::domain::duration::format_duration;
use crate::domain::names::ServiceName;
use crate::domain::yaml_line::{locate, read_node, Seg, YamlError};

/// The one registration list of step kinds, in the order of docs/reference.md#step-kinds:
/// `Variant => module::Type`, where `step/<module>.rs` holds `Type: StepDef`. Calls
/// `$callback!` with the list; [`step_kinds!`] (here) and the engine's executor dispatch are
/// its callbacks. Adding a kind is one line here (see ARCHITECTURE.md, "How to add a step
/// kind").
macro_rules! for_each_step_kind {
    ($callback:ident) => {
        $callback! {
            FreeSpace => free_space::FreeSpace,
            Snapshot => snapshot::Snapshot,
            PeersHealthy => peers_healthy::PeersHealthy,
            Plan => plan::Plan,
            Stage => stage::Stage,
            Window => window::Window,
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
pub(crate) trait StepDef: DeserializeOwned {
    /// The kind's name as written in runbooks and stored in `step.kind` (`wait_health`).
    const NAME: &'static str;
    /// One line: what the step does.
    const DOC: &'static str;
    /// The fields the kind takes besides `name` and `kind`, as messages list them (a test
    /// holds them to what serde takes).
    const FIELDS: &'static [&'static str];
    /// Whether the step changes the replica: once one has started, a failed canary with
    /// `on_failure: rollback` rolls back.
    const TOUCHES_REPLICA: bool = false;

    /// What serde cannot say about the fields read (a zero duration, an `interval` longer
    /// than its window, a blank text): the field at fault and the message.
    fn check(&self) -> Checked {
        Ok(())
    }

    /// The step's budget, fixed when it starts and persisted as its deadline.
    fn budget(&self) -> Duration;

    /// The step's evidence: what its executor stores as the step's `detail` (the runner adds
    /// `error` and `target_logs` around it, preflight `signals`), read back by the summary
    /// and the carry-over between steps.
    type Evidence: StepEvidence + serde::de::DeserializeOwned;

    /// A one-line rendering of the step's evidence; `None` when it has none.
    fn summary(evidence: &Self::Evidence) -> Option<String>;
}

/// A kind's evidence type (each kind's module): what a step may keep in its `detail`.
pub(crate) trait StepEvidence: serde::Serialize {}

impl<C: serde::Serialize> StepEvidence for snapshot::SnapshotEvidence<C> {}
impl StepEvidence for peers_healthy::PeersHealthyEvidence {}
impl StepEvidence for plan::PlanEvidence {}
impl StepEvidence for up::ComposeEvidence {}
/// A `plan`, `down` or `up` whose call did not end with a plain answer: both kinds' evidence
/// hold it (flattened).
impl StepEvidence for call::CallFailure {}
impl StepEvidence for verify_neighbours::VerifyNeighboursEvidence {}
impl StepEvidence for wait_health::WaitHealthEvidence {}
impl StepEvidence for wait_logs::WaitLogsEvidence {}
impl StepEvidence for soak::SoakEvidence {}
impl StepEvidence for smoke::SmokeEvidence {}
impl StepEvidence for analyze::AnalyzeEvidence {}
impl StepEvidence for approve::ApproveEvidence {}
impl StepEvidence for window::WindowEvidence {}
impl StepEvidence for free_space::FreeSpaceEvidence {}

/// A step's stored `detail` read as kind `K`'s evidence; `None` when it does not read as one
/// (a step that failed before it gathered any).
pub(crate) fn evidence<K: StepDef>(detail: &serde_json::Value) -> Option<K::Evidence> {
    serde::Deserialize::deserialize(detail).ok()
}

/// What [`StepDef::check`] answers: `Err((field, message))` for the field at fault.
pub(crate) type Checked = Result<(), (&'static str, String)>;

/// For an evidence key written `null` as well as left out: `Some` of its value when present
/// (with `#[serde(default)]`, absent is `None`), so `null` is written back as `null`.
pub(crate) fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

pub mod call;
pub mod signals;

/// Test support: stored evidence reads as its kind's type and writes back unchanged.
#[cfg(test)]
pub(crate) mod evidence_tests {
    use super::{evidence, StepDef, StepKindName};

    /// `base` with `more`'s keys added (both JSON objects).
    pub(crate) fn merged(base: &serde_json::Value, more: serde_json::Value) -> serde_json::Value {
        let mut d = base.clone();
        if let (Some(d), serde_json::Value::Object(more)) = (d.as_object_mut(), more) {
            d.extend(more);
        }
        d
    }

    /// Each `(detail, summary)`: `detail` (evidence as the executors store it) reads as `K`'s
    /// evidence and serialises back to the same JSON (or, for `{}`, the start of a step whose
    /// evidence has required keys, does not read), and the summary is `summary`.
    pub(crate) fn same_json_and_summary<K: StepDef>(cases: &[(serde_json::Value, Option<&str>)]) {
        let kind: StepKindName = K::NAME.parse().expect("a registered kind");
        for (stored, summary) in cases {
            match evidence::<K>(stored) {
                Some(typed) => assert_eq!(
                    &serde_json::to_value(&typed).expect("serialises"),
                    stored,
                    "{} evidence written back",
                    K::NAME
                ),
                None => assert_eq!(stored, &serde_json::json!({}), "{} reads {stored}", K::NAME),
            }
            assert_eq!(kind.summary(stored).as_deref(), *summary, "{stored}");
        }
    }
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
                    $(Self::$variant => {
                        <$ty as StepDef>::summary(&evidence::<$ty>(detail)?)
                    })+
                }
            }

            /// The fields the kind takes, as messages list them.
            #[cfg(test)]
            pub(crate) fn fields(self) -> &'static [&'static str] {
                match self {
                    $(Self::$variant => <$ty as StepDef>::FIELDS),+
                }
            }

            /// Reads the kind's fields, `node` (the step at `at` in `source` without its
            /// `name` and `kind`).
            fn read(
                self,
                source: &str,
                at: &[Seg<'_>],
                node: Mapping,
            ) -> Result<StepKind, Vec<StepError>> {
                Ok(match self {
                    $(Self::$variant => StepKind::$variant(read_kind::<$ty>(source, at, node)?)),+
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
    pub fn companions(&self) -> &[ServiceName] {
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
///
/// It is flattened into its step, where serde knows no path: its fields' errors name them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Scope {
    /// Companion services; empty means the target.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "services"
    )]
    pub services: Vec<ServiceName>,
    /// The reconcile: apply only what the dry run plans out of date (a subset of `services`),
    /// and skip the `up` when nothing is.
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "only_out_of_date"
    )]
    pub only_out_of_date: bool,
    /// `force_recreate: true` on the `up` and its dry run; only for services of the config's
    /// `force_recreate_allowed`.
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "force_recreate"
    )]
    pub force_recreate: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Reads `T`, its error naming `field`.
fn named<'de, T: serde::Deserialize<'de>, D: serde::Deserializer<'de>>(
    field: &str,
    deserializer: D,
) -> Result<T, D::Error> {
    T::deserialize(deserializer).map_err(|e| serde::de::Error::custom(format!("`{field}`: {e}")))
}

/// Companion services: compose service names ([`ServiceName`]), none twice.
fn services<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<ServiceName>, D::Error> {
    let names: Vec<String> = named("services", d)?;
    if names.is_empty() {
        return Err(serde::de::Error::custom(
            "`services` is empty: leave it out to act on the target, or name companion services",
        ));
    }
    let mut services: Vec<ServiceName> = Vec::with_capacity(names.len());
    for (i, name) in names.into_iter().enumerate() {
        let refuse =
            |why: &str| serde::de::Error::custom(format!("`services[{i}]` {name:?} {why}"));
        let service = ServiceName::parse(name.clone())
            .map_err(|e| refuse(&format!("is not a compose service name: it {}", e.why)))?;
        if services.contains(&service) {
            return Err(refuse("is listed twice"));
        }
        services.push(service);
    }
    Ok(services)
}

fn only_out_of_date<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    named("only_out_of_date", d)
}

fn force_recreate<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    named("force_recreate", d)
}

/// A `down` step's scope: `services` only (no reconcile, no recreate).
pub(crate) fn services_only<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Scope, D::Error> {
    #[derive(serde::Deserialize)]
    struct ServicesOnly {
        #[serde(default, deserialize_with = "services")]
        services: Vec<ServiceName>,
    }
    let ServicesOnly { services } = serde::Deserialize::deserialize(d)?;
    Ok(Scope {
        services,
        ..Scope::default()
    })
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

    /// `only_out_of_date` and `force_recreate` only with `services` (never on the target).
    pub(crate) fn check(&self) -> Checked {
        for (field, on) in [
            ("only_out_of_date", self.only_out_of_date),
            ("force_recreate", self.force_recreate),
        ] {
            if on && self.services.is_empty() {
                return Err((
                    field,
                    format!("`{field}: true` needs `services` (companion services): never on the target replica"),
                ));
            }
        }
        Ok(())
    }
}

/// `12 stream lines`: the evidence of a compose call (`down`, `up`).
pub(crate) fn compose_summary(evidence: &up::ComposeEvidence) -> Option<String> {
    evidence.lines.map(|n| format!("{n} stream lines"))
}

/// A step refusal: its line and message; `unknown` when a key the kind does not take.
pub(crate) struct StepError {
    pub line: Option<usize>,
    pub message: String,
    pub unknown: bool,
}

/// `Err((field, message))` for a duration `field` that must be longer than zero.
pub(crate) fn positive_duration(field: &'static str, d: Duration) -> Checked {
    if d.is_zero() {
        return Err((field, format!("`{field}` must be longer than zero")));
    }
    Ok(())
}

/// `Err((field, message))` for a count `field` that must be at least 1.
pub(crate) fn at_least_one(field: &'static str, n: u32) -> Checked {
    if n == 0 {
        return Err((
            field,
            format!("`{field}` must be a whole number of at least 1, got `0`"),
        ));
    }
    Ok(())
}

/// `Err` when `interval` is longer than `limit` (the field `limit_field`).
pub(crate) fn interval_within(interval: Duration, limit: Duration, limit_field: &str) -> Checked {
    if interval > limit {
        return Err((
            "interval",
            format!(
                "`interval` ({}) is longer than `{limit_field}` ({})",
                format_duration(interval),
                format_duration(limit)
            ),
        ));
    }
    Ok(())
}

/// Reads a step of kind `K` from `node` (at `at` in `source`), then checks it; messages
/// without the step's prefix. Every key the kind does not take is refused at once, in file
/// order, before anything else (`yaml_line::read_node`).
fn read_kind<K: StepDef>(
    source: &str,
    at: &[Seg<'_>],
    mut node: Mapping,
) -> Result<K, Vec<StepError>> {
    // A field the kind takes, left empty (`timeout:`), takes its default.
    node.retain(|key, value| {
        !(value.is_null() && key.as_str().is_some_and(|k| K::FIELDS.contains(&k)))
    });
    let kind: K = read_node(source, at, Value::Mapping(node)).map_err(|found| {
        found
            .into_iter()
            .map(|e| StepError {
                line: e.line,
                unknown: e.unknown.is_some(),
                message: shown_error::<K>(e),
            })
            .collect::<Vec<_>>()
    })?;
    kind.check().map_err(|(field, message)| {
        let mut path = at.to_vec();
        path.push(Seg::Key(field));
        vec![StepError {
            line: locate(source, &path),
            message,
            unknown: false,
        }]
    })?;
    Ok(kind)
}

/// A serde error of a `K` step's fields, naming the field.
fn shown_error<K: StepDef>(e: YamlError) -> String {
    match (e.unknown, e.path.as_str()) {
        (Some(key), "") => {
            let takes = if K::FIELDS.is_empty() {
                "no other fields".to_string()
            } else {
                K::FIELDS.join(", ")
            };
            format!(
                "unknown field `{key}` (a `{}` step takes: {takes})",
                K::NAME
            )
        }
        (_, "") => e.message,
        (_, path) => format!("`{path}`: {}", e.message),
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

pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Reads step number `index` (0-based) of the runbook `source`, `value`; every message names
/// the step and has its line.
pub(super) fn read(source: &str, index: usize, value: &Value) -> Result<Step, Vec<StepError>> {
    let number = index + 1;
    let at = [Seg::Key("steps"), Seg::Index(index)];
    let fail = |field: Option<&str>, message: String| {
        let mut path = at.to_vec();
        path.extend(field.map(Seg::Key));
        vec![StepError {
            line: locate(source, &path),
            message,
            unknown: false,
        }]
    };
    let Some(map) = value.as_mapping() else {
        return Err(fail(
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
            return Err(fail(
                Some("kind"),
                format!(
                    "step {number}: `kind` must be a string, got {}",
                    show(other)
                ),
            ))
        }
        None => {
            return Err(fail(
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
            return Err(fail(Some("name"), format!("step {number}: `name` must be 1 to 64 letters, digits, `-`, `_` or `.`, got {}", show(other))));
        }
    };
    let label = format!("step {number} \"{name}\"");
    let Ok(kind_name) = kind.parse::<StepKindName>() else {
        return Err(fail(
            Some("kind"),
            format!(
                "{label}: unknown kind `{kind}` (expected one of: {})",
                StepKind::NAMES.join(", ")
            ),
        ));
    };
    if let Some(key) = map.keys().find(|k| k.as_str().is_none()) {
        return Err(fail(
            None,
            format!("{label}: field names must be strings, got {}", show(key)),
        ));
    }
    let mut fields = map.clone();
    fields.shift_remove("name");
    fields.shift_remove("kind");
    let kind = kind_name.read(source, &at, fields).map_err(|errors| {
        errors
            .into_iter()
            .map(|e| StepError {
                message: format!("{label}: {}", e.message),
                ..e
            })
            .collect::<Vec<_>>()
    })?;
    Ok(Step { name, kind })
}
