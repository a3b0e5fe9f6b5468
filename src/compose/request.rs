//! What the engine asks compose-manager to do, and the only bodies the client can send.
//!
//! The safety rules of docs/safety.md live in the shapes here: a compose body's `services` is a
//! [`Services`] (a non-empty list: the target alone, or a runbook step's companion services,
//! rule 15), `force_recreate` only through a [`ForceRecreate`] (which exists only for services
//! of the config's `force_recreate_allowed`), always the full `env`, and `dry_run` only when
//! built by [`ComposeBody::dry_run`]. Every field is checked before a request exists. `Debug`
//! prints env keys, never values.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use super::error::ComposeError;
use crate::domain::names::{ComposeFile, ServiceName, Tag};

/// The services of one compose call: a list that is never empty and has no duplicates, so no
/// call can be unscoped. The target's calls carry [`Services::one`]; a runbook's companion step
/// carries its fixed list ([`Services::list`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Services(Vec<ServiceName>);

impl Services {
    /// The one service of a target's call.
    pub fn one(service: ServiceName) -> Self {
        Services(vec![service])
    }

    /// A fixed list of services (a companion step's): refused when empty or with a duplicate.
    pub fn list(services: Vec<ServiceName>) -> Result<Self, ComposeError> {
        if services.is_empty() {
            return Err(refuse(
                "services is empty: refusing an unscoped compose call".into(),
            ));
        }
        for (i, name) in services.iter().enumerate() {
            if services[..i].contains(name) {
                return Err(refuse(format!("service {name:?} is listed twice")));
            }
        }
        Ok(Services(services))
    }

    /// The names, in the step's order.
    pub fn names(&self) -> &[ServiceName] {
        &self.0
    }
}

/// Permission to send `force_recreate: true`: built only by [`ForceRecreate::allowed`], for
/// services that are all in the config's `force_recreate_allowed` (never a replica).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForceRecreate(());

impl ForceRecreate {
    /// `Some` when every one of `services` is in `allowed`; the error names the others.
    pub fn allowed(services: &Services, allowed: &[String]) -> Result<Self, ComposeError> {
        let others: Vec<&ServiceName> = services
            .names()
            .iter()
            .filter(|s| !allowed.iter().any(|a| a == s.as_str()))
            .collect();
        if others.is_empty() {
            Ok(ForceRecreate(()))
        } else {
            Err(refuse(format!(
                "force_recreate refused: {others:?} not in force_recreate_allowed {allowed:?}"
            )))
        }
    }
}

/// A scoped compose call: what `up`, its dry run and `down` send. The same value serves both
/// calls of a rollout's target (same tag, file, service and env), so what is taken down is what
/// is brought up.
#[derive(Clone, PartialEq, Eq)]
pub struct ComposeRequest {
    /// Git ref of the compose repo, e.g. `v0.0.452` (compose-manager checks it, including its
    /// age, on `down` too).
    pub tag: Tag,
    /// Compose file path in the repo, e.g. `prod/GLM-5.3-Flash-SGL-TP4-W4AFP8-LongContext.yaml`.
    pub file: ComposeFile,
    /// The services to bring up or take down: the target alone or a step's companions.
    pub services: Services,
    /// The host's full env map merged with the plan's overrides. Values are secret.
    pub env: BTreeMap<String, String>,
    /// `force_recreate: true` on `up` and its dry run (ignored by `down`), only for services of
    /// the config's `force_recreate_allowed`.
    pub force_recreate: Option<ForceRecreate>,
}

/// The last `tail` log lines of one service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogsRequest {
    /// Compose file path in the repo.
    pub file: ComposeFile,
    /// The one compose service to read.
    pub service: ServiceName,
    /// How many lines from the end.
    pub tail: u32,
}

impl fmt::Debug for ComposeRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ComposeRequest")
            .field("tag", &self.tag)
            .field("file", &self.file)
            .field("services", &self.services.names())
            .field("env_keys", &self.env.keys().collect::<Vec<_>>())
            .field("force_recreate", &self.force_recreate.is_some())
            .finish()
    }
}

/// Body of `compose/up` and `compose/down`. Deliberately not `Debug`: it holds env values.
#[derive(Serialize)]
pub(crate) struct ComposeBody<'a> {
    tag: &'a str,
    file: &'a str,
    services: &'a [ServiceName],
    env: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "is_false")]
    force_recreate: bool,
    #[serde(skip_serializing_if = "is_false")]
    dry_run: bool,
    #[serde(skip_serializing_if = "is_false")]
    materialize_only: bool,
}

impl<'a> ComposeBody<'a> {
    /// A real `compose/up`: never carries `dry_run`.
    pub(crate) fn up(req: &'a ComposeRequest) -> Result<Self, ComposeError> {
        Self::checked(req, false, req.force_recreate.is_some())
    }

    /// A `compose/up` with `"dry_run": true` (and the up's `force_recreate`, so the dry run
    /// sees the identical payload).
    pub(crate) fn dry_run(req: &'a ComposeRequest) -> Result<Self, ComposeError> {
        Self::checked(req, true, req.force_recreate.is_some())
    }

    /// A scoped `compose/down` (never `volumes`, `dry_run` nor `force_recreate`).
    pub(crate) fn down(req: &'a ComposeRequest) -> Result<Self, ComposeError> {
        Self::checked(req, false, false)
    }

