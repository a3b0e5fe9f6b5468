//! `POST /v1/rollbacks`: one-click rollback of a single replica (docs/reference.md#rollback).

use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use axum::Router;

use serde_json::Value;

use super::body::Body;
use super::rollout::{created, rollout_out};
use super::{Actor, ApiError, AppState};
use crate::engine::RollbackRequest;

pub(super) fn router() -> Router<AppState> {
    Router::new().route("/v1/rollbacks", post(create_rollback))
}

/// The fields a rollback body may have.
const FIELDS: &[&str] = &["host", "service", "reason", "to_tag", "preempt"];

async fn create_rollback(
    State(state): State<AppState>,
    actor: Actor,
    body: Body,
) -> Result<Response, ApiError> {
    actor.require_rollback()?;
    body.require_json()?;
    let req = parse(&body.bytes)?;
    check_target(&state, &req)?;
    let rollout = state.engine.submit_rollback(req, &actor.name).await?;
    Ok(created(rollout_out(&state, rollout).await?))
}

/// Reads the body with the codes a canary plan gets for the same faults: `unknown_field`,
/// `missing_reason` (absent or blank), `invalid_body` for the rest.
fn parse(bytes: &[u8]) -> Result<RollbackRequest, ApiError> {
    let invalid = |e: String| {
        ApiError::bad_request(
            "invalid_body",
            format!("rollback body: {e} (fields: {})", FIELDS.join(", ")),
        )
    };
    let value: Value = serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
    let Value::Object(map) = &value else {
        return Err(invalid("must be a JSON object".into()));
    };
    if let Some(key) = map.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(ApiError::bad_request(
            "unknown_field",
            format!(
                "{key}: unknown field (expected one of: {})",
                FIELDS.join(", ")
            ),
        ));
    }
    let blank = match map.get("reason") {
        None | Some(Value::Null) => true,
        Some(Value::String(r)) => r.trim().is_empty(),
        Some(_) => false,
    };
    if blank {
        return Err(ApiError::Unprocessable {
            code: "missing_reason",
            message: "reason: must say why (it is kept in the audit trail)".into(),
        });
    }
    serde_json::from_value(value).map_err(|e| invalid(e.to_string()))
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
    if !host.replicas.contains_key(&req.service) {
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
