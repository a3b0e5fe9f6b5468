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

    type Evidence = serde_json::Value;

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

fn max_tokens() -> u32 {
    defaults::SMOKE_MAX_TOKENS
}

fn repeat() -> u32 {
    defaults::SMOKE_REPEAT
}

fn timeout() -> Duration {
    defaults::SMOKE_TIMEOUT
}
