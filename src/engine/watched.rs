//! How much of a `soak`'s or an `analyze`'s window was watched (safety rule 19): time the
//! daemon was not running is not observation.
//!
//! A watching step keeps `observed_ms` (the part of its window its probes covered, over every
//! drive of the step) in the evidence it saves as it goes. A drive that resumes the step after
//! a restart (or a storage error) counts as unobserved everything the last saved evidence does
//! not cover: the window minus `observed_ms` as last saved, so a tail the crash kept from being
//! saved is watched again (more, never less). It then watches at least that long from its own
//! start, past the step's original end if need be, and moves the step's deadline with it.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::step_run::StepRun;
use crate::domain::runbook::step::soak::{ResumedWatch, WatchedEvidence};
use crate::store::Step;

/// The evidence key of the observed time.
const OBSERVED: &str = "observed_ms";

/// A watching step's coverage of its window in this drive, and in the ones before.
#[derive(Debug)]
pub(super) struct Watched {
    window: chrono::Duration,
    /// Observed by earlier drives, as last saved.
    before: chrono::Duration,
    resumed: bool,
    /// Where this drive's watch of the window begins: its own start, or the window's.
    from: DateTime<Utc>,
    /// The latest observation of this drive.
    last: Option<DateTime<Utc>>,
}

impl Watched {
    /// The coverage of a step's window (`window` long from `window_start`: a soak's start, an
    /// analysis's end of warmup) for a drive beginning `now`; `resumed` counts what the earlier
    /// drives saved as observed (`saved`, `observed_ms` of the step's stored evidence).
    pub(super) fn new(
        saved: Option<i64>,
        resumed: bool,
        window_start: DateTime<Utc>,
        window: Duration,
        now: DateTime<Utc>,
    ) -> Self {
        let window = chrono::Duration::from_std(window).unwrap_or(chrono::Duration::MAX);
        let saved = saved.unwrap_or(0);
        let before = if resumed {
            chrono::Duration::try_milliseconds(saved)
                .unwrap_or_default()
                .clamp(chrono::Duration::zero(), window)
        } else {
            chrono::Duration::zero()
        };
        Watched {
            window,
            before,
            resumed,
            from: now.max(window_start),
            last: None,
        }
    }

    /// The part of the window no drive before this one watched (none for a first drive).
    pub(super) fn unobserved(&self) -> chrono::Duration {
        if self.resumed {
            self.window - self.before
        } else {
            chrono::Duration::zero()
        }
    }

    /// When the window ends: `planned`, or later when a resumed drive has more to watch again
    /// than is left of it.
    pub(super) fn end(&self, planned: DateTime<Utc>) -> DateTime<Utc> {
        if self.resumed {
            let again = self.from.checked_add_signed(self.unobserved());
            planned.max(again.unwrap_or(DateTime::<Utc>::MAX_UTC))
        } else {
            planned
        }
    }

    /// Records an observation (a probe, a scrape) made at `at`.
    pub(super) fn observe(&mut self, at: DateTime<Utc>) {
        self.last = self.last.max(Some(at));
    }

    /// How much of the window this drive has watched.
    pub(super) fn reobserved(&self) -> chrono::Duration {
        self.last
            .map_or(chrono::Duration::zero(), |last| last - self.from)
            .max(chrono::Duration::zero())
    }

    /// The evidence: `observed_ms` (over every drive, at most the window), and for a resumed
    /// drive `resumed` (what was unobserved, what was observed before, until when it watches)
    /// and `reobserved_ms`. `observed_ms` and `reobserved_ms` move at every observation.
    pub(super) fn evidence(&self, end: DateTime<Utc>) -> WatchedEvidence {
        let observed = (self.before + self.reobserved()).min(self.window);
        let resumed = self.resumed.then(|| ResumedWatch {
            observed_before_ms: self.before.num_milliseconds(),
            unobserved_ms: self.unobserved().num_milliseconds(),
            watch_from: self.from,
            watch_until: end,
        });
        WatchedEvidence {
            observed_ms: observed.num_milliseconds(),
            reobserved_ms: resumed
                .is_some()
                .then(|| self.reobserved().num_milliseconds()),
            resumed,
        }
    }
}

