//! NDJSON streams: the verdict comes from the last line only.

use std::time::{Duration, Instant};

use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer};

use super::*;
use crate::compose::{ComposeError, StreamOutcome};
use crate::domain::plan_gate::DryRunPlan;

async fn up_with_body(body: String) -> Result<crate::compose::StreamResult, ComposeError> {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/compose/up"))
        .respond_with(stream_body(body))
        .mount(&server)
        .await;
    client(&server).up(&up_req(R2)).await
}

#[tokio::test]
async fn a_stream_ending_in_done_success_has_succeeded_with_its_transcript() {
    let result = up_with_body(ndjson(&[ERR, OUT, DONE_OK]))
        .await
        .expect("ok");
    assert_eq!(result.outcome, StreamOutcome::Succeeded);
    assert_eq!(result.n_lines, 2);
    assert_eq!(
        result.transcript_tail,
        vec![
            "stderr: Pulling model-sg-glm53-w4afp8-tp4-r2",
            "stdout: Container model-sg-glm53-w4afp8-tp4-r2 Started"
        ]
    );
}

#[tokio::test]
async fn done_with_success_false_is_a_failure_carrying_the_exit_code() {
    let done = r#"{"event":"done","success":false,"exit_code":17}"#;
    let result = up_with_body(ndjson(&[ERR, done])).await.expect("ok");
    assert_eq!(
        result.outcome,
        StreamOutcome::Failed {
            exit_code: Some(17)
        }
    );
}

#[tokio::test]
async fn cut_stream_is_outcome_unknown_not_failure() {
    let result = up_with_body(ndjson(&[ERR, OUT]))
        .await
        .expect("not an error");
    assert_eq!(result.outcome, StreamOutcome::Unknown);
    assert_eq!(result.n_lines, 2);
    assert_eq!(
        result.transcript_tail.last().map(String::as_str),
        Some("canaryd: body ended without `done`")
    );
}

#[tokio::test]
async fn a_final_done_without_newline_still_counts() {
    let body = format!("{OUT}\n{DONE_OK}");
    let result = up_with_body(body).await.expect("ok");
    assert_eq!(result.outcome, StreamOutcome::Succeeded);
}

