//! The operator guide's canary-then-release flow, run as written: its `plan.yaml` and its
//! `release.yaml`, read from docs/operator-guide.md, against the dev host's names.

use canaryd::api::ReleaseOut;
use serde_json::{json, Value};

use crate::helpers::{TestApp, R1, R2};

/// The YAML block of the guide that starts with `first` (its first line), as JSON.
fn guide_block(first: &str) -> Value {
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/operator-guide.md"
    ))
    .expect("docs/operator-guide.md");
    let block = page
        .split("```yaml\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .find(|b| b.starts_with(first))
        .unwrap_or_else(|| panic!("the guide has a yaml block starting {first:?}"));
    serde_yaml::from_str(block).expect("the block is YAML")
}

async fn release(app: &TestApp, id: &str) -> ReleaseOut {
    let mut r = Value::Null;
    for _ in 0..600 {
        r = reqwest::get(format!("{}/v1/releases/{id}", app.url))
            .await
            .expect("answers")
            .json()
            .await
            .expect("json");
        if matches!(
            r["status"].as_str(),
            Some("succeeded" | "failed" | "aborted")
        ) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    serde_json::from_value(r).expect("release")
}

#[tokio::test]
async fn the_guides_canary_then_release_flow_works_as_written() {
    let app = TestApp::spawn().await;
    let plan = guide_block("host: gpu02");
    assert_eq!(plan["service"], R2, "the guide's plan is the dev host's r2");
    let canary = app.start_canary(&plan).await;
    let canary = app.wait_terminal(&canary).await;
    assert_eq!(canary.status, "succeeded", "{canary:#?}");

    let body = guide_block("# release.yaml");
    let (status, out) = app.post("/v1/releases", &body).await;
    assert_eq!(status, 201, "{out}");
    let r = release(&app, out["id"].as_str().expect("id")).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let outcome = |service: &str| {
        r.targets
            .iter()
            .find(|t| t.service == service)
            .map(|t| t.state.clone())
            .unwrap_or_default()
    };
    assert_eq!(outcome(R2), "already_current", "{r:#?}");
    assert_eq!(outcome(R1), "succeeded", "{r:#?}");
    app.stop().await;
}

/// The same release without the canary's `env`: r2 does not count as current, and the
/// refusal says what differs.
#[tokio::test]
async fn a_release_without_the_canarys_env_says_what_differs() {
    let app = TestApp::spawn().await;
    let plan = guide_block("host: gpu02");
    let canary = app.start_canary(&plan).await;
    assert_eq!(app.wait_terminal(&canary).await.status, "succeeded");
    let mut body = guide_block("# release.yaml");
    body.as_object_mut().expect("mapping").remove("env");
    body["on_failure"] = json!("halt");
    let (status, out) = app.post("/v1/releases", &body).await;
    assert_eq!(status, 201, "{out}");
    let r = release(&app, out["id"].as_str().expect("id")).await;
    assert_eq!(r.status, "failed", "{r:#?}");
    let rollout = r
        .targets
        .iter()
        .find(|t| t.service == R2)
        .and_then(|t| t.rollout_id.clone())
        .expect("r2 was rolled");
    let r2 = app.rollout(&rollout).await;
    let message = r2.error.map(|e| e.message).unwrap_or_default();
    assert!(
        message.contains(&format!(
            "{R2} runs v0.0.452 with overrides {{GLM53_R2_HICACHE_RAM_BUDGET}}; this rollout sets none"
        )),
        "{message}"
    );
    app.stop().await;
}
