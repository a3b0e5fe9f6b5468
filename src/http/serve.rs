//! The HTTP/1 server loop. `axum::serve` sets no header read timeout, so a client that opens
//! a connection and sends its headers a byte at a time holds it forever; this loop is
//! `axum::serve` with hyper's `header_read_timeout` (which also closes idle keep-alive
//! connections after that long). Body reads are bounded by the `Body` extractor.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Serves `app` on `listener` until `shutdown` completes, then stops accepting, lets every
/// open connection finish its request in progress, and returns once they are all closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    header_read_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    // Every connection task holds a receiver; `closed()` resolves when the last one ends.
    let (open_tx, open_rx) = watch::channel(());
    tokio::pin!(shutdown);
    loop {
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
        });
    }
    drop(listener);
    drop(open_rx);
    let _ = stop_tx.send(true);
    open_tx.closed().await;
    Ok(())
}
