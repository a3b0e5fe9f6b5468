//! An `analyze` step: the analysis spec of `domain::analysis`, and what serde cannot say
//! about it and its checks.

use super::{Checked, interval_within, positive_duration, valid_name};
use crate::domain::analysis::{
    unknown_placeholder, AnalysisSource, AnalyzeSpec, Check, PLACEHOLDERS,
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
    ];

    fn check(&self) -> Checked {
        positive_duration("duration", self.duration)?;
        positive_duration("interval", self.interval)?;
        interval_within(self.interval, self.duration, "duration")?;
        positive_duration("approve_timeout", self.approve_timeout)?;
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

    type Evidence = serde_json::Value;

    /// `ttft_p95 pass 0.412 vs peers 0.405 (1.02×, limit 1.2×); took_traffic pass 250`.
    fn summary(d: &serde_json::Value) -> Option<String> {
        let number =
            |v: &serde_json::Value| v.as_f64().map_or("-".to_owned(), |x| format!("{x:.3}"));
        let summary = d["checks"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let mut line = format!(
                    "{} {} {}",
                    c["name"].as_str().unwrap_or("?"),
                    c["verdict"].as_str().unwrap_or("?"),
                    number(&c["target"]["value"])
                );
                if !c["max_ratio_to_peers"].is_null() {
                    line.push_str(&format!(
                        " vs peers {} ({}×, limit {}×)",
                        number(&c["peer_median"]),
                        number(&c["ratio"]),
                        number(&c["max_ratio_to_peers"])
                    ));
                }
                line
            })
            .collect::<Vec<_>>()
            .join("; ");
        Some(summary).filter(|s| !s.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
            ("unknown step field", "{name: a, kind: analyze, timeout: 5m, checks: [{name: t, counter: c, min: 1}]}".to_owned(), "unknown field `timeout` (a `analyze` step takes: source, warmup, duration, interval, checks, approve_timeout)"),
        ];
        for (case, step, expected) in cases {
            let err = one(&step).expect_err(case);
            assert!(
                err.contains(expected),
                "{case}:\n  got:      {err}\n  expected: {expected}"
            );
        }
    }
}
