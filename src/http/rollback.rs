//! `POST /v1/rollbacks`: one-click rollback of a single replica (docs/reference.md#rollback).

use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use axum::Router;

use super::body::{JsonBody, JsonInput};
use super::rollout::{created, rollout_out};
use super::{Actor, ApiError, AppState};
use crate::domain::names::Tag;
use crate::engine::RollbackRequest;

pub(super) fn router() -> Router<AppState> {
    Router::new().route("/v1/rollbacks", post(create_rollback))
}

impl JsonInput for RollbackRequest {
    const NAME: &'static str = "rollback body";
    const FIELDS: &'static [&'static str] = &["host", "service", "reason", "to_tag", "preempt"];
    const REQUIRES_REASON: bool = true;
}

async fn create_rollback(
    State(state): State<AppState>,
    actor: Actor,
    body: Result<JsonBody<RollbackRequest>, ApiError>,
) -> Result<Response, ApiError> {
    actor.require_rollback()?;
    let JsonBody(req) = body?;
    check_target(&state, &req)?;
    let rollout = state.engine.submit_rollback(req, &actor.name).await?;
    Ok(created(rollout_out(&state, rollout).await?))
}

/// `unknown_host` and `unknown_service`, as a canary plan naming them gets.
fn check_target(state: &AppState, req: &RollbackRequest) -> Result<(), ApiError> {
    let Some(host) = state.config.hosts.get(&req.host) else {
        let hosts: Vec<&str> = state.config.hosts.keys().map(String::as_str).collect();
        return Err(ApiError::Unprocessable {
            code: "unknown_host",
            message: format!(
                "host: \"{}\" is not a configured host (configured: {})",
                req.host,
                hosts.join(", ")
            ),
        });
    };
    if let Some(Err(e)) = req.to_tag.clone().map(Tag::parse) {
        return Err(ApiError::Unprocessable {
            code: "invalid_tag",
            message: format!("to_tag: {}, got \"{}\"", e.why, e.shown),
        });
    }
    // A former name (`aliases`) stands for its replica.
    if !host.is_replica_name(&req.service) {
        let names: Vec<&str> = host.replicas.keys().map(String::as_str).collect();
        return Err(ApiError::Unprocessable {
            code: "unknown_service",
            message: format!(
                "service: \"{}\" is not a configured replica of {} (replicas: {})",
                req.service,
                req.host,
                names.join(", ")
            ),
        });
    }
    Ok(())
}
