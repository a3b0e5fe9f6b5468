use super::*;

const TTFT: &str = "sglang:time_to_first_token_seconds";

fn h(buckets: &[(f64, f64)], count: f64) -> Histogram {
    Histogram {
        buckets: buckets.to_vec(),
        count,
    }
}

const INF: f64 = f64::INFINITY;

/// 10 requests under 0.1 s, 20 in (0.1, 0.5], 15 in (0.5, 1], 5 above 1 s.
fn fifty() -> Histogram {
    h(&[(0.1, 10.0), (0.5, 30.0), (1.0, 45.0), (INF, 50.0)], 50.0)
}

#[test]
fn quantiles_interpolate_inside_the_bucket_like_histogram_quantile() {
    // (q, hand-computed answer)
    let table = [
        (0.1, Some(0.05)), // rank 5 in [0, 0.1] holding 10: 0 + 0.1·5/10
        (0.2, Some(0.1)),  // rank 10: the top of the first bucket
        (0.5, Some(0.4)),  // rank 25 in (0.1, 0.5] holding 20 from 10: 0.1 + 0.4·15/20
        (0.9, Some(1.0)),  // rank 45: the top of (0.5, 1]
        (0.95, Some(1.0)), // rank 47.5 falls in +Inf: the highest finite bound
        (1.0, Some(1.0)),
        (0.0, None),
        (1.5, None),
    ];
    for (q, want) in table {
        let got = quantile(q, &fifty());
        match (got, want) {
            (Some(g), Some(w)) => assert!((g - w).abs() < 1e-12, "q={q}: {g} != {w}"),
            (g, w) => assert_eq!(g, w, "q={q}"),
        }
    }
}

#[test]
fn a_quantile_needs_observations_and_a_plus_inf_bucket() {
    let empty = h(&[(0.1, 0.0), (INF, 0.0)], 0.0);
    let no_inf = h(&[(0.1, 3.0), (0.5, 4.0)], 4.0);
    let only_inf = h(&[(INF, 4.0)], 4.0);
    for (what, hist) in [
        ("empty window", empty),
        ("no +Inf", no_inf),
        ("only +Inf", only_inf),
        ("no buckets", Histogram::default()),
    ] {
        assert_eq!(quantile(0.95, &hist), None, "{what}");
    }
    // Every observation above the highest finite bound.
    let all_slow = h(&[(0.1, 0.0), (1.0, 0.0), (INF, 7.0)], 7.0);
    assert_eq!(quantile(0.5, &all_slow), Some(1.0));
}

#[test]
fn counter_deltas_take_the_later_value_after_a_reset() {
    // (before, after, delta)
    let table = [
        (10.0, 25.0, 15.0),
        (5.0, 5.0, 0.0),
        (100.0, 7.0, 7.0),
        (0.0, 0.0, 0.0),
    ];
    for (before, after, want) in table {
        assert_eq!(counter_delta(before, after), want, "{before} -> {after}");
    }
}

#[test]
fn histogram_deltas_subtract_bucket_by_bucket_and_restart_on_a_reset() {
    let before = h(&[(0.1, 4.0), (0.5, 10.0), (1.0, 12.0), (INF, 12.0)], 12.0);
    let after = h(&[(0.1, 14.0), (0.5, 40.0), (1.0, 57.0), (INF, 62.0)], 62.0);
    assert_eq!(histogram_delta(Some(&before), &after), fifty());
    assert_eq!(
        quantile(0.5, &histogram_delta(Some(&before), &after)),
        Some(0.4)
    );
    // A reset: the later read is everything since.
    let reset = h(&[(0.1, 1.0), (0.5, 2.0), (1.0, 2.0), (INF, 3.0)], 3.0);
    assert_eq!(histogram_delta(Some(&after), &reset), reset);
    // A series first seen now counts from zero.
    assert_eq!(histogram_delta(None, &after), after);
    // No change: an empty window.
    let none = histogram_delta(Some(&after), &after);
    assert_eq!(none.count, 0.0);
    assert_eq!(quantile(0.95, &none), None);
}

