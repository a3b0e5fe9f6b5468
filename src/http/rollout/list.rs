//! `GET /v1/rollouts`: the audit query (docs/reference.md#http-api). Filters combine with AND;
//! newest first; keyset pagination (`limit`, `cursor`); `format=csv` streams every matching row.

use std::collections::HashMap;

use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::api::RolloutOut;
use crate::http::{Actor, ApiError, AppState};
use crate::store::{fmt_time, RolloutFilter, Store};

/// Items per page unless `limit` says otherwise, and the most one page holds.
const DEFAULT_LIMIT: u32 = 50;
const MAX_LIMIT: u32 = 500;
/// Rows read per query while streaming a CSV export.
const CSV_PAGE: u32 = 5000;

/// Query of `GET /v1/rollouts`; every value is parsed here so a bad one is named in the 400.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListRolloutsQuery {
    host: Option<String>,
    service: Option<String>,
    status: Option<String>,
    kind: Option<String>,
    tag: Option<String>,
    actor: Option<String>,
    release: Option<String>,
    since: Option<String>,
    until: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
    format: Option<String>,
}

#[derive(Debug, Serialize)]
struct ListOut {
    items: Vec<RolloutOut>,
    next_cursor: Option<String>,
}

fn invalid(param: &str, value: &str, expected: &str) -> ApiError {
    ApiError::bad_request(
        "invalid_query",
        format!("query parameter {param}={value:?} is not valid: expected {expected}"),
    )
}

fn time_param(param: &str, v: Option<String>) -> Result<Option<DateTime<Utc>>, ApiError> {
    v.map(|s| {
        DateTime::parse_from_rfc3339(&s)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|_| invalid(param, &s, "an RFC 3339 time such as 2026-01-31T00:00:00Z"))
    })
    .transpose()
}

/// Turns the query into a store filter (without limit) and the page size.
fn filter_of(q: ListRolloutsQuery) -> Result<(RolloutFilter, u32, bool), ApiError> {
    let csv = match q.format.as_deref() {
        None | Some("json") => false,
        Some("csv") => true,
        Some(other) => return Err(invalid("format", other, "json or csv")),
    };
    let limit = match q.limit {
        None => DEFAULT_LIMIT,
        Some(s) => s
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_LIMIT).contains(n))
            .ok_or_else(|| invalid("limit", &s, "an integer from 1 to 500"))?,
    };
    let status = q
        .status
        .map(|s| {
            s.parse().map_err(|_| {
                invalid(
                    "status",
                    &s,
                    "pending, running, succeeded, failed or aborted",
                )
            })
        })
        .transpose()?;
    let kind = q
        .kind
        .map(|s| {
            s.parse()
                .map_err(|_| invalid("kind", &s, "canary or rollback"))
        })
        .transpose()?;
    let before = q
        .cursor
        .map(|c| decode_cursor(&c).ok_or_else(|| invalid("cursor", &c, "a next_cursor value")))
        .transpose()?;
    let since = time_param("since", q.since)?;
    let until = time_param("until", q.until)?;
    let nonempty = |param: &str, v: Option<String>| match v {
        Some(s) if s.trim().is_empty() => Err(invalid(param, &s, "a non-empty value")),
        other => Ok(other),
    };
    let filter = RolloutFilter {
        host: nonempty("host", q.host)?,
        service: nonempty("service", q.service)?,
        status,
        kind,
        tag: nonempty("tag", q.tag)?,
        actor: nonempty("actor", q.actor)?,
        release: nonempty("release", q.release)?,
        since,
        until,
        before,
        limit: 0,
    };
    Ok((filter, limit, csv))
}

pub(super) async fn list_rollouts(
    State(state): State<AppState>,
    _actor: Actor,
    query: Result<Query<ListRolloutsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let (mut filter, limit, csv) = filter_of(q)?;
    let store = state.engine.store().clone();
    if csv {
        return Ok(csv_response(store, filter));
    }
    filter.limit = limit + 1;
    let internal = |e: crate::store::StoreError| ApiError::Internal(e.to_string());
    let mut rows = store.list_rollouts(&filter).await.map_err(internal)?;
    let next_cursor = if rows.len() > limit as usize {
        rows.truncate(limit as usize);
        rows.last()
            .map(|r| encode_cursor(&fmt_time(r.created_at), &r.id))
    } else {
        None
    };
    // One query for the steps of the whole page (not one per rollout).
    let ids: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
    let mut steps: HashMap<_, _> = store.steps_of(&ids).await.map_err(internal)?;
    let items = rows
        .into_iter()
        .map(|r| {
            let s = steps.remove(&r.id).unwrap_or_default();
            RolloutOut::new(r, s)
        })
        .collect();
    Ok(Json(ListOut { items, next_cursor }).into_response())
}

