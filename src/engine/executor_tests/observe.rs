//! `snapshot`, `peers_healthy` and `wait_health`: what each reads of the host and its engines,
//! and how each ends.

use super::fakes::answered;
use super::{ended, message, Bench};
use super::{health_url, R1, R2};

#[tokio::test]
async fn a_snapshot_keeps_every_container_of_the_project() {
    let bench = Bench::new("  - {name: snap, kind: snapshot}\n");
    let end = bench.run(0, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!((status, code), ("succeeded", None), "{detail}");
    let ps = detail["ps"].as_array().expect("ps kept");
    for service in [R1, R2] {
        let entry = ps.iter().find(|c| c["names"] == service);
        assert!(
            entry.is_some_and(|c| c["state"] == "running"),
            "{service} missing: {detail}"
        );
    }
}

#[tokio::test]
async fn wait_health_succeeds_after_its_consecutive_200s_of_the_target() {
    let bench = Bench::new(
        "  - {name: health, kind: wait_health, timeout: 5s, interval: 50ms, consecutive: 2}\n",
    );
    let end = bench.run(0, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!((status, code), ("succeeded", None), "{detail}");
    assert_eq!(detail["streak"], 2, "{detail}");
    assert_eq!(detail["last"]["status"], 200, "{detail}");
}

#[tokio::test]
async fn wait_health_fails_health_timeout_when_the_target_never_turns_healthy() {
    let bench = Bench::new(
        "  - {name: health, kind: wait_health, timeout: 600ms, interval: 50ms, consecutive: 2}\n",
    );
    bench.probe.script(&health_url(R2), vec![answered(503)]);
    let end = bench.run(0, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!(status, "failed", "{detail}");
    assert_eq!(code.as_deref(), Some("health_timeout"), "{detail}");
}

#[tokio::test]
async fn peers_healthy_fails_when_the_peer_does_not_serve_and_passes_when_it_does() {
    let steps = "  - {name: peers, kind: peers_healthy, timeout: 600ms}\n";
    let bench = Bench::new(steps);
    bench.probe.script(&health_url(R1), vec![answered(503)]);
    let end = bench.run(0, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!(status, "failed", "{detail}");
    assert_eq!(code.as_deref(), Some("peers_unhealthy"), "{detail}");
    assert!(message(&end).contains(R1), "{}", message(&end));
    assert_eq!(detail["unhealthy"][R1]["status"], 503, "{detail}");

    let bench = Bench::new(steps);
    // The target's own health is no peer's: r2 down does not fail the check of r1.
    bench.probe.script(&health_url(R2), vec![answered(503)]);
    let end = bench.run(0, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!((status, code), ("succeeded", None), "{detail}");
    assert_eq!(
        bench.probe.asked(&health_url(R2)),
        0,
        "the target is no peer"
    );
    assert!(bench.probe.asked(&health_url(R1)) >= 1);
}

#[tokio::test]
async fn wait_health_fails_health_timeout_once_the_clock_passes_its_deadline() {
    let bench = Bench::new(
        "  - {name: health, kind: wait_health, timeout: 1h, interval: 50ms, consecutive: 2}\n",
    );
    bench.probe.script(&health_url(R2), vec![answered(503)]);
    bench.clock_ahead_after(
        std::time::Duration::from_millis(200),
        std::time::Duration::from_secs(7200),
    );
    let end = bench.run(0, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!(status, "failed", "{detail}");
    assert_eq!(code.as_deref(), Some("health_timeout"), "{detail}");
}
