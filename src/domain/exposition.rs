//! Prometheus text exposition: one scraped page reduced to what an analysis reads, and the
//! maths over two pages of the same replica (counter deltas, histogram bucket deltas,
//! quantiles from bucket deltas like PromQL's `histogram_quantile`).
//!
//! The page is parsed by `prom_text_format_parser` (names with `:` such as SGLang's
//! `sglang:time_to_first_token_seconds`, `+Inf`, escaped label values). `prometheus-parse`
//! was not used: its name pattern has no `:`, so every SGLang line would be dropped.
//!
//! The engine's label quirk: counters and histograms are split by `priority`, and the series
//! with `priority=""` is a stale placeholder that must never be read. [`Page::histogram`] and
//! [`Page::counter`] leave it out and keep every other series apart; the deltas are taken per
//! series and summed afterwards, so a reset of one priority does not hide the others.

use std::collections::BTreeMap;

use prom_text_format_parser::{
    parse_scrape, Label, Labels, Metric, ScrapeParseError, Type, ValueType,
};

mod fast;
mod stream;
pub use stream::FamilyLines;

/// The label the engine splits its counters and histograms by.
pub const PRIORITY_LABEL: &str = "priority";
/// The placeholder series' label pair, as it appears in a [`SeriesKey`].
const STALE_KEY: &str = "priority=\"\"";

/// A page that is not valid exposition text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not Prometheus text exposition: {0}")]
pub struct ExpositionError(String);

/// A series' identity: its labels (without `le`), sorted, as `k="v",…`.
pub type SeriesKey = String;

/// One histogram series: cumulative bucket counts by upper bound, and `_count`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    /// `(le, cumulative count)`, sorted by `le`; the last is `+Inf` on a well-formed page.
    pub buckets: Vec<(f64, f64)>,
    /// `_count` (observations; one per request for the latency histograms).
    pub count: f64,
}

/// One parsed page. Families are converted only when asked for: an analysis reads three
/// of a page's hundreds.
#[derive(Debug, Clone, Default)]
pub struct Page {
    metrics: Vec<Metric>,
}

/// The key of a sample's series: its `k="v"` pairs but `le`, sorted as those strings sort,
/// joined by `,`. Built into one `String` (no per-label `format!`).
fn series_key(labels: &Labels) -> SeriesKey {
    let mut pairs: Vec<&Label> = labels.iter().filter(|l| l.key != "le").collect();
    pairs.sort_by(|a, b| pair_bytes(a).cmp(pair_bytes(b)));
    let len: usize = pairs.iter().map(|l| l.key.len() + l.value.len() + 4).sum();
    let mut key = String::with_capacity(len);
    for (i, l) in pairs.iter().enumerate() {
        if i > 0 {
            key.push(',');
        }
        key.push_str(&l.key);
        key.push_str("=\"");
        key.push_str(&l.value);
        key.push('"');
    }
    key
}

/// The bytes of `k="v"`, without building it (the order [`series_key`] sorts pairs in).
fn pair_bytes(l: &Label) -> impl Iterator<Item = u8> + '_ {
    let quote = std::iter::once(b'"');
    l.key
        .bytes()
        .chain("=\"".bytes())
        .chain(l.value.bytes())
        .chain(quote)
}

/// Whether two samples belong to the same series (the same labels but `le`, in order): the
/// buckets of one series follow each other on a page, so its key is built once.
fn same_series(a: &Labels, b: &Labels) -> bool {
    let a = a.iter().filter(|l| l.key != "le");
    let b = b.iter().filter(|l| l.key != "le");
    a.eq(b)
}

impl Page {
    /// Parses one page. Text that is not exposition format is refused; a family whose
    /// lines do not assemble (e.g. a histogram without `le`) is left out. Lines in the plain
    /// shape engines write are read by a tokenizer of their own (`fast.rs`, ~10× cheaper);
    /// any other text by `prom_text_format_parser`, with the same result.
    pub fn parse(text: &str) -> Result<Page, ExpositionError> {
        if let Some(metrics) = fast::parse(text) {
            return Ok(Page { metrics });
        }
        Page::parse_with_crate(text)
    }

    /// [`Page::parse`] by `prom_text_format_parser` alone, whatever the text's shape.
    pub fn parse_with_crate(text: &str) -> Result<Page, ExpositionError> {
        let (metrics, error) = parse_scrape(text);
        if let Some(ScrapeParseError::Parse(e)) = error {
            return Err(ExpositionError(e));
        }
        Ok(Page { metrics })
    }

