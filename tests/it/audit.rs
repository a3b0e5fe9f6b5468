//! Audit and live view (SPEC §7): history filters, keyset pagination, CSV export, the event
//! stream, who-did-what in the audit trail, retention, and the indexes behind the filters.

mod history_cli;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use canaryd::domain::state::{OnFailure, RolloutEvent, RolloutKind};
use canaryd::store::{
    new_id, BulkSpec, NewDeployment, NewRollout, NewStep, RolloutChange, RolloutFilter, Store,
};
use chrono::{DateTime, TimeZone, Utc};
use serde_json::{json, Value};

use crate::helpers::{TestApp, HOST, R2};

/// 2025-01-01T00:00:00Z plus `minutes`.
pub fn at(minutes: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0)
        .single()
        .expect("valid time")
        + chrono::Duration::minutes(minutes)
}

/// A rollout as the tests insert it straight into the store.
#[derive(Clone)]
pub struct Row {
    pub host: &'static str,
    pub service: &'static str,
    pub kind: RolloutKind,
    pub tag: &'static str,
    pub actor: &'static str,
    pub reason: &'static str,
    pub created_at: DateTime<Utc>,
    /// Start then this (Succeed, Fail or Abort) a minute after creation; `Start`: left running.
    pub outcome: RolloutEvent,
}

impl Row {
    pub fn new(created_at: DateTime<Utc>) -> Row {
        Row {
            host: "gpu07",
            service: "svc-a",
            kind: RolloutKind::Canary,
            tag: "v1",
            actor: "ops-alice",
            reason: "routine",
            created_at,
            outcome: RolloutEvent::Succeed,
        }
    }
}

pub async fn open_store(app: &TestApp) -> Store {
    Store::open(&app.db)
        .await
        .expect("second handle on the daemon's database")
}

/// Inserts a finished rollout (created, started, then `outcome`) with two steps; returns its id.
pub async fn insert(store: &Store, row: &Row) -> String {
    let id = new_id("ro");
    let new = NewRollout {
        id: id.clone(),
        kind: row.kind,
        host: row.host.to_owned(),
        file: "prod/x.yaml".to_owned(),
        service: row.service.to_owned(),
        tag: row.tag.to_owned(),
        runbook: "single-replica-canary".to_owned(),
        actor: row.actor.to_owned(),
        reason: row.reason.to_owned(),
        env_overrides: BTreeMap::new(),
        env_sha256: "0".repeat(64),
        require_logs: Vec::new(),
        on_failure: OnFailure::Rollback,
        rollback_of: None,
        expect_commit: None,
        expect_file_sha256: None,
        created_at: row.created_at,
    };
    let steps = [
        NewStep {
            name: "snapshot".into(),
            kind: "snapshot".into(),
        },
        NewStep {
            name: "up".into(),
            kind: "up".into(),
        },
    ];
    store
        .create_rollout(&new, &steps)
        .await
        .expect("rollout inserted");
    let mut events = vec![(RolloutEvent::Start, 1)];
    if !matches!(row.outcome, RolloutEvent::Start) {
        events.push((row.outcome, 60));
    }
    for (event, secs) in events {
        let change = RolloutChange {
            event,
            actor: "canaryd".into(),
            error: None,
            detail: json!({}),
            at: row.created_at + chrono::Duration::seconds(secs),
        };
        store
            .transition_rollout(&id, &change)
            .await
            .expect("transition");
    }
    id
}

/// `GET path` as (status, JSON body).
pub async fn get(app: &TestApp, path: &str) -> (u16, Value) {
    let res = reqwest::Client::new()
        .get(format!("{}{path}", app.url))
        .send()
        .await
        .expect("request reaches the daemon");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

fn ids(body: &Value) -> Vec<String> {
    body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|r| r["id"].as_str().expect("id").to_owned())
        .collect()
}

