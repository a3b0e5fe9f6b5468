//! The `analyze` step's model and its judgement: a runbook's checks, and the verdict of one
//! check from the numbers a window produced (the target's value, each peer's, their median).
//!
//! A check compares the target with the median of its peers (`max_ratio_to_peers`) and/or
//! with absolute bounds (`max`, `min`). A replica that served fewer than `min_requests`
//! requests in the window gives no usable value: the target's makes the check
//! `inconclusive`, a peer's leaves that peer out of the median. An inconclusive check fails
//! the step unless it says `on_inconclusive: pass`.
//!
//! With `source: prometheus` a check is a PromQL `query` instead of a family: its
//! `{{host}}`, `{{service}}` and `{{window}}` placeholders are filled per replica
//! ([`fill_query`], [`promql_duration`]); its value is the query's one sample at the window's
//! end, no sample (or NaN) meaning no data. There is no `min_requests`: a query says itself
//! what traffic it needs.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::domain::duration::serde_duration;

mod verdict;
pub use verdict::{verdict_event, verdict_table};

/// Where the numbers come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AnalysisSource {
    /// Each replica's own Prometheus text page (`metrics_url`).
    #[default]
    Engine,
    /// A PromQL query per check and replica, on the config's `prometheus:` server.
    Prometheus,
}

/// What an inconclusive check (not enough data) counts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnInconclusive {
    /// The step fails (default: no evidence is no pass).
    #[default]
    Fail,
    /// The check passes.
    Pass,
    /// An operator decides: the step waits for an approval (docs/reference.md#approve) up to
    /// the step's `approve_timeout`, and fails `not_approved` without one.
    Ask,
}

/// An `analyze` step's settings (omitted ones take `domain::defaults`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnalyzeSpec {
    /// Where the numbers come from.
    #[serde(default)]
    pub source: AnalysisSource,
    /// Sampled, not judged: the window starts after it.
    #[serde(with = "serde_duration", default = "default_warmup")]
    pub warmup: Duration,
    /// The judged window.
    #[serde(with = "serde_duration", default = "default_duration")]
    pub duration: Duration,
    /// Time between scrapes.
    #[serde(with = "serde_duration", default = "default_interval")]
    pub interval: Duration,
    /// At least one; names are unique.
    pub checks: Vec<Check>,
    /// How long an inconclusive check with `on_inconclusive: ask` waits for an approval.
    #[serde(with = "serde_duration", default = "default_approve_timeout")]
    pub approve_timeout: Duration,
    /// Another compose service's log (the proxy's) watched for lines naming the target; the
    /// lines of the warm-up are not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch: Option<crate::domain::pattern::CompanionWatch>,
}

fn default_approve_timeout() -> Duration {
    crate::domain::defaults::APPROVE_TIMEOUT
}

fn default_warmup() -> Duration {
    crate::domain::defaults::ANALYZE_WARMUP
}

fn default_duration() -> Duration {
    crate::domain::defaults::ANALYZE_DURATION
}

fn default_interval() -> Duration {
    crate::domain::defaults::ANALYZE_INTERVAL
}

impl AnalyzeSpec {
    /// Whether an inconclusive verdict of some check waits for an operator.
    pub fn may_ask(&self) -> bool {
        self.checks
            .iter()
            .any(|c| c.on_inconclusive == OnInconclusive::Ask)
    }
}

/// One check: a histogram quantile or a counter increase over the window, and its limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    /// Unique within the step; named in `analysis_failed`.
    pub name: String,
    /// A histogram family (with `quantile`), e.g. `sglang:time_to_first_token_seconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub histogram: Option<String>,
    /// The quantile of `histogram`, in (0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantile: Option<f64>,
    /// A counter family, e.g. `sglang:num_requests_total`: its increase over the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counter: Option<String>,
    /// `source: prometheus`: the PromQL query, with `{{host}}`, `{{service}}` and
    /// `{{window}}` placeholders (see [`fill_query`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// The target's value may be at most this times the peers' median.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ratio_to_peers: Option<f64>,
    /// Absolute upper bound of the target's value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    /// Absolute lower bound of the target's value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    /// Requests a replica must have served in the window for its value to count; see
    /// [`Check::min_requests`] for the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_requests: Option<u64>,
    /// What not enough data counts as.
    #[serde(default)]
    pub on_inconclusive: OnInconclusive,
}

