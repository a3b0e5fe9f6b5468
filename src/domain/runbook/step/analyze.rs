//! An `analyze` step: the analysis spec of `domain::analysis`, and what serde cannot say
//! about it and its checks.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::approve::ApproveEvidence;
use super::soak::{RestartEvidence, WatchedEvidence};
use super::{Checked, interval_within, positive_duration, valid_name};
use crate::domain::analysis::{
    unknown_placeholder, verdict_table, AnalysisSource, AnalyzeSpec, Check, CheckVerdict,
    PLACEHOLDERS,
};

/// What is wrong with a check (named `at`, as `check "ttft_p95"`), of an analysis of `source`.
fn check_problem(check: &Check, source: AnalysisSource) -> Option<String> {
    let at = format!("check \"{}\"", check.name);
    let texts = [
        ("histogram", &check.histogram),
        ("counter", &check.counter),
        ("query", &check.query),
    ];
    if let Some((key, _)) = texts
        .iter()
        .find(|(_, t)| t.as_deref().is_some_and(|t| t.trim().is_empty()))
    {
        return Some(format!("{at}: `{key}` must be a non-empty string"));
    }
    let numbers = [
        ("quantile", check.quantile),
        ("max_ratio_to_peers", check.max_ratio_to_peers),
        ("max", check.max),
        ("min", check.min),
    ];
    if let Some((key, n)) = numbers.iter().find(|(_, n)| n.is_some_and(|n| !n.is_finite())) {
        return Some(format!("{at}: `{key}` must be a number, got `{}`", n.unwrap_or_default()));
    }
    let (histogram, counter) = (&check.histogram, &check.counter);
    if source == AnalysisSource::Prometheus {
        let engine_only = [
            ("histogram", histogram.is_some()),
            ("quantile", check.quantile.is_some()),
            ("counter", counter.is_some()),
            ("min_requests", check.min_requests.is_some()),
        ];
        if let Some((key, _)) = engine_only.iter().find(|(_, given)| *given) {
            return Some(format!("{at}: `{key}` is for `source: engine`; with `source: prometheus` a check is a PromQL `query` (put any traffic condition in it)"));
        }
        let Some(q) = &check.query else {
            return Some(format!("{at}: `source: prometheus` needs a PromQL `query`, e.g. 'histogram_quantile(0.95, sum by (le) (rate(sglang:time_to_first_token_seconds_bucket{{host=\"{{{{host}}}}\",container_name=\"{{{{service}}}}\"}}[{{{{window}}}}])))'"));
        };
        if let Some(bad) = unknown_placeholder(q) {
            let known: Vec<String> = PLACEHOLDERS.iter().map(|p| format!("{{{{{p}}}}}")).collect();
            return Some(format!(
                "{at}: `query` has an unknown placeholder `{bad}` (known: {})",
                known.join(", ")
            ));
        }
    } else if check.query.is_some() {
        return Some(format!("{at}: `query` is for `source: prometheus`; with `source: engine` name a `histogram` (with `quantile`) or a `counter`"));
    } else {
        match (histogram, counter, check.quantile) {
            (Some(_), Some(_), _) | (None, None, _) => {
                return Some(format!(
                    "{at}: name exactly one of `histogram` (with `quantile`) or `counter`"
                ))
            }
            (Some(_), None, Some(q)) if q > 0.0 && q <= 1.0 => {}
            (Some(_), None, _) => return Some(format!(
                "{at}: a `histogram` check needs `quantile` between 0 (excluded) and 1, e.g. 0.95"
            )),
            (None, Some(_), Some(_)) => {
                return Some(format!("{at}: a `counter` check takes no `quantile`"))
            }
            (None, Some(_), None) => {}
        }
    }
    if check.max_ratio_to_peers.is_some_and(|r| r <= 0.0) {
        return Some(format!("{at}: `max_ratio_to_peers` must be above 0"));
    }
    match (check.max, check.min) {
        (None, None) if check.max_ratio_to_peers.is_none() => Some(format!(
            "{at}: give at least one limit: `max_ratio_to_peers`, `max` or `min`"
        )),
        (Some(max), Some(min)) if min > max => {
            Some(format!("{at}: `min` ({min}) is above `max` ({max})"))
        }
        _ => None,
    }
}

