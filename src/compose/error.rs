//! `ComposeError`: everything a compose-manager call can end in, other than an answer.
//!
//! compose-manager answers errors as `{"status":"error","error":"..."}`, except axum's
//! body-extraction errors (415/400/422), which are plain text and come before auth.

use thiserror::Error;

use crate::domain::error_code::ErrorCode;

/// Longest body or line excerpt kept in an error.
const EXCERPT_CHARS: usize = 200;
/// Longest error message kept from an error body.
const MESSAGE_CHARS: usize = 500;
/// The 409 text compose-manager sends when its one-operation lock is taken.
const BUSY_PREFIX: &str = "another docker operation is already in progress:";

/// A failed compose-manager call. `code()` gives a stable snake_case name for the API and audit.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ComposeError {
    /// 401: the bearer token was missing or wrong.
    #[error("compose-manager refused the token on {endpoint} (401): {message}")]
    Unauthorized { endpoint: String, message: String },
    /// 409: the host's one-operation lock is held by `in_flight` (e.g. `compose_up`).
    #[error("compose-manager host is busy on {endpoint} (409): {in_flight} is in progress")]
    Busy { endpoint: String, in_flight: String },
    /// 400 `tag not found: <tag>` (also what a GitHub rate limit looks like).
    #[error("compose-manager does not know tag '{tag}' on {endpoint} (400)")]
    TagNotFound { endpoint: String, tag: String },
    /// 400 `tag too recent: ...`: the tag is younger than the host's minimum age.
    #[error("compose-manager refused a too recent tag on {endpoint} (400): {message}")]
    TagTooRecent { endpoint: String, message: String },
    /// 400 `file '<f>' not found at tag '<t>'`.
    #[error("compose-manager found no such compose file on {endpoint} (400): {message}")]
    FileNotFound { endpoint: String, message: String },
    /// Any other 4xx except 401/404/409, including axum's plain-text 415/400/422.
    #[error("compose-manager rejected the request to {endpoint} ({status}): {message}")]
    BadRequest {
        endpoint: String,
        status: u16,
        message: String,
    },
    /// 404: the route does not exist on this compose-manager version.
    #[error("compose-manager has no route {endpoint} (404)")]
    NotFound { endpoint: String },
    /// 5xx.
    #[error("compose-manager failed on {endpoint} ({status}): {message}")]
    Server {
        endpoint: String,
        status: u16,
        message: String,
    },
    /// A non-streaming call did not finish within the request timeout.
    #[error("compose-manager did not answer {endpoint} in time")]
    Timeout { endpoint: String },
    /// The host could not be reached (connection refused, DNS, reset before an answer).
    #[error("compose-manager is unreachable on {endpoint}: {message}")]
    Connect { endpoint: String, message: String },
    /// The answer broke the contract. `line_no` is the 1-based NDJSON line, 0 for a whole body.
    #[error("compose-manager broke the protocol on {endpoint} at line {line_no}: {reason} (line: {line:?})")]
    Protocol {
        endpoint: String,
        line_no: usize,
        line: String,
        reason: String,
    },
    /// Refused by the client before anything was sent (e.g. an empty or list-like service).
    #[error("refused to send the request: {message}")]
    InvalidRequest { message: String },
    /// The compose-manager base URL is not usable.
    #[error("invalid compose-manager URL '{url}': {message}")]
    InvalidUrl { url: String, message: String },
}

impl ComposeError {
    /// Stable snake_case code, used in step details and API errors.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Unauthorized { .. } => ErrorCode::ComposeUnauthorized,
            Self::Busy { .. } => ErrorCode::HostBusy,
            Self::TagNotFound { .. } => ErrorCode::TagNotFound,
            Self::TagTooRecent { .. } => ErrorCode::TagTooRecent,
            Self::FileNotFound { .. } => ErrorCode::FileNotFound,
            Self::BadRequest { .. } => ErrorCode::ComposeBadRequest,
            Self::NotFound { .. } => ErrorCode::ComposeNotFound,
            Self::Server { .. } => ErrorCode::ComposeServerError,
            Self::Timeout { .. } => ErrorCode::ComposeTimeout,
            Self::Connect { .. } => ErrorCode::ComposeUnreachable,
            Self::Protocol { .. } => ErrorCode::ComposeProtocol,
            Self::InvalidRequest { .. } => ErrorCode::InvalidRequest,
            Self::InvalidUrl { .. } => ErrorCode::InvalidUrl,
        }
    }

    /// Maps a non-success HTTP answer (status and body text) to an error.
    pub(crate) fn from_status(endpoint: &str, status: u16, body: &str) -> Self {
        let endpoint = endpoint.to_owned();
        let message = error_message(body);
        match status {
            400 => classify_bad_request(endpoint, message),
            401 => Self::Unauthorized { endpoint, message },
            404 => Self::NotFound { endpoint },
            409 => Self::Busy {
                endpoint,
                in_flight: in_flight_action(&message),
            },
            402..=499 => Self::BadRequest {
                endpoint,
                status,
                message,
            },
            500..=599 => Self::Server {
                endpoint,
                status,
                message,
            },
            _ => Self::protocol(
                endpoint,
                0,
                body,
                format!("unexpected HTTP status {status}"),
            ),
        }
    }

    /// Maps a transport error of a whole (non-streaming) call.
    pub(crate) fn from_transport(endpoint: &str, err: &reqwest::Error) -> Self {
        let endpoint = endpoint.to_owned();
        if err.is_builder() {
            return Self::InvalidRequest {
                message: format!("could not build the request to {endpoint}: {}", chain(err)),
            };
        }
        if err.is_timeout() && !err.is_connect() {
            return Self::Timeout { endpoint };
        }
        Self::Connect {
            endpoint,
            message: chain(err),
        }
    }

    /// A protocol error with the offending line cut to 200 characters.
    pub(crate) fn protocol(
        endpoint: impl Into<String>,
        line_no: usize,
        line: &str,
        reason: impl Into<String>,
    ) -> Self {
        Self::Protocol {
            endpoint: endpoint.into(),
            line_no,
            line: truncate(line, EXCERPT_CHARS),
            reason: reason.into(),
        }
    }
}

