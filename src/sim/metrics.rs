//! The simulated engines' `/metrics`: SGLang's Prometheus text page, fed by simulated
//! background traffic.
//!
//! A host task ticks every [`TICK`]: every engine that is running and ready receives
//! `rate` requests per second (fractions carry over). Request `n` gets a deterministic
//! latency: TTFT spread evenly over 0.1–0.3 s and inter-token latency over 10–30 ms (a
//! low-discrepancy sequence, not a random one, so tests are repeatable), both multiplied by
//! the service's slowdown. Requests alternate between priorities `0` and `1`; as on the real
//! engine, the counters and histograms also carry a `priority=""` placeholder series whose
//! values are frozen (stale), and the gauges' live aggregate is the `priority=""` series.
//! An engine whose process restarts (a new start time) starts counting from zero again.
//!
//! Faults (sticky until changed): [`SimFaults::set_engine_slowdown`] (TTFT and ITL × k),
//! [`SimFaults::set_engine_traffic`] (no requests reach the service),
//! [`SimFaults::set_metrics_padding`] (extra series, to make a page of realistic size), and
//! [`SimFaults::set_metrics_status`] (the page answers an error while the engine serves).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::faults::SimFaults;
use super::state::Shared;

/// How often the simulated traffic advances.
const TICK: Duration = Duration::from_millis(100);
/// Requests per second each ready engine receives by default.
pub const DEFAULT_RATE: f64 = 50.0;
/// The model every simulated engine serves.
const MODEL: &str = "z-ai/glm-5.3-flash";

/// SGLang's TTFT and e2e buckets (seconds).
const TTFT_BUCKETS: &[f64] = &[
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
    400.0,
];
/// SGLang's inter-token latency buckets (seconds).
const ITL_BUCKETS: &[f64] = &[
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
    0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0,
];
const E2E_BUCKETS: &[f64] = &[
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
    400.0, 800.0,
];

/// One histogram series being filled: per-bucket (non-cumulative) counts plus +Inf.
#[derive(Debug, Clone)]
struct Hist {
    bounds: &'static [f64],
    /// `counts[i]` observations in bucket `i`; the last is above every bound.
    counts: Vec<u64>,
    sum: f64,
}

impl Hist {
    fn new(bounds: &'static [f64]) -> Self {
        Hist {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
        }
    }

    fn observe(&mut self, v: f64) {
        let i = self
            .bounds
            .iter()
            .position(|b| v <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += v;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (i, count) in self.counts.iter().enumerate() {
            cumulative += count;
            let le = match self.bounds.get(i) {
                Some(b) => format!("{b:?}"),
                None => "+Inf".to_owned(),
            };
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}.0");
        }
        let _ = writeln!(out, "{name}_sum{{{labels}}} {:?}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}.0");
    }
}

/// What one priority of one engine has served.
#[derive(Debug, Clone)]
struct Served {
    requests: u64,
    tokens: u64,
    ttft: Hist,
    itl: Hist,
    e2e: Hist,
}

impl Served {
    fn new() -> Self {
        Served {
            requests: 0,
            tokens: 0,
            ttft: Hist::new(TTFT_BUCKETS),
            itl: Hist::new(ITL_BUCKETS),
            e2e: Hist::new(E2E_BUCKETS),
        }
    }
}

/// One engine process's counters.
#[derive(Debug, Clone)]
struct EngineTraffic {
    /// The process these counters belong to (a restart starts them again).
    started_at: DateTime<Utc>,
    /// Requests received so far, including the fraction of the next one.
    received: f64,
    /// Priority `0` and `1`.
    served: [Served; 2],
}

impl EngineTraffic {
    fn new(started_at: DateTime<Utc>) -> Self {
        EngineTraffic {
            started_at,
            received: 0.0,
            served: [Served::new(), Served::new()],
        }
    }

    /// Serves request number `n` (deterministic latencies, scaled by `slowdown`).
    fn serve(&mut self, n: u64, slowdown: f64) {
        let u = (n as f64 * 0.618_033_988_749_895).fract();
        let v = (n as f64 * 0.754_877_666_246_693).fract();
        let ttft = (0.1 + 0.2 * u) * slowdown;
        let itl = (0.010 + 0.020 * v) * slowdown;
        let tokens = 64 + n % 64;
        let served = &mut self.served[usize::from(n % 4 == 3)];
        served.requests += 1;
        served.tokens += tokens;
        served.ttft.observe(ttft);
        served.itl.observe(itl);
        served.e2e.observe(ttft + itl * tokens as f64);
    }
}

