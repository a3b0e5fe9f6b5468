//! Pre-staging weights (issue: prepared before the down), the shipped
//! `prestage-glm53-w4afp8` runbook on the simulated host: the free-space gate refusing with
//! nothing sent, weights already cached ending it at once (`already_staged`), and a pre-stage
//! that runs the downloader alone from the file already deployed, follows its logs to
//! `Download complete.` and leaves every engine's container as it was.

use serde_json::json;

use crate::helpers::{fast_runbooks, sim_config, TestApp, TestOptions, R2};
use canaryd::domain::runbook;

const BOOK: &str = "prestage-glm53-w4afp8";
const VOLUME: &str = "work_huggingface_cache";
const GIB: u64 = 1 << 30;

/// The shipped runbook with test timings, beside the fast canary runbooks.
async fn app() -> TestApp {
    let path = format!("{}/runbooks/{BOOK}.yaml", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("the shipped runbook");
    let fast = text
        .replace("interval: 30s", "interval: 50ms")
        .replace("timeout: 6h", "timeout: 5s")
        .replace("timeout: 10m", "timeout: 5s")
        .replace("timeout: 2m", "timeout: 3s");
    let mut books = fast_runbooks();
    books.insert(
        BOOK.to_owned(),
        runbook::parse(BOOK, &path, &fast).expect("parses"),
    );
    let opts = TestOptions {
        runbooks: Some(books),
        ..TestOptions::default()
    };
    TestApp::spawn_custom(sim_config(), opts).await
}

fn plan() -> serde_json::Value {
    let mut p = TestApp::plan("v0.0.452");
    p["runbook"] = json!(BOOK);
    p["reason"] = json!("pre-stage the W4AFP8 weights");
    p
}

#[tokio::test]
async fn a_prestage_runs_the_downloader_alone_from_the_deployed_file_and_every_engine_keeps_its_container(
) {
    let app = app().await;
    // The new tag's downloader fetches the W4AFP8 snapshot (300 ms here).
    let download = std::time::Duration::from_millis(300);
    app.sim
        .faults()
        .set_download("graphistry/GLM-5.3-Flash-W4AFP8", download, 165 * GIB);
    let before = app.sim.containers();
    let id = app.start_canary(&plan()).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");

    let step = |name: &str| r.steps.iter().find(|s| s.name == name).expect(name);
    let space = &step("space").detail;
    assert_eq!(
        space["free_bytes"],
        json!(1024 * GIB - 180 * GIB),
        "{space:#}"
    );
    assert_eq!(space["required_bytes"], json!(250 * GIB), "{space:#}");
    let planned = &step("plan").detail["plan"];
    assert_eq!(
        planned["create"],
        json!(["model-downloader"]),
        "{planned:#}"
    );
    assert_eq!(planned["recreate"], json!([]), "{planned:#}");
    assert_eq!(planned["remove"], json!([]), "{planned:#}");
    assert!(
        step("downloaded")
            .detail
            .to_string()
            .contains("Download complete."),
        "{:#}",
        step("downloaded").detail
    );
    assert_eq!(step("neighbours").status, "succeeded");

    // Exactly the downloader's dry run and its up; no down, nothing of a replica.
    let calls: Vec<(String, bool, serde_json::Value)> = app
        .compose_calls()
        .into_iter()
        .map(|c| {
            (
                c.path.clone(),
                c.body["dry_run"] == true,
                c.body["services"].clone(),
            )
        })
        .collect();
    assert_eq!(
        calls,
        [
            ("/compose/up".to_owned(), true, json!(["model-downloader"])),
            ("/compose/up".to_owned(), false, json!(["model-downloader"])),
        ]
    );
    let after = app.sim.containers();
    for c in before.iter().filter(|c| c.service != "model-downloader") {
        let now = after
            .iter()
            .find(|a| a.service == c.service)
            .expect("still there");
        assert_eq!(
            (&now.id, now.state.as_str()),
            (&c.id, c.state.as_str()),
            "{}",
            c.service
        );
    }
    // Nothing of r2 was deployed: its deployments do not name this rollout.
    let deployments: serde_json::Value =
        reqwest::get(format!("{}/v1/replicas/gpu02/{R2}/deployments", app.url))
            .await
            .expect("answers")
            .json()
            .await
            .expect("json");
    assert!(
        !deployments.to_string().contains(&id),
        "no deployment recorded: {deployments:#}"
    );
    assert_eq!(r.downtime_ms, None);
}

#[tokio::test]
async fn the_gate_refuses_too_little_space_or_another_file_and_a_failed_download_fails_the_prestage(
) {
    let app = app().await;
    // 900 GiB of the 1 TiB volume used: 124 GiB free, 250 GiB required.
    app.sim.faults().set_cache(VOLUME, Some(900 * GIB), None);
    let id = app.start_canary(&plan()).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "failed", "{r:#?}");
    let error = r.error.clone().expect("an error");
    assert_eq!(error.code, "insufficient_space");
    assert!(
        error.message.contains("124.0 GiB free") && error.message.contains("250.0 GiB required"),
        "{}",
        error.message
    );
    assert!(error.message.contains("nothing sent"), "{}", error.message);
    assert_eq!(app.compose_calls(), [], "nothing sent");

    // A plan may raise the runbook's 250 GiB, never lower it.
    app.sim.faults().set_cache(VOLUME, Some(180 * GIB), None);
    let mut raised = plan();
    raised["required_free"] = json!("900GiB");
    let id = app.start_canary(&raised).await;
    let error = app.wait_terminal(&id).await.error.expect("an error");
    assert_eq!(error.code, "insufficient_space");
    assert!(
        error.message.contains("844.0 GiB free") && error.message.contains("900.0 GiB required"),
        "{}",
        error.message
    );
    app.sim.faults().set_cache(VOLUME, Some(900 * GIB), None);
    let mut lowered = plan();
    lowered["required_free"] = json!("100GiB");
    let id = app.start_canary(&lowered).await;
    let error = app.wait_terminal(&id).await.error.expect("an error");
    assert!(
        error.message.contains("250.0 GiB required"),
        "{}",
        error.message
    );
    assert_eq!(app.compose_calls(), [], "nothing sent");

    // A file the host does not run: refused before anything is sent.
    app.sim.faults().set_cache(VOLUME, Some(180 * GIB), None);
    let mut other = plan();
    other["file"] = json!("prod/GLM-5.3-Flash-SGL-TP4.yaml");
    let id = app.start_canary(&other).await;
    let r = app.wait_terminal(&id).await;
    let error = r.error.clone().expect("an error");
    assert_eq!(error.code, "file_not_deployed", "{r:#?}");
    assert!(error.message.contains("orphans"), "{}", error.message);
    assert_eq!(app.compose_calls(), [], "nothing sent");

    // A download that fails: its error line fails the wait at once.
    app.sim.faults().set_logs_on_start(
        "model-downloader",
        Some(vec![
            "Downloading graphistry/GLM-5.3-Flash-W4AFP8...".to_owned(),
            "huggingface_hub.errors.HfHubHTTPError: 401 Client Error: Unauthorized".to_owned(),
        ]),
    );
    let id = app.start_canary(&plan()).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "failed", "{r:#?}");
    let failed = r
        .steps
        .iter()
        .find(|s| s.status == "failed")
        .expect("a failed step");
    assert_eq!(failed.name, "downloaded", "{failed:#?}");
}

