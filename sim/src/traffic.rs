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
//! Faults (sticky until changed): [`crate::SimFaults::set_engine_slowdown`] (TTFT and ITL × k),
//! [`crate::SimFaults::set_engine_traffic`] (no requests reach the service),
//! [`crate::SimFaults::set_metrics_padding`] (extra series, to make a page of realistic size), and
//! [`crate::SimFaults::set_metrics_status`] (the page answers an error while the engine serves).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use chrono::{DateTime, Utc};

/// How often the simulated traffic advances.
pub(crate) const TICK: Duration = Duration::from_millis(100);
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
    pub(crate) slowdown: BTreeMap<String, f64>,
    /// Services that receive no requests.
    pub(crate) idle: std::collections::BTreeSet<String>,
    /// Requests per second per engine (`None`: [`DEFAULT_RATE`]).
    pub(crate) rate: Option<f64>,
    /// Extra gauge series on every page.
    pub(crate) padding: usize,
    /// Service → the HTTP status its page answers instead of the page.
    pub(crate) page_status: BTreeMap<String, u16>,
}

impl Traffic {
    /// Gives each of the `ready` engines (service, process start) its share of `elapsed`
    /// worth of requests; an engine whose process restarted counts from zero again.
    pub(crate) fn advance(&mut self, ready: Vec<(String, DateTime<Utc>)>, elapsed: Duration) {
        let rate = self.rate.unwrap_or(DEFAULT_RATE);
        for (service, started_at) in ready {
            let slowdown = self.slowdown.get(&service).copied().unwrap_or(1.0);
            let idle = self.idle.contains(&service);
            let engine = self
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

    /// The page of `service`'s engine.
    pub(crate) fn page(&self, service: &str) -> String {
        render(self.engines.get(service), self.padding)
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

/// The pages of one engine before and after serving requests `before..after` at `slowdown`
/// (1.0 is normal speed), having served `0..before` first: what an analysis scrapes at the
/// edges of its window. The product's tests read them with its own parser.
pub fn pages_around_traffic(slowdown: f64, before: u64, after: u64) -> (String, String) {
    let mut traffic = EngineTraffic::new(Utc::now());
    for n in 0..before {
        traffic.serve(n, slowdown);
    }
    let first = render(Some(&traffic), 0);
    for n in before..after {
        traffic.serve(n, slowdown);
    }
    (first, render(Some(&traffic), 0))
}
