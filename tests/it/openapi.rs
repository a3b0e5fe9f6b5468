//! `/openapi.json` cannot drift from the router: every `.route(...)` in `src/http/` is
//! documented with its methods, and every documented path and method reaches a handler.

use std::collections::BTreeSet;

use serde_json::Value;

use canaryd::http::ERROR_CODES;
use regex::Regex;

use crate::helpers::{TestApp, HOST, R2};

const METHODS: [&str; 5] = ["get", "post", "put", "delete", "patch"];

/// (method, path) of every `.route("path", get(..).post(..))` call in `src/http/*.rs`.
fn routes_in_source() -> BTreeSet<(String, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/http");
    let mut routes = BTreeSet::new();
    let entries = std::fs::read_dir(&dir).expect("src/http is readable");
    for entry in entries {
        let path = entry.expect("dir entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("source readable");
        for (start, _) in text.match_indices(".route(") {
            let call = balanced_call(&text[start + ".route".len()..]);
            let route_path = call
                .split('"')
                .nth(1)
                .unwrap_or_else(|| panic!("{}: route without a path: {call}", path.display()));
            let after_path = &call[call.find(route_path).unwrap_or(0) + route_path.len()..];
            let mut found = false;
            for m in METHODS {
                let needle = format!("{m}(");
                let called = after_path.match_indices(&needle).any(|(i, _)| {
                    let before = if i == 0 {
                        b' '
                    } else {
                        after_path.as_bytes()[i - 1]
                    };
                    !(before.is_ascii_alphanumeric() || before == b'_')
                });
                if called {
                    routes.insert((m.to_owned(), route_path.to_owned()));
                    found = true;
                }
            }
            assert!(found, "{}: no method in {call}", path.display());
        }
    }
    routes
}

/// The text of a parenthesised call starting at `s[0] == '('`, parentheses balanced.
fn balanced_call(s: &str) -> &str {
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return &s[..=i];
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced route call: {s}");
}

fn routes_in_document(doc: &Value) -> BTreeSet<(String, String)> {
    let paths = doc["paths"].as_object().expect("paths is an object");
    let mut routes = BTreeSet::new();
    for (path, item) in paths {
        let item = item.as_object().expect("path item is an object");
        for m in METHODS {
            if item.contains_key(m) {
                routes.insert((m.to_owned(), path.clone()));
            }
        }
    }
    routes
}

async fn served_document(app: &TestApp) -> Value {
    let res = reqwest::get(format!("{}/openapi.json", app.url))
        .await
        .expect("openapi.json answers");
    assert_eq!(res.status(), 200);
    let content_type = res.headers()["content-type"].to_str().expect("ascii");
    assert!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    res.json().await.expect("openapi.json is JSON")
}

#[tokio::test]
async fn the_openapi_document_lists_exactly_the_routes_of_the_router() {
    let app = TestApp::spawn().await;
    let doc = served_document(&app).await;
    assert_eq!(doc["openapi"], "3.1.0");
    let in_source = routes_in_source();
    let documented = routes_in_document(&doc);
    assert!(
        in_source.len() >= 10,
        "the source scan found too few routes: {in_source:?}"
    );
    let undocumented: Vec<_> = in_source.difference(&documented).collect();
    let unrouted: Vec<_> = documented.difference(&in_source).collect();
    assert!(
        undocumented.is_empty(),
        "routes missing from docs/openapi.yaml: {undocumented:?}"
    );
    assert!(
        unrouted.is_empty(),
        "documented but not routed: {unrouted:?}"
    );
    app.stop().await;
}

#[tokio::test]
async fn every_documented_operation_reaches_a_handler() {
    let app = TestApp::spawn().await;
    let doc = served_document(&app).await;
    let client = reqwest::Client::new();
    for (method, path) in routes_in_document(&doc) {
        let concrete = path
            .replace("{id}", "ro_00000000000000000000000000")
            .replace("{host}", HOST)
            .replace("{service}", R2);
        let url = format!("{}{concrete}", app.url);
        let req = match method.as_str() {
            "get" => client.get(&url),
            "post" => client.post(&url).json(&serde_json::json!({})),
            other => panic!("no probe for method {other}"),
        };
        let res = req.send().await.expect("daemon answers");
        let status = res.status().as_u16();
        assert_ne!(status, 405, "{method} {path} is documented but not routed");
        if status == 404 {
            // A handler's 404 names what is missing; the router's fallback is route_not_found.
            let body: Value = res.json().await.unwrap_or(Value::Null);
            let code = body["error"]["code"].as_str().unwrap_or("route_not_found");
            assert_ne!(
                code, "route_not_found",
                "{method} {path} is documented but not routed"
            );
        }
    }
    app.stop().await;
}

#[tokio::test]
async fn every_operation_has_an_id_and_every_reference_resolves() {
    let app = TestApp::spawn().await;
    let doc = served_document(&app).await;
    let mut ids = BTreeSet::new();
    for (method, path) in routes_in_document(&doc) {
        let op = &doc["paths"][&path][&method];
        let id = op["operationId"]
            .as_str()
            .unwrap_or_else(|| panic!("{method} {path} has no operationId"));
        assert!(ids.insert(id.to_owned()), "operationId {id} is used twice");
        assert!(
            op["responses"].is_object(),
            "{method} {path} has no responses"
        );
    }
    let text = doc.to_string();
    for (at, _) in text.match_indices("\"#/components/") {
        let rest = &text[at + 1..];
        let reference = &rest[..rest.find('"').expect("closing quote")];
        let mut node = &doc;
        for part in reference.trim_start_matches("#/").split('/') {
            node = &node[part];
        }
        assert!(!node.is_null(), "{reference} does not resolve");
    }
    app.stop().await;
}

/// Every error code literal in the code that answers the API: `ApiError`'s fixed codes, the
/// codes handlers pass, and the plan parser's codes; with their status where the source says
/// it (`ApiError::NotFound { code: "..." }` is a 404).
fn codes_in_source() -> (BTreeSet<String>, BTreeSet<(String, u16)>) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in [
        "src/http",
        "src/http/rollout",
        "src/domain",
        "src/domain/plan",
    ] {
        for entry in std::fs::read_dir(root.join(dir)).expect("source dir readable") {
            let path = entry.expect("dir entry").path();
            if path.extension().and_then(|e| e.to_str()) == Some("rs") {
                files.push(path);
            }
        }
    }
    let patterns = [
        r#"code:\s*"([a-z_]+)""#,
        r#"bad_request\(\s*"([a-z_]+)""#,
        r#"PlanError::new\(\s*"([a-z_]+)""#,
        r#"text\("[a-z_]+",\s*Some\("([a-z_]+)"\)"#,
        r#"StatusCode::[A-Z_]+,\s*"([a-z_]+)""#,
    ];
    let patterns: Vec<Regex> = patterns
        .iter()
        .map(|p| Regex::new(p).expect("pattern"))
        .collect();
    let with_status = [
        (r#"NotFound\s*\{\s*code:\s*"([a-z_]+)""#, 404),
        (r#"Unprocessable\s*\{\s*code:\s*"([a-z_]+)""#, 422),
        (r#"Conflict\s*\{\s*code:\s*"([a-z_]+)""#, 409),
        (r#"BadRequest\s*\{\s*code:\s*"([a-z_]+)""#, 400),
        (r#"bad_request\(\s*"([a-z_]+)""#, 400),
    ];
    let with_status: Vec<(Regex, u16)> = with_status
        .iter()
        .map(|(p, s)| (Regex::new(p).expect("pattern"), *s))
        .collect();
    let mut codes = BTreeSet::new();
    let mut pairs = BTreeSet::new();
    for path in files {
        let text = std::fs::read_to_string(&path).expect("source readable");
        // Unit tests build sample errors; only the code that runs counts.
        let text = text.split("#[cfg(test)]").next().unwrap_or("");
        for re in &patterns {
            for cap in re.captures_iter(text) {
                codes.insert(cap[1].to_owned());
            }
        }
        for (re, status) in &with_status {
            for cap in re.captures_iter(text) {
                pairs.insert((cap[1].to_owned(), *status));
            }
        }
    }
    (codes, pairs)
}

/// (code, status) pairs from the `Error` schema: its `enum`, and its description's
/// `NNN: code, code; ...` table.
fn codes_in_document(doc: &Value) -> (BTreeSet<String>, BTreeSet<(String, u16)>) {
    let code = &doc["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"];
    let listed = code["enum"]
        .as_array()
        .expect("the Error schema's code has an enum")
        .iter()
        .map(|c| c.as_str().expect("a string").to_owned())
        .collect();
    let description = code["description"].as_str().expect("a description");
    let mut pairs = BTreeSet::new();
    let table = Regex::new(r"(\d{3}): ([a-z_, ]+)").expect("pattern");
    for cap in table.captures_iter(description) {
        let status: u16 = cap[1].parse().expect("a status");
        for c in cap[2].split(',') {
            pairs.insert((c.trim().to_owned(), status));
        }
    }
    (listed, pairs)
}

#[tokio::test]
async fn every_error_code_the_api_answers_is_documented_with_its_status_and_no_other() {
    let app = TestApp::spawn().await;
    let doc = served_document(&app).await;
    app.stop().await;
    let known: BTreeSet<String> = ERROR_CODES.iter().map(|(c, _)| (*c).to_owned()).collect();
    let (in_source, statuses) = codes_in_source();
    assert!(
        in_source.len() >= 20,
        "the scan found too few: {in_source:?}"
    );
    let unlisted: Vec<_> = in_source.difference(&known).collect();
    assert!(
        unlisted.is_empty(),
        "codes answered but missing from ApiError's ERROR_CODES: {unlisted:?}"
    );
    let listed: BTreeSet<(String, u16)> = ERROR_CODES
        .iter()
        .map(|(c, s)| ((*c).to_owned(), *s))
        .collect();
    let other_status: Vec<_> = statuses.difference(&listed).collect();
    assert!(
        other_status.is_empty(),
        "codes answered with another status than ERROR_CODES says: {other_status:?}"
    );
    let (documented, pairs) = codes_in_document(&doc);
    let undocumented: Vec<_> = known.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&known).collect();
    assert!(
        undocumented.is_empty(),
        "codes missing from docs/openapi.yaml: {undocumented:?}"
    );
    assert!(
        unknown.is_empty(),
        "documented codes the API never answers: {unknown:?}"
    );
    let expected: BTreeSet<(String, u16)> = ERROR_CODES
        .iter()
        .map(|(c, s)| ((*c).to_owned(), *s))
        .collect();
    assert_eq!(pairs, expected, "the documented status of each code");
    // Every status a code comes with is a documented response of some operation, or global.
    let text = doc["paths"].to_string();
    for (code, status) in ERROR_CODES {
        let global = matches!(status, 404 | 405 | 500);
        assert!(
            global || text.contains(&format!("\"{status}\"")),
            "{code}: no operation documents a {status} response"
        );
    }
}

/// A step kind added to the registration list is documented in the API's `Step.kind` enum.
#[tokio::test]
async fn the_documented_step_kinds_are_the_registered_ones() {
    let app = TestApp::spawn().await;
    let doc = served_document(&app).await;
    let documented: Vec<&str> = doc["components"]["schemas"]["Step"]["properties"]["kind"]["enum"]
        .as_array()
        .expect("Step.kind has an enum")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(documented, canaryd::domain::runbook::StepKind::NAMES);
}

/// The release event kinds the API documents are the stored ones, and a target's documented
/// states include those it ends in without a rollout.
#[tokio::test]
async fn the_documented_release_event_kinds_and_target_outcomes_are_the_stored_ones() {
    let app = TestApp::spawn().await;
    let doc = served_document(&app).await;
    let release = &doc["components"]["schemas"]["Release"]["properties"];
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .expect("an enum")
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect()
    };
    let kinds = strings(&release["events"]["items"]["properties"]["kind"]["enum"]);
    let stored: Vec<String> = canaryd::domain::release::ReleaseEventKind::ALL
        .iter()
        .map(|k| k.to_string())
        .collect();
    assert_eq!(kinds, stored);
    let states = strings(&release["targets"]["items"]["properties"]["state"]["enum"]);
    for outcome in canaryd::domain::release::TargetOutcome::ALL {
        assert!(
            states.contains(&outcome.to_string()),
            "{outcome} in {states:?}"
        );
    }
}
