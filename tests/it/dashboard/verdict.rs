//! The rollout's detail view draws an analysis verdict as one small table per check: the
//! target's value, each peer's, the peers' median, the ratio, its limit, the verdict.

use serde_json::Value;

use super::{browser_slot, failed_analysis};
use crate::helpers::R1;

/// The text of cell `cell` of check `check`'s table in rollout `id`'s card.
fn cell(id: &str, check: &str, cell: &str) -> String {
    format!(
        "const e = document.querySelector('[data-rollout=\"{id}\"] table[data-check=\"{check}\"] [data-cell=\"{cell}\"]'); \
         return e && e.textContent;"
    )
}

/// `0.581` or `250`, as the page prints numbers.
fn shown(v: &Value) -> String {
    let x = v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"));
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.3}")
    }
}

#[tokio::test]
async fn a_failed_analysis_shows_its_verdict_table_in_the_rollouts_detail_view() {
    let Some(slot) = browser_slot("the dashboard verdict test").await else {
        return;
    };
    let (daemon, r) = failed_analysis("1500ms").await;
    let id = r["id"].as_str().expect("id").to_owned();
    let analysis = r["steps"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "analysis"))
        .expect("the analysis step");
    let checks = analysis["detail"]["checks"].as_array().expect("checks");
    let ttft = checks
        .iter()
        .find(|c| c["name"] == "ttft_p95")
        .expect("ttft");
    let traffic = checks
        .iter()
        .find(|c| c["name"] == "took_traffic")
        .expect("traffic");

    let browser = slot.browser().await;
    browser.open(&format!("{}/", daemon.url)).await;
    // The rollout's detail view: its row in the history, clicked.
    browser
        .wait_for(
            "the canary in the history",
            &format!("return !!document.querySelector('[data-history=\"{id}\"]')"),
            |v| v == true,
        )
        .await;
    browser.click(&format!("[data-history=\"{id}\"]")).await;
    browser
        .wait_for(
            "the ttft_p95 verdict table",
            &format!("const e = document.querySelector('[data-rollout=\"{id}\"] table[data-check=\"ttft_p95\"]'); return e && e.getAttribute('data-verdict');"),
            |v| v == "fail",
        )
        .await;
    let peer_cell = format!("peer:{R1}");
    let expect = [
        ("target", shown(&ttft["target"]["value"])),
        (peer_cell.as_str(), shown(&ttft["peers"][R1]["value"])),
        ("median", shown(&ttft["peer_median"])),
        ("ratio", format!("{}×", shown(&ttft["ratio"]))),
        ("limit", "limit ≤ 1.2×".to_owned()),
        ("verdict", "fail".to_owned()),
    ];
    for (name, want) in expect {
        assert_eq!(
            browser.eval(&cell(&id, "ttft_p95", name)).await,
            Value::String(want),
            "cell {name} of ttft_p95"
        );
    }
    assert_eq!(
        browser.eval(&cell(&id, "took_traffic", "verdict")).await,
        "pass"
    );
    assert_eq!(
        browser.eval(&cell(&id, "took_traffic", "target")).await,
        Value::String(shown(&traffic["target"]["value"]))
    );
    assert_eq!(
        browser.eval(&cell(&id, "took_traffic", "bounds")).await,
        "limit ≥ 1"
    );
    let colour = browser
        .eval(&format!(
            "const e = document.querySelector('[data-rollout=\"{id}\"] table[data-check=\"ttft_p95\"] [data-cell=\"verdict\"]'); \
             return getComputedStyle(e).color;"
        ))
        .await;
    assert_eq!(colour, "rgb(207, 34, 46)", "a failed check is red");
    browser.quit().await;
    daemon.stop().await;
}