impl Check {
    /// `min_requests`, or by default 1 for a histogram (a quantile needs observations) and 0
    /// for a counter or a query.
    pub fn min_requests(&self) -> u64 {
        let default = match self.histogram {
            Some(_) => crate::domain::defaults::ANALYZE_MIN_REQUESTS,
            None => 0,
        };
        self.min_requests.unwrap_or(default)
    }

    /// The family it reads.
    pub fn family(&self) -> &str {
        self.histogram
            .as_deref()
            .or(self.counter.as_deref())
            .unwrap_or_default()
    }
}

/// What a window gave for one replica and one check.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Observed {
    /// The quantile or the counter increase; `None` without data (no successful scrape in
    /// the window, no such family on the page, no observation).
    pub value: Option<f64>,
    /// Requests served in the window (the histogram's `_count` increase; for a counter check,
    /// the increase itself). `None` for a Prometheus query, which has no request count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<f64>,
}

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Pass,
    Fail,
    Inconclusive,
}

impl Verdict {
    /// `pass`, `fail` or `inconclusive`, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
            Verdict::Inconclusive => "inconclusive",
        }
    }
}

/// One check's verdict with every number it used (stored as the step's evidence, in
/// `checks`). Read back, every key but `name` and `verdict` may be missing: a verdict stored
/// by an older build still reads, with what it has.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckVerdict {
    pub name: String,
    pub verdict: Verdict,
    /// Whether the step fails because of this check (a failure, or an inconclusive verdict
    /// with `on_inconclusive: fail`).
    #[serde(default)]
    pub fails_step: bool,
    /// Whether this check leaves the decision to an operator (inconclusive, with
    /// `on_inconclusive: ask`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub asks: bool,
    #[serde(default)]
    pub target: Observed,
    #[serde(default)]
    pub peers: BTreeMap<String, Observed>,
    /// Median of the peers whose value counts (`None` when none does).
    #[serde(default)]
    pub peer_median: Option<f64>,
    /// Target ÷ peer median.
    #[serde(default)]
    pub ratio: Option<f64>,
    #[serde(default)]
    pub max_ratio_to_peers: Option<f64>,
    #[serde(default)]
    pub max: Option<f64>,
    #[serde(default)]
    pub min: Option<f64>,
    #[serde(default)]
    pub min_requests: u64,
    #[serde(default)]
    pub on_inconclusive: OnInconclusive,
    /// Why it is not a pass, in words (empty for a pass).
    #[serde(default)]
    pub reasons: Vec<String>,
    /// `source: prometheus`: the query sent for each replica, by replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queries: Option<BTreeMap<String, String>>,
}

/// The median (mean of the middle two for an even count); `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    })
}

fn usable(o: &Observed, min_requests: u64) -> Option<f64> {
    o.value
        .filter(|_| o.requests.is_none_or(|r| r >= min_requests as f64))
}

