//! Read models the store hands out (rows are converted here, and never leave `store/`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::domain::audit::AuditKind;
use crate::domain::names::{ComposeFile, ServiceName, Tag};
use crate::domain::runbook::StepKindName;
use crate::domain::state::{
    AttemptOutcome, DeploymentSource, OnFailure, RolloutKind, RolloutStatus, StepStatus,
};

/// One rollout as stored.
#[derive(Debug, Clone, Serialize)]
pub struct Rollout {
    pub id: String,
    pub kind: RolloutKind,
    pub status: RolloutStatus,
    pub host: String,
    pub file: ComposeFile,
    pub service: ServiceName,
    pub tag: Tag,
    pub runbook: String,
    pub actor: String,
    pub reason: String,
    pub env_overrides: BTreeMap<String, String>,
    pub env_sha256: String,
    pub require_logs: Vec<String>,
    pub on_failure: OnFailure,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    pub rollback_of: Option<String>,
    pub expect_commit: Option<String>,
    pub expect_file_sha256: Option<String>,
    pub rolled_back_by: Option<String>,
    pub touched_replica: bool,
    pub abort_reason: Option<String>,
    /// The compose service `plan`/`up` act on when not `service`, the replica's slot (a
    /// rollback to a former name).
    pub deploy_as: Option<ServiceName>,
    /// The former service a rename takes down (`down` acts on it with its file and tag).
    pub replaces: Option<crate::domain::plan::Replaces>,
    /// How long its replica was out (ms), written with its end (`domain::downtime`).
    pub downtime_ms: Option<i64>,
    /// Low-traffic windows its plan named (the `window` step's, before the host's).
    pub windows: Vec<crate::domain::window::TrafficWindow>,
    /// The free space its plan requires of a weights pre-stage (bytes), raising its runbook's.
    pub required_free: Option<u64>,
}

impl Rollout {
    /// The compose service this rollout deploys (`plan`, `up`, health, logs): `deploy_as`,
    /// else `service`.
    pub fn target(&self) -> &ServiceName {
        self.deploy_as.as_ref().unwrap_or(&self.service)
    }

    /// The former service a rename takes down, if any.
    pub fn replaced(&self) -> Option<&ServiceName> {
        self.replaces.as_ref().map(|r| &r.service)
    }
}

/// One step of a rollout.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub id: String,
    pub rollout_id: String,
    pub position: i64,
    pub name: String,
    pub kind: StepKindName,
    pub status: StepStatus,
    pub attempts: i64,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub deadline_at: Option<DateTime<Utc>>,
    pub detail: serde_json::Value,
}

