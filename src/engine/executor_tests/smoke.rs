//! `smoke`: real calls of the target engine's API, never of its peer.

use std::time::Duration;

use canaryd_sim::ApiFault;

use super::{ended, message, Bench};
use crate::config::sim::{R1, R2};

const SMOKE: &str =
    "  - {name: smoke, kind: smoke, model: z-ai/glm-5.3-flash, prompt: \"Say hello\", timeout: 10s}\n";

#[tokio::test]
async fn a_smoke_of_a_serving_engine_succeeds_and_calls_the_target_alone() {
    let bench = Bench::new(SMOKE).await;
    let end = bench.run(0, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!((status, code), ("succeeded", None), "{detail}");
    assert_eq!(detail["model"], "z-ai/glm-5.3-flash", "{detail}");
    assert_eq!(
        detail["calls"].as_array().map(Vec::len),
        Some(1),
        "{detail}"
    );
    assert!(
        detail["output"].as_str().is_some_and(|o| !o.is_empty()),
        "{detail}"
    );
    let calls = bench.sim.api_calls();
    assert!(calls.iter().any(|c| c.service == R2), "{calls:?}");
    assert!(calls.iter().all(|c| c.service != R1), "{calls:?}");
}

#[tokio::test]
async fn a_smoke_fails_with_the_engines_status_when_chat_answers_500() {
    let bench = Bench::new(SMOKE).await;
    bench
        .sim
        .faults()
        .set_api_fault(R2, None, Some(ApiFault::Status(500)));
    let end = bench.run(0, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!(status, "failed", "{detail}");
    assert_eq!(code.as_deref(), Some("smoke_http_status"), "{detail}");
    assert_eq!(detail["failed_call"]["status"], 500, "{detail}");
    assert!(message(&end).contains("answered 500"), "{}", message(&end));
}

#[tokio::test]
async fn an_abort_stops_a_smoke_waiting_on_a_slow_engine() {
    let bench = Bench::new(SMOKE).await;
    bench
        .sim
        .faults()
        .set_api_fault(R2, None, Some(ApiFault::Delay(Duration::from_secs(20))));
    // Without the abort the step would end `smoke_timeout` at its 10 s budget.
    let end = bench.run(0, Some(Duration::from_millis(200))).await;
    let (status, _, detail) = ended(&end);
    assert_eq!(status, "aborted", "{detail}");
}
