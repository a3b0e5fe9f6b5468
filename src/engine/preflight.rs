//! Look before you touch (safety rule 20, docs/safety.md): before the first call that touches
//! the target — the first `down` or `up` of the target itself, not a dry run, not a companion
//! call — every signal a later step of the runbook needs is read once:
//!
//! - the target's logs (`compose/logs`, as `wait_logs` and `soak` read them), when a later
//!   `wait_logs` watches the target or a `soak` follows;
//! - the target's OpenAI-compatible API (`GET {api_url}/v1/models`), when a `smoke` follows;
//! - for an `analyze` that follows, the metrics pages of the target and its peers (`source:
//!   engine`), or each check's Prometheus query, once per replica it needs (`source:
//!   prometheus`).
//!
//! The target's own engine (its API, its page) is read only while it serves (`/health`
//! answers 200): a replica that is down, absent or failing may be what the rollout brings back,
//! so those are then skipped, the health answer kept as the reason. Its logs are read either
//! way (compose-manager answers them for a service that does not run).
//!
//! One source that cannot be read fails a canary `signal_unavailable`, naming the source and
//! the cause, before anything is sent that touches the target: nothing to roll back. A
//! rollback reads and records them too, but is never blocked: it must be able to restore a
//! replica whose logs are unreadable. What was read is the touching step's evidence
//! (`signals` in its detail). A step that already wrote a compose attempt, or a rollout that
//! already touched its target (a resumed one), does not read them again.

use std::collections::BTreeSet;

use super::step_run::{Evidence, StepEnd, StepRun};
use crate::domain::analysis::{AnalysisSource, AnalyzeSpec, Check};
use crate::domain::error_code::ErrorCode;
use crate::domain::mask::mask;
use crate::domain::runbook::step::analyze::Role;
use crate::domain::runbook::step::signals::{Signals, SourceRead};
use crate::domain::runbook::step::up::ComposeEvidence;
use crate::domain::runbook::{self, StepKind};
use crate::domain::state::RolloutKind;
use crate::store::Step;

/// Characters of an engine's answer kept in a message.
const BODY_EXCERPT: usize = 200;

/// The signals the steps after the touching one read.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Needs<'r> {
    /// The target's logs: a `wait_logs` of the target, or a `soak`.
    pub logs: bool,
    /// The companions a `soak` watches (the proxy's log).
    pub companions: BTreeSet<&'r crate::domain::names::ServiceName>,
    /// The target's OpenAI-compatible API: a `smoke`.
    pub api: bool,
    /// The families of the `analyze` steps that scrape the engines' pages.
    pub pages: BTreeSet<&'r str>,
    /// The `analyze` steps that ask Prometheus.
    pub prometheus: Vec<&'r AnalyzeSpec>,
}

impl Needs<'_> {
    fn is_empty(&self) -> bool {
        !self.logs
            && !self.api
            && self.pages.is_empty()
            && self.prometheus.is_empty()
            && self.companions.is_empty()
    }
}

/// What `later` (the steps after the touching one) will read of `target` (the compose name
/// the rollout acts on).
pub(super) fn needs<'r>(later: &'r [runbook::Step], target: &str) -> Needs<'r> {
    let mut needs = Needs::default();
    for step in later {
        match &step.kind {
            StepKind::WaitLogs(w) => {
                needs.logs |= w.service.as_ref().is_none_or(|s| s == target);
            }
            StepKind::Soak(s) => {
                needs.logs = true;
                needs.companions.extend(s.watch.iter().map(|w| &w.service));
            }
            StepKind::Smoke(_) => needs.api = true,
            StepKind::Analyze(a) if a.source == AnalysisSource::Prometheus => {
                needs.prometheus.push(a);
            }
            StepKind::Analyze(a) => needs.pages.extend(a.checks.iter().map(Check::family)),
            _ => {}
        }
        if let StepKind::Analyze(a) = &step.kind {
            needs.companions.extend(a.watch.iter().map(|w| &w.service));
        }
    }
    needs
}

