//! Bounded polling: how the engine waits for something it can only read (a rollout becoming
//! terminal, for a preempting rollback). Kept apart from what it reads so its timing is tested
//! on tokio's paused clock, which SQLite's pool cannot run on.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// How often `Engine::wait_terminal` reads the rollout.
pub(crate) const POLL: Duration = Duration::from_millis(20);

/// Reads with `read` every `every` until `done` holds for what it read or `timeout` has passed
/// since the call; returns the last value read (there is always one: the first read is at
/// once, and one is made at or after the deadline). A read error ends the wait.
pub(crate) async fn poll_until<T, E, Fut>(
    timeout: Duration,
    every: Duration,
    mut read: impl FnMut() -> Fut,
    done: impl Fn(&T) -> bool,
) -> Result<T, E>
where
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let value = read().await?;
        if done(&value) || Instant::now() >= deadline {
            return Ok(value);
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::engine::rollback::PREEMPT_WAIT;

    /// Polls a counter that reads `n` at its n-th read (from 1), until `until` (or never).
    async fn count_reads(timeout: Duration, until: Option<u32>) -> (u32, Duration) {
        let reads = Cell::new(0u32);
        let start = Instant::now();
        let last = poll_until(
            timeout,
            POLL,
            || {
                reads.set(reads.get() + 1);
                let n = reads.get();
                async move { Ok::<u32, ()>(n) }
            },
            |n| Some(*n) == until,
        )
        .await
        .expect("no read fails");
        assert_eq!(last, reads.get(), "the last value read is returned");
        (last, start.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_at_the_read_that_sees_the_end() {
        let (reads, took) = count_reads(PREEMPT_WAIT, Some(5)).await;
        assert_eq!(reads, 5);
        assert_eq!(took, POLL * 4);
    }

    #[tokio::test(start_paused = true)]
    async fn the_preempt_wait_gives_up_after_120_s_of_a_rollout_that_never_ends() {
        assert_eq!(PREEMPT_WAIT, Duration::from_secs(120));
        let (reads, took) = count_reads(PREEMPT_WAIT, None).await;
        assert_eq!(took, PREEMPT_WAIT, "the read at the deadline is the last");
        assert_eq!(reads, 120_000 / 20 + 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_error_ends_the_wait_at_once() {
        let start = Instant::now();
        let reads = Cell::new(0);
        let got = poll_until(
            PREEMPT_WAIT,
            POLL,
            || {
                reads.set(reads.get() + 1);
                async { Err::<u32, &str>("database is locked") }
            },
            |_| false,
        )
        .await;
        assert_eq!(got, Err("database is locked"));
        assert_eq!((reads.get(), start.elapsed()), (1, Duration::ZERO));
    }
}
