//! `wait_logs` and `soak`: the target's log read through compose-manager, its `/health`
//! probed, and how each ends.

use std::time::Duration;

use super::fakes::answered;
use super::{ended, message, Bench};
use super::{health_url, R2};

#[tokio::test]
async fn wait_logs_succeeds_once_the_required_line_is_logged() {
    let bench = Bench::new(
        "  - {name: logs, kind: wait_logs, timeout: 5s, interval: 50ms, require: [\"marker-7f3\"]}\n",
    );
    let (end, ()) = tokio::join!(bench.run(0, None), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        bench.host.log(R2, "INFO marker-7f3 ready");
    });
    let (status, code, detail) = ended(&end);
    assert_eq!((status, code), ("succeeded", None), "{detail}");
    assert!(detail.to_string().contains("marker-7f3"), "{detail}");
}

#[tokio::test]
async fn wait_logs_fails_logs_timeout_without_the_required_line() {
    let bench = Bench::new(
        "  - {name: logs, kind: wait_logs, timeout: 400ms, interval: 50ms, require: [\"never-logged\"]}\n",
    );
    let end = bench.run(0, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!(status, "failed", "{detail}");
    assert_eq!(code.as_deref(), Some("logs_timeout"), "{detail}");
    assert!(message(&end).contains("never-logged"), "{}", message(&end));
}

#[tokio::test]
async fn a_soak_of_a_serving_target_succeeds_at_its_end() {
    let bench = Bench::new(
        "  - {name: soak, kind: soak, duration: 500ms, interval: 50ms, forbid: [\"CUDA error\"]}\n",
    );
    let end = bench.run(0, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!((status, code), ("succeeded", None), "{detail}");
    assert!(detail["probes"].as_u64() >= Some(2), "{detail}");
}

#[tokio::test]
async fn a_forbidden_line_during_the_soak_fails_it() {
    let bench = Bench::new(
        "  - {name: soak, kind: soak, duration: 5s, interval: 50ms, forbid: [\"CUDA error\"]}\n",
    );
    let (end, ()) = tokio::join!(bench.run(0, None), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        bench
            .host
            .log(R2, "RuntimeError: CUDA error: an illegal memory access");
    });
    let (status, code, detail) = ended(&end);
    assert_eq!(status, "failed", "{detail}");
    assert_eq!(code.as_deref(), Some("forbidden_log_line"), "{detail}");
    assert!(message(&end).contains("CUDA error"), "{}", message(&end));
}

#[tokio::test]
async fn a_soak_fails_when_the_target_stops_answering_its_health() {
    let bench =
        Bench::new("  - {name: soak, kind: soak, duration: 5s, interval: 50ms, max_misses: 2}\n");
    bench.probe.script(&health_url(R2), vec![answered(503)]);
    let end = bench.run(0, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!(status, "failed", "{detail}");
    assert_eq!(code.as_deref(), Some("soak_health"), "{detail}");
}

#[tokio::test]
async fn a_soak_of_an_hour_ends_at_its_first_read_once_the_clock_passes_its_end() {
    let bench = Bench::new("  - {name: soak, kind: soak, duration: 1h, interval: 50ms}\n");
    bench.clock_ahead_after(Duration::from_millis(200), Duration::from_secs(3660));
    // Bounded by `Bench::run` (30 s): without the clock the soak would take its hour.
    let end = bench.run(0, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!((status, code), ("succeeded", None), "{detail}");
    assert!(detail["probes"].as_u64() >= Some(1), "{detail}");
}
