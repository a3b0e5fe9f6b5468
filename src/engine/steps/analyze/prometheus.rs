//! The `analyze` step with `source: prometheus`: wait out `warmup` + `duration` (watching the
//! target for restarts every `interval`, as the engine source does), then evaluate every
//! check's PromQL query at the window's end, once per replica it needs (the target; each peer
//! too for `max_ratio_to_peers`), with `{{host}}`, `{{service}}` and `{{window}}` filled per
//! replica, and judge the values as the engine source does. Resumed after a restart, it
//! watches again at least the part of the window nobody watched and evaluates at the moved
//! end (`watched.rs`): over a window that ends after what it watched.
//!
//! A query's value is its one sample; no sample (or NaN, as `histogram_quantile` gives
//! without observations) is no data, hence `inconclusive`. A query Prometheus cannot answer
//! fails the step with the error's own code (`prometheus_query_error`,
//! `prometheus_http_status`, `prometheus_timeout`, `prometheus_unreachable`,
//! `prometheus_bad_answer`, `prometheus_many_series`) and Prometheus's message, masked like
//! every text from a host. Every query as sent and its answer are the step's evidence.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{next_wait, saved_container};
use crate::domain::analysis::{fill_query, judge, promql_duration, AnalyzeSpec, Observed};
use crate::domain::error_code::ErrorCode;
use crate::domain::mask::mask;
use crate::domain::runbook::step::analyze::{
    AnalyzeEvidence, AnalyzedReplica, QueryEvidence, Role,
};
use crate::domain::runbook::step::signals::SourceRead;
use crate::engine::restart::RestartWatch;
use crate::engine::step_run::{pause, Evidence, Progress, StepEnd, StepRun};
use crate::engine::watched::Watched;
use crate::probe::prometheus::{QueryError, Sample};
use crate::store::Step;

/// The longest one query may take (the step's deadline leaves a minute after the window for
/// the queries, which run at the same time).
pub(crate) const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// One query to evaluate: check `check`'s query for `replica`.
struct Query {
    check: usize,
    replica: String,
    target: bool,
    query: String,
}

impl Query {
    fn role(&self) -> Role {
        if self.target {
            Role::Target
        } else {
            Role::Peer
        }
    }
}

/// What a query answered, as evidence.
fn evidence(
    q: &Query,
    name: &str,
    answer: Option<&Result<Option<Sample>, String>>,
) -> QueryEvidence {
    let mut e = QueryEvidence {
        check: name.to_owned(),
        replica: q.replica.clone(),
        role: q.role(),
        query: q.query.clone(),
        samples: None,
        value: None,
        error: None,
    };
    match answer {
        None => {}
        Some(Ok(sample)) => {
            e.samples = Some(u8::from(sample.is_some()));
            e.value = Some(sample.as_ref().map(|s| s.raw.clone()));
        }
        Some(Err(error)) => e.error = Some(error.clone()),
    }
    e
}

/// A sample's value when it is a number a check can use.
fn usable(sample: &Option<Sample>) -> Option<f64> {
    sample.as_ref().map(|s| s.value).filter(|v| v.is_finite())
}

