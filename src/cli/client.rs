//! A small client of canaryd's own API, used by the client commands, dev mode and the tests.

use std::time::Duration;

use anyhow::{anyhow, Context};
use serde_json::Value;

use crate::api::RolloutOut;

/// The id of the rollout a `POST` created, from its answer.
pub fn created_id(answer: &Value) -> anyhow::Result<String> {
    answer["id"]
        .as_str()
        .map(str::to_owned)
        .context("the daemon answered without an id")
}

/// Talks to a canaryd daemon.
#[derive(Clone, Debug)]
pub struct ApiClient {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl ApiClient {
    /// A client for `base` (e.g. `http://127.0.0.1:7878`) with an optional bearer token.
    pub fn new(base: &str, token: Option<String>) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()?;
        Ok(Self {
            base: base.trim_end_matches('/').to_owned(),
            token,
            http,
        })
    }

    /// A client configured from `CANARYD_TOKEN`.
    pub fn from_env(base: &str) -> anyhow::Result<Self> {
        Self::new(
            base,
            std::env::var("CANARYD_TOKEN")
                .ok()
                .filter(|t| !t.is_empty()),
        )
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let req = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> anyhow::Result<Value> {
        let res = req
            .send()
            .await
            .with_context(|| format!("cannot reach canaryd at {}", self.base))?;
        let status = res.status();
        let body: Value = res.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(body);
        }
        Err(self.refusal(status.as_u16(), &body))
    }

    /// The daemon's refusal as an error; a 401 says where the token comes from.
    fn refusal(&self, status: u16, body: &Value) -> anyhow::Error {
        let code = body["error"]["code"].as_str().unwrap_or("error");
        let message = body["error"]["message"].as_str().unwrap_or("");
        if status != 401 {
            return anyhow!("{status} {code}: {message}");
        }
        let hint = match self.token {
            None => "CANARYD_TOKEN is not set: export CANARYD_TOKEN=<an API token of the daemon's auth.tokens>",
            Some(_) => "the token in CANARYD_TOKEN is not one of this daemon's auth.tokens",
        };
        anyhow!(
            "{status} {code}: {message}\nhint: {hint} (daemon {}, from CANARYD_SERVER or --server)",
            self.base
        )
    }

    /// `GET path` as JSON.
    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.send(self.request(reqwest::Method::GET, path)).await
    }

    /// `POST path` with a JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.send(self.request(reqwest::Method::POST, path).json(body))
            .await
    }

    /// `POST path` with a raw body of the given content type.
    pub async fn post_raw(
        &self,
        path: &str,
        content_type: &str,
        body: String,
    ) -> anyhow::Result<Value> {
        let req = self
            .request(reqwest::Method::POST, path)
            .header("content-type", content_type)
            .body(body);
        self.send(req).await
    }

    /// Opens `GET path` as a stream (Server-Sent Events): the caller reads the body with
    /// `chunk()`. No overall timeout; a stream silent for 45 s (three missed keep-alives) fails.
    pub async fn get_stream(
        &self,
        path: &str,
        last_event_id: Option<i64>,
    ) -> anyhow::Result<reqwest::Response> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(45))
            .build()?;
        let mut req = http
            .get(format!("{}{path}", self.base))
            .header("accept", "text/event-stream");
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id.to_string());
        }
        let res = req
            .send()
            .await
            .with_context(|| format!("cannot reach canaryd at {}", self.base))?;
        if !res.status().is_success() {
            let status = res.status().as_u16();
            let body: Value = res.json().await.unwrap_or(Value::Null);
            return Err(self.refusal(status, &body));
        }
        Ok(res)
    }

    /// One rollout.
    pub async fn rollout(&self, id: &str) -> anyhow::Result<RolloutOut> {
        Ok(serde_json::from_value(
            self.get(&format!("/v1/rollouts/{id}")).await?,
        )?)
    }
}
