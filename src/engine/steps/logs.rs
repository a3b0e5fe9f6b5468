//! The steps that watch the target's logs: `wait_logs` (until every required line appeared)
//! and `soak` (health and forbidden lines for a while).
//!
//! Neither succeeds blind (safety rule 11): a log fetch that fails is counted, the last error
//! (status and compose-manager's message) is kept in the step's detail and in its error, and
//! `max_log_failures` failures in a row fail the step `logs_unavailable`. A soak whose last
//! fetch failed does not end on its deadline: it keeps reading until one read succeeds or
//! the failures run out.
//!
//! A soak resumed after a restart watches at least the part of its window that nobody watched
//! (`watched.rs`), past its original deadline if need be; it reads the whole log tail again,
//! so lines printed while the daemon was down are judged, and it holds the target to the
//! container its saved evidence names.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::compose::ComposeError;
use crate::domain::error_code::ErrorCode;
use crate::domain::log_watch::new_lines_naming;
use crate::domain::log_watch::{LogVerdict, LogWatch};
use crate::domain::mask::mask;
use crate::domain::names::ServiceName;
use crate::domain::pattern::CompanionWatch;
use crate::domain::pattern::LogPattern;
use crate::domain::runbook::step::soak::{CompanionLines, SeenLine, SoakEvidence, SoakProbes};
use crate::domain::runbook::step::wait_logs::{
    ForbiddenLine, LogReadError, LogReadsEvidence, WaitLogsEvidence,
};
use crate::domain::runbook::step::{evidence, Soak, WaitLogs};
use crate::engine::step_run::{
    pause_until_next_probe, Evidence, Execute, Progress, Rhythm, Running, StepEnd, StepRun,
};
use crate::engine::watched::{Watched, COUNTERS};
use crate::store::Step;

/// A step's watched companion (`watch`): its settings, what it saw, how its reads went.
pub(crate) struct CompanionRead<'w> {
    pub watch: &'w CompanionWatch,
    pub lines: CompanionLines,
    pub reads: LogReads,
}

impl<'w> CompanionRead<'w> {
    /// The watch's reads, resuming from `saved` (a step's evidence) when it is of the same
    /// service.
    pub(crate) fn new(
        watch: &'w CompanionWatch,
        saved: Option<CompanionLines>,
        limit: u32,
    ) -> Self {
        let lines = saved
            .filter(|c| c.service == watch.service.as_str())
            .unwrap_or_else(|| CompanionLines {
                service: watch.service.to_string(),
                ..CompanionLines::default()
            });
        Self {
            watch,
            lines,
            reads: LogReads::new(limit),
        }
    }
}

/// The block a forbidden line begins, when it has more than the line.
fn block_of(output: &str, line: &str) -> Option<Vec<String>> {
    let block = crate::domain::log_watch::block_at(output, line);
    (block.len() > 1).then_some(block)
}

/// Lines of a watched companion kept in a soak's evidence (the count goes on past them).
const KEPT_LINES: usize = 50;

/// What a log-watching step knows about its reads of `compose/logs`.
#[derive(Debug, Default)]
pub(crate) struct LogReads {
    /// Failures that end the step when reached in a row.
    limit: u32,
    in_a_row: u32,
    total_failures: u64,
    /// The last failure: its code and message (status and the server's text).
    last_error: Option<(String, String)>,
}

impl LogReads {
    pub(crate) fn new(limit: u32) -> Self {
        Self {
            limit: limit.max(1),
            ..Self::default()
        }
    }

    /// Records one fetch; the output when it succeeded.
    pub(crate) fn record(&mut self, fetched: Result<String, ComposeError>) -> Option<String> {
        match fetched {
            Ok(output) => {
                self.in_a_row = 0;
                Some(output)
            }
            Err(e) => {
                self.in_a_row += 1;
                self.total_failures += 1;
                self.last_error = Some((e.code().to_string(), e.to_string()));
                None
            }
        }
    }

    /// Whether the last fetch failed (the logs since the previous read are unseen).
    pub(crate) fn blind(&self) -> bool {
        self.in_a_row > 0
    }

