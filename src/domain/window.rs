//! Low-traffic windows: when a canary may take its replica out (the operators' "deploy in a
//! low-traffic window, the peer carries the tier during the cold start"). A window opens on
//! some days of the week at `start` and closes at `end`, both UTC; an `end` at or before
//! `start` closes the next day (`22:00`–`04:00`), and `days` are the days it opens on.

use std::fmt;

use chrono::{DateTime, Datelike, Days, NaiveDate, Utc, Weekday};
use serde::{Deserialize, Serialize};

/// One recurring window, as written in a host's config or a `window` step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "WindowSpec", into = "WindowSpec")]
pub struct TrafficWindow {
    /// The days it opens on; every day when empty.
    days: Vec<Weekday>,
    /// Minutes after midnight UTC it opens at.
    start: u16,
    /// Minutes after midnight UTC it closes at (the next day when not after `start`).
    end: u16,
}

/// A window as written: `{days: [sat, sun], start: "02:00", end: "06:00"}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    days: Vec<String>,
    start: String,
    end: String,
}

const DAY_NAMES: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

impl TryFrom<WindowSpec> for TrafficWindow {
    type Error = String;

    fn try_from(spec: WindowSpec) -> Result<Self, String> {
        let mut days = Vec::new();
        for day in &spec.days {
            let i = DAY_NAMES
                .iter()
                .position(|d| d.eq_ignore_ascii_case(day))
                .ok_or_else(|| {
                    format!(
                        "`days`: `{day}` is not a day (one of: {})",
                        DAY_NAMES.join(", ")
                    )
                })?;
            let day = Weekday::try_from(i as u8).map_err(|e| e.to_string())?;
            if !days.contains(&day) {
                days.push(day);
            }
        }
        let start = minutes("start", &spec.start, false)?;
        let end = minutes("end", &spec.end, true)?;
        if start == end {
            return Err(format!(
                "`start` and `end` are both {}: a window must last longer than zero (to never \
                 wait, configure no window)",
                spec.start
            ));
        }
        Ok(Self { days, start, end })
    }
}

impl From<TrafficWindow> for WindowSpec {
    fn from(w: TrafficWindow) -> Self {
        Self {
            days: w
                .days
                .iter()
                .map(|d| DAY_NAMES[d.num_days_from_monday() as usize].to_owned())
                .collect(),
            start: hhmm(w.start),
            end: hhmm(w.end),
        }
    }
}

/// `HH:MM` (UTC) as minutes after midnight; `24:00` only for an `end`.
fn minutes(field: &str, text: &str, is_end: bool) -> Result<u16, String> {
    let bad = || {
        format!(
            "`{field}`: `{text}` is not a time `HH:MM` (UTC, 00:00 to {})",
            if is_end { "24:00" } else { "23:59" }
        )
    };
    let (h, m) = text.split_once(':').ok_or_else(bad)?;
    if h.len() != 2 || m.len() != 2 {
        return Err(bad());
    }
    let (h, m): (u16, u16) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    let total = h * 60 + m;
    match (h, m) {
        (24, 0) if is_end => Ok(total),
        (0..=23, 0..=59) => Ok(total),
        _ => Err(bad()),
    }
}

fn hhmm(minutes: u16) -> String {
    format!("{:02}:{:02}", minutes / 60, minutes % 60)
}

impl fmt::Display for TrafficWindow {
    /// `sat,sun 02:00-06:00 UTC`, or `daily 22:00-04:00 UTC`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let days = if self.days.is_empty() {
            "daily".to_owned()
        } else {
            let names: Vec<&str> = self
                .days
                .iter()
                .map(|d| DAY_NAMES[d.num_days_from_monday() as usize])
                .collect();
            names.join(",")
        };
        write!(f, "{days} {}-{} UTC", hhmm(self.start), hhmm(self.end))
    }
}

impl TrafficWindow {
    /// The span it is open on `day` (opening that day), if it opens that day.
    fn on(&self, day: NaiveDate) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
        if !self.days.is_empty() && !self.days.contains(&day.weekday()) {
            return None;
        }
        let at = |date: NaiveDate, minutes: u16| {
            let midnight = date.and_hms_opt(0, 0, 0)?.and_utc();
            Some(midnight + chrono::Duration::minutes(i64::from(minutes)))
        };
        let open = at(day, self.start)?;
        let close_day = if self.end > self.start {
            day
        } else {
            day.checked_add_days(Days::new(1))?
        };
        Some((open, at(close_day, self.end)?))
    }
}

/// The days whose windows can hold `now` or open within the week after it.
fn days_around(now: DateTime<Utc>) -> impl Iterator<Item = NaiveDate> {
    let today = now.date_naive();
    let first = today.checked_sub_days(Days::new(1)).unwrap_or(today);
    (0..=8u64).filter_map(move |n| first.checked_add_days(Days::new(n)))
}

/// Whether one of `windows` is open at `now`.
pub fn open_at(windows: &[TrafficWindow], now: DateTime<Utc>) -> bool {
    windows.iter().any(|w| {
        days_around(now)
            .filter_map(|d| w.on(d))
            .any(|(open, close)| open <= now && now < close)
    })
}