/// Judges one check from the window's numbers.
pub fn judge(check: &Check, target: Observed, peers: BTreeMap<String, Observed>) -> CheckVerdict {
    let mut reasons = Vec::new();
    let peer_values: Vec<f64> = peers
        .values()
        .filter_map(|o| usable(o, check.min_requests()))
        .collect();
    let peer_median = median(&peer_values);
    let target_value = usable(&target, check.min_requests());
    let ratio = match (target_value, peer_median) {
        (Some(t), Some(m)) if m > 0.0 => Some(t / m),
        (Some(0.0), Some(_)) => Some(1.0),
        _ => None,
    };
    let mut failed = false;
    let mut inconclusive = false;
    match target_value {
        None if target.value.is_none() => {
            inconclusive = true;
            reasons.push("no data for the target in the window".to_owned());
        }
        None => {
            inconclusive = true;
            reasons.push(format!(
                "the target served {} requests in the window, fewer than min_requests {}",
                target.requests.unwrap_or_default(),
                check.min_requests()
            ));
        }
        Some(value) => {
            if let Some(max) = check.max.filter(|max| value > *max) {
                failed = true;
                reasons.push(format!("{} is above max {max}", shown(value)));
            }
            if let Some(min) = check.min.filter(|min| value < *min) {
                failed = true;
                reasons.push(format!("{} is below min {min}", shown(value)));
            }
            if let Some(limit) = check.max_ratio_to_peers {
                match (ratio, peer_median) {
                    (Some(r), _) if r > limit => {
                        failed = true;
                        reasons.push(format!(
                            "{r:.3}× the peers' median ({}) is above max_ratio_to_peers {limit}",
                            shown(peer_median.unwrap_or_default())
                        ));
                    }
                    (Some(_), _) => {}
                    (None, Some(_)) => {
                        inconclusive = true;
                        reasons.push("the peers' median is 0: no ratio".to_owned());
                    }
                    (None, None) => {
                        inconclusive = true;
                        reasons.push(format!(
                            "no peer served min_requests {} requests in the window",
                            check.min_requests()
                        ));
                    }
                }
            }
        }
    }
    let verdict = if failed {
        Verdict::Fail
    } else if inconclusive {
        Verdict::Inconclusive
    } else {
        Verdict::Pass
    };
    let fails_step = verdict == Verdict::Fail
        || (verdict == Verdict::Inconclusive && check.on_inconclusive == OnInconclusive::Fail);
    let asks = verdict == Verdict::Inconclusive && check.on_inconclusive == OnInconclusive::Ask;
    CheckVerdict {
        name: check.name.clone(),
        verdict,
        fails_step,
        asks,
        target,
        peers,
        peer_median,
        ratio,
        max_ratio_to_peers: check.max_ratio_to_peers,
        max: check.max,
        min: check.min,
        min_requests: check.min_requests(),
        on_inconclusive: check.on_inconclusive,
        reasons,
        queries: None,
    }
}

/// The placeholders a Prometheus query may hold.
pub const PLACEHOLDERS: &[&str] = &["host", "service", "window"];

/// The first `{{name}}` in `query` that is not one of [`PLACEHOLDERS`] (or an unclosed
/// `{{`), for the runbook parser.
pub fn unknown_placeholder(query: &str) -> Option<String> {
    let mut rest = query;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            return Some(rest[start..].chars().take(20).collect());
        };
        let name = &after[..end];
        if !PLACEHOLDERS.contains(&name) {
            return Some(format!("{{{{{name}}}}}"));
        }
        rest = &after[end + 2..];
    }
    None
}

/// `query` with `{{host}}`, `{{service}}` and `{{window}}` replaced. Host and service names
/// are config names (letters, digits, `.`, `_`, `-`), safe inside a PromQL string.
pub fn fill_query(query: &str, host: &str, service: &str, window: Duration) -> String {
    query
        .replace("{{host}}", host)
        .replace("{{service}}", service)
        .replace("{{window}}", &promql_duration(window))
}

/// A duration as PromQL writes it, in the largest unit that divides it: `30m`, `90s`,
/// `1500ms`, `2h`, `1d` (a zero duration is `0s`).
pub fn promql_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".to_owned();
    }
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// Whether a counter check is already lost before the window ends: counters only grow, so
/// a target increase above `max` cannot come back.
pub fn lost_early(check: &Check, target_so_far: f64) -> bool {
    check.counter.is_some() && check.max.is_some_and(|max| target_so_far > max)
}

