//! Faults of the simulated engines' OpenAI-compatible API (`/v1/models`,
//! `/v1/chat/completions`), kept apart from the compose-manager faults of `faults.rs`.
//!
//! Which faults last: [`SimFaults::set_api_fault`] and [`SimFaults::require_api_token`] are
//! sticky until changed. A fault may be scoped to one tag, so that a broken new version
//! misbehaves while the prior one a rollback brings back answers as usual.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::faults::SimFaults;

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

impl SimFaults {
    /// Sticky until changed: the OpenAI-compatible API of `service`'s engine misbehaves as
    /// `fault` while its container runs `tag` (any tag when `None`). One fault per service:
    /// setting one replaces the previous; `None` clears it.
    pub fn set_api_fault(&self, service: &str, tag: Option<&str>, fault: Option<ApiFault>) {
        let mut st = self.shared.state();
        let faults = &mut st.faults.api.by_service;
        match fault {
            Some(fault) => {
                let tag = tag.map(str::to_owned);
                faults.insert(service.to_owned(), ScopedApiFault { tag, fault });
            }
            None => {
                faults.remove(service);
            }
        }
    }

    /// Sticky until changed: every engine answers its API calls with 401 unless they carry
    /// `Authorization: Bearer <token>` (`None`: no auth, the default).
    pub fn require_api_token(&self, token: Option<&str>) {
        self.shared.state().faults.api.token = token.map(str::to_owned);
    }
}
