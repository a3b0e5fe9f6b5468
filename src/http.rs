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
use tower_http::classify::{ServerErrorsAsFailures, SharedClassifier};
use tower_http::trace::{DefaultOnFailure, TraceLayer};

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
        .layer(trace())
        .with_state(state)
}

/// The requests' trace. An answer that failed (5xx) is logged at debug, not at error:
/// `/readyz`'s 503 is what a probe asks every few seconds while the daemon is not ready,
/// and an internal error is logged at error by `ApiError` itself, with its cause.
fn trace() -> TraceLayer<SharedClassifier<ServerErrorsAsFailures>> {
    TraceLayer::new_for_http().on_failure(DefaultOnFailure::new().level(tracing::Level::DEBUG))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use axum::routing::get;
    use tower::ServiceExt;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if let Ok(mut v) = self.0.lock() {
                v.extend_from_slice(buf);
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_503_answer_logs_nothing_at_error() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let _default = tracing::subscriber::set_default(subscriber);
        let app = axum::Router::new()
            .route(
                "/readyz",
                get(|| async { super::ApiError::Unavailable("not yet".into()) }),
            )
            .layer(super::trace());
        for _ in 0..3 {
            let res = app
                .clone()
                .oneshot(
                    Request::get("/readyz")
                        .body(Body::empty())
                        .expect("request"),
                )
                .await
                .expect("answer");
            assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        }
        let text = String::from_utf8(captured.0.lock().expect("log").clone()).expect("utf-8");
        assert!(
            text.contains("response failed"),
            "the failure is still traced: {text}"
        );
        assert!(!text.contains("ERROR"), "{text}");
    }
}
