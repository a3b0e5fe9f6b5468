//! Faults of the simulated engines' OpenAI-compatible API (`/v1/models`,
//! `/v1/chat/completions`), kept apart from the compose-manager faults of `faults.rs`.
//!
//! Which faults last: [`crate::SimFaults::set_api_fault`] and [`crate::SimFaults::require_api_token`] are
//! sticky until changed. A fault may be scoped to one tag, so that a broken new version
//! misbehaves while the prior one a rollback brings back answers as usual.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

/// How an engine's API misbehaves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ApiFault {
    /// `/v1/chat/completions` answers this HTTP status with an OpenAI-style error body.
    Status(u16),
    /// Chat answers are 200 with an empty `choices[0].message.content`.
    EmptyContent,
    /// Chat answers are 200 with a body that is not JSON (an HTML error page).
    Garbage,
    /// Chat content differs on every call, even at `temperature: 0`.
    NonDeterministic,
    /// `/v1/models` lists this id instead of the served model name (chat still answers).
    ModelId(String),
    /// Every API call waits this long before answering.
    Delay(Duration),
}

/// A fault and the tag it is limited to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScopedApiFault {
    /// Only while the service's container runs this tag; any tag when `None`.
    pub tag: Option<String>,
    pub fault: ApiFault,
}

/// The API faults of every engine (inside the host's fault state).
#[derive(Debug, Clone, Default)]
pub(crate) struct ApiFaults {
    /// Service → its fault.
    pub by_service: BTreeMap<String, ScopedApiFault>,
    /// Bearer token every engine API call must carry (`None`: no auth).
    pub token: Option<String>,
    /// Counts chat answers, so non-deterministic ones differ.
    pub seq: u64,
}

impl ApiFaults {
    /// The fault of `service` that applies while it runs `tag`.
    pub fn active(&self, service: &str, tag: &str) -> Option<&ApiFault> {
        self.by_service
            .get(service)
            .filter(|f| f.tag.as_deref().is_none_or(|t| t == tag))
            .map(|f| &f.fault)
    }
}