/// The `analyze` step's settings are the analysis spec of `domain::analysis`.
pub type Analyze = AnalyzeSpec;

impl super::StepDef for AnalyzeSpec {
    const NAME: &'static str = "analyze";
    const DOC: &'static str =
        "scrapes the target and its peers; after `warmup`, judges each check over `duration`";
    const FIELDS: &'static [&'static str] = &[
        "source",
        "warmup",
        "duration",
        "interval",
        "checks",
        "approve_timeout",
        "watch",
    ];

    fn check(&self) -> Checked {
        positive_duration("duration", self.duration)?;
        positive_duration("interval", self.interval)?;
        interval_within(self.interval, self.duration, "duration")?;
        positive_duration("approve_timeout", self.approve_timeout)?;
        if let Some(w) = &self.watch {
            if w.patterns.is_empty() {
                let msg = "`watch.patterns` must name at least one line to count".to_owned();
                return Err(("watch", msg));
            }
            if self.source == AnalysisSource::Prometheus {
                let msg = "`watch` reads a companion's log at each scrape of the engines: with `source: prometheus` there are none (watch it in a `soak`)".to_owned();
                return Err(("watch", msg));
            }
        }
        if self.checks.is_empty() {
            let message = "`checks` is empty: an analysis needs at least one check";
            return Err(("checks", message.to_string()));
        }
        for (i, check) in self.checks.iter().enumerate() {
            let problem = if !valid_name(&check.name) {
                Some(format!("`checks[{i}]`: `name` must be 1 to 64 letters, digits, `-`, `_` or `.`, got \"{}\"", check.name))
            } else if self.checks[..i].iter().any(|c| c.name == check.name) {
                Some(format!("`checks[{i}]`: duplicate check name \"{}\"", check.name))
            } else {
                check_problem(check, self.source)
            };
            if let Some(problem) = problem {
                return Err(("checks", problem));
            }
        }
        Ok(())
    }

    /// Scrapes run until warmup + duration; a last slow scrape may end past it.
    fn budget(&self) -> std::time::Duration {
        let scrapes = self.warmup + self.duration + self.interval + std::time::Duration::from_secs(60);
        // An inconclusive check that asks waits for an operator after the window.
        scrapes + if self.may_ask() { self.approve_timeout } else { std::time::Duration::ZERO }
    }

    type Evidence = AnalyzeEvidence;

    /// `ttft_p95 pass 0.412 vs peers 0.405 (1.02×, limit 1.2×); took_traffic pass 250`.
    fn summary(d: &AnalyzeEvidence) -> Option<String> {
        let number = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x:.3}"));
        let summary = d
            .verdicts()
            .iter()
            .map(|c| {
                let mut line = format!(
                    "{} {} {}",
                    c.name,
                    c.verdict.as_str(),
                    number(c.target.value)
                );
                if c.max_ratio_to_peers.is_some() {
                    line.push_str(&format!(
                        " vs peers {} ({}×, limit {}×)",
                        number(c.peer_median),
                        number(c.ratio),
                        number(c.max_ratio_to_peers)
                    ));
                }
                line
            })
            .collect::<Vec<_>>()
            .join("; ");
        Some(summary).filter(|s| !s.is_empty())
    }
}