#[tokio::test]
async fn each_filter_returns_exactly_the_matching_rollouts_newest_first() {
    let app = TestApp::spawn().await;
    let store = open_store(&app).await;
    use RolloutEvent::{Abort, Fail, Succeed};
    use RolloutKind::{Canary, Rollback};
    let spec: [(&str, &str, RolloutKind, &str, &str, RolloutEvent); 8] = [
        ("gpu07", "svc-a", Canary, "v1", "ops-alice", Succeed),
        ("gpu07", "svc-b", Canary, "v2", "ops-bob", Fail),
        ("gpu08", "svc-a", Rollback, "v1", "oncall", Succeed),
        ("gpu08", "svc-c", Canary, "v3", "ops-alice", Abort),
        ("gpu07", "svc-a", Rollback, "v2", "canaryd", Succeed),
        ("gpu09", "svc-b", Canary, "v3", "ops-bob", Succeed),
        ("gpu07", "svc-c", Canary, "v1", "ops-alice", Fail),
        ("gpu09", "svc-a", Canary, "v2", "oncall", Succeed),
    ];
    let mut rows = Vec::new();
    for (i, (host, service, kind, tag, actor, outcome)) in spec.into_iter().enumerate() {
        let row = Row {
            host,
            service,
            kind,
            tag,
            actor,
            outcome,
            reason: "filter test",
            created_at: at(10 * i as i64),
        };
        let id = insert(&store, &row).await;
        rows.push((id, row));
    }
    let status_of = |e: RolloutEvent| match e {
        Succeed => "succeeded",
        Fail => "failed",
        _ => "aborted",
    };
    type Pred = Box<dyn Fn(&Row) -> bool>;
    let cases: Vec<(&str, Pred)> = vec![
        ("host=gpu07", Box::new(|r| r.host == "gpu07")),
        ("service=svc-a", Box::new(|r| r.service == "svc-a")),
        (
            "status=failed",
            Box::new(move |r| status_of(r.outcome) == "failed"),
        ),
        (
            "status=aborted",
            Box::new(move |r| status_of(r.outcome) == "aborted"),
        ),
        ("kind=rollback", Box::new(|r| r.kind == Rollback)),
        ("tag=v3", Box::new(|r| r.tag == "v3")),
        ("actor=ops-alice", Box::new(|r| r.actor == "ops-alice")),
        (
            "since=2025-01-01T00:30:00Z",
            Box::new(|r| r.created_at >= at(30)),
        ),
        (
            "until=2025-01-01T00:30:00Z",
            Box::new(|r| r.created_at < at(30)),
        ),
        (
            "host=gpu07&service=svc-a&kind=canary",
            Box::new(|r| r.host == "gpu07" && r.service == "svc-a" && r.kind == Canary),
        ),
        (
            "since=2025-01-01T00:10:00Z&until=2025-01-01T00:50:00Z&actor=oncall",
            Box::new(|r| r.created_at >= at(10) && r.created_at < at(50) && r.actor == "oncall"),
        ),
        ("tag=nope", Box::new(|_| false)),
    ];
    for (query, pred) in cases {
        let (status, body) = get(&app, &format!("/v1/rollouts?{query}&limit=100")).await;
        assert_eq!(status, 200, "{query}: {body}");
        let mut want: Vec<&(String, Row)> = rows.iter().filter(|(_, r)| pred(r)).collect();
        want.sort_by_key(|(_, r)| std::cmp::Reverse(r.created_at));
        let want: Vec<String> = want.into_iter().map(|(id, _)| id.clone()).collect();
        assert_eq!(ids(&body), want, "{query}");
        assert_eq!(body["next_cursor"], Value::Null, "{query}: one page");
    }
    // Items come with their steps (fetched for the whole page at once).
    let (_, body) = get(&app, "/v1/rollouts?host=gpu09").await;
    for item in body["items"].as_array().expect("items") {
        assert_eq!(item["steps"].as_array().map(Vec::len), Some(2), "{item}");
        assert_eq!(item["actor"].as_str().map(str::is_empty), Some(false));
    }
    app.stop().await;
}

