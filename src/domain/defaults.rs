//! Defaults for omitted runbook step fields (docs/reference.md#step-kinds), shared by the
//! runbook reader and the analysis model.

use std::time::Duration;

/// `peers_healthy.timeout`: peers are already serving, a few probes are enough.
pub const PEERS_HEALTHY_TIMEOUT: Duration = Duration::from_secs(2 * 60);
/// `down.timeout`: twice the engines' 5m `stop_grace_period`.
pub const DOWN_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// `up.timeout`: pull of a new multi-GB image plus `up -d` (which returns at container start).
pub const UP_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// `stage`: a multi-GB engine image pulled over a slow registry link, as the `up`'s own pull.
pub const STAGE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// `window.timeout`: a daily window opens within a day.
pub const WINDOW_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);
/// `wait_health.timeout`: TP4 cold starts take up to ~50 min.
pub const WAIT_HEALTH_TIMEOUT: Duration = Duration::from_secs(60 * 60);
/// `wait_health.interval`.
pub const WAIT_HEALTH_INTERVAL: Duration = Duration::from_secs(5);
/// `wait_health.consecutive`: as many 200s in a row as the proxy needs misses to eject.
pub const WAIT_HEALTH_CONSECUTIVE: u32 = 3;
/// `wait_logs.timeout`.
pub const WAIT_LOGS_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// `wait_logs.interval`.
pub const WAIT_LOGS_INTERVAL: Duration = Duration::from_secs(5);
/// `soak.duration`: the post-ready soak of the r1 promotion.
pub const SOAK_DURATION: Duration = Duration::from_secs(10 * 60);
/// `soak.interval`.
pub const SOAK_INTERVAL: Duration = Duration::from_secs(5);
/// `soak.max_misses`: the inference proxy ejects a backend after 3 consecutive misses.
pub const SOAK_MAX_MISSES: u32 = 3;
/// `wait_logs.max_log_failures` and `soak.max_log_failures`: log fetches that may fail in
/// a row before the step fails `logs_unavailable` (a step that watches logs never
/// succeeds blind).
pub const MAX_LOG_FAILURES: u32 = 3;
/// `smoke.max_tokens`: enough for a short sentence, cheap for a serving engine.
pub const SMOKE_MAX_TOKENS: u32 = 16;
/// `smoke.repeat`: one generation unless determinism is checked.
pub const SMOKE_REPEAT: u32 = 1;
/// `smoke.timeout`: a few short generations on a ready engine take seconds.
pub const SMOKE_TIMEOUT: Duration = Duration::from_secs(2 * 60);
/// `analyze.warmup`: the fleet runbooks exclude the first 10 minutes after ready.
pub const ANALYZE_WARMUP: Duration = Duration::from_secs(10 * 60);
/// `analyze.duration`: the judged window.
pub const ANALYZE_DURATION: Duration = Duration::from_secs(30 * 60);
/// `analyze.interval`: between scrapes of the target and its peers.
pub const ANALYZE_INTERVAL: Duration = Duration::from_secs(30);
/// `min_requests` of a histogram check (a quantile needs observations); counters: 0.
pub const ANALYZE_MIN_REQUESTS: u64 = 1;
/// `approve.timeout`: an operator's shift is long enough to look at a canary and decide.
pub const APPROVE_TIMEOUT: Duration = Duration::from_secs(4 * 60 * 60);
