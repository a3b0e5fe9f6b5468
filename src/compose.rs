//! compose-manager client: one typed call per endpoint the engine uses.
//!
//! How compose-manager behaves is in docs/compose-manager.md. Every call carries `Authorization:
//! Bearer <token>` and `X-Triggered-By`. `up`, `down` and `dry_run` read the NDJSON stream to its
//! end ([`stream`]); their bodies name an explicit, non-empty list of services ([`request`]). A streaming call whose
//! answer may have reached the host but gave no verdict returns [`StreamOutcome::Unknown`], never
//! an error, so nobody resends `up` blindly (safety rule 5, docs/safety.md). The token and env
//! values are never logged nor shown by `Debug`.

mod error;
mod lines;
mod output;
mod plan;
mod request;
mod stream;
#[cfg(test)]
mod tests;
mod wire;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::header::{HeaderName, HeaderValue, AUTHORIZATION};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde::de::DeserializeOwned;

pub use error::ComposeError;
pub use request::{ComposeRequest, ForceRecreate, LogsRequest, Services};
pub use stream::{DryRunResult, StageResult, StreamOutcome, StreamResult, TRANSCRIPT_TAIL_LINES};
pub use wire::{
    CacheVolume, DeployedRecord, HostCache, HostStatus, InFlight, ProjectDeployments, PsEntry,
    VersionInfo,
};

use request::{ComposeBody, LogsBody};
use stream::{Streamed, Transcript};

const UP: &str = "/compose/up";
const DOWN: &str = "/compose/down";
const LOGS: &str = "/compose/logs";
const PS: &str = "/docker/ps";
const EVICT: &str = "/docker/evict";
const STATUS: &str = "/status";
const VERSION: &str = "/version";
const HOST_CACHE: &str = "/host/cache";
/// Every endpoint a client calls: their URLs are parsed once, when the client is made.
const ENDPOINTS: [&str; 8] = [UP, DOWN, LOGS, PS, EVICT, STATUS, VERSION, HOST_CACHE];

/// Timeouts and identity of a [`ComposeClient`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientOptions {
    /// TCP connect timeout (with [`ComposeClient::with_http`], the shared client's).
    pub connect_timeout: Duration,
    /// Whole non-streaming calls (status, version, ps, logs, the probe).
    pub request_timeout: Duration,
    /// Longest silence on a streaming call: before its answer starts, and between chunks.
    pub stream_idle_timeout: Duration,
    /// `X-Triggered-By` value.
    pub triggered_by: String,
    /// Where the token comes from (`the env var X (hosts.h.token_env)`): a `401` says it, so
    /// that whoever reads the error knows what to fix.
    pub token_source: Option<String>,
    /// compose project of the host, used to turn `<project>-<service>-<n>` into `<service>`.
    pub project: String,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            stream_idle_timeout: Duration::from_secs(600),
            triggered_by: "canaryd".to_owned(),
            token_source: None,
            project: "work".to_owned(),
        }
    }
}

/// Told of every request: (endpoint, HTTP status or `error`/`unknown`). Feeds metrics.
pub type ComposeObserver = Arc<dyn Fn(&str, &str) + Send + Sync>;

/// The HTTP client that every host's [`ComposeClient`] can share: one connection pool (keyed
/// by host and port, so each compose-manager still has connections of its own) and one TLS
/// setup. A `reqwest::Client` per host cost about 25 KB before its first request (rustls'
/// session cache and root store, unused on plain http): 25 MB at 1,000 hosts.
#[derive(Clone, Debug)]
pub struct ComposeHttp(reqwest::Client);

impl ComposeHttp {
    /// A client that connects within `connect_timeout`, follows no redirect and uses no proxy.
    pub fn new(connect_timeout: Duration) -> Result<Self, ComposeError> {
        reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .map(Self)
            .map_err(|e| ComposeError::InvalidRequest {
                message: format!("could not build the HTTP client: {e}"),
            })
    }
}

