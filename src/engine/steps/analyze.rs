//! The `analyze` step: scrape the target's and each peer's Prometheus page every `interval`
//! for `warmup` + `duration`, then judge every check over the window after the warmup.
//!
//! Values come from deltas between consecutive successful scrapes inside the window (never
//! from lifetime totals): per series, summed over the engine's priorities, a counter reset
//! counting from zero. The window runs from the step's persisted start; a step resumed after a
//! restart starts its window again at its first scrape, and ends it no earlier than the part
//! of the window nobody watched after it (`watched.rs`): it judges only what it gathered. The
//! target's container is watched for restarts at every interval. A counter check
//! with `max` that the target already exceeded ends the step early (counters only grow).
//!
//! `source: prometheus` asks a Prometheus server instead (`prometheus.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::domain::analysis::{
    judge, lost_early, AnalysisSource, AnalyzeSpec, Check, CheckVerdict, Observed,
};
use crate::domain::error_code::ErrorCode;
use crate::domain::exposition::{
    add_histogram, counter_series_delta, histogram_series_delta, quantile, FamilyLines, Histogram,
    Page, SeriesKey,
};
use crate::domain::runbook::step::analyze::{AnalyzeEvidence, AnalyzedReplica, Role, Scrapes};
use crate::domain::runbook::step::signals::SourceRead;
use crate::domain::runbook::step::{evidence, Analyze};
use crate::engine::restart::RestartWatch;
use crate::engine::step_run::{pause, Evidence, Execute, Progress, Running, StepEnd, StepRun};
use crate::engine::steps::logs::CompanionRead;
use crate::engine::watched::Watched;
use crate::store::Step;

mod prometheus;
mod scrape;
mod series;

pub(crate) use prometheus::QUERY_TIMEOUT as PROMETHEUS_QUERY_TIMEOUT;

/// One check's series on one page.
enum Extract {
    Histogram(BTreeMap<SeriesKey, Histogram>),
    Counter(BTreeMap<SeriesKey, f64>),
}

impl Extract {
    fn from_page(page: &Page, check: &Check) -> Self {
        match (&check.histogram, &check.counter) {
            (Some(name), _) => Extract::Histogram(page.histogram(name)),
            (None, Some(name)) => Extract::Counter(page.counter(name)),
            (None, None) => Extract::Counter(BTreeMap::new()),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Extract::Histogram(m) => m.is_empty(),
            Extract::Counter(m) => m.is_empty(),
        }
    }
}

/// One check's window so far, for one replica.
#[derive(Default)]
struct Window {
    histogram: Histogram,
    counter: f64,
    /// Whether the family was on a page of the window.
    seen: bool,
}

/// A replica being scraped: the target or a peer.
struct Replica {
    name: String,
    url: String,
    /// Its page's address and the connection kept to it between scrapes.
    scraper: scrape::Scraper,
    target: bool,
    previous: Option<Vec<Extract>>,
    windows: Vec<Window>,
    /// Whether the window's first scrape (its baseline) was taken.
    baseline: bool,
    scrapes: u64,
    scrape_errors: u64,
    window_scrapes: u64,
    last_error: Option<String>,
    /// Each check's value per interval, warm-up included (`series.rs`).
    series: series::Series,
}

impl Replica {
    fn new(name: &str, url: String, target: bool, checks: usize) -> Self {
        Replica {
            name: name.to_owned(),
            scraper: scrape::Scraper::new(&url),
            url,
            target,
            previous: None,
            windows: (0..checks).map(|_| Window::default()).collect(),
            baseline: false,
            scrapes: 0,
            scrape_errors: 0,
            window_scrapes: 0,
            last_error: None,
            series: series::Series::new(checks),
        }
    }

