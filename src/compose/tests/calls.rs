//! What the client sends, and what it makes of the JSON answers.

use serde_json::{json, Value};
use wiremock::matchers::{body_json, header, method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

use super::*;
use crate::compose::{ComposeError, LogsRequest};

async fn stream_ok(server: &MockServer, at: &str) {
    Mock::given(method("POST"))
        .and(path(at))
        .respond_with(stream_body(ndjson(&[OUT, DONE_OK])))
        .mount(server)
        .await;
}

async fn only_request(server: &MockServer) -> Request {
    let mut requests = server.received_requests().await.expect("recording on");
    assert_eq!(requests.len(), 1, "exactly one request");
    requests.remove(0)
}

/// A read of `tail` lines of `service`'s logs in the test file.
fn logs_req(service: &str, tail: u32) -> LogsRequest {
    LogsRequest {
        file: FILE.parse().expect("a valid name"),
        service: service.parse().expect("a valid name"),
        tail,
    }
}

/// `server` answers `GET /docker/ps` with `output`.
async fn answer_ps(server: &MockServer, output: &str) {
    Mock::given(method("GET"))
        .and(path("/docker/ps"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"status": "ok", "output": output})),
        )
        .mount(server)
        .await;
}

fn header_of(request: &Request, name: &str) -> Option<String> {
    request
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn body_of(request: &Request) -> Value {
    serde_json::from_slice(&request.body).expect("JSON body")
}

fn assert_identity(request: &Request) {
    assert_eq!(
        header_of(request, "authorization").as_deref(),
        Some("Bearer cm-secret-token")
    );
    assert_eq!(
        header_of(request, "x-triggered-by").as_deref(),
        Some("canaryd")
    );
}

fn expected_env() -> Value {
    json!({"GLM53_HICACHE_RAM_BUDGET": "406GiB", "HF_TOKEN": "hf_very_secret"})
}

#[tokio::test]
async fn up_sends_one_service_the_full_env_and_neither_force_recreate_nor_dry_run() {
    let server = MockServer::start().await;
    stream_ok(&server, "/compose/up").await;
    client(&server).up(&up_req(R2)).await.expect("ok");
    let request = only_request(&server).await;
    assert_identity(&request);
    assert_eq!(
        header_of(&request, "content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(
        body_of(&request),
        json!({"tag": "v0.0.452", "file": FILE, "services": [R2], "env": expected_env()})
    );
}

#[tokio::test]
async fn dry_run_sends_the_same_body_plus_dry_run_true() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/compose/up"))
        .and(header("authorization", "Bearer cm-secret-token"))
        .and(body_json(
            json!({"tag": "v0.0.452", "file": FILE, "services": [R2],
                              "env": expected_env(), "dry_run": true}),
        ))
        .respond_with(stream_body(ndjson(&[DONE_OK])))
        .expect(1)
        .mount(&server)
        .await;
    let result = client(&server).dry_run(&up_req(R2)).await.expect("ok");
    assert!(result.stream.succeeded());
}

#[tokio::test]
async fn down_sends_one_service_the_full_env_and_nothing_else() {
    let server = MockServer::start().await;
    stream_ok(&server, "/compose/down").await;
    let result = client(&server).down(&down_req(R2)).await.expect("ok");
    assert!(result.succeeded());
    let request = only_request(&server).await;
    assert_identity(&request);
    assert_eq!(
        body_of(&request),
        json!({"tag": "v0.0.451", "file": FILE, "services": [R2], "env": expected_env()})
    );
}

#[tokio::test]
async fn logs_sends_file_tail_and_one_service_and_returns_the_output() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/compose/logs"))
        .and(body_json(
            json!({"file": FILE, "tail": 500, "services": [R2]}),
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(
            json!({"status": "ok", "output": "r2  | event-loop stall dump armed: x\n"}),
        ))
        .expect(1)
        .mount(&server)
        .await;
    let logs = logs_req(R2, 500);
    let output = client(&server).logs(&logs).await.expect("ok");
    assert_eq!(output, "r2  | event-loop stall dump armed: x\n");
    assert_identity(&only_request(&server).await);
}

/// A whole answer is read from its bytes in place when it is UTF-8; one that is
/// not is still read with the invalid bytes replaced, as `reqwest`'s `text()` read it.
#[tokio::test]
async fn an_answer_that_is_not_utf8_is_read_with_the_invalid_bytes_replaced() {
    let server = MockServer::start().await;
    let mut body = br#"{"status": "ok", "output": "r2  | caf"#.to_vec();
    body.extend_from_slice(b"\xE9 \xFF\\n\"}");
    Mock::given(method("POST"))
        .and(path("/compose/logs"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(body, "application/json"))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/version"))
        .respond_with(ResponseTemplate::new(500).set_body_raw(
            b"{\"error\": \"disk \xFF full\"}".to_vec(),
            "application/json",
        ))
        .mount(&server)
        .await;
    let logs = logs_req(R2, 500);
    let output = client(&server).logs(&logs).await.expect("ok");
    assert_eq!(output, "r2  | caf\u{FFFD} \u{FFFD}\n");
    let err = client(&server).version().await.expect_err("a 500");
    assert!(err.to_string().contains("disk \u{FFFD} full"), "{err}");
}

#[tokio::test]
async fn ps_splits_its_output_into_containers() {
    let server = MockServer::start().await;
    let output = concat!(
        r#"{"ID":"a1","Names":"model-sg-glm53-w4afp8-tp4-r1","Image":"sglang:1","State":"running","Status":"Up 2 hours","Labels":"x=y"}"#,
        "\n",
        r#"{"ID":"b2","Names":"nginx","Image":"nginx:1.27","State":"running","Status":"Up 2 hours"}"#,
        "\n"
    );
    answer_ps(&server, output).await;
    let entries = client(&server).ps().await.expect("ok");
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0].names, "model-sg-glm53-w4afp8-tp4-r1");
    assert_eq!(entries[1].image, "nginx:1.27");
    assert_eq!(entries[1].labels, "");
    assert_identity(&only_request(&server).await);
}

