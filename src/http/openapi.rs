//! `GET /openapi.json`: the hand-maintained OpenAPI 3.1 document (`docs/openapi.yaml`), served
//! as JSON. Hand-written rather than generated (utoipa) to keep the build lean; the test
//! `tests/it/openapi.rs` keeps it honest: every route of `src/http/` is documented, and every
//! documented path and method is routed.

use std::sync::LazyLock;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::{ApiError, AppState};

/// The document as written (YAML).
pub const OPENAPI_YAML: &str = include_str!("../../docs/openapi.yaml");

/// The document as JSON, converted once.
static OPENAPI_JSON: LazyLock<Result<String, String>> = LazyLock::new(|| {
    let value: serde_json::Value =
        serde_yaml::from_str(OPENAPI_YAML).map_err(|e| format!("docs/openapi.yaml: {e}"))?;
    serde_json::to_string_pretty(&value).map_err(|e| e.to_string())
});

pub(super) fn router() -> Router<AppState> {
    Router::new().route("/openapi.json", get(get_openapi))
}

async fn get_openapi() -> Result<Response, ApiError> {
    let json = OPENAPI_JSON
        .as_ref()
        .map_err(|e| ApiError::Internal(e.clone()))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], json.clone()).into_response())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_openapi_document_parses_and_is_version_3_1() {
        let json = super::OPENAPI_JSON
            .as_ref()
            .expect("docs/openapi.yaml parses");
        let value: serde_json::Value = serde_json::from_str(json).expect("valid JSON");
        assert_eq!(value["openapi"], "3.1.0");
    }
}