fn page(ttft_p0: &[f64; 4], ttft_p1: &[f64; 4], requests: (f64, f64)) -> String {
    let mut text = format!(
        "# HELP {TTFT} Histogram of time to first token in seconds.\n# TYPE {TTFT} histogram\n"
    );
    for (priority, counts) in [("", &[9.0, 9.0, 9.0, 9.0]), ("0", ttft_p0), ("1", ttft_p1)] {
        for (le, c) in ["0.1", "0.5", "1.0", "+Inf"].iter().zip(counts.iter()) {
            text.push_str(&format!(
                "{TTFT}_bucket{{le=\"{le}\",model_name=\"z-ai/glm-5.3-flash\",priority=\"{priority}\"}} {c}\n"
            ));
        }
        text.push_str(&format!(
            "{TTFT}_sum{{model_name=\"z-ai/glm-5.3-flash\",priority=\"{priority}\"}} 1.5\n"
        ));
        text.push_str(&format!(
            "{TTFT}_count{{model_name=\"z-ai/glm-5.3-flash\",priority=\"{priority}\"}} {}\n",
            counts[3]
        ));
    }
    text.push_str("# HELP sglang:num_requests_total Number of requests.\n# TYPE sglang:num_requests_total counter\n");
    text.push_str(
        "sglang:num_requests_total{model_name=\"z-ai/glm-5.3-flash\",priority=\"\"} 1000.0\n",
    );
    text.push_str(&format!(
        "sglang:num_requests_total{{model_name=\"z-ai/glm-5.3-flash\",priority=\"0\"}} {}\n",
        requests.0
    ));
    text.push_str(&format!(
        "sglang:num_requests_total{{model_name=\"z-ai/glm-5.3-flash\",priority=\"1\"}} {:e}\n",
        requests.1
    ));
    text.push_str("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name=\"z-ai/glm-5.3-flash\",priority=\"\"} 3\n");
    text
}

#[test]
fn a_page_sums_every_priority_but_the_stale_placeholder() {
    let before = Page::parse(&page(
        &[1.0, 2.0, 2.0, 2.0],
        &[0.0, 1.0, 1.0, 1.0],
        (10.0, 5.0),
    ))
    .expect("parses");
    let after = Page::parse(&page(
        &[6.0, 17.0, 27.0, 30.0],
        &[5.0, 14.0, 20.0, 23.0],
        (40.0, 25.0),
    ))
    .expect("parses");
    assert_eq!(after.histogram(TTFT).len(), 2, "priority \"\" is left out");
    let window = histogram_series_delta(&before.histogram(TTFT), &after.histogram(TTFT));
    // p0: +5 +15 +25 +28; p1: +5 +13 +19 +22 → 10, 28, 44, 50 cumulative.
    assert_eq!(window, fifty_like());
    assert_eq!(
        counter_series_delta(
            &before.counter("sglang:num_requests_total"),
            &after.counter("sglang:num_requests_total")
        ),
        50.0,
        "30 + 20, never the frozen 1000 of priority \"\""
    );
    // The placeholder is the only series of the gauge: nothing live.
    assert!(after.counter("sglang:num_running_reqs").is_empty());
    assert!(after.histogram("sglang:missing").is_empty());
    assert_eq!(after.series_count(), 3 + 3 + 1);
}

fn fifty_like() -> Histogram {
    h(&[(0.1, 10.0), (0.5, 28.0), (1.0, 44.0), (INF, 50.0)], 50.0)
}

#[test]
fn escaped_label_values_and_special_floats_parse() {
    let text = "weird{path=\"C:\\\\DIR\",error=\"x:\\n\\\"y\\\"\"} +Inf -3982045\nplain 12.47\n";
    let page = Page::parse(text).expect("parses");
    assert_eq!(
        page.counter("plain").values().copied().collect::<Vec<_>>(),
        [12.47]
    );
    assert_eq!(
        page.counter("weird").values().copied().collect::<Vec<_>>(),
        [INF]
    );
}

#[test]
fn text_that_is_not_exposition_is_refused() {
    for text in [
        "<html><body>502 Bad Gateway</body></html>",
        "{\"error\": 1}",
        "metric{ 1",
    ] {
        assert!(Page::parse(text).is_err(), "{text}");
    }
}

