//! The `smoke` step end to end: a real generation through the canary's OpenAI-compatible API
//! after `/health`, its evidence stored, and each way it fails rolling the one replica back.

use std::time::Duration;

use canaryd::api::RolloutOut;
use canaryd_sim::{ApiFault, SimHost};
use serde_json::{json, Value};

use crate::helpers::step;
use crate::helpers::{sim_config, with_smoke, TestApp, TestOptions, FAST_SMOKE, R1, R2};

const MODEL: &str = "z-ai/glm-5.3-flash";
const PROMPT: &str = "Reply with the word ready.";
const CANARY_TAG: &str = "v0.0.452";
/// What the example host runs at start, and so what a failed canary's rollback restores.
const PRIOR_TAG: &str = "v0.0.450";

fn code(r: &RolloutOut) -> Option<&str> {
    r.error.as_ref().map(|e| e.code.as_str())
}

fn image_of(app: &TestApp, service: &str) -> String {
    app.sim
        .containers()
        .into_iter()
        .find(|c| c.service == service)
        .map(|c| c.image)
        .unwrap_or_default()
}

/// The engine's calls of one service's API, as (path, body, bearer).
fn api_calls(sim: &SimHost, service: &str) -> Vec<(String, Value, Option<String>)> {
    sim.api_calls()
        .into_iter()
        .filter(|c| c.service == service)
        .map(|c| (c.path, c.body, c.bearer))
        .collect()
}

async fn spawn(canary_smoke: &str) -> TestApp {
    let opts = TestOptions {
        runbooks: Some(with_smoke(canary_smoke)),
        ..TestOptions::default()
    };
    TestApp::spawn_custom(sim_config(), opts).await
}

#[tokio::test]
async fn a_canary_smoke_tests_the_new_engine_and_stores_latency_usage_and_output() {
    let app = spawn(FAST_SMOKE).await;
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");

    let kinds: Vec<&str> = r.steps.iter().map(|s| s.kind.as_str()).collect();
    let health = kinds.iter().position(|k| *k == "wait_health");
    assert_eq!(health.map(|h| kinds[h + 1]), Some("smoke"), "{kinds:?}");
    let smoke = step(&r, "smoke");
    assert_eq!(smoke.status, "succeeded");
    let d = &smoke.detail;
    assert_eq!(d["model"], MODEL);
    assert_eq!(d["models"], json!([MODEL]));
    assert_eq!(d["repeat"], 2);
    assert_eq!(d["identical_outputs"], 2);
    assert_eq!(
        d["prompt"], "Reply with the word ready.",
        "the prompt, for the page"
    );
    let output = d["output"].as_str().expect("an output excerpt");
    assert!(
        output.starts_with("Ready. Served by lmsysorg/sglang:glm53-v452, answer "),
        "the new engine answered: {output}"
    );
    let calls = d["calls"].as_array().expect("calls");
    assert_eq!(calls.len(), 2, "{d:#}");
    for call in calls {
        // "Reply with the word ready." is 5 words; the answer 6.
        assert_eq!(
            call["usage"],
            json!({"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11})
        );
        assert_eq!(call["finish_reason"], "stop");
        assert_eq!(call["output"], output);
        assert!(call["latency_ms"].is_u64(), "{call}");
    }
    let max = calls.iter().filter_map(|c| c["latency_ms"].as_u64()).max();
    assert_eq!(d["latency_ms_max"].as_u64(), max);
    assert!(d["models_latency_ms"].is_u64());

    // The old engine's model listing read before the down (safety rule 20), then one model
    // listing and two generations, to the canary only, in the OpenAI shape.
    let calls = api_calls(&app.sim, R2);
    let paths: Vec<&str> = calls.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/v1/models",
            "/v1/models",
            "/v1/chat/completions",
            "/v1/chat/completions"
        ]
    );
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": PROMPT}],
                      "max_tokens": 16, "temperature": 0});
    assert_eq!(calls[2].1, chat);
    assert_eq!(calls[3].1, chat);
    assert!(calls.iter().all(|c| c.2.is_none()), "no token configured");
    assert!(api_calls(&app.sim, R1).is_empty(), "the peer is not asked");
    app.stop().await;
}

