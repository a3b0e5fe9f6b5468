//! Calls of an engine's OpenAI-compatible API, one at a time: a GET or a JSON POST with an
//! optional bearer, answered with the status, the body (at most [`BODY_CAP`] bytes) and the
//! latency. What the answer means is the `smoke` step's business.

use std::time::{Duration, Instant};

use crate::config::Secret;

/// Longest body kept; the rest is not read (an engine's answer to a short prompt is small).
pub const BODY_CAP: usize = 1 << 20;

/// One HTTP answer of the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiAnswer {
    /// HTTP status.
    pub status: u16,
    /// The body as text (lossy UTF-8), cut at [`BODY_CAP`] bytes.
    pub body: String,
    /// From sending the request to the end of the body.
    pub latency: Duration,
}

/// Why there was no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiCallError {
    /// The call's time ran out.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// Connect refused, reset, bad URL: no HTTP answer at all.
    #[error("{0}")]
    Transport(String),
}

/// A client for engine APIs. Cheap to clone.
#[derive(Clone, Debug)]
pub struct EngineApi {
    client: reqwest::Client,
}

impl EngineApi {
    /// A client that gives up connecting after `connect_timeout`; each call has its own time.
    pub fn new(connect_timeout: Duration) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .build()
            .unwrap_or_default();
        Self { client }
    }

    /// `GET url`.
    pub async fn get(
        &self,
        url: &str,
        token: Option<&Secret>,
        time: Duration,
    ) -> Result<ApiAnswer, ApiCallError> {
        self.send(self.client.get(url), token, time).await
    }

    /// `POST url` with a JSON body.
    pub async fn post_json(
        &self,
        url: &str,
        token: Option<&Secret>,
        body: &serde_json::Value,
        time: Duration,
    ) -> Result<ApiAnswer, ApiCallError> {
        self.send(self.client.post(url).json(body), token, time)
            .await
    }

    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        token: Option<&Secret>,
        time: Duration,
    ) -> Result<ApiAnswer, ApiCallError> {
        let req = match token {
            Some(token) => req.bearer_auth(token.expose()),
            None => req,
        };
        let started = Instant::now();
        let call = async {
            let mut res = req.send().await.map_err(|e| transport(&e))?;
            let status = res.status().as_u16();
            let mut body = Vec::new();
            while let Some(chunk) = res.chunk().await.map_err(|e| transport(&e))? {
                let room = BODY_CAP.saturating_sub(body.len());
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                if body.len() >= BODY_CAP {
                    break;
                }
            }
            Ok(ApiAnswer {
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
                latency: started.elapsed(),
            })
        };
        match tokio::time::timeout(time, call).await {
            Ok(answer) => answer,
            Err(_) => Err(ApiCallError::Timeout(time)),
        }
    }
}

/// A short reason, without the URL (which the caller knows) or the token.
fn transport(e: &reqwest::Error) -> ApiCallError {
    if e.is_timeout() {
        return ApiCallError::Timeout(Duration::ZERO);
    }
    let why = if e.is_connect() {
        "connection refused"
    } else if e.is_body() || e.is_decode() {
        "the answer's body broke off"
    } else {
        "request failed"
    };
    ApiCallError::Transport(why.to_owned())
}