#[test]
fn parsing_only_the_families_read_gives_the_same_series() {
    let text = format!(
        "{}# TYPE other_seconds histogram\nother_seconds_bucket{{le=\"+Inf\"}} 3\nother_seconds_count 3\n",
        page(&[6.0, 17.0, 27.0, 30.0], &[5.0, 14.0, 20.0, 23.0], (40.0, 25.0))
    );
    let whole = Page::parse(&text).expect("parses");
    let some = Page::parse_families(&text, &[TTFT, "sglang:num_requests_total"]).expect("parses");
    assert_eq!(some.histogram(TTFT), whole.histogram(TTFT));
    assert_eq!(
        some.counter("sglang:num_requests_total"),
        whole.counter("sglang:num_requests_total")
    );
    assert!(some.histogram("other_seconds").is_empty(), "not asked for");
    assert!(!whole.histogram("other_seconds").is_empty());
    assert!(Page::parse_families("<html>502</html>", &[TTFT]).is_err());
    assert!(
        Page::parse_families("", &[TTFT]).is_ok(),
        "an empty page has no series"
    );
}

/// The key as it was built before it was built without `format!`: the `k="v"` strings,
/// sorted, joined.
fn formatted_key(labels: &Labels) -> SeriesKey {
    let mut pairs: Vec<String> = labels
        .iter()
        .filter(|l| l.key != "le")
        .map(|l| format!("{}=\"{}\"", l.key, l.value))
        .collect();
    pairs.sort();
    pairs.join(",")
}

#[test]
fn a_series_key_sorts_its_pairs_as_the_formatted_pairs_sort() {
    // `a1="…"` sorts before `a="…"` (`1` < `=`), though `a` < `a1` as names.
    let text = "# TYPE x counter\nx{a=\"1\",a1=\"2\",b_=\"q\\\"z\",b=\"\"} 1\nx{zz=\"\",z=\"\",le=\"3\"} 2\nx 3\n";
    let page = Page::parse(text).expect("parses");
    for sample in &page.metrics[0].samples {
        assert_eq!(series_key(&sample.labels), formatted_key(&sample.labels));
    }
    assert_eq!(
        series_key(&page.metrics[0].samples[0].labels),
        "a1=\"2\",a=\"1\",b=\"\",b_=\"q\\\"z\""
    );
}

#[test]
fn only_the_priority_placeholder_lines_are_left_out_before_parsing() {
    for stale in [
        "x_bucket{priority=\"\",le=\"1\"} 1",
        "x_bucket{le=\"1\",priority=\"\"} 1",
        "x{ a=\"\\\\\" , priority=\"\" } 1",
    ] {
        assert!(is_stale_sample(stale), "{stale}");
        assert!(!is_family_line(stale, &["x"]), "{stale}");
    }
    for live in [
        "x_bucket{priority=\"0\",le=\"1\"} 1",
        "x{xpriority=\"\"} 1",
        "x{a=\"priority=\\\"\\\"\"} 1",
        "x{a=\",priority=\\\"\\\"}\"} 1",
        "x 1",
    ] {
        assert!(!is_stale_sample(live), "{live}");
        assert!(is_family_line(live, &["x"]), "{live}");
    }
}

#[test]
fn the_placeholder_left_out_before_parsing_changes_no_series_read() {
    let text = page(
        &[6.0, 17.0, 27.0, 30.0],
        &[5.0, 14.0, 20.0, 23.0],
        (40.0, 25.0),
    );
    assert!(
        text.contains("priority=\"\""),
        "the page has the placeholder"
    );
    let whole = Page::parse(&text).expect("parses");
    let some = Page::parse_families(&text, &[TTFT, "sglang:num_requests_total"]).expect("parses");
    assert!(
        some.series_count() < whole.series_count(),
        "placeholder left out"
    );
    assert_eq!(some.histogram(TTFT), whole.histogram(TTFT));
    assert!(!whole.histogram(TTFT).is_empty());
    assert_eq!(
        some.counter("sglang:num_requests_total"),
        whole.counter("sglang:num_requests_total")
    );
}