fn classify_bad_request(endpoint: String, message: String) -> ComposeError {
    if let Some(tag) = message.strip_prefix("tag not found:") {
        return ComposeError::TagNotFound {
            endpoint,
            tag: tag.trim().to_owned(),
        };
    }
    if message.starts_with("tag too recent:") {
        return ComposeError::TagTooRecent { endpoint, message };
    }
    if message.starts_with("file '") && message.contains("' not found at tag '") {
        return ComposeError::FileNotFound { endpoint, message };
    }
    ComposeError::BadRequest {
        endpoint,
        status: 400,
        message,
    }
}

/// `another docker operation is already in progress: compose_up` → `compose_up`.
fn in_flight_action(message: &str) -> String {
    let action = message.strip_prefix(BUSY_PREFIX).unwrap_or(message).trim();
    if action.is_empty() {
        "unknown".to_owned()
    } else {
        action.to_owned()
    }
}

/// The `error` field of a JSON error body, or the plain text of an axum rejection.
fn error_message(body: &str) -> String {
    if let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(body) {
        if let Some(serde_json::Value::String(error)) = map.get("error") {
            return truncate(error, MESSAGE_CHARS);
        }
    }
    let text = body.trim();
    if text.is_empty() {
        "(empty body)".to_owned()
    } else {
        truncate(text, MESSAGE_CHARS)
    }
}

/// Cuts `text` to at most `max` characters, marking the cut.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// An error and its sources, joined: reqwest's own message hides the useful part.
fn chain(err: &dyn std::error::Error) -> String {
    let mut parts = vec![err.to_string()];
    let mut source = err.source();
    for _ in 0..8 {
        let Some(next) = source else { break };
        parts.push(next.to_string());
        source = next.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_map_to_the_variant_an_operator_expects() {
        let cases: &[(u16, &str, &str)] = &[
            (
                401,
                r#"{"status":"error","error":"Invalid token"}"#,
                "compose_unauthorized",
            ),
            (
                409,
                r#"{"status":"error","error":"another docker operation is already in progress: compose_down"}"#,
                "host_busy",
            ),
            (
                400,
                r#"{"status":"error","error":"tag not found: v9"}"#,
                "tag_not_found",
            ),
            (
                400,
                r#"{"status":"error","error":"tag too recent: 2026-01-01 00:00:00 UTC is less than 48 hours old"}"#,
                "tag_too_recent",
            ),
            (
                400,
                r#"{"status":"error","error":"file 'prod/x.yaml' not found at tag 'v1'"}"#,
                "file_not_found",
            ),
            (
                400,
                r#"{"status":"error","error":"invalid env var key: '1x' (must match [A-Za-z_][A-Za-z0-9_]*)"}"#,
                "compose_bad_request",
            ),
            (
                400,
                "Failed to parse the request body as JSON",
                "compose_bad_request",
            ),
            (
                415,
                "Expected request with `Content-Type: application/json`",
                "compose_bad_request",
            ),
            (
                422,
                "Failed to deserialize the JSON body: missing field `tag`",
                "compose_bad_request",
            ),
            (405, "", "compose_bad_request"),
            (404, "", "compose_not_found"),
            (
                500,
                r#"{"status":"error","error":"Failed to query GitHub API"}"#,
                "compose_server_error",
            ),
            (503, "upstream gone", "compose_server_error"),
            (302, "", "compose_protocol"),
        ];
        for (status, body, code) in cases {
            let err = ComposeError::from_status("/compose/up", *status, body);
            assert_eq!(err.code(), *code, "{status} {body}");
            assert!(err.to_string().contains("/compose/up"), "{err}");
        }
    }

    #[test]
    fn busy_names_the_in_flight_action() {
        let err = ComposeError::from_status(
            "/compose/up",
            409,
            r#"{"status":"error","error":"another docker operation is already in progress: compose_up"}"#,
        );
        assert_eq!(
            err,
            ComposeError::Busy {
                endpoint: "/compose/up".into(),
                in_flight: "compose_up".into()
            }
        );
    }

    #[test]
    fn plain_text_bodies_become_the_message_and_long_ones_are_cut() {
        let long = "x".repeat(2000);
        match ComposeError::from_status("/compose/up", 422, &long) {
            ComposeError::BadRequest { message, .. } => {
                assert_eq!(message.chars().count(), MESSAGE_CHARS + 1)
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(truncate("héllo", 2), "hé…");
        assert_eq!(truncate("hé", 2), "hé");
    }
}
