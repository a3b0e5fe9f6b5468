//! The wire types of `/v1/releases` and the validation of a release request, shared by the
//! API and `canaryd check release`.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::config::ResolvedConfig;
use crate::domain::plan::{self, KnownTargets, PlanError, PlanSpec};
use crate::domain::release::ReleaseOnFailure;
use crate::domain::state::{OnFailure, RolloutStatus};
use crate::store::{
    new_id, NewRelease, NewReleaseTarget, Release, ReleaseEvent, ReleaseTarget, TargetStateKey,
};

/// One replica: a target or the canary.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TargetIn {
    pub host: String,
    pub service: String,
}

/// The replicas of one group on the listed hosts.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SelectorIn {
    pub hosts: Vec<String>,
    pub group: String,
}

/// `POST /v1/releases`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseIn {
    pub file: String,
    pub tag: String,
    pub reason: String,
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub require_logs: Option<Vec<String>>,
    #[serde(default)]
    pub runbook: Option<String>,
    #[serde(default)]
    pub targets: Option<Vec<TargetIn>>,
    #[serde(default)]
    pub selector: Option<SelectorIn>,
    #[serde(default)]
    pub canary: Option<TargetIn>,
    #[serde(default)]
    pub max_parallel_hosts: Option<u32>,
    #[serde(default)]
    pub on_failure: Option<ReleaseOnFailure>,
    /// Low-traffic windows for every target's rollout, instead of their hosts'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows: Option<Vec<crate::domain::window::TrafficWindow>>,
}

/// A release as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReleaseOut {
    pub id: String,
    pub status: String,
    pub actor: String,
    pub reason: String,
    pub file: String,
    pub tag: String,
    pub runbook: String,
    pub max_parallel_hosts: u32,
    pub on_failure: String,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub error: Option<String>,
    /// Targets per state (`waiting`, `running`, `succeeded`, `failed`, `aborted`,
    /// `rolled_back`, `already_current`, `not_started`).
    pub progress: BTreeMap<String, usize>,
    pub targets: Vec<ReleaseTargetOut>,
    /// The release's audit trail (only in a single release's answer).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<ReleaseEventOut>,
}

/// One entry of a release's audit trail.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReleaseEventOut {
    pub at: DateTime<Utc>,
    pub actor: String,
    pub kind: String,
    pub from_state: Option<String>,
    pub to_state: Option<String>,
    pub reason: Option<String>,
    pub detail: serde_json::Value,
}

/// One target and its rollout.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReleaseTargetOut {
    pub position: u32,
    pub host: String,
    pub service: String,
    pub canary: bool,
    /// `waiting` (no rollout yet), its rollout's status, `rolled_back` (it succeeded and
    /// `rollback_release` undid it), `already_current` (already at the release's file, tag and
    /// env: done, no rollout, nothing sent) or `not_started` (the release ended first).
    pub state: String,
    pub rollout_id: Option<String>,
    pub error: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The newest rollback of the target's rollout (its automatic one, or the release's).
    pub rollback_id: Option<String>,
    pub rollback_status: Option<String>,
    /// The name of the target rollout's running step, if one runs.
    pub current_step: Option<String>,
    /// How long its replica was out (ms), once its rollout ended (its `downtime_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downtime_ms: Option<i64>,
}

/// The state a target is shown in.
pub fn target_state(t: &ReleaseTarget) -> &'static str {
    state_of(&(t.rollout_status, t.rollback_status, t.outcome))
}

fn state_of(key: &TargetStateKey) -> &'static str {
    match key {
        (None, _, Some(outcome)) => outcome.as_str(),
        (None, _, None) => "waiting",
        (Some(RolloutStatus::Succeeded), Some(RolloutStatus::Succeeded), _) => "rolled_back",
        (Some(s), _, _) => s.as_str(),
    }
}

/// The state name of a target from `Store::release_metrics`' (rollout status, rollback
/// status, outcome) key.
pub fn target_state_name(key: &TargetStateKey) -> String {
    state_of(key).to_owned()
}

impl ReleaseOut {
    pub fn new(r: Release, events: Vec<ReleaseEvent>) -> Self {
        let targets: Vec<ReleaseTargetOut> = r
            .targets
            .iter()
            .map(|t| ReleaseTargetOut {
                position: t.position,
                host: t.host.clone(),
                service: t.service.clone(),
                canary: t.position == 0,
                state: target_state(t).to_owned(),
                rollout_id: t.rollout_id.clone(),
                error: t.rollout_error.clone(),
                started_at: t.rollout_started_at,
                finished_at: t.rollout_finished_at,
                rollback_id: t.rollback_id.clone(),
                rollback_status: t.rollback_status.map(|s| s.as_str().to_owned()),
                current_step: t.current_step.clone(),
                downtime_ms: t.downtime_ms,
            })
            .collect();
        let mut progress = BTreeMap::new();
        for t in &targets {
            *progress.entry(t.state.clone()).or_insert(0) += 1;
        }
        Self {
            id: r.id,
            status: r.status.as_str().to_owned(),
            actor: r.actor,
            reason: r.reason,
            file: r.file,
            tag: r.tag,
            runbook: r.runbook,
            max_parallel_hosts: r.max_parallel_hosts,
            on_failure: r.on_failure.as_str().to_owned(),
            created_at: r.created_at,
            started_at: r.started_at,
            finished_at: r.finished_at,
            error: r.error_message,
            progress,
            targets,
            events: events
                .into_iter()
                .map(|e| ReleaseEventOut {
                    at: e.at,
                    actor: e.actor,
                    kind: e.kind.as_str().to_owned(),
                    from_state: e.from_state,
                    to_state: e.to_state,
                    reason: e.reason,
                    detail: e.detail,
                })
                .collect(),
        }
    }
}