/// A client for one host's compose-manager. Cheap to clone.
#[derive(Clone)]
pub struct ComposeClient {
    http: reqwest::Client,
    /// `Authorization: Bearer <token>` (marked sensitive) and `X-Triggered-By`, sent with
    /// every request.
    auth: HeaderValue,
    actor: HeaderValue,
    base_url: Arc<str>,
    /// The URL of each of [`ENDPOINTS`], in that order, parsed once: parsing it again at
    /// every request was about 7 % of a 1,000-canary soak's CPU.
    urls: Arc<[reqwest::Url]>,
    opts: Arc<ClientOptions>,
    observer: Option<ComposeObserver>,
}

impl fmt::Debug for ComposeClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ComposeClient")
            .field("base_url", &self.base_url)
            .field("token", &"<redacted>")
            .field("opts", &self.opts)
            .finish()
    }
}

impl ComposeClient {
    /// A client for `base_url` (`http://host:8080`, trailing `/` ignored), with an HTTP
    /// client of its own.
    pub fn new(base_url: &str, token: &str, opts: ClientOptions) -> Result<Self, ComposeError> {
        let http = ComposeHttp::new(opts.connect_timeout)?;
        Self::with_http(&http, base_url, token, opts)
    }

    /// A client for `base_url` over `http`, shared with other hosts' clients (the engine's one
    /// per daemon); `opts.connect_timeout` is then `http`'s.
    pub fn with_http(
        http: &ComposeHttp,
        base_url: &str,
        token: &str,
        opts: ClientOptions,
    ) -> Result<Self, ComposeError> {
        let base_url = check_base_url(base_url)?;
        let urls = ENDPOINTS
            .iter()
            .map(|endpoint| {
                reqwest::Url::parse(&format!("{base_url}{endpoint}")).map_err(|e| {
                    ComposeError::InvalidUrl {
                        url: base_url.clone(),
                        message: format!("{endpoint}: {e}"),
                    }
                })
            })
            .collect::<Result<_, _>>()?;
        if token.is_empty() {
            return Err(ComposeError::InvalidRequest {
                message: "compose-manager token is empty".into(),
            });
        }
        let mut auth = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
            ComposeError::InvalidRequest {
                message: "compose-manager token is not a valid header value".into(),
            }
        })?;
        auth.set_sensitive(true);
        let actor = HeaderValue::from_str(&opts.triggered_by).map_err(|_| {
            ComposeError::InvalidRequest {
                message: format!(
                    "X-Triggered-By {:?} is not a valid header value",
                    opts.triggered_by
                ),
            }
        })?;
        Ok(Self {
            http: http.0.clone(),
            auth,
            actor,
            base_url: base_url.into(),
            urls,
            opts: Arc::new(opts),
            observer: None,
        })
    }

    /// The same client, reporting every request to `observer`.
    pub fn with_observer(mut self, observer: ComposeObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    fn observe(&self, endpoint: &str, code: &str) {
        if let Some(observer) = &self.observer {
            observer(endpoint, code);
        }
    }

    /// The base URL, without a trailing `/`.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// A real scoped `compose/up` of `req.services` (never `dry_run`; `force_recreate` only
    /// through [`ForceRecreate`]).
    pub async fn up(&self, req: &ComposeRequest) -> Result<StreamResult, ComposeError> {
        let body = ComposeBody::up(req)?;
        self.log_compose_call(UP, &body, req.env.len(), &req.tag);
        Ok(self.stream(UP, &body).await?.result)
    }

    /// The same `compose/up` with `"dry_run": true`. Probe [`Self::supports_dry_run`] first:
    /// an older compose-manager ignores the flag and deploys for real.
    pub async fn dry_run(&self, req: &ComposeRequest) -> Result<DryRunResult, ComposeError> {
        let body = ComposeBody::dry_run(req)?;
        self.log_compose_call("/compose/up (dry run)", &body, req.env.len(), &req.tag);
        let streamed = self.stream(UP, &body).await?;
        let (raw_plan, plan) = match streamed.plan {
            Some((value, raw)) => (
                Some(value),
                Some(plan::normalise_plan(&raw, &self.opts.project)),
            ),
            None => (None, None),
        };
        Ok(DryRunResult {
            stream: streamed.result,
            plan,
            raw_plan,
        })
    }

    /// The same `compose/up` with `"materialize_only": true`: pulls and builds, runs
    /// nothing. Probe [`Self::supports_dry_run`] first (the same server version added both
    /// flags): an older compose-manager ignores the flag and deploys for real.
    pub async fn stage(&self, req: &ComposeRequest) -> Result<StageResult, ComposeError> {
        let body = ComposeBody::stage(req)?;
        self.log_compose_call(
            "/compose/up (materialize only)",
            &body,
            req.env.len(),
            &req.tag,
        );
        let streamed = self.stream(UP, &body).await?;
        Ok(StageResult {
            stream: streamed.result,
            staged: streamed.staged,
        })
    }

    /// A scoped `compose/down` of `req.services` (never `volumes`).
    pub async fn down(&self, req: &ComposeRequest) -> Result<StreamResult, ComposeError> {
        let body = ComposeBody::down(req)?;
        self.log_compose_call(DOWN, &body, req.env.len(), &req.tag);
        Ok(self.stream(DOWN, &body).await?.result)
    }

    /// The last `req.tail` log lines of one service: compose's prefixed `output` text.
    pub async fn logs(&self, req: &LogsRequest) -> Result<String, ComposeError> {
        let body = LogsBody::new(req)?;
        let request = self.request(Method::POST, LOGS).json(&body);
        self.call_output(LOGS, request).await
    }

    /// The host's containers (`GET /docker/ps`).
    pub async fn ps(&self) -> Result<Vec<PsEntry>, ComposeError> {
        let output = self.call_output(PS, self.request(Method::GET, PS)).await?;
        wire::parse_ps_output(PS, &output)
    }

    /// The container of compose service `service` among the host's (`GET /docker/ps`):
    /// the same call and errors as [`Self::ps`], but only that entry is copied out of the
    /// answer (a soak reads it at every probe).
    pub async fn ps_service(&self, service: &str) -> Result<Option<PsEntry>, ComposeError> {
        let output = self.call_output(PS, self.request(Method::GET, PS)).await?;
        wire::find_service_entry(PS, &output, service)
    }

    /// The operation holding the host's lock, if any (`GET /status`).
    pub async fn status(&self) -> Result<HostStatus, ComposeError> {
        self.call(STATUS, self.request(Method::GET, STATUS)).await
    }

    /// The host's model cache (`GET /host/cache`): each volume's used bytes and the weight
    /// repos it holds.
    pub async fn host_cache(&self) -> Result<HostCache, ComposeError> {
        self.call(HOST_CACHE, self.request(Method::GET, HOST_CACHE))
            .await
    }

    /// What the host last deployed (`GET /version`).
    pub async fn version(&self) -> Result<VersionInfo, ComposeError> {
        self.call(VERSION, self.request(Method::GET, VERSION)).await
    }

    /// Whether the host understands `dry_run`, without side effects: `POST /docker/evict`
    /// with `{}` is `422` on the newest compose-manager (true) and `404` on older ones (false).
    pub async fn supports_dry_run(&self) -> Result<bool, ComposeError> {
        let request = self
            .request(Method::POST, EVICT)
            .json(&serde_json::json!({}));
        let (status, text) = self.send_whole(EVICT, request).await?;
        match status {
            422 => Ok(true),
            404 => Ok(false),
            200..=299 => Err(ComposeError::protocol(
                EVICT,
                0,
                &text,
                format!("the capability probe (an empty evict body) was accepted with {status}"),
            )),
            _ => Err(self.refused(EVICT, status, &text)),
        }
    }

    /// The error of a non-success answer; a `401` names where the token comes from.
    fn refused(&self, endpoint: &str, status: u16, text: &str) -> ComposeError {
        match (
            ComposeError::from_status(endpoint, status, text),
            &self.opts.token_source,
        ) {
            (ComposeError::Unauthorized { endpoint, message }, Some(source)) => {
                ComposeError::Unauthorized {
                    endpoint,
                    message: format!(
                        "{message}; canaryd sends the token in {source}: set it to this host's \
                         compose-manager token and restart canaryd (`canaryd doctor` checks it)"
                    ),
                }
            }
            (e, _) => e,
        }
    }

    /// The URL of `endpoint`, one of [`ENDPOINTS`].
    fn url(&self, endpoint: &str) -> reqwest::Url {
        match ENDPOINTS.iter().position(|e| *e == endpoint) {
            Some(i) => self.urls[i].clone(),
            None => unreachable!("{endpoint} is not in ENDPOINTS"),
        }
    }

    /// A request to `endpoint` with this host's `Authorization` and `X-Triggered-By`.
    fn request(&self, method: Method, endpoint: &str) -> RequestBuilder {
        self.http
            .request(method, self.url(endpoint))
            .header(AUTHORIZATION, self.auth.clone())
            .header(
                HeaderName::from_static("x-triggered-by"),
                self.actor.clone(),
            )
    }

    fn log_compose_call(&self, what: &str, body: &ComposeBody<'_>, env_keys: usize, tag: &str) {
        tracing::debug!(
            compose.url = %self.base_url,
            compose.endpoint = what,
            compose.service = %body.services_shown(),
            compose.tag = tag,
            env.keys = env_keys,
            "calling compose-manager"
        );
    }

    /// Sends a streaming call and reads its NDJSON answer to the end.
    async fn stream(
        &self,
        endpoint: &'static str,
        body: &ComposeBody<'_>,
    ) -> Result<Streamed, ComposeError> {
        let idle = self.opts.stream_idle_timeout;
        let started = Instant::now();
        let send = self.request(Method::POST, endpoint).json(body).send();
        let response = match tokio::time::timeout(idle, send).await {
            Ok(Ok(response)) => response,
            // Nothing reached the host: safe to report as an error (and to retry).
            Ok(Err(err)) if err.is_connect() || err.is_builder() => {
                self.observe(endpoint, "error");
                return Err(ComposeError::from_transport(endpoint, &err));
            }
            // The request may have reached the host: the outcome is unknown.
            Ok(Err(err)) => {
                self.observe(endpoint, "unknown");
                return Transcript::new(endpoint).finish(Some(format!("no answer: {err}")));
            }
            Err(_) => {
                self.observe(endpoint, "unknown");
                let why = format!("no answer within {} ms", idle.as_millis());
                return Transcript::new(endpoint).finish(Some(why));
            }
        };
        let status = response.status();
        self.observe(endpoint, status.as_str());
        if status != StatusCode::OK {
            let text = tokio::time::timeout(self.opts.request_timeout, response.text())
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default();
            return Err(self.refused(endpoint, status.as_u16(), &text));
        }
        let streamed = stream::read_stream(response, endpoint, idle).await;
        if let Ok(streamed) = &streamed {
            tracing::debug!(
                compose.endpoint = endpoint,
                outcome = ?streamed.result.outcome,
                lines = streamed.result.n_lines,
                duration_ms = started.elapsed().as_millis() as u64,
                "compose stream ended"
            );
        }
        streamed
    }

    /// Sends a whole call with the request timeout; returns status and body text (invalid
    /// UTF-8 replaced, as `reqwest::Response::text` does).
    async fn send_whole(
        &self,
        endpoint: &'static str,
        request: RequestBuilder,
    ) -> Result<(u16, String), ComposeError> {
        self.send_whole_with(endpoint, request, |status, body| {
            (status, String::from_utf8_lossy(body).into_owned())
        })
        .await
    }

    /// `send_whole`, the status and body as received given to `read`: a caller that only
    /// reads the body need not copy it into a `String` first (a soak's 500-line log answer
    /// is about 94 KB).
    async fn send_whole_with<R>(
        &self,
        endpoint: &'static str,
        request: RequestBuilder,
        read: impl FnOnce(u16, &[u8]) -> R,
    ) -> Result<R, ComposeError> {
        let started = Instant::now();
        let response = match request.timeout(self.opts.request_timeout).send().await {
            Ok(response) => response,
            Err(e) => {
                self.observe(endpoint, "error");
                return Err(ComposeError::from_transport(endpoint, &e));
            }
        };
        let status = response.status().as_u16();
        self.observe(endpoint, response.status().as_str());
        let body = response
            .bytes()
            .await
            .map_err(|e| ComposeError::from_transport(endpoint, &e))?;
        tracing::debug!(
            compose.url = %self.base_url,
            compose.endpoint = endpoint,
            http.status = status,
            duration_ms = started.elapsed().as_millis() as u64,
            "compose-manager answered"
        );
        Ok(read(status, &body))
    }

    /// A whole call whose 200 answer is JSON of type `T`.
    async fn call<T: DeserializeOwned>(
        &self,
        endpoint: &'static str,
        request: RequestBuilder,
    ) -> Result<T, ComposeError> {
        self.send_whole_with(endpoint, request, |status, body| {
            let text = body_text(body);
            self.decode(endpoint, status, &text)
        })
        .await?
    }

    /// A whole call whose 200 answer is `{"output": "...", ...}` (logs, ps): the output text,
    /// decoded in one buffer of its size ([`output`]).
    async fn call_output(
        &self,
        endpoint: &'static str,
        request: RequestBuilder,
    ) -> Result<String, ComposeError> {
        self.send_whole_with(endpoint, request, |status, body| {
            let text = body_text(body);
            if status != 200 {
                return Err(self.refused(endpoint, status, &text));
            }
            output::output_of(&text).map_err(|e| {
                ComposeError::protocol(endpoint, 0, &text, format!("unexpected answer: {e}"))
            })
        })
        .await?
    }

    /// A whole call's answer: JSON of type `T` when `status` is 200, its error otherwise.
    fn decode<T: DeserializeOwned>(
        &self,
        endpoint: &'static str,
        status: u16,
        text: &str,
    ) -> Result<T, ComposeError> {
        if status != 200 {
            return Err(self.refused(endpoint, status, text));
        }
        serde_json::from_str(text).map_err(|e| {
            ComposeError::protocol(endpoint, 0, text, format!("unexpected answer: {e}"))
        })
    }
}

/// `http://host[:port][/prefix]`, without a trailing `/`, credentials, query or fragment.
/// An answer's body as text: read in place when UTF-8 (always, from compose-manager);
/// otherwise with the invalid bytes replaced, as `reqwest`'s `text()` does.
fn body_text(body: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(body) {
        Ok(text) => std::borrow::Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(body),
    }
}

fn check_base_url(raw: &str) -> Result<String, ComposeError> {
    let trimmed = raw.trim().trim_end_matches('/');
    let invalid = |message: &str| ComposeError::InvalidUrl {
        url: trimmed.to_owned(),
        message: message.to_owned(),
    };
    let url = reqwest::Url::parse(trimmed).map_err(|e| invalid(&e.to_string()))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ComposeError::InvalidUrl {
            url: "<redacted>".into(),
            message: "credentials do not belong in the URL: use the token".into(),
        });
    }
    if url.scheme() != "http" {
        return Err(invalid(
            "only http:// is supported (compose-manager listens on plain HTTP)",
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid("no host"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("no query or fragment allowed"));
    }
    Ok(trimmed.to_owned())
}