    /// A `compose/up` with `"materialize_only": true`: pull and build the scoped services,
    /// run nothing (never `dry_run` nor `force_recreate`; never an empty list, which would
    /// pull every service of the file: [`Services`] is never empty).
    pub(crate) fn stage(req: &'a ComposeRequest) -> Result<Self, ComposeError> {
        let mut body = Self::checked(req, false, false)?;
        body.materialize_only = true;
        Ok(body)
    }

    fn checked(
        req: &'a ComposeRequest,
        dry_run: bool,
        force_recreate: bool,
    ) -> Result<Self, ComposeError> {
        check_env(&req.env)?;
        Ok(Self {
            tag: req.tag.as_str(),
            file: req.file.as_str(),
            services: req.services.names(),
            env: &req.env,
            force_recreate,
            dry_run,
            materialize_only: false,
        })
    }

    /// The services, joined with `,` (for logs).
    pub(crate) fn services_shown(&self) -> String {
        self.services.join(",")
    }
}

/// Body of `compose/logs`.
#[derive(Debug, Serialize)]
pub(crate) struct LogsBody<'a> {
    file: &'a str,
    tail: u32,
    services: [&'a str; 1],
}

impl<'a> LogsBody<'a> {
    pub(crate) fn new(req: &'a LogsRequest) -> Result<Self, ComposeError> {
        Ok(Self {
            file: req.file.as_str(),
            tail: req.tail,
            services: [req.service.as_str()],
        })
    }
}

fn is_false(value: &bool) -> bool {
    !*value
}

fn refuse(message: String) -> ComposeError {
    ComposeError::InvalidRequest { message }
}

/// Keys `[A-Za-z_][A-Za-z0-9_]*`, values without newlines (as compose-manager checks too).
fn check_env(env: &BTreeMap<String, String>) -> Result<(), ComposeError> {
    for (key, value) in env {
        let mut chars = key.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(refuse(format!(
                "invalid env var key {key:?} (must match [A-Za-z_][A-Za-z0-9_]*)"
            )));
        }
        if value.contains(['\n', '\r']) {
            return Err(refuse(format!(
                "env var {key:?} value must not contain newlines"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn name(s: &str) -> ServiceName {
        s.parse().expect("a service name")
    }

    fn up(service: &str) -> ComposeRequest {
        ComposeRequest {
            tag: "v0.0.452".parse().expect("a tag"),
            file: "prod/a.yaml".parse().expect("a file"),
            services: Services::one(name(service)),
            env: BTreeMap::from([("HF_TOKEN".to_owned(), "hf_secret".to_owned())]),
            force_recreate: None,
        }
    }

    #[test]
    fn companion_lists_are_non_empty_and_force_recreate_needs_every_service_allowed() {
        assert!(Services::list(vec![]).is_err());
        assert!(Services::list(vec![name("a"), name("a")]).is_err());
        let both = Services::list(vec![name("proxy-glm53"), name("otelcol-contrib")]).expect("ok");
        let allowed = vec!["otelcol-contrib".to_string()];
        assert!(ForceRecreate::allowed(&both, &allowed).is_err());
        let otel = Services::list(vec![name("otelcol-contrib")]).expect("ok");
        let force = ForceRecreate::allowed(&otel, &allowed).expect("allowed");
        let mut req = up("x");
        req.services = both;
        let body = serde_json::to_value(ComposeBody::up(&req).expect("valid")).expect("json");
        assert_eq!(body["services"], json!(["proxy-glm53", "otelcol-contrib"]));
        assert!(body.get("force_recreate").is_none());
        req.services = otel;
        req.force_recreate = Some(force);
        let body = serde_json::to_value(ComposeBody::dry_run(&req).expect("valid")).expect("json");
        assert_eq!(body["services"], json!(["otelcol-contrib"]));
        assert_eq!(body["force_recreate"], json!(true));
        assert_eq!(body["dry_run"], json!(true));
        let down = serde_json::to_value(ComposeBody::down(&req).expect("valid")).expect("json");
        assert!(down.get("force_recreate").is_none());
    }

    #[test]
    fn a_compose_body_names_exactly_one_service_and_never_force_recreate() {
        let req = up("model-sg-glm53-w4afp8-tp4-r2");
        let body = serde_json::to_value(ComposeBody::up(&req).expect("valid")).expect("json");
        assert_eq!(
            body,
            json!({"tag": "v0.0.452", "file": "prod/a.yaml",
                   "services": ["model-sg-glm53-w4afp8-tp4-r2"],
                   "env": {"HF_TOKEN": "hf_secret"}})
        );
        let dry = serde_json::to_value(ComposeBody::dry_run(&req).expect("valid")).expect("json");
        assert_eq!(dry["dry_run"], json!(true));
        assert!(dry.get("force_recreate").is_none());
    }

    #[test]
    fn bad_env_is_refused_without_echoing_values() {
        let mut req = up("r2");
        req.env.insert("1BAD".into(), "x".into());
        assert!(ComposeBody::up(&req).is_err());
        let mut req = up("r2");
        req.env.insert("GOOD".into(), "line1\nsecret-value".into());
        let err = ComposeBody::up(&req).err().expect("refused").to_string();
        assert!(!err.contains("secret-value"), "{err}");
    }

    #[test]
    fn debug_output_never_shows_env_values() {
        let shown = format!("{:?}", up("r2"));
        assert!(shown.contains("HF_TOKEN"), "{shown}");
        assert!(!shown.contains("hf_secret"), "{shown}");
    }
}