/// Whether a step of this kind calls the target itself (`down`/`up` without `services`).
fn touches_target(kind: &StepKind) -> bool {
    match kind {
        StepKind::Down(d) => !d.scope.is_companion(),
        StepKind::Up(u) => !u.scope.is_companion(),
        _ => false,
    }
}

/// Run before `step` (started, not yet executed): when it is the rollout's first call of its
/// target, reads the signals the later steps need. `Ok(Some(signals))` when they were read
/// (to keep in the step's detail, [`Evidence::with_signals`]), `Ok(None)` when there was
/// nothing to do, `Err` with the step's failure when a canary cannot read one (nothing sent).
pub(super) async fn look(
    run: &StepRun<'_>,
    runbook: &runbook::Runbook,
    step: &Step,
    kind: &StepKind,
) -> Result<Option<Signals>, StepEnd> {
    if !touches_target(kind) || run.touched.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(None);
    }
    // A step resumed after it wrote a compose attempt (a rename's dry run of the former
    // service, say) got past its look before.
    let store = run.ctx.store;
    if let Ok(attempts) = store.attempts(&run.rollout.id).await {
        if attempts.iter().any(|a| a.step_id == step.id) {
            return Ok(None);
        }
    }
    let later = runbook
        .steps
        .get(
            usize::try_from(step.position)
                .unwrap_or(usize::MAX)
                .saturating_add(1)..,
        )
        .unwrap_or_default();
    let needs = needs(later, run.rollout.target());
    let sources = if needs.is_empty() {
        Vec::new()
    } else {
        read(run, &needs).await
    };
    let failed: Vec<&str> = sources.iter().filter_map(|r| r.error.as_deref()).collect();
    let blocking = run.rollout.kind == RolloutKind::Canary;
    if failed.is_empty() || !blocking {
        if !failed.is_empty() {
            let causes = failed.join("; ");
            tracing::warn!(rollout.id = %run.rollout.id, step.name = %step.name, "rollout {} goes on although a signal cannot be read (a rollback is never blocked): {causes}", run.rollout.id);
        }
        return Ok(Some(Signals {
            read_at: run.ctx.now(),
            blocking,
            sources,
        }));
    }
    let msg = format!(
        "a signal a later step needs cannot be read, so nothing was sent: {}",
        failed.join("; ")
    );
    let evidence = ComposeEvidence {
        sent: Some(false),
        signals: Some(Signals {
            read_at: run.ctx.now(),
            blocking,
            sources,
        }),
        ..ComposeEvidence::default()
    };
    Err(StepEnd::failed(
        ErrorCode::SignalUnavailable,
        msg,
        Evidence::of(&evidence),
    ))
}

/// The step's end with the signals read before it in its detail.
pub(super) fn with_evidence(end: StepEnd, signals: Option<Signals>) -> StepEnd {
    match signals {
        Some(signals) => end.map(|d| d.with_signals(&signals)),
        None => end,
    }
}

