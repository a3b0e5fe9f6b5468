//! `smoke`: a real generation, because a 200 from `/health` alone does not prove the engine
//! serves the right model or answers.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{defaults, Fields, StepDef, StepError};
use crate::domain::duration::serde_duration;
use crate::domain::pattern::LogPattern;

/// A real generation through the replica's OpenAI-compatible API: the model is listed,
/// the answer is 200 with content, matches every `expect`, and is the same `repeat` times.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Smoke {
    /// The model id `/v1/models` must list, sent in the chat request.
    pub model: String,
    /// The user message.
    pub prompt: String,
    /// `max_tokens` of each chat request.
    pub max_tokens: u32,
    /// Patterns every output must match (substring, or `re:` regex).
    pub expect: Vec<LogPattern>,
    /// Chat requests sent; all outputs must be identical.
    pub repeat: u32,
    /// Deadline for all the calls together.
    #[serde(with = "serde_duration")]
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

    fn parse(fields: &Fields<'_>) -> Result<Self, StepError> {
        Ok(Smoke {
            model: fields.required_text(
                "model",
                "the model id the engine serves, e.g. `z-ai/glm-5.3-flash`",
            )?,
            prompt: fields.required_text("prompt", "the message sent to the engine")?,
            max_tokens: fields.positive("max_tokens", defaults::SMOKE_MAX_TOKENS)?,
            expect: fields.patterns("expect")?,
            repeat: fields.positive("repeat", defaults::SMOKE_REPEAT)?,
            timeout: fields.duration("timeout", defaults::SMOKE_TIMEOUT)?,
        })
    }

    fn budget(&self) -> Duration {
        self.timeout
    }

    /// `model z-ai/glm-5.3-flash ok, 2 identical outputs, up to 120 ms, 11 tokens: "Ready. …"`.
    fn summary(d: &serde_json::Value) -> Option<String> {
        d.get("model")?;
        let calls = d["calls"].as_array().map_or(&[][..], Vec::as_slice);
        let tokens: u64 = calls
            .iter()
            .filter_map(|c| c["usage"]["completion_tokens"].as_u64())
            .sum();
        let outputs = match d["identical_outputs"].as_u64() {
            Some(1) => "1 output".to_owned(),
            Some(n) => format!("{n} identical outputs"),
            None => format!("{} output(s)", calls.len()),
        };
        Some(format!(
            "model {} ok, {outputs}, up to {} ms, {tokens} tokens: {:?}",
            d["model"].as_str().unwrap_or("?"),
            d["latency_ms_max"],
            d["output"].as_str().unwrap_or("")
        ))
    }
}
