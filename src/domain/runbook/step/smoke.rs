//! `smoke`: a real generation, because a 200 from `/health` alone does not prove the engine
//! serves the right model or answers.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Checked, at_least_one, defaults, positive_duration, StepDef};
use crate::domain::duration::serde_duration;
use crate::domain::pattern::LogPattern;

/// A real generation through the replica's OpenAI-compatible API: the model is listed,
/// the answer is 200 with content, matches every `expect`, and is the same `repeat` times.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Smoke {
    /// The model id `/v1/models` must list, sent in the chat request.
    #[serde(default)]
    pub model: String,
    /// The user message.
    #[serde(default)]
    pub prompt: String,
    /// `max_tokens` of each chat request.
    #[serde(default = "max_tokens")]
    pub max_tokens: u32,
    /// Patterns every output must match (substring, or `re:` regex).
    #[serde(default)]
    pub expect: Vec<LogPattern>,
    /// Chat requests sent; all outputs must be identical.
    #[serde(default = "repeat")]
    pub repeat: u32,
    /// Deadline for all the calls together.
    #[serde(with = "serde_duration", default = "timeout")]
    pub timeout: Duration,
}

impl StepDef for Smoke {
    const NAME: &'static str = "smoke";
    const DOC: &'static str =
        "a real generation through the replica's OpenAI-compatible API, `repeat` times identical";
    const FIELDS: &'static [&'static str] = &[
        "model",
        "prompt",
        "max_tokens",
        "expect",
        "repeat",
        "timeout",
    ];

    fn check(&self) -> Checked {
        for (field, text, what) in [
            ("model", &self.model, "the model id the engine serves, e.g. `z-ai/glm-5.3-flash`"),
            ("prompt", &self.prompt, "the message sent to the engine"),
        ] {
            if text.is_empty() {
                return Err((field, format!("missing field `{field}` ({what})")));
            }
            if text.trim().is_empty() {
                let message = format!("`{field}` must be a non-empty string ({what}), got \"{text}\"");
                return Err((field, message));
            }
        }
        at_least_one("max_tokens", self.max_tokens)?;
        at_least_one("repeat", self.repeat)?;
        positive_duration("timeout", self.timeout)
    }

    fn budget(&self) -> Duration {
        self.timeout
    }

    type Evidence = SmokeEvidence;

    /// `model z-ai/glm-5.3-flash ok, 2 identical outputs, up to 120 ms, 11 tokens: "Ready. …"`.
    fn summary(d: &SmokeEvidence) -> Option<String> {
        let tokens: u64 = d.calls.iter().filter_map(SmokeCall::completion_tokens).sum();
        let outputs = match d.identical_outputs {
            Some(1) => "1 output".to_owned(),
            Some(n) => format!("{n} identical outputs"),
            None => format!("{} output(s)", d.calls.len()),
        };
        let latency = d
            .latency_ms_max
            .map_or_else(|| "null".to_owned(), |ms| ms.to_string());
        Some(format!(
            "model {} ok, {outputs}, up to {latency} ms, {tokens} tokens: {:?}",
            d.model,
            d.output.as_deref().unwrap_or("")
        ))
    }
}

fn max_tokens() -> u32 {
    defaults::SMOKE_MAX_TOKENS
}

fn repeat() -> u32 {
    defaults::SMOKE_REPEAT
}

fn timeout() -> Duration {
    defaults::SMOKE_TIMEOUT
}

/// A `smoke` step's evidence: the model, each generation, and what failed. Text from the
/// engine is stored masked.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SmokeEvidence {
    /// The model asked for.
    pub model: String,
    /// The replica's API base URL.
    #[serde(default)]
    pub api_url: String,
    /// Generations asked for.
    #[serde(default)]
    pub repeat: u32,
    /// The message sent to the engine (absent from rows written before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// The generations answered so far.
    #[serde(default)]
    pub calls: Vec<SmokeCall>,
    /// How long `GET /v1/models` took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models_latency_ms: Option<u64>,
    /// The model ids `/v1/models` listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// An excerpt of the last output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// The `expect` patterns the output did not match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmatched: Option<Vec<String>>,
    /// The first output and the one that differed from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distinct_outputs: Option<Vec<String>>,
    /// Identical outputs, once every generation matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identical_outputs: Option<u32>,
    /// The slowest generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms_max: Option<u64>,
    /// All generations together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms_total: Option<u64>,
    /// The call that failed: no answer, a status other than 200, or a body that is not an
    /// OpenAI answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_call: Option<FailedCall>,
}

