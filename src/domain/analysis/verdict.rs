//! How an `analyze` step's verdict is shown: one small table per check (the target's value,
//! each peer's, the peers' median, the ratio, the limits, the verdict), from the verdicts of
//! the step's evidence (`AnalyzeEvidence::verdict_table`), for `canaryd show`/`watch` and
//! `dev --demo`; and the part of the detail the step's `step_succeeded` event carries (the
//! SSE stream). The dashboard draws the same rows from the same detail.

use std::fmt::Write as _;

use serde_json::{json, Value};

use super::{CheckVerdict, Observed, Verdict};

/// What a succeeded step's audit event (and so its SSE event) carries: the analysis verdict
/// (`{"checks": [...]}`) for an `analyze` step, nothing (`{}`) for any other step.
pub fn verdict_event(detail: &Value) -> Value {
    match detail.get("checks").filter(|c| c.is_array()) {
        Some(checks) => json!({ "checks": checks }),
        None => json!({}),
    }
}

/// `0.412`, `250` (a count), `-` (no value).
fn number(v: Option<f64>) -> String {
    match v {
        Some(x) if x.is_finite() && x.fract() == 0.0 && x.abs() < 1e15 => format!("{x:.0}"),
        Some(x) if x.is_finite() => format!("{x:.3}"),
        _ => "-".to_owned(),
    }
}

/// The target's absolute bounds in words: `limit ≤ 0.5`, `limit ≥ 1`; empty without one.
fn bounds(c: &CheckVerdict) -> String {
    let mut out = Vec::new();
    if let Some(max) = c.max {
        out.push(format!("≤ {max}"));
    }
    if let Some(min) = c.min {
        out.push(format!("≥ {min}"));
    }
    if out.is_empty() {
        String::new()
    } else {
        format!("limit {}", out.join(" and "))
    }
}

fn requests(o: &Observed) -> String {
    o.requests
        .map(|r| format!("{} requests", number(Some(r))))
        .unwrap_or_default()
}

