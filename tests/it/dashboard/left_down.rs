//! A replica that a rollout left down is a red row in the dashboard's replica table, until a
//! later rollout brings it back.

use canaryd_sim::SimOp;
use serde_json::json;

use super::{browser_slot, Daemon};
use crate::helpers::{FILE, HOST, R2};

fn r2_row(what: &str) -> String {
    format!(
        "const e = document.querySelector('[data-replica=\"{HOST}/{R2}\"]'); return e && {what};"
    )
}

#[tokio::test]
async fn a_replica_left_down_is_a_red_row_until_a_rollout_brings_it_back() {
    let Some(slot) = browser_slot("the dashboard left-down test").await else {
        return;
    };
    let daemon = Daemon::start(Vec::new()).await;
    // The up fails after the down, and the canary does not roll back: r2 has no container.
    daemon.sim.faults().fail_phase(SimOp::Up, Some("up".into()));
    let plan = json!({"host": HOST, "file": FILE, "service": R2, "tag": "v0.0.452",
                      "reason": "dashboard test", "on_failure": "halt"});
    let created = daemon
        .request("POST", "/v1/rollouts", None, Some(plan))
        .await;
    let id = created["id"].as_str().expect("id").to_owned();
    let done = daemon
        .wait_rollout(&id, None, |r| r["status"] == "failed")
        .await;
    assert_eq!(done["error"]["code"], "replica_left_down", "{done}");

    let browser = slot.browser().await;
    browser.open(&format!("{}/", daemon.url)).await;
    browser
        .wait_for(
            "r2's row marked left down",
            &r2_row("e.classList.contains('left-down')"),
            |v| v == true,
        )
        .await;
    let text = browser.eval(&r2_row("e.innerText")).await;
    assert!(
        text.as_str().is_some_and(|t| t.contains("LEFT DOWN")),
        "{text}"
    );
    assert_eq!(
        browser
            .eval(&r2_row("getComputedStyle(e.querySelector('td')).color"))
            .await,
        "rgb(207, 34, 46)",
        "the row is red"
    );

    // A canary that succeeds brings r2 back: the row is plain again after a reload.
    let id = daemon.start_canary("v0.0.451", None).await;
    daemon
        .wait_rollout(&id, None, |r| r["status"] == "succeeded")
        .await;
    browser.open(&format!("{}/", daemon.url)).await;
    browser
        .wait_for(
            "r2's row plain again",
            &r2_row("e.classList.contains('left-down')"),
            |v| v == false,
        )
        .await;
    browser.quit().await;
    daemon.stop().await;
}
