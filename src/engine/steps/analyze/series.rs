//! Each check's value per interval, per replica, kept in the step's evidence (`series`) so a
//! chart of the whole window, warm-up included, can be drawn for any past rollout.
//!
//! A point is the check's value over one interval: the delta between two consecutive
//! successful scrapes of the replica (a counter's increase; a histogram's quantile, or its
//! observations without a `quantile`). A failed scrape is a `null` point. Only the last
//! [`MAX_POINTS`] points of each check and replica are kept. Every replica's point of an
//! interval carries the same time (the scrapes are sent together), so peers line up.

use std::collections::{BTreeMap, VecDeque};

use chrono::{DateTime, Utc};

use super::Extract;
use crate::domain::analysis::Check;
use crate::domain::exposition::{counter_series_delta, histogram_series_delta, quantile};
use crate::domain::runbook::step::analyze::{CheckSeries, SeriesShape};

/// The points kept per check and replica: a 4-minute window at a 1 s interval.
pub(super) const MAX_POINTS: usize = 240;

/// One replica's series, one per check.
#[derive(Default)]
pub(super) struct Series {
    checks: Vec<VecDeque<(i64, Option<f64>)>>,
}

impl Series {
    pub(super) fn new(checks: usize) -> Self {
        Series {
            checks: (0..checks).map(|_| VecDeque::new()).collect(),
        }
    }

    /// The interval ending at `at`: its value from `before` to `now`, per check.
    pub(super) fn record(
        &mut self,
        at: DateTime<Utc>,
        before: &[Extract],
        now: &[Extract],
        checks: &[Check],
    ) {
        for ((points, check), (b, a)) in self
            .checks
            .iter_mut()
            .zip(checks)
            .zip(before.iter().zip(now))
        {
            let value = match (b, a) {
                (Extract::Histogram(b), Extract::Histogram(a)) if !a.is_empty() => {
                    let delta = histogram_series_delta(b, a);
                    match check.quantile {
                        Some(q) => quantile(q, &delta),
                        None => Some(delta.count),
                    }
                }
                (Extract::Counter(b), Extract::Counter(a)) if !a.is_empty() => {
                    Some(counter_series_delta(b, a))
                }
                _ => None,
            };
            push(points, at, value);
        }
    }

    /// A failed scrape: a gap in every check's line.
    pub(super) fn missed(&mut self, at: DateTime<Utc>) {
        for points in &mut self.checks {
            push(points, at, None);
        }
    }
}

fn push(points: &mut VecDeque<(i64, Option<f64>)>, at: DateTime<Utc>, value: Option<f64>) {
    if points.len() == MAX_POINTS {
        points.pop_front();
    }
    points.push_back((at.timestamp_millis(), value.filter(|v| v.is_finite())));
}

/// Each check's series by check name, each replica's points by replica (stored as
/// `{"<check>": {"shape": "quantile" | "counter", "points": {"<replica>": [[unix_ms, value or
/// null], ...]}}}`).
pub(super) fn evidence<'a>(
    checks: &[Check],
    replicas: impl Iterator<Item = (&'a str, &'a Series)> + Clone,
) -> BTreeMap<String, CheckSeries> {
    checks
        .iter()
        .enumerate()
        .map(|(i, check)| {
            let points = replicas
                .clone()
                .map(|(name, s)| (name.to_owned(), s.checks[i].iter().copied().collect()))
                .collect();
            let shape = if check.histogram.is_some() && check.quantile.is_some() {
                SeriesShape::Quantile
            } else {
                SeriesShape::Counter
            };
            let unit = check
                .histogram
                .as_deref()
                .filter(|h| shape == SeriesShape::Quantile && h.ends_with("_seconds"))
                .map(|_| "s".to_owned());
            (
                check.name.clone(),
                CheckSeries {
                    shape,
                    unit,
                    points,
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::domain::exposition::{Histogram, SeriesKey};

    fn check(name: &str, histogram: Option<&str>, quantile: Option<f64>) -> Check {
        Check {
            name: name.to_owned(),
            histogram: histogram.map(str::to_owned),
            quantile,
            counter: histogram.is_none().then(|| "requests_total".to_owned()),
            query: None,
            max_ratio_to_peers: None,
            max: None,
            min: None,
            min_requests: Some(0),
            on_inconclusive: Default::default(),
        }
    }

    fn counter_check() -> Check {
        check("requests", None, None)
    }

    fn counter(v: f64) -> Extract {
        let mut m = BTreeMap::new();
        m.insert(SeriesKey::default(), v);
        Extract::Counter(m)
    }

    #[test]
    fn each_interval_is_the_delta_and_only_the_last_points_are_kept() {
        let checks = [counter_check()];
        let mut s = Series::new(1);
        let t0 = Utc::now();
        for i in 0..(MAX_POINTS as i64 + 10) {
            let at = t0 + chrono::Duration::seconds(i);
            s.record(
                at,
                &[counter(i as f64 * 3.0)],
                &[counter((i + 1) as f64 * 3.0)],
                &checks,
            );
        }
        s.missed(t0 + chrono::Duration::seconds(1_000));
        let d = evidence(&checks, [("r2", &s)].into_iter());
        assert_eq!(d["requests"].shape, SeriesShape::Counter);
        let points = &d["requests"].points["r2"];
        assert_eq!(points.len(), MAX_POINTS);
        assert_eq!(points[0].1, Some(3.0));
        assert_eq!(
            points[0].0,
            (t0 + chrono::Duration::seconds(11)).timestamp_millis()
        );
        assert_eq!(points[MAX_POINTS - 1].1, None, "a missed scrape is a gap");
    }

    #[test]
    fn a_histogram_point_is_the_quantile_of_the_interval_alone() {
        let check = check("ttft_p50", Some("ttft"), Some(0.5));
        let h = |fast: f64, slow: f64| {
            let mut m = BTreeMap::new();
            m.insert(
                SeriesKey::default(),
                Histogram {
                    buckets: vec![
                        (0.1, fast),
                        (1.0, fast + slow),
                        (f64::INFINITY, fast + slow),
                    ],
                    count: fast + slow,
                },
            );
            Extract::Histogram(m)
        };
        let mut s = Series::new(1);
        // 100 fast requests before; then 10 slow ones in the interval: its median is slow.
        s.record(
            Utc::now(),
            &[h(100.0, 0.0)],
            &[h(100.0, 10.0)],
            std::slice::from_ref(&check),
        );
        let mut seconds = check.clone();
        seconds.histogram = Some("sglang:time_to_first_token_seconds".into());
        let d = evidence(&[seconds], [("r2", &s)].into_iter());
        assert_eq!(
            d["ttft_p50"].unit.as_deref(),
            Some("s"),
            "a `_seconds` histogram"
        );
        let d = evidence(&[check], [("r2", &s)].into_iter());
        assert_eq!(d["ttft_p50"].unit, None, "a name that says no unit");
        assert_eq!(d["ttft_p50"].shape, SeriesShape::Quantile);
        let v = d["ttft_p50"].points["r2"][0].1.expect("a value");
        assert!(
            v > 0.1,
            "the interval's own median, not the lifetime's: {v}"
        );
    }
}