/// An `analyze` step's evidence, saved as it goes: the window, each replica (its scrapes, or
/// with `source: prometheus` each query and its answer), each check's series, the watch of the
/// target's container and of the window, and at the end every check's verdict and what an
/// operator was asked.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AnalyzeEvidence {
    /// Where the numbers come from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<AnalysisSource>,
    /// `source: prometheus`: the server asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus_url: Option<String>,
    /// The end of the warm-up: the window's start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_ends_at: Option<DateTime<Utc>>,
    /// The window's end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ends_at: Option<DateTime<Utc>>,
    /// `source: prometheus`: the window as the queries' `{{window}}` (`30m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    /// `source: prometheus`: when the queries were evaluated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluated_at: Option<DateTime<Utc>>,
    /// Each replica judged, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub replicas: BTreeMap<String, AnalyzedReplica>,
    /// `source: prometheus`: every query and its answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queries: Option<Vec<QueryEvidence>>,
    /// Every check's verdict once judged (`null` while `source: engine` scrapes).
    #[serde(
        default,
        deserialize_with = "super::present",
        skip_serializing_if = "Option::is_none"
    )]
    pub checks: Option<Option<Vec<CheckVerdict>>>,
    /// `source: engine`: each check's value per interval and replica, by check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub series: Option<BTreeMap<String, CheckSeries>>,
    /// The reads of the target's container (`now`: the read that saw it restart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<RestartEvidence>,
    /// How much of the window was watched.
    #[serde(flatten)]
    pub watched: Option<WatchedEvidence>,
    /// A counter check the target had already lost ended the step before the window's end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_early: Option<bool>,
    /// The inconclusive checks that ask an operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asking: Option<Vec<String>>,
    /// `true` while the step waits for an operator's approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub awaiting_approval: Option<bool>,
    /// The end of that wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DateTime<Utc>>,
    /// The watched companion's lines naming the target (`watch`), past the warm-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub companion: Option<super::soak::CompanionLines>,
    /// The operator's approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApproveEvidence>,
}

impl AnalyzeEvidence {
    /// Every check's verdict; empty before the step judged.
    pub fn verdicts(&self) -> &[CheckVerdict] {
        self.checks.as_ref().and_then(Option::as_deref).unwrap_or_default()
    }

    /// The target's name; empty when the evidence names none.
    pub fn target(&self) -> &str {
        self.replicas
            .iter()
            .find(|(_, r)| r.role == Role::Target)
            .map_or("", |(name, _)| name.as_str())
    }

    /// The verdicts as text, one small table per check; `None` before the step judged.
    pub fn verdict_table(&self) -> Option<String> {
        verdict_table(self.target(), self.verdicts())
    }
}

/// What a replica is to the analysis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Target,
    Peer,
}

impl Role {
    /// `target` or `peer`, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Target => "target",
            Role::Peer => "peer",
        }
    }
}

/// A replica of an analysis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnalyzedReplica {
    pub role: Role,
    /// `source: engine`: its page and how the scrapes went.
    #[serde(flatten)]
    pub scrapes: Option<Scrapes>,
}

/// The scrapes of a replica's metrics page (`source: engine`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scrapes {
    /// The page.
    pub metrics_url: String,
    /// Scrapes that read the page.
    pub scrapes: u64,
    /// Scrapes that failed.
    pub scrape_errors: u64,
    /// Scrapes read inside the window.
    pub window_scrapes: u64,
    /// The last failed scrape's error.
    pub last_error: Option<String>,
}

/// One query of a `source: prometheus` analysis: check `check`'s for `replica`, and its
/// answer once evaluated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueryEvidence {
    /// The check's name.
    pub check: String,
    pub replica: String,
    pub role: Role,
    /// The query as sent, its placeholders filled.
    pub query: String,
    /// Samples answered: 0 or 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<u8>,
    /// The sample's value as Prometheus wrote it (`"0.25"`, `"NaN"`); `null` without one.
    #[serde(
        default,
        deserialize_with = "super::present",
        skip_serializing_if = "Option::is_none"
    )]
    pub value: Option<Option<String>>,
    /// Why Prometheus gave no answer (masked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One check's series: its value per interval, per replica. A quantile is drawn as lines, a