    pub(crate) fn exhausted(&self) -> bool {
        self.in_a_row >= self.limit
    }

    /// The evidence kept in the step's detail.
    pub(crate) fn evidence(&self) -> LogReadsEvidence {
        LogReadsEvidence {
            log_fetch_errors: self.total_failures,
            log_fetch_failures_in_a_row: self.in_a_row,
            last_log_error: self
                .last_error
                .as_ref()
                .map(|(code, message)| LogReadError {
                    code: code.clone(),
                    message: message.clone(),
                }),
        }
    }

    /// `; the last log fetch failed: <message>`, or nothing.
    fn last_error_suffix(&self) -> String {
        match &self.last_error {
            Some((_, message)) => format!("; the last log fetch failed: {message}"),
            None => String::new(),
        }
    }

    /// The failure of a step that could not read the logs it watches.
    fn unavailable(&self, service: &str, detail: Evidence) -> StepEnd {
        let msg = self.unavailable_message(service);
        StepEnd::failed(ErrorCode::LogsUnavailable, msg, detail)
    }

    /// Why the logs of `service` count as unavailable.
    fn unavailable_message(&self, service: &str) -> String {
        let last = self
            .last_error
            .as_ref()
            .map_or("unknown error", |(_, m)| m.as_str());
        format!(
            "could not read the logs of {service}: {} fetches failed in a row; last error: {last}",
            self.in_a_row
        )
    }
}

/// The watch's evidence with the reads'.
fn log_detail(watch: &LogWatch, reads: &LogReads) -> WaitLogsEvidence {
    WaitLogsEvidence {
        seen: watch.seen(),
        missing: watch.missing(),
        reads: reads.evidence(),
        service: None,
        forbidden: None,
    }
}

/// The step's fields, as the runbook gave them.
pub(crate) struct LogWait {
    /// Whose logs: the target, or the companion a `wait_logs` names.
    pub service: ServiceName,
    pub interval: Duration,
    pub require: Vec<LogPattern>,
    pub forbid: Vec<LogPattern>,
    pub max_log_failures: u32,
}

impl Execute for WaitLogs {
    /// The runbook's `require` lines, and the plan's `require_logs` when it reads the target.
    async fn execute(&self, run: &mut StepRun<'_>, at: &mut Running<'_>) -> StepEnd {
        let mut require = self.require.clone();
        let service = self
            .service
            .clone()
            .unwrap_or_else(|| run.rollout.target().clone());
        if service == *run.rollout.target() {
            require.extend(
                run.rollout
                    .require_logs
                    .iter()
                    .filter_map(|p| LogPattern::parse(p).ok()),
            );
        }
        let spec = LogWait {
            service,
            interval: self.interval,
            require,
            forbid: self.forbid.clone(),
            max_log_failures: self.max_log_failures,
        };
        let end = run.wait_logs(at.step, at.deadline, spec, at.abort).await;
        run.masked(end)
    }
}

impl Execute for Soak {
    async fn execute(&self, run: &mut StepRun<'_>, at: &mut Running<'_>) -> StepEnd {
        let end = run.soak(at.step, at.deadline, self, at.abort).await;
        run.masked(end)
    }
}

