//! `/v1/releases` (docs/reference.md#releases): submit a release, read releases, pause, resume
//! and abort them. Every target is validated as a canary plan before anything is stored.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

mod events;

use super::body::{JsonBody, JsonInput};
use super::{Actor, ApiError, AppState};
use crate::api::release::{self, ReleaseIn, ReleaseOut};
use crate::domain::release::{ReleaseControl, ReleaseStatus};
use crate::store::{NewRelease, Release, ReleaseFilter};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/releases", post(create_release).get(list_releases))
        .route("/v1/releases/{id}", get(get_release))
        .route("/v1/releases/{id}/pause", post(pause_release))
        .route("/v1/releases/{id}/resume", post(resume_release))
        .route("/v1/releases/{id}/abort", post(abort_release))
        .route("/v1/releases/{id}/events", get(events::release_events))
}

impl JsonInput for ReleaseIn {
    const NAME: &'static str = "release";
    const FIELDS: &'static [&'static str] = &[
        "file",
        "tag",
        "reason",
        "env",
        "require_logs",
        "runbook",
        "targets",
        "selector",
        "canary",
        "max_parallel_hosts",
        "on_failure",
    ];
    const REQUIRES_REASON: bool = true;
}

/// Validates a release request against the daemon's config.
pub(super) fn validate(
    state: &AppState,
    input: ReleaseIn,
    actor: &str,
) -> Result<NewRelease, ApiError> {
    release::validate(&state.config, &state.known, input, actor).map_err(ApiError::from)
}

async fn release_out(state: &AppState, release: Release) -> Result<ReleaseOut, ApiError> {
    let events = state
        .engine
        .store()
        .release_events(&release.id)
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(ReleaseOut::new(release, events))
}

async fn create_release(
    State(state): State<AppState>,
    actor: Actor,
    body: Result<JsonBody<ReleaseIn>, ApiError>,
) -> Result<Response, ApiError> {
    actor.require_operate()?;
    let JsonBody(input) = body?;
    let new = validate(&state, input, &actor.name)?;
    let release = state.engine.submit_release(new).await?;
    let out = release_out(&state, release).await?;
    let location = format!("/v1/releases/{}", out.id);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(out),
    )
        .into_response())
}

async fn get_release(
    State(state): State<AppState>,
    _actor: Actor,
    Path(id): Path<String>,
) -> Result<Json<ReleaseOut>, ApiError> {
    let release = state.engine.get_release(&id).await?;
    Ok(Json(release_out(&state, release).await?))
}

/// Query of `GET /v1/releases`.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct ListReleasesQuery {
    status: Option<String>,
    tag: Option<String>,
    actor: Option<String>,
    limit: Option<String>,
}

#[derive(Debug, Serialize)]
struct ListOut {
    items: Vec<ReleaseOut>,
}

async fn list_releases(
    State(state): State<AppState>,
    _actor: Actor,
    query: Result<Query<ListReleasesQuery>, QueryRejection>,
) -> Result<Json<ListOut>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let invalid = |param: &str, value: &str, expected: &str| {
        ApiError::bad_request(
            "invalid_query",
            format!("query parameter {param}={value:?} is not valid: expected {expected}"),
        )
    };
    let status = q
        .status
        .map(|s| {
            s.parse::<ReleaseStatus>().map_err(|_| {
                invalid(
                    "status",
                    &s,
                    "pending, running, paused, succeeded, failed or aborted",
                )
            })
        })
        .transpose()?;
    let limit = match q.limit {
        None => 50,
        Some(s) => s
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=500).contains(n))
            .ok_or_else(|| invalid("limit", &s, "an integer from 1 to 500"))?,
    };
    let filter = ReleaseFilter {
        status,
        tag: q.tag,
        actor: q.actor,
        limit,
    };
    let rows = state
        .engine
        .store()
        .list_releases(&filter)
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(Json(ListOut {
        items: rows
            .into_iter()
            .map(|r| ReleaseOut::new(r, Vec::new()))
            .collect(),
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ControlIn {
    reason: String,
}

impl JsonInput for ControlIn {
    const NAME: &'static str = "release control body";
    const FIELDS: &'static [&'static str] = &["reason"];
    const REQUIRES_REASON: bool = true;
}

async fn control(
    state: AppState,
    actor: Actor,
    id: String,
    body: Result<JsonBody<ControlIn>, ApiError>,
    control: ReleaseControl,
) -> Result<Json<ReleaseOut>, ApiError> {
    match control {
        ReleaseControl::Resume => actor.require_operate()?,
        ReleaseControl::Pause | ReleaseControl::Abort => actor.require_rollback()?,
    }
    let JsonBody(input) = body?;
    let release = state
        .engine
        .control_release(&id, control, &actor.name, input.reason.trim())
        .await?;
    Ok(Json(release_out(&state, release).await?))
}

async fn pause_release(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<String>,
    body: Result<JsonBody<ControlIn>, ApiError>,
) -> Result<Json<ReleaseOut>, ApiError> {
    control(state, actor, id, body, ReleaseControl::Pause).await
}

async fn resume_release(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<String>,
    body: Result<JsonBody<ControlIn>, ApiError>,
) -> Result<Json<ReleaseOut>, ApiError> {
    control(state, actor, id, body, ReleaseControl::Resume).await
}

async fn abort_release(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<String>,
    body: Result<JsonBody<ControlIn>, ApiError>,
) -> Result<Json<ReleaseOut>, ApiError> {
    control(state, actor, id, body, ReleaseControl::Abort).await
}