#[tokio::test]
async fn weights_already_cached_end_the_prestage_at_once_as_already_staged() {
    let app = app().await;
    app.sim.faults().set_cache(
        VOLUME,
        None,
        Some(&["models--graphistry--GLM-5.3-Flash-W4AFP8"]),
    );
    let id = app.start_canary(&plan()).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let statuses: Vec<(&str, &str)> = r
        .steps
        .iter()
        .map(|s| (s.name.as_str(), s.status.as_str()))
        .collect();
    assert_eq!(statuses[0], ("space", "succeeded"));
    assert!(
        statuses[1..].iter().all(|(_, s)| *s == "skipped"),
        "the rest is skipped: {statuses:?}"
    );
    assert_eq!(r.steps[0].detail["already_staged"], true);
    assert_eq!(app.compose_calls(), [], "nothing sent");
}

#[tokio::test]
async fn the_prestage_takes_the_weights_download_out_of_the_canarys_downtime() {
    let download = std::time::Duration::from_secs(2);
    let d_ms = download.as_millis() as i64;
    let weights = "graphistry/GLM-5.3-Flash-W4AFP8";

    // Without it, the canary's up waits for the downloader: the download is downtime.
    let bare = app().await;
    bare.sim.faults().set_download(weights, download, 165 * GIB);
    let id = bare.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = bare.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let up = r
        .downtime
        .clone()
        .and_then(|d| d.parts.up_ms)
        .expect("the up's part");
    assert!(
        up >= d_ms,
        "the up waited for the download ({up} ms): {:?}",
        r.downtime
    );

    // With it, the download happens while r2 serves; the canary's up finds the weights.
    let app = app().await;
    app.sim.faults().set_download(weights, download, 165 * GIB);
    let id = app.start_canary(&plan()).await;
    let pre = app.wait_terminal(&id).await;
    assert_eq!(pre.status, "succeeded", "{pre:#?}");
    let waited = pre
        .steps
        .iter()
        .find(|s| s.name == "downloaded")
        .and_then(|s| Some((s.finished_at? - s.started_at?).num_milliseconds()))
        .expect("the log wait ran");
    assert!(
        waited * 2 >= d_ms,
        "followed the download to its end ({waited} ms)"
    );
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let up = r
        .downtime
        .clone()
        .and_then(|d| d.parts.up_ms)
        .expect("the up's part");
    assert!(
        up < d_ms,
        "the weights were cached ({up} ms): {:?}",
        r.downtime
    );
}
