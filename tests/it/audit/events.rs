//! The event stream (replay, live, Last-Event-ID) and who-did-what in the audit trail.

use std::time::Duration;

use serde_json::{json, Value};

use super::{get, ids};
use crate::helpers::{TestApp, HOST, R2};

/// Reads an SSE body until it ends (bounded: `max_chunks` chunks within `deadline`).
pub async fn read_sse(res: &mut reqwest::Response, deadline: Duration) -> (Vec<Value>, bool) {
    let mut events = Vec::new();
    let mut buf = String::new();
    let until = tokio::time::Instant::now() + deadline;
    for _chunk in 0..10_000 {
        let next = tokio::time::timeout_at(until, res.chunk()).await;
        let Ok(Ok(Some(bytes))) = next else {
            let ended = matches!(next, Ok(Ok(None)));
            return (events, ended);
        };
        buf.push_str(&String::from_utf8_lossy(&bytes));
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let mut id = None;
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = v.parse::<i64>().ok();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            if let Some(id) = id {
                let e: Value = serde_json::from_str(&data).expect("event data is JSON");
                assert_eq!(e["seq"], json!(id), "the SSE id is the event's seq");
                events.push(e);
            }
        }
    }
    (events, false)
}

async fn open_events(app: &TestApp, id: &str, last: Option<i64>) -> reqwest::Response {
    let mut req = reqwest::Client::new().get(format!("{}/v1/rollouts/{id}/events", app.url));
    if let Some(last) = last {
        req = req.header("last-event-id", last.to_string());
    }
    let res = req.send().await.expect("stream opens");
    assert_eq!(res.status().as_u16(), 200);
    let ct = res.headers()["content-type"]
        .to_str()
        .unwrap_or("")
        .to_owned();
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    res
}

#[tokio::test]
async fn the_event_stream_replays_the_past_then_follows_live_until_the_rollout_ends() {
    let app = TestApp::spawn().await;
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    app.wait_step(&id, "health", "running").await;

    let mut res = open_events(&app, &id, None).await;
    let (events, ended) = read_sse(&mut res, Duration::from_secs(20)).await;
    drop(res);
    assert!(ended, "the stream ends with the rollout");
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["kind"].as_str()).collect();
    assert_eq!(
        kinds.first(),
        Some(&"rollout_created"),
        "replay starts at the beginning"
    );
    assert_eq!(kinds.last(), Some(&"rollout_succeeded"), "{kinds:?}");
    let seqs: Vec<i64> = events.iter().filter_map(|e| e["seq"].as_i64()).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "in order, no duplicates: {seqs:?}"
    );
    assert!(events.iter().all(|e| e["rollout_id"] == json!(id)));
    let step_event = |step: &str, kind: &str| {
        events
            .iter()
            .any(|e| e["step"] == json!(step) && e["kind"] == json!(kind))
    };
    assert!(step_event("down", "step_succeeded"), "replayed: {kinds:?}");
    assert!(step_event("soak", "step_succeeded"), "live: {kinds:?}");

    // Reconnecting with Last-Event-ID replays only what came after it, then ends.
    let middle = seqs[seqs.len() / 2];
    let mut res = open_events(&app, &id, Some(middle)).await;
    let (again, ended) = read_sse(&mut res, Duration::from_secs(10)).await;
    drop(res);
    assert!(ended);
    let again: Vec<i64> = again.iter().filter_map(|e| e["seq"].as_i64()).collect();
    assert_eq!(
        again,
        seqs.iter()
            .copied()
            .filter(|s| *s > middle)
            .collect::<Vec<_>>()
    );

    let res = reqwest::get(format!("{}/v1/rollouts/ro_nope/events", app.url))
        .await
        .expect("answers");
    assert_eq!(res.status().as_u16(), 404);
    app.stop().await;
}

async fn audit_of(app: &TestApp, id: &str) -> Vec<Value> {
    let (status, body) = get(app, &format!("/v1/rollouts/{id}/audit")).await;
    assert_eq!(status, 200, "{body}");
    body["items"].as_array().expect("items").clone()
}

fn find<'a>(events: &'a [Value], kind: &str) -> &'a Value {
    events
        .iter()
        .find(|e| e["kind"] == json!(kind))
        .unwrap_or_else(|| panic!("no {kind} event in {events:#?}"))
}

#[tokio::test]
async fn aborts_and_rollbacks_record_who_asked_and_why_with_the_change_they_caused() {
    let app = TestApp::spawn().await;
    // An abort: the request and the resulting state change both name the caller and reason.
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    app.wait_step(&id, "health", "running").await;
    let (status, body) = app
        .post(
            &format!("/v1/rollouts/{id}/abort"),
            &json!({"reason": "wrong tag, sorry"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(app.wait_terminal(&id).await.status, "aborted");
    let events = audit_of(&app, &id).await;
    let created = find(&events, "rollout_created");
    assert_eq!(created["actor"], "local");
    assert_eq!(created["detail"]["reason"], "test canary");
    let requested = find(&events, "abort_requested");
    assert_eq!(requested["actor"], "local");
    assert_eq!(requested["detail"]["reason"], "wrong tag, sorry");
    let aborted = find(&events, "rollout_aborted");
    assert_eq!(
        aborted["actor"], "local",
        "the abort is attributed to who asked"
    );
    assert_eq!(aborted["detail"]["reason"], "wrong tag, sorry");
    assert_eq!(aborted["to_state"], "aborted");

    // A one-click rollback: its creation carries actor and reason; the rolled-back rollout
    // records the link with the same actor and reason.
    for tag in ["v0.0.451", "v0.0.452"] {
        let c = app.start_canary(&TestApp::plan(tag)).await;
        let r = app.wait_terminal(&c).await;
        assert_eq!(r.status, "succeeded", "{r:#?}");
    }
    let (_, page) = get(&app, "/v1/rollouts?limit=1").await;
    let undone = ids(&page).remove(0);
    let (status, body) = app
        .post(
            "/v1/rollbacks",
            &json!({"host": HOST, "service": R2, "reason": "TTFT regression"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let rb = body["id"].as_str().expect("id").to_owned();
    let events = audit_of(&app, &rb).await;
    let created = find(&events, "rollout_created");
    assert_eq!(created["actor"], "local");
    assert_eq!(created["detail"]["reason"], "TTFT regression");
    assert_eq!(created["detail"]["rollback_of"], json!(undone));
    let linked = find(&audit_of(&app, &undone).await, "rollback_linked").clone();
    assert_eq!(linked["actor"], "local");
    assert_eq!(linked["detail"]["rolled_back_by"], json!(rb));
    assert_eq!(linked["detail"]["reason"], "TTFT regression");
    app.wait_terminal(&rb).await;

    // A preempting rollback aborts the running canary in the caller's name.
    let c = app.start_canary(&TestApp::plan("v0.0.452")).await;
    app.wait_step(&c, "health", "running").await;
    let (status, body) = app
        .post(
            "/v1/rollbacks",
            &json!({"host": HOST, "service": R2, "reason": "pager fired", "preempt": true}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let events = audit_of(&app, &c).await;
    let requested = find(&events, "abort_requested");
    assert_eq!(requested["actor"], "local");
    let why = requested["detail"]["reason"].as_str().unwrap_or("");
    assert!(why.contains("pager fired"), "{why}");
    assert_eq!(find(&events, "rollout_aborted")["actor"], "local");
    let rb = body["id"].as_str().expect("id").to_owned();
    app.wait_terminal(&rb).await;
    app.stop().await;
}
