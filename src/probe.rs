//! Health probes of engines (`GET <health_url>`): one sample at a time; the engine's wait steps
//! decide what a run of samples means. `engine_api` calls an engine's OpenAI-compatible API
//! for the `smoke` step; `prometheus` makes the instant queries of `analyze` steps with
//! `source: prometheus`.

pub mod engine_api;
pub mod prometheus;

use std::time::Duration;

use serde::Serialize;

/// One answer (or non-answer) of a replica's `/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HealthSample {
    /// HTTP status, when the engine answered at all.
    pub status: Option<u16>,
    /// Why there was no answer (connect refused, timeout).
    pub error: Option<String>,
}

impl HealthSample {
    /// Healthy means HTTP 200, as the in-CVM proxy judges it.
    pub fn is_healthy(&self) -> bool {
        self.status == Some(200)
    }
}

/// Probes health URLs with a per-probe timeout (the proxy uses 3 s).
#[derive(Clone, Debug)]
pub struct HealthProber {
    client: reqwest::Client,
}

/// How long a connection to an engine stays open unused: more than a wait's or a soak's
/// interval (5 s in the shipped runbook), so their probes reuse it, but not reqwest's 90 s:
/// a peer probed once by `peers_healthy` kept its connection (about 30 KB of buffers) through
/// the canary's soak, 30 MB with 1,000 canaries at once.
const IDLE_CONNECTION: Duration = Duration::from_secs(10);

impl HealthProber {
    /// A prober whose every probe gives up after `timeout`.
    pub fn new(timeout: Duration) -> Self {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .pool_idle_timeout(IDLE_CONNECTION)
            .build()
            .unwrap_or_default();
        Self { client }
    }

    /// Takes one sample of `url`: a `&str`, or a [`HealthUrl`]'s parsed URL for a loop of
    /// samples.
    pub async fn sample(&self, url: impl reqwest::IntoUrl) -> HealthSample {
        match self.client.get(url).send().await {
            Ok(res) => HealthSample {
                status: Some(res.status().as_u16()),
                error: None,
            },
            Err(e) => HealthSample {
                status: None,
                error: Some(short_error(&e)),
            },
        }
    }
}

/// A health URL parsed once for a loop of samples (a wait or a soak): parsing it at every
/// probe would be a few per cent of a 1,000-canary soak's CPU. A URL that does not
/// parse is kept as it is and fails each sample.
#[derive(Debug, Clone)]
pub struct HealthUrl {
    raw: String,
    parsed: Option<reqwest::Url>,
}

impl HealthUrl {
    /// `raw`, parsed.
    pub fn new(raw: String) -> Self {
        let parsed = reqwest::Url::parse(&raw).ok();
        Self { raw, parsed }
    }
}

impl std::fmt::Display for HealthUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.raw)
    }
}

impl HealthProber {
    /// One sample of a [`HealthUrl`].
    pub async fn sample_url(&self, url: &HealthUrl) -> HealthSample {
        match &url.parsed {
            Some(parsed) => self.sample(parsed.clone()).await,
            None => self.sample(url.raw.as_str()).await,
        }
    }
}

/// A request error as one short word a step's evidence can keep.
pub(crate) fn short_error(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timeout".to_owned()
    } else if e.is_connect() {
        "connection refused".to_owned()
    } else {
        "request failed".to_owned()
    }
}
