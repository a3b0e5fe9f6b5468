//! Prometheus metrics (docs/reference.md#operations), fed by the store's committed audit events and
//! by the compose-manager client's per-request observer. Encoded with `prometheus-client`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::sync::broadcast::error::RecvError;

use crate::compose::ComposeObserver;
use crate::domain::runbook::StepKindName;
use crate::domain::state::{RolloutKind, RolloutStatus, StepStatus};
use crate::store::{AuditEvent, Store};

#[cfg(test)]
mod step_end_tests;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindOutcome {
    kind: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ComposeLabels {
    host: String,
    endpoint: String,
    code: String,
}

type HistogramFamily = Family<KindOutcome, Histogram, fn() -> Histogram>;

/// Rollouts last minutes to hours: 1 s … ~9 h.
fn rollout_buckets() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 16))
}

/// Steps last milliseconds (a snapshot) to an hour (a cold start).
fn step_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.5, 16))
}

/// Every metric canaryd exposes.
pub struct Metrics {
    registry: Registry,
    rollouts: Family<KindOutcome, Counter>,
    rollout_duration: HistogramFamily,
    step_duration: HistogramFamily,
    rollback_initiation: Histogram,
    replica_downtime: HistogramFamily,
    compose_requests: Family<ComposeLabels, Counter>,
    active_rollouts: Gauge,
    replicas_down: Gauge,
    storage_errors: Counter,
    storage_waiting: Gauge,
    releases: Family<OutcomeLabel, Counter>,
    release_targets: Family<StateLabel, Gauge>,
    /// What a step's running event said of it (handed over with the event, or read with
    /// `Store::step_timing` for one read back), by rollout id and step name, until its end
    /// event. Bounded:
    /// an entry leaves at its step's end, a rollout's at the rollout's end, and all of them
    /// when `KEPT_ROLLOUTS` rollouts are kept (an end that never arrives, e.g. a catch-up
    /// whose read failed, would otherwise stay).
    running: Mutex<HashMap<String, HashMap<String, StartedStep>>>,
}

/// At most this many rollouts' running steps are kept (`Metrics::running`): far more than run
/// at once; reached only when end events never arrived, and then the store answers the ends.
const KEPT_ROLLOUTS: usize = 10_000;

