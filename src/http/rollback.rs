//! `POST /v1/rollbacks`: one-click rollback of a single replica (docs/reference.md#rollback).

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use axum::Router;

use super::rollout::{created, rollout_out};
use super::{Actor, ApiError, AppState};
use crate::engine::RollbackRequest;

pub(super) fn router() -> Router<AppState> {
    Router::new().route("/v1/rollbacks", post(create_rollback))
}

async fn create_rollback(
    State(state): State<AppState>,
    actor: Actor,
    body: Bytes,
) -> Result<Response, ApiError> {
    actor.require_rollback()?;
    let req: RollbackRequest = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(
            "invalid_body",
            format!("rollback body: {e} (fields: host, service, reason, to_tag, preempt)"),
        )
    })?;
    if req.reason.trim().is_empty() {
        return Err(ApiError::Unprocessable {
            code: "missing_reason",
            message: "reason must not be empty".into(),
        });
    }
    let rollout = state.engine.submit_rollback(req, &actor.name).await?;
    Ok(created(rollout_out(&state, rollout).await?))
}
