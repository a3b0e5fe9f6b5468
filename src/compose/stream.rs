//! The NDJSON stream of `compose/up` and `compose/down`, read chunk by chunk.
//!
//! The stream succeeds only if its last line is `done` with `success: true`. A body that ends
//! (or is cut, or falls silent) without `done` has an unknown outcome: compose may still be
//! running on the host. After a protocol error the reader keeps draining to the end, because
//! dropping the connection releases compose-manager's lock while compose keeps running.

use std::collections::VecDeque;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::{truncate, ComposeError};
use super::lines::LineSplitter;
use super::plan::{raw_plan_from_event, RawPlan};
use crate::domain::plan_gate::DryRunPlan;
use crate::domain::runbook::step::up::Staged;

/// How many output lines a [`StreamResult`] keeps.
pub const TRANSCRIPT_TAIL_LINES: usize = 50;
/// Longest output line kept in the transcript tail, in characters.
const TAIL_LINE_CHARS: usize = 2_000;
/// Longest NDJSON line accepted.
const MAX_LINE_BYTES: usize = 1 << 20;
/// Most bytes read from one stream before giving up.
const MAX_STREAM_BYTES: usize = 512 << 20;
/// Most chunks read from one stream (a bound on the read loop; never reached in practice).
const MAX_CHUNKS: usize = 10_000_000;

/// How a compose stream ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamResult {
    /// Judged from the last line only.
    pub outcome: StreamOutcome,
    /// The last 50 output lines as `stdout: ...` / `stderr: ...`; when the outcome is unknown
    /// because the stream was cut, a final `canaryd: ...` line says why.
    pub transcript_tail: Vec<String>,
    /// How many stdout/stderr lines the stream carried.
    pub n_lines: usize,
    /// When its last image pull or build line (`… Pulled`, `… Built`) arrived: an up's
    /// stream is pull and build until then, create and start after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pulled_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl StreamResult {
    /// True only for a last line `done` with `success: true`.
    pub fn succeeded(&self) -> bool {
        self.outcome == StreamOutcome::Succeeded
    }
}

/// The verdict of a compose stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StreamOutcome {
    /// Last line `done` with `success: true`.
    Succeeded,
    /// Last line `done` with `success: false`; no exit code when compose died from a signal.
    Failed { exit_code: Option<i32> },
    /// No `done`: the body ended, was cut or fell silent. Wait for the host to be idle.
    Unknown,
}

/// A dry run's stream and the plan it announced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DryRunResult {
    /// The stream; a plan is only trustworthy if this succeeded.
    pub stream: StreamResult,
    /// The `plan` event with names normalised to services; `None` if none came.
    pub plan: Option<DryRunPlan>,
    /// The `plan` object exactly as sent, for evidence.
    pub raw_plan: Option<Value>,
}

/// A `materialize_only` up's stream and its `staged` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageResult {
    /// The stream; staged only if this succeeded and `staged` came.
    pub stream: StreamResult,
    /// The `staged` event; `None` if none came.
    pub staged: Option<Staged>,
}

/// A stream read to its end: the verdict and the plan or staged event, if any.
#[derive(Debug)]
pub(crate) struct Streamed {
    pub(crate) result: StreamResult,
    pub(crate) plan: Option<(Value, RawPlan)>,
    pub(crate) staged: Option<Staged>,
}

/// Judges NDJSON lines one at a time. The first protocol error sticks.
#[derive(Debug)]
pub(crate) struct Transcript {
    endpoint: &'static str,
    line_no: usize,
    done: Option<Option<i32>>,
    succeeded: bool,
    tail: VecDeque<String>,
    n_lines: usize,
    plan: Option<(Value, RawPlan)>,
    staged: Option<Staged>,
    pulled_at: Option<chrono::DateTime<chrono::Utc>>,
    error: Option<ComposeError>,
}

impl Transcript {
    pub(crate) fn new(endpoint: &'static str) -> Self {
        Self {
            endpoint,
            line_no: 0,
            done: None,
            succeeded: false,
            tail: VecDeque::with_capacity(TRANSCRIPT_TAIL_LINES + 1),
            n_lines: 0,
            plan: None,
            staged: None,
            pulled_at: None,
            error: None,
        }
    }

    /// Takes the next line (without its `\n`).
    pub(crate) fn feed(&mut self, raw: &[u8]) {
        self.line_no += 1;
        if self.error.is_none() {
            if let Err(err) = self.judge(raw) {
                self.error = Some(err);
            }
        }
    }

    /// Records a protocol problem that is not about one complete line.
    pub(crate) fn fail(&mut self, line: &str, reason: &str) {
        if self.error.is_none() {
            let line_no = self.line_no + 1;
            self.error = Some(ComposeError::protocol(self.endpoint, line_no, line, reason));
        }
    }