/// An SGLang page of about `series` series, shaped like the simulated engine's (and the real
/// engine's): two counters and three histograms for priorities `""`, `0`, `1`, then gauges
/// in families of 50.
fn sglang_like_page(series: usize) -> String {
    let model = "model_name=\"z-ai/glm-5.3-flash\"";
    let mut text = String::new();
    for (name, help) in [
        ("sglang:num_requests_total", "Number of requests processed."),
        (
            "sglang:generation_tokens_total",
            "Number of generation tokens.",
        ),
    ] {
        text.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
        for (i, p) in ["", "0", "1"].iter().enumerate() {
            text.push_str(&format!(
                "{name}{{{model},priority=\"{p}\"}} {}.0\n",
                40 + i * 7
            ));
        }
    }
    let bounds = [
        "0.001", "0.005", "0.01", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "+Inf",
    ];
    for name in [
        TTFT,
        "sglang:inter_token_latency_seconds",
        "sglang:e2e_request_latency_seconds",
    ] {
        text.push_str(&format!(
            "# HELP {name} Histogram of {name}.\n# TYPE {name} histogram\n"
        ));
        for (i, p) in ["", "0", "1"].iter().enumerate() {
            for (j, le) in bounds.iter().enumerate() {
                text.push_str(&format!(
                    "{name}_bucket{{le=\"{le}\",{model},priority=\"{p}\"}} {}.0\n",
                    i + j * 3
                ));
            }
            text.push_str(&format!(
                "{name}_sum{{{model},priority=\"{p}\"}} {}.25\n",
                i * 11
            ));
            text.push_str(&format!(
                "{name}_count{{{model},priority=\"{p}\"}} {}.0\n",
                i + 30
            ));
        }
    }
    for family in 0..series.div_ceil(50) {
        let name = format!("sglang:cache_stat_{family}");
        text.push_str(&format!(
            "# HELP {name} Per-rank cache statistic {family}.\n# TYPE {name} gauge\n"
        ));
        for i in 0..50.min(series - family * 50) {
            text.push_str(&format!(
                "{name}{{{model},tp_rank=\"{}\",pool=\"pool-{i}\"}} {}.5\n",
                i % 4,
                family * 1000 + i
            ));
        }
    }
    text
}

/// Both parsers' answers, side by side, as text (the crate's `Metric` has no `PartialEq`).
fn both(text: &str) -> (String, String) {
    (
        format!("{:?}", Page::parse(text)),
        format!("{:?}", Page::parse_with_crate(text)),
    )
}

#[test]
fn the_plain_tokenizer_reads_an_sglang_sized_page_as_the_parser_of_record_does() {
    let text = sglang_like_page(2_000);
    assert!(text.len() > 150 * 1024, "a real-sized page");
    assert!(
        fast::parse(&text).is_some(),
        "the plain shape is not handed on"
    );
    let (ours, crates) = both(&text);
    assert_eq!(ours, crates);
    // And the lines an analysis keeps of it, fed in chunks as a scrape reads them.
    let families = [
        TTFT,
        "sglang:inter_token_latency_seconds",
        "sglang:num_requests_total",
    ];
    let mut lines = FamilyLines::new(&families);
    for chunk in text.as_bytes().chunks(16 * 1024) {
        lines.push(chunk);
    }
    let streamed = lines.finish().expect("parses");
    let kept = Page::parse_families(&text, &families).expect("parses");
    let by_crate: String = text
        .lines()
        .filter(|l| is_family_line(l, &families))
        .map(|l| format!("{l}\n"))
        .collect();
    let by_crate = Page::parse_with_crate(&by_crate).expect("parses");
    assert_eq!(format!("{streamed:?}"), format!("{by_crate:?}"));
    assert_eq!(format!("{kept:?}"), format!("{by_crate:?}"));
    assert_eq!(streamed.histogram(TTFT).len(), 2, "priorities 0 and 1");
}

#[test]
fn text_off_the_plain_shape_is_handed_to_the_parser_of_record() {
    for text in [
        "# TYPE x counter\nx{a=\"q\\\"z\"} 1\n",
        "# TYPE x counter\nx 1 1700000000000\n",
        "# TYPE x counter\nx  1\n",
        "# TYPE x counter\n\nx 1\n",
        "# TYPE x counter\n# a comment\nx 1\n",
        "# TYPE x counter\n",
        "# HELP x\nx 1\n",
        "# TYPE x Counter\nx 1\n",
        "x{} 1\n",
        "x 1e\n",
        "x 1\r\n",
        "",
    ] {
        assert!(fast::parse(text).is_none(), "{text:?}");
        let (ours, crates) = both(text);
        assert_eq!(ours, crates, "{text:?}");
    }
}

