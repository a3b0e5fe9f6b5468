//! On-call's hands at 3 a.m., in the real browser: Abort on the rollout page (a viewer's token
//! is refused, on-call's aborts) and in the dashboard's active list, and "abort and roll back"
//! on the replica page (the API's `preempt`). Each canary is held in an `approve` step after
//! it touched r2, so it is running, healthy and waiting when the button is clicked.

use canaryd::config::{ApiToken, Role, Secret};
use serde_json::Value;

use super::{browser_slot, operator_and_oncall, Browser, Daemon};
use crate::helpers::{HOST, R2};

const HEALTH: &str = "kind: wait_health, timeout: 60s, interval: 50ms, consecutive: 2}\n";

/// A daemon (operator, on-call and viewer tokens) whose canary of r2 waits for an approval
/// after its up; the canary's id.
async fn canary_waiting() -> (Daemon, String) {
    let mut tokens = operator_and_oncall();
    tokens.push(ApiToken {
        name: "viewer".into(),
        role: Role::Viewer,
        secret: Secret::new("viewer-secret"),
    });
    let daemon = Daemon::start_with_canary(tokens, |text| {
        assert!(text.contains(HEALTH), "the canary has the health step");
        text.replace(
            HEALTH,
            &format!("{HEALTH}  - {{name: judgement, kind: approve, timeout: 60s}}\n"),
        )
    })
    .await;
    let id = daemon.start_canary("v0.0.452", Some("alice-secret")).await;
    daemon
        .wait_rollout(&id, Some("alice-secret"), |r| {
            r["steps"]
                .as_array()
                .and_then(|s| s.iter().find(|s| s["name"] == "judgement"))
                .is_some_and(|s| s["detail"]["awaiting_approval"] == true)
        })
        .await;
    (daemon, id)
}

async fn use_token(browser: &Browser, token: &str) {
    browser
        .eval("document.getElementById('token').value = ''; return true;")
        .await;
    browser.type_into("#token", token).await;
    browser.click("#token-save").await;
}

/// Fills the dialog `p` (`abort-`, `rollback-`): a reason, the question, the confirmation;
/// returns the question asked.
async fn reason_and_confirm(browser: &Browser, p: &str, reason: &str) -> Value {
    browser.type_into(&format!("#{p}reason"), reason).await;
    browser.click(&format!("#{p}submit")).await;
    let question = browser
        .wait_for(
            "the confirmation question",
            &format!(
                "return document.getElementById('{p}step2').hidden ? null : \
                 document.getElementById('{p}question').textContent"
            ),
            |v| v.is_string(),
        )
        .await;
    browser.click(&format!("#{p}confirm")).await;
    question
}

#[tokio::test]
async fn abort_on_the_rollout_page_is_role_gated_confirmed_and_stops_the_canary() {
    let Some(slot) = browser_slot("the rollout page abort test").await else {
        return;
    };
    let (daemon, id) = canary_waiting().await;
    let browser = slot.browser().await;
    browser.open(&format!("{}/rollouts/{id}", daemon.url)).await;
    use_token(&browser, "viewer-secret").await;
    browser
        .wait_for(
            "the Abort button of the running canary",
            "return !document.getElementById('abort-box').hidden;",
            |v| v == true,
        )
        .await;
    // A viewer may read, not abort: the refusal is shown, the canary goes on.
    browser.click("#abort-open").await;
    let question = reason_and_confirm(&browser, "abort-", "TTFT doubled").await;
    assert!(
        question
            .as_str()
            .is_some_and(|q| q.contains(&id) && q.contains(R2)),
        "{question}"
    );
    let refused = browser
        .wait_for(
            "the viewer's refusal",
            "const t = document.getElementById('abort-result').textContent; \
             return t.startsWith('Abort refused') ? t : null;",
            |v| v.is_string(),
        )
        .await;
    assert!(
        refused.as_str().is_some_and(|t| t.contains("forbidden")),
        "{refused}"
    );
    let r = daemon
        .request(
            "GET",
            &format!("/v1/rollouts/{id}"),
            Some("alice-secret"),
            None,
        )
        .await;
    assert_eq!(r["status"], "running", "a viewer's abort changes nothing");

    // On-call aborts it.
    use_token(&browser, "oncall-secret").await;
    byid_click(&browser, "abort-cancel").await;
    browser.click("#abort-open").await;
    reason_and_confirm(&browser, "abort-", "TTFT doubled on r2").await;
    let aborted = daemon
        .wait_rollout(&id, Some("oncall-secret"), |r| r["status"] == "aborted")
        .await;
    let audit = daemon
        .request(
            "GET",
            &format!("/v1/rollouts/{id}/audit"),
            Some("oncall-secret"),
            None,
        )
        .await;
    let requested = audit["items"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["kind"] == "abort_requested"))
        .cloned()
        .expect("the abort is audited");
    assert_eq!(requested["actor"], "oncall", "{requested}");
    assert!(
        requested.to_string().contains("TTFT doubled on r2"),
        "{requested}"
    );
    assert_eq!(aborted["status"], "aborted");
    browser
        .wait_for(
            "the page shows it aborted, without its Abort button",
            "const s = document.querySelector('#status [data-status]'); \
             return s && s.getAttribute('data-status') === 'aborted' && document.getElementById('abort-box').hidden;",
            |v| v == true,
        )
        .await;
    browser.quit().await;
    daemon.stop().await;
}

