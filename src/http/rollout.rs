//! `/v1/rollouts`: submit a canary plan, read rollouts, abort.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Actor, ApiError, AppState};
use crate::domain::plan;
use crate::store::{Rollout, Step};

mod list;

/// Plans larger than this are refused (docs/reference.md#canary-plans).
pub const MAX_PLAN_BYTES: usize = 64 * 1024;

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/rollouts",
            post(create_rollout).get(list::list_rollouts),
        )
        .route("/v1/rollouts/{id}", get(get_rollout))
        .route("/v1/rollouts/{id}/abort", post(abort_rollout))
}

/// A rollout as the API shows it.
#[derive(Debug, Serialize, Deserialize, Clone)]
pub struct RolloutOut {
    pub id: String,
    pub kind: String,
    pub status: String,
    pub host: String,
    pub file: String,
    pub service: String,
    pub tag: String,
    pub runbook: String,
    pub actor: String,
    pub reason: String,
    pub env_overrides: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub error: Option<ErrorOut>,
    pub rollback_of: Option<String>,
    pub rolled_back_by: Option<String>,
    pub steps: Vec<StepOut>,
}

/// A rollout's error.
#[derive(Debug, Serialize, Deserialize, Clone)]
pub struct ErrorOut {
    pub code: String,
    pub message: String,
}

/// One step with its evidence.
#[derive(Debug, Serialize, Deserialize, Clone)]
pub struct StepOut {
    pub name: String,
    pub kind: String,
    pub status: String,
    pub attempts: i64,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// When a running wait gives up (kept across restarts).
    pub deadline_at: Option<DateTime<Utc>>,
    pub detail: serde_json::Value,
}

impl RolloutOut {
    pub fn new(r: Rollout, steps: Vec<Step>) -> Self {
        Self {
            kind: r.kind.as_str().to_owned(),
            status: r.status.as_str().to_owned(),
            env_overrides: r.env_overrides.keys().cloned().collect(),
            error: r.error_code.map(|code| ErrorOut {
                code,
                message: r.error_message.unwrap_or_default(),
            }),
            steps: steps.into_iter().map(StepOut::from).collect(),
            id: r.id,
            host: r.host,
            file: r.file,
            service: r.service,
            tag: r.tag,
            runbook: r.runbook,
            actor: r.actor,
            reason: r.reason,
            created_at: r.created_at,
            started_at: r.started_at,
            finished_at: r.finished_at,
            rollback_of: r.rollback_of,
            rolled_back_by: r.rolled_back_by,
        }
    }
}

impl From<Step> for StepOut {
    fn from(s: Step) -> Self {
        Self {
            name: s.name,
            kind: s.kind,
            status: s.status.as_str().to_owned(),
            attempts: s.attempts,
            started_at: s.started_at,
            finished_at: s.finished_at,
            deadline_at: s.deadline_at,
            detail: s.detail,
        }
    }
}

pub(super) async fn rollout_out(
    state: &AppState,
    rollout: Rollout,
) -> Result<RolloutOut, ApiError> {
    let steps = state
        .engine
        .store()
        .steps(&rollout.id)
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(RolloutOut::new(rollout, steps))
}

pub(super) fn created(out: RolloutOut) -> Response {
    let location = format!("/v1/rollouts/{}", out.id);
    (
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(out),
    )
        .into_response()
}

async fn create_rollout(
    State(state): State<AppState>,
    actor: Actor,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    actor.require_operate()?;
    if body.len() > MAX_PLAN_BYTES {
        return Err(ApiError::bad_request(
            "body_too_large",
            format!(
                "the plan is {} bytes; the limit is {MAX_PLAN_BYTES}",
                body.len()
            ),
        ));
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let spec = if content_type.starts_with("application/yaml")
        || content_type.starts_with("application/x-yaml")
    {
        let text = std::str::from_utf8(&body)
            .map_err(|_| ApiError::bad_request("invalid_body", "the plan is not UTF-8"))?;
        plan::parse_yaml(text)?
    } else if content_type.starts_with("application/json") {
        plan::parse_json(&body)?
    } else {
        return Err(ApiError::bad_request(
            "unsupported_media_type",
            format!("Content-Type {content_type} is neither application/json nor application/yaml"),
        ));
    };
    let known = state.config.known_targets(&state.runbooks);
    let canary = plan::validate(spec, &known)?;
    let rollout = state.engine.submit_canary(canary, &actor.name).await?;
    Ok(created(rollout_out(&state, rollout).await?))
}

async fn get_rollout(
    State(state): State<AppState>,
    _actor: Actor,
    Path(id): Path<String>,
) -> Result<Json<RolloutOut>, ApiError> {
    let rollout = state.engine.get(&id).await?;
    Ok(Json(rollout_out(&state, rollout).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AbortIn {
    reason: String,
}

async fn abort_rollout(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<RolloutOut>, ApiError> {
    actor.require_rollback()?;
    let input: AbortIn = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(
            "invalid_body",
            format!("abort body must be {{\"reason\": \"...\"}}: {e}"),
        )
    })?;
    if input.reason.trim().is_empty() {
        return Err(ApiError::Unprocessable {
            code: "missing_reason",
            message: "reason must not be empty".into(),
        });
    }
    let rollout = state.engine.abort(&id, &actor.name, &input.reason).await?;
    Ok(Json(rollout_out(&state, rollout).await?))
}
