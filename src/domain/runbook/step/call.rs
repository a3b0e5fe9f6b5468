//! What a compose call of a `plan`, `down` or `up` step keeps: each try's attempt detail
//! ([`CallDetail`]), and what the step adds when a call did not end with a plain answer
//! ([`CallFailure`]: an unknown outcome and how the host settled, a deadline, a moved tag).

use serde::{Deserialize, Serialize};

/// A compose call as its attempt row keeps it (`step_attempt.detail`), and as the evidence of
/// a call of unknown outcome names it (`call`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CallDetail {
    /// `compose/down` or `compose/up`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Output lines the stream carried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lines: Option<u64>,
    /// When the stream's last image pull or build line arrived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pulled_at: Option<chrono::DateTime<chrono::Utc>>,
    /// A dry run's plan; `null` when it answered without one.
    #[serde(
        default,
        deserialize_with = "super::present",
        skip_serializing_if = "Option::is_none"
    )]
    pub plan: Option<Option<crate::domain::plan_gate::DryRunPlan>>,
    /// The last output lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<Vec<String>>,
    /// Why the try failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The failure's error code, for a try that is retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// A refusal retried with backoff (409 busy, a refused connection, a rate limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retried: Option<bool>,
    /// Aborted after its row was written, before it was sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aborted: Option<bool>,
    /// In flight at a restart, closed as unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconciled: Option<bool>,
    /// What was sent again after the restart (a dry run: no side effect).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resent: Option<String>,
    /// The attempt found in flight at a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<String>,
    /// Found in flight at a restart: reconciled, never resent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconciled_after_restart: Option<bool>,
}

/// What a `plan`, `down` or `up` step adds when its call did not end with a plain answer.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CallFailure {
    /// The refusal that kept a call from being sent before the deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The call of unknown outcome, or the call whose tag moved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<CallDetail>,
    /// `unknown` when the wait for the host was aborted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// Whether `GET /status` read idle at the end of the wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_idle: Option<bool>,
    /// Whether the target's container was unchanged across two `docker ps` reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_settled: Option<bool>,
    /// How the wait for the host to settle went.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settle: Option<Settled>,
    /// How long the wait took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<i64>,
    /// The target's container after the wait (`docker ps`); `null` when absent.
    #[serde(
        default,
        deserialize_with = "super::present",
        skip_serializing_if = "Option::is_none"
    )]
    pub target_container: Option<Option<serde_json::Value>>,
    /// The target's container as the snapshot saw it; `null` when absent.
    #[serde(
        default,
        deserialize_with = "super::present",
        skip_serializing_if = "Option::is_none"
    )]
    pub target_before: Option<Option<serde_json::Value>>,
    /// Whether the target's container differs from the snapshot's; `null` when neither saw it.
    #[serde(
        default,
        deserialize_with = "super::present",
        skip_serializing_if = "Option::is_none"
    )]
    pub target_changed_since_snapshot: Option<Option<bool>>,
    /// What a rollback's tag meant when it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<TagContent>,
    /// What the host reports the tag means now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub got: Option<TagContent>,
}

/// How a wait for the host to settle ended (safety rule 13).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Settled {
    pub settled: bool,
    pub host_idle: bool,
    /// `GET /docker/ps` reads taken.
    pub ps_reads: u32,
    /// How often the target's container differed between two reads.
    pub target_changes: u32,
}

/// A tag's content: its commit and its file's sha256 (`null` when the host does not say).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TagContent {
    pub commit: Option<String>,
    pub file_sha256: Option<String>,
}
