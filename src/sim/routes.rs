//! The compose-manager routes, the request recorder, bearer auth and the checks shared by the
//! mutating calls (tag, env, project), plus the small handlers: `/status`, `/version`,
//! `/docker/evict`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequest, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::Utc;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::state::{DeployRecord, InFlight, Shared, TagEntry, PROJECT};
use super::{down, inspect, up, RecordedCall};

/// compose-manager's own image digest, as `/version` reports it.
const SELF_IMAGE: &str = "ghcr.io/nearai/compose-manager@sha256:\
    5a1e0c3b9d8f7e6a4b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a";
/// Largest request body the recorder reads.
const BODY_LIMIT: usize = 4 << 20;
/// Recorded requests kept; the oldest fall off beyond this.
const CALLS_CAP: usize = 50_000;
/// The HuggingFace cache volume of project `work`.
pub(crate) const HF_VOLUME: &str = "work_huggingface_cache";

/// The compose-manager router (newest version; legacy mode is decided per request).
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/compose/up", post(up::compose_up))
        .route("/compose/down", post(down::compose_down))
        .route("/compose/logs", post(inspect::compose_logs))
        .route("/docker/ps", get(inspect::docker_ps))
        .route("/docker/evict", post(evict_model))
        .route("/status", get(get_status))
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

/// A refused request: `{"status":"error","error":…}` with its status code.
#[derive(Debug)]
pub(crate) struct Refusal {
    status: StatusCode,
    message: String,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({"status": "error", "error": self.message})),
        )
            .into_response()
    }
}

/// `{"status":"error","error":…}` with `status`.
pub(crate) fn error(status: StatusCode, message: impl Into<String>) -> Refusal {
    Refusal {
        status,
        message: message.into(),
    }
}

/// The 409 of a held lock.
pub(crate) fn busy(action: &str) -> Refusal {
    error(
        StatusCode::CONFLICT,
        format!("another docker operation is already in progress: {action}"),
    )
}

/// `Authorization: Bearer <token>`, exactly; 401 with the documented messages otherwise.
pub(crate) fn authorize(shared: &Shared, headers: &HeaderMap) -> Result<(), Refusal> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match presented {
        None => Err(error(
            StatusCode::UNAUTHORIZED,
            "Missing or invalid Authorization header",
        )),
        Some(token) if token == shared.token => Ok(()),
        Some(_) => Err(error(StatusCode::UNAUTHORIZED, "Invalid token")),
    }
}

/// The tag table: unknown → `tag not found`, younger than the minimum age → `tag too recent`.
/// A scripted rate limit of the git host answers like an unknown tag.
pub(crate) fn check_tag<'a>(shared: &'a Shared, tag: &str) -> Result<&'a TagEntry, Refusal> {
    let rate_limited = {
        let mut st = shared.state();
        let limited = st.faults.tag_rate_limited > 0;
        st.faults.tag_rate_limited = st.faults.tag_rate_limited.saturating_sub(1);
        limited
    };
    if rate_limited {
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!("tag not found: {tag}"),
        ));
    }
    let entry = shared
        .find_tag(tag)
        .ok_or_else(|| error(StatusCode::BAD_REQUEST, format!("tag not found: {tag}")))?;
    if entry.committed_at > Utc::now() - shared.min_tag_age {
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!(
                "tag too recent: {} is less than {} hours old",
                entry.committed_at.format("%Y-%m-%d %H:%M:%S UTC"),
                shared.min_tag_age.num_hours()
            ),
        ));
    }
    Ok(entry)
}

/// Env keys `[A-Za-z_][A-Za-z0-9_]*`, values without newlines.
pub(crate) fn check_env(env: &BTreeMap<String, String>) -> Result<(), Refusal> {
    for (key, value) in env {
        let mut chars = key.chars();
        let valid = chars
            .next()
            .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
            && chars.all(|c| c == '_' || c.is_ascii_alphanumeric());
        if !valid {
            return Err(error(
                StatusCode::BAD_REQUEST,
                format!("invalid env var key: '{key}' (must match [A-Za-z_][A-Za-z0-9_]*)"),
            ));
        }
        if value.contains('\n') || value.contains('\r') {
            return Err(error(
                StatusCode::BAD_REQUEST,
                format!("env var '{key}' value must not contain newlines"),
            ));
        }
    }
    Ok(())
}

/// A `project` override must be canonical and not reserved. (The simulated host models the
/// one default project, `work`; an accepted override acts on it too.)
pub(crate) fn check_project(project: Option<&str>) -> Result<(), Refusal> {
    let Some(p) = project else {
        return Ok(());
    };
    let message = if p.is_empty() {
        format!("project name '{p}' is empty after sanitization")
    } else if p == PROJECT || p == "dstack" {
        format!("project '{p}' is reserved and cannot be overridden")
    } else if !p.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        || !p
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
    {
        format!(
            "project '{p}' is not canonical (must be lowercase [a-z0-9_-], \
             starting with a letter or digit)"
        )
    } else {
        return Ok(());
    };
    Err(error(StatusCode::BAD_REQUEST, message))
}

async fn get_status(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(denied) = authorize(&shared, &headers) {
        return denied.into_response();
    }
    Json(json!({"status": "ok", "in_flight": shared.in_flight()})).into_response()
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
