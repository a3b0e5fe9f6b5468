//! `GET /`: the dashboard, one static HTML page with vanilla JavaScript (no build step). It
//! calls the API with a token kept in the browser's localStorage; serving it needs no token.

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use super::AppState;

const DASHBOARD_HTML: &str = include_str!("dashboard.html");

pub(super) fn router() -> Router<AppState> {
    Router::new().route("/", get(get_dashboard))
}

async fn get_dashboard() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        DASHBOARD_HTML,
    )
}

#[cfg(test)]
mod tests {
    use super::DASHBOARD_HTML;
    use crate::domain::runbook::StepKind;

    /// A step's text comes from its kind through the API's `summary`: the page has no branch
    /// per kind, so a new kind needs no change here.
    #[test]
    fn the_page_names_no_step_kind() {
        for kind in StepKind::NAMES {
            for quoted in [format!("\"{kind}\""), format!("'{kind}'")] {
                assert!(!DASHBOARD_HTML.contains(&quoted), "{quoted}");
            }
        }
        assert!(DASHBOARD_HTML.contains("s.summary"));
    }
}
