//! `canaryd history`, `show` and `rollout watch` as an operator runs them (the built binary).

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use canaryd::store::BulkSpec;
use serde_json::{json, Value};

use super::listing::parse_csv;
use super::{insert, open_store, Row};
use crate::helpers::TestApp;

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs the binary against `server`, killing it after 30 s (300 × 100 ms) if still running.
/// Output goes to files, so a large answer cannot block the child on a full pipe.
async fn canaryd(args: &[&str], server: &str) -> Run {
    let dir = tempfile::tempdir().expect("temp dir");
    let (out_path, err_path) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let file = |p: &std::path::Path| std::fs::File::create(p).expect("output file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_canaryd"))
        .args(args)
        .env("CANARYD_SERVER", server)
        .env_remove("CANARYD_TOKEN")
        .stdout(Stdio::from(file(&out_path)))
        .stderr(Stdio::from(file(&err_path)))
        .spawn()
        .expect("the canaryd binary runs");
    let mut code = None;
    for _ in 0..300 {
        if let Some(status) = child.try_wait().expect("child status") {
            code = status.code();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if code.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
    Run {
        code,
        stdout: read(&out_path),
        stderr: read(&err_path),
    }
}

#[tokio::test]
async fn history_prints_a_table_json_and_csv_with_every_filter() {
    let app = TestApp::spawn().await;
    let store = open_store(&app).await;
    let mut bob = Row::new(super::at(10));
    bob.actor = "ops-bob";
    bob.reason = "pin v2, \"carefully\"";
    let bob = insert(&store, &bob).await;
    let alice = insert(&store, &Row::new(super::at(5))).await;

    let run = canaryd(
        &["history", "--actor", "ops-bob", "--host", "gpu07"],
        &app.url,
    )
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert!(lines[0].starts_with("ID"), "a header: {}", run.stdout);
    assert_eq!(lines.len(), 2, "one rollout: {}", run.stdout);
    assert!(lines[1].contains(&bob) && lines[1].contains("ops-bob"));

    let run = canaryd(
        &[
            "history",
            "--format",
            "json",
            "--since",
            "2025-01-01T00:00:00Z",
            "--until",
            "2025-01-01T00:08:00Z",
            "--status",
            "succeeded",
            "--kind",
            "canary",
            "--service",
            "svc-a",
            "--tag",
            "v1",
        ],
        &app.url,
    )
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let items: Value = serde_json::from_str(&run.stdout).expect("JSON");
    assert_eq!(items.as_array().map(Vec::len), Some(1), "{items}");
    assert_eq!(items[0]["id"], json!(alice));

    let run = canaryd(&["history", "--format", "csv", "--host", "gpu07"], &app.url).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let records = parse_csv(&run.stdout);
    assert_eq!(records.len(), 3, "{}", run.stdout);
    assert_eq!(records[1][0], bob, "newest first");
    assert!(records[1].iter().any(|f| f == "pin v2, \"carefully\""));

    // A status that does not exist is a usage error, refused before anything is asked.
    let run = canaryd(&["history", "--status", "nope"], &app.url).await;
    assert_eq!(run.code, Some(2));
    assert!(run.stderr.contains("--status"), "{}", run.stderr);
    assert!(
        run.stderr.contains("succeeded"),
        "lists the values: {}",
        run.stderr
    );
    app.stop().await;
}

#[tokio::test]
async fn history_pages_through_the_cursor_up_to_the_limit() {
    let app = TestApp::spawn().await;
    let store = open_store(&app).await;
    let spec = BulkSpec {
        rollouts: 700,
        steps_per_rollout: 1,
        hosts: 5,
        services_per_host: 2,
        start_unix: 1_600_000_000,
        spacing_secs: 60,
    };
    store.bulk_fill(spec).await.expect("bulk fill");
    let run = canaryd(&["history", "--format", "json", "--limit", "650"], &app.url).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let items: Vec<Value> = serde_json::from_str(&run.stdout).expect("JSON");
    assert_eq!(items.len(), 650, "more than one page of 500");
    let ids: Vec<&str> = items.iter().filter_map(|i| i["id"].as_str()).collect();
    assert_eq!(
        ids.iter().collect::<BTreeSet<_>>().len(),
        650,
        "no duplicates"
    );
    let mut sorted = ids.clone();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(ids, sorted, "newest first (bulk ids grow with time)");
    app.stop().await;
}

#[tokio::test]
async fn show_prints_the_step_timeline_and_the_audit_trail() {
    let app = TestApp::spawn().await;
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    assert_eq!(app.wait_terminal(&id).await.status, "succeeded");
    let run = canaryd(&["show", &id], &app.url).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let out = &run.stdout;
    for expected in [
        "snapshot",
        "soak",
        "audit trail",
        "rollout_created",
        "local",
        "rollout_succeeded",
        "reason=\"test canary\"",
    ] {
        assert!(out.contains(expected), "{expected:?} in {out}");
    }
    app.stop().await;
}

#[tokio::test]
async fn rollout_watch_follows_the_event_stream_and_exits_by_outcome() {
    let app = TestApp::spawn().await;
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let run = canaryd(&["rollout", "watch", &id], &app.url).await;
    assert_eq!(run.code, Some(0), "succeeded: {}", run.stderr);
    assert!(
        !run.stderr.contains("polling"),
        "the stream was used: {}",
        run.stderr
    );
    for step in ["snapshot", "down", "up", "health", "soak"] {
        let line = format!("{id}  {step}");
        assert!(
            run.stdout.contains(&line),
            "a progress line for {step}: {}",
            run.stdout
        );
    }

    // An aborted rollout: exit 2.
    let id = app.start_canary(&TestApp::plan("v0.0.451")).await;
    app.wait_step(&id, "health", "running").await;
    let watcher = {
        let (url, id) = (app.url.clone(), id.clone());
        tokio::spawn(async move { canaryd(&["rollout", "watch", &id], &url).await })
    };
    let (status, body) = app
        .post(
            &format!("/v1/rollouts/{id}/abort"),
            &json!({"reason": "stop"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let run = watcher.await.expect("watcher");
    assert_eq!(run.code, Some(2), "aborted: {} {}", run.stdout, run.stderr);
    app.stop().await;
}

/// A `reason` a spreadsheet would run as a formula is exported with a leading `'`, by the API's
/// CSV and the CLI's alike, every formula lead character (`=`, `+`, `-`, `@`, tab, CR).
#[tokio::test]
async fn csv_exports_neutralise_spreadsheet_formulas_in_the_api_and_the_cli() {
    let app = TestApp::spawn().await;
    let store = open_store(&app).await;
    let reasons = [
        "=HYPERLINK(\"http://evil.example\",\"x\")",
        "+1+1",
        "-2+3",
        "@SUM(A1)",
        "\t=1",
        "\r=1",
        "plain reason",
    ];
    for (i, reason) in reasons.iter().enumerate() {
        let mut row = Row::new(super::at(10 + i as i64));
        row.reason = reason;
        insert(&store, &row).await;
    }
    let api = reqwest::get(format!("{}/v1/rollouts?format=csv&host=gpu07", app.url))
        .await
        .expect("export answers")
        .text()
        .await
        .expect("body");
    let cli = canaryd(&["history", "--host", "gpu07", "--format", "csv"], &app.url).await;
    assert_eq!(cli.code, Some(0), "{}", cli.stderr);
    for (name, text) in [("API", api), ("CLI", cli.stdout)] {
        let records = parse_csv(&text);
        let col = records[0]
            .iter()
            .position(|h| h == "reason")
            .expect("reason column");
        let exported: BTreeSet<String> = records[1..].iter().map(|r| r[col].clone()).collect();
        let expected: BTreeSet<String> = reasons
            .iter()
            .map(|r| match r {
                &"plain reason" => (*r).to_owned(),
                _ => format!("'{r}"),
            })
            .collect();
        assert_eq!(exported, expected, "{name} export:\n{text}");
    }
    app.stop().await;
}
