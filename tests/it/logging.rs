//! `--log-format json`: every line is a JSON object, and what a rollout logs carries its
//! `rollout.id`, `host` and `service` (and, inside a step, `step.name`) from its spans.

use std::io::Write;
use std::sync::{Arc, Mutex};

use canaryd::telemetry::{subscriber, LogFormat};
use serde_json::Value;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

use crate::helpers::{TestApp, HOST, R2};

/// Collects every log line in memory.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'w> MakeWriter<'w> for Lines {
    type Writer = Lines;
    fn make_writer(&'w self) -> Lines {
        self.clone()
    }
}

impl Lines {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().expect("lines").clone()).expect("UTF-8 log")
    }
}

/// The value of `field` in any span of a JSON log line.
fn span_field<'a>(line: &'a Value, field: &str) -> Option<&'a Value> {
    line["spans"]
        .as_array()?
        .iter()
        .find_map(|span| span.get(field))
}

// A current-thread runtime (the default of #[tokio::test]): the daemon's tasks run on this
// thread, so the thread-local subscriber sees all of them.
#[tokio::test]
async fn json_log_lines_parse_and_carry_the_rollout_id_host_service_and_step() {
    let lines = Lines::default();
    let filter = EnvFilter::new("canaryd=debug");
    let _guard =
        tracing::subscriber::set_default(subscriber(LogFormat::Json, filter, lines.clone()));

    let app = TestApp::spawn().await;
    let id = app.start_canary(&TestApp::plan("v0.0.451")).await;
    let done = app.wait_terminal(&id).await;
    assert_eq!(done.status, "succeeded");
    app.stop().await;

    let text = lines.text();
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
        assert_eq!(span_field(line, "host"), Some(&Value::from(HOST)), "{line}");
        assert_eq!(
            span_field(line, "service"),
            Some(&Value::from(R2)),
            "{line}"
        );
    }
    assert!(
        of_rollout
            .iter()
            .any(|l| span_field(l, "step.name").is_some()),
        "lines written during a step carry step.name:\n{text}"
    );
}
