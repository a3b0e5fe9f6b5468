//! `ApiError`: every error the API answers with, its status and its stable snake_case code.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::domain::plan::PlanError;
use crate::engine::EngineError;

/// An error answered as `{"error": {"code", "message"}}`.
#[derive(Debug)]
pub enum ApiError {
    Unauthorized(String),
    Forbidden(String),
    NotFound {
        code: &'static str,
        message: String,
    },
    BadRequest {
        code: &'static str,
        message: String,
    },
    Unprocessable {
        code: &'static str,
        message: String,
    },
    Conflict {
        code: &'static str,
        message: String,
        rollout_id: Option<String>,
    },
    /// A body over the limit (413 `body_too_large`).
    PayloadTooLarge(String),
    /// A body whose `Content-Type` the route does not read (415 `unsupported_media_type`).
    UnsupportedMediaType(String),
    /// A client that did not send its body in time (408 `request_timeout`).
    RequestTimeout(String),
    /// A `Host` this daemon does not answer to without tokens (421 `misdirected_host`).
    MisdirectedHost(String),
    /// No route has this path (404 `route_not_found`).
    RouteNotFound(String),
    /// The path exists, not with this method (405 `method_not_allowed`).
    MethodNotAllowed(String),
    Unavailable(String),
    Internal(String),
}

/// Every code the API answers with and its status: the exhaustive list `docs/openapi.yaml`
/// documents (checked both ways by `tests/it/openapi.rs`). Codes are stable; a code that
/// two routes answer with different statuses is listed once per status.
pub const ERROR_CODES: &[(&str, u16)] = &[
    ("invalid_body", 400),
    ("unknown_field", 400),
    ("invalid_query", 400),
    ("invalid_header", 400),
    ("unauthorized", 401),
    ("forbidden", 403),
    ("not_found", 404),
    ("route_not_found", 404),
    ("unknown_replica", 404),
    ("no_prior_deployment", 404),
    // A host named in the path (`/v1/hosts/{host}/doctor`); in a body it is 422.
    ("unknown_host", 404),
    ("method_not_allowed", 405),
    ("request_timeout", 408),
    ("misdirected_host", 421),
    ("host_busy", 409),
    ("rollout_terminal", 409),
    ("not_awaiting_approval", 409),
    ("release_state", 409),
    ("body_too_large", 413),
    ("unsupported_media_type", 415),
    ("unknown_host", 422),
    ("unknown_service", 422),
    ("invalid_service", 422),
    ("invalid_file", 422),
    ("invalid_tag", 422),
    ("invalid_env", 422),
    ("unknown_runbook", 422),
    ("missing_reason", 422),
    ("invalid_pattern", 422),
    ("invalid_on_failure", 422),
    ("invalid_replaces", 422),
    ("invalid_size", 422),
    ("unknown_target", 422),
    ("companion_is_replica", 422),
    ("invalid_release", 422),
    ("internal", 500),
    ("not_ready", 503),
];

impl ApiError {
    fn parts(&self) -> (StatusCode, &str, &str) {
        match self {
            ApiError::Unauthorized(m) => (StatusCode::UNAUTHORIZED, "unauthorized", m),
            ApiError::Forbidden(m) => (StatusCode::FORBIDDEN, "forbidden", m),
            ApiError::NotFound { code, message } => (StatusCode::NOT_FOUND, code, message),
            ApiError::BadRequest { code, message } => (StatusCode::BAD_REQUEST, code, message),
            ApiError::Unprocessable { code, message } => {
                (StatusCode::UNPROCESSABLE_ENTITY, code, message)
            }
            ApiError::Conflict { code, message, .. } => (StatusCode::CONFLICT, code, message),
            ApiError::PayloadTooLarge(m) => (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", m),
            ApiError::UnsupportedMediaType(m) => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                m,
            ),
            ApiError::RequestTimeout(m) => (StatusCode::REQUEST_TIMEOUT, "request_timeout", m),
            ApiError::MisdirectedHost(m) => {
                (StatusCode::MISDIRECTED_REQUEST, "misdirected_host", m)
            }
            ApiError::RouteNotFound(m) => (StatusCode::NOT_FOUND, "route_not_found", m),
            ApiError::MethodNotAllowed(m) => {
                (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", m)
            }
            ApiError::Unavailable(m) => (StatusCode::SERVICE_UNAVAILABLE, "not_ready", m),
            ApiError::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "internal error; see the daemon's log",
            ),
        }
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            code,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let ApiError::Internal(detail) = &self {
            tracing::error!(error = %detail, "request failed");
        }
        let (status, code, message) = self.parts();
        if !ERROR_CODES.contains(&(code, status.as_u16())) {
            // tests/it/openapi.rs keeps this from happening; say so if it does.
            tracing::warn!(
                code,
                status = status.as_u16(),
                "an error code missing from ERROR_CODES"
            );
        }
        let mut body = json!({"error": {"code": code, "message": message}});
        if let ApiError::Conflict {
            rollout_id: Some(id),
            ..
        } = &self
        {
            body["error"]["rollout_id"] = json!(id);
        }
        (status, Json(body)).into_response()
    }
}