#[tokio::test]
async fn the_api_token_is_sent_as_a_bearer_and_never_stored() {
    let secret = "engine-api-secret-7f3a";
    let opts = TestOptions {
        runbooks: Some(with_smoke(FAST_SMOKE)),
        api_token: Some(secret.to_owned()),
        ..TestOptions::default()
    };
    let app = TestApp::spawn_custom(sim_config(), opts).await;
    app.sim.faults().require_api_token(Some(secret));
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let calls = api_calls(&app.sim, R2);
    assert_eq!(
        calls.len(),
        4,
        "the listing read before the down, then the smoke's three"
    );
    assert!(calls.iter().all(|c| c.2.as_deref() == Some(secret)));
    let stored = serde_json::to_string(&r).expect("json");
    assert!(!stored.contains(secret), "the token is not in the rollout");
    let audit = app
        .engine
        .store()
        .audit_events(&id, 0)
        .await
        .expect("audit");
    assert!(!format!("{audit:?}").contains(secret), "nor in its audit");
    app.stop().await;
}

#[tokio::test]
async fn a_missing_api_token_fails_smoke_http_status_with_the_401() {
    let app = spawn(FAST_SMOKE).await;
    // Once the target is down: a token wanted from the start is caught before it
    // (`signal_unavailable`, tests/it/preflight.rs).
    let mut up = app.engine.pause_at("step:up:started");
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    assert!(up.reached(Duration::from_secs(20)).await.is_some());
    app.sim
        .faults()
        .require_api_token(Some("the-engine-wants-this"));
    up.release();
    let r = app.wait_terminal(&id).await;
    assert_eq!(code(&r), Some("smoke_http_status"), "{r:#?}");
    let failed = &step(&r, "smoke").detail["failed_call"];
    assert_eq!(failed["call"], "GET /v1/models");
    assert_eq!(failed["status"], 401, "{failed}");
    // A configuration problem, not the version's: the rollback's smoke test fails alike.
    let rb = app
        .wait_terminal(r.rolled_back_by.as_deref().expect("rolled back"))
        .await;
    assert_eq!(code(&rb), Some("smoke_http_status"), "{rb:#?}");
    app.stop().await;
}

/// Runs a canary of r2 that must fail its smoke step with `expected`, and checks that the
/// automatic rollback brought r2 back to the prior tag, touching nothing else. Returns the
/// canary and its rollback.
async fn fails_and_rolls_back_with(app: &TestApp, expected: &str) -> (RolloutOut, RolloutOut) {
    let r1_before = app.container_id(R1).expect("r1 runs");
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "failed", "{r:#?}");
    assert_eq!(code(&r), Some(expected), "{r:#?}");
    let smoke = step(&r, "smoke");
    assert_eq!(smoke.status, "failed");
    assert_eq!(
        smoke.detail["error"]["code"], expected,
        "{:#}",
        smoke.detail
    );
    assert_eq!(smoke.detail["model"], MODEL);
    for later in ["startup-logs", "soak"] {
        assert_eq!(step(&r, later).status, "skipped", "{later}");
    }

    let rb_id = r
        .rolled_back_by
        .clone()
        .expect("the failed canary is rolled back");
    let rb = app.wait_terminal(&rb_id).await;
    assert_eq!(rb.status, "succeeded", "{rb:#?}");
    assert_eq!(rb.tag, PRIOR_TAG);
    assert_eq!(
        step(&rb, "smoke").status,
        "succeeded",
        "the prior engine passes the same smoke test"
    );
    assert_eq!(image_of(app, R2), "lmsysorg/sglang:glm53-v450");
    for call in app.compose_calls() {
        assert_eq!(
            call.body["services"],
            json!([R2]),
            "r2 alone: {}",
            call.body
        );
    }
    assert_eq!(app.container_id(R1), Some(r1_before), "r1 untouched");
    (r, rb)
}

/// The canary's engine (tag v0.0.452 only) misbehaves as `fault`.
async fn faulty(fault: ApiFault, canary_smoke: &str) -> TestApp {
    let app = spawn(canary_smoke).await;
    app.sim
        .faults()
        .set_api_fault(R2, Some(CANARY_TAG), Some(fault));
    app
}

