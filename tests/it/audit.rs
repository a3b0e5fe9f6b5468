//! Audit and live view (docs/audit.md): history filters, keyset pagination, CSV export, the event
//! stream, who-did-what in the audit trail, retention, and the indexes behind the filters.
//! This file holds the shared helpers; the tests are in `audit/`.

mod events;
mod history_cli;
mod listing;
mod retention;

use std::collections::BTreeMap;

use canaryd::domain::runbook::StepKindName;
use canaryd::domain::state::{OnFailure, RolloutEvent, RolloutKind};
use canaryd::store::{new_id, NewRollout, NewStep, RolloutChange, Store};
use chrono::{DateTime, TimeZone, Utc};
use serde_json::Value;

use crate::helpers::TestApp;

/// 2025-01-01T00:00:00Z plus `minutes`.
pub fn at(minutes: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0)
        .single()
        .expect("valid time")
        + chrono::Duration::minutes(minutes)
}

/// A rollout as the tests insert it straight into the store.
#[derive(Clone)]
pub struct Row {
    pub host: &'static str,
    pub service: &'static str,
    pub kind: RolloutKind,
    pub tag: &'static str,
    pub actor: &'static str,
    pub reason: &'static str,
    pub created_at: DateTime<Utc>,
    /// Start then this (Succeed, Fail or Abort) a minute after creation; `Start`: left running.
    pub outcome: RolloutEvent,
}

impl Row {
    pub fn new(created_at: DateTime<Utc>) -> Row {
        Row {
            host: "gpu07",
            service: "svc-a",
            kind: RolloutKind::Canary,
            tag: "v1",
            actor: "ops-alice",
            reason: "routine",
            created_at,
            outcome: RolloutEvent::Succeed,
        }
    }
}

/// The daemon's own database handle (a second process could not open it: it is owned).
pub async fn open_store(app: &TestApp) -> Store {
    app.engine.store().clone()
}

/// Inserts a finished rollout (created, started, then `outcome`) with two steps; returns its id.
pub async fn insert(store: &Store, row: &Row) -> String {
    let id = new_id("ro");
    let new = NewRollout {
        id: id.clone(),
        kind: row.kind,
        host: row.host.to_owned(),
        file: "prod/x.yaml".parse().expect("a valid name"),
        service: row.service.parse().expect("a valid name"),
        tag: row.tag.parse().expect("a valid name"),
        runbook: "single-replica-canary".to_owned(),
        actor: row.actor.to_owned(),
        reason: row.reason.to_owned(),
        env_overrides: BTreeMap::new(),
        env_sha256: "0".repeat(64),
        require_logs: Vec::new(),
        on_failure: OnFailure::Rollback,
        rollback_of: None,
        expect_commit: None,
        expect_file_sha256: None,
        created_at: row.created_at,
        deploy_as: None,
        replaces: None,
        windows: Vec::new(),
        required_free: None,
    };
    let steps = [
        NewStep {
            name: "snapshot".into(),
            kind: StepKindName::Snapshot,
        },
        NewStep {
            name: "up".into(),
            kind: StepKindName::Up,
        },
    ];
    store
        .create_rollout(&new, &steps)
        .await
        .expect("rollout inserted");
    let mut events = vec![(RolloutEvent::Start, 1)];
    if !matches!(row.outcome, RolloutEvent::Start) {
        events.push((row.outcome, 60));
    }
    for (event, secs) in events {
        let change = RolloutChange {
            event,
            actor: "canaryd".into(),
            error: None,
            detail: Default::default(),
            at: row.created_at + chrono::Duration::seconds(secs),
        };
        store
            .transition_rollout(&id, &change)
            .await
            .expect("transition");
    }
    id
}

/// `GET path` as (status, JSON body).
pub async fn get(app: &TestApp, path: &str) -> (u16, Value) {
    let res = reqwest::Client::new()
        .get(format!("{}{path}", app.url))
        .send()
        .await
        .expect("request reaches the daemon");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

pub fn ids(body: &Value) -> Vec<String> {
    body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|r| r["id"].as_str().expect("id").to_owned())
        .collect()
}