impl StepRun<'_> {
    /// Stores `deadline` as the step's when it is later than the stored one: the end a resumed
    /// watch moved (the API shows it). The drive goes by its own copy; a failed write is
    /// logged, and the next drive computes the end again from the saved evidence.
    pub(super) async fn extend_deadline(&self, step: &Step, deadline: DateTime<Utc>) {
        if step.deadline_at.is_some_and(|d| d >= deadline) {
            return;
        }
        let store = self.ctx.store;
        match store.extend_step_deadline(&step.id, deadline).await {
            Ok(()) => tracing::info!(
                rollout.id = %step.rollout_id,
                step.name = %step.name,
                "step {} of {} resumed: it watches again until {deadline}",
                step.name,
                step.rollout_id
            ),
            Err(e) => tracing::warn!(error = %e, "could not move the deadline of step {}", step.id),
        }
    }
}

/// The evidence keys that move at every observation (`Progress::save_changes`' counters).
pub(super) const COUNTERS: [&str; 2] = [OBSERVED, "reobserved_ms"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resumed_drive_watches_the_window_minus_what_was_saved_as_observed() {
        let t0 = Utc::now();
        let s = chrono::Duration::seconds;
        let six = Duration::from_secs(6);
        // (resumed, saved observed_ms, drive begins at) -> (unobserved, window ends at)
        let table = [
            (false, None, 0, 0, 6),             // a first drive: the planned end
            (false, Some(2_000), 0, 0, 6),      // evidence is read only when resumed
            (true, None, 10, 6_000, 16),        // nothing saved: the whole window again
            (true, Some(2_000), 10, 4_000, 14), // 2 s saved, resumed after the end
            (true, Some(2_000), 3, 4_000, 7),   // resumed before the end: later than planned
            (true, Some(5_000), 3, 1_000, 6),   // what is left of the window covers it
            (true, Some(9_000), 10, 0, 10),     // more than the window saved: nothing more
            (true, Some(-5), 10, 6_000, 16),    // nonsense reads as nothing observed
            (true, Some(i64::MIN), 10, 6_000, 16),
        ];
        for (resumed, saved, begins, unobserved, ends) in table {
            let w = Watched::new(saved, resumed, t0, six, t0 + s(begins));
            let what = format!("{resumed} {saved:?} {begins}");
            assert_eq!(w.unobserved().num_milliseconds(), unobserved, "{what}");
            assert_eq!(w.end(t0 + s(6)), t0 + s(ends), "{what}");
        }
    }

    #[test]
    fn observed_time_adds_this_drive_to_the_saved_and_never_exceeds_the_window() {
        let t0 = Utc::now();
        let s = chrono::Duration::seconds;
        let mut w = Watched::new(Some(2_000), true, t0, Duration::from_secs(6), t0 + s(10));
        assert_eq!(w.evidence(t0 + s(14)).observed_ms, 2_000, "nothing yet");
        w.observe(t0 + s(11));
        w.observe(t0 + s(10)); // out of order: the latest counts
        let d = w.evidence(t0 + s(14));
        assert_eq!((d.observed_ms, d.reobserved_ms), (3_000, Some(1_000)));
        let resumed = d.resumed.expect("a resumed drive");
        assert_eq!(resumed.unobserved_ms, 4_000);
        assert_eq!(resumed.observed_before_ms, 2_000);
        w.observe(t0 + s(15));
        let d = w.evidence(t0 + s(14));
        assert_eq!((d.observed_ms, d.reobserved_ms), (6_000, Some(5_000)));
        // A first drive's window starts where the window does (an analysis's warmup end).
        let mut w = Watched::new(None, false, t0 + s(2), Duration::from_secs(6), t0);
        w.observe(t0 + s(1));
        assert_eq!(
            w.evidence(t0).observed_ms,
            0,
            "the warmup is not the window"
        );
        w.observe(t0 + s(5));
        assert_eq!(w.evidence(t0).observed_ms, 3_000);
        assert!(w.evidence(t0).resumed.is_none());
    }
}