    fn judge(&mut self, raw: &[u8]) -> Result<(), ComposeError> {
        let line_no = self.line_no;
        let endpoint = self.endpoint;
        let bad =
            |line: &str, reason: String| ComposeError::protocol(endpoint, line_no, line, reason);
        let text = std::str::from_utf8(raw)
            .map_err(|_| bad(&String::from_utf8_lossy(raw), "line is not UTF-8".into()))?;
        if text.trim().is_empty() {
            return Ok(());
        }
        if self.done.is_some() {
            return Err(bad(text, "line after `done`".into()));
        }
        let value: Value =
            serde_json::from_str(text).map_err(|e| bad(text, format!("not JSON: {e}")))?;
        let Value::Object(map) = value else {
            return Err(bad(text, "not a JSON object".into()));
        };
        let event = match map.get("event") {
            Some(Value::String(event)) => event.as_str(),
            Some(_) => return Err(bad(text, "`event` is not a string".into())),
            None => return Err(bad(text, "no `event` field".into())),
        };
        match event {
            "stdout" | "stderr" => {
                let data = map
                    .get("data")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(text, format!("{event} event without string `data`")))?;
                self.record(event, data);
            }
            "plan" => {
                if self.plan.is_some() {
                    return Err(bad(text, "second `plan` event".into()));
                }
                self.plan = Some(raw_plan_from_event(&map).map_err(|reason| bad(text, reason))?);
            }
            "staged" => {
                if self.staged.is_some() {
                    return Err(bad(text, "second `staged` event".into()));
                }
                let field = |key: &str| {
                    map.get(key)
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                        .ok_or_else(|| bad(text, format!("`staged` without string `{key}`")))
                };
                self.staged = Some(Staged {
                    file: field("file")?,
                    file_sha256: field("file_sha256")?,
                    tag: field("tag")?,
                });
            }
            "done" => {
                let success = map
                    .get("success")
                    .and_then(Value::as_bool)
                    .ok_or_else(|| bad(text, "`done` without boolean `success`".into()))?;
                let exit_code = match map.get("exit_code") {
                    None | Some(Value::Null) => None,
                    Some(code) => Some(
                        code.as_i64()
                            .and_then(|n| i32::try_from(n).ok())
                            .ok_or_else(|| bad(text, "`exit_code` is not an integer".into()))?,
                    ),
                };
                self.succeeded = success;
                self.done = Some(exit_code);
            }
            other => return Err(bad(text, format!("unknown event {other:?}"))),
        }
        Ok(())
    }

    fn record(&mut self, stream: &str, data: &str) {
        self.n_lines += 1;
        if data
            .split_whitespace()
            .any(|w| w == "Pulled" || w == "Built")
        {
            self.pulled_at = Some(chrono::Utc::now());
        }
        self.push_tail(format!("{stream}: {}", truncate(data, TAIL_LINE_CHARS)));
    }

    fn push_tail(&mut self, line: String) {
        self.tail.push_back(line);
        if self.tail.len() > TRANSCRIPT_TAIL_LINES {
            self.tail.pop_front();
        }
    }

    /// The verdict. `cut` says why reading stopped before the body ended, if it did.
    pub(crate) fn finish(mut self, cut: Option<String>) -> Result<Streamed, ComposeError> {
        if let Some(err) = self.error {
            return Err(err);
        }
        let outcome = match self.done {
            Some(_) if self.succeeded => StreamOutcome::Succeeded,
            Some(exit_code) => StreamOutcome::Failed { exit_code },
            None => {
                let why = cut.unwrap_or_else(|| "body ended without `done`".to_owned());
                self.push_tail(format!("canaryd: {why}"));
                StreamOutcome::Unknown
            }
        };
        Ok(Streamed {
            result: StreamResult {
                outcome,
                transcript_tail: self.tail.into(),
                n_lines: self.n_lines,
                pulled_at: self.pulled_at,
            },
            plan: self.plan,
            staged: self.staged,
        })
    }
}

