//! Hostile clients against the running daemon without tokens (dev mode): each refusal is a
//! clear 4xx, nothing is created and nothing is sent to the host.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::TestApp;

/// A request the way a browser or a script would send it; (status, body).
async fn send(
    app: &TestApp,
    build: impl FnOnce(reqwest::Client, &str) -> reqwest::RequestBuilder,
) -> (u16, Value) {
    let res = build(reqwest::Client::new(), &app.url)
        .send()
        .await
        .expect("the daemon answers");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

/// Nothing was created and nothing was sent to the host.
async fn nothing_happened(app: &TestApp) {
    let (status, list) = send(app, |c, url| c.get(format!("{url}/v1/rollouts"))).await;
    assert_eq!(status, 200);
    assert_eq!(list["items"].as_array().map(Vec::len), Some(0), "{list}");
    assert!(app.compose_calls().is_empty(), "nothing sent to the host");
}

fn plan_text() -> String {
    TestApp::plan("v0.0.452").to_string()
}

#[tokio::test]
async fn a_cross_site_post_without_a_json_media_type_or_from_another_origin_starts_nothing() {
    let app = TestApp::spawn().await;
    // `fetch(url, {method: "POST", mode: "no-cors", body})` sends text/plain, or no type at all.
    type Build = Box<dyn Fn(reqwest::Client, &str) -> reqwest::RequestBuilder>;
    let cases: Vec<(&str, Build, u16, &str)> = vec![
        (
            "no Content-Type",
            Box::new(|c, url| c.post(format!("{url}/v1/rollouts")).body(plan_text())),
            415,
            "unsupported_media_type",
        ),
        (
            "text/plain",
            Box::new(|c, url| {
                c.post(format!("{url}/v1/rollouts"))
                    .header("content-type", "text/plain")
                    .body(plan_text())
            }),
            415,
            "unsupported_media_type",
        ),
        (
            "a form",
            Box::new(|c, url| {
                c.post(format!("{url}/v1/rollbacks"))
                    .header("content-type", "application/x-www-form-urlencoded")
                    .body("host=gpu02")
            }),
            415,
            "unsupported_media_type",
        ),
        (
            "a rollback without a type",
            Box::new(|c, url| {
                c.post(format!("{url}/v1/rollbacks"))
                    .body(r#"{"host":"gpu02","service":"x","reason":"r"}"#)
            }),
            415,
            "unsupported_media_type",
        ),
        (
            "another Origin",
            Box::new(|c, url| {
                c.post(format!("{url}/v1/rollouts"))
                    .header("origin", "http://evil.example")
                    .json(&TestApp::plan("v0.0.452"))
            }),
            403,
            "forbidden",
        ),
        (
            "a null Origin",
            Box::new(|c, url| {
                c.post(format!("{url}/v1/rollouts"))
                    .header("origin", "null")
                    .json(&TestApp::plan("v0.0.452"))
            }),
            403,
            "forbidden",
        ),
        (
            "a cross-site fetch",
            Box::new(|c, url| {
                c.post(format!("{url}/v1/rollouts"))
                    .header("sec-fetch-site", "cross-site")
                    .json(&TestApp::plan("v0.0.452"))
            }),
            403,
            "forbidden",
        ),
        (
            "another port on localhost",
            Box::new(|c, url| {
                c.post(format!("{url}/v1/rollouts"))
                    .header("origin", "http://localhost:3000")
                    .json(&TestApp::plan("v0.0.452"))
            }),
            403,
            "forbidden",
        ),
    ];
    for (case, build, want_status, want_code) in cases {
        let (status, body) = send(&app, build).await;
        assert_eq!(status, want_status, "{case}: {body}");
        assert_eq!(body["error"]["code"], want_code, "{case}: {body}");
    }
    nothing_happened(&app).await;
    // The daemon's own page (same Origin) still works.
    let own = app.url.clone();
    let (status, body) = send(&app, |c, url| {
        c.post(format!("{url}/v1/rollouts"))
            .header("origin", own)
            .header("sec-fetch-site", "same-origin")
            .json(&TestApp::plan("v0.0.452"))
    })
    .await;
    assert_eq!(status, 201, "{body}");
}

#[tokio::test]
async fn a_rebound_host_name_is_refused_421_without_tokens() {
    let app = TestApp::spawn().await;
    let port = app.url.rsplit(':').next().expect("port").to_owned();
    for host in [format!("evil.example:{port}"), "evil.example".to_owned()] {
        let (status, body) = send(&app, |c, url| {
            c.get(format!("{url}/v1/rollouts"))
                .header("host", host.clone())
        })
        .await;
        assert_eq!(status, 421, "{host}: {body}");
        assert_eq!(body["error"]["code"], "misdirected_host");
    }
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        let (status, body) = send(&app, |c, url| {
            c.get(format!("{url}/v1/rollouts"))
                .header("host", host.clone())
        })
        .await;
        assert_eq!(status, 200, "{host}: {body}");
    }
}

/// `..` in every spelling a URL parser or a shell would resolve, an absolute path, a
/// backslash, NUL and control characters: refused 422 `invalid_file` by plans and releases,
/// nothing created, nothing sent (safety rule 24).
pub(crate) const HOSTILE_FILES: &[&str] = &[
    "prod/%2e%2e/%2e%2e/%2e%2e/%2e%2e/attacker/repo/main/evil.yaml",
    "prod/%2E%2E/evil.yaml",
    "prod/%252e%252e/evil.yaml",
    "prod/.%2e/evil.yaml",
    "prod%2f..%2fevil.yaml",
    "prod/%2fetc/passwd.yaml",
    "prod/..\\evil.yaml",
    "prod\\..\\evil.yaml",
    "prod/\u{ff0e}\u{ff0e}/evil.yaml",
    "prod/../evil.yaml",
    "prod/x/../../evil.yaml",
    "/etc/passwd.yaml",
    "~/prod/evil.yaml",
    "prod/evil\u{0}.yaml",
    "prod/evil\n.yaml",
    "prod/evil\t.yaml",
];

#[tokio::test]
async fn a_file_with_dots_in_any_spelling_is_refused_422_by_plans_and_releases() {
    let app = TestApp::spawn().await;
    for file in HOSTILE_FILES {
        let mut plan = TestApp::plan("v0.0.452");
        plan["file"] = json!(file);
        let (status, body) = app.post_plan(&plan).await;
        assert_eq!(status, 422, "{file:?}: {body}");
        assert_eq!(body["error"]["code"], "invalid_file", "{file:?}: {body}");
        let release = json!({"file": file, "tag": "v0.0.452", "reason": "r",
            "targets": [{"host": "gpu02", "service": crate::helpers::R2}]});
        let (status, body) = app.post("/v1/releases", &release).await;
        assert_eq!(status, 422, "release {file:?}: {body}");
        assert!(
            body["error"]["code"] == "invalid_file"
                || body["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("(invalid_file)")),
            "release {file:?}: {body}"
        );
    }
    let (_, releases) = send(&app, |c, url| c.get(format!("{url}/v1/releases"))).await;
    assert_eq!(
        releases["items"].as_array().map(Vec::len),
        Some(0),
        "{releases}"
    );
    nothing_happened(&app).await;
}

/// Tags that break the one tag rule (`domain::names::Tag`): every entry point refuses each.
const BAD_TAGS: [&str; 9] = [
    "../../etc/passwd",
    "..",
    "a//b",
    "x.lock",
    "v@{1}",
    "/v1",
    "-v1",
    "v1;rm -rf",
    "v1.",
];

/// `canaryd <args>` against a daemon that is never reached: (exit code, stderr).
fn cli(args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_canaryd"))
        .args(args)
        .args(["--server", "http://127.0.0.1:9"])
        .env_remove("CANARYD_TOKEN")
        .output()
        .expect("the CLI runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn one_table_of_bad_tags_is_refused_alike_by_plan_release_rollback_and_the_cli() {
    let app = TestApp::spawn().await;
    let long = "v".repeat(60_000);
    for tag in BAD_TAGS.iter().copied().chain([long.as_str()]) {
        let shown = &tag[..tag.len().min(20)];
        let (status, body) = app.post_plan(&TestApp::plan(tag)).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (422, Some("invalid_tag")),
            "plan {shown}: {body}"
        );
        let release = json!({"file": "prod/GLM-5.3-Flash-SGL-TP4-W4AFP8-LongContext.yaml",
            "tag": tag, "reason": "r", "targets": [{"host": "gpu02", "service": crate::helpers::R2}]});
        let (status, body) = app.post("/v1/releases", &release).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (422, Some("invalid_tag")),
            "release {shown}: {body}"
        );
        let rollback =
            json!({"host": "gpu02", "service": crate::helpers::R2, "reason": "r", "to_tag": tag});
        let (status, body) = app.post("/v1/rollbacks", &rollback).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (422, Some("invalid_tag")),
            "rollback {shown}: {body}"
        );
    }
    nothing_happened(&app).await;
    // The CLI refuses each before it calls anything: a usage error naming the flag.
    for bad in BAD_TAGS {
        // `--tag=-v1`: a value that starts with `-` is still the flag's.
        let (tag, to_tag) = (format!("--tag={bad}"), format!("--to-tag={bad}"));
        let start = [
            "rollout",
            "start",
            "--host",
            "gpu02",
            "--service",
            crate::helpers::R2,
            "--file",
            "prod/a.yaml",
            "--reason",
            "r",
            &tag,
        ];
        let rollback = [
            "rollback",
            "--host",
            "gpu02",
            "--service",
            crate::helpers::R2,
            "--reason",
            "r",
            &to_tag,
        ];
        let release = [
            "release",
            "start",
            "--file",
            "prod/a.yaml",
            "--reason",
            "r",
            &tag,
        ];
        for (args, flag) in [
            (&start[..], "--tag"),
            (&rollback[..], "--to-tag"),
            (&release[..], "--tag"),
        ] {
            let (code, stderr) = cli(args);
            assert_eq!(code, Some(2), "{args:?}: {stderr}");
            assert!(
                stderr.contains(flag) && stderr.contains("invalid value"),
                "{args:?}: {stderr}"
            );
        }
    }
    // A valid tag passes the CLI's check (and fails only on the unreachable daemon).
    let (code, stderr) = cli(&[
        "rollback",
        "--host",
        "gpu02",
        "--service",
        crate::helpers::R2,
        "--reason",
        "r",
        "--to-tag",
        "v0.0.452",
    ]);
    assert_ne!(code, Some(2), "{stderr}");
}

