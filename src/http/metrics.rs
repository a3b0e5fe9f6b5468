//! `GET /metrics`: Prometheus exposition (no auth, like `/healthz`: it holds no secrets).

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::{ApiError, AppState};

pub(super) fn router() -> Router<AppState> {
    Router::new().route("/metrics", get(get_metrics))
}

async fn get_metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let store = state.engine.store();
    let internal = |e: crate::store::StoreError| ApiError::Internal(e.to_string());
    let active = store.count_active_rollouts().await.map_err(internal)?;
    let down = store.replicas_left_down().await.map_err(internal)?;
    let (ended, targets) = store.release_metrics().await.map_err(internal)?;
    let targets: Vec<(String, i64)> = targets
        .iter()
        .map(|(state, n)| (crate::api::release::target_state_name(state), *n))
        .collect();
    state.metrics.set_releases(&ended, &targets);
    let health = store.health();
    state
        .metrics
        .set_storage(health.errors_total(), health.waiting().len() as i64);
    let body = state.metrics.encode(active, down.len() as i64);
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    Ok(([(header::CONTENT_TYPE, content_type)], body).into_response())
}