#[tokio::test]
async fn an_engine_that_serves_another_model_fails_smoke_model_missing_and_rolls_back() {
    let app = faulty(ApiFault::ModelId("z-ai/glm-4.6".into()), FAST_SMOKE).await;
    let (r, _) = fails_and_rolls_back_with(&app, "smoke_model_missing").await;
    let d = &step(&r, "smoke").detail;
    assert_eq!(d["models"], json!(["z-ai/glm-4.6"]));
    assert!(
        d["calls"].as_array().is_some_and(Vec::is_empty),
        "no generation asked"
    );
    let message = d["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("z-ai/glm-5.3-flash") && message.contains("z-ai/glm-4.6"),
        "{message}"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_500_fails_smoke_http_status_with_the_body_and_rolls_back() {
    let app = faulty(ApiFault::Status(500), FAST_SMOKE).await;
    let (r, _) = fails_and_rolls_back_with(&app, "smoke_http_status").await;
    let failed = &step(&r, "smoke").detail["failed_call"];
    assert_eq!(failed["call"], "POST /v1/chat/completions (call 1 of 2)");
    assert_eq!(failed["status"], 500);
    assert!(
        failed["body"]
            .as_str()
            .unwrap_or_default()
            .contains("simulated engine failure"),
        "{failed}"
    );
    app.stop().await;
}

#[tokio::test]
async fn empty_content_fails_smoke_empty_output_and_rolls_back() {
    let app = faulty(ApiFault::EmptyContent, FAST_SMOKE).await;
    let (r, _) = fails_and_rolls_back_with(&app, "smoke_empty_output").await;
    let d = &step(&r, "smoke").detail;
    assert_eq!(d["output"], "");
    assert_eq!(d["calls"][0]["usage"]["completion_tokens"], 0);
    app.stop().await;
}

#[tokio::test]
async fn a_body_that_is_not_json_fails_smoke_http_status_naming_why() {
    let app = faulty(ApiFault::Garbage, FAST_SMOKE).await;
    let (r, _) = fails_and_rolls_back_with(&app, "smoke_http_status").await;
    let failed = &step(&r, "smoke").detail["failed_call"];
    assert_eq!(failed["status"], 200);
    assert!(
        failed["error"]
            .as_str()
            .unwrap_or_default()
            .starts_with("not JSON"),
        "{failed}"
    );
    assert!(failed["body"]
        .as_str()
        .unwrap_or_default()
        .contains("502 Bad Gateway"));
    app.stop().await;
}

#[tokio::test]
async fn an_output_that_misses_an_expect_pattern_fails_smoke_mismatch_naming_it() {
    let smoke = FAST_SMOKE.replace(
        r#"expect: ["re:(?i)ready"]"#,
        r#"expect: ["re:(?i)ready", "re:^OK$"]"#,
    );
    assert_ne!(smoke, FAST_SMOKE);
    let app = spawn(&smoke).await;
    let (r, _) = fails_and_rolls_back_with(&app, "smoke_mismatch").await;
    let d = &step(&r, "smoke").detail;
    assert_eq!(d["unmatched"], json!(["re:^OK$"]));
    let message = d["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("re:^OK$") && message.contains("Ready."),
        "{message}"
    );
    assert_eq!(
        d["calls"].as_array().map(Vec::len),
        Some(1),
        "stops at the first miss"
    );
    app.stop().await;
}

#[tokio::test]
async fn outputs_that_differ_at_temperature_0_fail_smoke_nondeterministic() {
    let app = faulty(ApiFault::NonDeterministic, FAST_SMOKE).await;
    let (r, _) = fails_and_rolls_back_with(&app, "smoke_nondeterministic").await;
    let d = &step(&r, "smoke").detail;
    let distinct: Vec<&str> = d["distinct_outputs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(distinct.len(), 2, "{d:#}");
    assert_ne!(distinct[0], distinct[1]);
    assert!(distinct
        .iter()
        .all(|o| o.starts_with("Ready. Served by lmsysorg/sglang:glm53-v452")));
    assert_eq!(d["calls"].as_array().map(Vec::len), Some(2));
    app.stop().await;
}

#[tokio::test]
async fn an_engine_slower_than_the_timeout_fails_smoke_timeout() {
    let smoke = FAST_SMOKE.replace("timeout: 2s", "timeout: 400ms");
    assert_ne!(smoke, FAST_SMOKE);
    let app = faulty(ApiFault::Delay(Duration::from_secs(3)), &smoke).await;
    let started = std::time::Instant::now();
    let (r, _) = fails_and_rolls_back_with(&app, "smoke_timeout").await;
    let s = step(&r, "smoke");
    let took = s
        .finished_at
        .zip(s.started_at)
        .map(|(b, a)| (b - a).num_milliseconds());
    assert!(
        took.is_some_and(|ms| (400..2000).contains(&ms)),
        "ended at its deadline: {took:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(15));
    app.stop().await;
}

#[tokio::test]
async fn an_abort_interrupts_a_smoke_call() {
    let smoke = FAST_SMOKE.replace("timeout: 2s", "timeout: 30s");
    let app = faulty(ApiFault::Delay(Duration::from_secs(20)), &smoke).await;
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    app.wait_step(&id, "smoke", "running").await;
    // The models call is now held by the delay.
    for _ in 0..100 {
        if !api_calls(&app.sim, R2).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let asked = std::time::Instant::now();
    let (status, body) = app
        .post(
            &format!("/v1/rollouts/{id}/abort"),
            &json!({"reason": "enough"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "aborted", "{r:#?}");
    assert_eq!(step(&r, "smoke").status, "aborted");
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    app.stop().await;
}

#[tokio::test]
async fn the_simulated_engines_serve_a_deterministic_openai_api_once_ready() {
    let sim = SimHost::start(sim_config()).await.expect("host");
    let base = sim.api_url(R1).expect("r1 api");
    let client = reqwest::Client::new();
    let models: Value = client
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .expect("answer")
        .json()
        .await
        .expect("json");
    assert_eq!(models["data"][0]["id"], MODEL);
    let chat = |prompt: &str, model: &str| {
        let body = json!({"model": model, "messages": [{"role": "user", "content": prompt}],
                          "max_tokens": 3, "temperature": 0});
        client
            .post(format!("{base}/v1/chat/completions"))
            .json(&body)
            .send()
    };
    let a: Value = chat(PROMPT, MODEL)
        .await
        .expect("a")
        .json()
        .await
        .expect("json");
    let b: Value = chat(PROMPT, MODEL)
        .await
        .expect("b")
        .json()
        .await
        .expect("json");
    assert_eq!(
        a["choices"], b["choices"],
        "same prompt, same image: same answer"
    );
    assert_eq!(a["choices"][0]["message"]["content"], "Ready. Served by");
    assert_eq!(
        a["choices"][0]["finish_reason"], "length",
        "cut at max_tokens"
    );
    assert_eq!(a["usage"]["completion_tokens"], 3);
    assert_eq!(chat(PROMPT, "other").await.expect("c").status(), 404);

    sim.faults().set_health_never(R1, true);
    assert_eq!(chat(PROMPT, MODEL).await.expect("d").status(), 503);
    let status = client
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .expect("e")
        .status();
    assert_eq!(status, 503, "not ready, like /health");
    sim.shutdown().await;
}

#[tokio::test]
async fn a_smoke_step_caught_by_a_crash_runs_again_after_the_restart_within_its_deadline() {
    let app = spawn(FAST_SMOKE).await;
    let mut pause = app.engine.pause_at("step:smoke:started");
    let id = app.start_canary(&TestApp::plan(CANARY_TAG)).await;
    assert!(pause.reached(Duration::from_secs(10)).await.is_some());
    let deadline_of = |steps: Vec<canaryd::store::Step>| {
        steps
            .into_iter()
            .find(|s| s.name == "smoke")
            .and_then(|s| s.deadline_at)
    };
    let deadline = deadline_of(app.engine.store().steps(&id).await.expect("steps"));
    assert!(
        deadline.is_some(),
        "the deadline was written when the step started"
    );
    let app = app.kill().await.restart().await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    assert_eq!(step(&r, "smoke").detail["identical_outputs"], 2);
    let kept = deadline_of(app.engine.store().steps(&id).await.expect("steps"));
    assert_eq!(kept, deadline, "the restart does not reset the deadline");
    assert_eq!(
        api_calls(&app.sim, R2).len(),
        4,
        "the listing read before the down once, then one listing, two generations"
    );
    app.stop().await;
}