/// When the next of `windows` opens after `now` (within a week and a day); `None` without
/// windows.
pub fn next_opening(windows: &[TrafficWindow], now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    windows
        .iter()
        .flat_map(|w| days_around(now).filter_map(|d| w.on(d)))
        .map(|(open, _)| open)
        .filter(|open| *open > now)
        .min()
}

/// `windows` as one line: `sat,sun 02:00-06:00 UTC; daily 22:00-04:00 UTC`.
pub fn shown(windows: &[TrafficWindow]) -> String {
    let all: Vec<String> = windows.iter().map(ToString::to_string).collect();
    all.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(yaml: &str) -> TrafficWindow {
        serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("{yaml}: {e}"))
    }

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().expect("a time")
    }

    #[test]
    fn a_window_is_open_on_its_days_between_start_and_end_and_wraps_past_midnight() {
        // 2026-12-05 is a Saturday.
        let weekend = window("{days: [sat, sun], start: '02:00', end: '06:00'}");
        let night = window("{start: '22:00', end: '04:00'}");
        let fri_night = window("{days: [fri], start: '22:00', end: '04:00'}");
        // (window, time, open, next opening after it)
        let table = [
            (
                &weekend,
                "2026-12-05T01:59:59Z",
                false,
                Some("2026-12-05T02:00:00Z"),
            ),
            (
                &weekend,
                "2026-12-05T02:00:00Z",
                true,
                Some("2026-12-06T02:00:00Z"),
            ),
            (
                &weekend,
                "2026-12-05T05:59:59Z",
                true,
                Some("2026-12-06T02:00:00Z"),
            ),
            (
                &weekend,
                "2026-12-05T06:00:00Z",
                false,
                Some("2026-12-06T02:00:00Z"),
            ),
            (
                &weekend,
                "2026-12-07T03:00:00Z",
                false,
                Some("2026-12-12T02:00:00Z"),
            ),
            (
                &night,
                "2026-12-05T23:00:00Z",
                true,
                Some("2026-12-06T22:00:00Z"),
            ),
            (
                &night,
                "2026-12-06T03:59:00Z",
                true,
                Some("2026-12-06T22:00:00Z"),
            ),
            (
                &night,
                "2026-12-06T04:00:00Z",
                false,
                Some("2026-12-06T22:00:00Z"),
            ),
            // A window opening Friday night is still open early Saturday, not early Friday.
            (
                &fri_night,
                "2026-12-05T03:00:00Z",
                true,
                Some("2026-12-11T22:00:00Z"),
            ),
            (
                &fri_night,
                "2026-12-04T03:00:00Z",
                false,
                Some("2026-12-04T22:00:00Z"),
            ),
        ];
        for (w, t, open, next) in table {
            let windows = std::slice::from_ref(w);
            assert_eq!(open_at(windows, at(t)), open, "{w} at {t}");
            assert_eq!(next_opening(windows, at(t)), next.map(at), "{w} after {t}");
        }
        let both = [weekend.clone(), night.clone()];
        assert!(
            open_at(&both, at("2026-12-07T23:00:00Z")),
            "either open is open"
        );
        assert_eq!(
            next_opening(&both, at("2026-12-05T01:00:00Z")),
            Some(at("2026-12-05T02:00:00Z")),
            "the earliest of both"
        );
        assert!(!open_at(&[], at("2026-12-05T02:00:00Z")));
        assert_eq!(next_opening(&[], at("2026-12-05T02:00:00Z")), None);
        assert_eq!(
            shown(&both),
            "sat,sun 02:00-06:00 UTC; daily 22:00-04:00 UTC"
        );
    }

    #[test]
    fn a_bad_window_is_refused_naming_its_field() {
        let table = [
            (
                "{start: '2:00', end: '06:00'}",
                "`start`: `2:00` is not a time",
            ),
            (
                "{start: '24:00', end: '06:00'}",
                "`start`: `24:00` is not a time",
            ),
            (
                "{start: '02:00', end: '24:01'}",
                "`end`: `24:01` is not a time",
            ),
            ("{start: '02:60', end: '06:00'}", "`start`: `02:60`"),
            (
                "{days: [sat, caturday], start: '02:00', end: '06:00'}",
                "`days`: `caturday` is not a day",
            ),
            (
                "{start: '02:00', end: '02:00'}",
                "must last longer than zero",
            ),
            (
                "{start: '02:00', end: '06:00', tz: cet}",
                "unknown field `tz`",
            ),
            ("{start: '02:00'}", "missing field `end`"),
        ];
        for (yaml, want) in table {
            let err = serde_yaml::from_str::<TrafficWindow>(yaml).expect_err(yaml);
            assert!(err.to_string().contains(want), "{yaml}: {err}");
        }
        let w = window("{days: [SAT, sat, sun], start: '00:00', end: '24:00'}");
        assert_eq!(
            w.to_string(),
            "sat,sun 00:00-24:00 UTC",
            "days once, any case"
        );
        let back: TrafficWindow =
            serde_json::from_value(serde_json::to_value(&w).expect("json")).expect("reads back");
        assert_eq!(back, w);
    }
}
