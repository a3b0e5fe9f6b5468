//! The pages behind the dashboard: `GET /rollouts/{id}`, one rollout (its header, its steps
//! on a timeline drawn to scale with their evidence, each analysis check as a chart, its
//! audit events; live while it runs), and `GET /replicas/{host}/{service}`, one replica's
//! deployments with its rollback. Static HTML with its script and style sheet, like the
//! dashboard: the data comes from the API with the token kept in the browser, nothing is
//! inline, and the dashboard's `Content-Security-Policy` applies. `GET /oncall_hints.json`
//! is on-call's failure table (docs/oncall.md, "Reading a failure"), code by code, for the
//! hint under a failed rollout's error.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use super::dashboard::{file, POLICY};
use super::AppState;

const ROLLOUT_HTML: &str = include_str!("rollout_page.html");
const ROLLOUT_JS: &str = include_str!("rollout_page.js");
const REPLICA_HTML: &str = include_str!("replica_page.html");
const REPLICA_JS: &str = include_str!("replica_page.js");
const PAGE_CSS: &str = include_str!("page.css");
const ONCALL: &str = include_str!("../../docs/oncall.md");

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/rollouts/{id}", get(|| file(HTML, ROLLOUT_HTML)))
        .route(
            "/replicas/{host}/{service}",
            get(|| file(HTML, REPLICA_HTML)),
        )
        .route("/rollout_page.js", get(|| file(JS, ROLLOUT_JS)))
        .route("/replica_page.js", get(|| file(JS, REPLICA_JS)))
        .route(
            "/page.css",
            get(|| file("text/css; charset=utf-8", PAGE_CSS)),
        )
        .route("/oncall_hints.json", get(oncall_hints))
}

static HINTS: LazyLock<String> =
    LazyLock::new(|| serde_json::to_string(&hints(ONCALL)).unwrap_or_else(|_| "{}".to_owned()));

async fn oncall_hints() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::CONTENT_SECURITY_POLICY, POLICY),
        ],
        HINTS.as_str(),
    )
}

/// Each code of the failure table under "## Reading a failure": `what happened — what to
/// check`, in plain text: markdown's backticks dropped, and its stars (emphasis) outside code
/// spans, so that `detail.replicas.*.last_error` keeps its star.
fn hints(doc: &str) -> BTreeMap<String, String> {
    let plain = |s: &str| {
        s.split('`')
            .enumerate()
            .map(|(i, part)| {
                if i % 2 == 1 {
                    part.to_owned()
                } else {
                    part.replace('*', "")
                }
            })
            .collect::<String>()
            .trim()
            .to_owned()
    };
    let mut out = BTreeMap::new();
    let Some(start) = doc.find("## Reading a failure") else {
        return out;
    };
    let section = &doc[start..];
    let section = section[3..]
        .find("\n## ")
        .map_or(section, |end| &section[..end + 3]);
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
        let [codes, happened, check] = cells[..] else {
            continue;
        };
        let hint = format!("{} — check: {}", plain(happened), plain(check));
        for code in codes.split(',').map(plain).filter(|c| !c.is_empty()) {
            out.insert(code, hint.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::runbook::StepKind;

    #[test]
    fn every_code_of_the_failure_table_has_its_hint() {
        let h = hints(ONCALL);
        assert!(h.len() >= 20, "{h:?}");
        let analysis = &h["analysis_failed"];
        assert!(analysis.contains("peers' median"), "{analysis}");
        assert!(!analysis.contains('`'), "{analysis}");
        assert!(h.contains_key("dry_run_failed"), "a row of several codes");
        let all: String = h.values().cloned().collect();
        assert!(!all.contains("**"), "no markdown emphasis is left");
        assert!(
            !all.contains("replicas.."),
            "no star lost inside a code span"
        );
        assert!(
            h.values()
                .any(|v| v.contains("detail.replicas.*.last_error")),
            "{h:#?}"
        );
    }

    /// A step's evidence is drawn from its shape, not its kind: a new kind needs no change.
    #[test]
    fn the_pages_name_no_step_kind() {
        for kind in StepKind::NAMES {
            for quoted in [format!("\"{kind}\""), format!("'{kind}'")] {
                for text in [ROLLOUT_JS, ROLLOUT_HTML, REPLICA_JS, REPLICA_HTML] {
                    assert!(!text.contains(&quoted), "{quoted}");
                }
            }
        }
    }

    /// The policy allows no inline script or style: the pages have none.
    #[test]
    fn the_pages_have_no_inline_script_style_or_handler() {
        for html in [ROLLOUT_HTML, REPLICA_HTML] {
            assert!(!html.contains("<script>"));
            assert!(!html.contains("<style"));
            assert!(!html.contains(" style="));
            assert!(!html.contains(" onclick="));
        }
        let common = include_str!("common.js");
        for js in [ROLLOUT_JS, REPLICA_JS, common] {
            assert!(!js.contains("innerHTML"), "DOM calls only");
            assert!(!js.contains("setAttribute(\"style\""), "no inline style");
        }
    }
}