#[tokio::test]
async fn bad_query_parameters_are_refused_with_a_400_naming_the_parameter() {
    let app = TestApp::spawn().await;
    let cases = [
        ("status=done", "status"),
        ("kind=blue", "kind"),
        ("since=yesterday", "since"),
        ("until=2025-13-01", "until"),
        ("limit=0", "limit"),
        ("limit=501", "limit"),
        ("limit=ten", "limit"),
        ("cursor=abc", "cursor"),
        ("format=xml", "format"),
        ("host=", "host"),
        ("colour=red", "colour"),
    ];
    for (query, param) in cases {
        let (status, body) = get(&app, &format!("/v1/rollouts?{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["error"]["code"], "invalid_query", "{query}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or("");
        assert!(
            message.contains(param),
            "{query}: {message:?} names {param}"
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn paging_while_rollouts_arrive_returns_every_existing_rollout_exactly_once() {
    let app = TestApp::spawn().await;
    let store = open_store(&app).await;
    // Three rollouts share each millisecond, so ties are broken by id.
    let mut existing = BTreeSet::new();
    for i in 0..60 {
        let mut row = Row::new(at(i / 3));
        row.host = "gpu-a";
        existing.insert(insert(&store, &row).await);
    }
    // Meanwhile new rollouts arrive, some newer, some within the range being paged.
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut added = Vec::new();
            for i in 0..30 {
                let mut row = Row::new(if i % 2 == 0 { Utc::now() } else { at(i / 2) });
                row.host = "gpu-b";
                added.push(insert(&store, &row).await);
                tokio::task::yield_now().await;
            }
            added
        })
    };
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _page in 0..100 {
        let mut path = "/v1/rollouts?limit=7".to_owned();
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={}", urlencode(c)));
        }
        let (status, body) = get(&app, &path).await;
        assert_eq!(status, 200, "{body}");
        seen.extend(ids(&body));
        match body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    let added = writer.await.expect("writer finished");
    let unique: BTreeSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no rollout is listed twice");
    for id in &existing {
        assert!(seen.contains(id), "{id} was listed");
    }
    assert!(seen
        .iter()
        .all(|id| existing.contains(id) || added.contains(id)));
    app.stop().await;
}

pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A strict RFC 4180 reader: records of fields, quoted fields may hold commas, CRLF, quotes.
pub fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut records = Vec::new();
    let mut record = Vec::new();
    let mut field = String::new();
    let mut chars = text.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') if field.is_empty() => quoted = true,
            (false, ',') => record.push(std::mem::take(&mut field)),
            (false, '\r') if chars.peek() == Some(&'\n') => {}
            (false, '\n') => {
                record.push(std::mem::take(&mut field));
                records.push(std::mem::take(&mut record));
            }
            (false, c) => field.push(c),
        }
    }
    assert!(!quoted, "unterminated quoted field");
    assert!(
        field.is_empty() && record.is_empty(),
        "last record ends with CRLF"
    );
    records
}

#[tokio::test]
async fn csv_export_quotes_a_reason_with_a_comma_a_quote_and_a_newline() {
    let app = TestApp::spawn().await;
    let store = open_store(&app).await;
    let reason = "TTFT p99 up 40%, see \"INC-7\"\nsecond line";
    let mut row = Row::new(at(5));
    row.reason = reason;
    let tricky = insert(&store, &row).await;
    insert(&store, &Row::new(at(1))).await;

    let res = reqwest::get(format!("{}/v1/rollouts?format=csv&host=gpu07", app.url))
        .await
        .expect("export answers");
    assert_eq!(res.status().as_u16(), 200);
    let ct = res.headers()["content-type"]
        .to_str()
        .unwrap_or("")
        .to_owned();
    assert!(ct.starts_with("text/csv"), "{ct}");
    let text = res.text().await.expect("body");
    assert!(
        text.contains("\"TTFT p99 up 40%, see \"\"INC-7\"\"\nsecond line\""),
        "quoted and doubled: {text}"
    );
    let records = parse_csv(&text);
    assert_eq!(records[0][0], "id");
    let header = &records[0];
    let col = |name: &str| header.iter().position(|h| h == name).expect("column");
    assert_eq!(records.len(), 3, "header and two rows: {records:?}");
    assert_eq!(records[1][col("id")], tricky, "newest first");
    assert_eq!(records[1][col("reason")], reason);
    assert_eq!(records[1][col("status")], "succeeded");
    assert!(records.iter().all(|r| r.len() == header.len()));
    app.stop().await;
}