#[tokio::test]
async fn ps_service_answers_the_one_container_of_a_service_after_checking_every_line() {
    let server = MockServer::start().await;
    let output = concat!(
        r#"{"ID":"b2","Names":"nginx","Image":"nginx:1.27","State":"running","Status":"Up 2 hours"}"#,
        "\n",
        r#"{"ID":"a1","Names":"work-r2-1","Image":"sglang:1","State":"running","Status":"Up 2 hours","Labels":"x=y,com.docker.compose.service=model-sg-glm53-w4afp8-tp4-r2"}"#,
        "\n",
        r#"{"ID":"c3","Names":"model-sg-glm53-w4afp8-tp4-r2","Image":"sglang:2"}"#,
        "\n"
    );
    answer_ps(&server, output).await;
    let c = client(&server);
    let found = c.ps_service(R2).await.expect("ok").expect("found");
    // The first match, as `ps()` and a `find` with `PsEntry::is_service` would pick it.
    let all = c.ps().await.expect("ok");
    let first = all.iter().find(|e| e.is_service(R2)).expect("found");
    assert_eq!(&found, first);
    assert_eq!(found.id, "a1");
    assert_eq!(
        c.ps_service("nginx").await.expect("ok").map(|e| e.id),
        Some("b2".into())
    );
    assert_eq!(c.ps_service("model-sg-glm53").await.expect("ok"), None);

    // A line that is not JSON fails the read even when the service's line came first.
    let server = MockServer::start().await;
    let output = format!(
        "{}\nnot json\n",
        r#"{"ID":"c3","Names":"model-sg-glm53-w4afp8-tp4-r2"}"#
    );
    answer_ps(&server, &output).await;
    let err = client(&server).ps_service(R2).await.err();
    assert!(
        matches!(err, Some(ComposeError::Protocol { line_no: 2, .. })),
        "{err:?}"
    );
}