async fn read(run: &StepRun<'_>, needs: &Needs<'_>) -> Vec<SourceRead> {
    let mut secrets: Vec<String> = run.env.values().cloned().collect();
    let replica = run.ctx.host.replicas.get(run.rollout.service.as_str());
    secrets.extend(
        replica
            .and_then(|r| r.api_token.as_ref())
            .map(|t| t.expose().to_owned()),
    );
    let mut reads = Vec::new();
    // The target's logs, and those of every companion a soak or analysis watches.
    let target = needs.logs.then(|| run.rollout.target());
    for service in target.into_iter().chain(needs.companions.iter().copied()) {
        let (error, lines) = match run.fetch_logs(service).await {
            Ok(text) => (None, Some(text.lines().count())),
            Err(e) => (Some(format!("logs of {service}: {e}")), None),
        };
        let read = SourceRead {
            service: Some(service.to_string()),
            lines: Some(lines),
            ..SourceRead::of("logs")
        };
        reads.push(read.ended(error.map(|e| mask(&e, &secrets)), None));
    }
    // The target's engine is read only while it serves.
    let serving = if needs.api || !needs.pages.is_empty() {
        Some(target_serving(run).await)
    } else {
        None
    };
    let not_serving = serving.as_ref().and_then(|s| s.as_ref().err().cloned());
    if needs.api {
        let mut r = match &not_serving {
            None => api(run).await,
            Some(why) => SourceRead {
                replica: Some(run.rollout.service.to_string()),
                ..SourceRead::of("engine_api")
            }
            .ended(None, Some(why.clone())),
        };
        r.error = r.error.map(|e| mask(&e, &secrets));
        reads.push(r);
    }
    if !needs.pages.is_empty() {
        let families: Vec<&str> = needs.pages.iter().copied().collect();
        if let Some(why) = &not_serving {
            let read = SourceRead {
                replica: Some(run.rollout.service.to_string()),
                role: Some(Role::Target),
                ..SourceRead::of("metrics")
            };
            reads.push(read.ended(None, Some(why.clone())));
        }
        reads.extend(run.pages_once(&families, not_serving.is_none()).await);
    }
    for spec in &needs.prometheus {
        reads.extend(run.prometheus_once(spec).await);
    }
    reads
}

/// `Ok` when the target's engine answers `/health` 200 now; else why it does not (or that it
/// has no `health_url`, in which case it is read as if it served).
async fn target_serving(run: &StepRun<'_>) -> Result<(), String> {
    let Some(url) = run.health_url(&run.rollout.service) else {
        return Ok(());
    };
    let url = crate::probe::HealthUrl::new(url.to_owned());
    let sample = run.ctx.prober.sample(&url).await;
    if sample.is_healthy() {
        return Ok(());
    }
    let answer = match (&sample.status, &sample.error) {
        (Some(status), _) => format!("answered {status}"),
        (None, Some(error)) => error.clone(),
        (None, None) => "no answer".to_owned(),
    };
    Err(format!(
        "the target's engine does not serve now (/health: {answer}): read once it is up"
    ))
}

