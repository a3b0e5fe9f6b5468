//! The wall clock the step executors read ([`StepCtx::now`](super::step_run::StepCtx::now)):
//! the system's in the shipped binary; a test moves it forward to see what a step does once
//! its deadline or its end has passed, without waiting for it.

#[cfg(test)]
use std::sync::atomic::{AtomicI64, Ordering};
#[cfg(test)]
use std::sync::Arc;

use chrono::{DateTime, Utc};

/// The system's clock. In unit tests it can be moved ahead ([`Clock::advance`]); the shipped
/// binary has no way to: the offset exists only in test builds.
#[derive(Debug, Clone, Default)]
pub(crate) struct Clock {
    #[cfg(test)]
    ahead_ms: Arc<AtomicI64>,
}

impl Clock {
    /// Now, on this clock.
    pub(crate) fn now(&self) -> DateTime<Utc> {
        Utc::now() + self.ahead()
    }

    #[cfg(not(test))]
    fn ahead(&self) -> chrono::Duration {
        chrono::Duration::zero()
    }

    #[cfg(test)]
    fn ahead(&self) -> chrono::Duration {
        chrono::Duration::milliseconds(self.ahead_ms.load(Ordering::Relaxed))
    }

    /// Moves the clock forward by `by`, for every reader of it from now on.
    #[cfg(test)]
    pub(crate) fn advance(&self, by: std::time::Duration) {
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.ahead_ms.fetch_add(ms, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::Clock;
    use std::time::Duration;

    #[test]
    fn the_clock_reads_the_system_time_until_a_test_moves_it_forward() {
        let clock = Clock::default();
        let before = chrono::Utc::now();
        let read = clock.now();
        assert!(read >= before && read - before < chrono::Duration::seconds(5));
        let copy = clock.clone();
        clock.advance(Duration::from_secs(3600));
        let ahead = copy.now() - chrono::Utc::now();
        assert!(
            ahead > chrono::Duration::minutes(59) && ahead <= chrono::Duration::hours(1),
            "{ahead}"
        );
    }
}