/// Why a release is refused: an API error code, its message (naming the field or target),
/// and whether it is a 422 (the request is well formed but does not fit the config) rather
/// than a 400.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: &'static str,
    pub message: String,
    pub unprocessable: bool,
}

fn unprocessable(code: &'static str, message: String) -> Refusal {
    Refusal {
        code,
        message,
        unprocessable: true,
    }
}

/// A target's plan refused: the same code, the message naming the target.
fn target_error(i: usize, t: &TargetIn, e: PlanError) -> Refusal {
    Refusal {
        code: e.code,
        message: format!("targets[{i}] ({}/{}): {}", t.host, t.service, e.message),
        unprocessable: e.is_unprocessable(),
    }
}

/// The targets of a selector: the group's replicas on each host in the order given, inside a
/// host by name, last first (`…-r2` before `…-r1`, as operators roll them).
fn select(config: &ResolvedConfig, s: &SelectorIn) -> Result<Vec<TargetIn>, Refusal> {
    let mut out = Vec::new();
    for (i, host) in s.hosts.iter().enumerate() {
        let Some(config) = config.hosts.get(host) else {
            return Err(unprocessable(
                "unknown_host",
                format!("selector.hosts[{i}]: \"{host}\" is not a configured host"),
            ));
        };
        let mut services: Vec<&String> = config
            .replicas
            .iter()
            .filter(|(_, r)| r.group == s.group)
            .map(|(name, _)| name)
            .collect();
        services.sort_by(|a, b| b.cmp(a));
        out.extend(services.into_iter().map(|service| TargetIn {
            host: host.clone(),
            service: service.clone(),
        }));
    }
    if out.is_empty() {
        return Err(unprocessable(
            "invalid_release",
            format!(
                "selector: no replica of group \"{}\" on {}",
                s.group,
                s.hosts.join(", ")
            ),
        ));
    }
    Ok(out)
}

/// Validates a release request into the release to store (the canary first), as
/// `POST /v1/releases` and `canaryd check release` do. `known` is what the config lets a plan
/// name (`ResolvedConfig::known_targets`); the daemon builds it once (`AppState::known`): at
/// 1,000 hosts it is about 0.5 MB of small maps, too much to rebuild per request.
pub fn validate(
    config: &ResolvedConfig,
    known: &KnownTargets,
    input: ReleaseIn,
    actor: &str,
) -> Result<NewRelease, Refusal> {
    let mut targets = match (&input.targets, &input.selector) {
        (Some(t), None) if !t.is_empty() => t.clone(),
        (Some(_), None) => {
            return Err(unprocessable(
                "invalid_release",
                "targets: must list at least one {host, service}".into(),
            ))
        }
        (None, Some(s)) => select(config, s)?,
        _ => {
            return Err(unprocessable(
                "invalid_release",
                "targets, selector: give exactly one of them".into(),
            ))
        }
    };
    let mut seen = BTreeSet::new();
    for (i, t) in targets.iter().enumerate() {
        if !seen.insert((t.host.clone(), t.service.clone())) {
            return Err(unprocessable(
                "invalid_release",
                format!("targets[{i}] ({}/{}): listed twice", t.host, t.service),
            ));
        }
    }
    if let Some(canary) = &input.canary {
        let Some(at) = targets.iter().position(|t| t == canary) else {
            return Err(unprocessable(
                "invalid_release",
                format!(
                    "canary ({}/{}): must be one of the targets",
                    canary.host, canary.service
                ),
            ));
        };
        let c = targets.remove(at);
        targets.insert(0, c);
    }
    let max_parallel_hosts = input.max_parallel_hosts.unwrap_or(1);
    if max_parallel_hosts == 0 {
        return Err(unprocessable(
            "invalid_release",
            "max_parallel_hosts: must be at least 1".into(),
        ));
    }
    let mut new_targets = Vec::with_capacity(targets.len());
    let mut runbook = String::new();
    for (i, t) in targets.iter().enumerate() {
        let spec = PlanSpec {
            host: t.host.clone(),
            file: input.file.clone(),
            service: t.service.clone(),
            tag: input.tag.clone(),
            reason: input.reason.clone(),
            runbook: input.runbook.clone(),
            env: input.env.clone(),
            require_logs: input.require_logs.clone(),
            replaces: None,
            on_failure: Some(OnFailure::Rollback),
            windows: input.windows.clone(),
            required_free: None,
        };
        let canary = plan::validate(spec, known).map_err(|e| target_error(i, t, e))?;
        runbook.clone_from(&canary.runbook);
        let plan = serde_json::to_value(&canary).map_err(|e| Refusal {
            code: "internal",
            message: e.to_string(),
            unprocessable: false,
        })?;
        new_targets.push(NewReleaseTarget {
            host: t.host.clone(),
            service: t.service.clone(),
            plan,
        });
    }
    Ok(NewRelease {
        id: new_id("rel"),
        actor: actor.to_owned(),
        reason: input.reason.trim().to_owned(),
        file: input.file,
        tag: input.tag,
        runbook,
        max_parallel_hosts,
        on_failure: input.on_failure.unwrap_or(ReleaseOnFailure::Halt),
        created_at: Utc::now(),
        targets: new_targets,
    })
}