/// A running step's kind and start, as its running event read them.
#[derive(Debug, Clone, Copy)]
struct StartedStep {
    kind: StepKindName,
    started_at: Option<DateTime<Utc>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// A registry with every metric of docs/reference.md#operations.
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::default();
        let rollouts = Family::<KindOutcome, Counter>::default();
        registry.register(
            "canaryd_rollouts",
            "Rollouts finished, by kind and outcome",
            rollouts.clone(),
        );
        let rollout_duration = HistogramFamily::new_with_constructor(rollout_buckets);
        registry.register(
            "canaryd_rollout_duration_seconds",
            "Wall time of finished rollouts, from start to end",
            rollout_duration.clone(),
        );
        let step_duration = HistogramFamily::new_with_constructor(step_buckets);
        registry.register(
            "canaryd_step_duration_seconds",
            "Wall time of finished steps, by step kind and outcome",
            step_duration.clone(),
        );
        let rollback_initiation = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register(
            "canaryd_rollback_initiation_seconds",
            "From a rollback's request (or the failure that caused an automatic one) to its first compose-manager call",
            rollback_initiation.clone(),
        );
        let replica_downtime = HistogramFamily::new_with_constructor(rollout_buckets);
        registry.register(
            "canaryd_replica_downtime_seconds",
            "A replica's time out of service in a rollout, from its down to its first healthy answer, by rollout kind and outcome",
            replica_downtime.clone(),
        );
        let compose_requests = Family::<ComposeLabels, Counter>::default();
        registry.register(
            "canaryd_compose_manager_requests",
            "Requests to compose-manager, by host, endpoint and HTTP status (or error)",
            compose_requests.clone(),
        );
        let active_rollouts = Gauge::default();
        registry.register(
            "canaryd_active_rollouts",
            "Rollouts not yet terminal",
            active_rollouts.clone(),
        );
        let replicas_down = Gauge::default();
        registry.register(
            "canaryd_replicas_down",
            "Replicas a rollout took down and did not bring back (error replica_left_down), until a later rollout of them succeeds",
            replicas_down.clone(),
        );
        let storage_errors = Counter::default();
        registry.register(
            "canaryd_storage_errors",
            "Writes to the database that failed on the storage (a full disk, an I/O error)",
            storage_errors.clone(),
        );
        let storage_waiting = Gauge::default();
        registry.register(
            "canaryd_rollouts_waiting_on_storage",
            "Rollouts whose task waits for the database to be writable again (they send nothing meanwhile)",
            storage_waiting.clone(),
        );
        let releases = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "canaryd_releases",
            "Releases ended, by outcome (succeeded, failed, aborted)",
            releases.clone(),
        );
        let release_targets = Family::<StateLabel, Gauge>::default();
        registry.register(
            "canaryd_release_targets",
            "Targets of the releases not yet ended, by state (waiting, pending, running, succeeded, failed, aborted, rolled_back)",
            release_targets.clone(),
        );
        Arc::new(Self {
            registry,
            releases,
            release_targets,
            rollouts,
            rollout_duration,
            step_duration,
            rollback_initiation,
            replica_downtime,
            compose_requests,
            active_rollouts,
            replicas_down,
            storage_errors,
            storage_waiting,
            running: Mutex::default(),
        })
    }

    /// The observer a host's compose client reports each request to.
    pub fn compose_observer(self: &Arc<Self>, host: &str) -> ComposeObserver {
        let metrics = Arc::clone(self);
        let host = host.to_owned();
        Arc::new(move |endpoint: &str, code: &str| {
            let labels = ComposeLabels {
                host: host.clone(),
                endpoint: endpoint.to_owned(),
                code: code.to_owned(),
            };
            metrics.compose_requests.get_or_create(&labels).inc();
        })
    }

    /// The release metrics, read fresh from the database: releases ended per outcome (the
    /// counter catches up with the database's count) and the targets of unfinished releases.
    pub fn set_releases(&self, ended: &[(String, u64)], targets: &[(String, i64)]) {
        for (outcome, n) in ended {
            let counter = self.releases.get_or_create(&OutcomeLabel {
                outcome: outcome.clone(),
            });
            let seen = counter.get();
            if *n > seen {
                counter.inc_by(n - seen);
            }
        }
        self.release_targets.clear();
        for (state, n) in targets {
            self.release_targets
                .get_or_create(&StateLabel {
                    state: state.clone(),
                })
                .set(*n);
        }
    }

    /// The storage's failures as the store counts them (`StorageHealth`): the counter catches
    /// up with its total.
    pub fn set_storage(&self, errors_total: u64, waiting: i64) {
        let seen = self.storage_errors.get();
        if errors_total > seen {
            self.storage_errors.inc_by(errors_total - seen);
        }
        self.storage_waiting.set(waiting);
    }

    /// The text exposition, with the gauges read fresh from the database.
    pub fn encode(&self, active_rollouts: i64, replicas_down: i64) -> String {
        self.active_rollouts.set(active_rollouts);
        self.replicas_down.set(replicas_down);
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            tracing::error!("could not encode metrics");
        }
        out
    }

    /// Follows the store's audit events until the store is dropped.
    pub async fn follow(self: Arc<Self>, store: Store) {
        let events = store.subscribe();
        // Events committed before this follower started are not its own (a restart's
        // counters start at zero).
        let last = match store.last_audit_seq().await {
            Ok(last) => last,
            Err(e) => {
                tracing::warn!(error = %e, "metrics could not read the last audit event");
                0
            }
        };
        self.follow_from(store, events, last).await;
    }

    /// Follows `events` from the event after `last`. Every committed event is counted once,
    /// in order: when the broadcast ran ahead of this follower (`Lagged`, as with 1,000
    /// rollouts starting at once), the events it skipped are read back from the database.
    async fn follow_from(
        self: Arc<Self>,
        store: Store,
        mut events: tokio::sync::broadcast::Receiver<AuditEvent>,
        mut last: i64,
    ) {
        loop {
            match events.recv().await {
                Ok(event) if event.seq <= last => {}
                Ok(event) => {
                    last = event.seq;
                    self.on_event(&store, &event).await;
                }
                Err(RecvError::Lagged(n)) => {
                    tracing::debug!(missed = n, "metrics catching up on {n} audit events");
                    last = self.catch_up(&store, last).await;
                }
                Err(RecvError::Closed) => return,
            }
        }
    }

    /// Handles every event after `last` from the database; the last one handled.
    async fn catch_up(&self, store: &Store, mut last: i64) -> i64 {
        loop {
            let batch = match store.audit_events_after(last).await {
                Ok(batch) => batch,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics could not read back missed audit events");
                    return last;
                }
            };
            let full = batch.len() >= crate::store::AUDIT_BATCH;
            for event in batch {
                last = event.seq;
                self.on_event(store, &event).await;
            }
            if !full {
                return last;
            }
        }
    }

    async fn on_event(&self, store: &Store, event: &AuditEvent) {
        let Some(rollout_id) = &event.rollout_id else {
            return;
        };
        if let Some(status) = event.kind.rollout_status() {
            if status.is_terminal() {
                self.on_rollout_end(store, rollout_id, status).await;
            }
        } else if let Some(status) = event.kind.step_status() {
            self.on_step(store, rollout_id, event, status).await;
        }
    }

    /// A rollout ended: count it and observe its duration.
    async fn on_rollout_end(&self, store: &Store, rollout_id: &str, outcome: RolloutStatus) {
        self.running_steps().remove(rollout_id);
        let Ok(Some(r)) = store.get_rollout(rollout_id).await else {
            return;
        };
        let labels = KindOutcome {
            kind: r.kind.as_str().to_owned(),
            outcome: outcome.as_str().to_owned(),
        };
        self.rollouts.get_or_create(&labels).inc();
        if let Some(secs) = seconds(r.started_at.unwrap_or(r.created_at), r.finished_at) {
            self.rollout_duration.get_or_create(&labels).observe(secs);
        }
        // Written with the rollout's end: no read of its steps and calls here.
        if let Some(ms) = r.downtime_ms {
            let secs = ms as f64 / 1000.0;
            self.replica_downtime.get_or_create(&labels).observe(secs);
        }
    }

    /// A step started (the first one of a rollback marks its initiation) or ended.
    async fn on_step(
        &self,
        store: &Store,
        rollout_id: &str,
        event: &AuditEvent,
        outcome: StepStatus,
    ) {
        if !matches!(
            outcome,
            StepStatus::Running | StepStatus::Succeeded | StepStatus::Failed | StepStatus::Aborted
        ) {
            return;
        }
        let Some(name) = &event.step else { return };
        if outcome != StepStatus::Running {
            let started = self
                .running_steps()
                .get_mut(rollout_id)
                .and_then(|steps| steps.remove(name));
            if let Some(started) = started {
                // The end's time is the event's: a step's `finished_at` is written with its
                // end event, in one transaction, from one clock reading.
                self.observe_step(
                    started.kind,
                    outcome,
                    started.started_at.unwrap_or(event.occurred_at),
                    Some(event.occurred_at),
                );
                return;
            }
        }
        // The step as its transition wrote it, handed over with the event; read only for an
        // event read back from the database, or an end whose start the writer did not know.
        let handed = event
            .step_timing
            .clone()
            .filter(|t| outcome == StepStatus::Running || t.started_at.is_some());
        let step = match handed {
            Some(step) => step,
            None => match store.step_timing(rollout_id, name).await {
                Ok(Some(step)) => step,
                _ => return,
            },
        };
        if outcome == StepStatus::Running {
            {
                let mut running = self.running_steps();
                if running.len() >= KEPT_ROLLOUTS && !running.contains_key(rollout_id) {
                    running.clear();
                }
                let started = StartedStep {
                    kind: step.kind,
                    started_at: step.started_at,
                };
                running
                    .entry(rollout_id.to_owned())
                    .or_default()
                    .insert(name.clone(), started);
            }
            if step.position == 0 {
                self.observe_initiation(store, rollout_id, event.occurred_at)
                    .await;
            }
            return;
        }
        self.observe_step(
            step.kind,
            outcome,
            step.started_at.unwrap_or(event.occurred_at),
            step.finished_at,
        );
    }

    fn observe_step(
        &self,
        kind: StepKindName,
        outcome: StepStatus,
        from: DateTime<Utc>,
        to: Option<DateTime<Utc>>,
    ) {
        let labels = KindOutcome {
            kind: kind.as_str().to_owned(),
            outcome: outcome.as_str().to_owned(),
        };
        if let Some(secs) = seconds(from, to) {
            self.step_duration.get_or_create(&labels).observe(secs);
        }
    }

    fn running_steps(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, HashMap<String, StartedStep>>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A rollback's first step starts right before its first compose call.
    async fn observe_initiation(&self, store: &Store, rollout_id: &str, at: DateTime<Utc>) {
        let Ok(Some(r)) = store.get_rollout(rollout_id).await else {
            return;
        };
        if r.kind == RolloutKind::Rollback {
            if let Some(secs) = seconds(r.created_at, Some(at)) {
                self.rollback_initiation.observe(secs);
            }
        }
    }
}

