//! The dashboard's release view: a release listed, shown with its targets (state, rollout,
//! current step), followed live through its event stream, and paused then aborted with the
//! Pause and Abort buttons, each after a reason and a confirmation.

use serde_json::{json, Value};

use super::{browser_slot, operator_and_oncall, Browser, Daemon};
use crate::helpers::{FILE, HOST, R1, R2};

/// Polls the release until `check` holds (bounded: 300 × 50 ms).
async fn wait_release(daemon: &Daemon, id: &str, check: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..300 {
        let r = daemon
            .request(
                "GET",
                &format!("/v1/releases/{id}"),
                Some("oncall-secret"),
                None,
            )
            .await;
        if check(&r) {
            return r;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("release {id} never reached the expected state");
}

fn target_field(target: &str, field: &str) -> String {
    format!(
        "const e = document.querySelector('[data-target=\"{target}\"] [data-field={field}]'); \
         return e && e.textContent;"
    )
}

/// Clicks a release control, types `reason`, checks the question names the release and
/// nothing was sent, then confirms.
async fn control(browser: &Browser, daemon: &Daemon, id: &str, verb: &str, reason: &str) {
    let before = wait_release(daemon, id, |_| true).await;
    browser.click(&format!("#release-{verb}")).await;
    browser.click("#release-submit").await;
    assert_eq!(
        browser
            .eval("return document.getElementById('release-step2').hidden")
            .await,
        true,
        "no confirmation without a reason"
    );
    browser.type_into("#release-reason", reason).await;
    browser.click("#release-submit").await;
    let question = browser
        .wait_for(
            "the confirmation question",
            "return document.getElementById('release-step2').hidden ? null : document.getElementById('release-question').textContent",
            |v| v.is_string(),
        )
        .await;
    assert!(
        question
            .as_str()
            .is_some_and(|q| q.contains(verb) && q.contains(id)),
        "{question}"
    );
    let now = wait_release(daemon, id, |_| true).await;
    assert_eq!(
        now["status"], before["status"],
        "nothing is sent before the confirmation"
    );
    browser.click("#release-confirm").await;
}

#[tokio::test]
async fn the_release_view_shows_the_targets_and_pauses_then_aborts_with_a_reason_and_a_confirmation(
) {
    let Some(slot) = browser_slot("the dashboard release test").await else {
        return;
    };
    let daemon = Daemon::start(operator_and_oncall()).await;
    // The canary target waits on health (60 s), so the release is held mid-way.
    daemon.sim.faults().set_health_never(R2, true);
    let body = json!({"file": FILE, "tag": "v0.0.452", "reason": "promote v0.0.452",
                      "targets": [{"host": HOST, "service": R2}, {"host": HOST, "service": R1}]});
    let created = daemon
        .request("POST", "/v1/releases", Some("alice-secret"), Some(body))
        .await;
    let id = created["id"].as_str().expect("id").to_owned();
    let held = wait_release(&daemon, &id, |r| {
        r["targets"][0]["current_step"] == "health"
    })
    .await;
    let canary = held["targets"][0]["rollout_id"]
        .as_str()
        .expect("the canary's rollout")
        .to_owned();

    let browser = slot.browser().await;
    browser.open(&format!("{}/", daemon.url)).await;
    browser.type_into("#token", "oncall-secret").await;
    browser.click("#token-save").await;
    browser
        .wait_for(
            "the release in the list",
            &format!("return !!document.querySelector('[data-release=\"{id}\"]');"),
            |v| v == true,
        )
        .await;
    browser.click(&format!("[data-release=\"{id}\"]")).await;
    let targets = browser
        .wait_for(
            "the release's targets",
            "return [...document.querySelectorAll('[data-target]')].map(e => [e.getAttribute('data-target'), e.getAttribute('data-state')])",
            |v| v.as_array().is_some_and(|a| a.len() == 2),
        )
        .await;
    assert_eq!(
        targets,
        json!([
            [format!("{HOST}/{R2}"), "running"],
            [format!("{HOST}/{R1}"), "waiting"]
        ]),
        "the canary first, running; the other waits"
    );
    assert_eq!(
        browser
            .eval(&target_field(&format!("{HOST}/{R2}"), "current-step"))
            .await,
        "health"
    );
    assert_eq!(
        browser
            .eval(&format!(
                "const e = document.querySelector('[data-target=\"{HOST}/{R2}\"] [data-rollout-link]'); return e && e.getAttribute('data-rollout-link');"
            ))
            .await,
        json!(canary),
        "the target links to its rollout"
    );
    assert_eq!(
        browser
            .eval("const e = document.querySelector('[data-progress=running]'); return e && e.textContent;")
            .await,
        "1 running"
    );
    browser
        .wait_for(
            "the release followed through its event stream",
            "return document.getElementById('release-live').textContent",
            |v| v == "live",
        )
        .await;
    assert_eq!(
        browser
            .eval("return document.getElementById('release-resume').hidden")
            .await,
        true,
        "nothing to resume while it runs"
    );

    control(
        &browser,
        &daemon,
        &id,
        "pause",
        "hold: a capacity review at noon",
    )
    .await;
    browser
        .wait_for(
            "the paused release",
            "const e = document.querySelector('[data-release-view]'); return e && e.getAttribute('data-status');",
            |v| v == "paused",
        )
        .await;
    let paused = wait_release(&daemon, &id, |r| r["status"] == "paused").await;
    let event = paused["events"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["kind"] == "release_paused"))
        .unwrap_or_else(|| panic!("a release_paused event: {paused:#}"));
    assert_eq!(
        event["actor"], "oncall",
        "sent with the token from the page"
    );
    assert_eq!(event["reason"], "hold: a capacity review at noon");
    browser
        .wait_for(
            "the pause in the events",
            "return !!document.querySelector('[data-release-event=release_paused]');",
            |v| v == true,
        )
        .await;
    assert_eq!(
        browser
            .eval("return document.getElementById('release-resume').hidden")
            .await,
        false,
        "a paused release can be resumed"
    );

    control(&browser, &daemon, &id, "abort", "v0.0.452 is withdrawn").await;
    let aborted = wait_release(&daemon, &id, |r| {
        r["status"] == "aborted" && r["targets"][0]["state"] == "aborted"
    })
    .await;
    let event = aborted["events"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["kind"] == "release_aborted"))
        .unwrap_or_else(|| panic!("a release_aborted event: {aborted:#}"));
    assert_eq!(event["actor"], "oncall");
    assert_eq!(event["reason"], "v0.0.452 is withdrawn");
    assert_eq!(
        aborted["targets"][1]["rollout_id"],
        Value::Null,
        "the waiting target never started"
    );
    browser
        .wait_for(
            "the aborted release and its aborted canary",
            &format!(
                "const v = document.querySelector('[data-release-view]'); \
                 const t = document.querySelector('[data-target=\"{HOST}/{R2}\"]'); \
                 const u = document.querySelector('[data-target=\"{HOST}/{R1}\"]'); \
                 return v && t && u && [v.getAttribute('data-status'), t.getAttribute('data-state'), \
                   u.getAttribute('data-state'), !!u.querySelector('[data-field=no-rollout]')];"
            ),
            |v| v == &json!(["aborted", "aborted", "not_started", true]),
        )
        .await;
    assert_eq!(
        browser
            .eval("return ['release-pause', 'release-resume', 'release-abort'].map(b => document.getElementById(b).hidden)")
            .await,
        json!([true, true, true]),
        "an ended release has no controls"
    );
    browser.quit().await;
    daemon.stop().await;
}
