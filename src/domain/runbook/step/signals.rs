//! The signals read before a rollout's first call of its target (safety rule 20), as the
//! touching step's evidence keeps them (`signals` in its detail).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::analyze::Role;

/// Every source read before the touch, and whether one that failed blocks the rollout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Signals {
    pub read_at: DateTime<Utc>,
    /// A canary's failed read blocks it; a rollback's never does.
    pub blocking: bool,
    pub sources: Vec<SourceRead>,
}

/// One source read: `logs`, `engine_api`, `metrics` or `prometheus`, what of, and how it went
/// (`ok`, or the `error`, or why it was `skipped`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SourceRead {
    pub source: String,
    /// The compose service whose logs were read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The log lines read; `null` when they could not be.
    #[serde(
        default,
        deserialize_with = "super::present",
        skip_serializing_if = "Option::is_none"
    )]
    pub lines: Option<Option<usize>>,
    /// The replica whose engine or series was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// The engine API's URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The metrics page's URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_url: Option<String>,
    /// A Prometheus check's name, its query and its answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<u8>,
    #[serde(
        default,
        deserialize_with = "super::present",
        skip_serializing_if = "Option::is_none"
    )]
    pub value: Option<Option<String>>,
    /// Read (absent when skipped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ok: Option<bool>,
    /// `<source> of <replica>: <cause>` (masked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why it was not read (the target's engine does not serve).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

impl SourceRead {
    /// A read of `source`, its outcome not yet set.
    pub fn of(source: &str) -> Self {
        SourceRead {
            source: source.to_owned(),
            ..SourceRead::default()
        }
    }

    /// The outcome: `ok: true`, or `ok: false` with the error, or skipped.
    pub fn ended(mut self, error: Option<String>, skipped: Option<String>) -> Self {
        match (error, skipped) {
            (Some(error), _) => {
                self.ok = Some(false);
                self.error = Some(error);
            }
            (None, Some(why)) => self.skipped = Some(why),
            (None, None) => self.ok = Some(true),
        }
        self
    }
}
