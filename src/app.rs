//! Start-up: bind the listener, open the database, build the engine, resume unfinished
//! rollouts, then serve. `App` knows its port, so tests can run it on `127.0.0.1:0`.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
    grace: Duration,
    /// The database is removed when the process ends (`canaryd dev` without `--db`): its
    /// unfinished rollouts do not resume anywhere, and the stop says so.
    temporary: bool,
}

/// How long a graceful shutdown lets running compose calls finish before stopping them.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

impl App {
    /// Binds the listener, opens and migrates the database and resumes every unfinished
    /// rollout. Binding comes first, so a daemon that cannot listen creates no database;
    /// requests wait in the socket's backlog until `run_until_stopped` serves them, after
    /// recovery.
    pub async fn build(
        config: ResolvedConfig,
        runbooks: BTreeMap<String, Runbook>,
    ) -> anyhow::Result<App> {
        Self::build_waiting(config, runbooks, Duration::ZERO).await
    }

    /// `build`, waiting up to `lock_wait` for another daemon that owns the database to exit
    /// (`serve --wait-for-lock`); its unfinished rollouts are then resumed as after a restart.
    /// A database still owned after that fails with `StoreError::InUse`, before anything of it
    /// is read or written.
    pub async fn build_waiting(
        config: ResolvedConfig,
        runbooks: BTreeMap<String, Runbook>,
        lock_wait: Duration,
    ) -> anyhow::Result<App> {
        let listener = TcpListener::bind(config.listen).await.map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
                format!(
                    " (another canaryd may be running there: `canaryd healthcheck --url \
                     http://{}/healthz` tells; or change `listen`)",
                    config.listen
                )
            } else {
                String::new()
            };
            anyhow::Error::new(e).context(format!("binding {}{hint}", config.listen))
        })?;
        let store = Store::open_waiting(&config.database, lock_wait)
            .await
            .with_context(|| format!("opening the database {}", config.database.display()))?;
        let names: BTreeSet<String> = runbooks.keys().cloned().collect();
        let metrics = crate::metrics::Metrics::new();
        tokio::spawn(Arc::clone(&metrics).follow(store.clone()));
        let observer = |host: &str| metrics.compose_observer(host);
        let engine = Engine::with_observers(store, &config, runbooks, Some(&observer))
            .context("building compose-manager clients")?;
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
        engine
            .recover_releases()
            .await
            .context("resuming unfinished releases")?;
        crate::store::spawn_retention(engine.store().clone(), config.retention_days);
        let known = Arc::new(config.known_targets(&names));
        let state = AppState {
            doctor: Arc::new(crate::doctor::Doctor::new(engine.clone())),
            engine,
            known,
            tokens: Arc::new(config.tokens.clone()),
            config: Arc::new(config),
            metrics,
            ready: Arc::new(AtomicBool::new(false)),
        };
        state.ready.store(true, Ordering::SeqCst);
        Ok(App {
            listener,
            state,
            grace: DEFAULT_SHUTDOWN_GRACE,
            temporary: false,
        })
    }

    /// The address actually bound (the port, when built with port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The engine, for in-process callers (tests, dev mode).
    pub fn engine(&self) -> Engine {
        self.state.engine.clone()
    }

    /// Sets how long a graceful shutdown waits for running compose calls.
    pub fn with_shutdown_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Marks the database as removed when the process ends (`canaryd dev`'s temporary one).
    pub fn with_temporary_database(mut self) -> Self {
        self.temporary = true;
        self
    }

    /// Serves until `shutdown` completes, then stops gracefully: no new connections, requests
    /// in progress answered, rollout tasks stopped at their next step boundary or wait (a
    /// running compose call gets `grace` to end). Nothing is marked failed: every unfinished
    /// rollout resumes at next start.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let engine = self.state.engine.clone();
        // Webhook notifications from the outbox; what is not delivered at stop is sent at next start.
        let notifier = crate::notify::Notifier::spawn(
            self.state.engine.store().clone(),
            self.state.config.notifications.clone(),
            self.state.config.public_url.clone(),
        );
        let recovery = tokio::spawn(
            self.state
                .engine
                .store()
                .clone()
                .watch_storage_recovery(Duration::from_secs(2)),
        );
        let header_read_timeout = self.state.config.http.header_read_timeout;
        let open_files = crate::http::raise_open_files_limit();
        let max_connections =
            crate::http::connection_cap(self.state.config.http.max_connections, open_files);
        tracing::info!(
            open_files,
            max_connections,
            "serving at most {max_connections} connections at once (open-file limit {})",
            open_files.map_or("unknown".to_owned(), |n| n.to_string())
        );
        let app = router(self.state);
        let (signalled_tx, mut signalled) = tokio::sync::watch::channel(false);
        let shutdown = async move {
            shutdown.await;
            let _ = signalled_tx.send(true);
        };
        let serve = crate::http::serve(
            self.listener,
            app,
            header_read_timeout,
            max_connections,
            shutdown,
        );
        // Long-lived answers (event streams) must not hold the shutdown forever.
        let grace = self.grace;
        let overdue = async move {
            let _ = signalled.wait_for(|s| *s).await;
            tokio::time::sleep(grace).await;
        };
        let served = tokio::select! {
            served = serve => served,
            () = overdue => {
                tracing::warn!("open HTTP connections outlived the shutdown grace; closing them");
                Ok(())
            }
        };
        engine.shutdown(self.grace).await;
        // What the stop interrupted is what the database still holds unfinished.
        let store = engine.store();
        let unfinished = store.count_active_rollouts().await.unwrap_or(0);
        if self.temporary {
            tracing::info!(
                interrupted = unfinished,
                "canaryd stopped; its temporary database is removed, with {unfinished} unfinished rollout(s) (keep them with --db FILE)"
            );
        } else {
            tracing::info!(
                interrupted = unfinished,
                "canaryd stopped; {unfinished} unfinished rollout(s) resume at next start"
            );
        }
        notifier.stop().await;
        recovery.abort();
        // The database is given up with the stop: another daemon may take it now.
        store.close().await;
        served
    }
}

/// Resolves on SIGINT or SIGTERM.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    // The handlers are installed now, not at the first poll: a SIGTERM that arrives while
    // the caller still prints its banner must not kill the process before it cleans up.
    #[cfg(unix)]
    let (term, int) = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::terminate()).ok(),
            signal(SignalKind::interrupt()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        {
            let wait = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = wait(term) => {},
                _ = wait(int) => {},
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        tracing::info!("shutdown requested; rollouts stop at their next step boundary or wait");
    }
}
