//! The image staged before the down (issue: prepared before the down): the `stage` step sends
//! one `materialize_only` up scoped to the target at the new tag while the old container
//! serves, before the down, so the up after the down pulls nothing; a server without
//! `materialize_only` is never sent one.

use std::time::Duration;

use crate::helpers::{canary_with, sim_config, TestApp, TestOptions, R2};

const PREFLIGHT: &str = "  - {name: preflight, kind: plan, allow: [model-downloader]}\n";

/// The compose calls the host received, as `(path, materialize_only, services)`.
fn compose_calls(app: &TestApp) -> Vec<(String, bool, Vec<String>)> {
    app.sim
        .calls()
        .into_iter()
        .filter(|c| c.path == "/compose/up" || c.path == "/compose/down")
        .map(|c| {
            let services = c.body["services"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            (c.path, c.body["materialize_only"] == true, services)
        })
        .collect()
}

#[tokio::test]
async fn a_canary_stages_the_targets_image_before_the_down_and_its_up_pulls_nothing() {
    let pull = Duration::from_secs(3);
    let stage = format!("{PREFLIGHT}  - {{name: stage, kind: stage, timeout: 20s}}\n");
    let opts = TestOptions {
        runbooks: Some(canary_with(&[(PREFLIGHT, stage.as_str())])),
        ..TestOptions::default()
    };
    let app = TestApp::spawn_custom(sim_config(), opts).await;
    app.sim.faults().set_pull_time(pull);
    let before = app.sim.containers();
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");

    let calls = compose_calls(&app);
    let staged: Vec<usize> = (0..calls.len()).filter(|i| calls[*i].1).collect();
    assert_eq!(staged.len(), 1, "one stage: {calls:?}");
    let down = calls
        .iter()
        .position(|c| c.0 == "/compose/down")
        .expect("a down");
    assert!(staged[0] < down, "staged before the down: {calls:?}");
    assert_eq!(calls[staged[0]].2, [R2], "scoped to the target alone");
    let body = &app
        .sim
        .calls()
        .into_iter()
        .find(|c| c.body["materialize_only"] == true)
        .expect("the stage's body")
        .body;
    assert_eq!(body["tag"], "v0.0.452", "at the new tag: {body}");
    assert!(body.get("dry_run").is_none(), "never a dry run too: {body}");

    let step = r.steps.iter().find(|s| s.kind == "stage").expect("stage");
    assert_eq!(step.status, "succeeded", "{step:#?}");
    assert_eq!(
        step.detail["staged"]["tag"], "v0.0.452",
        "{:#}",
        step.detail
    );
    // While the stage pulled, every container (r2's too) kept running as it was.
    let at_stage_end = step.finished_at.expect("ended");
    let down_sent = r
        .steps
        .iter()
        .find(|s| s.name == "down")
        .and_then(|s| s.started_at)
        .expect("down started");
    assert!(at_stage_end <= down_sent);
    let others: Vec<_> = before.iter().filter(|c| c.service != R2).collect();
    let after = app.sim.containers();
    for c in others {
        let now = after.iter().find(|a| a.service == c.service);
        assert_eq!(
            now.map(|a| &a.id),
            Some(&c.id),
            "{} kept its container",
            c.service
        );
    }
    // The image was on the host when the up ran: its part of the downtime is far below
    // the pull the stage took (the simulated host sleeps the whole pull for a missing image).
    let d = r.downtime.clone().expect("a downtime");
    let up_ms = d.parts.up_ms.expect("the up's part");
    assert!(
        up_ms < pull.as_millis() as i64,
        "the up pulled nothing ({up_ms} ms, a pull takes {pull:?}): {d:?}"
    );
    let pull_ms = d
        .parts
        .pull_ms
        .expect("the up's stream says when it pulled");
    assert!(pull_ms <= up_ms, "{d:?}");
}

#[tokio::test]
async fn without_a_stage_the_up_pulls_the_image_while_the_replica_is_out() {
    let pull = Duration::from_millis(700);
    let app = TestApp::spawn_with(sim_config()).await;
    // The new version's image is the slow one (the others on the host pull at once).
    app.sim
        .faults()
        .set_image_pull_time("lmsysorg/sglang:glm53-v452", pull);
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let d = r.downtime.clone().expect("a downtime");
    let up_ms = d.parts.up_ms.expect("the up's part");
    assert!(
        up_ms >= pull.as_millis() as i64,
        "the up pulled the new image after the down ({up_ms} ms): {d:?}"
    );
    // The pull is the part of the up before its last `Pulled` line.
    let pull_ms = d.parts.pull_ms.expect("the pull's part");
    assert!(
        pull_ms >= pull.as_millis() as i64 && pull_ms <= up_ms,
        "{d:?}"
    );
}

#[tokio::test]
async fn a_server_without_materialize_only_is_never_sent_a_stage() {
    let mut cfg = sim_config();
    cfg.legacy = true;
    // The stage first: on an older server it is skipped, then the plan gate refuses.
    let staged_first = "  - {name: stage, kind: stage, timeout: 5s}\n".to_owned() + PREFLIGHT;
    let opts = TestOptions {
        runbooks: Some(canary_with(&[(PREFLIGHT, staged_first.as_str())])),
        ..TestOptions::default()
    };
    let app = TestApp::spawn_custom(cfg, opts).await;
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "failed", "{r:#?}");
    let step = r.steps.iter().find(|s| s.kind == "stage").expect("stage");
    assert_eq!(step.status, "succeeded", "{step:#?}");
    assert_eq!(step.detail["skipped"], true, "{:#}", step.detail);
    assert!(
        step.detail["reason"]
            .as_str()
            .is_some_and(|r| r.contains("materialize_only")),
        "{:#}",
        step.detail
    );
    assert!(step.calls.is_empty(), "no attempt: {step:#?}");
    assert_eq!(compose_calls(&app), [], "nothing reached compose-manager");
}