async fn byid_click(browser: &Browser, id: &str) {
    browser
        .eval(&format!(
            "document.getElementById('{id}').click(); return true;"
        ))
        .await;
}

#[tokio::test]
async fn abort_in_the_dashboards_active_list_stops_the_canary() {
    let Some(slot) = browser_slot("the dashboard abort test").await else {
        return;
    };
    let (daemon, id) = canary_waiting().await;
    let browser = slot.browser().await;
    browser.open(&format!("{}/", daemon.url)).await;
    use_token(&browser, "oncall-secret").await;
    browser
        .wait_for(
            "the Abort button on the active canary",
            &format!("return !!document.querySelector('[data-abort=\"{id}\"]');"),
            |v| v == true,
        )
        .await;
    browser
        .eval(&format!(
            "document.querySelector('[data-abort=\"{id}\"]').click(); return true;"
        ))
        .await;
    // No reason: nothing is asked, nothing is sent.
    browser.click("#abort-submit").await;
    assert_eq!(
        browser
            .eval("return document.getElementById('abort-step2').hidden")
            .await,
        true,
        "no confirmation without a reason"
    );
    reason_and_confirm(&browser, "abort-", "r1 is overloaded").await;
    daemon
        .wait_rollout(&id, Some("oncall-secret"), |r| r["status"] == "aborted")
        .await;
    browser
        .wait_for(
            "the card shows it aborted",
            &format!(
                "const c = document.querySelector('[data-rollout=\"{id}\"]'); \
                 return c ? c.getAttribute('data-status') : null;"
            ),
            |v| v == "aborted",
        )
        .await;
    browser.quit().await;
    daemon.stop().await;
}

#[tokio::test]
async fn abort_and_roll_back_on_the_replica_page_preempts_the_canary_and_restores_r2() {
    let Some(slot) = browser_slot("the replica page abort-and-roll-back test").await else {
        return;
    };
    let (daemon, id) = canary_waiting().await;
    let browser = slot.browser().await;
    browser
        .open(&format!("{}/replicas/{HOST}/{R2}", daemon.url))
        .await;
    use_token(&browser, "oncall-secret").await;
    let label = browser
        .wait_for(
            "the abort-and-roll-back button",
            "const b = document.getElementById('rollback-open'); \
             return b.disabled ? null : b.textContent;",
            |v| v.as_str().is_some_and(|t| t.starts_with("Abort ")),
        )
        .await;
    assert_eq!(label, format!("Abort {id} and roll back…").as_str());
    browser.click("#rollback-open").await;
    let question = reason_and_confirm(&browser, "rollback-", "r2 answers garbage").await;
    assert!(
        question
            .as_str()
            .is_some_and(|q| q.starts_with(&format!("Really abort {id} and roll back {R2}"))),
        "{question}"
    );
    // Aborted first, then linked to the rollback that undoes it.
    let canary = daemon
        .wait_rollout(&id, Some("oncall-secret"), |r| {
            r["status"] == "aborted" && r["rolled_back_by"].is_string()
        })
        .await;
    let rollback = canary["rolled_back_by"]
        .as_str()
        .map(str::to_owned)
        .expect("the rollback undoes the canary");
    let done = daemon
        .wait_rollout(&rollback, Some("oncall-secret"), |r| {
            matches!(r["status"].as_str(), Some("succeeded" | "failed"))
        })
        .await;
    assert_eq!(done["status"], "succeeded", "{done:#}");
    assert_eq!(
        done["tag"], "v0.0.450",
        "r2 is back on what it ran: {done:#}"
    );
    browser
        .wait_for(
            "the page says the rollback started",
            &format!(
                "return !!document.querySelector('#rollback-result [data-rollout-link=\"{rollback}\"]');"
            ),
            |v| v == true,
        )
        .await;
    browser.quit().await;
    daemon.stop().await;
}