/// The verdicts of an analysis as text, one small table per check; `None` without a verdict.
/// `target_name` names the target's row.
///
/// ```text
///     ttft_p95: FAIL
///       target  model-…-r2    0.581  212 requests
///       peer    model-…-r1    0.290  210 requests
///       peers' median         0.290
///       ratio to the median  2.003×  limit ≤ 1.2×
///       why: 2.003× the peers' median (0.29) is above max_ratio_to_peers 1.2
/// ```
pub fn verdict_table(target_name: &str, checks: &[CheckVerdict]) -> Option<String> {
    if checks.is_empty() {
        return None;
    }
    let mut out = String::new();
    for c in checks {
        let verdict = match (c.verdict, c.fails_step) {
            (Verdict::Fail, _) => "FAIL",
            (Verdict::Pass, _) => "pass",
            (Verdict::Inconclusive, true) => "inconclusive (fails the step)",
            (Verdict::Inconclusive, false) => "inconclusive (does not fail the step)",
        };
        let _ = writeln!(out, "    {}: {verdict}", c.name);
        // (label, value, note)
        let mut rows: Vec<(String, String, String)> = Vec::new();
        let target_note = [requests(&c.target), bounds(c)]
            .into_iter()
            .filter(|n| !n.is_empty())
            .collect::<Vec<_>>()
            .join(", ");
        rows.push((
            format!("target  {target_name}").trim_end().to_owned(),
            number(c.target.value),
            target_note,
        ));
        for (name, peer) in &c.peers {
            rows.push((
                format!("peer    {name}"),
                number(peer.value),
                requests(peer),
            ));
        }
        if !c.peers.is_empty() {
            rows.push((
                "peers' median".to_owned(),
                number(c.peer_median),
                String::new(),
            ));
        }
        if c.max_ratio_to_peers.is_some() || c.ratio.is_some() {
            let limit = c
                .max_ratio_to_peers
                .map(|r| format!("limit ≤ {r}×"))
                .unwrap_or_default();
            let ratio = c
                .ratio
                .map_or("-".to_owned(), |r| format!("{}×", number(Some(r))));
            rows.push(("ratio to the median".to_owned(), ratio, limit));
        }
        let label_w = rows.iter().map(|r| r.0.chars().count()).max().unwrap_or(0);
        let value_w = rows.iter().map(|r| r.1.chars().count()).max().unwrap_or(0);
        for (label, value, note) in rows {
            let line = format!("      {label:<label_w$}  {value:>value_w$}  {note}");
            let _ = writeln!(out, "{}", line.trim_end());
        }
        if !c.reasons.is_empty() {
            let _ = writeln!(out, "      why: {}", c.reasons.join("; "));
        }
    }
    Some(out.trim_end_matches('\n').to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detail() -> Value {
        json!({
            "source": "engine",
            "replicas": {
                "r1": {"role": "peer", "scrapes": 9},
                "r2": {"role": "target", "scrapes": 9},
            },
            "checks": [
                {"name": "ttft_p95", "verdict": "fail", "fails_step": true,
                 "target": {"value": 0.58125, "requests": 212.0},
                 "peers": {"r1": {"value": 0.29, "requests": 210.0}},
                 "peer_median": 0.29, "ratio": 2.0043, "max_ratio_to_peers": 1.2,
                 "max": null, "min": null, "min_requests": 50, "on_inconclusive": "fail",
                 "reasons": ["2.004× the peers' median (0.29) is above max_ratio_to_peers 1.2"]},
                {"name": "took_traffic", "verdict": "pass", "fails_step": false,
                 "target": {"value": 250.0, "requests": 250.0},
                 "peers": {"r1": {"value": 248.0, "requests": 248.0}},
                 "peer_median": 248.0, "ratio": 1.008, "max_ratio_to_peers": null,
                 "max": null, "min": 1.0, "min_requests": 0, "on_inconclusive": "fail",
                 "reasons": []},
                {"name": "itl_p95", "verdict": "inconclusive", "fails_step": false,
                 "target": {"value": null, "requests": 0.0},
                 "peers": {"r1": {"value": 0.02, "requests": 210.0}},
                 "peer_median": 0.02, "ratio": null, "max_ratio_to_peers": 1.2,
                 "on_inconclusive": "pass", "reasons": ["no data for the target in the window"]},
            ],
        })
    }

    /// The verdicts of a detail, as the step's evidence reads them.
    fn checks(detail: &Value) -> Vec<CheckVerdict> {
        serde_json::from_value(detail["checks"].clone()).expect("stored verdicts")
    }

    #[test]
    fn each_check_is_a_small_table_of_target_peers_median_ratio_limit_and_verdict() {
        let table = verdict_table("r2", &checks(&detail())).expect("a verdict");
        let want = [
            "    ttft_p95: FAIL",
            "      target  r2            0.581  212 requests",
            "      peer    r1            0.290  210 requests",
            "      peers' median         0.290",
            "      ratio to the median  2.004×  limit ≤ 1.2×",
            "      why: 2.004× the peers' median (0.29) is above max_ratio_to_peers 1.2",
            "    took_traffic: pass",
            "      target  r2              250  250 requests, limit ≥ 1",
            "      peer    r1              248  248 requests",
            "      peers' median           248",
            "      ratio to the median  1.008×",
            "    itl_p95: inconclusive (does not fail the step)",
            "      target  r2               -  0 requests",
            "      peer    r1           0.020  210 requests",
            "      peers' median        0.020",
            "      ratio to the median      -  limit ≤ 1.2×",
            "      why: no data for the target in the window",
        ]
        .join("\n");
        assert_eq!(table, want, "\n{table}");
    }

    #[test]
    fn no_verdict_shows_no_table() {
        assert_eq!(verdict_table("r2", &[]), None);
    }

    #[test]
    fn an_inconclusive_check_that_fails_the_step_says_so() {
        let d = json!({"checks": [{"name": "c", "verdict": "inconclusive", "fails_step": true,
                                   "target": {"value": null, "requests": 3.0}, "peers": {}}]});
        let table = verdict_table("", &checks(&d)).expect("a verdict");
        assert!(
            table.starts_with("    c: inconclusive (fails the step)\n      target  -  3 requests"),
            "{table}"
        );
        assert!(!table.contains("median"), "no peers, no median: {table}");
    }

    #[test]
    fn only_an_analysis_verdict_rides_on_a_succeeded_step_event() {
        let d = detail();
        assert_eq!(verdict_event(&d), json!({"checks": d["checks"]}));
        assert_eq!(verdict_event(&json!({"checks": null})), json!({}));
        assert_eq!(verdict_event(&json!({"lines": 12})), json!({}));
    }
}
