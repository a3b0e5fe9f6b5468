//! Bearer tokens and roles (docs/reference.md#http-api) on every API route: 401 without a token or
//! with a wrong one, 403 for a role that may not act; `viewer` reads, `oncall` also aborts and
//! rolls back, `operator` does everything. Probes, metrics, the OpenAPI document and the dashboard
//! page are open by design (they carry no rollout data).

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::{TestApp, HOST, R2};

const OPERATOR: &str = "tok-operator-0123456789abcdef";
const ONCALL: &str = "tok-oncall-0123456789abcdef";
const VIEWER: &str = "tok-viewer-0123456789abcdef";

async fn call(
    app: &TestApp,
    method: Method,
    path: &str,
    auth: Option<&str>,
    body: Option<&Value>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .request(method, format!("{}{path}", app.url))
        .timeout(Duration::from_secs(5));
    if let Some(auth) = auth {
        req = req.header("authorization", auth);
    }
    if let Some(body) = body {
        req = req.json(body);
    }
    let res = req.send().await.expect("the daemon answers");
    let status = res.status().as_u16();
    let is_stream = res
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("text/event-stream"));
    if is_stream {
        return (status, Value::Null);
    }
    (status, res.json().await.unwrap_or(Value::Null))
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[tokio::test]
async fn every_api_route_refuses_a_missing_or_wrong_token_with_401() {
    let app = TestApp::spawn_with_tokens(OPERATOR, ONCALL, VIEWER).await;
    let routes: &[(Method, &str)] = &[
        (Method::GET, "/v1/rollouts"),
        (Method::POST, "/v1/rollouts"),
        (Method::GET, "/v1/rollouts/ro_missing"),
        (Method::POST, "/v1/rollouts/ro_missing/abort"),
        (Method::GET, "/v1/rollouts/ro_missing/events"),
        (Method::GET, "/v1/rollouts/ro_missing/audit"),
        (Method::POST, "/v1/rollbacks"),
        (Method::GET, "/v1/replicas"),
        (
            Method::GET,
            &*format!("/v1/replicas/{HOST}/{R2}/deployments"),
        ),
    ];
    let wrong = [
        None,
        Some("Bearer".to_owned()),
        Some("Bearer ".to_owned()),
        Some(bearer("nope")),
        Some(bearer(&format!("{OPERATOR}x"))),
        Some(bearer(&OPERATOR[..OPERATOR.len() - 1])),
        Some(format!("Basic {OPERATOR}")),
        Some(format!("Bearer  {OPERATOR}")),
    ];
    let body = json!({"reason": "x"});
    for (method, path) in routes {
        for auth in &wrong {
            let (status, answer) =
                call(&app, method.clone(), path, auth.as_deref(), Some(&body)).await;
            assert_eq!(status, 401, "{method} {path} with {auth:?}: {answer}");
            assert!(
                answer["error"]["code"].is_string(),
                "a JSON error: {answer}"
            );
            let text = answer.to_string();
            assert!(!text.contains(OPERATOR), "the answer never echoes a token");
        }
    }
    assert!(
        app.compose_calls().is_empty(),
        "nothing reached compose-manager"
    );
    app.stop().await;
}

