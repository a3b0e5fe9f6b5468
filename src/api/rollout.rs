//! The wire types of `/v1/rollouts`: a rollout as the API shows it, with its steps, their
//! evidence and their compose calls.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::downtime::Downtime;
use crate::domain::state::{AttemptOutcome, StepStatus};
use crate::store::{Rollout, Step};

/// A rollout as the API shows it.
#[derive(Debug, Serialize, Deserialize, Clone)]
pub struct RolloutOut {
    pub id: String,
    pub kind: String,
    pub status: String,
    pub host: String,
    pub file: String,
    pub service: String,
    pub tag: String,
    pub runbook: String,
    pub actor: String,
    pub reason: String,
    pub env_overrides: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub error: Option<ErrorOut>,
    pub rollback_of: Option<String>,
    pub rolled_back_by: Option<String>,
    /// The compose service `plan`/`up` act on, when not `service` (a rollback to a former
    /// name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deploy_as: Option<String>,
    /// The former service a rename takes down (docs/reference.md#renamed-replicas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaces: Option<crate::domain::plan::Replaces>,
    pub steps: Vec<StepOut>,
    /// The release that started it, when one did. Only in a single rollout's answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_id: Option<String>,
    /// Its page (`<public_url>/rollouts/<id>`), when the config has a `public_url`. Only in a
    /// single rollout's answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_url: Option<String>,
    /// How long the replica was out of service, from its `down` to its first healthy answer,
    /// and the parts of that time; absent when no down of it was sent. Only in a single
    /// rollout's answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downtime: Option<Downtime>,
    /// The downtime's total (ms) as written when the rollout ended: in every answer, lists
    /// and the CSV export too; absent while it runs and when its replica was not taken down
    /// or did not answer healthy again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downtime_ms: Option<i64>,
}

/// A rollout's error.
#[derive(Debug, Serialize, Deserialize, Clone)]
pub struct ErrorOut {
    pub code: String,
    pub message: String,
}

/// One step with its evidence.
#[derive(Debug, Serialize, Deserialize, Clone)]
pub struct StepOut {
    pub name: String,
    pub kind: String,
    pub status: String,
    pub attempts: i64,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// When a running wait gives up (kept across restarts; a resumed soak or analyze moves it
    /// later, see docs/recovery.md).
    pub deadline_at: Option<DateTime<Utc>>,
    pub detail: serde_json::Value,
    /// One line of a succeeded step's evidence, rendered by its kind
    /// (`12 stream lines`, `model … ok, 2 identical outputs, …`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Every compose-manager call of the step, refused ones (`busy`, retried `error`) too.
    /// Only in a single rollout's answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calls: Vec<CallOut>,
}

/// One compose-manager call of a step (a write-ahead attempt row).
#[derive(Debug, Serialize, Deserialize, Clone)]
pub struct CallOut {
    pub n: i64,
    pub endpoint: String,
    /// `succeeded`, `failed`, `unknown`, `error`, `busy`, `not_sent`; absent while in flight.
    pub outcome: Option<AttemptOutcome>,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The error of a refused or failed call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl RolloutOut {
    /// Its status as people read it: a rollout a rollback later undid says so
    /// (`succeeded · rolled back by ro_…`).
    pub fn shown_status(&self) -> String {
        match &self.rolled_back_by {
            Some(by) => format!("{} · rolled back by {by}", self.status),
            None => self.status.clone(),
        }
    }

    pub fn new(r: Rollout, steps: Vec<Step>) -> Self {
        Self {
            kind: r.kind.as_str().to_owned(),
            status: r.status.as_str().to_owned(),
            env_overrides: r.env_overrides.keys().cloned().collect(),
            error: r.error_code.map(|code| ErrorOut {
                code,
                message: r.error_message.unwrap_or_default(),
            }),
            steps: steps.into_iter().map(StepOut::from).collect(),
            id: r.id,
            host: r.host,
            file: r.file.into(),
            service: r.service.into(),
            tag: r.tag.into(),
            runbook: r.runbook,
            actor: r.actor,
            reason: r.reason,
            created_at: r.created_at,
            started_at: r.started_at,
            finished_at: r.finished_at,
            rollback_of: r.rollback_of,
            rolled_back_by: r.rolled_back_by,
            deploy_as: r.deploy_as.map(String::from),
            replaces: r.replaces,
            release_id: None,
            page_url: None,
            downtime: None,
            downtime_ms: r.downtime_ms,
        }
    }
}

impl From<Step> for StepOut {
    fn from(s: Step) -> Self {
        let summary = match s.status {
            StepStatus::Succeeded => s.kind.summary(&s.detail),
            _ => None,
        };
        Self {
            summary,
            name: s.name,
            kind: s.kind.as_str().to_owned(),
            status: s.status.as_str().to_owned(),
            attempts: s.attempts,
            started_at: s.started_at,
            finished_at: s.finished_at,
            deadline_at: s.deadline_at,
            detail: s.detail,
            calls: Vec::new(),
        }
    }
}
