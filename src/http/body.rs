//! `Body`: a request body read whole, within the size limit and the read timeout, with every
//! refusal in the API's JSON error shape (413, 408, 400) instead of axum's plain text.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{header, StatusCode};

use super::{ApiError, AppState};

/// The largest body any route reads (a plan is the largest).
pub const MAX_BODY_BYTES: usize = crate::domain::plan::MAX_BODY_BYTES;

/// A whole request body and its `Content-Type`.
pub struct Body {
    pub bytes: Bytes,
    /// The media type, parameters (`; charset=...`) removed; `None` without the header.
    pub content_type: Option<String>,
}

impl Body {
    /// Refuses a body that says it is not JSON (415); no `Content-Type` is read as JSON.
    pub fn require_json(&self) -> Result<(), ApiError> {
        match self.content_type.as_deref() {
            None | Some("application/json") => Ok(()),
            Some(other) => Err(ApiError::UnsupportedMediaType(format!(
                "Content-Type {other} is not application/json"
            ))),
        }
    }
}

impl FromRequest<AppState> for Body {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| {
                let text = v.to_str().unwrap_or("?");
                text.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            })
            .filter(|t| !t.is_empty());
        let timeout = state.config.http.body_read_timeout;
        let read = tokio::time::timeout(timeout, Bytes::from_request(req, state)).await;
        let bytes = match read {
            Err(_) => {
                return Err(ApiError::RequestTimeout(format!(
                    "the body was not received within {}s",
                    timeout.as_secs_f64()
                )))
            }
            Ok(Err(rejection)) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                return Err(ApiError::PayloadTooLarge(format!(
                    "the body is larger than the limit of {MAX_BODY_BYTES} bytes"
                )))
            }
            Ok(Err(rejection)) => {
                return Err(ApiError::bad_request("invalid_body", rejection.body_text()))
            }
            Ok(Ok(bytes)) => bytes,
        };
        Ok(Body {
            bytes,
            content_type,
        })
    }
}