/// One generation of a `smoke` step (every key written; a missing one reads as empty).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct SmokeCall {
    /// How long it took.
    pub latency_ms: u64,
    /// The answer's `usage`, as the engine gave it.
    pub usage: serde_json::Value,
    /// The answer's `choices[0].finish_reason`, as the engine gave it.
    pub finish_reason: serde_json::Value,
    /// An excerpt of the output.
    pub output: String,
}

impl SmokeCall {
    /// `usage.completion_tokens`, when the engine reported it.
    pub fn completion_tokens(&self) -> Option<u64> {
        self.usage["completion_tokens"].as_u64()
    }
}

/// The call a `smoke` step failed on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailedCall {
    /// `GET /v1/models`, or `POST /v1/chat/completions (call 2 of 3)`.
    pub call: String,
    /// The HTTP status; `null` when there was no answer.
    pub status: Option<u16>,
    /// An excerpt of the body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// Why there was no answer, or why the body is not an OpenAI answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::runbook::step::evidence_tests::{merged, same_json_and_summary};

    #[test]
    fn stored_smoke_evidence_reads_and_writes_back_the_same_json() {
        let call = |n: u32| {
            json!({"finish_reason": "stop", "latency_ms": 3 * n, "output": "Ready.",
                   "usage": {"completion_tokens": 6, "prompt_tokens": 5, "total_tokens": 11}})
        };
        let base = json!({"api_url": "http://127.0.0.1:8001", "model": "z-ai/glm-5.3-flash", "repeat": 2});
        let with = |more: serde_json::Value| merged(&base, more);
        same_json_and_summary::<Smoke>(&[
            (json!({}), None),
            (
                with(json!({"calls": [call(1), call(2)], "identical_outputs": 2, "latency_ms_max": 6,
                            "latency_ms_total": 9, "models": ["z-ai/glm-5.3-flash"],
                            "models_latency_ms": 14, "output": "Ready.",
                            "prompt": "Reply with the word ready."})),
                Some("model z-ai/glm-5.3-flash ok, 2 identical outputs, up to 6 ms, 12 tokens: \"Ready.\""),
            ),
            (
                with(json!({"calls": [], "models_latency_ms": 0, "failed_call":
                            {"call": "GET /v1/models", "status": 401, "body": "no"}})),
                Some("model z-ai/glm-5.3-flash ok, 0 output(s), up to null ms, 0 tokens: \"\""),
            ),
            (
                with(json!({"calls": [], "failed_call": {"call": "POST /v1/chat/completions (call 1 of 2)",
                            "status": 200, "body": "<html>", "error": "not JSON"}})),
                Some("model z-ai/glm-5.3-flash ok, 0 output(s), up to null ms, 0 tokens: \"\""),
            ),
            (
                with(json!({"calls": [], "failed_call": {"call": "GET /v1/models", "status": null,
                            "error": "connection refused"}})),
                Some("model z-ai/glm-5.3-flash ok, 0 output(s), up to null ms, 0 tokens: \"\""),
            ),
            (with(json!({"calls": [], "models": ["z-ai/glm-4.6"], "models_latency_ms": 0})), Some("model z-ai/glm-5.3-flash ok, 0 output(s), up to null ms, 0 tokens: \"\"")),
            (
                with(json!({"calls": [call(1)], "output": "Ready.", "unmatched": ["re:^OK$"]})),
                Some("model z-ai/glm-5.3-flash ok, 1 output(s), up to null ms, 6 tokens: \"Ready.\""),
            ),
            (
                with(json!({"calls": [call(1), call(2)], "output": "b", "distinct_outputs": ["a", "b"]})),
                Some("model z-ai/glm-5.3-flash ok, 2 output(s), up to null ms, 12 tokens: \"b\""),
            ),
        ]);
    }
}
