//! `GET /`: the dashboard, one static HTML page with its script (`/dashboard.js`, after the
//! `/common.js` it shares with the rollout and replica pages) and style (`/dashboard.css`), vanilla JavaScript with no build step. It calls the API with a token
//! kept in the browser's localStorage; serving it needs no token. Nothing of it is inline, so
//! its `Content-Security-Policy` allows only the daemon's own files and no framing.

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use super::AppState;

const DASHBOARD_HTML: &str = include_str!("dashboard.html");
const DASHBOARD_JS: &str = include_str!("dashboard.js");
const DASHBOARD_CSS: &str = include_str!("dashboard.css");
/// What the dashboard and the rollout and replica pages share (token, API calls, DOM).
const COMMON_JS: &str = include_str!("common.js");

/// Scripts, styles and API calls from the daemon itself only; never in a frame.
pub(super) const POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
                      connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
                      form-action 'none'; frame-ancestors 'none'";

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/",
            get(|| file("text/html; charset=utf-8", DASHBOARD_HTML)),
        )
        .route(
            "/dashboard.js",
            get(|| file("text/javascript; charset=utf-8", DASHBOARD_JS)),
        )
        .route(
            "/common.js",
            get(|| file("text/javascript; charset=utf-8", COMMON_JS)),
        )
        .route(
            "/dashboard.css",
            get(|| file("text/css; charset=utf-8", DASHBOARD_CSS)),
        )
}

pub(super) async fn file(content_type: &'static str, text: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::CONTENT_SECURITY_POLICY, POLICY),
        ],
        text,
    )
}

#[cfg(test)]
mod tests {
    use super::{DASHBOARD_HTML, DASHBOARD_JS};
    use crate::domain::runbook::StepKind;

    /// A step's text comes from its kind through the API's `summary`: the page has no branch
    /// per kind, so a new kind needs no change here.
    #[test]
    fn the_page_names_no_step_kind() {
        for kind in StepKind::NAMES {
            for quoted in [format!("\"{kind}\""), format!("'{kind}'")] {
                assert!(!DASHBOARD_JS.contains(&quoted), "{quoted}");
                assert!(!DASHBOARD_HTML.contains(&quoted), "{quoted}");
            }
        }
        assert!(DASHBOARD_JS.contains("s.summary"));
    }

    /// Its policy allows no inline script or style: the page has none.
    #[test]
    fn the_page_has_no_inline_script_style_or_handler() {
        assert!(!DASHBOARD_HTML.contains("<script>"));
        assert!(!DASHBOARD_HTML.contains("<style"));
        assert!(!DASHBOARD_HTML.contains(" style="));
        assert!(!DASHBOARD_HTML.contains(" onclick="));
    }
}
