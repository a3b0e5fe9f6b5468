//! Every enum stored in a TEXT column lists exactly the values of the column's CHECK, as the
//! newest migration that (re)creates the table states it. `step.kind`, whose table cannot be
//! rebuilt, is checked by triggers against the `step_kind` table, which `Store::open` fills
//! with `StepKindName::ALL`.

use std::collections::BTreeSet;

use super::MIGRATOR;
use crate::domain::audit::AuditKind;
use crate::domain::notification::{DeliveryStatus, NotifyEvent};
use crate::domain::release::{ReleaseEventKind, ReleaseOnFailure, ReleaseStatus, TargetOutcome};
use crate::domain::runbook::StepKindName;
use crate::domain::state::{
    AttemptOutcome, DeploymentSource, OnFailure, RolloutKind, RolloutStatus, StepStatus,
};

/// The values of `column text ... check (column in (...))` in the newest migration that
/// creates `table` (or `table_new`, renamed to it).
fn check_list(table: &str, column: &str) -> BTreeSet<String> {
    let mut found = None;
    for migration in MIGRATOR.iter() {
        let sql = migration.sql.as_ref();
        for create in [
            format!("create table {table} ("),
            format!("create table {table}_new ("),
        ] {
            let Some(start) = sql.find(&create) else {
                continue;
            };
            let body = &sql[start..];
            let body = &body[..body.find(");").unwrap_or(body.len())];
            if let Some(list) = quoted_list(body, &format!("check ({column} in (")) {
                found = Some(list);
            }
        }
    }
    found.unwrap_or_else(|| panic!("no CHECK on {table}.{column}"))
}

/// The `'a', 'b'` list that follows `marker` in `body`, up to its closing parenthesis.
fn quoted_list(body: &str, marker: &str) -> Option<BTreeSet<String>> {
    let list = &body[body.find(marker)? + marker.len()..];
    let list = &list[..list.find(')').expect("closing parenthesis")];
    Some(
        list.split(',')
            .map(|v| v.trim().trim_matches('\'').to_owned())
            .collect(),
    )
}

/// The names of every value of a stored enum.
fn names<T: std::fmt::Display>(all: &[T]) -> BTreeSet<String> {
    all.iter().map(T::to_string).collect()
}

#[test]
fn every_stored_enum_matches_its_column_check() {
    let cases = [
        ("rollout", "kind", names(RolloutKind::ALL)),
        ("rollout", "status", names(RolloutStatus::ALL)),
        ("rollout", "on_failure", names(OnFailure::ALL)),
        ("step", "status", names(StepStatus::ALL)),
        ("step_attempt", "outcome", names(AttemptOutcome::ALL)),
        ("outbox", "event", names(&NotifyEvent::ALL)),
        ("outbox_delivery", "status", names(DeliveryStatus::ALL)),
        ("audit_event", "kind", names(AuditKind::ALL)),
        ("deployment", "source", names(DeploymentSource::ALL)),
        ("release", "status", names(ReleaseStatus::ALL)),
        ("release", "on_failure", names(ReleaseOnFailure::ALL)),
        ("release_event", "kind", names(ReleaseEventKind::ALL)),
        ("release_target", "outcome", names(TargetOutcome::ALL)),
    ];
    for (table, column, values) in cases {
        assert_eq!(check_list(table, column), values, "{table}.{column}");
    }
}

#[test]
fn the_step_kind_triggers_read_the_step_kind_table_not_a_list() {
    for trigger in ["step_kind_check_insert", "step_kind_check_update"] {
        let body = trigger_body(trigger);
        assert!(
            body.contains("when new.kind not in (select name from step_kind)"),
            "{trigger}: {body}"
        );
    }
}

/// The newest migration's `create trigger name ... end;`.
fn trigger_body(name: &str) -> String {
    let mut found = None;
    for migration in MIGRATOR.iter() {
        let sql = migration.sql.as_ref();
        let Some(start) = sql.find(&format!("create trigger {name} ")) else {
            continue;
        };
        let body = &sql[start..];
        found = Some(body[..body.find("end;").unwrap_or(body.len())].to_owned());
    }
    found.unwrap_or_else(|| panic!("no trigger {name}"))
}

/// The rows of `step_kind`.
async fn step_kind_table(store: &super::Store) -> BTreeSet<String> {
    let rows: Vec<(String,)> = sqlx::query_as("select name from step_kind")
        .fetch_all(store.pool())
        .await
        .expect("step_kind");
    rows.into_iter().map(|(n,)| n).collect()
}

#[tokio::test]
async fn after_open_the_step_kind_table_is_the_registered_kinds() {
    let (dir, store) = super::tests::temp_store().await;
    assert_eq!(step_kind_table(&store).await, names(StepKindName::ALL));
    // A name registered once and used by a step stays; one nobody uses goes at the next start.
    let new = super::tests::rollout("r1", "gpu02", "svc", 0);
    store
        .create_rollout(&new, &super::tests::steps())
        .await
        .expect("a rollout of known kinds");
    for sql in [
        "insert into step_kind (name) values ('retired'), ('unused')",
        "update step set kind = 'retired' where rollout_id = 'r1' and position = 0",
    ] {
        store
            .write_one(sql, |q| q)
            .await
            .expect("a kind of an older canaryd");
    }
    let path = dir.path().join("canaryd.db");
    store.close().await;
    let store = super::Store::open(&path).await.expect("reopen");
    let mut expected = names(StepKindName::ALL);
    expected.insert("retired".to_owned());
    assert_eq!(step_kind_table(&store).await, expected);
}

#[tokio::test]
async fn a_step_of_an_unknown_kind_is_refused_by_the_database() {
    let (_dir, store) = super::tests::temp_store().await;
    let new = super::tests::rollout("r1", "gpu02", "svc", 0);
    store
        .create_rollout(&new, &super::tests::steps())
        .await
        .expect("a rollout of known kinds");
    let insert = store
        .write_one(
            "insert into step (step_id, rollout_id, position, name, kind, status) \
             values ('st_x', 'r1', 9, 'x', 'reboot', 'pending')",
            |q| q,
        )
        .await;
    let err = insert.expect_err("an unknown kind").to_string();
    assert!(err.contains("step.kind"), "{err}");
    let update = store
        .write_one(
            "update step set kind = 'reboot' where rollout_id = 'r1'",
            |q| q,
        )
        .await;
    assert!(update.is_err(), "an update to an unknown kind");
    let steps = store.steps("r1").await.expect("steps");
    assert_eq!(steps[1].kind, StepKindName::Down);
}