#[tokio::test]
async fn csv_export_holds_every_matching_row_beyond_one_page() {
    let app = TestApp::spawn().await;
    let store = open_store(&app).await;
    let spec = BulkSpec {
        rollouts: 4500,
        steps_per_rollout: 1,
        hosts: 3,
        services_per_host: 2,
        start_unix: 1_600_000_000,
        spacing_secs: 60,
    };
    store.bulk_fill(spec).await.expect("bulk fill");
    let text = reqwest::get(format!("{}/v1/rollouts?format=csv", app.url))
        .await
        .expect("export answers")
        .text()
        .await
        .expect("body");
    let records = parse_csv(&text);
    assert_eq!(records.len(), 4500 + 1, "every row and the header");
    let ids: BTreeSet<&String> = records[1..].iter().map(|r| &r[0]).collect();
    assert_eq!(ids.len(), 4500, "no row twice");
    let text = reqwest::get(format!(
        "{}/v1/rollouts?format=csv&host=host01&status=running",
        app.url
    ))
    .await
    .expect("export answers")
    .text()
    .await
    .expect("body");
    assert_eq!(parse_csv(&text).len(), 2, "filters apply to the export");
    app.stop().await;
}

#[tokio::test]
async fn every_filter_is_served_by_an_index() {
    let app = TestApp::spawn().await;
    let store = open_store(&app).await;
    let base = RolloutFilter {
        limit: 50,
        ..Default::default()
    };
    let cursor = Some(("2025-01-01T00:00:00.000Z".to_owned(), "ro_x".to_owned()));
    let s = |v: &str| Some(v.to_owned());
    let filters = [
        ("none", base.clone()),
        (
            "host",
            RolloutFilter {
                host: s("gpu02"),
                ..base.clone()
            },
        ),
        (
            "service",
            RolloutFilter {
                service: s(R2),
                ..base.clone()
            },
        ),
        (
            "host+service",
            RolloutFilter {
                host: s(HOST),
                service: s(R2),
                ..base.clone()
            },
        ),
        (
            "status",
            RolloutFilter {
                status: Some("failed".parse().expect("status")),
                ..base.clone()
            },
        ),
        (
            "kind",
            RolloutFilter {
                kind: Some(RolloutKind::Rollback),
                ..base.clone()
            },
        ),
        (
            "tag",
            RolloutFilter {
                tag: s("v0.0.452"),
                ..base.clone()
            },
        ),
        (
            "actor",
            RolloutFilter {
                actor: s("ops-alice"),
                ..base.clone()
            },
        ),
        (
            "since",
            RolloutFilter {
                since: Some(at(0)),
                ..base.clone()
            },
        ),
        (
            "until",
            RolloutFilter {
                until: Some(at(0)),
                ..base.clone()
            },
        ),
        (
            "since+until",
            RolloutFilter {
                since: Some(at(0)),
                until: Some(at(60)),
                ..base.clone()
            },
        ),
        (
            "cursor",
            RolloutFilter {
                before: cursor.clone(),
                ..base.clone()
            },
        ),
        (
            "host+cursor",
            RolloutFilter {
                host: s("gpu02"),
                before: cursor.clone(),
                ..base.clone()
            },
        ),
        (
            "actor+since",
            RolloutFilter {
                actor: s("oncall"),
                since: Some(at(0)),
                ..base.clone()
            },
        ),
    ];
    for (name, f) in filters {
        let plan = store.explain_list_rollouts(&f).await.expect("explain");
        assert!(!plan.is_empty(), "{name}");
        for line in &plan {
            let scans_table = line.contains("rollout") && !line.contains("USING");
            assert!(!scans_table, "{name}: full scan in {plan:?}");
            assert!(!line.contains("TEMP B-TREE"), "{name}: sorts in {plan:?}");
        }
    }
    app.stop().await;
}