impl StepRun<'_> {
    /// Safety rule 8 for text read from a host: every env value of 8 or more characters in
    /// the evidence and the message of a log step (matched lines, forbidden lines, the last
    /// fetch error) is replaced by `***` before it is stored. An engine may print its env.
    pub(crate) fn masked(&self, end: StepEnd) -> StepEnd {
        match end.map(|d| self.mask_json(&d)) {
            StepEnd::Failed {
                code,
                message,
                detail,
            } => StepEnd::failed(code, mask(&message, &self.env_values()), detail),
            other => other,
        }
    }

    fn env_values(&self) -> Vec<String> {
        self.env.values().cloned().collect()
    }

    /// `evidence` with every string masked (see [`StepRun::masked`]).
    pub(crate) fn mask_json(&self, evidence: &Evidence) -> Evidence {
        fn walk(v: &serde_json::Value, secrets: &[String]) -> serde_json::Value {
            match v {
                serde_json::Value::String(s) => serde_json::Value::String(mask(s, secrets)),
                serde_json::Value::Array(items) => items.iter().map(|i| walk(i, secrets)).collect(),
                serde_json::Value::Object(map) => map
                    .iter()
                    .map(|(k, v)| (k.clone(), walk(v, secrets)))
                    .collect(),
                other => other.clone(),
            }
        }
        let secrets = self.env_values();
        evidence.masked(|v| walk(v, &secrets))
    }

    pub(crate) async fn wait_logs(
        &self,
        step: &Step,
        deadline: DateTime<Utc>,
        spec: LogWait,
        abort: &CancellationToken,
    ) -> StepEnd {
        let mut watch = LogWatch::new(spec.require, spec.forbid);
        let mut reads = LogReads::new(spec.max_log_failures);
        let mut progress = Progress::new(self.ctx.timings.progress_every);
        let mut rhythm = Rhythm::new(spec.interval);
        loop {
            rhythm.begin();
            if let Some(output) = reads.record(self.fetch_logs(&spec.service).await) {
                match watch.observe(&output, self.ctx.now()) {
                    LogVerdict::Satisfied => {
                        let mut detail = log_detail(&watch, &reads);
                        if spec.service != *self.rollout.target() {
                            detail.service = Some(spec.service);
                        }
                        return StepEnd::Succeeded(Evidence::of(&detail));
                    }
                    LogVerdict::Forbidden { pattern, line } => {
                        let msg = format!("forbidden line matched {pattern:?}: {line}");
                        let mut detail = log_detail(&watch, &reads);
                        detail.forbidden = Some(ForbiddenLine {
                            block: block_of(&output, &line),
                            pattern,
                            line,
                            companion_lines: None,
                        });
                        return StepEnd::failed(
                            ErrorCode::ForbiddenLogLine,
                            msg,
                            Evidence::of(&detail),
                        );
                    }
                    LogVerdict::Pending => {}
                }
            }
            let detail = Evidence::of(&log_detail(&watch, &reads));
            if reads.exhausted() {
                return reads.unavailable(&spec.service, detail);
            }
            if self.ctx.now() >= deadline {
                let msg = format!(
                    "required log lines of {} never seen: {:?}{}",
                    spec.service,
                    watch.missing(),
                    reads.last_error_suffix()
                );
                return StepEnd::failed(ErrorCode::LogsTimeout, msg, detail);
            }
            progress
                .save(self.ctx.store, &step.id, &self.mask_json(&detail))
                .await;
            if pause_until_next_probe(&mut rhythm, None, abort).await {
                return StepEnd::Aborted(detail);
            }
        }
    }

    /// The watched companion's last lines naming the target (the last 20), read now: what the
    /// proxy said of the replica around a forbidden line. `None` when its log cannot be read.
    async fn companion_lines_now(&self, w: &CompanionWatch) -> Option<Vec<String>> {
        let output = self.fetch_logs(&w.service).await.ok()?;
        let target = self.rollout.target().as_str();
        let naming: Vec<&str> = output.lines().filter(|l| l.contains(target)).collect();
        let from = naming.len().saturating_sub(20);
        Some(naming[from..].iter().map(|l| (*l).to_owned()).collect())
    }

    /// One read of a step's watched companion (the proxy): its new lines naming the target
    /// are counted into `c.lines` when `counting` (an analysis's warm-up reads without
    /// counting; the first read of all only places the cursor: its lines came before the
    /// step). `Some` fails the step, with its code and message: above the watch's `max`, or
    /// when the companion's log could not be read `max_log_failures` times in a row.
    pub(crate) async fn read_companion(
        &self,
        c: &mut CompanionRead<'_>,
        counting: bool,
        during: &str,
    ) -> Option<(ErrorCode, String)> {
        let target = self.rollout.target().as_str();
        let (w, lines) = (c.watch, &mut c.lines);
        if let Some(output) = c.reads.record(self.fetch_logs(&w.service).await) {
            let (found, cursor) =
                new_lines_naming(&output, lines.cursor.as_deref(), &w.patterns, target);
            if lines.read && counting {
                let at = self.ctx.now();
                for line in found {
                    lines.count += 1;
                    if lines.lines.len() < KEPT_LINES {
                        let line = line.to_owned();
                        lines.lines.push(SeenLine { at, line });
                    }
                }
            }
            lines.read = true;
            lines.cursor = cursor;
        }
        if lines.count > u64::from(w.max) {
            let first = lines.lines.first().map_or("", |l| l.line.as_str());
            let msg = format!(
                "{} line(s) of {} naming {target} {during} (at most {} allowed), the first: {first}",
                lines.count, w.service, w.max
            );
            return Some((ErrorCode::CompanionLogLimit, msg));
        }
        if c.reads.exhausted() {
            return Some((
                ErrorCode::LogsUnavailable,
                c.reads.unavailable_message(&w.service),
            ));
        }
        None
    }

    /// Watches the target for `window` from the step's start, until `deadline`; resumed
    /// after a restart, for at least the part of the window nobody watched, past `deadline`
    /// if need be (`watched.rs`).
    pub(crate) async fn soak(
        &self,
        step: &Step,
        deadline: DateTime<Utc>,
        soak: &Soak,
        abort: &CancellationToken,
    ) -> StepEnd {
        let (window, max_misses) = (soak.duration, soak.max_misses);
        let url = match self.target_health_url() {
            Ok(url) => url,
            Err(end) => return end,
        };
        let now = self.ctx.now();
        // What earlier drives of the step saved: the part of the window watched, the container
        // the target is held to (`container_id`, or the first read of a restart's evidence).
        let saved = evidence::<Soak>(&step.detail).unwrap_or_default();
        let mut watched = Watched::new(
            saved.watched.as_ref().map(|w| w.observed_ms),
            self.resumed,
            step.started_at.unwrap_or(now),
            window,
            now,
        );
        let deadline = watched.end(deadline);
        self.extend_deadline(step, deadline).await;
        let mut watch = LogWatch::new(Vec::new(), soak.forbid.clone());
        let mut reads = LogReads::new(soak.max_log_failures);
        let (mut probes, mut misses, mut worst) = (0u64, 0u32, 0u32);
        let mut progress = Progress::new(self.ctx.timings.progress_every);
        let saved_container = saved.probes.and_then(|p| p.container_id).or_else(|| {
            let first = saved.restart.and_then(|r| r.first);
            first.map(|read| read.id)
        });
        let mut restarts = crate::engine::restart::RestartWatch::resuming(saved_container);
        // The watched companion (the proxy): its lines naming the target, as saved.
        let mut companion = soak
            .watch
            .as_ref()
            .map(|w| CompanionRead::new(w, saved.companion.clone(), soak.max_log_failures));
        let mut rhythm = Rhythm::new(soak.interval);
        loop {
            rhythm.begin();
            if let Some(restarted) = restarts.check(self).await {
                let evidence = SoakEvidence {
                    restart: Some(restarted.reads.clone()),
                    ..SoakEvidence::default()
                };
                return restarted.failed(Evidence::of(&evidence));
            }
            let sample = self.ctx.prober.sample(&url).await;
            watched.observe(self.ctx.now());
            probes += 1;
            misses = if sample.is_healthy() { 0 } else { misses + 1 };
            worst = worst.max(misses);
            let mut evidence = SoakEvidence {
                probes: Some(SoakProbes {
                    probes,
                    misses_in_a_row: misses,
                    worst_streak: worst,
                    last: serde_json::to_value(&sample).unwrap_or_default(),
                    container_id: restarts.container_id().map(str::to_owned),
                }),
                watched: Some(watched.evidence(deadline)),
                ..SoakEvidence::default()
            };
            if misses >= max_misses {
                let msg = format!("{url} missed {misses} health probes in a row during the soak");
                return StepEnd::failed(ErrorCode::SoakHealth, msg, Evidence::of(&evidence));
            }
            if let Some(output) = reads.record(self.fetch_logs(self.rollout.target()).await) {
                if let LogVerdict::Forbidden { pattern, line } =
                    watch.observe(&output, self.ctx.now())
                {
                    let msg = format!("forbidden line matched {pattern:?} during the soak: {line}");
                    // The whole block (a stall dump's stacks), with what the watched
                    // companion (the proxy) said of the target around then.
                    let companion_lines = match &soak.watch {
                        Some(w) => self.companion_lines_now(w).await,
                        None => None,
                    };
                    evidence.forbidden = Some(ForbiddenLine {
                        block: block_of(&output, &line),
                        pattern,
                        line,
                        companion_lines,
                    });
                    return StepEnd::failed(
                        ErrorCode::ForbiddenLogLine,
                        msg,
                        Evidence::of(&evidence),
                    );
                }
            }
            evidence.reads = Some(reads.evidence());
            if let Some(c) = companion.as_mut() {
                let failed = self.read_companion(c, true, "during the soak").await;
                evidence.companion = Some(c.lines.clone());
                if let Some((code, msg)) = failed {
                    return StepEnd::failed(code, msg, Evidence::of(&evidence));
                }
            }
            let detail = Evidence::of(&evidence);
            if reads.exhausted() {
                return reads.unavailable(self.rollout.target(), detail);
            }
            let companion_blind = companion.as_ref().is_some_and(|c| c.reads.blind());
            // The soak ends only on a successful read: lines printed while the logs could
            // not be read are still to be checked.
            if self.ctx.now() >= deadline && !reads.blind() && !companion_blind {
                return StepEnd::Succeeded(detail);
            }
            progress
                .save_changes(
                    self.ctx.store,
                    &step.id,
                    &detail,
                    || self.mask_json(&detail),
                    &["probes", COUNTERS[0], COUNTERS[1]],
                )
                .await;
            // The last probe falls on the deadline, not up to an interval after it.
            if pause_until_next_probe(&mut rhythm, Some(deadline - self.ctx.now()), abort).await {
                return StepEnd::Aborted(detail);
            }
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    fn server_error() -> ComposeError {
        ComposeError::Server {
            endpoint: "compose/logs".into(),
            status: 500,
            message:
                "docker compose failed (exit 1): required variable PROXY_TOKEN is missing a value"
                    .into(),
        }
    }

    #[test]
    fn failures_in_a_row_exhaust_the_reads_and_a_success_resets_the_run() {
        let mut reads = LogReads::new(3);
        // (fetch succeeds, blind after, exhausted after)
        let table = [
            (false, true, false),
            (false, true, false),
            (true, false, false),
            (false, true, false),
            (false, true, false),
            (false, true, true),
        ];
        for (i, (ok, blind, exhausted)) in table.into_iter().enumerate() {
            let fetched = if ok {
                Ok("line\n".to_owned())
            } else {
                Err(server_error())
            };
            assert_eq!(reads.record(fetched).is_some(), ok, "read {i}");
            assert_eq!(reads.blind(), blind, "read {i}");
            assert_eq!(reads.exhausted(), exhausted, "read {i}");
        }
        let evidence = reads.evidence();
        assert_eq!(evidence.log_fetch_errors, 5);
        assert_eq!(evidence.log_fetch_failures_in_a_row, 3);
        let last = evidence.last_log_error.expect("the last error is kept");
        assert_eq!(last.code, "compose_server_error");
        assert!(last.message.contains("(500)") && last.message.contains("PROXY_TOKEN"));
    }

    #[test]
    fn the_unavailable_failure_names_the_service_and_the_last_error() {
        let mut reads = LogReads::new(1);
        reads.record(Err(server_error()));
        match reads.unavailable("r2", Evidence::none()) {
            StepEnd::Failed { code, message, .. } => {
                assert_eq!(code, "logs_unavailable");
                assert!(
                    message.contains("r2") && message.contains("PROXY_TOKEN"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(reads.last_error_suffix().contains("PROXY_TOKEN"));
        assert_eq!(LogReads::new(0).limit, 1, "a limit of 0 still reads once");
    }
}
