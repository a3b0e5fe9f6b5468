//! `/v1/rollouts`: submit a canary plan, read rollouts, abort.

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;

use super::body::{Body, JsonBody, JsonInput};
use super::{Actor, ApiError, AppState};
use crate::api::rollout::{CallOut, RolloutOut};
use crate::domain::plan;
use crate::store::Rollout;

mod list;

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/rollouts",
            post(create_rollout).get(list::list_rollouts),
        )
        .route("/v1/rollouts/{id}", get(get_rollout))
        .route("/v1/rollouts/{id}/abort", post(abort_rollout))
        .route("/v1/rollouts/{id}/approve", post(approve_rollout))
}

pub(super) async fn rollout_out(
    state: &AppState,
    rollout: Rollout,
) -> Result<RolloutOut, ApiError> {
    let store = state.engine.store();
    let internal = |e: crate::store::StoreError| ApiError::Internal(e.to_string());
    // The calls are extra evidence: an unreadable attempt row must not hide the rollout.
    let attempts = store.attempts(&rollout.id).await.unwrap_or_else(|e| {
        tracing::warn!(rollout.id = %rollout.id, error = %e, "could not read the compose calls of rollout {}", rollout.id);
        Vec::new()
    });
    // The steps last: their evidence (dry-run plans, `docker ps` snapshots, parsed JSON, tens
    // of KB a rollout) then goes to the answer without waiting for the database again. Read
    // first, 1,000 concurrent reads held it while they queued for the attempts' read.
    let steps = store.steps(&rollout.id).await.map_err(internal)?;
    let step_ids: Vec<String> = steps.iter().map(|s| s.id.clone()).collect();
    let runbook = state.engine.runbook(&rollout.runbook).ok();
    let downtime = crate::store::downtime::of_rollout(&steps, &attempts, runbook);
    let mut out = RolloutOut::new(rollout, steps);
    out.downtime = downtime;
    for a in attempts {
        let Some(i) = step_ids.iter().position(|id| *id == a.step_id) else {
            continue;
        };
        out.steps[i].calls.push(CallOut {
            n: a.n,
            endpoint: a.endpoint,
            outcome: a.outcome,
            started_at: a.started_at,
            finished_at: a.finished_at,
            error: a.detail["error"].as_str().map(str::to_owned),
        });
    }
    Ok(out)
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
    body: Body,
) -> Result<Response, ApiError> {
    actor.require_operate()?;
    let spec = match body.content_type.as_deref() {
        Some("application/yaml" | "application/x-yaml") => {
            let text = std::str::from_utf8(&body.bytes)
                .map_err(|_| ApiError::bad_request("invalid_body", "the plan is not UTF-8"))?;
            plan::parse_yaml(text)?
        }
        Some("application/json") => plan::parse_json(&body.bytes)?,
        None => {
            return Err(ApiError::UnsupportedMediaType(
                "no Content-Type: send the plan as application/json or application/yaml".into(),
            ))
        }
        Some(other) => {
            return Err(ApiError::UnsupportedMediaType(format!(
                "Content-Type {other} is neither application/json nor application/yaml"
            )))
        }
    };
    let canary = plan::validate(spec, &state.known)?;
    let rollout = state.engine.submit_canary(canary, &actor.name).await?;
    Ok(created(rollout_out(&state, rollout).await?))
}

async fn get_rollout(
    State(state): State<AppState>,
    _actor: Actor,
    Path(id): Path<String>,
) -> Result<Json<RolloutOut>, ApiError> {
    let rollout = state.engine.get(&id).await?;
    let mut out = rollout_out(&state, rollout).await?;
    // A link, not the rollout: an unreadable release row must not hide it.
    out.release_id = state
        .engine
        .store()
        .release_of_rollout(&out.id)
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(rollout.id = %out.id, error = %e, "could not read the release of rollout {}", out.id);
            None
        });
    out.page_url = state
        .config
        .public_url
        .as_ref()
        .map(|base| format!("{base}/rollouts/{}", out.id));
    Ok(Json(out))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AbortIn {
    reason: String,
}

impl JsonInput for AbortIn {
    const NAME: &'static str = "abort body";
    const FIELDS: &'static [&'static str] = &["reason"];
    /// Absent is refused like blank: `missing_reason`, as for plans and rollbacks.
    const REQUIRES_REASON: bool = true;
}

async fn abort_rollout(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<String>,
    body: Result<JsonBody<AbortIn>, ApiError>,
) -> Result<Json<RolloutOut>, ApiError> {
    actor.require_rollback()?;
    let JsonBody(input) = body?;
    let rollout = state.engine.abort(&id, &actor.name, &input.reason).await?;
    Ok(Json(rollout_out(&state, rollout).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApproveIn {
    reason: String,
}

impl JsonInput for ApproveIn {
    const NAME: &'static str = "approve body";
    const FIELDS: &'static [&'static str] = &["reason"];
    /// An approval says why, like an abort.
    const REQUIRES_REASON: bool = true;
}

/// `POST /v1/rollouts/{id}/approve {"reason"}` (operator): the step the rollout waits on goes on.
async fn approve_rollout(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<String>,
    body: Result<JsonBody<ApproveIn>, ApiError>,
) -> Result<Json<RolloutOut>, ApiError> {
    actor.require_approve()?;
    let JsonBody(input) = body?;
    let rollout = state
        .engine
        .approve(&id, &actor.name, &input.reason)
        .await?;
    Ok(Json(rollout_out(&state, rollout).await?))
}