/// The traffic state of the host (inside the state mutex).
#[derive(Debug, Default)]
pub(crate) struct Traffic {
    engines: BTreeMap<String, EngineTraffic>,
    /// Service → TTFT and ITL multiplier.
    slowdown: BTreeMap<String, f64>,
    /// Services that receive no requests.
    idle: std::collections::BTreeSet<String>,
    /// Requests per second per engine (`None`: [`DEFAULT_RATE`]).
    rate: Option<f64>,
    /// Extra gauge series on every page.
    padding: usize,
    /// Service → the HTTP status its page answers instead of the page.
    page_status: BTreeMap<String, u16>,
}

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
    let traffic = &mut st.traffic;
    let rate = traffic.rate.unwrap_or(DEFAULT_RATE);
    for (service, started_at) in ready {
        let slowdown = traffic.slowdown.get(&service).copied().unwrap_or(1.0);
        let idle = traffic.idle.contains(&service);
        let engine = traffic
            .engines
            .entry(service)
            .or_insert_with(|| EngineTraffic::new(started_at));
        if engine.started_at != started_at {
            *engine = EngineTraffic::new(started_at);
        }
        if idle {
            continue;
        }
        let before = engine.received as u64;
        engine.received += rate * elapsed.as_secs_f64();
        for n in before..engine.received as u64 {
            engine.serve(n, slowdown);
        }
    }
}

/// A counter family: name, help, and its value in a priority's counts.
type CounterFamily = (&'static str, &'static str, fn(&Served) -> u64);
/// A histogram family: name, help, and its series in a priority's counts.
type HistogramFamily = (&'static str, &'static str, fn(&Served) -> &Hist);

/// The page of one engine (`None` when it has not served yet: an empty page of families).
fn render(engine: Option<&EngineTraffic>, padding: usize) -> String {
    let fresh = EngineTraffic::new(DateTime::<Utc>::MIN_UTC);
    let engine = engine.unwrap_or(&fresh);
    // The placeholder keeps what an older engine build counted, frozen.
    let mut stale = Served::new();
    for n in 0..40 {
        stale.requests += 1;
        stale.tokens += 100;
        stale.ttft.observe(5.0 + n as f64);
        stale.itl.observe(0.5);
        stale.e2e.observe(60.0);
    }
    let series: [(&str, &Served); 3] = [
        ("", &stale),
        ("0", &engine.served[0]),
        ("1", &engine.served[1]),
    ];
    let labels = |priority: &str| format!("model_name=\"{MODEL}\",priority=\"{priority}\"");
    let mut out = String::with_capacity(64 * 1024 + padding * 96);
    let counters: [CounterFamily; 2] = [
        (
            "sglang:num_requests_total",
            "Number of requests processed.",
            |s| s.requests,
        ),
        (
            "sglang:generation_tokens_total",
            "Number of generation tokens processed.",
            |s| s.tokens,
        ),
    ];
    for (name, help, value) in counters {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (priority, served) in &series {
            let _ = writeln!(out, "{name}{{{}}} {}.0", labels(priority), value(served));
        }
    }
    let histograms: [HistogramFamily; 3] = [
        (
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            |s| &s.ttft,
        ),
        (
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            |s| &s.itl,
        ),
        (
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            |s| &s.e2e,
        ),
    ];
    for (name, help, hist) in histograms {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (priority, served) in &series {
            hist(served).render(&mut out, name, &labels(priority));
        }
    }
    let running = (engine.served[0].requests + engine.served[1].requests) % 7;
    let _ = writeln!(
        out,
        "# HELP sglang:num_running_reqs The number of running requests.\n# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{{{}}} {running}.0",
        labels("")
    );
    pad(&mut out, padding);
    out
}

/// Appends `n` gauge series in families of 50, like the many per-rank and cache gauges of
/// a real engine page.
fn pad(out: &mut String, n: usize) {
    for family in 0..n.div_ceil(50) {
        let name = format!("sglang:cache_stat_{family}");
        let _ = writeln!(
            out,
            "# HELP {name} Per-rank cache statistic {family}.\n# TYPE {name} gauge"
        );
        for i in 0..50.min(n - family * 50) {
            let _ = writeln!(
                out,
                "{name}{{model_name=\"{MODEL}\",tp_rank=\"{}\",pool=\"pool-{i}\"}} {}.5",
                i % 4,
                family * 1000 + i
            );
        }
    }
}