#[tokio::test]
async fn a_json_key_given_twice_is_refused_422() {
    let app = TestApp::spawn().await;
    let twice = r#"{"host": "gpu02", "file": "prod/GLM-5.3-Flash-SGL-TP4-W4AFP8-LongContext.yaml",
        "service": "model-sg-glm53-w4afp8-tp4-r2", "tag": "v0.0.452", "reason": "r",
        "env": {"GLM53_R2_HICACHE_RAM_BUDGET": "1GiB", "GLM53_R2_HICACHE_RAM_BUDGET": "406GiB"}}"#;
    let (status, body) = send(&app, |c, url| {
        c.post(format!("{url}/v1/rollouts"))
            .header("content-type", "application/json")
            .body(twice)
    })
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "invalid_env");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("env.GLM53_R2_HICACHE_RAM_BUDGET: given twice")),
        "{body}"
    );
    nothing_happened(&app).await;
}

#[tokio::test]
async fn the_dashboard_cannot_be_framed_and_runs_only_the_daemons_own_scripts() {
    let app = TestApp::spawn().await;
    for path in ["/", "/dashboard.js", "/v1/rollouts"] {
        let res = reqwest::get(format!("{}{path}", app.url))
            .await
            .expect("answers");
        assert_eq!(res.status().as_u16(), 200, "{path}");
        let h = res.headers();
        let get = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
        assert_eq!(get("x-frame-options"), "DENY", "{path}");
        assert_eq!(get("x-content-type-options"), "nosniff", "{path}");
        assert!(
            get("content-security-policy").contains("frame-ancestors 'none'"),
            "{path}"
        );
        if path == "/" {
            let csp = get("content-security-policy");
            assert!(csp.contains("default-src 'self'"), "{csp}");
            assert!(!csp.contains("unsafe-inline"), "{csp}");
        }
    }
}

/// `Content-Length: 1073741824` and no body: refused 413 from the header, not after the body
/// read timeout (here 60 s; the answer is awaited 10 s at most).
#[tokio::test]
async fn a_body_that_only_claims_to_be_huge_is_refused_413_from_its_header() {
    let opts = crate::helpers::TestOptions {
        http: Some(canaryd::config::HttpTuning {
            body_read_timeout: Duration::from_secs(60),
            ..Default::default()
        }),
        ..Default::default()
    };
    let app = TestApp::spawn_custom(crate::helpers::sim_config(), opts).await;
    let addr = app.url.trim_start_matches("http://").to_owned();
    let mut conn = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connects");
    let head = format!(
        "POST /v1/rollouts HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: 1073741824\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.expect("head sent");
    let mut answer = vec![0u8; 512];
    let read = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut answer)).await;
    let n = read.expect("answered without the body").expect("read");
    let text = String::from_utf8_lossy(&answer[..n]);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    nothing_happened(&app).await;
}