impl From<PlanError> for ApiError {
    fn from(e: PlanError) -> Self {
        let message = e.message.clone();
        if e.code == "body_too_large" {
            ApiError::PayloadTooLarge(message)
        } else if e.is_unprocessable() {
            ApiError::Unprocessable {
                code: e.code,
                message,
            }
        } else {
            ApiError::BadRequest {
                code: e.code,
                message,
            }
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        let message = e.to_string();
        match e {
            EngineError::HostBusy { rollout_id, .. } => ApiError::Conflict {
                code: "host_busy",
                message,
                rollout_id: Some(rollout_id),
            },
            EngineError::NotFound(_) => ApiError::NotFound {
                code: "not_found",
                message,
            },
            EngineError::Terminal(_) => ApiError::Conflict {
                code: "rollout_terminal",
                message,
                rollout_id: None,
            },
            EngineError::NoPriorDeployment { .. } => ApiError::NotFound {
                code: "no_prior_deployment",
                message,
            },
            EngineError::UnknownTarget(_) => ApiError::Unprocessable {
                code: "unknown_target",
                message,
            },
            EngineError::UnknownRunbook(_) => ApiError::Unprocessable {
                code: "unknown_runbook",
                message,
            },
            EngineError::NotAwaitingApproval(_) => ApiError::Conflict {
                code: "not_awaiting_approval",
                message,
                rollout_id: None,
            },
            EngineError::CompanionIsReplica(_) => ApiError::Unprocessable {
                code: "companion_is_replica",
                message,
            },
            EngineError::InvalidReplaces(_) => ApiError::Unprocessable {
                code: "invalid_replaces",
                message,
            },
            EngineError::ReleaseNotFound(_) => ApiError::NotFound {
                code: "not_found",
                message,
            },
            EngineError::ReleaseState(_) => ApiError::Conflict {
                code: "release_state",
                message,
                rollout_id: None,
            },
            EngineError::Store(_) => ApiError::Internal(message),
        }
    }
}

/// The router's fallback: a path no route has.
pub(super) async fn route_not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::RouteNotFound(format!(
        "no route {}; the routes are listed at /openapi.json",
        uri.path()
    ))
}

/// The router's answer to a known path called with another method.
pub(super) async fn method_not_allowed(
    method: axum::http::Method,
    uri: axum::http::Uri,
) -> ApiError {
    ApiError::MethodNotAllowed(format!(
        "{} does not answer {method}; see /openapi.json",
        uri.path()
    ))
}

impl From<crate::api::release::Refusal> for ApiError {
    fn from(r: crate::api::release::Refusal) -> Self {
        match (r.unprocessable, r.code) {
            (_, "internal") => ApiError::Internal(r.message),
            (true, code) => ApiError::Unprocessable {
                code,
                message: r.message,
            },
            (false, code) => ApiError::bad_request(code, r.message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{ApiError, ERROR_CODES};

    #[test]
    fn every_fixed_code_is_in_the_exhaustive_list_with_its_status() {
        let m = || "m".to_owned();
        let fixed = [
            ApiError::Unauthorized(m()),
            ApiError::Forbidden(m()),
            ApiError::PayloadTooLarge(m()),
            ApiError::UnsupportedMediaType(m()),
            ApiError::RequestTimeout(m()),
            ApiError::RouteNotFound(m()),
            ApiError::MethodNotAllowed(m()),
            ApiError::Unavailable(m()),
            ApiError::Internal(m()),
        ];
        for e in &fixed {
            let (status, code, _) = e.parts();
            assert!(
                ERROR_CODES.contains(&(code, status.as_u16())),
                "{code} {status}"
            );
        }
        let mut pairs = ERROR_CODES.to_vec();
        pairs.sort_unstable();
        let len = pairs.len();
        pairs.dedup();
        assert_eq!(
            pairs.len(),
            len,
            "a code is listed twice with the same status"
        );
    }
}
