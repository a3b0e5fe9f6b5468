//! A fake engine on a loopback port, for the kinds that read engines over HTTP: each replica's
//! Prometheus page (`/{service}/metrics`, a request counter that grows by one per scrape while
//! the replica takes traffic) and its OpenAI-compatible API (`/{service}/v1/models`,
//! `/{service}/v1/chat/completions`). What each replica answers is set per test; every call
//! is counted by replica.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;

/// How one replica answers.
#[derive(Debug, Clone, Default)]
pub(super) struct Replica {
    /// Whether its request counter grows between scrapes.
    pub idle: bool,
    /// Its metrics page answers this status instead, when set.
    pub metrics_status: Option<u16>,
    /// Its chat completions answer this status instead, when set.
    pub chat_status: Option<u16>,
    /// Its chat completions answer only after this long.
    pub chat_delay: Option<Duration>,
}

#[derive(Default)]
struct Engines {
    replicas: BTreeMap<String, Replica>,
    requests: BTreeMap<String, u64>,
    /// API calls by replica.
    api_calls: BTreeMap<String, u64>,
}

type Shared = Arc<Mutex<Engines>>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, Engines> {
    s.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The fake engines' server; it stops when dropped.
pub(super) struct FakeEngines {
    base: String,
    shared: Shared,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl FakeEngines {
    pub async fn start() -> FakeEngines {
        let shared = Shared::default();
        let app = Router::new()
            .route("/{service}/metrics", get(metrics))
            .route("/{service}/v1/models", get(models))
            .route("/{service}/v1/chat/completions", post(chat))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let base = format!("http://{}", listener.local_addr().expect("its address"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
        FakeEngines {
            base,
            shared,
            _stop: stop,
        }
    }

    /// `service`'s API base URL.
    pub fn api_url(&self, service: &str) -> String {
        format!("{}/{service}", self.base)
    }

    /// `service`'s Prometheus page.
    pub fn metrics_url(&self, service: &str) -> String {
        format!("{}/{service}/metrics", self.base)
    }

    /// Sets how `service` answers.
    pub fn set(&self, service: &str, replica: Replica) {
        lock(&self.shared)
            .replicas
            .insert(service.to_owned(), replica);
    }

    /// How many API calls `service` got.
    pub fn api_calls(&self, service: &str) -> u64 {
        lock(&self.shared)
            .api_calls
            .get(service)
            .copied()
            .unwrap_or(0)
    }
}

async fn metrics(State(s): State<Shared>, Path(service): Path<String>) -> Response {
    let mut engines = lock(&s);
    let replica = engines.replicas.get(&service).cloned().unwrap_or_default();
    if let Some(status) = replica.metrics_status {
        return status_only(status);
    }
    let n = engines.requests.entry(service).or_default();
    if !replica.idle {
        *n += 1;
    }
    let name = "sglang:num_requests_total";
    format!("# HELP {name} Number of requests processed.\n# TYPE {name} counter\n{name}{{model_name=\"m\"}} {n}.0\n")
        .into_response()
}

async fn models(State(s): State<Shared>, Path(service): Path<String>) -> Response {
    *lock(&s).api_calls.entry(service).or_default() += 1;
    axum::Json(json!({"object": "list", "data": [{"id": "z-ai/glm-5.3-flash", "object": "model"}]}))
        .into_response()
}

async fn chat(State(s): State<Shared>, Path(service): Path<String>) -> Response {
    let replica = {
        let mut engines = lock(&s);
        *engines.api_calls.entry(service.clone()).or_default() += 1;
        engines.replicas.get(&service).cloned().unwrap_or_default()
    };
    if let Some(delay) = replica.chat_delay {
        tokio::time::sleep(delay).await;
    }
    if let Some(status) = replica.chat_status {
        return status_only(status);
    }
    axum::Json(json!({
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }))
    .into_response()
}

fn status_only(status: u16) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        code,
        axum::Json(json!({"error": {"message": "fault", "code": status}})),
    )
        .into_response()
}
