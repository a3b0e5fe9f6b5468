//! The proxy's view of the replica (issue: read out like the seeds): a soak watching
//! `proxy-glm53`'s log counts its new lines that name the target (`Backend marked unhealthy`),
//! fails above its `max` with the lines and their times in evidence, ignores lines printed
//! before the soak and lines naming another replica, and reads that log before the first touch.

use serde_json::json;

use crate::helpers::{canary_with, sim_config, TestApp, TestOptions, R1, R2};

const PROXY: &str = "proxy-glm53";
const SOAK: &str = r#"  - {name: soak, kind: soak, duration: 300ms, interval: 50ms, max_misses: 3, forbid: ["[event-loop-stall]", "CUDA error"]}"#;

async fn app(max: u32) -> TestApp {
    let watched = format!(
        r#"  - {{name: soak, kind: soak, duration: 2s, interval: 50ms, max_misses: 3, forbid: ["CUDA error"], watch: {{service: {PROXY}, patterns: ["Backend marked unhealthy"], max: {max}}}}}"#
    );
    let opts = TestOptions {
        runbooks: Some(canary_with(&[(SOAK, watched.as_str())])),
        ..TestOptions::default()
    };
    TestApp::spawn_custom(sim_config(), opts).await
}

#[tokio::test]
async fn a_proxy_transition_naming_the_canary_during_the_soak_fails_it_with_the_lines_kept() {
    let app = app(0).await;
    let faults = app.sim.faults();
    // Before the soak (r2 is taken down and comes back): not counted.
    faults.emit_log_line(
        PROXY,
        &format!("2026-12-06T05:00:00Z Backend marked unhealthy: {R2}"),
    );
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    app.wait_step(&id, "soak", "running").await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    faults.emit_log_line(
        PROXY,
        &format!("2026-12-06T05:10:00Z Backend marked unhealthy: {R1}"),
    );
    let line = format!("2026-12-06T05:10:01Z Backend marked unhealthy: {R2} (3 misses)");
    faults.emit_log_line(PROXY, &line);
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "failed", "{r:#?}");
    let error = r.error.clone().expect("an error");
    assert_eq!(error.code, "companion_log_limit", "{error:?}");
    assert!(
        error.message.contains(PROXY) && error.message.contains("(3 misses)"),
        "{}",
        error.message
    );
    let soak = r.steps.iter().find(|s| s.name == "soak").expect("soak");
    let seen = &soak.detail["companion"];
    assert_eq!(seen["count"], 1, "{seen:#}");
    assert_eq!(seen["service"], PROXY);
    let kept = seen["lines"][0]["line"].as_str().unwrap_or_default();
    assert!(kept.ends_with(&line), "{seen:#}");
    assert!(
        seen["lines"][0]["at"].is_string(),
        "kept with its time: {seen:#}"
    );
}

#[tokio::test]
async fn a_quiet_proxy_passes_the_soak_and_its_log_is_read_before_the_down() {
    let app = app(0).await;
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let soak = r.steps.iter().find(|s| s.name == "soak").expect("soak");
    assert_eq!(soak.detail["companion"]["count"], 0, "{:#}", soak.detail);
    let down = r.steps.iter().find(|s| s.name == "down").expect("down");
    let sources = down.detail["signals"]["sources"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        sources
            .iter()
            .any(|s| s["source"] == "logs" && s["service"] == json!(PROXY) && s["ok"] == true),
        "the proxy's log was read before the first touch: {sources:#?}"
    );
}

#[tokio::test]
async fn a_stall_block_is_kept_whole_with_the_proxys_lines_around_it() {
    let watched = format!(
        r#"  - {{name: soak, kind: soak, duration: 3s, interval: 50ms, max_misses: 3, forbid: ["[event-loop-stall]"], watch: {{service: {PROXY}, patterns: ["Backend marked unhealthy"], max: 5}}}}"#
    );
    let opts = TestOptions {
        runbooks: Some(canary_with(&[(SOAK, watched.as_str())])),
        ..TestOptions::default()
    };
    let app = TestApp::spawn_custom(sim_config(), opts).await;
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    app.wait_step(&id, "soak", "running").await;
    let faults = app.sim.faults();
    let proxy_line = format!("2026-12-06T05:10:01Z Backend marked unhealthy: {R2} (3 misses)");
    faults.emit_log_line(PROXY, &proxy_line);
    faults.emit_stall_block(R2);
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "failed", "{r:#?}");
    assert_eq!(
        r.error.as_ref().map(|e| e.code.as_str()),
        Some("forbidden_log_line")
    );
    let soak = r.steps.iter().find(|s| s.name == "soak").expect("soak");
    let forbidden = &soak.detail["forbidden"];
    let block: Vec<&str> = forbidden["block"]
        .as_array()
        .map(|b| b.iter().filter_map(|l| l.as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        block.len(),
        5,
        "the stamped line and its four stack lines: {forbidden:#}"
    );
    assert!(block[0].contains("[event-loop-stall]") && block[1].starts_with("Thread 0x7f3a"));
    assert!(block[4].contains("threading.py"), "{forbidden:#}");
    let around = forbidden["companion_lines"].to_string();
    assert!(
        around.contains("(3 misses)"),
        "the proxy's transition kept with it: {forbidden:#}"
    );
}

#[tokio::test]
async fn a_proxy_that_ejects_the_canary_now_and_then_fails_the_soak() {
    let app = app(0).await;
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    app.wait_step(&id, "soak", "running").await;
    let every = std::time::Duration::from_millis(200);
    app.sim.faults().set_proxy_flap(PROXY, R2, Some(every));
    let r = app.wait_terminal(&id).await;
    app.sim.faults().set_proxy_flap(PROXY, R2, None);
    assert_eq!(
        r.error.map(|e| e.code).as_deref(),
        Some("companion_log_limit")
    );
}

#[tokio::test]
async fn an_analysis_watching_the_proxy_counts_only_past_its_warmup() {
    let analysis = format!(
        "  - name: analysis\n    kind: analyze\n    warmup: 1s\n    duration: 1500ms\n    interval: 100ms\n    watch: {{service: {PROXY}, patterns: [\"Backend marked unhealthy\"], max: 0}}\n    checks:\n      - {{name: took_traffic, counter: \"sglang:num_requests_total\", min: 1}}\n"
    );
    let soak_and_analysis = format!("{SOAK}\n{analysis}");
    let opts = TestOptions {
        runbooks: Some(canary_with(&[(SOAK, soak_and_analysis.trim_end())])),
        ..TestOptions::default()
    };
    let app = TestApp::spawn_custom(sim_config(), opts).await;
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    app.wait_step(&id, "analysis", "running").await;
    let faults = app.sim.faults();
    // During the warm-up: not counted.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    faults.emit_log_line(PROXY, &format!("warm Backend marked unhealthy: {R2}"));
    // Past it: counted, and the analysis fails.
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    faults.emit_log_line(PROXY, &format!("judged Backend marked unhealthy: {R2}"));
    let r = app.wait_terminal(&id).await;
    assert_eq!(
        r.error.as_ref().map(|e| e.code.as_str()),
        Some("companion_log_limit"),
        "{r:#?}"
    );
    let step = r
        .steps
        .iter()
        .find(|s| s.name == "analysis")
        .expect("analysis");
    let lines = &step.detail["companion"];
    assert_eq!(lines["count"], 1, "{lines:#}");
    assert!(
        lines["lines"][0]["line"]
            .as_str()
            .is_some_and(|l| l.contains("judged")),
        "{lines:#}"
    );
}