/// An SGLang-sized page (about `series` series, mostly padding) with a few thousand requests
/// served, for benchmarks and tests of the parser.
pub fn example_page(series: usize) -> String {
    let mut engine = EngineTraffic::new(Utc::now());
    for n in 0..5_000 {
        engine.serve(n, 1.0);
    }
    // 3 priorities × (2 counters + 3 histograms) + 1 gauge are the engine's own series.
    render(Some(&engine), series.saturating_sub(16))
}

/// `GET /metrics` of one engine: 503 while it is absent, exited or cold-starting.
pub(super) async fn serve(State(ctx): State<super::engine::EngineCtx>) -> Response {
    let service = ctx.service();
    let ready = super::engine::engine_ready(&ctx.shared, &service);
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
    let page = {
        let st = ctx.shared.state();
        render(st.traffic.engines.get(&service), st.traffic.padding)
    };
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        page,
    )
        .into_response()
}

impl SimFaults {
    /// Sticky: the engine of `service` serves its requests `factor`× slower (TTFT and
    /// inter-token latency multiplied; `1.0` restores it).
    pub fn set_engine_slowdown(&self, service: &str, factor: f64) {
        let mut st = self.shared.state();
        if factor == 1.0 {
            st.traffic.slowdown.remove(service);
        } else {
            st.traffic.slowdown.insert(service.to_owned(), factor);
        }
    }

    /// Sticky: whether the engine of `service` receives simulated requests (default true).
    pub fn set_engine_traffic(&self, service: &str, on: bool) {
        let mut st = self.shared.state();
        if on {
            st.traffic.idle.remove(service);
        } else {
            st.traffic.idle.insert(service.to_owned());
        }
    }

    /// Sticky: requests per second each ready engine receives (default [`DEFAULT_RATE`]).
    pub fn set_traffic_rate(&self, per_second: f64) {
        self.shared.state().traffic.rate = Some(per_second.max(0.0));
    }

    /// Sticky: every `/metrics` page carries `series` extra gauge series (default 0).
    pub fn set_metrics_padding(&self, series: usize) {
        self.shared.state().traffic.padding = series;
    }

    /// Sticky: the `/metrics` page of `service`'s engine answers `status` (its `/health` and
    /// API are unchanged); `None` serves the page again.
    pub fn set_metrics_status(&self, service: &str, status: Option<u16>) {
        let mut st = self.shared.state();
        match status {
            Some(status) => st.traffic.page_status.insert(service.to_owned(), status),
            None => st.traffic.page_status.remove(service),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::exposition::{histogram_series_delta, quantile, Page};

    fn p95_of(slowdown: f64, name: &str) -> f64 {
        let mut before = EngineTraffic::new(Utc::now());
        for n in 0..200 {
            before.serve(n, slowdown);
        }
        let mut after = before.clone();
        for n in 200..1_200 {
            after.serve(n, slowdown);
        }
        let a = Page::parse(&render(Some(&before), 0)).expect("page parses");
        let b = Page::parse(&render(Some(&after), 0)).expect("page parses");
        let window = histogram_series_delta(&a.histogram(name), &b.histogram(name));
        assert_eq!(
            window.count, 1_000.0,
            "the stale placeholder is not counted"
        );
        quantile(0.95, &window).expect("observations")
    }

    #[test]
    fn a_slowdown_moves_the_p95_the_way_the_analysis_will_see_it() {
        for name in [
            "sglang:time_to_first_token_seconds",
            "sglang:inter_token_latency_seconds",
        ] {
            let base = p95_of(1.0, name);
            let slight = p95_of(1.1, name) / base;
            let double = p95_of(2.0, name) / base;
            assert!((1.0..1.2).contains(&slight), "{name}: 1.1x reads {slight}");
            assert!(double > 1.4, "{name}: 2x reads {double}");
        }
    }

    #[test]
    fn the_example_page_has_the_size_asked_for() {
        let page = Page::parse(&example_page(2_000)).expect("parses");
        // Histograms count once per series here; the text has ~2,000 series lines
        // besides the buckets.
        assert!(
            (1_900..=2_100).contains(&page.series_count()),
            "{}",
            page.series_count()
        );
    }
}
