//! Bounded waits for something the engine can only read (a rollout becoming terminal, for a
//! preempting rollback): read it, and while it is not done wait for the end of the task that
//! can change it, never past the timeout. No polling. Kept apart from what it reads so its
//! timing is tested on tokio's paused clock, which SQLite's pool cannot run on.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// Reads with `read` until `done` holds for what it read; between reads waits for the future
/// `task_end` gives (the end of the task that can change what is read), or until `timeout`
/// has passed since the call, then reads once more. Returns the last value read: not done when
/// the timeout passed or when no task runs (`task_end` gives `None`: nothing will change it).
/// A read error ends the wait.
pub(crate) async fn until_done<T, E, Fut, End>(
    timeout: Duration,
    mut task_end: impl FnMut() -> Option<End>,
    mut read: impl FnMut() -> Fut,
    done: impl Fn(&T) -> bool,
) -> Result<T, E>
where
    Fut: Future<Output = Result<T, E>>,
    End: Future<Output = ()>,
{
    let deadline = Instant::now() + timeout;
    loop {
        // Taken before the read: a task that ends in between has written what the read sees.
        let end = task_end();
        let value = read().await?;
        if done(&value) || Instant::now() >= deadline {
            return Ok(value);
        }
        let Some(end) = end else {
            return Ok(value);
        };
        if tokio::time::timeout_at(deadline, end).await.is_err() {
            return read().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::future::Future;
    use std::pin::Pin;

    use super::*;

    /// The preempt wait (`engine.preempt_wait`, by default).
    const PREEMPT_WAIT: Duration = Duration::from_secs(120);

    type End = Pin<Box<dyn Future<Output = ()>>>;

    /// Waits on a counter that reads `n` at its n-th read (from 1), done at `until` (or never),
    /// its task ending `ends_after` after each wait starts (never when `None`).
    async fn count_reads(
        timeout: Duration,
        until: Option<u32>,
        ends_after: Option<Duration>,
    ) -> (u32, Duration) {
        let reads = Cell::new(0u32);
        let start = Instant::now();
        let last = until_done(
            timeout,
            || -> Option<End> {
                Some(match ends_after {
                    Some(d) => Box::pin(tokio::time::sleep(d)),
                    None => Box::pin(std::future::pending()),
                })
            },
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
    async fn a_wait_ends_at_the_read_after_the_task_ends() {
        let tick = Duration::from_secs(3);
        assert_eq!(
            count_reads(PREEMPT_WAIT, Some(2), Some(tick)).await,
            (2, tick)
        );
        // A task that ends without the end (then another one) is waited for again.
        assert_eq!(
            count_reads(PREEMPT_WAIT, Some(3), Some(tick)).await,
            (3, tick * 2)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_preempt_wait_gives_up_after_120_s_of_a_rollout_that_never_ends() {
        let default = crate::config::EngineTuning::default().preempt_wait;
        assert_eq!(PREEMPT_WAIT, default);
        let (reads, took) = count_reads(PREEMPT_WAIT, None, None).await;
        assert_eq!(took, PREEMPT_WAIT, "the read at the deadline is the last");
        assert_eq!(
            reads, 2,
            "one read at once, one at the deadline: no polling"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_task_the_first_read_is_the_answer() {
        let reads = Cell::new(0);
        let got = until_done(
            PREEMPT_WAIT,
            || None::<End>,
            || {
                reads.set(reads.get() + 1);
                async { Ok::<&str, ()>("running") }
            },
            |s| *s == "succeeded",
        )
        .await;
        assert_eq!(got, Ok("running"));
        assert_eq!(reads.get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_error_ends_the_wait_at_once() {
        let start = Instant::now();
        let reads = Cell::new(0);
        let got = until_done(
            PREEMPT_WAIT,
            || -> Option<End> { Some(Box::pin(std::future::pending())) },
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