/// `GET {api_url}/v1/models` of the target: 200 with a list of models.
async fn api(run: &StepRun<'_>) -> SourceRead {
    let service = &run.rollout.service;
    let read = SourceRead {
        replica: Some(service.to_string()),
        ..SourceRead::of("engine_api")
    };
    let Some(replica) = run.ctx.host.replicas.get(service.as_str()) else {
        let error = format!("engine API of {service}: not a configured replica");
        return read.ended(Some(error), None);
    };
    let url = format!("{}/v1/models", replica.api_url.trim_end_matches('/'));
    let time = run.ctx.timings.scrape_timeout;
    let token = replica.api_token.as_ref();
    let answer = run.ctx.engine_api.get(&url, token, time).await;
    let cause = match answer {
        Ok(a) if a.status == 200 => match super::steps::smoke::parse_models(&a.body) {
            Ok(_) => None,
            Err(e) => Some(format!("answered 200 but not a list of models: {e}")),
        },
        Ok(a) => {
            let body: String = a.body.chars().take(BODY_EXCERPT).collect();
            Some(format!("answered {}: {body}", a.status))
        }
        Err(e) => Some(e.to_string()),
    };
    let error = cause.map(|c| format!("engine API of {service} (GET {url}): {c}"));
    SourceRead {
        url: Some(url),
        ..read
    }
    .ended(error, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn later(yaml: &str) -> runbook::Runbook {
        runbook::parse("t", "t", yaml).expect("test runbook parses")
    }

    #[test]
    fn logs_are_needed_for_a_wait_logs_of_the_target_or_a_soak_not_of_a_companion() {
        let companion =
            later("steps:\n  - {name: l, kind: wait_logs, service: relay, require: [x]}\n");
        assert!(needs(&companion.steps, "r2").is_empty());
        let of_target = later("steps:\n  - {name: l, kind: wait_logs, require: [x]}\n");
        assert!(needs(&of_target.steps, "r2").logs);
        let named = later("steps:\n  - {name: l, kind: wait_logs, service: r2, require: [x]}\n");
        assert!(needs(&named.steps, "r2").logs);
        let soak = later("steps:\n  - {name: s, kind: soak, duration: 1s, interval: 100ms}\n");
        assert_eq!(
            needs(&soak.steps, "r2"),
            Needs {
                logs: true,
                ..Needs::default()
            }
        );
        // A soak watching the proxy reads its log before the touch too.
        let watching = later("steps:\n  - {name: s, kind: soak, duration: 1s, interval: 100ms, watch: {service: proxy-glm53, patterns: [Backend marked unhealthy]}}\n");
        let proxy: crate::domain::names::ServiceName = "proxy-glm53".parse().expect("name");
        assert_eq!(
            needs(&watching.steps, "r2").companions,
            BTreeSet::from([&proxy])
        );
    }

    #[test]
    fn a_smoke_needs_the_api_and_an_analysis_its_pages_or_its_prometheus() {
        let rb = later(
            r#"steps:
  - {name: health, kind: wait_health}
  - {name: smoke, kind: smoke, model: m, prompt: p, expect: [x]}
  - name: a
    kind: analyze
    checks: [{name: t, counter: "sglang:num_requests_total", min: 1}]
  - name: p
    kind: analyze
    source: prometheus
    checks: [{name: q, query: "sum(up)", min: 1}]
"#,
        );
        let n = needs(&rb.steps, "r2");
        assert!(!n.logs && n.api);
        assert_eq!(
            n.pages.into_iter().collect::<Vec<_>>(),
            ["sglang:num_requests_total"]
        );
        assert_eq!(n.prometheus.len(), 1);
        assert_eq!(n.prometheus[0].checks[0].name, "q");
    }

    #[test]
    fn only_a_down_or_up_of_the_target_itself_is_looked_before() {
        let rb = later(
            r#"steps:
  - {name: peers, kind: peers_healthy}
  - {name: plan, kind: plan}
  - {name: down, kind: down}
  - {name: up, kind: up}
  - {name: down-relay, kind: down, services: [relay]}
  - {name: plan-relay, kind: plan, services: [relay]}
  - {name: up-relay, kind: up, services: [relay]}
"#,
        );
        let touching: Vec<bool> = rb.steps.iter().map(|s| touches_target(&s.kind)).collect();
        assert_eq!(touching, [false, false, true, true, false, false, false]);
    }

    #[test]
    fn the_evidence_joins_the_steps_detail_whatever_its_end() {
        use serde_json::json;
        let at = chrono::DateTime::parse_from_rfc3339("2026-12-06T03:00:00Z").expect("a time");
        let signals = Some(Signals {
            read_at: at.to_utc(),
            blocking: true,
            sources: vec![SourceRead::of("logs").ended(None, None)],
        });
        let kept = json!({"read_at": "2026-12-06T03:00:00Z", "blocking": true,
                          "sources": [{"source": "logs", "ok": true}]});
        let lines = ComposeEvidence {
            lines: Some(3),
            ..ComposeEvidence::default()
        };
        let StepEnd::Succeeded(d) =
            with_evidence(StepEnd::Succeeded(Evidence::of(&lines)), signals.clone())
        else {
            panic!("still succeeded");
        };
        assert_eq!(d.json(), &json!({"lines": 3, "signals": kept}));
        let failed = StepEnd::failed(ErrorCode::ComposeFailed, "m", Evidence::none());
        let StepEnd::Failed { detail, code, .. } = with_evidence(failed, signals) else {
            panic!("still failed");
        };
        assert_eq!(code, ErrorCode::ComposeFailed);
        assert_eq!(detail.json(), &json!({"signals": kept}));
    }
}
