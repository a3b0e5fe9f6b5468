//! `GET /v1/rollouts`: each filter, bad parameters, paging under concurrent inserts, the CSV
//! export, the indexes behind the filters; and a replica's deployments.

use std::collections::BTreeSet;

use canaryd::domain::state::{RolloutEvent, RolloutKind};
use canaryd::store::{BulkSpec, RolloutFilter};
use chrono::Utc;
use serde_json::{json, Value};

use super::{at, get, ids, insert, open_store, Row};
use crate::helpers::{TestApp, HOST, R2};

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
    let mut last_page = false;
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
            None => {
                last_page = true;
                break;
            }
        }
    }
    assert!(last_page, "paging ended within 100 pages");
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
        assert!(
            plan.iter()
                .any(|line| line.contains("rollout") && line.contains("USING")),
            "{name}: the rollout table is read through an index: {plan:?}"
        );
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

/// The guide's recipe "where does tag X run now" answers only what runs now: a canary of the
/// tag that was then rolled back is not listed (it was, when the recipe read succeeded
/// rollouts), and the replica is listed again once the tag is deployed again.
#[tokio::test]
async fn where_a_tag_runs_lists_what_runs_now_not_canaries_rolled_back() {
    let guide = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/operator-guide.md"
    ))
    .expect("guide");
    let recipe = guide
        .lines()
        .skip_while(|l| !l.starts_with("# Where does tag v0.0.452 run now"))
        .find(|l| l.starts_with("curl"))
        .expect("the recipe");
    assert!(
        recipe.contains("/v1/replicas")
            && recipe
                .contains("select(.current_deployment.tag == \"v0.0.452\" and (.left_down | not))"),
        "the test below applies the guide's filter: {recipe}"
    );
    // The recipe's filter, in Rust.
    async fn runs(app: &TestApp, tag: &str) -> Vec<String> {
        let replicas: Vec<Value> = reqwest::get(format!("{}/v1/replicas", app.url))
            .await
            .expect("answers")
            .json()
            .await
            .expect("json");
        replicas
            .iter()
            .filter(|r| r["current_deployment"]["tag"] == tag && r["left_down"] != true)
            .filter_map(|r| r["service"].as_str().map(str::to_owned))
            .collect()
    }
    let app = TestApp::spawn().await;
    let canary = app.start_canary(&TestApp::plan("v0.0.452")).await;
    assert_eq!(app.wait_terminal(&canary).await.status, "succeeded");
    assert_eq!(runs(&app, "v0.0.452").await, [crate::helpers::R2]);
    let (status, out) = app
        .post(
            "/v1/rollbacks",
            &json!({"host": "gpu02", "service": crate::helpers::R2, "reason": "TTFT regression"}),
        )
        .await;
    assert_eq!(status, 201, "{out}");
    let rollback = app.wait_terminal(out["id"].as_str().expect("id")).await;
    assert_eq!(rollback.status, "succeeded", "{rollback:#?}");
    assert!(
        runs(&app, "v0.0.452").await.is_empty(),
        "a rolled-back canary is not where the tag runs"
    );
    app.stop().await;
}
