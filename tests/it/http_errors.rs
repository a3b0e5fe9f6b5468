//! Every refusal of the API has one shape, `{"error": {"code", "message"}}`, whoever refuses:
//! a handler, the router (unknown path, wrong method), the body limit or a read timeout.

use std::time::Duration;

use canaryd::config::HttpTuning;
use reqwest::Method;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{sim_config, TestApp, TestOptions, HOST, R2};

async fn send(
    app: &TestApp,
    method: Method,
    path: &str,
    body: Option<(&str, Vec<u8>)>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new().request(method, format!("{}{path}", app.url));
    if let Some((content_type, bytes)) = body {
        req = req.header("content-type", content_type).body(bytes);
    }
    let res = req.send().await.expect("the daemon answers");
    let status = res.status().as_u16();
    let content_type = res
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let text = res.text().await.expect("a body");
    assert!(
        content_type.starts_with("application/json"),
        "{status} answered {content_type:?}: {text}"
    );
    let value: Value = serde_json::from_str(&text).expect("a JSON body");
    assert!(
        value["error"]["code"].is_string() && value["error"]["message"].is_string(),
        "the error shape: {value}"
    );
    (status, value)
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

#[tokio::test]
async fn a_body_over_the_limit_gets_a_json_413_whatever_its_size() {
    let app = TestApp::spawn().await;
    for size in [100 * 1024, 10 * 1024 * 1024] {
        let reason = "x".repeat(size);
        let plan = serde_json::to_vec(&json!({"host": HOST, "reason": reason})).expect("json");
        for path in ["/v1/rollouts", "/v1/rollbacks"] {
            let (status, body) = send(
                &app,
                Method::POST,
                path,
                Some(("application/json", plan.clone())),
            )
            .await;
            assert_eq!(status, 413, "{path} with {size} bytes: {body}");
            assert_eq!(code(&body), "body_too_large", "{body}");
        }
    }
    assert!(app.compose_calls().is_empty());
    app.stop().await;
}

#[tokio::test]
async fn a_body_of_another_media_type_gets_a_json_415() {
    let app = TestApp::spawn().await;
    let plan = serde_json::to_vec(&TestApp::plan("v0.0.452")).expect("json");
    for path in [
        "/v1/rollouts",
        "/v1/rollbacks",
        "/v1/rollouts/ro_00000000000000000000000000/abort",
    ] {
        let (status, body) =
            send(&app, Method::POST, path, Some(("text/plain", plan.clone()))).await;
        assert_eq!(status, 415, "{path}: {body}");
        assert_eq!(code(&body), "unsupported_media_type", "{body}");
    }
    // A charset parameter is still JSON.
    let res = reqwest::Client::new()
        .post(format!("{}/v1/rollouts", app.url))
        .header("content-type", "application/json; charset=utf-8")
        .body(plan)
        .send()
        .await
        .expect("the daemon answers");
    assert_eq!(res.status(), 201);
    app.stop().await;
}

#[tokio::test]
async fn an_unknown_path_gets_a_json_404_and_a_wrong_method_a_json_405() {
    let app = TestApp::spawn().await;
    let (status, body) = send(&app, Method::GET, "/v1/nothing-here", None).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(code(&body), "route_not_found");
    for (method, path) in [
        (Method::DELETE, "/v1/rollouts"),
        (Method::GET, "/v1/rollbacks"),
        (Method::PUT, "/healthz"),
    ] {
        let (status, body) = send(&app, method.clone(), path, None).await;
        assert_eq!(status, 405, "{method} {path}: {body}");
        assert_eq!(code(&body), "method_not_allowed");
    }
    app.stop().await;
}

#[tokio::test]
async fn rollbacks_and_rollouts_answer_the_same_codes_for_the_same_faults() {
    let app = TestApp::spawn().await;
    let rollback = json!({"host": HOST, "service": R2, "reason": "bad canary"});
    let plan = TestApp::plan("v0.0.452");
    let with = |base: &Value, key: &str, value: Value| {
        let mut v = base.clone();
        if value.is_null() {
            v.as_object_mut().expect("object").remove(key);
        } else {
            v[key] = value;
        }
        v
    };
    let faults = [
        ("unknown host", "host", json!("gpu99"), 422, "unknown_host"),
        (
            "unknown replica",
            "service",
            json!("nope-r9"),
            422,
            "unknown_service",
        ),
        ("no reason", "reason", Value::Null, 422, "missing_reason"),
        ("blank reason", "reason", json!("  "), 422, "missing_reason"),
        (
            "unknown field",
            "force_recreate",
            json!(true),
            400,
            "unknown_field",
        ),
    ];
    for (what, key, value, want_status, want_code) in faults {
        for (path, base) in [("/v1/rollouts", &plan), ("/v1/rollbacks", &rollback)] {
            let (status, body) = app.post(path, &with(base, key, value.clone())).await;
            assert_eq!(status, want_status, "{what} to {path}: {body}");
            assert_eq!(code(&body), want_code, "{what} to {path}: {body}");
        }
    }
    // An abort without a reason: the same code.
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    for body in [json!({}), json!({"reason": " "})] {
        let (status, answer) = app.post(&format!("/v1/rollouts/{id}/abort"), &body).await;
        assert_eq!(status, 422, "abort with {body}: {answer}");
        assert_eq!(code(&answer), "missing_reason", "{answer}");
    }
    app.stop().await;
}

#[tokio::test]
async fn every_json_body_names_the_field_at_fault_with_the_same_codes() {
    let app = TestApp::spawn().await;
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let abort = format!("/v1/rollouts/{id}/abort");
    let faults = [
        (
            "/v1/rollbacks",
            json!({"host": HOST, "service": R2, "reason": "r", "preempt": "yes"}),
            "invalid_body",
            "rollback body: preempt: invalid type: string \"yes\", expected a boolean",
        ),
        (
            abort.as_str(),
            json!({"reason": "r", "force": true}),
            "unknown_field",
            "force: unknown field (expected one of: reason)",
        ),
        (
            abort.as_str(),
            json!({"reason": ["r"]}),
            "invalid_body",
            "abort body: reason: invalid type: sequence, expected a string",
        ),
        (
            abort.as_str(),
            json!("stop"),
            "invalid_body",
            "abort body: must be a JSON object",
        ),
    ];
    for (path, body, want_code, want_message) in faults {
        let (status, answer) = app.post(path, &body).await;
        assert_eq!(status, 400, "{body} to {path}: {answer}");
        assert_eq!(code(&answer), want_code, "{body} to {path}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or("");
        assert!(
            message.starts_with(want_message),
            "{body} to {path}: {answer}"
        );
    }
    app.stop().await;
}

fn quick_reads() -> TestOptions {
    TestOptions {
        http: Some(HttpTuning {
            header_read_timeout: Duration::from_millis(300),
            body_read_timeout: Duration::from_millis(300),
            ..HttpTuning::default()
        }),
        ..TestOptions::default()
    }
}

/// Reads until the server closes the connection (or 5 s pass); returns what it sent.
async fn read_until_closed(stream: &mut TcpStream) -> Option<String> {
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer));
    match read.await {
        Ok(_) => Some(String::from_utf8_lossy(&answer).into_owned()),
        Err(_) => None,
    }
}

#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_disconnected() {
    let app = TestApp::spawn_custom(sim_config(), quick_reads()).await;
    let addr = app.url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .expect("write");
    let answer = read_until_closed(&mut stream).await;
    assert!(
        answer.is_some(),
        "the connection is closed after the header read timeout"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_client_that_never_finishes_its_body_gets_a_json_408() {
    let app = TestApp::spawn_custom(sim_config(), quick_reads()).await;
    let addr = app.url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(
            b"POST /v1/rollouts HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
              Content-Length: 100\r\n\r\n{\"host\":",
        )
        .await
        .expect("write");
    let answer = read_until_closed(&mut stream)
        .await
        .expect("the server answers and closes");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"request_timeout\""), "{answer}");
    app.stop().await;
}