#[tokio::test]
async fn status_reports_the_operation_in_flight() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/status"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"status": "ok",
            "in_flight": {"action": "compose_down", "started_at": "2026-05-01T10:00:00+00:00",
                          "tag": "v0.0.451", "file": FILE, "services": [R2]}})),
        )
        .mount(&server)
        .await;
    let status = client(&server).status().await.expect("ok");
    let in_flight = status.in_flight.expect("busy");
    assert_eq!(in_flight.action, "compose_down");
    assert_eq!(in_flight.services, vec![R2.to_owned()]);
    assert_eq!(in_flight.tag.as_deref(), Some("v0.0.451"));
}

#[tokio::test]
async fn version_reads_the_per_project_deployments_and_still_sends_the_token() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/version"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"status": "ok",
            "tag": "v0.0.452", "commit": "abc", "file": FILE, "file_sha256": "ff",
            "image": "cm@sha256:1",
            "projects": {"work": {"current": {"tag": "v0.0.452", "commit": "abc", "file": FILE,
                                              "file_sha256": "ff"},
                                  "previous": {"tag": "v0.0.451"}}}})),
        )
        .mount(&server)
        .await;
    let version = client(&server).version().await.expect("ok");
    assert_eq!(version.image.as_deref(), Some("cm@sha256:1"));
    let work = &version.projects["work"];
    assert_eq!(
        work.previous.as_ref().and_then(|p| p.tag.as_deref()),
        Some("v0.0.451")
    );
    assert_identity(&only_request(&server).await);
}

async fn probe_answering(template: ResponseTemplate) -> (Result<bool, ComposeError>, Value) {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/docker/evict"))
        .respond_with(template)
        .mount(&server)
        .await;
    let answer = client(&server).supports_dry_run().await;
    let body = body_of(&only_request(&server).await);
    (answer, body)
}

#[tokio::test]
async fn the_probe_says_dry_run_is_supported_on_422() {
    let text = "Failed to deserialize the JSON body into the target type: missing field `model`";
    let (answer, body) = probe_answering(ResponseTemplate::new(422).set_body_string(text)).await;
    assert_eq!(answer, Ok(true));
    assert_eq!(body, json!({}));
}

#[tokio::test]
async fn the_probe_says_dry_run_is_unsupported_on_404() {
    let (answer, _) = probe_answering(ResponseTemplate::new(404)).await;
    assert_eq!(answer, Ok(false));
}

#[tokio::test]
async fn the_probe_fails_on_anything_else() {
    let (answer, _) = probe_answering(error_body(500, "boom")).await;
    assert_eq!(
        answer.map_err(|e| e.code().as_str()),
        Err("compose_server_error")
    );
    let (answer, _) = probe_answering(ResponseTemplate::new(200)).await;
    assert_eq!(
        answer.map_err(|e| e.code().as_str()),
        Err("compose_protocol")
    );
}

#[test]
fn bad_base_urls_are_refused() {
    for bad in [
        "",
        "gpu02:8080",
        "https://gpu02.internal:8080",
        "ftp://gpu02",
        "http://user:pw@gpu02:8080",
        "http://gpu02:8080/?x=1",
    ] {
        let err = ComposeClient::new(bad, TOKEN, ClientOptions::default()).err();
        assert!(
            matches!(err, Some(ComposeError::InvalidUrl { .. })),
            "{bad:?} gave {err:?}"
        );
    }
    let shown = format!(
        "{:?}",
        ComposeClient::new("http://user:pw@gpu02:8080", TOKEN, ClientOptions::default()).err()
    );
    assert!(!shown.contains("pw"), "{shown}");
}

#[test]
fn the_base_url_loses_its_trailing_slash_and_debug_hides_the_token() {
    let c = ComposeClient::new(
        "http://gpu02.internal:8080/",
        TOKEN,
        ClientOptions::default(),
    )
    .expect("valid");
    assert_eq!(c.base_url(), "http://gpu02.internal:8080");
    let shown = format!("{c:?}");
    assert!(!shown.contains(TOKEN), "{shown}");
    assert!(ComposeClient::new("http://h:1", "", ClientOptions::default()).is_err());
    assert!(ComposeClient::new("http://h:1", "bad\ntoken", ClientOptions::default()).is_err());
}

