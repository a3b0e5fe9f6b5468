//! `analyze` against the engines' own `/metrics` pages: the target against its peer.

use super::engine::{FakeEngines, Replica};
use super::{ended, message, Bench, R2};

const ANALYZE: &str = "  - name: analysis\n    kind: analyze\n    warmup: 100ms\n    duration: 1s\n    interval: 250ms\n    checks:\n      - {name: took_traffic, counter: \"sglang:num_requests_total\", min: 1}\n";

#[tokio::test]
async fn an_analysis_of_a_target_that_serves_passes() {
    let engines = FakeEngines::start().await;
    let bench = Bench::new(ANALYZE).on_engines(&engines);
    let end = bench.run(0, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!((status, code), ("succeeded", None), "{detail}");
    let check = &detail["checks"][0];
    assert_eq!(check["verdict"], "pass", "{detail}");
    assert!(check["target"]["value"].as_f64() >= Some(1.0), "{detail}");
    // Each check's value per interval, for the rollout page's chart.
    let points = detail["series"]["took_traffic"]["points"][R2].as_array();
    assert!(points.is_some_and(|p| !p.is_empty()), "{detail}");
}

#[tokio::test]
async fn an_analysis_of_a_target_without_traffic_fails_its_check() {
    let engines = FakeEngines::start().await;
    let bench = Bench::new(ANALYZE).on_engines(&engines);
    engines.set(
        R2,
        Replica {
            idle: true,
            ..Replica::default()
        },
    );
    let end = bench.run(0, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!(status, "failed", "{detail}");
    assert_eq!(code.as_deref(), Some("analysis_failed"), "{detail}");
    assert!(message(&end).contains("took_traffic"), "{}", message(&end));
}

#[tokio::test]
async fn an_analysis_whose_target_page_cannot_be_read_never_passes() {
    let engines = FakeEngines::start().await;
    let bench = Bench::new(ANALYZE).on_engines(&engines);
    engines.set(
        R2,
        Replica {
            metrics_status: Some(500),
            ..Replica::default()
        },
    );
    let end = bench.run(0, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!(status, "failed", "{detail}");
    assert_eq!(code.as_deref(), Some("analysis_failed"), "{detail}");
    assert!(
        message(&end).contains("no data for the target"),
        "{}",
        message(&end)
    );
    let target = &detail["replicas"][R2];
    assert_eq!(target["last_error"], "HTTP 500", "{detail}");
    assert_eq!(target["window_scrapes"], 0, "{detail}");
}
