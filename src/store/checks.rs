//! Every enum stored in a TEXT column lists exactly the values of the column's CHECK, as the
//! newest migration that (re)creates the table states it.

use std::collections::BTreeSet;

use super::MIGRATOR;
use crate::domain::audit::AuditKind;
use crate::domain::notification::{DeliveryStatus, NotifyEvent};
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
            let marker = format!("check ({column} in (");
            if let Some(at) = body.find(&marker) {
                let list = &body[at + marker.len()..];
                let list = &list[..list.find(')').expect("closing parenthesis")];
                found = Some(
                    list.split(',')
                        .map(|v| v.trim().trim_matches('\'').to_owned())
                        .collect(),
                );
            }
        }
    }
    found.unwrap_or_else(|| panic!("no CHECK on {table}.{column}"))
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
    ];
    for (table, column, values) in cases {
        assert_eq!(check_list(table, column), values, "{table}.{column}");
    }
}