/// A step's kind, position and times (`Store::step_timing`).
#[derive(Debug, Clone, PartialEq)]
pub struct StepTiming {
    pub position: i64,
    pub kind: StepKindName,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// One write-ahead record of a compose-manager call with side effects.
#[derive(Debug, Clone, Serialize)]
pub struct StepAttempt {
    pub id: String,
    pub step_id: String,
    pub rollout_id: String,
    pub n: i64,
    pub endpoint: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub outcome: Option<AttemptOutcome>,
    pub detail: serde_json::Value,
}

/// What ran (or runs) on a replica.
#[derive(Debug, Clone, Serialize)]
pub struct Deployment {
    pub id: String,
    pub host: String,
    pub service: ServiceName,
    pub file: ComposeFile,
    pub tag: Tag,
    pub env_overrides: BTreeMap<String, String>,
    pub env_sha256: Option<String>,
    pub commit: Option<String>,
    pub file_sha256: Option<String>,
    pub image: Option<String>,
    pub source: DeploymentSource,
    pub rollout_id: Option<String>,
    pub deployed_at: DateTime<Utc>,
    /// The compose service it ran under, when not `service` (a former name).
    pub deployed_as: Option<ServiceName>,
}

impl Deployment {
    /// The compose service it ran under: `deployed_as`, else `service`.
    pub fn name(&self) -> &ServiceName {
        self.deployed_as.as_ref().unwrap_or(&self.service)
    }
}

/// One entry of the append-only audit trail.
#[derive(Debug, Clone, Serialize)]
pub struct AuditEvent {
    pub seq: i64,
    pub occurred_at: DateTime<Utc>,
    pub rollout_id: Option<String>,
    pub step: Option<String>,
    pub actor: String,
    pub kind: AuditKind,
    pub from_state: Option<String>,
    pub to_state: Option<String>,
    pub detail: serde_json::Value,
    /// A step event's step as its transition wrote it, when the event was handed over by
    /// the transaction that wrote it (`None` when read back from the database): what the
    /// metrics time the step with, without a read.
    #[serde(skip)]
    pub step_timing: Option<StepTiming>,
}

/// Filters of `GET /v1/rollouts`; all optional, combined with AND.
#[derive(Debug, Clone, Default)]
pub struct RolloutFilter {
    pub host: Option<String>,
    pub service: Option<String>,
    pub status: Option<RolloutStatus>,
    pub kind: Option<RolloutKind>,
    pub tag: Option<String>,
    pub actor: Option<String>,
    /// Only the target rollouts of this release.
    pub release: Option<String>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    /// Keyset cursor: items strictly older than this (created_at, id).
    pub before: Option<(String, String)>,
    pub limit: u32,
}

/// An audit entry being built.
#[derive(Debug, Clone)]
pub struct AuditEntry {
    pub(super) at: DateTime<Utc>,
    pub(super) actor: String,
    pub(super) kind: AuditKind,
    pub(super) rollout_id: Option<String>,
    pub(super) step: Option<String>,
    pub(super) from_state: Option<String>,
    pub(super) to_state: Option<String>,
    pub(super) detail: serde_json::Value,
    /// Handed to subscribers with the event (`AuditEvent::step_timing`), never stored.
    pub(super) step_timing: Option<StepTiming>,
}

impl AuditEntry {
    pub fn new(at: DateTime<Utc>, actor: &str, kind: AuditKind) -> Self {
        Self {
            at,
            actor: actor.to_owned(),
            kind,
            rollout_id: None,
            step: None,
            from_state: None,
            to_state: None,
            detail: serde_json::json!({}),
            step_timing: None,
        }
    }
    pub fn rollout(mut self, id: &str) -> Self {
        self.rollout_id = Some(id.to_owned());
        self
    }
    pub fn step(mut self, name: &str) -> Self {
        self.step = Some(name.to_owned());
        self
    }
    pub fn states(mut self, from: Option<&str>, to: Option<&str>) -> Self {
        self.from_state = from.map(str::to_owned);
        self.to_state = to.map(str::to_owned);
        self
    }
    pub fn detail(mut self, detail: serde_json::Value) -> Self {
        self.detail = detail;
        self
    }
    pub(super) fn step_timing(mut self, timing: StepTiming) -> Self {
        self.step_timing = Some(timing);
        self
    }

    /// The event this entry is once stored with sequence number `seq`: its time and detail
    /// as reading the row back would give them (times are stored to the millisecond).
    pub(super) fn stored(&self, seq: i64) -> AuditEvent {
        use chrono::SubsecRound;
        let ms = |t: DateTime<Utc>| t.trunc_subsecs(3);
        AuditEvent {
            seq,
            occurred_at: ms(self.at),
            rollout_id: self.rollout_id.clone(),
            step: self.step.clone(),
            actor: self.actor.clone(),
            kind: self.kind,
            from_state: self.from_state.clone(),
            to_state: self.to_state.clone(),
            detail: self.detail.clone(),
            step_timing: self.step_timing.as_ref().map(|t| StepTiming {
                position: t.position,
                kind: t.kind,
                started_at: t.started_at.map(ms),
                finished_at: t.finished_at.map(ms),
            }),
        }
    }
}
