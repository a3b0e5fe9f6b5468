//! The `smoke` step: a real generation through the target's OpenAI-compatible API, because a
//! 200 from `/health` alone does not prove the engine serves the right model or answers.
//!
//! `GET {api_url}/v1/models` must list the step's model; then `repeat` times `POST
//! {api_url}/v1/chat/completions` (`temperature: 0`) must answer 200 with non-empty
//! content matching every `expect` pattern, and every output must be the same. All within
//! the step's deadline; an abort interrupts any call. The detail keeps each call's latency
//! and token usage and an excerpt of the output; text from the engine is stored with every
//! env-file value (8+ characters) and the API token masked.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::domain::error_code::ErrorCode;
use crate::domain::mask::mask;
use crate::domain::pattern::LogPattern;
use crate::domain::runbook::step::smoke::{FailedCall, SmokeCall, SmokeEvidence};
use crate::domain::runbook::step::Smoke;
use crate::engine::step_run::{Evidence, Execute, Running, StepEnd, StepRun};
use crate::probe::engine_api::{ApiAnswer, ApiCallError};

/// Characters of an output or a body kept in the step's detail.
const EXCERPT_CHARS: usize = 200;

impl Execute for Smoke {
    async fn execute(&self, run: &mut StepRun<'_>, at: &mut Running<'_>) -> StepEnd {
        run.smoke(at.deadline, self, at.abort).await
    }
}

/// One chat answer, as far as the step cares.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ChatOutput {
    pub content: String,
    pub usage: Value,
    pub finish_reason: Value,
}

/// The model ids of a `/v1/models` answer.
pub(crate) fn parse_models(body: &str) -> Result<Vec<String>, String> {
    let value: Value = serde_json::from_str(body).map_err(|e| format!("not JSON ({e})"))?;
    let data = value["data"].as_array().ok_or("no `data` list of models")?;
    Ok(data
        .iter()
        .filter_map(|m| m["id"].as_str().map(str::to_owned))
        .collect())
}

/// The content, usage and finish reason of a chat completion (content may be empty).
pub(crate) fn parse_chat(body: &str) -> Result<ChatOutput, String> {
    let value: Value = serde_json::from_str(body).map_err(|e| format!("not JSON ({e})"))?;
    let choice = &value["choices"][0];
    if choice.is_null() {
        return Err("no `choices[0]`".to_owned());
    }
    let content = match &choice["message"]["content"] {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        other => return Err(format!("`choices[0].message.content` is not text: {other}")),
    };
    Ok(ChatOutput {
        content,
        usage: value["usage"].clone(),
        finish_reason: choice["finish_reason"].clone(),
    })
}