impl StepRun<'_> {
    /// Every query the step evaluates: each check's for the target (the compose service it
    /// runs under) and, with `max_ratio_to_peers`, for each peer (by its slot).
    fn queries(&self, spec: &AnalyzeSpec) -> Vec<Query> {
        let config = &self.ctx.host;
        let target = self.rollout.target().as_str();
        let peers = config.peers(&self.rollout.service);
        let mut queries = Vec::new();
        for (i, check) in spec.checks.iter().enumerate() {
            let text = check.query.as_deref().unwrap_or_default();
            let mut replicas = vec![(target, true)];
            if check.max_ratio_to_peers.is_some() {
                replicas.extend(peers.iter().map(|p| (*p, false)));
            }
            for (replica, is_target) in replicas {
                queries.push(Query {
                    check: i,
                    replica: replica.to_owned(),
                    target: is_target,
                    query: fill_query(text, &config.name, replica, spec.duration),
                });
            }
        }
        queries
    }

    /// The step's queries evaluated once, now, before anything touches the target (safety
    /// rule 20, `preflight.rs`): each as evidence, with the error (masked) of one Prometheus
    /// could not answer. No sample is an answer (the target may not be serving yet).
    pub(in crate::engine) async fn prometheus_once(&self, spec: &AnalyzeSpec) -> Vec<SourceRead> {
        let Some(prom) = self.ctx.prometheus else {
            let msg = "Prometheus: `source: prometheus` needs a `prometheus:` server in the daemon config, which has none";
            return vec![SourceRead::of("prometheus").ended(Some(msg.to_owned()), None)];
        };
        let mut secrets: Vec<String> = self.env.values().cloned().collect();
        secrets.extend(prom.token().map(|t| t.expose().to_owned()));
        let queries = self.queries(spec);
        let now = self.ctx.now();
        let answers =
            futures_util::future::join_all(queries.iter().map(|q| prom.instant(&q.query, now)))
                .await;
        queries
            .iter()
            .zip(answers)
            .map(|(q, answer)| {
                let answer = answer.map_err(|e| mask(&e.to_string(), &secrets));
                let name = &spec.checks[q.check].name;
                let e = evidence(q, name, Some(&answer));
                let error = answer.err().map(|e| {
                    format!(
                        "Prometheus query of check \"{name}\" for {}: {e}",
                        q.replica
                    )
                });
                let read = SourceRead {
                    check: Some(e.check),
                    replica: Some(e.replica),
                    role: Some(e.role),
                    query: Some(e.query),
                    samples: e.samples,
                    value: e.value,
                    ..SourceRead::of("prometheus")
                };
                read.ended(error, None)
            })
            .collect()
    }

    pub(super) async fn analyze_prometheus(
        &self,
        step: &Step,
        spec: &AnalyzeSpec,
        abort: &CancellationToken,
    ) -> StepEnd {
        let Some(prom) = self.ctx.prometheus else {
            let msg = "`source: prometheus` needs a `prometheus:` server in the daemon config, which has none";
            return StepEnd::failed(ErrorCode::PrometheusNotConfigured, msg, Evidence::none());
        };
        // The compose service the target runs under; its peers by its slot.
        let target = self.rollout.target().as_str();
        let peers = self.ctx.host.peers(&self.rollout.service);
        let queries = self.queries(spec);
        let (step, mut watched, warm_end, end) = self.analysis_window(step, spec).await;
        let step = &step;
        let detail = |restarts: &RestartWatch, watched: &Watched, queries: Vec<QueryEvidence>| {
            AnalyzeEvidence {
                source: Some(spec.source),
                prometheus_url: Some(prom.url().to_owned()),
                warmup_ends_at: Some(warm_end),
                ends_at: Some(end),
                window: Some(promql_duration(spec.duration)),
                replicas: std::iter::once((target, Role::Target))
                    .chain(peers.iter().map(|p| (*p, Role::Peer)))
                    .map(|(name, role)| {
                        let replica = AnalyzedReplica {
                            role,
                            scrapes: None,
                        };
                        (name.to_owned(), replica)
                    })
                    .collect(),
                queries: Some(queries),
                restart: Some(restarts.evidence()),
                watched: Some(watched.evidence(end)),
                ..AnalyzeEvidence::default()
            }
        };
        let pending = || -> Vec<QueryEvidence> {
            queries
                .iter()
                .map(|q| evidence(q, &spec.checks[q.check].name, None))
                .collect()
        };
        let mut restarts = RestartWatch::resuming(saved_container(step));
        let mut progress = Progress::new(self.ctx.timings.progress_every);
        loop {
            if let Some(restarted) = restarts.check(self).await {
                let mut e = detail(&restarts, &watched, pending());
                e.restart = Some(restarted.reads.clone());
                return restarted.failed(Evidence::of(&e));
            }
            let now = self.ctx.now();
            watched.observe(now);
            if now >= end {
                break;
            }
            progress
                .save(
                    self.ctx.store,
                    &step.id,
                    &Evidence::of(&detail(&restarts, &watched, pending())),
                )
                .await;
            if pause(next_wait(now, warm_end, end, spec.interval), abort).await {
                return StepEnd::Aborted(Evidence::of(&detail(&restarts, &watched, pending())));
            }
        }
        let mut secrets: Vec<String> = self.env.values().cloned().collect();
        secrets.extend(prom.token().map(|t| t.expose().to_owned()));
        let answers: Vec<Result<Option<Sample>, QueryError>> =
            futures_util::future::join_all(queries.iter().map(|q| prom.instant(&q.query, end)))
                .await;
        let shown: Vec<Result<Option<Sample>, String>> = answers
            .iter()
            .map(|a| a.clone().map_err(|e| mask(&e.to_string(), &secrets)))
            .collect();
        let answered: Vec<QueryEvidence> = queries
            .iter()
            .zip(&shown)
            .map(|(q, a)| evidence(q, &spec.checks[q.check].name, Some(a)))
            .collect();
        if let Some((q, e)) = queries
            .iter()
            .zip(&answers)
            .find_map(|(q, a)| a.as_ref().err().map(|e| (q, e)))
        {
            let msg = format!(
                "check \"{}\": the query for {} ({}) failed: {}",
                spec.checks[q.check].name,
                q.replica,
                q.role().as_str(),
                mask(&e.to_string(), &secrets)
            );
            let failed = Evidence::of(&detail(&restarts, &watched, answered));
            return StepEnd::failed(e.code(), msg, failed);
        }
        let mut checks = Vec::with_capacity(spec.checks.len());
        for (i, check) in spec.checks.iter().enumerate() {
            let mut target_seen = Observed {
                value: None,
                requests: None,
            };
            let mut peer_seen = BTreeMap::new();
            let mut sent = BTreeMap::new();
            for (q, a) in queries.iter().zip(&answers).filter(|(q, _)| q.check == i) {
                let value = a.as_ref().ok().and_then(usable);
                let seen = Observed {
                    value,
                    requests: None,
                };
                if q.target {
                    target_seen = seen;
                } else {
                    peer_seen.insert(q.replica.clone(), seen);
                }
                sent.insert(q.replica.clone(), q.query.clone());
            }
            let mut verdict = judge(check, target_seen, peer_seen);
            verdict.queries = Some(sent);
            checks.push(verdict);
        }
        let mut e = detail(&restarts, &watched, answered);
        e.evaluated_at = Some(end);
        e.checks = Some(Some(checks));
        self.conclude(step, spec, e, abort).await
    }
}