#[tokio::test]
async fn a_garbage_line_is_a_protocol_error_naming_its_line_number() {
    let err = up_with_body(ndjson(&[OUT, ERR, "<html>oops</html>", DONE_OK]))
        .await
        .expect_err("protocol error");
    match &err {
        ComposeError::Protocol { line_no, line, .. } => {
            assert_eq!(*line_no, 3);
            assert_eq!(line, "<html>oops</html>");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(err.code(), "compose_protocol");
    assert!(err.to_string().contains("line 3"), "{err}");
}

#[tokio::test]
async fn an_unknown_event_is_a_protocol_error() {
    let err = up_with_body(ndjson(&[r#"{"event":"error","data":"x"}"#, DONE_OK]))
        .await
        .expect_err("protocol error");
    assert!(
        matches!(err, ComposeError::Protocol { line_no: 1, .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_line_after_done_is_a_protocol_error() {
    let err = up_with_body(ndjson(&[OUT, DONE_OK, OUT]))
        .await
        .expect_err("protocol error");
    match err {
        ComposeError::Protocol {
            line_no, reason, ..
        } => {
            assert_eq!(line_no, 3);
            assert!(reason.contains("after `done`"), "{reason}");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn a_long_garbage_line_is_cut_to_two_hundred_characters_in_the_error() {
    let garbage = "z".repeat(5000);
    let err = up_with_body(ndjson(&[&garbage]))
        .await
        .expect_err("protocol");
    match err {
        ComposeError::Protocol { line, .. } => assert_eq!(line.chars().count(), 201),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn lines_split_across_chunks_are_reassembled() {
    let base = scripted_server(vec![
        chunked_head(),
        chunk(r#"{"event":"stdout","da"#),
        Step::Sleep(Duration::from_millis(30)),
        chunk("ta\":\"hé"),
        chunk("llo\"}\n{\"event\":\"stderr\",\"data\":\"two\"}\n{\"event\":\"do"),
        Step::Sleep(Duration::from_millis(30)),
        chunk(r#"ne","success":true,"exit_code":0}"#),
        last_chunk(),
    ])
    .await;
    let result = client_for(&base, opts()).up(&up_req(R2)).await.expect("ok");
    assert_eq!(result.outcome, StreamOutcome::Succeeded);
    assert_eq!(result.transcript_tail, vec!["stdout: héllo", "stderr: two"]);
}

#[tokio::test]
async fn a_connection_dropped_mid_stream_is_outcome_unknown() {
    let base = scripted_server(vec![chunked_head(), chunk(&ndjson(&[ERR, OUT]))]).await;
    let result = client_for(&base, opts())
        .down(&down_req(R2))
        .await
        .expect("ok");
    assert_eq!(result.outcome, StreamOutcome::Unknown);
    assert_eq!(result.n_lines, 2);
    let why = result.transcript_tail.last().cloned().unwrap_or_default();
    assert!(why.starts_with("canaryd: connection lost"), "{why}");
}

#[tokio::test]
async fn a_silent_stream_is_outcome_unknown_after_the_idle_timeout() {
    let base = scripted_server(vec![
        chunked_head(),
        chunk(&ndjson(&[ERR])),
        Step::Sleep(Duration::from_secs(30)),
    ])
    .await;
    let fast = ClientOptions {
        stream_idle_timeout: Duration::from_millis(200),
        ..opts()
    };
    let started = Instant::now();
    let result = client_for(&base, fast).up(&up_req(R2)).await.expect("ok");
    assert_eq!(result.outcome, StreamOutcome::Unknown);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        result.transcript_tail.last().map(String::as_str),
        Some("canaryd: no data for 200 ms")
    );
}

#[tokio::test]
async fn an_up_that_never_answers_is_outcome_unknown_not_a_retryable_error() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/compose/up"))
        .respond_with(stream_body(ndjson(&[DONE_OK])).set_delay(Duration::from_secs(5)))
        .mount(&server)
        .await;
    let fast = ClientOptions {
        stream_idle_timeout: Duration::from_millis(200),
        ..opts()
    };
    let result = client_for(&server.uri(), fast)
        .up(&up_req(R2))
        .await
        .expect("unknown, not an error");
    assert_eq!(result.outcome, StreamOutcome::Unknown);
}

#[tokio::test]
async fn a_protocol_error_still_drains_the_stream_so_the_host_keeps_its_lock() {
    let base = scripted_server(vec![
        chunked_head(),
        chunk("not json\n"),
        Step::Sleep(Duration::from_millis(300)),
        chunk(&ndjson(&[DONE_OK])),
        last_chunk(),
    ])
    .await;
    let started = Instant::now();
    let err = client_for(&base, opts())
        .up(&up_req(R2))
        .await
        .expect_err("protocol");
    assert!(
        matches!(err, ComposeError::Protocol { line_no: 1, .. }),
        "{err:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "returned before the end"
    );
}

const PLAN: &str = r#"{"event":"plan","exit_code":null,"plan":{"unchanged":["Container model-sg-glm53-w4afp8-tp4-r1","Container work-nginx-1"],"remove":[],"recreate":["Container model-sg-glm53-w4afp8-tp4-r2"],"create":["Network work_default","Container work-model-downloader-1"]},"success":true}"#;

#[tokio::test]
async fn a_dry_run_returns_the_normalised_plan_and_the_raw_plan() {
    let server = MockServer::start().await;
    let dry = r#"{"event":"stderr","data":" DRY-RUN MODE -  Container model-sg-glm53-w4afp8-tp4-r2 Recreate"}"#;
    Mock::given(method("POST"))
        .and(path("/compose/up"))
        .respond_with(stream_body(ndjson(&[dry, PLAN, DONE_OK])))
        .mount(&server)
        .await;
    let result = client(&server).dry_run(&up_req(R2)).await.expect("ok");
    assert!(result.stream.succeeded());
    assert_eq!(
        result.plan,
        Some(DryRunPlan {
            create: vec!["model-downloader".into()],
            recreate: vec![R2.into()],
            remove: vec![],
            unchanged: vec!["model-sg-glm53-w4afp8-tp4-r1".into(), "nginx".into()],
            resources: vec!["Network work_default".into()],
        })
    );
    let raw = result.raw_plan.expect("raw plan kept");
    assert_eq!(
        raw["recreate"],
        serde_json::json!(["Container model-sg-glm53-w4afp8-tp4-r2"])
    );
}

#[tokio::test]
async fn a_dry_run_without_a_plan_event_has_no_plan() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/compose/up"))
        .respond_with(stream_body(ndjson(&[OUT, DONE_OK])))
        .mount(&server)
        .await;
    let result = client(&server).dry_run(&up_req(R2)).await.expect("ok");
    assert!(result.stream.succeeded());
    assert!(result.plan.is_none() && result.raw_plan.is_none());
}

#[tokio::test]
async fn a_failed_dry_run_still_reports_its_plan_and_failure() {
    let server = MockServer::start().await;
    let plan = r#"{"event":"plan","exit_code":1,"plan":{"create":[],"recreate":[],"remove":[],"unchanged":[]},"success":false}"#;
    let done = r#"{"event":"done","success":false,"exit_code":1}"#;
    Mock::given(method("POST"))
        .and(path("/compose/up"))
        .respond_with(stream_body(ndjson(&[ERR, plan, done])))
        .mount(&server)
        .await;
    let result = client(&server).dry_run(&up_req(R2)).await.expect("ok");
    assert_eq!(
        result.stream.outcome,
        StreamOutcome::Failed { exit_code: Some(1) }
    );
    assert_eq!(result.plan, Some(DryRunPlan::default()));
}
