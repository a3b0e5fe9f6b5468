//! `smoke`: real calls of the target engine's API, never of its peer.

use std::time::Duration;

use super::engine::{FakeEngines, Replica};
use super::{ended, message, Bench, R1, R2};

const SMOKE: &str =
    "  - {name: smoke, kind: smoke, model: z-ai/glm-5.3-flash, prompt: \"Say hello\", timeout: 10s}\n";

#[tokio::test]
async fn a_smoke_of_a_serving_engine_succeeds_and_calls_the_target_alone() {
    let engines = FakeEngines::start().await;
    let bench = Bench::new(SMOKE).on_engines(&engines);
    let end = bench.run(0, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!((status, code), ("succeeded", None), "{detail}");
    assert_eq!(detail["model"], "z-ai/glm-5.3-flash", "{detail}");
    assert_eq!(
        detail["calls"].as_array().map(Vec::len),
        Some(1),
        "{detail}"
    );
    assert_eq!(detail["output"], "Hello!", "{detail}");
    assert!(engines.api_calls(R2) >= 2, "models and chat of the target");
    assert_eq!(engines.api_calls(R1), 0, "never the peer");
    assert!(bench.host.compose_calls().is_empty());
}

#[tokio::test]
async fn a_smoke_fails_with_the_engines_status_when_chat_answers_500() {
    let engines = FakeEngines::start().await;
    let bench = Bench::new(SMOKE).on_engines(&engines);
    engines.set(
        R2,
        Replica {
            chat_status: Some(500),
            ..Replica::default()
        },
    );
    let end = bench.run(0, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!(status, "failed", "{detail}");
    assert_eq!(code.as_deref(), Some("smoke_http_status"), "{detail}");
    assert_eq!(detail["failed_call"]["status"], 500, "{detail}");
    assert!(message(&end).contains("answered 500"), "{}", message(&end));
}

#[tokio::test]
async fn an_abort_stops_a_smoke_waiting_on_a_slow_engine() {
    let engines = FakeEngines::start().await;
    let bench = Bench::new(SMOKE).on_engines(&engines);
    engines.set(
        R2,
        Replica {
            chat_delay: Some(Duration::from_secs(20)),
            ..Replica::default()
        },
    );
    // Without the abort the step would end `smoke_timeout` at its 10 s budget.
    let end = bench.run(0, Some(Duration::from_millis(200))).await;
    let (status, _, detail) = ended(&end);
    assert_eq!(status, "aborted", "{detail}");
}