    fn record(
        &mut self,
        at: DateTime<Utc>,
        page: Result<Page, String>,
        in_window: bool,
        checks: &[Check],
    ) {
        let page = match page {
            Ok(page) => page,
            Err(e) => {
                self.scrape_errors += 1;
                self.last_error = Some(e);
                self.series.missed(at);
                return;
            }
        };
        self.scrapes += 1;
        let current: Vec<Extract> = checks
            .iter()
            .map(|c| Extract::from_page(&page, c))
            .collect();
        if let Some(before) = &self.previous {
            self.series.record(at, before, &current, checks);
        }
        if in_window {
            self.window_scrapes += 1;
            for (window, now) in self.windows.iter_mut().zip(&current) {
                window.seen |= !now.is_empty();
            }
            if self.baseline {
                let before = self.previous.iter().flatten();
                for ((window, now), before) in self.windows.iter_mut().zip(&current).zip(before) {
                    match (before, now) {
                        (Extract::Histogram(b), Extract::Histogram(a)) => {
                            add_histogram(&mut window.histogram, &histogram_series_delta(b, a));
                        }
                        (Extract::Counter(b), Extract::Counter(a)) => {
                            window.counter += counter_series_delta(b, a);
                        }
                        _ => {}
                    }
                }
            }
            self.baseline = true;
        }
        self.previous = Some(current);
    }

    fn observed(&self, i: usize, check: &Check) -> Observed {
        let window = &self.windows[i];
        if self.window_scrapes == 0 || !window.seen {
            return Observed {
                value: None,
                requests: Some(0.0),
            };
        }
        match check.quantile {
            Some(q) if check.histogram.is_some() => Observed {
                value: quantile(q, &window.histogram),
                requests: Some(window.histogram.count),
            },
            _ => Observed {
                value: Some(window.counter),
                requests: Some(window.counter),
            },
        }
    }

    fn evidence(&self) -> AnalyzedReplica {
        AnalyzedReplica {
            role: if self.target {
                Role::Target
            } else {
                Role::Peer
            },
            scrapes: Some(Scrapes {
                metrics_url: self.url.clone(),
                scrapes: self.scrapes,
                scrape_errors: self.scrape_errors,
                window_scrapes: self.window_scrapes,
                last_error: self.last_error.clone(),
            }),
        }
    }
}

async fn scrape(client: &reqwest::Client, url: &str, families: &[&str]) -> Result<Page, String> {
    let mut res = client
        .get(url)
        .send()
        .await
        .map_err(|e| crate::probe::short_error(&e))?;
    if !res.status().is_success() {
        return Err(format!("HTTP {}", res.status().as_u16()));
    }
    // Only the checks' families are kept as the body arrives: never the whole page.
    let mut lines = FamilyLines::new(families);
    while let Some(chunk) = res.chunk().await.map_err(|_| "body not read".to_owned())? {
        lines.push(&chunk);
    }
    lines.finish().map_err(|e| e.to_string())
}

/// Judges every check over the window.
fn verdicts(spec: &AnalyzeSpec, replicas: &[Replica]) -> Vec<CheckVerdict> {
    spec.checks
        .iter()
        .enumerate()
        .map(|(i, check)| {
            let mut target = Observed {
                value: None,
                requests: Some(0.0),
            };
            let mut peers = BTreeMap::new();
            for r in replicas {
                if r.target {
                    target = r.observed(i, check);
                } else {
                    peers.insert(r.name.clone(), r.observed(i, check));
                }
            }
            judge(check, target, peers)
        })
        .collect()
}

/// `ttft_p95 (2.013× the peers' median …); took_traffic (…)`.
fn failures(verdicts: &[CheckVerdict]) -> String {
    verdicts
        .iter()
        .filter(|v| v.fails_step)
        .map(|v| format!("{} ({:?}: {})", v.name, v.verdict, v.reasons.join("; ")).to_lowercase())
        .collect::<Vec<_>>()
        .join("; ")
}

impl Execute for AnalyzeSpec {
    async fn execute(&self, run: &mut StepRun<'_>, at: &mut Running<'_>) -> StepEnd {
        let end = run.analyze(at.step, self, at.abort).await;
        // A watched companion's lines are text read from the host: env values masked.
        if self.watch.is_some() {
            return run.masked(end);
        }
        end
    }
}