/// A measured value as a message shows it: at most 4 decimals, no trailing zeros
/// (`0.3802`, not `0.3801980198019802`).
fn shown(x: f64) -> String {
    let text = format!("{x:.4}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".to_owned()
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(ratio: Option<f64>, max: Option<f64>, min: Option<f64>, min_requests: u64) -> Check {
        Check {
            name: "c".into(),
            histogram: Some("h".into()),
            quantile: Some(0.95),
            counter: None,
            query: None,
            max_ratio_to_peers: ratio,
            max,
            min,
            min_requests: Some(min_requests),
            on_inconclusive: OnInconclusive::Fail,
        }
    }

    fn obs(value: Option<f64>, requests: f64) -> Observed {
        Observed {
            value,
            requests: Some(requests),
        }
    }

    fn peers(list: &[(f64, f64)]) -> BTreeMap<String, Observed> {
        list.iter()
            .enumerate()
            .map(|(i, (v, r))| (format!("p{i}"), obs(Some(*v), *r)))
            .collect()
    }

    #[test]
    fn the_median_of_the_peers_is_the_baseline() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0]), Some(2.5));
        assert_eq!(median(&[9.0, 1.0, 2.0]), Some(2.0));
    }

    /// (what, check, target, peers as (value, requests), verdict, fails_step, ratio)
    type Row = (
        &'static str,
        Check,
        Observed,
        Vec<(f64, f64)>,
        Verdict,
        bool,
        Option<f64>,
    );

    #[test]
    fn verdicts_follow_the_limits_and_the_data() {
        let ratio = check(Some(1.2), None, None, 50);
        let table: Vec<Row> = vec![
            (
                "2x slower",
                ratio.clone(),
                obs(Some(0.8), 100.0),
                vec![(0.4, 100.0)],
                Verdict::Fail,
                true,
                Some(2.0),
            ),
            (
                "1.1x passes",
                ratio.clone(),
                obs(Some(0.44), 100.0),
                vec![(0.4, 100.0)],
                Verdict::Pass,
                false,
                Some(1.1),
            ),
            (
                "exactly the limit passes",
                ratio.clone(),
                obs(Some(0.6), 100.0),
                vec![(0.5, 100.0)],
                Verdict::Pass,
                false,
                Some(1.2),
            ),
            (
                "median of three peers",
                ratio.clone(),
                obs(Some(0.5), 100.0),
                vec![(0.1, 100.0), (0.4, 100.0), (9.0, 100.0)],
                Verdict::Fail,
                true,
                Some(1.25),
            ),
            (
                "too few target requests",
                ratio.clone(),
                obs(Some(0.8), 49.0),
                vec![(0.4, 100.0)],
                Verdict::Inconclusive,
                true,
                None,
            ),
            (
                "no target data",
                ratio.clone(),
                obs(None, 0.0),
                vec![(0.4, 100.0)],
                Verdict::Inconclusive,
                true,
                None,
            ),
            (
                "no peer with enough requests",
                ratio.clone(),
                obs(Some(0.4), 100.0),
                vec![(0.4, 10.0)],
                Verdict::Inconclusive,
                true,
                None,
            ),
            (
                "a thin peer is left out",
                ratio.clone(),
                obs(Some(0.4), 100.0),
                vec![(0.4, 100.0), (0.01, 3.0)],
                Verdict::Pass,
                false,
                Some(1.0),
            ),
            (
                "above max",
                check(None, Some(1.0), None, 0),
                obs(Some(2.0), 5.0),
                vec![],
                Verdict::Fail,
                true,
                None,
            ),
            (
                "below min",
                check(None, None, Some(1.0), 0),
                obs(Some(0.0), 0.0),
                vec![],
                Verdict::Fail,
                true,
                None,
            ),
            (
                "within min",
                check(None, None, Some(1.0), 0),
                obs(Some(3.0), 3.0),
                vec![],
                Verdict::Pass,
                false,
                None,
            ),
        ];
        for (what, check, target, peer_list, verdict, fails, want_ratio) in table {
            let v = judge(&check, target, peers(&peer_list));
            assert_eq!(v.verdict, verdict, "{what}: {:?}", v.reasons);
            assert_eq!(v.fails_step, fails, "{what}");
            match (v.ratio, want_ratio) {
                (Some(g), Some(w)) => assert!((g - w).abs() < 1e-9, "{what}: ratio {g}"),
                (g, w) => assert_eq!(g, w, "{what}"),
            }
            assert_eq!(v.reasons.is_empty(), verdict == Verdict::Pass, "{what}");
        }
    }

    #[test]
    fn an_inconclusive_check_passes_only_when_told_to() {
        let mut c = check(Some(1.2), None, None, 50);
        let v = judge(&c, obs(None, 0.0), peers(&[(0.4, 100.0)]));
        assert!(v.fails_step);
        c.on_inconclusive = OnInconclusive::Pass;
        let v = judge(&c, obs(None, 0.0), peers(&[(0.4, 100.0)]));
        assert_eq!(v.verdict, Verdict::Inconclusive);
        assert!(!v.fails_step);
    }

    #[test]
    fn placeholders_are_filled_per_replica_with_the_window_in_promql() {
        let q = r#"histogram_quantile(0.95, sum by (le) (rate(x_bucket{host="{{host}}",container_name="{{service}}"}[{{window}}])))"#;
        // (window, PromQL duration)
        let table = [
            (Duration::from_secs(1800), "30m"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_secs(7200), "2h"),
            (Duration::from_secs(86_400), "1d"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_secs(5), "5s"),
            (Duration::ZERO, "0s"),
        ];
        for (window, text) in table {
            assert_eq!(promql_duration(window), text, "{window:?}");
        }
        assert_eq!(
            fill_query(q, "gpu02", "model-r2", Duration::from_secs(1800)),
            r#"histogram_quantile(0.95, sum by (le) (rate(x_bucket{host="gpu02",container_name="model-r2"}[30m])))"#
        );
        assert_eq!(
            fill_query(
                "a{s=\"{{service}}\"} / b{s=\"{{service}}\"}",
                "h",
                "r1",
                Duration::ZERO
            ),
            "a{s=\"r1\"} / b{s=\"r1\"}",
            "every occurrence"
        );
        // (query, the unknown placeholder)
        let table = [
            (q, None),
            ("up", None),
            ("x{a=\"{{hosts}}\"}", Some("{{hosts}}")),
            ("x[{{ window }}]", Some("{{ window }}")),
            ("x[{{window]", Some("{{window]")),
        ];
        for (query, unknown) in table {
            assert_eq!(unknown_placeholder(query).as_deref(), unknown, "{query}");
        }
    }

    #[test]
    fn a_query_value_needs_no_request_count() {
        let mut c = check(Some(1.2), None, None, 0);
        c.histogram = None;
        c.quantile = None;
        c.query = Some("q".into());
        let none = |value| Observed {
            value,
            requests: None,
        };
        let peers = BTreeMap::from([("p".to_owned(), none(Some(0.4)))]);
        let v = judge(&c, none(Some(0.8)), peers.clone());
        assert_eq!(v.verdict, Verdict::Fail, "{:?}", v.reasons);
        assert_eq!(v.ratio, Some(2.0));
        let v = judge(&c, none(None), peers);
        assert_eq!(v.verdict, Verdict::Inconclusive);
        assert_eq!(v.reasons, ["no data for the target in the window"]);
        let json = serde_json::to_value(&v).expect("serialises");
        assert!(json["target"].get("requests").is_none(), "{json}");
    }

    #[test]
    fn only_a_counter_above_its_max_is_lost_early() {
        let mut c = check(None, Some(0.0), None, 0);
        assert!(!lost_early(&c, 3.0), "a histogram can still come back");
        c.histogram = None;
        c.quantile = None;
        c.counter = Some("errors_total".into());
        assert!(lost_early(&c, 1.0));
        assert!(!lost_early(&c, 0.0));
    }

    #[test]
    fn a_value_in_a_message_has_at_most_four_decimals() {
        let cases = [
            (0.3801980198019802, "0.3802"),
            (2.0, "2"),
            (100.0, "100"),
            (0.25, "0.25"),
            (-0.00001, "0"),
        ];
        for (x, want) in cases {
            assert_eq!(shown(x), want, "{x}");
        }
    }
}
