//! NDJSON response streams: a worker task writes events through an [`Emitter`], the response
//! body reads them, and the body owns the operation lock, so the lock is freed when the body
//! ends or the client hangs up (the real server's behaviour, disconnect hazard included).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tokio::sync::{mpsc, watch};

use super::dry_run::PlanBody;
use super::fault_state::StreamShape;
use super::state::{HeldLock, Shared};

/// The client is gone (or the host is shutting down): stop writing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gone;

/// Writes one stream's lines, pausing `delay` before each.
pub(crate) struct Emitter {
    tx: mpsc::Sender<Bytes>,
    delay: Duration,
    shutdown: watch::Receiver<bool>,
    shared: Arc<Shared>,
    lock_seq: u64,
    shape: StreamShape,
    sent: usize,
}

#[derive(Serialize)]
struct LineEvent<'a> {
    event: &'static str,
    data: &'a str,
}

#[derive(Serialize)]
struct DoneEvent {
    event: &'static str,
    success: bool,
    exit_code: i32,
}

/// `{"event":"plan","exit_code":…,"plan":{…},"success":…}`, keys alphabetical.
#[derive(Serialize)]
struct PlanEvent {
    event: &'static str,
    exit_code: Option<i32>,
    plan: PlanBody,
    success: bool,
}

/// `{"event":"staged","file":…,"file_sha256":…,"images":[…],"tag":…}`.
#[derive(Serialize)]
pub(crate) struct StagedEvent {
    pub event: &'static str,
    pub file: String,
    pub file_sha256: String,
    pub images: Vec<String>,
    pub tag: String,
}

impl Emitter {
    async fn send<T: Serialize>(&mut self, event: &T) -> Result<(), Gone> {
        let line = serde_json::to_vec(event).map_err(|_| Gone)?;
        self.send_raw(line).await?;
        if self.sent == 1 {
            if let Some(garbage) = self.shape.garbage.take() {
                self.send_raw(garbage.into_bytes()).await?;
            }
        }
        Ok(())
    }

    async fn send_raw(&mut self, mut line: Vec<u8>) -> Result<(), Gone> {
        if self.shape.cut_after.is_some_and(|n| self.sent >= n) {
            return Err(Gone);
        }
        line.push(b'\n');
        let slow = self.shared.state().faults.line_delay.unwrap_or_default();
        let pause = self.delay.max(slow);
        if pause.is_zero() {
            // No timer: a zero sleep still waits for the timer's next millisecond tick, which
            // made an unpaced stream of 50 lines take 50 ms.
            if *self.shutdown.borrow() {
                return Err(Gone);
            }
        } else {
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = self.shutdown.wait_for(|stop| *stop) => return Err(Gone),
            }
        }
        self.sent += 1;
        self.tx.send(Bytes::from(line)).await.map_err(|_| Gone)
    }

    /// A stall fault: holds until released, or fails if the client hangs up first.
    pub async fn hold(&mut self) -> Result<(), Gone> {
        if !std::mem::take(&mut self.shape.stall) {
            return Ok(());
        }
        let mut release = self.shared.release_stalls.subscribe();
        release.mark_unchanged();
        self.shared.stalled.send_modify(|n| *n += 1);
        let outcome = tokio::select! {
            _ = release.changed() => Ok(()),
            () = self.tx.closed() => Err(Gone),
            _ = self.shutdown.wait_for(|stop| *stop) => Err(Gone),
        };
        self.shared
            .stalled
            .send_modify(|n| *n = n.saturating_sub(1));
        outcome
    }

    /// `{"event":"stderr","data":…}` (compose writes its progress to stderr).
    pub async fn stderr(&mut self, data: &str) -> Result<(), Gone> {
        self.send(&LineEvent {
            event: "stderr",
            data,
        })
        .await
    }

    /// Several stderr lines.
    pub async fn stderr_all(&mut self, lines: &[String]) -> Result<(), Gone> {
        for line in lines {
            self.stderr(line).await?;
        }
        Ok(())
    }

    /// The dry run's `plan` line.
    pub async fn plan(
        &mut self,
        plan: PlanBody,
        success: bool,
        exit_code: i32,
    ) -> Result<(), Gone> {
        self.send(&PlanEvent {
            event: "plan",
            exit_code: Some(exit_code),
            plan,
            success,
        })
        .await
    }

    /// The `staged` line of a `materialize_only` up.
    pub async fn staged(&mut self, staged: StagedEvent) -> Result<(), Gone> {
        self.send(&staged).await
    }

    /// Frees the operation lock, then writes the terminal `done` line. Freeing it first means
    /// a client that acts on `done` at once never meets its own operation's 409.
    pub async fn done(mut self, success: bool, exit_code: i32) -> Result<(), Gone> {
        self.hold().await?;
        self.shared.release(self.lock_seq);
        self.send(&DoneEvent {
            event: "done",
            success,
            exit_code,
        })
        .await
    }
}

/// Answers 200 `application/x-ndjson` and runs `work` in its own task to fill the body. The
/// body holds `lock` until it ends.
pub(crate) fn respond<F, Fut>(
    shared: &Arc<Shared>,
    lock: HeldLock,
    shape: StreamShape,
    work: F,
) -> Response
where
    F: FnOnce(Emitter) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let emitter = Emitter {
        tx,
        delay: shared.stream_line_delay,
        shutdown: shared.shutdown.clone(),
        shared: shared.clone(),
        lock_seq: lock.seq,
        shape,
        sent: 0,
    };
    tokio::spawn(work(emitter));
    let body = futures_util::stream::unfold((rx, lock), |(mut rx, lock)| async move {
        let chunk = rx.recv().await?;
        Some((Ok::<_, Infallible>(chunk), (rx, lock)))
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(body),
    )
        .into_response()
}
