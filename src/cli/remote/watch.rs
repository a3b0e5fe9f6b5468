//! Following a rollout: the event stream (`GET /v1/rollouts/{id}/events`) first, with a
//! progress line per step; polling when the stream is unavailable or breaks.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::bail;
use chrono::Utc;
use serde_json::Value;

use super::super::output::step_line;
use super::super::ApiClient;
use crate::api::RolloutOut;

/// A stream silent this long gets a progress line for the running step.
const PROGRESS_EVERY: Duration = Duration::from_secs(30);

/// One Server-Sent Event.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct SseEvent {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
}

/// Incremental parser of a `text/event-stream` body: feed it chunks, get complete events.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: String,
    pending: SseEvent,
}

impl SseParser {
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        self.buf.push_str(&String::from_utf8_lossy(chunk));
        let mut out = Vec::new();
        while let Some(nl) = self.buf.find('\n') {
            let line: String = self.buf.drain(..=nl).collect();
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                let e = std::mem::take(&mut self.pending);
                if e != SseEvent::default() {
                    out.push(e);
                }
                continue;
            }
            if line.starts_with(':') {
                continue; // comment (keep-alive)
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "id" => self.pending.id = Some(value.to_owned()),
                "event" => self.pending.event = Some(value.to_owned()),
                "data" => {
                    if !self.pending.data.is_empty() {
                        self.pending.data.push('\n');
                    }
                    self.pending.data.push_str(value);
                }
                _ => {}
            }
        }
        out
    }
}

fn is_terminal(status: &str) -> bool {
    matches!(status, "succeeded" | "failed" | "aborted")
}

/// Follows a rollout until terminal, calling `print` once per step change; the event stream
/// first, polling if it breaks.
pub async fn follow(
    client: &ApiClient,
    id: &str,
    mut print: impl FnMut(String) -> anyhow::Result<()>,
) -> anyhow::Result<RolloutOut> {
    let mut shown = BTreeMap::new();
    match follow_events(client, id, &mut print, &mut shown).await {
        Ok(r) => Ok(r),
        Err(e) if e.is::<super::super::stdout::StdoutClosed>() => Err(e),
        Err(e) => {
            eprintln!("event stream of {id} unavailable ({e:#}); polling instead");
            poll(client, id, print, shown).await
        }
    }
}

/// Prints the lines of steps whose status changed since they were last shown; true if any.
fn show_changes(
    r: &RolloutOut,
    shown: &mut BTreeMap<String, String>,
    print: &mut impl FnMut(String) -> anyhow::Result<()>,
) -> anyhow::Result<bool> {
    let now = Utc::now();
    let mut any = false;
    for s in &r.steps {
        if s.status != "pending" && shown.get(&s.name) != Some(&s.status) {
            shown.insert(s.name.clone(), s.status.clone());
            print(step_line(r, s, now))?;
            any = true;
        }
    }
    Ok(any)
}

async fn follow_events(
    client: &ApiClient,
    id: &str,
    print: &mut impl FnMut(String) -> anyhow::Result<()>,
    shown: &mut BTreeMap<String, String>,
) -> anyhow::Result<RolloutOut> {
    let mut res = client
        .get_stream(&format!("/v1/rollouts/{id}/events"), None)
        .await?;
    let mut parser = SseParser::default();
    loop {
        let chunk = match tokio::time::timeout(PROGRESS_EVERY, res.chunk()).await {
            Err(_) => {
                let r = client.rollout(id).await?;
                if let Some(s) = r.steps.iter().find(|s| s.status == "running") {
                    print(step_line(&r, s, Utc::now()))?;
                }
                continue;
            }
            Ok(chunk) => chunk?,
        };
        let Some(bytes) = chunk else {
            // The daemon ends the stream when the rollout is terminal.
            let r = client.rollout(id).await?;
            show_changes(&r, shown, print)?;
            if is_terminal(&r.status) {
                return Ok(r);
            }
            bail!("the event stream ended while the rollout is {}", r.status);
        };
        for event in parser.push(&bytes) {
            let data: Value = serde_json::from_str(&event.data).unwrap_or(Value::Null);
            let step_changed = data["step"].is_string();
            let ended =
                data["step"].is_null() && data["to_state"].as_str().is_some_and(is_terminal);
            if step_changed || ended {
                let r = client.rollout(id).await?;
                show_changes(&r, shown, print)?;
                if ended && is_terminal(&r.status) {
                    return Ok(r);
                }
            }
        }
    }
}

/// Polls a rollout until terminal, printing each step change not yet in `shown`.
async fn poll(
    client: &ApiClient,
    id: &str,
    mut print: impl FnMut(String) -> anyhow::Result<()>,
    mut shown: BTreeMap<String, String>,
) -> anyhow::Result<RolloutOut> {
    let mut last_progress = std::time::Instant::now();
    loop {
        let r = client.rollout(id).await?;
        if show_changes(&r, &mut shown, &mut print)? {
            last_progress = std::time::Instant::now();
        } else if last_progress.elapsed() > PROGRESS_EVERY {
            if let Some(s) = r.steps.iter().find(|s| s.status == "running") {
                print(step_line(&r, s, Utc::now()))?;
            }
            last_progress = std::time::Instant::now();
        }
        if is_terminal(&r.status) {
            return Ok(r);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_chunks_are_parsed_once_complete() {
        let mut p = SseParser::default();
        assert!(p.push(b": keep-alive\n\nid: 7\nevent: step_run").is_empty());
        let got = p.push(b"ning\ndata: {\"a\":1}\n\nid: 8\ndata: x\r\ndata: y\r\n\r\n");
        assert_eq!(
            got,
            vec![
                SseEvent {
                    id: Some("7".into()),
                    event: Some("step_running".into()),
                    data: "{\"a\":1}".into()
                },
                SseEvent {
                    id: Some("8".into()),
                    event: None,
                    data: "x\ny".into()
                },
            ]
        );
    }
}