#[test]
fn client_options_default_to_the_documented_values() {
    let o = ClientOptions::default();
    assert_eq!(o.connect_timeout, std::time::Duration::from_secs(5));
    assert_eq!(o.request_timeout, std::time::Duration::from_secs(30));
    assert_eq!(o.stream_idle_timeout, std::time::Duration::from_secs(600));
    assert_eq!(
        (o.triggered_by.as_str(), o.project.as_str()),
        ("canaryd", "work")
    );
}

#[tokio::test]
async fn hosts_sharing_one_http_client_each_send_their_own_token_and_actor() {
    let http = crate::compose::ComposeHttp::new(std::time::Duration::from_secs(2)).expect("http");
    let (a, b) = (MockServer::start().await, MockServer::start().await);
    for server in [&a, &b] {
        Mock::given(method("GET"))
            .and(path("/status"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"in_flight": null})))
            .mount(server)
            .await;
    }
    let on = |server: &MockServer, token: &str, actor: &str| {
        let opts = ClientOptions {
            triggered_by: actor.to_owned(),
            ..opts()
        };
        ComposeClient::with_http(&http, &server.uri(), token, opts).expect("valid client")
    };
    let (to_a, to_b) = (
        on(&a, "token-of-a", "canaryd-a"),
        on(&b, "token-of-b", "canaryd-b"),
    );
    for _ in 0..2 {
        to_a.status().await.expect("a answers");
        to_b.status().await.expect("b answers");
    }
    for (server, token, actor) in [
        (&a, "token-of-a", "canaryd-a"),
        (&b, "token-of-b", "canaryd-b"),
    ] {
        let requests = server.received_requests().await.expect("recording on");
        assert_eq!(requests.len(), 2, "two calls each");
        for request in &requests {
            assert_eq!(
                header_of(request, "authorization"),
                Some(format!("Bearer {token}"))
            );
            assert_eq!(header_of(request, "x-triggered-by").as_deref(), Some(actor));
        }
    }
}

#[tokio::test]
async fn every_call_over_a_shared_http_client_sends_the_hosts_token_and_actor() {
    let http = crate::compose::ComposeHttp::new(std::time::Duration::from_secs(2)).expect("http");
    let server = MockServer::start().await;
    // Any answer will do: what is checked is what each call sent.
    Mock::given(wiremock::matchers::any())
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"output": ""})))
        .mount(&server)
        .await;
    let opts = ClientOptions {
        triggered_by: "canaryd-x".to_owned(),
        ..opts()
    };
    let c = ComposeClient::with_http(&http, &server.uri(), "token-x", opts).expect("client");
    let logs = logs_req(R2, 5);
    let _ = c.status().await;
    let _ = c.version().await;
    let _ = c.ps().await;
    let _ = c.ps_service(R2).await;
    let _ = c.logs(&logs).await;
    let _ = c.supports_dry_run().await;
    let _ = c.dry_run(&up_req(R2)).await;
    let _ = c.down(&down_req(R2)).await;
    let _ = c.up(&up_req(R2)).await;
    let requests = server.received_requests().await.expect("recording on");
    let paths: Vec<&str> = requests.iter().map(|r| r.url.path()).collect();
    assert_eq!(
        paths,
        [
            "/status",
            "/version",
            "/docker/ps",
            "/docker/ps",
            "/compose/logs",
            "/docker/evict",
            "/compose/up",
            "/compose/down",
            "/compose/up"
        ]
    );
    for request in &requests {
        let at = request.url.path();
        assert_eq!(
            header_of(request, "authorization").as_deref(),
            Some("Bearer token-x"),
            "{at}"
        );
        assert_eq!(
            header_of(request, "x-triggered-by").as_deref(),
            Some("canaryd-x"),
            "{at}"
        );
    }
}
