//! The simulated engines' `/metrics` endpoint and the host task that feeds their traffic
//! (the traffic itself and the page's text are `traffic.rs`).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::engine::{engine_ready, EngineCtx};
use super::state::Shared;
use super::traffic::TICK;

/// Starts the host's traffic generator; it stops with the host.
pub(crate) fn spawn_traffic(shared: Arc<Shared>) -> JoinHandle<()> {
    let mut stop = shared.shutdown.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = Instant::now();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let now = Instant::now();
            advance(&shared, now.duration_since(last));
            last = now;
        }
    })
}

/// Gives every running, ready engine its share of `elapsed` worth of requests.
fn advance(shared: &Shared, elapsed: Duration) {
    let mut st = shared.state();
    let now = Instant::now();
    let ready: Vec<(String, DateTime<Utc>)> = st
        .containers
        .values()
        .filter(|c| shared.engine_ports.contains_key(&c.service))
        .filter(|c| c.running && now >= c.ready_at)
        .filter(|c| !st.faults.health_never.contains(&c.service))
        .map(|c| (c.service.clone(), c.started_at))
        .collect();
    st.traffic.advance(ready, elapsed);
}

/// `GET /metrics` of one engine: 503 while it is absent, exited or cold-starting.
pub(super) async fn serve(State(ctx): State<EngineCtx>) -> Response {
    let service = ctx.service();
    let ready = engine_ready(&ctx.shared, &service);
    let status = if ready { 200 } else { 503 };
    ctx.shared
        .state()
        .record_engine_read(&service, "/metrics", status);
    if !ready {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let failing = ctx
        .shared
        .state()
        .traffic
        .page_status
        .get(&service)
        .copied();
    if let Some(status) = failing.and_then(|s| StatusCode::from_u16(s).ok()) {
        return (status, "metrics exporter failed\n").into_response();
    }
    let page = ctx.shared.state().traffic.page(&service);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        page,
    )
        .into_response()
}
