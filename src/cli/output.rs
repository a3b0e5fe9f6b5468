//! How rollouts are printed: live progress lines and the final timeline.

use chrono::{DateTime, Utc};

use crate::http::{RolloutOut, StepOut};

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

/// A one-line summary of a step's evidence.
pub fn evidence(s: &StepOut) -> String {
    let d = &s.detail;
    if let Some(e) = d.get("error") {
        return format!(
            "{}: {}",
            e["code"].as_str().unwrap_or("error"),
            e["message"].as_str().unwrap_or("")
        );
    }
    match s.kind.as_str() {
        "plan" => {
            let p = &d["plan"];
            format!(
                "plan create={} recreate={} remove={}",
                p["create"], p["recreate"], p["remove"]
            )
        }
        "snapshot" => format!(
            "{} containers recorded",
            d["ps"].as_array().map_or(0, Vec::len)
        ),
        "wait_health" => format!(
            "{} healthy / {} unhealthy samples",
            d["healthy_samples"], d["unhealthy_samples"]
        ),
        "wait_logs" => {
            let seen: Vec<String> = d["seen"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|x| x["pattern"].as_str().map(str::to_owned))
                .collect();
            format!("seen {seen:?}")
        }
        "soak" => format!(
            "{} probes, worst miss streak {}",
            d["probes"], d["worst_streak"]
        ),
        "verify_neighbours" => format!("{} neighbours unchanged", d["checked"]),
        "down" | "up" => format!("{} stream lines", d["lines"]),
        "peers_healthy" => format!("peers healthy: {}", d["peers"]),
        "analyze" => analysis_summary(d),
        _ => String::new(),
    }
}

/// `ttft_p95 pass 0.412 vs peers 0.405 (1.02×, limit 1.2×); took_traffic pass 250`.
fn analysis_summary(d: &serde_json::Value) -> String {
    let number = |v: &serde_json::Value| v.as_f64().map_or("-".to_owned(), |x| format!("{x:.3}"));
    d["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let mut line = format!(
                "{} {} {}",
                c["name"].as_str().unwrap_or("?"),
                c["verdict"].as_str().unwrap_or("?"),
                number(&c["target"]["value"])
            );
            if !c["max_ratio_to_peers"].is_null() {
                line.push_str(&format!(
                    " vs peers {} ({}×, limit {}×)",
                    number(&c["peer_median"]),
                    number(&c["ratio"]),
                    number(&c["max_ratio_to_peers"])
                ));
            }
            line
        })
        .collect::<Vec<_>>()
        .join("; ")
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
    }
    line
}

/// The whole timeline of a rollout.
pub fn timeline(r: &RolloutOut) -> String {
    let now = Utc::now();
    let mut out = format!(
        "{} {} of {} on {} to {} ({}): {}\n  reason: {}  actor: {}\n",
        r.id, r.kind, r.service, r.host, r.tag, r.file, r.status, r.reason, r.actor
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