/// Streams every row of the filter as CSV, reading the store page by page (keyset), so memory
/// stays flat however many rows match.
fn csv_response(store: Store, mut filter: RolloutFilter) -> Response {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    tokio::spawn(async move {
        if tx
            .send(Ok(Bytes::from_static(RolloutOut::CSV_HEADER.as_bytes())))
            .await
            .is_err()
        {
            return;
        }
        filter.limit = CSV_PAGE;
        loop {
            let page = match store.export_csv_page(&filter).await {
                Ok(page) => page,
                Err(e) => {
                    tracing::error!(error = %e, "CSV export failed; the response is cut short");
                    let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                    return;
                }
            };
            let full = page.rows == CSV_PAGE;
            filter.before = page.last;
            if tx.send(Ok(Bytes::from(page.text))).await.is_err() {
                return; // the client went away
            }
            if !full {
                return;
            }
        }
    });
    let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    (
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"rollouts.csv\"",
            ),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

impl RolloutOut {
    /// The header row of the CSV export (RFC 4180, CRLF line ends).
    pub const CSV_HEADER: &'static str =
        "id,kind,status,host,service,file,tag,runbook,actor,reason,\
        created_at,started_at,finished_at,error_code,error_message,rollback_of,rolled_back_by,\
        downtime_ms\r\n";

    /// Appends this rollout as one CSV record (RFC 4180: fields with a comma, quote, CR or LF
    /// are quoted, quotes doubled).
    pub fn write_csv_record(&self, out: &mut String) {
        let time = |t: Option<DateTime<Utc>>| t.map(fmt_time).unwrap_or_default();
        let (created, started, finished) = (
            fmt_time(self.created_at),
            time(self.started_at),
            time(self.finished_at),
        );
        let downtime = self
            .downtime_ms
            .map(|ms| ms.to_string())
            .unwrap_or_default();
        write_record(
            out,
            &[
                self.id.as_str(),
                &self.kind,
                &self.status,
                &self.host,
                &self.service,
                &self.file,
                &self.tag,
                &self.runbook,
                &self.actor,
                &self.reason,
                &created,
                &started,
                &finished,
                self.error.as_ref().map_or("", |e| e.code.as_str()),
                self.error.as_ref().map_or("", |e| e.message.as_str()),
                self.rollback_of.as_deref().unwrap_or(""),
                self.rolled_back_by.as_deref().unwrap_or(""),
                &downtime,
            ],
        );
    }
}

/// One CSV record in the columns of `CSV_HEADER`, CRLF-terminated.
fn write_record(out: &mut String, fields: &[&str; 18]) {
    for (i, f) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_csv_field(out, f);
    }
    out.push_str("\r\n");
}

/// One RFC 4180 field, a would-be spreadsheet formula (a leading `=`, `+`, `-`, `@`, tab or
/// CR) prefixed with `'` as the store's export does (`store::history`).
fn push_csv_field(out: &mut String, f: &str) {
    let neutralised;
    let f = if f.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        neutralised = format!("'{f}");
        neutralised.as_str()
    } else {
        f
    };
    if f.contains([',', '"', '\r', '\n']) {
        out.push('"');
        out.push_str(&f.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(f);
    }
}

fn encode_cursor(created_at: &str, id: &str) -> String {
    format!("{created_at}~{id}")
}

fn decode_cursor(c: &str) -> Option<(String, String)> {
    let (t, id) = c.split_once('~')?;
    let t = DateTime::parse_from_rfc3339(t).ok()?.with_timezone(&Utc);
    // Normalised, so the comparison with the stored text is exact.
    id.starts_with("ro_").then(|| (fmt_time(t), id.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_with_commas_quotes_and_newlines_are_quoted_and_quotes_doubled() {
        let cases = [
            ("plain", "plain"),
            ("a,b", "\"a,b\""),
            ("say \"hi\"", "\"say \"\"hi\"\"\""),
            ("two\nlines", "\"two\nlines\""),
            ("cr\rhere", "\"cr\rhere\""),
            ("", ""),
        ];
        for (input, want) in cases {
            let mut out = String::new();
            push_csv_field(&mut out, input);
            assert_eq!(out, want, "{input:?}");
        }
    }

    #[test]
    fn the_csv_header_names_the_columns_the_store_exports() {
        let names: Vec<&str> = crate::store::CSV_COLUMNS
            .iter()
            .map(|c| if *c == "rollout_id" { "id" } else { c })
            .collect();
        assert_eq!(RolloutOut::CSV_HEADER, format!("{}\r\n", names.join(",")));
    }

    #[test]
    fn a_cursor_round_trips_and_garbage_is_refused() {
        let c = encode_cursor("2026-11-29T15:08:02.123Z", "ro_01abc");
        assert_eq!(
            decode_cursor(&c),
            Some(("2026-11-29T15:08:02.123Z".to_owned(), "ro_01abc".to_owned()))
        );
        assert_eq!(decode_cursor("nonsense"), None);
        assert_eq!(decode_cursor("2026-11-29T15:08:02Z~xx_1"), None);
    }
}
