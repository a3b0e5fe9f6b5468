//! `GET /v1/releases/{id}/events`: the release's own events and its targets' ends as one SSE
//! stream, replayed then live, ending once nothing more can happen; `Last-Event-ID` resumes it.

use std::time::Duration;

use serde_json::{json, Value};

use super::Fleet;
use crate::helpers::{FILE, R2};

/// One SSE event: its id, name and JSON data.
#[derive(Debug, Clone)]
struct Sse {
    id: String,
    event: String,
    data: Value,
}

fn parse(block: &str) -> Option<Sse> {
    let (mut id, mut event, mut data) = (String::new(), String::new(), String::new());
    for line in block.lines() {
        if let Some(v) = line.strip_prefix("id:") {
            id = v.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("event:") {
            event = v.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push_str(v.trim());
        }
    }
    (!data.is_empty()).then(|| Sse {
        id,
        event,
        data: serde_json::from_str(&data).expect("JSON data"),
    })
}

/// An open stream, read event by event.
struct Stream {
    res: reqwest::Response,
    buffer: String,
}

impl Stream {
    async fn open(fleet: &Fleet, id: &str, last_event_id: Option<&str>) -> Stream {
        let mut req = reqwest::Client::new().get(format!("{}/v1/releases/{id}/events", fleet.url));
        if let Some(last) = last_event_id {
            req = req.header("last-event-id", last);
        }
        let res = req.send().await.expect("the stream opens");
        assert_eq!(res.status(), 200);
        Stream {
            res,
            buffer: String::new(),
        }
    }

    /// The next event, or `None` when the stream ended (bounded: 30 s without an event fails).
    async fn next(&mut self) -> Option<Sse> {
        loop {
            let text = self.buffer.replace("\r\n", "\n");
            if let Some(cut) = text.find("\n\n") {
                self.buffer = text[cut + 2..].to_owned();
                match parse(&text[..cut]) {
                    Some(e) => return Some(e),
                    None => continue,
                }
            }
            let chunk = tokio::time::timeout(Duration::from_secs(30), self.res.chunk())
                .await
                .expect("an event within 30 s")
                .expect("the stream reads");
            self.buffer.push_str(&String::from_utf8_lossy(&chunk?));
        }
    }

    /// Every event until the stream ends (bounded: 200 events).
    async fn all(mut self) -> Vec<Sse> {
        let mut out = Vec::new();
        for _ in 0..200 {
            match self.next().await {
                Some(e) => out.push(e),
                None => return out,
            }
        }
        panic!("the stream never ended: {out:#?}");
    }
}

fn two_hosts() -> Value {
    json!({"file": FILE, "tag": "v0.0.452", "reason": "promote v0.0.452",
           "targets": [{"host": "gpu01", "service": R2}, {"host": "gpu02", "service": R2}]})
}

fn kinds(events: &[Sse]) -> Vec<String> {
    events
        .iter()
        .map(|e| match &e.data["target"] {
            Value::Null => e.event.clone(),
            t => format!(
                "{} {} {}",
                e.event,
                t["host"].as_str().unwrap_or("?"),
                t["status"].as_str().unwrap_or("?")
            ),
        })
        .collect()
}

#[tokio::test]
async fn the_release_stream_tells_each_target_start_and_end_in_order_then_ends() {
    let fleet = Fleet::spawn(2).await;
    let id = fleet.start(&two_hosts()).await;
    let events = Stream::open(&fleet, &id, None).await.all().await;
    let seen = kinds(&events);
    let started = |e: &Sse| (e.event == "target_started").then(|| e.data["detail"]["host"].clone());
    assert_eq!(
        seen,
        [
            "release_created",
            "release_running",
            "target_started",
            "target_ended gpu01 succeeded",
            "target_started",
            "target_ended gpu02 succeeded",
            "release_succeeded",
        ],
        "{events:#?}"
    );
    let hosts: Vec<Value> = events.iter().filter_map(started).collect();
    assert_eq!(hosts, [json!("gpu01"), json!("gpu02")]);
    let r = fleet.release(&id).await;
    assert_eq!(
        events[3].data["target"]["rollout_id"],
        json!(r.targets[0].rollout_id),
        "a target's end names its rollout"
    );
    assert!(events.iter().all(|e| e.data["release_id"] == json!(id)));

    // Reconnecting after the fourth event replays exactly the rest, then ends.
    let rest = Stream::open(&fleet, &id, Some(&events[3].id))
        .await
        .all()
        .await;
    assert_eq!(kinds(&rest), seen[4..], "{rest:#?}");

    let res = reqwest::Client::new()
        .get(format!("{}/v1/releases/{id}/events", fleet.url))
        .header("last-event-id", "7")
        .send()
        .await
        .expect("answers");
    assert_eq!(
        res.status(),
        400,
        "a rollout stream's id is not a release stream's"
    );
}

#[tokio::test]
async fn a_pause_and_an_abort_reach_an_open_release_stream_with_actor_and_reason() {
    let fleet = Fleet::spawn(2).await;
    let id = fleet.start(&two_hosts()).await;
    let mut stream = Stream::open(&fleet, &id, None).await;
    let mut seen = Vec::new();
    for _ in 0..10 {
        let e = stream.next().await.expect("the stream goes on");
        let started = e.event == "target_started";
        seen.push(e);
        if started {
            break;
        }
    }
    assert_eq!(
        kinds(&seen),
        ["release_created", "release_running", "target_started"]
    );
    let (status, _) = fleet
        .post(
            &format!("/v1/releases/{id}/pause"),
            &json!({"reason": "watching queue depth"}),
        )
        .await;
    assert_eq!(status, 200);
    // The canary goes on while paused: its end and the pause arrive, in either order.
    let mut next = Vec::new();
    for _ in 0..2 {
        next.push(stream.next().await.expect("the stream goes on"));
    }
    let mut got = kinds(&next);
    got.sort();
    assert_eq!(
        got,
        ["release_paused", "target_ended gpu01 succeeded"],
        "{next:#?}"
    );
    let paused = next
        .iter()
        .find(|e| e.event == "release_paused")
        .expect("paused");
    assert_eq!(paused.data["reason"], "watching queue depth");
    assert_eq!(paused.data["actor"], "local", "{paused:?}");
    assert_eq!(paused.data["to_state"], "paused");

    let (status, _) = fleet
        .post(
            &format!("/v1/releases/{id}/abort"),
            &json!({"reason": "wrong tag"}),
        )
        .await;
    assert_eq!(status, 200);
    let rest = stream.all().await;
    assert_eq!(
        kinds(&rest),
        ["release_aborted"],
        "nothing started while paused; the stream ends with the release: {rest:#?}"
    );
    assert_eq!(rest[0].data["reason"], "wrong tag");
    assert_eq!(rest[0].data["actor"], "local");
}