mod against_the_crate {
    use super::*;
    use proptest::prelude::*;

    fn name() -> impl Strategy<Value = String> {
        prop::sample::select(vec!["a", "b", "s:x", "a_b"]).prop_map(str::to_owned)
    }

    /// A line in the plain shape, or near it (every way the crate's grammar bends).
    fn any_line() -> impl Strategy<Value = String> {
        let help = (
            name(),
            prop::sample::select(vec![" d", " two words", "  lead", "", " \tt", "\td"]),
        )
            .prop_map(|(n, d)| format!("# HELP {n}{d}"));
        let kind = prop::sample::select(vec![
            " counter",
            " gauge",
            " histogram",
            " summary",
            " untyped",
            " Histogram",
            " bogus",
            "  counter",
            " counter ",
            "",
        ]);
        let typ = (name(), kind).prop_map(|(n, k)| format!("# TYPE {n}{k}"));
        let sample = (
            name(),
            prop::sample::select(vec!["", "_bucket", "_sum", "_count", "_total"]),
            prop::sample::select(vec![
                "",
                "{le=\"1\"}",
                "{a=\"x\",le=\"+Inf\"}",
                "{a=\"\"}",
                "{a=\"q\\\"z\"}",
                "{ a = \"1\" }",
                "{}",
                "{a=\"1\",}",
                "{a=\"é ,}\"}",
                "{a=\"1\"",
                " {a=\"1\"}",
            ]),
            prop::sample::select(vec![" ", "  ", "\t", ""]),
            prop::sample::select(vec![
                "1", "1.5", "+Inf", "-inf", "NaN", "1e3", "-2.5E-3", ".5", "1.", "1e", "x", "0x1",
                "+1", "-.5e+2", "Infinity", "nan5", "",
            ]),
            prop::sample::select(vec!["", " 123", " ", "\r", " -5", "x"]),
        )
            .prop_map(|(n, s, l, sep, v, t)| format!("{n}{s}{l}{sep}{v}{t}"));
        let other = prop::sample::select(vec!["", "# comment", "#HELP a d", " a 1", "#"])
            .prop_map(str::to_owned);
        prop_oneof![2 => help, 2 => typ, 6 => sample, 1 => other]
    }

    /// A family in the plain shape: its `HELP` and `TYPE` (either, both or none) and samples.
    fn plain_family() -> impl Strategy<Value = String> {
        (
            name(),
            prop::sample::select(vec!["counter", "gauge", "histogram", "summary", "untyped"]),
            0..3usize,
            prop::collection::vec(
                (
                    prop::sample::select(vec!["", "_bucket", "_sum", "_count"]),
                    prop::sample::select(vec![
                        "",
                        "{le=\"0.5\"}",
                        "{p=\"\",le=\"+Inf\"}",
                        "{m=\"é\",p=\"1\"}",
                    ]),
                    prop::sample::select(vec!["0", "3.25", "+Inf", "NaN", "1e-3", "17.0"]),
                ),
                1..8,
            ),
        )
            .prop_map(|(n, kind, header, samples)| {
                let mut text = String::new();
                if header != 1 {
                    text.push_str(&format!("# HELP {n} Help of {n}.\n"));
                }
                if header != 2 {
                    text.push_str(&format!("# TYPE {n} {kind}\n"));
                }
                for (suffix, labels, value) in samples {
                    text.push_str(&format!("{n}{suffix}{labels} {value}\n"));
                }
                text
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn any_lines_parse_as_the_crate_parses_them(
            lines in prop::collection::vec(any_line(), 0..24),
            newline in any::<bool>(),
        ) {
            let mut text = lines.join("\n");
            if newline {
                text.push('\n');
            }
            let (ours, crates) = both(&text);
            prop_assert_eq!(ours, crates);
        }

        #[test]
        fn plain_pages_parse_as_the_crate_parses_them(
            families in prop::collection::vec(plain_family(), 1..8),
        ) {
            let text: String = families.concat();
            let (ours, crates) = both(&text);
            prop_assert_eq!(ours, crates);
        }
    }
}