#[tokio::test]
async fn viewers_read_oncall_aborts_and_rolls_back_operators_start_canaries() {
    let app = TestApp::spawn_with_tokens(OPERATOR, ONCALL, VIEWER).await;
    let (op, oc, vw) = (bearer(OPERATOR), bearer(ONCALL), bearer(VIEWER));
    let plan = TestApp::plan("v0.0.452");

    // Starting a canary: operator only; refusals store nothing.
    for who in [&vw, &oc] {
        let (status, answer) =
            call(&app, Method::POST, "/v1/rollouts", Some(who), Some(&plan)).await;
        assert_eq!(status, 403, "{answer}");
        assert_eq!(answer["error"]["code"], "forbidden", "{answer}");
    }
    let (status, list) = call(&app, Method::GET, "/v1/rollouts", Some(&vw), None).await;
    assert_eq!(status, 200);
    assert_eq!(list["items"].as_array().map(Vec::len), Some(0), "{list}");
    let (status, created) = call(&app, Method::POST, "/v1/rollouts", Some(&op), Some(&plan)).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(
        created["actor"], "ops-alice",
        "the token's name is the actor"
    );
    let id = created["id"].as_str().expect("id").to_owned();

    // Every role reads everything.
    for who in [&vw, &oc, &op] {
        for path in [
            "/v1/rollouts".to_owned(),
            format!("/v1/rollouts/{id}"),
            format!("/v1/rollouts/{id}/events"),
            format!("/v1/rollouts/{id}/audit"),
            "/v1/replicas".to_owned(),
            format!("/v1/replicas/{HOST}/{R2}/deployments"),
        ] {
            let (status, answer) = call(&app, Method::GET, &path, Some(who), None).await;
            assert_eq!(status, 200, "GET {path}: {answer}");
        }
    }

    // Approving a waiting step: operators only, refused before anything else is looked at.
    let approve = format!("/v1/rollouts/{id}/approve");
    for who in [&vw, &oc] {
        let body = json!({"reason": "looks fine"});
        let (status, answer) = call(&app, Method::POST, &approve, Some(who), Some(&body)).await;
        assert_eq!(status, 403, "{answer}");
        assert_eq!(answer["error"]["code"], "forbidden", "{answer}");
    }

    // Abort: not a viewer; on-call may.
    let reason = json!({"reason": "on-call stops it"});
    let abort = format!("/v1/rollouts/{id}/abort");
    let (status, answer) = call(&app, Method::POST, &abort, Some(&vw), Some(&reason)).await;
    assert_eq!(status, 403, "{answer}");
    assert_eq!(answer["error"]["code"], "forbidden", "{answer}");
    let (status, answer) = call(&app, Method::POST, &abort, Some(&oc), Some(&reason)).await;
    assert_eq!(status, 200, "{answer}");
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "aborted");
    let (_, trail) = call(
        &app,
        Method::GET,
        &format!("/v1/rollouts/{id}/audit"),
        Some(&vw),
        None,
    )
    .await;
    let actor_of = |kind: &str| {
        trail["items"]
            .as_array()
            .and_then(|items| items.iter().find(|e| e["kind"] == kind))
            .map(|e| e["actor"].clone())
    };
    for kind in ["abort_requested", "rollout_aborted"] {
        assert_eq!(
            actor_of(kind),
            Some(json!("oncall")),
            "{kind} is recorded with the on-call token's name: {trail}"
        );
    }

    // Rollback: not a viewer; on-call may (to a tag never deployed: whether the aborted canary
    // got as far as its down or not, the handler finds nothing to go back to).
    let rollback =
        json!({"host": HOST, "service": R2, "reason": "TTFT regression", "to_tag": "v0.0.1"});
    let (status, answer) = call(
        &app,
        Method::POST,
        "/v1/rollbacks",
        Some(&vw),
        Some(&rollback),
    )
    .await;
    assert_eq!(status, 403, "{answer}");
    assert_eq!(answer["error"]["code"], "forbidden", "{answer}");
    let (status, answer) = call(
        &app,
        Method::POST,
        "/v1/rollbacks",
        Some(&oc),
        Some(&rollback),
    )
    .await;
    // Past auth and into the handler: it finds nothing to go back to.
    assert_eq!(status, 404, "on-call may roll back: {answer}");
    assert_eq!(answer["error"]["code"], "no_prior_deployment", "{answer}");
    app.stop().await;
}

#[tokio::test]
async fn probes_metrics_and_the_api_document_stay_open_without_a_token() {
    let app = TestApp::spawn_with_tokens(OPERATOR, ONCALL, VIEWER).await;
    for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        let res = reqwest::get(format!("{}{path}", app.url))
            .await
            .expect("answers");
        assert_eq!(res.status(), 200, "{path}");
    }
    app.stop().await;
}

#[tokio::test]
async fn the_bearer_scheme_is_matched_without_regard_to_case() {
    let app = TestApp::spawn_with_tokens(OPERATOR, ONCALL, VIEWER).await;
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let auth = format!("{scheme} {VIEWER}");
        let (status, answer) = call(&app, Method::GET, "/v1/rollouts", Some(&auth), None).await;
        assert_eq!(status, 200, "{scheme}: {answer}");
    }
    let (status, _) = call(
        &app,
        Method::GET,
        "/v1/rollouts",
        Some(&format!("Bearerx {VIEWER}")),
        None,
    )
    .await;
    assert_eq!(status, 401, "another scheme is still refused");
    app.stop().await;
}
