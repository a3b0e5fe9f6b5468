//! The dashboard's Approve button: shown on a rollout whose step waits for an operator, it asks
//! for a reason and a confirmation, then approves, and the rollout goes on.

use canaryd::config::{ApiToken, Role, Secret};
use serde_json::json;

use super::{browser_slot, step_status, Daemon};

const HEALTH: &str = "kind: wait_health, timeout: 60s, interval: 50ms, consecutive: 2}\n";

#[tokio::test]
async fn the_approve_button_asks_for_a_reason_and_a_confirmation_then_the_rollout_goes_on() {
    let Some(slot) = browser_slot("the dashboard approve test").await else {
        return;
    };
    let tokens = vec![ApiToken {
        name: "ops-alice".into(),
        role: Role::Operator,
        secret: Secret::new("alice-secret"),
    }];
    let daemon = Daemon::start_with_canary(tokens, |text| {
        assert!(text.contains(HEALTH), "the canary has the health step");
        text.replace(
            HEALTH,
            &format!("{HEALTH}  - {{name: judgement, kind: approve, timeout: 60s}}\n"),
        )
    })
    .await;
    let token = Some("alice-secret");
    let id = daemon.start_canary("v0.0.452", token).await;
    daemon
        .wait_rollout(&id, token, |r| {
            r["steps"]
                .as_array()
                .and_then(|s| s.iter().find(|s| s["name"] == "judgement"))
                .is_some_and(|s| s["detail"]["awaiting_approval"] == true)
        })
        .await;

    let browser = slot.browser().await;
    browser.open(&format!("{}/", daemon.url)).await;
    browser.type_into("#token", "alice-secret").await;
    browser.click("#token-save").await;
    browser
        .wait_for(
            "the Approve button on the waiting rollout",
            &format!("return !!document.querySelector('[data-approve=\"{id}\"]');"),
            |v| v == true,
        )
        .await;
    // The card is drawn again on every event of the rollout: click the button as it is now.
    browser
        .eval(&format!(
            "document.querySelector('[data-approve=\"{id}\"]').click(); return true;"
        ))
        .await;
    // No reason: nothing is asked, nothing is sent.
    browser.click("#approve-submit").await;
    assert_eq!(
        browser
            .eval("return document.getElementById('approve-step2').hidden")
            .await,
        true,
        "no confirmation without a reason"
    );
    browser
        .type_into("#approve-reason", "outputs and latency look right")
        .await;
    browser.click("#approve-submit").await;
    let question = browser
        .wait_for(
            "the confirmation question",
            "return document.getElementById('approve-step2').hidden ? null : document.getElementById('approve-question').textContent",
            |v| v.is_string(),
        )
        .await;
    assert!(
        question
            .as_str()
            .is_some_and(|q| q.contains("judgement") && q.contains(&id)),
        "{question}"
    );
    let r = daemon
        .request("GET", &format!("/v1/rollouts/{id}"), token, None)
        .await;
    assert_eq!(
        r["status"], "running",
        "nothing is sent before the confirmation"
    );

    browser.click("#approve-confirm").await;
    let done = daemon
        .wait_rollout(&id, token, |r| r["status"] == "succeeded")
        .await;
    let judgement = done["steps"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "judgement"))
        .expect("judgement step");
    assert_eq!(judgement["detail"]["approved_by"], "ops-alice");
    assert_eq!(
        judgement["detail"]["reason"],
        json!("outputs and latency look right")
    );
    browser
        .wait_for(
            "the step shown succeeded",
            &step_status(&id, "judgement"),
            |v| v == "succeeded",
        )
        .await;
    browser.quit().await;
    daemon.stop().await;
}
