//! Whether the target's engine restarted, from what `docker ps` shows of its container: the
//! ID, and the uptime in `Status` (`Up 3 minutes (healthy)`). `docker ps --format json` has
//! no start time, only docker's rounded human duration, so each status is read as bounds
//! `[lo, hi)` on the time since the process started, and a restart is only called when the
//! bounds cannot be explained without one (with [`SLACK`] for the request's own time).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Allowance for clocks and request latency.
pub const SLACK: Duration = Duration::from_secs(1);

/// The bounds `[lo, hi)` of the time since start that docker's `Status` text stands for
/// (docker's `HumanDuration`); `None` when the container is not `Up`.
pub fn uptime_bounds(status: &str) -> Option<(Duration, Duration)> {
    let text = status.strip_prefix("Up ")?;
    let text = text.split(" (").next().unwrap_or(text).trim();
    const S: u64 = 1;
    const M: u64 = 60;
    const H: u64 = 3600;
    const D: u64 = 24 * H;
    let secs = |lo: u64, hi: u64| Some((Duration::from_secs(lo), Duration::from_secs(hi)));
    let half_hour = H / 2;
    match text {
        "Less than a second" => return secs(0, S),
        "About a minute" => return secs(M, 2 * M),
        "About an hour" => return secs(H, H + half_hour),
        _ => {}
    }
    let (n, unit) = text.split_once(' ')?;
    let n: u64 = n.parse().ok()?;
    match unit {
        "second" | "seconds" => secs(n, n + 1),
        "minutes" => secs(n * M, (n + 1) * M),
        "hours" => secs((n * H).saturating_sub(half_hour), n * H + half_hour),
        "days" => secs((n * D).saturating_sub(half_hour), (n + 1) * D),
        "weeks" => secs((n * 7 * D).saturating_sub(half_hour), (n + 1) * 7 * D),
        "months" => secs((n * 30 * D).saturating_sub(half_hour), (n + 1) * 31 * D),
        "years" => secs(n * 365 * D, (n + 1) * 366 * D),
        _ => None,
    }
}

/// One read of the target's container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRead {
    pub id: String,
    pub status: String,
    /// When the read was sent (before the answer: the uptime is at least now − start).
    pub at: DateTime<Utc>,
}

fn secs(d: chrono::Duration) -> Duration {
    d.to_std().unwrap_or_default()
}

/// Why the container is not the one that was started by the `up` and has run since, or
/// `Ok` when nothing says so. `baseline_id`: the container seen first; `up_done_at`: when
/// the `up` ended (the engine started before then); `previous`: the last read.
pub fn judge_restart(
    baseline_id: Option<&str>,
    up_done_at: Option<DateTime<Utc>>,
    previous: Option<&ContainerRead>,
    current: Option<&ContainerRead>,
) -> Result<(), String> {
    let Some(current) = current else {
        return Err("the target's container is no longer running (gone from docker ps)".into());
    };
    if let Some(id) = baseline_id.filter(|id| *id != current.id) {
        return Err(format!(
            "the target's container changed: id {id} is now {} (recreated)",
            current.id
        ));
    }
    let Some((_, hi)) = uptime_bounds(&current.status) else {
        if current.status.starts_with("Restarting") {
            return Err(format!(
                "the target's container is restarting ({})",
                current.status
            ));
        }
        // A status docker did not write this way: nothing to conclude.
        return Ok(());
    };
    if let Some(up) = up_done_at {
        let since_up = secs(current.at - up);
        if hi + SLACK < since_up {
            return Err(format!(
                "the engine restarted in place: \"{}\" (under {}s) but the up ended {}s ago",
                current.status,
                hi.as_secs(),
                since_up.as_secs()
            ));
        }
    }
    if let Some(prev) = previous {
        if let Some((lo_prev, _)) = uptime_bounds(&prev.status) {
            let expected = lo_prev + secs(current.at - prev.at);
            if hi + SLACK < expected {
                return Err(format!(
                    "the engine restarted in place: uptime went from \"{}\" to \"{}\"",
                    prev.status, current.status
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_statuses_read_as_uptime_bounds() {
        let table = [
            ("Up Less than a second", Some((0, 1))),
            ("Up 1 second", Some((1, 2))),
            ("Up 42 seconds (health: starting)", Some((42, 43))),
            ("Up About a minute", Some((60, 120))),
            ("Up 3 minutes (healthy)", Some((180, 240))),
            ("Up About an hour", Some((3600, 5400))),
            ("Up 2 hours", Some((5400, 9000))),
            ("Up 3 days", Some((3 * 86400 - 1800, 4 * 86400))),
            ("Exited (0) 3 minutes ago", None),
            ("Restarting (1) 2 seconds ago", None),
            ("Up forever", None),
        ];
        for (status, want) in table {
            let want = want.map(|(lo, hi)| (Duration::from_secs(lo), Duration::from_secs(hi)));
            assert_eq!(uptime_bounds(status), want, "{status}");
        }
    }

    fn read(id: &str, status: &str, at_secs: i64) -> ContainerRead {
        let t0 = DateTime::<Utc>::UNIX_EPOCH + chrono::Duration::days(20_000);
        ContainerRead {
            id: id.into(),
            status: status.into(),
            at: t0 + chrono::Duration::seconds(at_secs),
        }
    }

    #[test]
    fn a_restart_is_called_only_when_the_uptime_cannot_explain_the_time() {
        let up = Some(read("a", "", 0).at);
        let first = read("a", "Up 5 seconds", 5);
        // (what, previous, current, restarted)
        let table = [
            (
                "steady",
                Some(&first),
                Some(read("a", "Up 10 seconds", 10)),
                false,
            ),
            (
                "minutes later",
                Some(&first),
                Some(read("a", "Up 3 minutes", 200)),
                false,
            ),
            (
                "in place, just now",
                Some(&first),
                Some(read("a", "Up 1 second", 10)),
                true,
            ),
            (
                "in place, a while ago",
                None,
                Some(read("a", "Up 4 minutes", 600)),
                true,
            ),
            (
                "recreated",
                Some(&first),
                Some(read("b", "Up 30 seconds", 40)),
                true,
            ),
            ("gone", Some(&first), None, true),
            (
                "restarting",
                Some(&first),
                Some(read("a", "Restarting (1) 1 second ago", 9)),
                true,
            ),
            (
                "within the slack",
                Some(&first),
                Some(read("a", "Up 5 seconds", 7)),
                false,
            ),
        ];
        for (what, prev, current, want) in table {
            let got = judge_restart(Some("a"), up, prev, current.as_ref());
            assert_eq!(got.is_err(), want, "{what}: {got:?}");
        }
        // Without the up's time, the previous read still catches an uptime that went down.
        let got = judge_restart(
            Some("a"),
            None,
            Some(&first),
            Some(&read("a", "Up 2 seconds", 8)),
        );
        assert!(got.is_err());
    }
}
