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
    Unavailable(String),
    Internal(String),
}

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
        if e.is_unprocessable() {
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
            EngineError::Store(_) => ApiError::Internal(message),
        }
    }
}
