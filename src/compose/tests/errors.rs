//! Error answers and transport failures, as the engine sees them.

use std::time::Duration;

use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use super::*;
use crate::compose::ComposeError;

async fn up_answering(template: ResponseTemplate) -> ComposeError {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/compose/up"))
        .respond_with(template)
        .mount(&server)
        .await;
    client(&server)
        .up(&up_req(R2))
        .await
        .expect_err("an error answer")
}

#[tokio::test]
async fn a_401_is_unauthorized_with_the_servers_message() {
    let err = up_answering(error_body(401, "Invalid token")).await;
    assert_eq!(
        err,
        ComposeError::Unauthorized {
            endpoint: "/compose/up".into(),
            message: "Invalid token".into()
        }
    );
}

#[tokio::test]
async fn a_409_is_host_busy_naming_the_action_in_flight() {
    let err = up_answering(error_body(
        409,
        "another docker operation is already in progress: compose_down",
    ))
    .await;
    match &err {
        ComposeError::Busy { in_flight, .. } => assert_eq!(in_flight, "compose_down"),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(err.code(), "host_busy");
}

#[tokio::test]
async fn the_three_known_400s_have_their_own_variants() {
    let err = up_answering(error_body(400, "tag not found: v0.0.999")).await;
    assert!(
        matches!(&err, ComposeError::TagNotFound { tag, .. } if tag == "v0.0.999"),
        "{err:?}"
    );
    let too_recent = "tag too recent: 2026-05-01 10:00:00 UTC is less than 48 hours old";
    let err = up_answering(error_body(400, too_recent)).await;
    assert!(
        matches!(&err, ComposeError::TagTooRecent { message, .. } if message == too_recent),
        "{err:?}"
    );
    let missing = "file 'prod/x.yaml' not found at tag 'v0.0.452'";
    let err = up_answering(error_body(400, missing)).await;
    assert!(
        matches!(&err, ComposeError::FileNotFound { message, .. } if message == missing),
        "{err:?}"
    );
    assert_eq!(err.code(), "file_not_found");
}

#[tokio::test]
async fn axum_plain_text_rejections_are_bad_requests_with_their_text() {
    let cases = [
        (
            415,
            "Expected request with `Content-Type: application/json`",
        ),
        (
            422,
            "Failed to deserialize the JSON body into the target type: missing field `tag`",
        ),
        (
            400,
            "Failed to parse the request body as JSON: EOF while parsing",
        ),
    ];
    for (status, text) in cases {
        let err = up_answering(ResponseTemplate::new(status).set_body_string(text)).await;
        assert_eq!(
            err,
            ComposeError::BadRequest {
                endpoint: "/compose/up".into(),
                status,
                message: text.into()
            }
        );
        assert_eq!(err.code(), "compose_bad_request");
    }
}

#[tokio::test]
async fn a_500_is_a_server_error_with_its_message() {
    let err = up_answering(error_body(500, "Failed to query GitHub API")).await;
    assert_eq!(
        err,
        ComposeError::Server {
            endpoint: "/compose/up".into(),
            status: 500,
            message: "Failed to query GitHub API".into()
        }
    );
    let err = up_answering(ResponseTemplate::new(503).set_body_string("bad gateway")).await;
    assert_eq!(err.code(), "compose_server_error");
}

#[tokio::test]
async fn a_missing_route_is_not_found() {
    let server = MockServer::start().await;
    let err = client(&server).status().await.expect_err("404");
    assert_eq!(
        err,
        ComposeError::NotFound {
            endpoint: "/status".into()
        }
    );
}

#[tokio::test]
async fn a_slow_answer_is_a_timeout_naming_the_endpoint() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/status"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(serde_json::json!({"status": "ok", "in_flight": null}))
                .set_delay(Duration::from_secs(5)),
        )
        .mount(&server)
        .await;
    let fast = ClientOptions {
        request_timeout: Duration::from_millis(200),
        ..opts()
    };
    let err = client_for(&server.uri(), fast)
        .status()
        .await
        .expect_err("timeout");
    assert_eq!(
        err,
        ComposeError::Timeout {
            endpoint: "/status".into()
        }
    );
    assert_eq!(err.code(), "compose_timeout");
}

#[tokio::test]
async fn a_refused_connection_is_unreachable_for_plain_and_streaming_calls() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    let c = client_for(&format!("http://127.0.0.1:{port}"), opts());
    for err in [
        c.status().await.expect_err("refused"),
        c.up(&up_req(R2)).await.expect_err("refused"),
    ] {
        assert!(matches!(err, ComposeError::Connect { .. }), "{err:?}");
        assert_eq!(err.code(), "compose_unreachable");
    }
}

#[tokio::test]
async fn a_200_that_is_not_the_expected_json_is_a_protocol_error() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/version"))
        .respond_with(ResponseTemplate::new(200).set_body_string("<html>proxy</html>"))
        .mount(&server)
        .await;
    let err = client(&server).version().await.expect_err("protocol");
    assert!(
        matches!(&err, ComposeError::Protocol { line_no: 0, line, .. } if line == "<html>proxy</html>"),
        "{err:?}"
    );
}

#[tokio::test]
async fn error_messages_never_carry_the_token_or_env_values() {
    let err = up_answering(error_body(401, "Invalid token")).await;
    let shown = format!("{err} {err:?}");
    assert!(
        !shown.contains(TOKEN) && !shown.contains("hf_very_secret"),
        "{shown}"
    );
}
