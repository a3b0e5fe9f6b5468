//! `/v1/replicas`: each configured replica with its current deployment and active rollout.

use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use super::{Actor, ApiError, AppState};
use crate::store::Deployment;

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/replicas", get(list_replicas))
        .route(
            "/v1/replicas/{host}/{service}/deployments",
            get(list_deployments),
        )
}

#[derive(Debug, Serialize)]
struct ReplicaOut {
    host: String,
    service: String,
    group: String,
    health_url: String,
    current_deployment: Option<Deployment>,
    active_rollout: Option<String>,
    /// A rollout took it down and none brought it back (`replica_left_down`).
    left_down: bool,
}

async fn list_replicas(
    State(state): State<AppState>,
    _actor: Actor,
) -> Result<Json<Vec<ReplicaOut>>, ApiError> {
    let store = state.engine.store();
    let internal = |e: crate::store::StoreError| ApiError::Internal(e.to_string());
    let down = store.replicas_left_down().await.map_err(internal)?;
    let mut out = Vec::new();
    for (host_name, host) in &state.config.hosts {
        let active = store.active_rollout_on(host_name).await.map_err(internal)?;
        for (service, replica) in &host.replicas {
            let current = store
                .recent_deployments(host_name, service, 1)
                .await
                .map_err(internal)?
                .into_iter()
                .next();
            out.push(ReplicaOut {
                host: host_name.clone(),
                service: service.clone(),
                group: replica.group.clone(),
                health_url: replica.health_url.clone(),
                current_deployment: current,
                active_rollout: active
                    .as_ref()
                    .filter(|r| r.service == **service)
                    .map(|r| r.id.clone()),
                left_down: down.iter().any(|(h, s)| h == host_name && s == service),
            });
        }
    }
    Ok(Json(out))
}

async fn list_deployments(
    State(state): State<AppState>,
    _actor: Actor,
    Path((host, service)): Path<(String, String)>,
) -> Result<Json<Vec<Deployment>>, ApiError> {
    // A former name (`aliases`) reads its replica's history.
    let slot = state
        .config
        .hosts
        .get(&host)
        .and_then(|h| h.replica(&service))
        .map(|(slot, _)| slot.to_owned());
    let Some(service) = slot else {
        return Err(ApiError::NotFound {
            code: "unknown_replica",
            message: format!("{service} is not a configured replica of {host}"),
        });
    };
    let list = state
        .engine
        .store()
        .deployments(&host, &service)
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(Json(list))
}
