//! `/v1/hosts`: the configured hosts with their last doctor report, and
//! `/v1/hosts/{host}/doctor`, which runs the host doctor (docs/oncall.md). Reading roles suffice:
//! the doctor changes nothing on the host.

use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use super::{Actor, ApiError, AppState};
use crate::doctor::DoctorReport;

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/hosts", get(list_hosts))
        .route("/v1/hosts/{host}/doctor", get(run_doctor))
}

#[derive(Debug, Serialize)]
struct HostOut {
    host: String,
    project: String,
    replicas: Vec<String>,
    /// `null` until the doctor ran for this host since the daemon started.
    last_doctor: Option<DoctorReport>,
}

async fn list_hosts(State(state): State<AppState>, _actor: Actor) -> Json<Vec<HostOut>> {
    let hosts = state
        .config
        .hosts
        .iter()
        .map(|(name, host)| HostOut {
            host: name.clone(),
            project: host.project.clone(),
            replicas: host.replicas.keys().cloned().collect(),
            last_doctor: state.doctor.last(name),
        })
        .collect();
    Json(hosts)
}

async fn run_doctor(
    State(state): State<AppState>,
    _actor: Actor,
    Path(host): Path<String>,
) -> Result<Json<DoctorReport>, ApiError> {
    if !state.config.hosts.contains_key(&host) {
        return Err(ApiError::NotFound {
            code: "unknown_host",
            message: format!("{host} is not a configured host"),
        });
    }
    Ok(Json(state.doctor.run(&host).await?))
}
