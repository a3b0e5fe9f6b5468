//! Helpers the tests and benches share (behind the `testing` feature, never in the shipped
//! binary): the canary step list they run, once, with their own timings.

use std::time::Duration;

/// The waits and budgets of the test/bench canary.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// `peers_healthy` timeout.
    pub peers: Duration,
    /// `down` and `up` timeouts.
    pub compose: Duration,
    /// `wait_health` and `wait_logs` timeouts.
    pub wait: Duration,
    /// Poll interval of the waits and the soak.
    pub interval: Duration,
    /// `wait_health` consecutive 200s.
    pub consecutive: u32,
    /// Soak duration.
    pub soak: Duration,
}

impl Timings {
    /// The integration tests' timings: every rollout ends in well under a second.
    pub const TESTS: Timings = Timings {
        peers: Duration::from_secs(3),
        compose: Duration::from_secs(5),
        wait: Duration::from_secs(3),
        interval: Duration::from_millis(50),
        consecutive: 2,
        soak: Duration::from_millis(300),
    };
}

/// A runbook duration: `10m`, `3s` or `50ms`.
pub fn runbook_duration(d: Duration) -> String {
    let ms = d.as_millis().max(1);
    if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// The shipped canary's steps (runbooks/single-replica-canary.yaml) with timings `t`.
pub fn canary(description: &str, t: &Timings) -> String {
    let d = runbook_duration;
    let (i, c) = (d(t.interval), t.consecutive);
    format!(
        r#"
description: {description}
steps:
  - {{name: snapshot, kind: snapshot}}
  - {{name: peers, kind: peers_healthy, timeout: {peers}}}
  - {{name: preflight, kind: plan, allow: [model-downloader]}}
  - {{name: down, kind: down, timeout: {compose}}}
  - {{name: plan, kind: plan, allow: [model-downloader]}}
  - {{name: up, kind: up, timeout: {compose}}}
  - {{name: neighbours, kind: verify_neighbours}}
  - {{name: health, kind: wait_health, timeout: {wait}, interval: {i}, consecutive: {c}}}
  - {{name: startup-logs, kind: wait_logs, timeout: {wait}, interval: {i},
     require: ["event-loop stall dump armed"],
     forbid: ["CUDA error 801", "Traceback (most recent call last)", "out of memory"]}}
  - {{name: soak, kind: soak, duration: {soak}, interval: {i}, max_misses: 3, forbid: ["[event-loop-stall]", "CUDA error"]}}
"#,
        peers = d(t.peers),
        compose = d(t.compose),
        wait = d(t.wait),
        soak = d(t.soak),
    )
}

/// The canary's steps up to and including the step named `last` (a rollback is the canary
/// without its soak).
pub fn canary_until(description: &str, t: &Timings, last: &str) -> String {
    let text = canary(description, t);
    let mut out = String::new();
    let mut past = false;
    for line in text.split_inclusive('\n') {
        if line.starts_with("  - {name: ") {
            if past {
                break;
            }
            past = line.starts_with(&format!("  - {{name: {last},"));
        }
        out.push_str(line);
    }
    assert!(past, "the canary has no step {last}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_written_in_their_largest_whole_unit() {
        for (ms, text) in [(600_000, "10m"), (3000, "3s"), (50, "50ms"), (0, "1ms")] {
            assert_eq!(runbook_duration(Duration::from_millis(ms)), text);
        }
    }

    #[test]
    fn the_rollback_is_the_canary_up_to_its_startup_logs() {
        let rollback = canary_until("r", &Timings::TESTS, "startup-logs");
        assert!(rollback.contains("out of memory\"]}\n"), "{rollback}");
        assert!(!rollback.contains("soak"), "{rollback}");
        let short = canary_until("r", &Timings::TESTS, "health");
        assert!(short.trim_end().ends_with("consecutive: 2}"), "{short}");
    }
}
