//! The audit query: `list_rollouts` with every filter, newest first, keyset pagination; the
//! CSV export; the query plans (checked by a test). The indexes serving each filter are in
//! migration 0005.

use sqlx::Sqlite;

use super::record::{Rollout, RolloutFilter};
use super::rollout::{corrupt, RolloutRow, SELECT_ROLLOUT};
use super::{fmt_time, Store, StoreError};

/// One page of the CSV export (see `Store::export_csv_page`).
#[derive(Debug, Clone, Default)]
pub struct CsvPage {
    /// The page's records, CRLF-terminated, in list order.
    pub text: String,
    pub rows: u32,
    /// Keyset cursor of the page's last row: pass it as `before` for the next page.
    pub last: Option<(String, String)>,
}

/// The columns of the CSV export, in order (the header row names them, `id` for `rollout_id`).
pub const CSV_COLUMNS: [&str; 18] = [
    "rollout_id",
    "kind",
    "status",
    "host",
    "service",
    "file",
    "tag",
    "runbook",
    "actor",
    "reason",
    "created_at",
    "started_at",
    "finished_at",
    "error_code",
    "error_message",
    "rollback_of",
    "rolled_back_by",
    "downtime_ms",
];

/// An SQL expression for one RFC 4180 field: NULL is empty; a value that a spreadsheet would
/// run as a formula (it begins with `=`, `+`, `-`, `@`, a tab or a CR) gets a leading `'`
/// (OWASP's CSV injection advice); a value with a comma, quote, CR or LF is quoted with its
/// quotes doubled.
fn csv_field_sql(column: &str) -> String {
    let text = format!(
        "(case when substr({column}, 1, 1) in ('=', '+', '-', '@', char(9), char(13)) \
         then '''' || {column} else {column} end)"
    );
    format!(
        "case when {column} is null then '' \
         when {text} glob '*[\",' || char(13, 10) || ']*' \
         then '\"' || replace({text}, '\"', '\"\"') || '\"' else {text} end"
    )
}

/// The columns of `SELECT_ROLLOUT` (the fields of `RolloutRow`).
const ROLLOUT_COLUMNS: [&str; 30] = [
    "rollout_id",
    "kind",
    "status",
    "host",
    "file",
    "service",
    "tag",
    "runbook",
    "actor",
    "reason",
    "env_overrides",
    "env_sha256",
    "require_logs",
    "on_failure",
    "created_at",
    "started_at",
    "finished_at",
    "error_code",
    "error_message",
    "rollback_of",
    "expect_commit",
    "expect_file_sha256",
    "rolled_back_by",
    "touched_replica",
    "abort_reason",
    "deploy_as",
    "replaces",
    "downtime_ms",
    "windows",
    "required_free",
];

impl Store {
    /// Lists rollouts newest first (by `created_at`, then id), with keyset pagination: `before`
    /// is exclusive, so paging with the last item's key visits every row exactly once even
    /// while new rollouts are inserted.
    ///
    /// SQLite hands the page over as one JSON array (one value, not one row per rollout: the
    /// per-row hand-off between sqlx's worker thread and the caller dominates otherwise).
    pub async fn list_rollouts(&self, f: &RolloutFilter) -> Result<Vec<Rollout>, StoreError> {
        let object = ROLLOUT_COLUMNS
            .iter()
            .map(|c| format!("'{c}', {c}"))
            .collect::<Vec<_>>()
            .join(", ");
        let select = format!(
            "select coalesce(json_group_array(json_object({object}) \
             order by created_at desc, rollout_id desc), '[]') from ({SELECT_ROLLOUT}"
        );
        let mut qb = list_query(&select, f);
        qb.push(")");
        let (json,): (String,) = qb.build_query_as().fetch_one(self.pool()).await?;
        let rows: Vec<RolloutRow> = serde_json::from_str(&json).map_err(corrupt)?;
        rows.into_iter().map(Rollout::try_from).collect()
    }

    /// One page of `list_rollouts(f)` as CSV records, rendered inside SQLite and returned as
    /// one value (a 100k-row export is a few dozen round trips, not 100k rows to convert).
    pub async fn export_csv_page(&self, f: &RolloutFilter) -> Result<CsvPage, StoreError> {
        let line = CSV_COLUMNS
            .iter()
            .map(|c| csv_field_sql(c))
            .collect::<Vec<_>>()
            .join(" || ',' || ");
        let select = format!(
            "select count(*), coalesce(group_concat(line, '' order by created_at desc, rollout_id desc), ''), \
             min(created_at || '~' || rollout_id) from \
             (select created_at, rollout_id, {line} || char(13, 10) as line from rollout"
        );
        let mut qb = list_query(&select, f);
        qb.push(")");
        let (rows, text, last): (i64, String, Option<String>) =
            qb.build_query_as().fetch_one(self.pool()).await?;
        let last = last.and_then(|k| {
            k.split_once('~')
                .map(|(t, id)| (t.to_owned(), id.to_owned()))
        });
        Ok(CsvPage {
            text,
            rows: u32::try_from(rows).unwrap_or(u32::MAX),
            last,
        })
    }

    /// The query plan SQLite chooses for `list_rollouts(f)` (one line per plan step), so a
    /// test can check every filter is served by an index.
    #[doc(hidden)]
    pub async fn explain_list_rollouts(
        &self,
        f: &RolloutFilter,
    ) -> Result<Vec<String>, StoreError> {
        let mut qb = list_query(&format!("explain query plan {SELECT_ROLLOUT}"), f);
        let rows: Vec<(i64, i64, i64, String)> = qb.build_query_as().fetch_all(self.pool()).await?;
        Ok(rows.into_iter().map(|r| r.3).collect())
    }
}

/// `select ... where <filters> order by created_at desc, rollout_id desc limit n`.
fn list_query(select: &str, f: &RolloutFilter) -> sqlx::QueryBuilder<'static, Sqlite> {
    let mut qb = sqlx::QueryBuilder::<Sqlite>::new(select);
    qb.push(" where 1 = 1");
    let eq = [
        ("host", f.host.clone()),
        ("service", f.service.clone()),
        ("status", f.status.map(|s| s.as_str().to_owned())),
        ("kind", f.kind.map(|k| k.as_str().to_owned())),
        ("tag", f.tag.clone()),
        ("actor", f.actor.clone()),
    ];
    for (column, value) in eq {
        if let Some(v) = value {
            qb.push(format!(" and {column} = ")).push_bind(v);
        }
    }
    if let Some(release) = &f.release {
        qb.push(" and rollout_id in (select rollout_id from release_target where release_id = ")
            .push_bind(release.clone())
            .push(")");
    }
    if let Some(since) = f.since {
        qb.push(" and created_at >= ").push_bind(fmt_time(since));
    }
    if let Some(until) = f.until {
        qb.push(" and created_at < ").push_bind(fmt_time(until));
    }
    if let Some((created_at, id)) = &f.before {
        // Spelled so that the index range stops at the cursor: `created_at <= t` bounds
        // the scan, the `or` breaks ties within the same millisecond by id.
        qb.push(" and created_at <= ")
            .push_bind(created_at.clone())
            .push(" and (created_at < ")
            .push_bind(created_at.clone())
            .push(" or rollout_id < ")
            .push_bind(id.clone())
            .push(")");
    }
    qb.push(" order by created_at desc, rollout_id desc limit ")
        .push_bind(i64::from(f.limit.max(1)));
    qb
}