/// Reads a 200 NDJSON body to its end; `idle` bounds the silence between chunks.
pub(crate) async fn read_stream(
    mut response: reqwest::Response,
    endpoint: &'static str,
    idle: Duration,
) -> Result<Streamed, ComposeError> {
    let mut splitter = LineSplitter::default();
    let mut transcript = Transcript::new(endpoint);
    let mut total = 0usize;
    let mut cut = Some(format!("stream still open after {MAX_CHUNKS} chunks"));
    for _ in 0..MAX_CHUNKS {
        let chunk = match tokio::time::timeout(idle, response.chunk()).await {
            Err(_) => {
                cut = Some(format!("no data for {} ms", idle.as_millis()));
                break;
            }
            Ok(Err(err)) => {
                cut = Some(format!("connection lost mid-stream: {err}"));
                break;
            }
            Ok(Ok(None)) => {
                cut = None;
                if let Some(last) = splitter.finish() {
                    transcript.feed(&last);
                }
                break;
            }
            Ok(Ok(Some(chunk))) => chunk,
        };
        total = total.saturating_add(chunk.len());
        for line in splitter.push(&chunk) {
            transcript.feed(&line);
        }
        if splitter.pending_len() > MAX_LINE_BYTES {
            transcript.fail("", "line longer than 1 MiB");
            splitter.discard_pending();
        }
        if total > MAX_STREAM_BYTES {
            transcript.fail("", "stream longer than 512 MiB");
            cut = Some("stream too long".to_owned());
            break;
        }
    }
    if let Some(why) = &cut {
        tracing::debug!(compose.endpoint = endpoint, reason = %why, "compose stream cut before its end");
    }
    transcript.finish(cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judge(lines: &[&str]) -> Result<Streamed, ComposeError> {
        let mut t = Transcript::new("/compose/up");
        for line in lines {
            t.feed(line.as_bytes());
        }
        t.finish(None)
    }

    #[test]
    fn the_tail_keeps_the_last_fifty_output_lines() {
        let lines: Vec<String> = (0..120)
            .map(|i| format!(r#"{{"event":"stderr","data":"line {i}"}}"#))
            .chain([r#"{"event":"done","success":true,"exit_code":0}"#.to_owned()])
            .collect();
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let streamed = judge(&refs).expect("valid");
        assert_eq!(streamed.result.n_lines, 120);
        assert_eq!(streamed.result.transcript_tail.len(), TRANSCRIPT_TAIL_LINES);
        assert_eq!(streamed.result.transcript_tail[0], "stderr: line 70");
        assert_eq!(streamed.result.transcript_tail[49], "stderr: line 119");
    }

    #[test]
    fn done_without_exit_code_is_a_failure_with_no_code() {
        let streamed = judge(&[r#"{"event":"done","success":false}"#]).expect("valid");
        assert_eq!(
            streamed.result.outcome,
            StreamOutcome::Failed { exit_code: None }
        );
    }

    #[test]
    fn malformed_events_are_protocol_errors_naming_the_line() {
        let out = r#"{"event":"stdout","data":"x"}"#;
        let cases: &[(&[&str], usize)] = &[
            (&[out, "{"], 2),
            (&[out, "[1]"], 2),
            (&[out, out, r#"{"data":"x"}"#], 3),
            (&[r#"{"event":"error","data":"x"}"#], 1),
            (&[r#"{"event":"stdout"}"#], 1),
            (&[r#"{"event":"staged","images":[],"tag":"v1"}"#], 1),
            (&[r#"{"event":"done"}"#], 1),
            (&[r#"{"event":"done","success":true,"exit_code":"0"}"#], 1),
            (&[r#"{"event":"done","success":true}"#, out], 2),
            (
                &[
                    r#"{"event":"plan","plan":{}}"#,
                    r#"{"event":"plan","plan":{}}"#,
                ],
                2,
            ),
        ];
        for (lines, line_no) in cases {
            match judge(lines) {
                Err(ComposeError::Protocol { line_no: got, .. }) => {
                    assert_eq!(got, *line_no, "{lines:?}")
                }
                other => panic!("{lines:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn blank_lines_are_tolerated_and_a_staged_event_is_kept_without_its_images() {
        let streamed = judge(&[
            "",
            r#"{"event":"staged","file":"prod/a.yaml","file_sha256":"9df5","images":[],"tag":"v1"}"#,
            r#"{"event":"done","success":true,"exit_code":0}"#,
            "  ",
        ])
        .expect("valid");
        assert!(streamed.result.succeeded());
        assert_eq!(streamed.result.pulled_at, None, "no pull or build line");
        let staged = Staged {
            file: "prod/a.yaml".into(),
            file_sha256: "9df5".into(),
            tag: "v1".into(),
        };
        assert_eq!(streamed.staged, Some(staged));
    }

    #[test]
    fn the_last_pull_or_build_line_is_timed() {
        let before = chrono::Utc::now();
        let streamed = judge(&[
            r#"{"event":"stderr","data":" r2 Pulling"}"#,
            r#"{"event":"stderr","data":" r2 Pulled"}"#,
            r#"{"event":"stderr","data":" Container r2  Started"}"#,
            r#"{"event":"done","success":true,"exit_code":0}"#,
        ])
        .expect("valid");
        let at = streamed.result.pulled_at.expect("a pull line");
        assert!(at >= before && at <= chrono::Utc::now());
    }

    #[test]
    fn a_cut_stream_says_why_in_the_tail() {
        let mut t = Transcript::new("/compose/up");
        t.feed(br#"{"event":"stdout","data":"pulling"}"#);
        let streamed = t.finish(Some("no data for 50 ms".into())).expect("valid");
        assert_eq!(streamed.result.outcome, StreamOutcome::Unknown);
        assert_eq!(
            streamed.result.transcript_tail,
            vec!["stdout: pulling", "canaryd: no data for 50 ms"]
        );
        assert_eq!(streamed.result.n_lines, 1);
    }
}
