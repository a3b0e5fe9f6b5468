//! The simulated host's fault state: what the faults scripted through [`crate::SimFaults`]
//! have set, read by the handlers (data only; the setters are in `faults.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::api_fault::ApiFaults;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SimOp {
    /// `POST /compose/up` that applies.
    Up,
    /// `POST /compose/down`.
    Down,
    /// `POST /compose/up` with `dry_run: true`.
    DryRun,
}

/// The current fault settings (inside the state mutex).
#[derive(Debug, Clone, Default)]
pub(crate) struct FaultState {
    pub dry_run_extra: Option<String>,
    pub dry_run_removal: Option<String>,
    /// One-shot: op → phase that exits 1.
    pub fail_phase: BTreeMap<SimOp, String>,
    /// One-shot: ops whose next stream ends without `done`.
    pub cut_stream: BTreeSet<SimOp>,
    pub busy: Option<(Instant, DateTime<Utc>)>,
    pub health_never: BTreeSet<String>,
    pub cold_start: Duration,
    /// Sticky: how long pulling an image the host does not hold takes.
    pub pull_time: Duration,
    /// Sticky: the proxy flap's generation; a flap task whose generation is no longer this one
    /// stops.
    pub proxy_flap: u64,
    /// Sticky: the pull time of particular images (by reference), instead of `pull_time`.
    pub pull_times: BTreeMap<String, Duration>,
    /// Sticky: the repo the downloader fetches when it runs (unless cached), how long that
    /// takes and the bytes it adds to the model cache.
    pub download: Option<(String, Duration, u64)>,
    pub legacy: bool,
    pub logs_on_start: BTreeMap<String, Vec<String>>,
    /// Tags force-moved to another commit (tag → new commit), with other file content.
    pub moved_tags: BTreeMap<String, String>,
    /// One-shot: op → number of lines after which the body ends (no `done`).
    pub cut_after: BTreeMap<SimOp, usize>,
    /// One-shot: ops whose next stream holds before `done` until released or hung up.
    pub stall: BTreeSet<SimOp>,
    /// One-shot: op → a line that is not an NDJSON event, sent after the first line.
    pub garbage: BTreeMap<SimOp, String>,
    /// Counted: op → (HTTP status, how many more answers) answered before any stream.
    pub answer_status: BTreeMap<SimOp, (u16, u32)>,
    /// Counted: op → (delay before the answer's headers, how many more answers).
    pub delay_answer: BTreeMap<SimOp, (Duration, u32)>,
    /// Sticky: pause before each NDJSON line, when longer than the host's own.
    pub line_delay: Option<Duration>,
    /// Sticky: engines whose `/health` alternates 200 and 503 (when otherwise ready).
    pub health_flap: BTreeSet<String>,
    /// Counts flapping health answers.
    pub flap_seq: u64,
    /// Counted: up, down and dry-run requests that answer `400 tag not found` (the git
    /// host's rate limit, which compose-manager reports as a missing tag).
    pub tag_rate_limited: u32,
    /// One-shot: the next real up ends its stream without `done` and frees the lock at once,
    /// while its compose child goes on: the target is stopped, removed and recreated over
    /// the given time after the stream ended.
    pub abandon_up: Option<Duration>,
    /// The engines' API faults.
    pub api: ApiFaults,
}

impl FaultState {
    /// Whether the scripted busy period is running.
    pub fn busy_now(&self) -> bool {
        self.busy.is_some_and(|(until, _)| Instant::now() < until)
    }

    /// When the running busy period started, if one is running.
    pub fn busy_since(&self) -> Option<DateTime<Utc>> {
        self.busy
            .filter(|(until, _)| Instant::now() < *until)
            .map(|(_, since)| since)
    }

    /// Takes the one-shot faults armed for `op`: (failing phase, cut stream).
    pub fn take_for(&mut self, op: SimOp) -> (Option<String>, bool) {
        (self.fail_phase.remove(&op), self.cut_stream.remove(&op))
    }

    /// Takes the one-shot stream shape faults armed for `op`.
    pub fn take_shape(&mut self, op: SimOp) -> StreamShape {
        StreamShape {
            cut_after: self.cut_after.remove(&op),
            stall: self.stall.remove(&op),
            garbage: self.garbage.remove(&op),
        }
    }

    /// Counts down a scripted pre-stream answer for `op`: the status to answer now, if any.
    pub fn take_status(&mut self, op: SimOp) -> Option<u16> {
        let (status, left) = self.answer_status.get_mut(&op)?;
        let status = *status;
        *left -= 1;
        if *left == 0 {
            self.answer_status.remove(&op);
        }
        Some(status)
    }

    /// Counts down a scripted answer delay for `op`.
    pub fn take_delay(&mut self, op: SimOp) -> Option<Duration> {
        let (delay, left) = self.delay_answer.get_mut(&op)?;
        let delay = *delay;
        *left -= 1;
        if *left == 0 {
            self.delay_answer.remove(&op);
        }
        Some(delay)
    }
}

/// How one stream is misshapen (see [`SimFaults`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct StreamShape {
    pub cut_after: Option<usize>,
    pub stall: bool,
    pub garbage: Option<String>,
}
