//! The simulated engines' OpenAI-compatible API, on each engine's own port next to `/health`:
//! `GET /v1/models` lists the served model name (from the service's command,
//! `--served-model-name`, else `--model-path`), and `POST /v1/chat/completions` answers with
//! content that depends only on the prompt and the container's image, so that `temperature:
//! 0` gives the same answer every time. Both answer 503 while the engine is absent, exited
//! or cold-starting, like `/health`. Faults: [`super::ApiFault`].

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::Utc;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::api_fault::ApiFault;
use super::engine::EngineCtx;
use super::state::{sha256_hex, CALLS_CAP};
use super::SimApiCall;

/// The API routes, merged into each engine's router.
pub(super) fn routes() -> Router<EngineCtx> {
    Router::new()
        .route("/v1/models", get(list_models))
        .route("/v1/chat/completions", post(chat_completions))
}

/// What an answer depends on, read once under the lock.
struct Serving {
    model: String,
    image: String,
    fault: Option<ApiFault>,
    seq: u64,
}

/// The served model name: `--served-model-name`, else `--model-path`, else `default`.
pub(super) fn served_model(command: &str) -> String {
    let words: Vec<&str> = command.split_whitespace().collect();
    let after = |flag: &str| {
        words
            .iter()
            .position(|w| *w == flag)
            .and_then(|i| words.get(i + 1))
            .map(|w| w.to_string())
    };
    after("--served-model-name")
        .or_else(|| after("--model-path"))
        .unwrap_or_else(|| "default".to_owned())
}

fn error(status: StatusCode, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": "invalid_request_error", "code": status.as_u16()}});
    (status, Json(body)).into_response()
}

/// Records the call, checks the bearer, waits out a delay fault and checks readiness.
async fn serve(
    ctx: &EngineCtx,
    path: &str,
    headers: &HeaderMap,
    body: Value,
) -> Result<Serving, Response> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let (serving, token, ready) = {
        let mut st = ctx.shared.state();
        let service = ctx.service_with(&st);
        st.faults.api.seq += 1;
        if st.api_calls.len() >= CALLS_CAP {
            st.api_calls.pop_front();
        }
        st.api_calls.push_back(SimApiCall {
            service: service.clone(),
            path: path.to_owned(),
            body,
            bearer: bearer.clone(),
            at: Utc::now(),
        });
        let container = st.containers.get(&service);
        let ready = !st.faults.health_never.contains(&service)
            && container.is_some_and(|c| c.running && Instant::now() >= c.ready_at);
        let (model, image, tag) = container
            .map(|c| (served_model(&c.command), c.image.clone(), c.tag.clone()))
            .unwrap_or_default();
        let fault = st.faults.api.active(&service, &tag).cloned();
        let serving = Serving {
            model,
            image,
            fault,
            seq: st.faults.api.seq,
        };
        (serving, st.faults.api.token.clone(), ready)
    };
    if let Some(ApiFault::Delay(d)) = &serving.fault {
        tokio::time::sleep(*d).await;
    }
    if token.is_some() && bearer != token {
        return Err(error(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token",
        ));
    }
    if !ready {
        return Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "engine is not ready",
        ));
    }
    Ok(serving)
}

async fn list_models(State(ctx): State<EngineCtx>, headers: HeaderMap) -> Response {
    let serving = match serve(&ctx, "/v1/models", &headers, Value::Null).await {
        Ok(s) => s,
        Err(res) => return res,
    };
    let id = match serving.fault {
        Some(ApiFault::ModelId(other)) => other,
        _ => serving.model,
    };
    Json(json!({"object": "list", "data": [{"id": id, "object": "model", "owned_by": "sglang"}]}))
        .into_response()
}

/// The deterministic answer to `prompt` from an engine running `image`: `Ready.` first when
/// the prompt asks for the word, then a fingerprint of (prompt, image).
pub(super) fn answer(prompt: &str, image: &str) -> String {
    let fingerprint = &sha256_hex(format!("{image}\n{prompt}").as_bytes())[..8];
    let lead = if prompt.to_lowercase().contains("ready") {
        "Ready."
    } else {
        "Hello."
    };
    format!("{lead} Served by {image}, answer {fingerprint}.")
}

fn words(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

async fn chat_completions(
    State(ctx): State<EngineCtx>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let parsed: Option<Value> = serde_json::from_str(&body).ok();
    let recorded = parsed
        .clone()
        .unwrap_or_else(|| Value::String(body.clone()));
    let serving = match serve(&ctx, "/v1/chat/completions", &headers, recorded).await {
        Ok(s) => s,
        Err(res) => return res,
    };
    let Some(request) = parsed else {
        return error(StatusCode::BAD_REQUEST, "the body is not JSON");
    };
    let Some(messages) = request["messages"].as_array().filter(|m| !m.is_empty()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "`messages` must be a non-empty list",
        );
    };
    let asked = request["model"].as_str().unwrap_or_default();
    if asked != serving.model {
        let message = format!("The model `{asked}` does not exist.");
        return error(StatusCode::NOT_FOUND, &message);
    }
    let prompt: Vec<&str> = messages
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    let prompt = prompt.join("\n");
    let max_tokens = request["max_tokens"].as_u64().unwrap_or(16).max(1) as usize;
    let mut content = answer(&prompt, &serving.image);
    match serving.fault {
        Some(ApiFault::Status(status)) => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return error(status, "simulated engine failure");
        }
        Some(ApiFault::Garbage) => {
            let page = "<html><body><h1>502 Bad Gateway</h1></body></html>";
            return (StatusCode::OK, [(header::CONTENT_TYPE, "text/html")], page).into_response();
        }
        Some(ApiFault::EmptyContent) => content.clear(),
        Some(ApiFault::NonDeterministic) => content = format!("{} #{}", content, serving.seq),
        _ => {}
    }
    let all: Vec<&str> = content.split_whitespace().collect();
    let finish_reason = if all.len() > max_tokens {
        "length"
    } else {
        "stop"
    };
    let content = all[..all.len().min(max_tokens)].join(" ");
    let (prompt_tokens, completion_tokens) = (words(&prompt), words(&content));
    Json(json!({
        "id": format!("chatcmpl-sim-{}", serving.seq),
        "object": "chat.completion",
        "created": Utc::now().timestamp(),
        "model": serving.model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens},
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_served_model_comes_from_the_command() {
        let cases = [
            (
                "sglang serve --model-path a/b --served-model-name z-ai/glm-5.3-flash --tp 4",
                "z-ai/glm-5.3-flash",
            ),
            (
                "sglang serve --model-path graphistry/GLM --tp 4",
                "graphistry/GLM",
            ),
            ("sglang serve --tp 4", "default"),
        ];
        for (command, want) in cases {
            assert_eq!(served_model(command), want, "{command}");
        }
    }

    #[test]
    fn answers_depend_on_the_prompt_and_the_image_only() {
        let a = answer("Reply with the word ready.", "lmsysorg/sglang:glm53-v452");
        assert!(a.starts_with("Ready. "), "{a}");
        assert_eq!(
            a,
            answer("Reply with the word ready.", "lmsysorg/sglang:glm53-v452")
        );
        assert_ne!(
            a,
            answer("Reply with the word ready.", "lmsysorg/sglang:glm53-v451")
        );
        assert!(answer("Say hi", "img").starts_with("Hello. "));
    }
}
