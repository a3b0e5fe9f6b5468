//! The dashboard's host doctor section: a failing host shows in red with its failing check,
//! and "Run doctor" runs it again.

use serde_json::json;

use super::{browser_slot, Daemon};
use crate::helpers::HOST;

fn host_row(what: &str) -> String {
    format!(
        "const e = document.querySelector('[data-doctor-host=\"{HOST}\"]'); return e && {what};"
    )
}

#[tokio::test]
async fn the_doctor_section_shows_a_failing_host_in_red_with_its_failing_check() {
    let Some(slot) = browser_slot("the dashboard doctor test").await else {
        return;
    };
    let daemon = Daemon::start(Vec::new()).await;
    daemon.sim.faults().set_legacy(true);

    let browser = slot.browser().await;
    browser.open(&format!("{}/", daemon.url)).await;
    browser
        .wait_for(
            "the host, not checked yet",
            &host_row("e.getAttribute('data-doctor-status')"),
            |v| v == "none",
        )
        .await;

    browser
        .click(&format!("[data-doctor-run=\"{HOST}\"]"))
        .await;
    browser
        .wait_for(
            "the doctor's verdict",
            &host_row("e.getAttribute('data-doctor-status')"),
            |v| v == "failed",
        )
        .await;
    let failing = browser
        .eval(&host_row(
            "[...e.querySelectorAll('[data-doctor-check]')].map(c => c.getAttribute('data-doctor-check'))",
        ))
        .await;
    assert_eq!(failing, json!(["dry_run_supported"]));
    let text = browser.eval(&host_row("e.innerText")).await;
    assert!(
        text.as_str()
            .is_some_and(|t| t.contains("failed") && t.contains("404")),
        "the verdict and the failing check's detail are shown: {text}"
    );
    let red = "rgb(207, 34, 46)";
    assert_eq!(
        browser
            .eval(&host_row(
                "getComputedStyle(e.querySelector('.doctor-verdict')).color"
            ))
            .await,
        red,
        "failed is red"
    );
    assert_eq!(
        browser
            .eval(&host_row(
                "getComputedStyle(e.querySelector('[data-doctor-check]')).color"
            ))
            .await,
        red,
        "the failing check is red"
    );

    // The host is upgraded: running the doctor again turns the row ok.
    daemon.sim.faults().set_legacy(false);
    browser
        .click(&format!("[data-doctor-run=\"{HOST}\"]"))
        .await;
    browser
        .wait_for(
            "the host ok after a new run",
            &host_row("e.getAttribute('data-doctor-status')"),
            |v| v == "ok",
        )
        .await;
    assert_eq!(
        browser
            .eval(&host_row(
                "e.querySelectorAll('[data-doctor-check]').length"
            ))
            .await,
        0
    );
    browser.quit().await;
    daemon.stop().await;
}