/// The first [`EXCERPT_CHARS`] characters of `text` with `secrets` masked (masked whole
/// first, so a secret is never cut in half and half-shown).
pub(crate) fn excerpt(text: &str, secrets: &[String]) -> String {
    let masked = mask(text, secrets);
    match masked.char_indices().nth(EXCERPT_CHARS) {
        Some((at, _)) => format!("{}…", &masked[..at]),
        None => masked,
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// How one call went, before judging its body.
enum Call {
    Answer(ApiAnswer),
    Failed(StepEnd),
}

impl StepRun<'_> {
    /// Values masked in stored text: the host's merged env map and the API token.
    fn smoke_secrets(&self) -> Vec<String> {
        let mut secrets: Vec<String> = self.env.values().cloned().collect();
        if let Some(replica) = self.ctx.host.replicas.get(self.rollout.service.as_str()) {
            if let Some(token) = &replica.api_token {
                secrets.push(token.expose().to_owned());
            }
        }
        secrets
    }

    pub(crate) async fn smoke(
        &self,
        deadline: DateTime<Utc>,
        spec: &Smoke,
        abort: &CancellationToken,
    ) -> StepEnd {
        let Some(replica) = self.ctx.host.replicas.get(self.rollout.service.as_str()) else {
            let msg = format!("{} is not a configured replica", self.rollout.service);
            return StepEnd::failed(ErrorCode::ReplicaNotConfigured, msg, Evidence::none());
        };
        let secrets = self.smoke_secrets();
        let base = replica.api_url.trim_end_matches('/');
        let token = replica.api_token.as_ref();
        let mut detail = SmokeEvidence {
            model: spec.model.clone(),
            api_url: base.to_owned(),
            repeat: spec.repeat,
            prompt: Some(spec.prompt.clone()),
            ..SmokeEvidence::default()
        };

        // The model must be served.
        let url = format!("{base}/v1/models");
        let api = &self.ctx.engine_api;
        let answer = match self
            .call(
                deadline,
                abort,
                &detail,
                &secrets,
                "GET /v1/models",
                |time| api.get(&url, token, time),
            )
            .await
        {
            Call::Answer(a) => a,
            Call::Failed(end) => return end,
        };
        detail.models_latency_ms = Some(millis(answer.latency));
        if answer.status != 200 {
            return http_status("GET /v1/models", &answer, detail, &secrets);
        }
        let models = match parse_models(&answer.body) {
            Ok(models) => models,
            Err(why) => return bad_body("GET /v1/models", &why, &answer, detail, &secrets),
        };
        let listed = models.contains(&spec.model);
        let models: Vec<String> = models.iter().map(|m| mask(m, &secrets)).collect();
        detail.models = Some(models.clone());
        if !listed {
            let msg = format!(
                "{base}/v1/models does not list {:?}; it serves {models:?}",
                spec.model
            );
            return StepEnd::failed(ErrorCode::SmokeModelMissing, msg, Evidence::of(&detail));
        }

        // `repeat` generations, all identical.
        let url = format!("{base}/v1/chat/completions");
        let body = json!({
            "model": spec.model,
            "messages": [{"role": "user", "content": spec.prompt}],
            "max_tokens": spec.max_tokens,
            "temperature": 0,
        });
        let mut first: Option<String> = None;
        let mut latencies = Vec::new();
        for n in 1..=spec.repeat {
            let what = format!("POST /v1/chat/completions (call {n} of {})", spec.repeat);
            let answer = match self
                .call(deadline, abort, &detail, &secrets, &what, |time| {
                    api.post_json(&url, token, &body, time)
                })
                .await
            {
                Call::Answer(a) => a,
                Call::Failed(end) => return end,
            };
            if answer.status != 200 {
                return http_status(&what, &answer, detail, &secrets);
            }
            let output = match parse_chat(&answer.body) {
                Ok(output) => output,
                Err(why) => return bad_body(&what, &why, &answer, detail, &secrets),
            };
            latencies.push(millis(answer.latency));
            tracing::debug!(rollout.id = %self.rollout.id, duration_ms = millis(answer.latency), "smoke generation {n} of {} answered", self.rollout.id);
            let shown = excerpt(&output.content, &secrets);
            detail.calls.push(SmokeCall {
                latency_ms: millis(answer.latency),
                usage: output.usage,
                finish_reason: output.finish_reason,
                output: shown.clone(),
            });
            detail.output = Some(shown.clone());
            if output.content.trim().is_empty() {
                let msg = format!("{what} answered 200 with empty content");
                return StepEnd::failed(ErrorCode::SmokeEmptyOutput, msg, Evidence::of(&detail));
            }
            let missed: Vec<&str> = spec
                .expect
                .iter()
                .filter(|p| !p.matches(&output.content))
                .map(LogPattern::as_str)
                .collect();
            if !missed.is_empty() {
                detail.unmatched = Some(missed.iter().map(|p| p.to_string()).collect());
                let msg = format!("the output does not match {missed:?}: {shown:?}");
                return StepEnd::failed(ErrorCode::SmokeMismatch, msg, Evidence::of(&detail));
            }
            match &first {
                None => first = Some(output.content),
                Some(earlier) if *earlier == output.content => {}
                Some(earlier) => {
                    let distinct = vec![excerpt(earlier, &secrets), shown];
                    let msg = format!(
                        "call {n} answered differently at temperature 0: {:?} then {:?}",
                        distinct[0], distinct[1]
                    );
                    detail.distinct_outputs = Some(distinct);
                    return StepEnd::failed(
                        ErrorCode::SmokeNondeterministic,
                        msg,
                        Evidence::of(&detail),
                    );
                }
            }
        }
        detail.identical_outputs = Some(spec.repeat);
        detail.latency_ms_max = Some(latencies.iter().max().copied().unwrap_or(0));
        detail.latency_ms_total = Some(latencies.iter().sum::<u64>());
        StepEnd::Succeeded(Evidence::of(&detail))
    }

    /// Runs one call with the time left before `deadline`, unless an abort comes first.
    async fn call<F, Fut>(
        &self,
        deadline: DateTime<Utc>,
        abort: &CancellationToken,
        detail: &SmokeEvidence,
        secrets: &[String],
        what: &str,
        send: F,
    ) -> Call
    where
        F: FnOnce(Duration) -> Fut,
        Fut: std::future::Future<Output = Result<ApiAnswer, ApiCallError>>,
    {
        let left = (deadline - self.ctx.now()).to_std().unwrap_or_default();
        if left.is_zero() {
            let msg = format!("the smoke test's deadline passed before {what}");
            return Call::Failed(StepEnd::failed(
                ErrorCode::SmokeTimeout,
                msg,
                Evidence::of(detail),
            ));
        }
        let result = tokio::select! {
            result = send(left) => result,
            () = abort.cancelled() => return Call::Failed(StepEnd::Aborted(Evidence::of(detail))),
        };
        match result {
            Ok(answer) => Call::Answer(answer),
            Err(ApiCallError::Timeout(_)) => {
                let msg = format!("{what} did not answer before the smoke test's deadline");
                Call::Failed(StepEnd::failed(
                    ErrorCode::SmokeTimeout,
                    msg,
                    Evidence::of(detail),
                ))
            }
            Err(ApiCallError::Transport(why)) => {
                let msg = mask(&format!("{what}: no HTTP answer: {why}"), secrets);
                let mut detail = detail.clone();
                detail.failed_call = Some(FailedCall {
                    call: what.to_owned(),
                    status: None,
                    body: None,
                    error: Some(why),
                });
                Call::Failed(StepEnd::failed(
                    ErrorCode::SmokeHttpStatus,
                    msg,
                    Evidence::of(&detail),
                ))
            }
        }
    }
}

/// A non-200 answer: the status and an excerpt of the body.
fn http_status(
    what: &str,
    answer: &ApiAnswer,
    mut detail: SmokeEvidence,
    secrets: &[String],
) -> StepEnd {
    let body = excerpt(&answer.body, secrets);
    let msg = format!("{what} answered {}: {body}", answer.status);
    detail.failed_call = Some(FailedCall {
        call: what.to_owned(),
        status: Some(answer.status),
        body: Some(body),
        error: None,
    });
    StepEnd::failed(ErrorCode::SmokeHttpStatus, msg, Evidence::of(&detail))
}

/// A 200 whose body is not what the OpenAI API answers: failed like a bad status, with the
/// reason and an excerpt of the body.
fn bad_body(
    what: &str,
    why: &str,
    answer: &ApiAnswer,
    mut detail: SmokeEvidence,
    secrets: &[String],
) -> StepEnd {
    let body = excerpt(&answer.body, secrets);
    let msg = format!(
        "{what} answered {} with a body that is not an OpenAI answer ({why}): {body}",
        answer.status
    );
    detail.failed_call = Some(FailedCall {
        call: what.to_owned(),
        status: Some(answer.status),
        body: Some(body),
        error: Some(why.to_owned()),
    });
    StepEnd::failed(ErrorCode::SmokeHttpStatus, msg, Evidence::of(&detail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_lists_are_read_or_refused() {
        let cases: &[(&str, Result<Vec<&str>, &str>)] = &[
            (
                r#"{"object":"list","data":[{"id":"z-ai/glm-5.3-flash","object":"model"}]}"#,
                Ok(vec!["z-ai/glm-5.3-flash"]),
            ),
            (r#"{"object":"list","data":[]}"#, Ok(vec![])),
            (r#"{"object":"list"}"#, Err("no `data` list of models")),
            ("<html>502</html>", Err("not JSON")),
        ];
        for (body, want) in cases {
            let got = parse_models(body);
            match want {
                Ok(ids) => assert_eq!(
                    got.as_deref(),
                    Ok(&ids.iter().map(|s| s.to_string()).collect::<Vec<_>>()[..]),
                    "{body}"
                ),
                Err(why) => assert!(
                    got.as_ref().is_err_and(|e| e.starts_with(why)),
                    "{body}: {got:?}"
                ),
            }
        }
    }

    #[test]
    fn chat_answers_are_read_or_refused() {
        let ok = r#"{"choices":[{"message":{"role":"assistant","content":"Ready."},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1}}"#;
        let out = parse_chat(ok).expect("parses");
        assert_eq!(out.content, "Ready.");
        assert_eq!(out.usage["completion_tokens"], 1);
        assert_eq!(out.finish_reason, "stop");
        let null = r#"{"choices":[{"message":{"role":"assistant","content":null}}]}"#;
        assert_eq!(parse_chat(null).map(|o| o.content), Ok(String::new()));
        for (body, why) in [
            ("not json", "not JSON"),
            (r#"{"choices":[]}"#, "no `choices[0]`"),
            (
                r#"{"choices":[{"message":{"content":3}}]}"#,
                "`choices[0].message.content` is not text",
            ),
        ] {
            let got = parse_chat(body);
            assert!(
                got.as_ref().is_err_and(|e| e.starts_with(why)),
                "{body}: {got:?}"
            );
        }
    }

    #[test]
    fn excerpts_are_cut_at_200_characters_after_masking_secrets() {
        let secrets = vec!["sim-proxy-token".to_owned(), "short".to_owned()];
        assert_eq!(
            excerpt("token sim-proxy-token, short", &secrets),
            "token ***, short"
        );
        let long = format!("{}sim-proxy-token", "é".repeat(195));
        let cut = excerpt(&long, &secrets);
        assert_eq!(cut, format!("{}***", "é".repeat(195)));
        let longer = "x".repeat(250);
        assert_eq!(excerpt(&longer, &[]), format!("{}…", "x".repeat(200)));
    }
}