#[tokio::test]
async fn deployments_of_a_replica_are_listed_newest_first() {
    let app = TestApp::spawn().await;
    for tag in ["v0.0.451", "v0.0.452"] {
        let id = app.start_canary(&TestApp::plan(tag)).await;
        assert_eq!(app.wait_terminal(&id).await.status, "succeeded");
    }
    let (status, body) = get(&app, &format!("/v1/replicas/{HOST}/{R2}/deployments")).await;
    assert_eq!(status, 200, "{body}");
    let list = body.as_array().expect("a list");
    let tags: Vec<&str> = list.iter().filter_map(|d| d["tag"].as_str()).collect();
    assert_eq!(&tags[..2], ["v0.0.452", "v0.0.451"], "{body}");
    assert_eq!(list[0]["source"], "rollout");
    assert_eq!(
        list.last().map(|d| d["source"].clone()),
        Some(json!("baseline"))
    );
    let (status, body) = get(
        &app,
        &format!("/v1/replicas/{HOST}/no-such-replica/deployments"),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_replica");
    app.stop().await;
}

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

#[tokio::test]
async fn retention_deletes_old_finished_rollouts_and_keeps_deployments_and_active_ones() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(&dir.path().join("r.db")).await.expect("store");
    let day = |d: i64| at(0) + chrono::Duration::days(d);

    // Old, succeeded, with a deployment and an attempt.
    let mut old_ok = Row::new(day(0));
    old_ok.host = "h1";
    let old_ok = insert(
        &store,
        &Row {
            outcome: RolloutEvent::Start,
            ..old_ok
        },
    )
    .await;
    let steps = store.steps(&old_ok).await.expect("steps");
    store
        .begin_attempt(&steps[1], "/compose/up", day(0))
        .await
        .expect("attempt");
    let deployment = NewDeployment {
        host: "h1".into(),
        service: "svc-a".into(),
        file: "prod/x.yaml".into(),
        tag: "v1".into(),
        env_overrides: BTreeMap::new(),
        env_sha256: None,
        commit: None,
        file_sha256: None,
        image: None,
        source: "rollout",
        rollout_id: Some(old_ok.clone()),
        deployed_at: day(0),
    };
    let change = RolloutChange {
        event: RolloutEvent::Succeed,
        actor: "canaryd".into(),
        error: None,
        detail: json!({}),
        at: day(0),
    };
    store
        .succeed_rollout(&old_ok, &change, &deployment)
        .await
        .expect("succeeded");
    // Old and failed; recent; and an old one still running.
    let old_failed = insert(
        &store,
        &Row {
            host: "h2",
            outcome: RolloutEvent::Fail,
            ..Row::new(day(1))
        },
    )
    .await;
    let recent = insert(
        &store,
        &Row {
            host: "h3",
            ..Row::new(day(95))
        },
    )
    .await;
    let running = insert(
        &store,
        &Row {
            host: "h4",
            outcome: RolloutEvent::Start,
            ..Row::new(day(2))
        },
    )
    .await;

    let purged = store.purge_finished(day(100), 90).await.expect("purge");
    assert_eq!(purged.rollouts, 2, "{purged:?}");
    assert_eq!(purged.attempts, 1);
    assert_eq!(purged.steps, 4);
    for gone in [&old_ok, &old_failed] {
        assert!(
            store.get_rollout(gone).await.expect("read").is_none(),
            "{gone} deleted"
        );
        assert!(store.steps(gone).await.expect("read").is_empty());
        assert!(store.attempts(gone).await.expect("read").is_empty());
        assert!(store.audit_events(gone, 0).await.expect("read").is_empty());
    }
    for kept in [&recent, &running] {
        assert!(
            store.get_rollout(kept).await.expect("read").is_some(),
            "{kept} kept"
        );
        assert!(!store.audit_events(kept, 0).await.expect("read").is_empty());
    }
    let deployments = store.deployments("h1", "svc-a").await.expect("read");
    assert_eq!(
        deployments.len(),
        1,
        "the deployment stays: it is rollback history"
    );
    assert_eq!(deployments[0].tag, "v1");
    assert_eq!(
        deployments[0].rollout_id, None,
        "only the link to the purged rollout goes"
    );
    let all = store.audit_events_after(0).await.expect("read");
    let note = all
        .iter()
        .find(|e| e.kind == "retention_purged")
        .expect("purge audited");
    assert_eq!(note.detail["rollouts"], 2);

    let again = store.purge_finished(day(100), 90).await.expect("purge");
    assert_eq!(again.rollouts, 0, "nothing left to delete");
    // Without a retention setting nothing runs at all.
    assert!(canaryd::store::spawn_retention(store.clone(), None).is_none());
}