    /// Parses only the lines of the named families (their `# HELP`/`# TYPE` lines and
    /// their samples, including `_bucket`, `_sum`, `_count`, but not the `priority=""`
    /// placeholder's, which are never read): what an analysis reads of a page of thousands
    /// of series, for a fraction of the cost of the whole page.
    pub fn parse_families(text: &str, families: &[&str]) -> Result<Page, ExpositionError> {
        let mut kept = String::new();
        for line in text.lines() {
            if is_family_line(line, families) {
                kept.push_str(line);
                kept.push('\n');
            }
        }
        if kept.is_empty() {
            if !text.trim().is_empty() && !looks_like_exposition(text) {
                return Err(ExpositionError("no exposition lines".to_owned()));
            }
            return Ok(Page::default());
        }
        Page::parse(&kept)
    }

    /// Number of series on the page (a histogram or summary series counts once).
    pub fn series_count(&self) -> usize {
        self.metrics
            .iter()
            .map(|m| match m.kind {
                Type::Histogram | Type::Summary => m
                    .samples
                    .iter()
                    .filter(|s| s.value.value_type == ValueType::Count)
                    .count(),
                _ => m.samples.len(),
            })
            .sum()
    }

    fn family(&self, name: &str, kinds: &[Type]) -> Option<&Metric> {
        self.metrics
            .iter()
            .find(|m| m.name == name && kinds.contains(&m.kind))
    }

    /// The live series of histogram `name`, by series key: the `priority=""` placeholder
    /// is left out. Empty when the page has no such histogram.
    pub fn histogram(&self, name: &str) -> BTreeMap<SeriesKey, Histogram> {
        let mut out: BTreeMap<SeriesKey, Histogram> = BTreeMap::new();
        let Some(metric) = self.family(name, &[Type::Histogram]) else {
            return out;
        };
        // The series of the previous sample: its labels, key, and whether it is stale.
        let mut last: Option<(&Labels, SeriesKey, bool)> = None;
        for sample in &metric.samples {
            if !last
                .as_ref()
                .is_some_and(|(labels, _, _)| same_series(labels, &sample.labels))
            {
                let key = series_key(&sample.labels);
                let stale = key_is_stale(&key);
                last = Some((&sample.labels, key, stale));
            }
            let Some((_, key, false)) = &last else {
                continue;
            };
            let value = sample.value.value.as_f64();
            if !out.contains_key(key) {
                out.insert(key.clone(), Histogram::default());
            }
            let Some(series) = out.get_mut(key) else {
                continue;
            };
            match sample.value.value_type {
                ValueType::Count => series.count = value,
                ValueType::Sum => {}
                ValueType::Sample => {
                    let le = sample
                        .labels
                        .iter()
                        .find(|l| l.key == "le")
                        .and_then(|l| l.value.parse::<f64>().ok());
                    if let Some(le) = le {
                        series.buckets.push((le, value));
                    }
                }
            }
        }
        for series in out.values_mut() {
            series.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        out
    }

    /// The live series of counter (or gauge) `name`, without the `priority=""` placeholder.
    pub fn counter(&self, name: &str) -> BTreeMap<SeriesKey, f64> {
        let kinds = [Type::Counter, Type::Gauge, Type::Untyped];
        let Some(metric) = self.family(name, &kinds) else {
            return BTreeMap::new();
        };
        metric
            .samples
            .iter()
            .map(|s| (series_key(&s.labels), s.value.value.as_f64()))
            .filter(|(key, _)| !key_is_stale(key))
            .collect()
    }
}

/// Whether `line` belongs to one of `families`: its `# HELP`/`# TYPE` line or one of its
/// samples (`_bucket`, `_sum`, `_count` included).
fn is_family_line(line: &str, families: &[&str]) -> bool {
    let trimmed = line.trim_start();
    let is_family = |name: &str, f: &str| {
        name.strip_prefix(f)
            .is_some_and(|rest| matches!(rest, "" | "_bucket" | "_sum" | "_count"))
    };
    match trimmed.strip_prefix('#') {
        Some(comment) => {
            let mut words = comment.split_whitespace();
            match (words.next(), words.next()) {
                (Some("HELP" | "TYPE"), Some(name)) => families.iter().any(|f| is_family(name, f)),
                _ => false,
            }
        }
        // A sample: its name runs to `{` or a blank. Most lines of a page share no prefix
        // with the families and are rejected by the first comparison.
        None => {
            families.iter().any(|f| {
                trimmed.starts_with(f) && {
                    let name = trimmed
                        .split(|c: char| c == '{' || c.is_whitespace())
                        .next()
                        .unwrap_or_default();
                    is_family(name, f)
                }
            }) && !is_stale_sample(trimmed)
        }
    }
}

/// Whether a sample line is of the `priority=""` placeholder series, which is never read:
/// left out before parsing (a third of an SGLang page's kept lines). `priority=""` cannot
/// occur inside a label value (a `"` in a value is escaped), so a match that starts a label
/// pair (after `{` or `,`) and ends one (before `,` or `}`) is the label itself.
fn is_stale_sample(line: &str) -> bool {
    // One searcher for every line (`str::match_indices` would build one per line).
    static STALE: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(STALE_KEY));
    let Some(open) = memchr::memchr(b'{', line.as_bytes()) else {
        return false;
    };
    let labels = &line[open..];
    STALE.find_iter(labels.as_bytes()).any(|at| {
        let before = labels[..at].trim_end().chars().next_back();
        let after = labels[at + STALE_KEY.len()..].trim_start().chars().next();
        matches!(before, Some('{' | ',')) && matches!(after, Some(',' | '}'))
    })
}

