//! The compose-manager routes and the request recorder, plus the small handlers: `/status`,
//! `/version`, `/docker/evict`. The checks the handlers share are in `checks.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::Utc;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::checks::{authorize, busy, error};
use super::state::{DeployRecord, InFlight, Shared, HF_VOLUME, PROJECT};
use super::{down, inspect, up, RecordedCall};

/// compose-manager's own image digest, as `/version` reports it.
const SELF_IMAGE: &str = "ghcr.io/nearai/compose-manager@sha256:\
    5a1e0c3b9d8f7e6a4b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a";
/// Largest request body the recorder reads.
const BODY_LIMIT: usize = 4 << 20;
/// Recorded requests kept; the oldest fall off beyond this.
const CALLS_CAP: usize = 50_000;

/// The compose-manager router (newest version; legacy mode is decided per request).
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/compose/up", post(up::compose_up))
        .route("/compose/down", post(down::compose_down))
        .route("/compose/logs", post(inspect::compose_logs))
        .route("/docker/ps", get(inspect::docker_ps))
        .route("/docker/evict", post(evict_model))
        .route("/status", get(get_status))
        .route("/host/cache", get(get_host_cache))
        .route("/version", get(get_version))
        .layer(middleware::from_fn_with_state(shared.clone(), record_call))
        .with_state(shared)
}

/// Records every request (method, path, JSON body) before anything else looks at it.
async fn record_call(State(shared): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, BODY_LIMIT).await else {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    };
    let body_value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    };
    {
        let mut st = shared.state();
        if st.calls.len() >= CALLS_CAP {
            st.calls.pop_front();
        }
        st.calls.push_back(RecordedCall {
            method: parts.method.to_string(),
            path: parts.uri.path().to_string(),
            body: body_value,
            at: Utc::now(),
        });
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

async fn get_status(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(denied) = authorize(&shared, &headers) {
        return denied.into_response();
    }
    Json(json!({"status": "ok", "in_flight": shared.in_flight()})).into_response()
}

/// `GET /host/cache`: `{"volumes":[{"name","size_bytes"}],"weights":[...]}` (newest).
async fn get_host_cache(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(denied) = authorize(&shared, &headers) {
        return denied.into_response();
    }
    let st = shared.state();
    let volumes: Vec<Value> = st
        .cache_volumes
        .iter()
        .map(|(name, size)| json!({"name": name, "size_bytes": size}))
        .collect();
    Json(json!({"volumes": volumes, "weights": st.cached_weights})).into_response()
}

#[derive(Serialize)]
struct ProjectOut {
    current: DeployRecord,
    #[serde(skip_serializing_if = "Option::is_none")]
    previous: Option<DeployRecord>,
}

#[derive(Serialize)]
struct VersionOut {
    status: &'static str,
    #[serde(flatten)]
    attempted: Option<DeployRecord>,
    image: &'static str,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    projects: BTreeMap<&'static str, ProjectOut>,
}

async fn get_version(State(shared): State<Arc<Shared>>) -> Response {
    let st = shared.state();
    let mut projects = BTreeMap::new();
    if let Some(current) = st.current.clone() {
        let previous = st.previous.clone();
        projects.insert(PROJECT, ProjectOut { current, previous });
    }
    Json(VersionOut {
        status: "ok",
        attempted: st.attempted.clone(),
        image: SELF_IMAGE,
        projects,
    })
    .into_response()
}

#[derive(Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum EvictTarget {
    #[default]
    Weights,
    Cache,
    Both,
}

#[derive(Deserialize)]
struct EvictIn {
    model: String,
    #[serde(default)]
    target: EvictTarget,
    #[serde(default)]
    cache_volume: Option<String>,
}

/// `POST /docker/evict`: 404 on a legacy host; otherwise axum's 422 for `{}` (no `model`),
/// which is what canaryd's capability probe looks for.
async fn evict_model(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    if shared.state().faults.legacy {
        return StatusCode::NOT_FOUND.into_response();
    }
    let headers = req.headers().clone();
    let input = match Json::<EvictIn>::from_request(req, &()).await {
        Ok(Json(input)) => input,
        Err(rejection) => return rejection.into_response(),
    };
    if let Err(denied) = authorize(&shared, &headers) {
        return denied.into_response();
    }
    let m = &input.model;
    let valid = !m.is_empty()
        && m.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-'))
        && !m.contains("..")
        && !m.contains("//")
        && !m.starts_with('/')
        && !m.ends_with('/');
    if !valid {
        return error(StatusCode::BAD_REQUEST, format!("invalid model id: '{m}'")).into_response();
    }
    let lock = match shared.try_lock(InFlight {
        action: "docker_evict".to_string(),
        started_at: Utc::now(),
        tag: None,
        file: None,
        services: Vec::new(),
        container: Some(m.clone()),
        seq: 0,
    }) {
        Ok(lock) => lock,
        Err(action) => return busy(&action).into_response(),
    };
    let volume = input.cache_volume.as_deref().unwrap_or(HF_VOLUME);
    if volume != HF_VOLUME {
        return error(
            StatusCode::NOT_FOUND,
            format!("volume '{volume}' not found"),
        )
        .into_response();
    }
    if input.target != EvictTarget::Cache {
        let serving: Vec<String> = {
            let st = lock.shared.state();
            st.containers
                .values()
                .filter(|c| c.running && serves(&c.command, &c.env, m))
                .map(|c| c.name.clone())
                .collect()
        };
        if !serving.is_empty() {
            return error(
                StatusCode::CONFLICT,
                format!(
                    "refusing to evict weights for '{m}': actively served by running container(s): {}",
                    serving.join(", ")
                ),
            )
            .into_response();
        }
    }
    Json(json!({"status": "ok", "output": format!("nothing to evict for '{m}' in volume '{volume}'")}))
        .into_response()
}

fn serves(command: &str, env: &BTreeMap<String, String>, model: &str) -> bool {
    let words: Vec<&str> = command.split_whitespace().collect();
    let by_flag = words
        .windows(2)
        .any(|w| (w[0] == "--model-path" || w[0] == "--model") && w[1] == model)
        || words
            .iter()
            .any(|w| *w == format!("--model-path={model}") || *w == format!("--model={model}"));
    by_flag || env.values().any(|v| v == model)
}
