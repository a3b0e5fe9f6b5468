//! One simulated engine's HTTP server: `/health`, `/metrics` and the OpenAI-compatible API
//! on its own loopback port.

use std::sync::Arc;

use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::engine::{health, EngineCtx};
use super::state::Shared;

/// Serves one engine's port (for `names`, see [`EngineCtx`]) until the host shuts down.
pub(crate) fn serve_engine(
    shared: Arc<Shared>,
    names: Vec<String>,
    listener: TcpListener,
) -> JoinHandle<()> {
    let mut stop = shared.shutdown.clone();
    let app = Router::new()
        .route("/health", get(health))
        .merge(super::openai::routes())
        .route("/metrics", get(super::metrics::serve))
        .with_state(EngineCtx { shared, names });
    tokio::spawn(async move {
        let signal = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(signal)
            .await
        {
            tracing::warn!(error = %e, "simulated engine server stopped");
        }
    })
}
