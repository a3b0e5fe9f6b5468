//! The HTTP API (docs/reference.md). Each resource module owns its `router()`; this module
//! merges them and holds the shared state.

mod auth;
mod body;
mod dashboard;
mod edge;
mod error;
mod event;
mod host;
mod metrics;
mod openapi;
mod ops;
mod pages;
mod release;
mod replica;
mod rollback;
mod rollout;
mod serve;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::Router;
use tower_http::trace::TraceLayer;

use crate::config::{ApiToken, ResolvedConfig};
use crate::domain::plan::KnownTargets;
use crate::engine::Engine;

pub use auth::Actor;
pub use body::MAX_BODY_BYTES;
pub use error::{ApiError, ERROR_CODES};
pub use serve::{connection_cap, raise_open_files_limit, serve};

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub engine: Engine,
    /// The host doctor and its last report per host.
    pub doctor: Arc<crate::doctor::Doctor>,
    pub config: Arc<ResolvedConfig>,
    pub tokens: Arc<Vec<ApiToken>>,
    /// The configured hosts, replicas and aliases and the loaded runbooks, built once at start:
    /// a fleet of 1,000 hosts makes it about 0.5 MB, too much to rebuild per request.
    pub known: Arc<KnownTargets>,
    /// Prometheus metrics (`/metrics`).
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Set once the database is open and restart recovery is done (`/readyz`).
    pub ready: Arc<AtomicBool>,
}

/// The whole API.
pub fn router(state: AppState) -> Router {
    Router::new()
        .merge(rollout::router())
        .merge(release::router())
        .merge(event::router())
        .merge(rollback::router())
        .merge(replica::router())
        .merge(host::router())
        .merge(ops::router())
        .merge(openapi::router())
        .merge(dashboard::router())
        .merge(pages::router())
        .merge(metrics::router())
        .fallback(error::route_not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            edge::guard,
        ))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}
