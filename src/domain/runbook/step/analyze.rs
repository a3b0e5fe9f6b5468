//! The fields of an `analyze` step and of each of its checks.

use serde_yaml::Value;

use super::{defaults, show, valid_name, Fields, StepError};
use crate::domain::analysis::{
    unknown_placeholder, AnalysisSource, AnalyzeSpec, Check, OnInconclusive, PLACEHOLDERS,
};
use crate::domain::duration::parse_duration;

/// The keys a check takes.
const CHECK_FIELDS: &[&str] = &[
    "name",
    "histogram",
    "quantile",
    "counter",
    "query",
    "max_ratio_to_peers",
    "max",
    "min",
    "min_requests",
    "on_inconclusive",
];

pub(super) fn parse(fields: &Fields<'_>) -> Result<AnalyzeSpec, StepError> {
    let source = match fields.get("source").map(|v| v.as_str()) {
        None | Some(Some("engine")) => AnalysisSource::Engine,
        Some(Some("prometheus")) => AnalysisSource::Prometheus,
        Some(_) => {
            let got = fields.get("source").map(show).unwrap_or_default();
            return fields.fail(
                "source",
                format!("`source` must be `engine` or `prometheus`, got {got}"),
            );
        }
    };
    let warmup = match fields.get("warmup") {
        None => defaults::ANALYZE_WARMUP,
        Some(Value::String(text)) => match parse_duration(text) {
            Ok(d) => d,
            Err(e) => return fields.fail("warmup", format!("`warmup`: {e}")),
        },
        Some(other) => {
            return fields.fail(
                "warmup",
                format!(
                    "`warmup` must be a duration such as `10m`, got {}",
                    show(other)
                ),
            )
        }
    };
    let duration = fields.duration("duration", defaults::ANALYZE_DURATION)?;
    let interval = fields.duration("interval", defaults::ANALYZE_INTERVAL)?;
    fields.interval_within(interval, duration, "duration")?;
    let approve_timeout = fields.duration("approve_timeout", defaults::APPROVE_TIMEOUT)?;
    let Some(items) = fields.get("checks").and_then(Value::as_sequence) else {
        return fields.fail(
            "checks",
            "`checks` must be a non-empty list such as `[{name: took_traffic, counter: \"sglang:num_requests_total\", min: 1}]`",
        );
    };
    if items.is_empty() {
        return fields.fail(
            "checks",
            "`checks` is empty: an analysis needs at least one check",
        );
    }
    let mut checks: Vec<Check> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let check = check(fields, source, i, item)?;
        if checks.iter().any(|c| c.name == check.name) {
            return fields.fail(
                "checks",
                format!("`checks[{i}]`: duplicate check name \"{}\"", check.name),
            );
        }
        checks.push(check);
    }
    Ok(AnalyzeSpec {
        source,
        warmup,
        duration,
        interval,
        checks,
        approve_timeout,
    })
}