/// counter's increase as bars.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckSeries {
    pub shape: SeriesShape,
    /// The values' unit, when the metric's name says it: `s` for a `*_seconds` histogram's
    /// quantile (the page draws milliseconds below a second).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// By replica: `[unix_ms, value]` per interval, `null` for a failed scrape.
    pub points: BTreeMap<String, Vec<(i64, Option<f64>)>>,
}

/// How a check's series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SeriesShape {
    /// A histogram's quantile: lines.
    Quantile,
    /// A counter's increase, or a histogram's observations: bars.
    Counter,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::{Analyze, AnalyzeEvidence};
    use crate::domain::runbook::step::evidence;
    use crate::domain::runbook::step::evidence_tests::{merged, same_json_and_summary};

    use crate::domain::analysis::{AnalysisSource, OnInconclusive};
    use crate::domain::runbook::{parse, StepKind};
    use crate::domain::runbook::step::StepDef;

    fn one(step: &str) -> Result<crate::domain::runbook::Runbook, String> {
        parse("r", "r.yaml", &format!("steps:\n  - {step}\n")).map_err(|e| e.to_string())
    }

    #[test]
    fn a_check_that_asks_adds_the_approval_wait_to_the_budget_and_old_runbooks_keep_loading() {
        let spec = |on: &str| {
            let rb = one(&format!("{{kind: analyze, warmup: 1m, duration: 10m, interval: 30s, approve_timeout: 1h, checks: [{{name: t, counter: c, min: 1, on_inconclusive: {on}}}]}}"))
                .unwrap_or_else(|e| panic!("{e}"));
            let StepKind::Analyze(spec) = rb.steps[0].kind.clone() else {
                panic!("an analyze step");
            };
            spec
        };
        let asks = spec("ask");
        assert_eq!(asks.checks[0].on_inconclusive, OnInconclusive::Ask);
        assert_eq!(asks.approve_timeout, Duration::from_secs(3600));
        let scrapes = Duration::from_secs(60 + 600 + 30 + 60);
        assert_eq!(StepDef::budget(&asks), scrapes + Duration::from_secs(3600));
        assert_eq!(StepDef::budget(&spec("fail")), scrapes, "nobody is asked: no wait");
        // A runbook stored before `approve_timeout` existed reads with the default.
        let mut json = serde_json::to_value(&asks).expect("serialises");
        json.as_object_mut().expect("object").remove("approve_timeout");
        let old: crate::domain::analysis::AnalyzeSpec =
            serde_json::from_value(json).expect("an old stored step");
        assert_eq!(old.approve_timeout, crate::domain::runbook::defaults::APPROVE_TIMEOUT);
    }

    #[test]
    fn an_analyze_step_reads_its_checks_with_their_defaults() {
        let rb = one("{name: analysis, kind: analyze, duration: 30m, checks: [{name: ttft_p95, histogram: \"sglang:time_to_first_token_seconds\", quantile: 0.95, max_ratio_to_peers: 1.2}, {name: took_traffic, counter: \"sglang:num_requests_total\", min: 1, on_inconclusive: pass}]}")
            .unwrap_or_else(|e| panic!("{e}"));
        let StepKind::Analyze(spec) = &rb.steps[0].kind else {
            panic!("{:?}", rb.steps[0].kind)
        };
        assert_eq!(spec.source, AnalysisSource::Engine);
        assert_eq!(spec.warmup, Duration::from_secs(600));
        assert_eq!(spec.duration, Duration::from_secs(1800));
        assert_eq!(spec.interval, Duration::from_secs(30));
        assert_eq!(
            spec.checks[0].min_requests(), 1,
            "a quantile needs observations"
        );
        assert_eq!(spec.checks[0].on_inconclusive, OnInconclusive::Fail);
        assert_eq!(spec.checks[1].min_requests(), 0);
        assert_eq!(spec.checks[1].on_inconclusive, OnInconclusive::Pass);
        let json = serde_json::to_value(&rb).expect("serialises");
        assert_eq!(json["steps"][0]["kind"], "analyze");
        assert_eq!(json["steps"][0]["warmup"], "10m");
        let back: crate::domain::runbook::Runbook =
            serde_json::from_value(json).expect("deserialises");
        assert_eq!(back, rb);
        let zero = one("{kind: analyze, warmup: 0s, duration: 1s, interval: 100ms, checks: [{name: t, counter: c, min: 1}]}")
            .unwrap_or_else(|e| panic!("{e}"));
        let StepKind::Analyze(spec) = &zero.steps[0].kind else {
            panic!()
        };
        assert_eq!(spec.warmup, Duration::ZERO, "no warm-up is allowed");
    }

    #[test]
    fn a_prometheus_analysis_reads_its_queries() {
        let rb = one(r#"{name: analysis, kind: analyze, source: prometheus, warmup: 1m, duration: 30m, checks: [{name: ttft_p95, query: 'histogram_quantile(0.95, sum by (le) (rate(sglang_time_to_first_token_seconds_bucket{host="{{host}}",container_name="{{service}}"}[{{window}}])))', max_ratio_to_peers: 1.2}, {name: took_traffic, query: 'sum(increase(sglang:num_requests_total{container_name="{{service}}"}[{{window}}]))', min: 1, on_inconclusive: pass}]}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        let StepKind::Analyze(spec) = &rb.steps[0].kind else {
            panic!("{:?}", rb.steps[0].kind)
        };
        assert_eq!(spec.source, AnalysisSource::Prometheus);
        let c = &spec.checks[0];
        assert!(
            c.query
                .as_deref()
                .is_some_and(|q| q.contains("[{{window}}]")),
            "{c:?}"
        );
        assert_eq!((c.histogram.as_deref(), c.counter.as_deref()), (None, None));
        assert_eq!(c.min_requests(), 0, "no request count with a query");
        assert_eq!(spec.checks[1].on_inconclusive, OnInconclusive::Pass);
        let json = serde_json::to_value(&rb).expect("serialises");
        assert_eq!(json["steps"][0]["source"], "prometheus");
        let back: crate::domain::runbook::Runbook =
            serde_json::from_value(json).expect("deserialises");
        assert_eq!(back, rb);
    }

    #[test]
    fn bad_analyze_steps_are_refused_naming_the_step_and_check() {
        let h = "histogram: h, quantile: 0.95";
        let cases = [
            ("histogram with prometheus", format!("{{name: a, kind: analyze, source: prometheus, checks: [{{name: t, {h}, max: 1}}]}}"), "r.yaml:2: step 1 \"a\": check \"t\": `histogram` is for `source: engine`"),
            ("min_requests with prometheus", "{name: a, kind: analyze, source: prometheus, checks: [{name: t, query: up, max: 1, min_requests: 5}]}".to_owned(), "check \"t\": `min_requests` is for `source: engine`"),
            ("no query with prometheus", "{name: a, kind: analyze, source: prometheus, checks: [{name: t, max: 1}]}".to_owned(), "check \"t\": `source: prometheus` needs a PromQL `query`"),
            ("unknown placeholder", "{name: a, kind: analyze, source: prometheus, checks: [{name: t, query: 'up{instance=\"{{instance}}\"}', max: 1}]}".to_owned(), "check \"t\": `query` has an unknown placeholder `{{instance}}` (known: {{host}}, {{service}}, {{window}})"),
            ("query with engine", "{name: a, kind: analyze, checks: [{name: t, query: up, max: 1}]}".to_owned(), "check \"t\": `query` is for `source: prometheus`"),
            ("no limit with prometheus", "{name: a, kind: analyze, source: prometheus, checks: [{name: t, query: up}]}".to_owned(), "give at least one limit"),
            ("unknown source", "{name: a, kind: analyze, source: graphite, checks: [{name: t, query: up, max: 1}]}".to_owned(), "step 1 \"a\": `source`: unknown variant `graphite`, expected `engine` or `prometheus`"),
            ("no checks", "{name: a, kind: analyze}".to_owned(), "r.yaml:2: step 1 \"a\": missing field `checks`"),
            ("empty checks", "{name: a, kind: analyze, checks: []}".to_owned(), "`checks` is empty"),
            ("unknown check field", format!("{{name: a, kind: analyze, checks: [{{name: t, {h}, max: 1, limit: 2}}]}}"), "`checks[0]`: unknown field `limit`"),
            ("no quantile", "{name: a, kind: analyze, checks: [{name: t, histogram: h, max: 1}]}".to_owned(), "check \"t\": a `histogram` check needs `quantile`"),
            ("quantile above 1", "{name: a, kind: analyze, checks: [{name: t, histogram: h, quantile: 95, max: 1}]}".to_owned(), "needs `quantile` between 0"),
            ("both metrics", format!("{{name: a, kind: analyze, checks: [{{name: t, {h}, counter: c, max: 1}}]}}"), "name exactly one of"),
            ("no limit", format!("{{name: a, kind: analyze, checks: [{{name: t, {h}}}]}}"), "give at least one limit"),
            ("min above max", "{name: a, kind: analyze, checks: [{name: t, counter: c, min: 5, max: 1}]}".to_owned(), "`min` (5) is above `max` (1)"),
            ("duplicate check", "{name: a, kind: analyze, checks: [{name: t, counter: c, min: 1}, {name: t, counter: c, min: 1}]}".to_owned(), "duplicate check name \"t\""),
            ("bad on_inconclusive", "{name: a, kind: analyze, checks: [{name: t, counter: c, min: 1, on_inconclusive: maybe}]}".to_owned(), "`checks[0].on_inconclusive`: unknown variant `maybe`, expected one of `fail`, `pass`, `ask`"),
            ("interval over duration", "{name: a, kind: analyze, duration: 1s, interval: 5s, checks: [{name: t, counter: c, min: 1}]}".to_owned(), "`interval` (5s) is longer than `duration` (1s)"),
            ("unknown step field", "{name: a, kind: analyze, timeout: 5m, checks: [{name: t, counter: c, min: 1}]}".to_owned(), "unknown field `timeout` (a `analyze` step takes: source, warmup, duration, interval, checks, approve_timeout, watch)"),
            ("a watch of prometheus's analysis", "{name: a, kind: analyze, source: prometheus, watch: {service: proxy, patterns: [x]}, checks: [{name: t, query: q, max: 1}]}".to_owned(), "`watch` reads a companion's log at each scrape"),
        ];
        for (case, step, expected) in cases {
            let err = one(&step).expect_err(case);
            assert!(
                err.contains(expected),
                "{case}:\n  got:      {err}\n  expected: {expected}"
            );
        }
    }

    fn scrapes(role: &str, port: u16, last_error: Option<&str>) -> serde_json::Value {
        json!({"role": role, "metrics_url": format!("http://127.0.0.1:{port}/metrics"), "scrapes": 3,
               "scrape_errors": u64::from(last_error.is_some()), "window_scrapes": 2, "last_error": last_error})
    }

    fn read(id: &str) -> serde_json::Value {
        json!({"at": "2026-12-04T20:46:32.740318758Z", "id": id, "status": "Up 2 seconds"})
    }

    /// Two checks as the engine source judges them: a ratio that fails, a counter that passes.
    fn verdicts() -> serde_json::Value {
        json!([
            {"name": "ttft_p95", "verdict": "fail", "fails_step": true,
             "target": {"value": 0.58125, "requests": 212.0}, "peers": {"r1": {"value": 0.29, "requests": 210.0}},
             "peer_median": 0.29, "ratio": 2.0043, "max_ratio_to_peers": 1.2, "max": null, "min": null,
             "min_requests": 50, "on_inconclusive": "fail",
             "reasons": ["2.004× the peers' median (0.29) is above max_ratio_to_peers 1.2"]},
            {"name": "took_traffic", "verdict": "pass", "fails_step": false,
             "target": {"value": 250.0, "requests": 250.0}, "peers": {"r1": {"value": 248.0, "requests": 248.0}},
             "peer_median": 248.0, "ratio": 1.008, "max_ratio_to_peers": null, "max": null, "min": 1.0,
             "min_requests": 0, "on_inconclusive": "fail", "reasons": []},
        ])
    }

    #[test]
    fn stored_engine_analysis_evidence_reads_and_writes_back_the_same_json() {
        let running = json!({
            "source": "engine",
            "warmup_ends_at": "2026-12-04T20:49:01.660720535Z",
            "ends_at": "2026-12-04T20:49:31.660720535Z",
            "replicas": {"r1": scrapes("peer", 9001, None), "r2": scrapes("target", 9002, Some("HTTP 503"))},
            "checks": null,
            "series": {
                "took_traffic": {"shape": "counter", "points": {
                    "r1": [[1_764_881_341_660_i64, 3.0], [1_764_881_342_660_i64, null]], "r2": []}},
                "ttft_p95": {"shape": "quantile", "points": {"r1": [[1_764_881_341_660_i64, 0.25]], "r2": []}},
            },
            "restart": {"first": read("89ec98ad7f04"), "last": read("89ec98ad7f04"), "last_ps_error": null,
                        "ps_read_errors": 0, "ps_reads": 2},
            "observed_ms": 1_200,
        });
        let with = |more: serde_json::Value| merged(&running, more);
        let judged = with(json!({"checks": verdicts()}));
        let summary = "ttft_p95 fail 0.581 vs peers 0.290 (2.004×, limit 1.200×); took_traffic pass 250.000";
        let asks = json!([{"name": "itl", "verdict": "inconclusive", "fails_step": false, "asks": true,
                           "target": {"value": null, "requests": 0.0}, "peers": {}, "peer_median": null,
                           "ratio": null, "max_ratio_to_peers": null, "max": 0.5, "min": null,
                           "min_requests": 1, "on_inconclusive": "ask",
                           "reasons": ["no data for the target in the window"]}]);
        same_json_and_summary::<Analyze>(&[
            (json!({}), None),
            (running.clone(), None),
            (
                with(json!({"observed_ms": 300, "reobserved_ms": 300, "resumed": {
                    "observed_before_ms": 900, "unobserved_ms": 29_100,
                    "watch_from": "2026-12-04T20:49:10.660720535Z",
                    "watch_until": "2026-12-04T20:49:40.660720535Z"}})),
                None,
            ),
            (
                with(json!({"restart": {"first": read("89ec98ad7f04"), "last": read("89ec98ad7f04"),
                            "last_ps_error": null, "now": read("1234"), "ps_read_errors": 0, "ps_reads": 3}})),
                None,
            ),
            (
                with(json!({"restart": {"first": null, "last": null, "last_ps_error": "refused",
                            "now": null, "ps_read_errors": 1, "ps_reads": 1}})),
                None,
            ),
            (judged.clone(), Some(summary)),
            (merged(&judged, json!({"ended_early": true})), Some(summary)),
            (
                with(json!({"checks": asks, "asking": ["itl"], "awaiting_approval": true,
                            "deadline": "2026-12-04T21:49:31Z"})),
                Some("itl inconclusive -"),
            ),
            (
                with(json!({"checks": asks, "asking": ["itl"], "approval": {"approved_by": "alice",
                            "reason": "quiet hour", "approved_at": "2026-12-04T20:50:01.500Z", "waited_s": 30}})),
                Some("itl inconclusive -"),
            ),
        ]);
    }

    #[test]
    fn stored_prometheus_analysis_evidence_reads_and_writes_back_the_same_json() {
        let query = |replica: &str, role: &str| {
            json!({"check": "ttft_p95", "replica": replica, "role": role,
                   "query": format!("histogram_quantile(0.95, sum by (le) (rate(ttft_bucket{{container_name=\"{replica}\"}}[30m])))")})
        };
        let running = json!({
            "source": "prometheus",
            "prometheus_url": "http://127.0.0.1:9090",
            "warmup_ends_at": "2026-12-04T20:49:01.660720535Z",
            "ends_at": "2026-12-04T21:19:01.660720535Z",
            "window": "30m",
            "replicas": {"r1": {"role": "peer"}, "r2": {"role": "target"}},
            "queries": [query("r2", "target"), query("r1", "peer")],
            "restart": {"first": read("89ec98ad7f04"), "last": read("89ec98ad7f04"), "last_ps_error": null,
                        "ps_read_errors": 0, "ps_reads": 2},
            "observed_ms": 1_200,
        });
        let with = |more: serde_json::Value| merged(&running, more);
        let answered = json!([merged(&query("r2", "target"), json!({"samples": 1, "value": "0.25"})),
                              merged(&query("r1", "peer"), json!({"samples": 0, "value": null}))]);
        let checks = json!([{"name": "ttft_p95", "verdict": "inconclusive", "fails_step": true,
                             "target": {"value": 0.25}, "peers": {"r1": {"value": null}}, "peer_median": null,
                             "ratio": null, "max_ratio_to_peers": 1.2, "max": null, "min": null,
                             "min_requests": 0, "on_inconclusive": "fail",
                             "reasons": ["no peer has data in the window"],
                             "queries": {"r1": query("r1", "peer")["query"], "r2": query("r2", "target")["query"]}}]);
        same_json_and_summary::<Analyze>(&[
            (running.clone(), None),
            (
                with(json!({"queries": [merged(&query("r2", "target"), json!({"error": "HTTP 503: down"})),
                                        merged(&query("r1", "peer"), json!({"samples": 1, "value": "NaN"}))]})),
                None,
            ),
            (
                with(json!({"queries": answered, "evaluated_at": "2026-12-04T21:19:01.660720535Z",
                            "checks": checks})),
                Some("ttft_p95 inconclusive 0.250 vs peers - (-×, limit 1.200×)"),
            ),
        ]);
    }

    #[test]
    fn a_verdict_stored_by_an_older_build_still_shows_its_table() {
        // No `asks`, `min_requests`, `on_inconclusive`, `max` or `min`; no series, no source.
        let old = json!({
            "replicas": {"r1": {"role": "peer", "scrapes": 9}, "r2": {"role": "target", "scrapes": 9}},
            "checks": [{"name": "itl_p95", "verdict": "inconclusive", "fails_step": false,
                        "target": {"value": null, "requests": 0.0},
                        "peers": {"r1": {"value": 0.02, "requests": 210.0}},
                        "peer_median": 0.02, "ratio": null, "max_ratio_to_peers": 1.2,
                        "reasons": ["no data for the target in the window"]}],
        });
        let e: AnalyzeEvidence = evidence::<Analyze>(&old).expect("reads");
        assert_eq!(e.target(), "r2");
        let table = e.verdict_table().expect("a table");
        assert!(
            table.starts_with("    itl_p95: inconclusive (does not fail the step)\n      target  r2"),
            "{table}"
        );
        for no_verdict in [
            json!({}),
            json!({"checks": null, "replicas": {}}),
            json!({"checks": []}),
        ] {
            let e = evidence::<Analyze>(&no_verdict).expect("reads");
            assert_eq!(e.verdict_table(), None, "{no_verdict}");
        }
        assert_eq!(evidence::<Analyze>(&json!({"checks": "not a list"})), None);
    }
}
