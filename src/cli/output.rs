//! How rollouts are printed: live progress lines and the final timeline.

use chrono::{DateTime, Utc};

use crate::api::{RolloutOut, StepOut};
use crate::domain::error_code::StepFailure;
use crate::domain::runbook::step::{evidence as evidence_of, Analyze};
use crate::domain::runbook::StepKindName;

/// `1m05s`, `850ms`.
pub fn human_duration(d: chrono::Duration) -> String {
    let ms = d.num_milliseconds().max(0);
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else {
        format!("{}m{:02}s", ms / 60_000, (ms % 60_000) / 1000)
    }
}

fn step_duration(s: &StepOut, now: DateTime<Utc>) -> String {
    match (s.started_at, s.finished_at) {
        (Some(a), Some(b)) => human_duration(b - a),
        (Some(a), None) => format!("{} so far", human_duration(now - a)),
        _ => String::new(),
    }
}

/// A one-line summary of a step's evidence; empty for a step that never ran (`skipped`,
/// `pending`) or whose evidence is missing: never `null`.
pub fn evidence(s: &StepOut) -> String {
    if matches!(s.status.as_str(), "skipped" | "pending") {
        return String::new();
    }
    let d = &s.detail;
    if let Some(e) = StepFailure::of(d) {
        return format!(
            "{}: {}",
            e.code.as_deref().unwrap_or("error"),
            e.message.as_deref().unwrap_or("")
        );
    }
    // The kind's own rendering (`domain::runbook::step`); a kind this build does not know
    // (a newer daemon) shows nothing rather than failing.
    s.kind
        .parse::<StepKindName>()
        .ok()
        .and_then(|kind| kind.summary(d))
        .unwrap_or_default()
}

/// The verdict of an `analyze` step, one small table per check; `None` for another kind or
/// before the step judged.
fn verdict_table(s: &StepOut) -> Option<String> {
    let kind = s.kind.parse::<StepKindName>().ok()?;
    (kind == StepKindName::Analyze)
        .then(|| evidence_of::<Analyze>(&s.detail))??
        .verdict_table()
}

/// A progress line for a step.
pub fn step_line(rollout: &RolloutOut, s: &StepOut, now: DateTime<Utc>) -> String {
    let mut line = format!(
        "{}  {:<18} {:<10} {}",
        rollout.id,
        s.name,
        s.status,
        step_duration(s, now)
    );
    if s.status == "running" {
        if let Some(deadline) = s.deadline_at {
            line.push_str(&format!(
                " (deadline in {})",
                human_duration(deadline - now)
            ));
        }
    } else {
        let ev = evidence(s);
        if !ev.is_empty() {
            line.push_str(&format!("  {ev}"));
        }
        line.extend(verdict_table(s).map(|t| format!("\n{t}")));
    }
    line
}

/// The whole timeline of a rollout.
pub fn timeline(r: &RolloutOut) -> String {
    let now = Utc::now();
    let mut out = format!(
        "{} {} of {} on {} to {} ({}): {}\n  reason: {}  actor: {}\n",
        r.id,
        r.kind,
        r.service,
        r.host,
        r.tag,
        r.file,
        r.shown_status(),
        r.reason,
        r.actor
    );
    if let Some(of) = &r.rollback_of {
        out.push_str(&format!("  rollback of {of}\n"));
    }
    if let Some(by) = &r.rolled_back_by {
        out.push_str(&format!("  rolled back by {by}\n"));
    }
    if let Some(e) = &r.error {
        out.push_str(&format!("  error {}: {}\n", e.code, e.message));
    }
    for s in &r.steps {
        let at = s
            .started_at
            .map(|t| t.format("%H:%M:%S%.3f").to_string())
            .unwrap_or_else(|| "-".repeat(12));
        out.push_str(&format!(
            "  {at}  {:<18} {:<17} {:<10} {:>10}  {}\n",
            s.name,
            s.kind,
            s.status,
            step_duration(s, now),
            evidence(s)
        ));
        out.extend(verdict_table(s).map(|t| format!("{t}\n")));
    }
    out
}

/// The audit trail: who did what when, one line per event (from `GET /v1/rollouts/{id}/audit`).
pub fn audit_trail(events: &[serde_json::Value]) -> String {
    let mut out = String::from("  audit trail:\n");
    for e in events {
        let at = e["occurred_at"]
            .as_str()
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| {
                t.with_timezone(&Utc)
                    .format("%Y-%m-%d %H:%M:%S%.3f")
                    .to_string()
            })
            .unwrap_or_default();
        let mut line = format!(
            "  {at}  #{:<6} {:<12} {:<20}",
            e["seq"],
            e["actor"].as_str().unwrap_or("?"),
            e["kind"].as_str().unwrap_or("?")
        );
        if let Some(step) = e["step"].as_str() {
            line.push_str(&format!(" step={step}"));
        }
        if let (Some(from), Some(to)) = (e["from_state"].as_str(), e["to_state"].as_str()) {
            line.push_str(&format!(" {from}->{to}"));
        } else if let Some(to) = e["to_state"].as_str() {
            line.push_str(&format!(" ->{to}"));
        }
        let d = &e["detail"];
        if let Some(reason) = d["reason"].as_str() {
            line.push_str(&format!(" reason={reason:?}"));
        }
        if let Some(by) = d["rolled_back_by"].as_str() {
            line.push_str(&format!(" rolled_back_by={by}"));
        }
        if let Some(code) = d["error"]["code"].as_str() {
            line.push_str(&format!(" error={code}"));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn step(kind: &str, status: &str, detail: serde_json::Value) -> StepOut {
        StepOut {
            name: kind.to_owned(),
            kind: kind.to_owned(),
            status: status.to_owned(),
            attempts: 0,
            started_at: None,
            finished_at: None,
            deadline_at: None,
            detail,
            summary: None,
            calls: Vec::new(),
        }
    }

    #[test]
    fn a_step_without_evidence_prints_nothing_rather_than_null() {
        for kind in crate::domain::runbook::StepKind::NAMES.iter().copied() {
            for status in ["skipped", "pending", "aborted", "succeeded"] {
                let got = evidence(&step(kind, status, json!({})));
                assert!(!got.contains("null"), "{kind} {status}: {got}");
                assert_eq!(got, "", "{kind} {status}");
            }
        }
    }

    #[test]
    fn evidence_reads_as_text() {
        let plan = json!({"plan": {"create": [], "recreate": ["r2"], "remove": []}});
        assert_eq!(
            evidence(&step("plan", "succeeded", plan)),
            "plan create=[] recreate=[r2] remove=[]"
        );
        assert_eq!(
            evidence(&step("up", "succeeded", json!({"lines": 12}))),
            "12 stream lines"
        );
    }

    #[test]
    fn a_smoke_step_reads_as_one_line_of_evidence() {
        let detail = serde_json::json!({
            "model": "z-ai/glm-5.3-flash", "identical_outputs": 2, "latency_ms_max": 120,
            "output": "Ready. Served by img.",
            "calls": [{"usage": {"completion_tokens": 4}}, {"usage": {"completion_tokens": 4}}],
        });
        assert_eq!(
            evidence(&step("smoke", "succeeded", detail)),
            "model z-ai/glm-5.3-flash ok, 2 identical outputs, up to 120 ms, 8 tokens: \"Ready. Served by img.\""
        );
        let failed = serde_json::json!({"error": {"code": "smoke_mismatch", "message": "the output does not match [\"re:^OK$\"]"}});
        assert!(
            evidence(&step("smoke", "failed", failed)).starts_with("smoke_mismatch: the output")
        );
    }
}
