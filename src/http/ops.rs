//! Liveness and readiness.

use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use super::{ApiError, AppState};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(get_healthz))
        .route("/readyz", get(get_readyz))
}

async fn get_healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn get_readyz(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    if !state.ready.load(Ordering::SeqCst) {
        return Err(ApiError::Unavailable(
            "restart recovery is not finished".into(),
        ));
    }
    if let Some(failing) = state.engine.store().health().failing() {
        return Err(ApiError::Unavailable(format!(
            "the database cannot be written: {} (since {}; {} rollout(s) wait to record their last call and send nothing meanwhile)",
            failing.error,
            crate::store::fmt_time(failing.since),
            failing.waiting
        )));
    }
    if !state.engine.store().ping().await {
        return Err(ApiError::Unavailable("the database does not answer".into()));
    }
    Ok(Json(json!({"status": "ready"})))
}