/// Whether the first non-blank line reads like exposition text (a comment or a metric name).
fn looks_like_exposition(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .and_then(|l| l.chars().next())
        .is_some_and(|c| c == '#' || c.is_ascii_alphabetic() || c == '_' || c == ':')
}

fn key_is_stale(key: &str) -> bool {
    // Keys are built by `series_key`: `priority=""` appears exactly so, between commas.
    key.split(',').any(|pair| pair == STALE_KEY)
}

/// The increase of a counter between two reads. A value lower than before means the
/// counter was reset (the engine restarted): everything it counted since is the later value.
pub fn counter_delta(before: f64, after: f64) -> f64 {
    if after < before {
        after
    } else {
        after - before
    }
}

/// The increase of every series of a counter between two pages, summed. A series missing
/// before counts from zero.
pub fn counter_series_delta(
    before: &BTreeMap<SeriesKey, f64>,
    after: &BTreeMap<SeriesKey, f64>,
) -> f64 {
    after
        .iter()
        .map(|(key, v)| counter_delta(before.get(key).copied().unwrap_or(0.0), *v))
        .sum()
}

/// The observations of one histogram series between two reads: per-bucket and `_count`
/// deltas. A reset (the count went down) makes the later read the delta.
pub fn histogram_delta(before: Option<&Histogram>, after: &Histogram) -> Histogram {
    let Some(before) = before.filter(|b| after.count >= b.count) else {
        return after.clone();
    };
    let buckets = after
        .buckets
        .iter()
        .map(|(le, v)| {
            let old = before
                .buckets
                .iter()
                .find(|(ble, _)| ble == le)
                .map_or(0.0, |(_, c)| *c);
            (*le, counter_delta(old, *v))
        })
        .collect();
    Histogram {
        buckets,
        count: after.count - before.count,
    }
}

/// Adds `delta` into `total`, bucket by bucket (buckets are matched by upper bound).
pub fn add_histogram(total: &mut Histogram, delta: &Histogram) {
    total.count += delta.count;
    for (le, v) in &delta.buckets {
        match total.buckets.iter_mut().find(|(tle, _)| tle == le) {
            Some((_, c)) => *c += v,
            None => total.buckets.push((*le, *v)),
        }
    }
    total.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
}

/// The deltas of every live series of a histogram between two pages, summed into one.
pub fn histogram_series_delta(
    before: &BTreeMap<SeriesKey, Histogram>,
    after: &BTreeMap<SeriesKey, Histogram>,
) -> Histogram {
    let mut total = Histogram::default();
    for (key, h) in after {
        add_histogram(&mut total, &histogram_delta(before.get(key), h));
    }
    total
}

/// The `q` quantile (0 < q ≤ 1) of the observations in `h`, as PromQL's
/// `histogram_quantile`: linear interpolation inside the bucket that holds rank `q·total`
/// (the first bucket starts at 0); a rank in the `+Inf` bucket answers the highest finite
/// bound. `None` without observations or without a `+Inf` bucket.
pub fn quantile(q: f64, h: &Histogram) -> Option<f64> {
    if !(q > 0.0 && q <= 1.0) {
        return None;
    }
    let (last_le, total) = *h.buckets.last()?;
    if last_le != f64::INFINITY || total <= 0.0 || h.buckets.len() < 2 {
        return None;
    }
    // Cumulative counts may dip after per-series resets: make them monotonic.
    let mut cumulative = Vec::with_capacity(h.buckets.len());
    let mut high = 0.0f64;
    for (le, c) in &h.buckets {
        high = high.max(*c);
        cumulative.push((*le, high));
    }
    let rank = q * total;
    let i = cumulative.iter().position(|(_, c)| *c >= rank)?;
    if i == cumulative.len() - 1 {
        return Some(cumulative[i - 1].0);
    }
    let (upper, count) = cumulative[i];
    let (lower, below) = if i == 0 {
        (0.0f64.min(upper), 0.0)
    } else {
        cumulative[i - 1]
    };
    if i == 0 && upper <= 0.0 {
        return Some(upper);
    }
    let in_bucket = count - below;
    if in_bucket <= 0.0 {
        return Some(upper);
    }
    Some(lower + (upper - lower) * (rank - below) / in_bucket)
}

#[cfg(test)]
mod tests;
