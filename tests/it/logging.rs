//! `--log-format json`: every line the daemon writes is a JSON object, and what a rollout logs
//! carries its `rollout.id`, `host` and `service` (and, inside a step, `step.name`) from its
//! spans. Runs the real binary (`canaryd dev --log-format json`), so the global subscriber is
//! the one operators get, and no other test's subscriber can interfere.

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::{FILE, HOST, R2};

/// The value of `field` in any open span of a JSON log line.
fn span_field<'a>(line: &'a Value, field: &str) -> Option<&'a Value> {
    line["spans"]
        .as_array()?
        .iter()
        .find_map(|span| span.get(field))
}

/// Kills the daemon when the test ends, however it ends.
struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn json_log_lines_parse_and_carry_the_rollout_id_host_service_and_step() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log_path = dir.path().join("stderr.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let out_path = dir.path().join("stdout.log");
    let out = std::fs::File::create(&out_path).expect("stdout file");
    let child = Command::new(env!("CARGO_BIN_EXE_canaryd"))
        .args([
            "dev",
            "--log-format",
            "json",
            "--listen",
            "127.0.0.1:0",
            "--db",
        ])
        .arg(dir.path().join("dev.db"))
        .env("RUST_LOG", "canaryd=debug")
        .stdout(out)
        .stderr(log)
        .spawn()
        .expect("canaryd dev starts");
    let daemon = Daemon(child);
    // The first stdout line names the daemon's URL (bounded: 400 × 25 ms).
    let mut first_line = String::new();
    for _ in 0..400 {
        let text = std::fs::read_to_string(&out_path).unwrap_or_default();
        if let Some(line) = text.lines().next().filter(|_| text.contains('\n')) {
            first_line = line.to_owned();
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let url = first_line
        .split_whitespace()
        .find(|w| w.starts_with("http://127.0.0.1:"))
        .unwrap_or_else(|| panic!("no URL in {first_line:?}"))
        .trim_end_matches(',')
        .to_owned();

    let client = reqwest::Client::new();
    let plan = json!({"host": HOST, "file": FILE, "service": R2, "tag": "v0.0.452",
                      "reason": "json logs"});
    let created: Value = client
        .post(format!("{url}/v1/rollouts"))
        .json(&plan)
        .send()
        .await
        .expect("daemon answers")
        .json()
        .await
        .expect("json");
    let id = created["id"].as_str().expect("rollout id").to_owned();
    // Bounded: 600 × 50 ms (the dev runbook takes about 7 s).
    let mut status = String::new();
    for _ in 0..600 {
        let r: Value = client
            .get(format!("{url}/v1/rollouts/{id}"))
            .send()
            .await
            .expect("daemon answers")
            .json()
            .await
            .expect("json");
        status = r["status"].as_str().unwrap_or_default().to_owned();
        if matches!(status.as_str(), "succeeded" | "failed" | "aborted") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, "succeeded");
    drop(daemon);

    let text = std::fs::read_to_string(&log_path).expect("stderr log");
    let parsed: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(!parsed.is_empty(), "the daemon logged");
    for line in &parsed {
        assert!(
            line["timestamp"].is_string() && line["level"].is_string(),
            "{line}"
        );
    }
    let of_rollout: Vec<&Value> = parsed
        .iter()
        .filter(|l| span_field(l, "rollout.id").and_then(Value::as_str) == Some(id.as_str()))
        .collect();
    assert!(
        !of_rollout.is_empty(),
        "some lines carry rollout.id = {id} from the rollout span:\n{text}"
    );
    for line in &of_rollout {
        assert_eq!(span_field(line, "host"), Some(&json!(HOST)), "{line}");
        assert_eq!(span_field(line, "service"), Some(&json!(R2)), "{line}");
    }
    assert!(
        of_rollout
            .iter()
            .any(|l| span_field(l, "step.name").is_some()),
        "lines written during a step carry step.name:\n{text}"
    );
}

#[tokio::test]
async fn text_logs_have_no_colour_codes_when_stderr_is_not_a_terminal() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log_path = dir.path().join("stderr.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let child = Command::new(env!("CARGO_BIN_EXE_canaryd"))
        .args(["dev", "--listen", "127.0.0.1:0", "--db"])
        .arg(dir.path().join("dev.db"))
        .env("RUST_LOG", "canaryd=info")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("canaryd dev starts");
    let daemon = Daemon(child);
    // Bounded: 400 × 25 ms for the first log line.
    let mut text = String::new();
    for _ in 0..400 {
        text = std::fs::read_to_string(&log_path).unwrap_or_default();
        if text.contains("INFO") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    drop(daemon);
    assert!(text.contains("INFO"), "the daemon logged: {text:?}");
    assert!(
        !text.contains('\u{1b}'),
        "no ANSI escape in a log written to a file: {text:?}"
    );
}