fn seconds(from: DateTime<Utc>, to: Option<DateTime<Utc>>) -> Option<f64> {
    let ms = (to? - from).num_milliseconds();
    (ms >= 0).then(|| ms as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::audit::AuditKind;
    use crate::store::AuditEntry;

    /// The value of the sample line starting with `prefix` in `text`.
    fn sample(text: &str, prefix: &str) -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    #[tokio::test]
    async fn a_follower_that_fell_behind_counts_the_events_it_missed_from_the_database() {
        let (_dir, store) = crate::store::tests::temp_store().await;
        let events = store.subscribe();
        let last = store.last_audit_seq().await.expect("last seq");
        let new = crate::store::tests::rollout("ro_1", "gpu02", "r2", 0);
        store.create_rollout(&new, &[]).await.expect("rollout");
        let ended = AuditEntry::new(
            Utc::now(),
            "canaryd",
            AuditKind::rollout(RolloutStatus::Succeeded),
        )
        .rollout("ro_1");
        store.audit(&ended).await.expect("end event");
        // More events than the broadcast holds (1,024), after the one that counts: a follower
        // that has not read yet loses the oldest, the rollout's end among them.
        let noise = 1_100;
        for _ in 0..noise {
            let entry = AuditEntry::new(
                Utc::now(),
                "alice",
                AuditKind::rollout(RolloutStatus::Pending),
            );
            store.audit(&entry).await.expect("noise event");
        }
        for _ in 0..500 {
            if events.len() > noise {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(
            events.len() > noise,
            "every event was broadcast: {}",
            events.len()
        );

        let metrics = Metrics::new();
        let follower = tokio::spawn(Arc::clone(&metrics).follow_from(store.clone(), events, last));
        let line = "canaryd_rollouts_total{kind=\"canary\",outcome=\"succeeded\"}";
        let mut counted = None;
        for _ in 0..500 {
            counted = sample(&metrics.encode(0, 0), line);
            if counted.is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        follower.abort();
        assert_eq!(counted, Some(1.0), "{}", metrics.encode(0, 0));
    }
}
