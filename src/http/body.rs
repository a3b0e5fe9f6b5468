//! `Body`: a request body read whole, within the size limit and the read timeout, with every
//! refusal in the API's JSON error shape (413, 408, 400) instead of axum's plain text.
//! `JsonBody<T>`: a `Body` that must be one JSON object of an input type ([`JsonInput`]),
//! refused with the same codes on every route (415, 400 `invalid_body` / `unknown_field`, 422
//! `missing_reason`).

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{header, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{ApiError, AppState};
use crate::domain::plan::MAX_REASON_BYTES;
use crate::domain::unknown_keys::refused_keys;

/// The largest body any route reads (a plan is the largest).
pub const MAX_BODY_BYTES: usize = crate::domain::plan::MAX_BODY_BYTES;

/// A whole request body and its `Content-Type`.
pub struct Body {
    pub bytes: Bytes,
    /// The media type, parameters (`; charset=...`) removed; `None` without the header.
    pub content_type: Option<String>,
}

impl Body {
    /// Refuses a body that does not say it is JSON (415): without a `Content-Type` too, since
    /// a web page can send a body without one, or as `text/plain`, with no preflight.
    pub fn require_json(&self) -> Result<(), ApiError> {
        match self.content_type.as_deref() {
            Some("application/json") => Ok(()),
            None => Err(ApiError::UnsupportedMediaType(
                "no Content-Type: send the body as application/json".into(),
            )),
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

/// A JSON object body an API route takes: its name in messages and the fields it may have.
/// Its type refuses unknown keys (`#[serde(deny_unknown_fields)]`): serde finds them, as it
/// does in configs, plans and runbooks (`domain::unknown_keys`).
pub trait JsonInput: DeserializeOwned {
    /// What the body is, at the start of its error messages (`rollback body`).
    const NAME: &'static str;
    /// Every field it may have, as messages list them.
    const FIELDS: &'static [&'static str];
    /// It must say why (a `reason` that is not blank), or it is refused `missing_reason`
    /// (422): the reason is kept in the audit trail.
    const REQUIRES_REASON: bool;
}

/// A request body read as `T` ([`Body`]'s bounds, then [`parse_json`]). A handler that checks
/// the caller's role first takes `Result<JsonBody<T>, ApiError>` and uses it after the check.
pub struct JsonBody<T>(pub T);

impl<T: JsonInput> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let body = Body::from_request(req, state).await?;
        body.require_json()?;
        parse_json(&body.bytes).map(JsonBody)
    }
}

/// Reads one JSON object as `T`, refusing in this order: not JSON or not an object
/// (`invalid_body`, with serde's line and column), a field `T` does not have
/// (`unknown_field`), a blank or absent reason (`missing_reason`), a field of the wrong type
/// (`invalid_body`, naming the field).
pub fn parse_json<T: JsonInput>(bytes: &[u8]) -> Result<T, ApiError> {
    let invalid = |e: String| {
        ApiError::bad_request(
            "invalid_body",
            format!("{}: {e} (fields: {})", T::NAME, T::FIELDS.join(", ")),
        )
    };
    let value: Value = serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
    let Value::Object(map) = &value else {
        return Err(invalid("must be a JSON object".into()));
    };
    crate::domain::plan::check_unique_keys(bytes).map_err(invalid)?;
    // Read again as a YAML mapping, which keeps the keys in the body's order (serde_json's
    // map sorts them): unknown keys are named in the order written, as serde refuses them.
    let ordered: serde_yaml::Value =
        serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
    let unknown: Vec<String> = refused_keys::<T>(ordered)
        .into_iter()
        .map(|r| match r.parent_shown() {
            parent if parent.is_empty() => r.key,
            parent => format!("{parent}.{}", r.key),
        })
        .collect();
    if !unknown.is_empty() {
        let s = if unknown.len() > 1 { "s" } else { "" };
        return Err(ApiError::bad_request(
            "unknown_field",
            format!(
                "{}: unknown field{s} (expected one of: {})",
                unknown.join(", "),
                T::FIELDS.join(", ")
            ),
        ));
    }
    if T::REQUIRES_REASON {
        let blank = match map.get("reason") {
            None | Some(Value::Null) => true,
            Some(Value::String(r)) => r.trim().is_empty(),
            Some(_) => false,
        };
        let long =
            matches!(map.get("reason"), Some(Value::String(r)) if r.len() > MAX_REASON_BYTES);
        if long {
            return Err(invalid(format!(
                "reason: must be at most {MAX_REASON_BYTES} bytes"
            )));
        }
        if blank {
            return Err(ApiError::Unprocessable {
                code: "missing_reason",
                message: "reason: must say why (it is kept in the audit trail)".into(),
            });
        }
    }
    let mut reader = serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(&mut reader).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            invalid(inner.to_string())
        } else {
            invalid(format!("{path}: {inner}"))
        }
    })
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Input {
        reason: String,
        #[serde(default)]
        preempt: bool,
    }

    impl JsonInput for Input {
        const NAME: &'static str = "test body";
        const FIELDS: &'static [&'static str] = &["reason", "preempt"];
        const REQUIRES_REASON: bool = true;
    }

    fn refusal(body: &str) -> (&'static str, String) {
        match parse_json::<Input>(body.as_bytes()) {
            Ok(v) => panic!("{body} was read as {v:?}"),
            Err(ApiError::BadRequest { code, message }) => (code, message),
            Err(ApiError::Unprocessable { code, message }) => (code, message),
            Err(other) => panic!("{body}: unexpected {other:?}"),
        }
    }

    #[test]
    fn each_fault_gets_its_code_and_a_message_that_says_where() {
        let cases = [
            ("{\"reason\": ", "invalid_body", "test body: EOF while parsing a value at line 1 column 11 (fields: reason, preempt)"),
            ("[1]", "invalid_body", "test body: must be a JSON object (fields: reason, preempt)"),
            ("{\"reason\": \"x\", \"force\": true}", "unknown_field", "force: unknown field (expected one of: reason, preempt)"),
            ("{\"zeal\": 1, \"reason\": \"x\", \"force\": true}", "unknown_field", "zeal, force: unknown fields (expected one of: reason, preempt)"),
            ("{}", "missing_reason", "reason: must say why (it is kept in the audit trail)"),
            ("{\"reason\": \" \"}", "missing_reason", "reason: must say why"),
            ("{\"reason\": null}", "missing_reason", "reason: must say why"),
            ("{\"reason\": \"x\",\n \"preempt\": \"yes\"}", "invalid_body", "test body: preempt: invalid type: string \"yes\", expected a boolean at line 2 column 17"),
            ("{\"reason\": 7}", "invalid_body", "test body: reason: invalid type: integer `7`, expected a string at line 1 column 12"),
        ];
        for (body, want_code, want_message) in cases {
            let (code, message) = refusal(body);
            assert_eq!(code, want_code, "{body}: {message}");
            assert!(message.starts_with(want_message), "{body}: {message}");
        }
    }

    #[test]
    fn a_good_body_is_read_with_its_defaults() {
        let read: Input =
            parse_json(json!({"reason": "why"}).to_string().as_bytes()).expect("read");
        assert_eq!(
            read,
            Input {
                reason: "why".into(),
                preempt: false
            }
        );
    }
}