fn check(
    fields: &Fields<'_>,
    source: AnalysisSource,
    i: usize,
    item: &Value,
) -> Result<Check, StepError> {
    let at = format!("`checks[{i}]`");
    let Some(map) = item.as_mapping() else {
        return fields.fail(
            "checks",
            format!("{at} must be a mapping, got {}", show(item)),
        );
    };
    for key in map.keys() {
        let key = key.as_str().unwrap_or_default();
        if !CHECK_FIELDS.contains(&key) {
            return fields.fail(
                "checks",
                format!(
                    "{at}: unknown field `{key}` (a check takes: {})",
                    CHECK_FIELDS.join(", ")
                ),
            );
        }
    }
    let get = |k: &str| map.get(k).filter(|v| !v.is_null());
    let text = |k: &str| -> Result<Option<String>, StepError> {
        match get(k) {
            None => Ok(None),
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.clone())),
            Some(other) => fields.fail(
                "checks",
                format!(
                    "{at}: `{k}` must be a non-empty string, got {}",
                    show(other)
                ),
            ),
        }
    };
    let number = |k: &str| -> Result<Option<f64>, StepError> {
        match get(k) {
            None => Ok(None),
            Some(v) => match v.as_f64().filter(|n| n.is_finite()) {
                Some(n) => Ok(Some(n)),
                None => fields.fail(
                    "checks",
                    format!("{at}: `{k}` must be a number, got {}", show(v)),
                ),
            },
        }
    };
    let name = match text("name")? {
        Some(name) if valid_name(&name) => name,
        Some(name) => {
            return fields.fail(
                "checks",
                format!(
                    "{at}: `name` must be 1 to 64 letters, digits, `-`, `_` or `.`, got \"{name}\""
                ),
            )
        }
        None => return fields.fail("checks", format!("{at}: missing field `name`")),
    };
    let at = format!("check \"{name}\"");
    let histogram = text("histogram")?;
    let counter = text("counter")?;
    let quantile = number("quantile")?;
    let query = text("query")?;
    let prometheus = source == AnalysisSource::Prometheus;
    if prometheus {
        for key in ["histogram", "quantile", "counter", "min_requests"] {
            if get(key).is_some() {
                return fields.fail(
                    "checks",
                    format!("{at}: `{key}` is for `source: engine`; with `source: prometheus` a check is a PromQL `query` (put any traffic condition in it)"),
                );
            }
        }
        let Some(q) = &query else {
            return fields.fail(
                "checks",
                format!("{at}: `source: prometheus` needs a PromQL `query`, e.g. 'histogram_quantile(0.95, sum by (le) (rate(sglang:time_to_first_token_seconds_bucket{{host=\"{{{{host}}}}\",container_name=\"{{{{service}}}}\"}}[{{{{window}}}}])))'"),
            );
        };
        if let Some(bad) = unknown_placeholder(q) {
            let known: Vec<String> = PLACEHOLDERS
                .iter()
                .map(|p| format!("{{{{{p}}}}}"))
                .collect();
            return fields.fail(
                "checks",
                format!(
                    "{at}: `query` has an unknown placeholder `{bad}` (known: {})",
                    known.join(", ")
                ),
            );
        }
    } else if query.is_some() {
        return fields.fail(
            "checks",
            format!("{at}: `query` is for `source: prometheus`; with `source: engine` name a `histogram` (with `quantile`) or a `counter`"),
        );
    }
    match (&histogram, &counter, quantile) {
        _ if prometheus => {}
        (Some(_), Some(_), _) | (None, None, _) => {
            return fields.fail(
                "checks",
                format!("{at}: name exactly one of `histogram` (with `quantile`) or `counter`"),
            )
        }
        (Some(_), None, Some(q)) if q > 0.0 && q <= 1.0 => {}
        (Some(_), None, _) => {
            return fields.fail(
                "checks",
                format!(
                "{at}: a `histogram` check needs `quantile` between 0 (excluded) and 1, e.g. 0.95"
            ),
            )
        }
        (None, Some(_), Some(_)) => {
            return fields.fail(
                "checks",
                format!("{at}: a `counter` check takes no `quantile`"),
            )
        }
        (None, Some(_), None) => {}
    }
    let max_ratio_to_peers = number("max_ratio_to_peers")?;
    if max_ratio_to_peers.is_some_and(|r| r <= 0.0) {
        return fields.fail(
            "checks",
            format!("{at}: `max_ratio_to_peers` must be above 0"),
        );
    }
    let (max, min) = (number("max")?, number("min")?);
    if max_ratio_to_peers.is_none() && max.is_none() && min.is_none() {
        return fields.fail(
            "checks",
            format!("{at}: give at least one limit: `max_ratio_to_peers`, `max` or `min`"),
        );
    }
    if let (Some(max), Some(min)) = (max, min) {
        if min > max {
            return fields.fail(
                "checks",
                format!("{at}: `min` ({min}) is above `max` ({max})"),
            );
        }
    }
    let default_requests = if histogram.is_some() && !prometheus {
        defaults::ANALYZE_MIN_REQUESTS
    } else {
        0
    };
    let min_requests = match get("min_requests") {
        None => default_requests,
        Some(v) => match v.as_u64() {
            Some(n) => n,
            None => {
                return fields.fail(
                    "checks",
                    format!(
                        "{at}: `min_requests` must be a whole number, got {}",
                        show(v)
                    ),
                )
            }
        },
    };
    let on_inconclusive = match text("on_inconclusive")?.as_deref() {
        None | Some("fail") => OnInconclusive::Fail,
        Some("pass") => OnInconclusive::Pass,
        Some("ask") => OnInconclusive::Ask,
        Some(other) => {
            return fields.fail(
                "checks",
                format!("{at}: `on_inconclusive` must be `fail`, `pass` or `ask`, got \"{other}\""),
            )
        }
    };
    Ok(Check {
        name,
        histogram,
        quantile,
        counter,
        query,
        max_ratio_to_peers,
        max,
        min,
        min_requests,
        on_inconclusive,
    })
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

    fn parse(fields: &Fields<'_>) -> Result<Self, StepError> {
        parse(fields)
    }

    /// Scrapes run until warmup + duration; a last slow scrape may end past it.
    fn budget(&self) -> std::time::Duration {
        let scrapes = self.warmup + self.duration + self.interval + std::time::Duration::from_secs(60);
        // An inconclusive check that asks waits for an operator after the window.
        scrapes + if self.may_ask() { self.approve_timeout } else { std::time::Duration::ZERO }
    }

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
            spec.checks[0].min_requests, 1,
            "a quantile needs observations"
        );
        assert_eq!(spec.checks[0].on_inconclusive, OnInconclusive::Fail);
        assert_eq!(spec.checks[1].min_requests, 0);
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
        assert_eq!(c.min_requests, 0, "no request count with a query");
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
            ("unknown source", "{name: a, kind: analyze, source: graphite, checks: [{name: t, query: up, max: 1}]}".to_owned(), "`source` must be `engine` or `prometheus`, got \"graphite\""),
            ("no checks", "{name: a, kind: analyze}".to_owned(), "step 1 \"a\": `checks` must be a non-empty list"),
            ("empty checks", "{name: a, kind: analyze, checks: []}".to_owned(), "`checks` is empty"),
            ("unknown check field", format!("{{name: a, kind: analyze, checks: [{{name: t, {h}, max: 1, limit: 2}}]}}"), "`checks[0]`: unknown field `limit`"),
            ("no quantile", "{name: a, kind: analyze, checks: [{name: t, histogram: h, max: 1}]}".to_owned(), "check \"t\": a `histogram` check needs `quantile`"),
            ("quantile above 1", "{name: a, kind: analyze, checks: [{name: t, histogram: h, quantile: 95, max: 1}]}".to_owned(), "needs `quantile` between 0"),
            ("both metrics", format!("{{name: a, kind: analyze, checks: [{{name: t, {h}, counter: c, max: 1}}]}}"), "name exactly one of"),
            ("no limit", format!("{{name: a, kind: analyze, checks: [{{name: t, {h}}}]}}"), "give at least one limit"),
            ("min above max", "{name: a, kind: analyze, checks: [{name: t, counter: c, min: 5, max: 1}]}".to_owned(), "`min` (5) is above `max` (1)"),
            ("duplicate check", "{name: a, kind: analyze, checks: [{name: t, counter: c, min: 1}, {name: t, counter: c, min: 1}]}".to_owned(), "duplicate check name \"t\""),
            ("bad on_inconclusive", "{name: a, kind: analyze, checks: [{name: t, counter: c, min: 1, on_inconclusive: maybe}]}".to_owned(), "`on_inconclusive` must be `fail`, `pass` or `ask`, got \"maybe\""),
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
