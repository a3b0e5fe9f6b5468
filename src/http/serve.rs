//! The HTTP/1 server loop. `axum::serve` sets no header read timeout, so a client that opens
//! a connection and sends its headers a byte at a time holds it forever; this loop is
//! `axum::serve` with hyper's `header_read_timeout` (which also closes idle keep-alive
//! connections after that long). Body reads are bounded by the `Body` extractor.
//!
//! It also serves at most `max_connections` connections at once: the next ones wait in the
//! kernel's listen backlog, holding no descriptor of the daemon's, until one closes. A flood of
//! idle connections therefore cannot take the descriptors that calls to compose-manager and
//! the engines need (safety rule 22), and at start the open-file limit is raised to its hard
//! limit ([`raise_open_files_limit`]), as Go's runtime does.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

/// Raises this process's soft limit of open files to its hard limit and returns the limit now
/// in force (`None` when it cannot be read). systemd's default soft limit is 1,024 even where
/// the hard limit is far higher.
pub fn raise_open_files_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes the struct it is given, which lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: `setrlimit` only reads the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
        }
    }
    Some(limit.rlim_cur)
}

/// The connections served at once: the configured cap, never more than half the open-file
/// limit (the other half for the database, the log and calls to hosts).
pub fn connection_cap(configured: usize, open_files: Option<u64>) -> usize {
    let half = open_files.map_or(usize::MAX, |n| usize::try_from(n / 2).unwrap_or(usize::MAX));
    configured.min(half).max(1)
}

/// Serves `app` on `listener`, at most `max_connections` connections at once, until
/// `shutdown` completes, then stops accepting, lets every open connection finish its request
/// in progress, and returns once they are all closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    header_read_timeout: Duration,
    max_connections: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    // Every connection task holds a receiver; `closed()` resolves when the last one ends.
    let (open_tx, open_rx) = watch::channel(());
    let slots = Arc::new(Semaphore::new(max_connections));
    let mut full = false;
    tokio::pin!(shutdown);
    loop {
        // A slot first: while none is free, nothing is accepted.
        let slot = match Arc::clone(&slots).try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if !full {
                    tracing::warn!(max_connections, "{max_connections} connections are open (http.max_connections); new ones wait until one closes");
                    full = true;
                }
                tokio::select! {
                    slot = Arc::clone(&slots).acquire_owned() => match slot {
                        Ok(slot) => slot,
                        Err(_) => break,
                    },
                    () = &mut shutdown => break,
                }
            }
        };
        if slots.available_permits() > max_connections / 2 {
            full = false;
        }
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Server-sent events are small writes: without this, one written while the previous
        // is unacknowledged waits for the client's delayed ACK (~40 ms).
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(remote = %remote, error = %e, "setting TCP_NODELAY failed");
        }
        let service = TowerToHyperService::new(app.clone());
        let mut stop = stop_rx.clone();
        let open = open_rx.clone();
        tokio::spawn(async move {
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let stopped = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            let result = tokio::select! {
                result = conn.as_mut() => result,
                () = stopped => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                tracing::debug!(remote = %remote, error = %e, "connection ended with an error");
            }
            drop(open);
            drop(slot);
        });
    }
    drop(listener);
    drop(open_rx);
    let _ = stop_tx.send(true);
    open_tx.closed().await;
    Ok(())
}