impl StepRun<'_> {
    /// Each page the step scrapes, read once now, before anything touches the target (safety
    /// rule 20, `preflight.rs`): the peers', and the target's when `with_target` (its engine
    /// serves). Each as the read's evidence, with the error of a page that could not be read.
    pub(in crate::engine) async fn pages_once(
        &self,
        families: &[&str],
        with_target: bool,
    ) -> Vec<SourceRead> {
        let config = &self.ctx.host;
        let service = &self.rollout.service;
        let target = config
            .replicas
            .get(service.as_str())
            .filter(|_| with_target);
        let peers = config.peers(service).into_iter().filter_map(|p| {
            let r = config.replicas.get(p)?;
            Some((p, r.metrics_url(), Role::Peer))
        });
        let replicas: Vec<(&str, String, Role)> = target
            .map(|r| (service.as_str(), r.metrics_url(), Role::Target))
            .into_iter()
            .chain(peers)
            .collect();
        let timeout = self.ctx.timings.scrape_timeout;
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .no_proxy()
            .timeout(timeout)
            .build()
            .unwrap_or_default();
        let pages = futures_util::future::join_all(replicas.iter().map(|(_, url, _)| {
            let client = &client;
            async move {
                let mut scraper = scrape::Scraper::new(url);
                scraper.scrape(client, families, timeout).await.map(|_| ())
            }
        }))
        .await;
        replicas
            .iter()
            .zip(pages)
            .map(|((name, url, role), page)| {
                let error = page
                    .err()
                    .map(|e| format!("metrics page of {name} ({url}): {e}"));
                let read = SourceRead {
                    replica: Some((*name).to_owned()),
                    role: Some(*role),
                    metrics_url: Some(url.clone()),
                    ..SourceRead::of("metrics")
                };
                read.ended(error, None)
            })
            .collect()
    }

    pub(crate) async fn analyze(
        &self,
        step: &Step,
        spec: &AnalyzeSpec,
        abort: &CancellationToken,
    ) -> StepEnd {
        if spec.source == AnalysisSource::Prometheus {
            return self.analyze_prometheus(step, spec, abort).await;
        }
        let config = &self.ctx.host;
        let Some(target) = config.replicas.get(self.rollout.service.as_str()) else {
            let msg = format!("{} is not a configured replica", self.rollout.service);
            return StepEnd::failed(ErrorCode::NoMetricsUrl, msg, Evidence::none());
        };
        let mut replicas = vec![Replica::new(
            &self.rollout.service,
            target.metrics_url(),
            true,
            spec.checks.len(),
        )];
        for peer in config.peers(&self.rollout.service) {
            if let Some(r) = config.replicas.get(peer) {
                replicas.push(Replica::new(
                    peer,
                    r.metrics_url(),
                    false,
                    spec.checks.len(),
                ));
            }
        }
        // `http://` pages are read on a connection kept per replica (`scrape.rs`); this
        // client, for `https://` ones, goes straight to the engine as those do, and keeps no
        // idle connection: a pooled connection keeps the read buffer a ~200 KiB page grew,
        // per replica, between scrapes (hundreds of MiB for a fleet of canaries).
        let scrape_timeout = spec.interval.min(self.ctx.timings.scrape_timeout);
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .no_proxy()
            .timeout(scrape_timeout)
            .build()
            .unwrap_or_default();
        let (step, mut watched, warm_end, end) = self.analysis_window(step, spec).await;
        let step = &step;
        let families: Vec<&str> = spec.checks.iter().map(Check::family).collect();
        let mut restarts = RestartWatch::resuming(saved_container(step));
        let mut progress = Progress::new(self.ctx.timings.progress_every);
        // The watched companion (the proxy); a resumed analysis gathers again, this too.
        let mut companion = spec
            .watch
            .as_ref()
            .map(|w| CompanionRead::new(w, None, crate::domain::defaults::MAX_LOG_FAILURES));
        let evidence = |replicas: &[Replica],
                        restarts: &RestartWatch,
                        watched: &Watched,
                        checks: Option<Vec<CheckVerdict>>| AnalyzeEvidence {
            source: Some(spec.source),
            warmup_ends_at: Some(warm_end),
            ends_at: Some(end),
            replicas: replicas
                .iter()
                .map(|r| (r.name.clone(), r.evidence()))
                .collect(),
            checks: Some(checks),
            series: Some(series::evidence(
                &spec.checks,
                replicas.iter().map(|r| (r.name.as_str(), &r.series)),
            )),
            restart: Some(restarts.evidence()),
            watched: Some(watched.evidence(end)),
            ..AnalyzeEvidence::default()
        };
        loop {
            if let Some(restarted) = restarts.check(self).await {
                let mut e = evidence(&replicas, &restarts, &watched, None);
                e.restart = Some(restarted.reads.clone());
                return restarted.failed(Evidence::of(&e));
            }
            let now = self.ctx.now();
            let in_window = now >= warm_end;
            let pages = futures_util::future::join_all(
                replicas
                    .iter_mut()
                    .map(|r| r.scraper.scrape(&client, &families, scrape_timeout)),
            )
            .await;
            for (replica, page) in replicas.iter_mut().zip(pages) {
                replica.record(now, page, in_window, &spec.checks);
            }
            watched.observe(now);
            if let Some(c) = companion.as_mut() {
                // Lines of the warm-up move the cursor, uncounted.
                let failed = self.read_companion(c, in_window, "after the warm-up").await;
                if let Some((code, msg)) = failed {
                    let mut e = evidence(&replicas, &restarts, &watched, None);
                    e.companion = Some(c.lines.clone());
                    e.ended_early = Some(true);
                    return StepEnd::failed(code, msg, Evidence::of(&e));
                }
            }
            if let Some(lost) = self.lost_early(spec, &replicas) {
                let verdicts = verdicts(spec, &replicas);
                let msg = format!("analysis failed before the window ended: {lost}");
                let mut e = evidence(&replicas, &restarts, &watched, Some(verdicts));
                e.ended_early = Some(true);
                return StepEnd::failed(ErrorCode::AnalysisFailed, msg, Evidence::of(&e));
            }
            let now = self.ctx.now();
            if now >= end {
                break;
            }
            let mut saved = evidence(&replicas, &restarts, &watched, None);
            saved.companion = companion.as_ref().map(|c| c.lines.clone());
            progress
                .save(self.ctx.store, &step.id, &Evidence::of(&saved))
                .await;
            if pause(next_wait(now, warm_end, end, spec.interval), abort).await {
                let e = evidence(&replicas, &restarts, &watched, None);
                return StepEnd::Aborted(Evidence::of(&e));
            }
        }
        let mut e = evidence(
            &replicas,
            &restarts,
            &watched,
            Some(verdicts(spec, &replicas)),
        );
        e.companion = companion.map(|c| c.lines);
        self.conclude(step, spec, e, abort).await
    }

    /// The analysis's window, from the step's persisted start: the step (its deadline moved
    /// as much as the window's end), the window's coverage, the warmup's end and the window's
    /// end. Resumed after a restart, the window ends late enough to gather again at least the
    /// part of it nobody watched (`watched.rs`): what was gathered before is not kept, so the
    /// checks judge what this drive gathers.
    pub(crate) async fn analysis_window(
        &self,
        step: &Step,
        spec: &AnalyzeSpec,
    ) -> (Step, Watched, DateTime<Utc>, DateTime<Utc>) {
        let now = self.ctx.now();
        let started = step.started_at.unwrap_or(now);
        let warm_end = started + chrono::Duration::from_std(spec.warmup).unwrap_or_default();
        let planned = warm_end + chrono::Duration::from_std(spec.duration).unwrap_or_default();
        let saved = evidence::<Analyze>(&step.detail).and_then(|e| e.watched);
        let watched = Watched::new(
            saved.map(|w| w.observed_ms),
            self.resumed,
            warm_end,
            spec.duration,
            now,
        );
        let end = watched.end(planned);
        let mut step = step.clone();
        if let Some(deadline) = step.deadline_at.filter(|_| end > planned) {
            let moved = deadline
                .checked_add_signed(end - planned)
                .unwrap_or(DateTime::<Utc>::MAX_UTC);
            self.extend_deadline(&step, moved).await;
            step.deadline_at = Some(moved);
        }
        (step, watched, warm_end, end)
    }

    /// The step's end once every check is judged: a failed check fails it; else an
    /// inconclusive check with `on_inconclusive: ask` waits for an operator's approval for
    /// `approve_timeout` (within the step's deadline, which includes it); else it passes.
    pub(crate) async fn conclude(
        &self,
        step: &Step,
        spec: &AnalyzeSpec,
        mut e: AnalyzeEvidence,
        abort: &CancellationToken,
    ) -> StepEnd {
        if e.verdicts().iter().any(|v| v.fails_step) {
            let msg = format!("analysis failed: {}", failures(e.verdicts()));
            return StepEnd::failed(ErrorCode::AnalysisFailed, msg, Evidence::of(&e));
        }
        let asking: Vec<String> = e
            .verdicts()
            .iter()
            .filter(|v| v.asks)
            .map(|v| v.name.clone())
            .collect();
        if asking.is_empty() {
            return StepEnd::Succeeded(Evidence::of(&e));
        }
        let asked_at = self.ctx.now();
        let names = asking.join(", ");
        e.asking = Some(asking);
        let wait = chrono::Duration::from_std(spec.approve_timeout).unwrap_or_default();
        let deadline = step
            .deadline_at
            .map_or(asked_at + wait, |d| d.min(asked_at + wait));
        let waiting = Evidence::of(&AnalyzeEvidence {
            awaiting_approval: Some(true),
            deadline: Some(deadline),
            ..e.clone()
        });
        match crate::engine::steps::approve::wait(self, step, &waiting, deadline, abort).await {
            crate::engine::steps::approve::Waited::Approved(a) => {
                e.approval = Some(crate::engine::steps::approve::evidence(&a, asked_at));
                StepEnd::Succeeded(Evidence::of(&e))
            }
            crate::engine::steps::approve::Waited::TimedOut => {
                let msg = format!(
                    "analysis inconclusive on {names} and no operator approved before {deadline}"
                );
                StepEnd::failed(ErrorCode::NotApproved, msg, Evidence::of(&e))
            }
            crate::engine::steps::approve::Waited::Aborted => StepEnd::Aborted(Evidence::of(&e)),
        }
    }

    /// A counter check the target has already lost, by name.
    fn lost_early(&self, spec: &AnalyzeSpec, replicas: &[Replica]) -> Option<String> {
        let target = replicas.iter().find(|r| r.target)?;
        spec.checks.iter().enumerate().find_map(|(i, check)| {
            let so_far = target.observed(i, check).value?;
            lost_early(check, so_far).then(|| {
                format!(
                    "{}: {so_far} is already above max {}",
                    check.name,
                    check.max.unwrap_or_default()
                )
            })
        })
    }
}

/// The container an earlier drive of the step held the target to: the first read of its saved
/// evidence (`restart.first`).
fn saved_container(step: &Step) -> Option<String> {
    let saved = evidence::<Analyze>(&step.detail)?;
    saved.restart?.first.map(|read| read.id)
}

/// Until the next scrape: an interval, but never past the warmup's end (so the window's
/// baseline is taken when it starts) or the window's end.
fn next_wait(
    now: DateTime<Utc>,
    warm_end: DateTime<Utc>,
    end: DateTime<Utc>,
    interval: Duration,
) -> Duration {
    let mut next = now + chrono::Duration::from_std(interval).unwrap_or_default();
    if now < warm_end && next > warm_end {
        next = warm_end;
    }
    next = next.min(end);
    (next - now)
        .to_std()
        .unwrap_or_default()
        .max(Duration::from_millis(10))
}
