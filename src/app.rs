//! Start-up: open the database, build the engine, resume unfinished rollouts, bind the
//! listener. `App` knows its port, so tests can run it on `127.0.0.1:0`.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::config::ResolvedConfig;
use crate::domain::runbook::Runbook;
use crate::engine::Engine;
use crate::http::{router, AppState};
use crate::store::Store;

/// A daemon ready to serve.
pub struct App {
    listener: TcpListener,
    state: AppState,
}

impl App {
    /// Opens and migrates the database, resumes every unfinished rollout, then binds.
    pub async fn build(
        config: ResolvedConfig,
        runbooks: BTreeMap<String, Runbook>,
    ) -> anyhow::Result<App> {
        let store = Store::open(&config.database)
            .await
            .with_context(|| format!("opening the database {}", config.database.display()))?;
        let names: BTreeSet<String> = runbooks.keys().cloned().collect();
        let engine =
            Engine::new(store, &config, runbooks).context("building compose-manager clients")?;
        let resumed = engine
            .recover()
            .await
            .context("resuming unfinished rollouts")?;
        if resumed > 0 {
            tracing::info!(
                rollouts = resumed,
                "resumed {resumed} unfinished rollout(s)"
            );
        }
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding {}", config.listen))?;
        let state = AppState {
            engine,
            tokens: Arc::new(config.tokens.clone()),
            config: Arc::new(config),
            runbooks: Arc::new(names),
            ready: Arc::new(AtomicBool::new(false)),
        };
        state.ready.store(true, Ordering::SeqCst);
        Ok(App { listener, state })
    }

    /// The address actually bound (the port, when built with port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The engine, for in-process callers (tests, dev mode).
    pub fn engine(&self) -> Engine {
        self.state.engine.clone()
    }

    /// Serves until `shutdown` completes; rollouts stay resumable in SQLite.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let app = router(self.state);
        axum::serve(self.listener, app)
            .with_graceful_shutdown(shutdown)
            .await
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutdown requested; unfinished rollouts resume at next start");
}
