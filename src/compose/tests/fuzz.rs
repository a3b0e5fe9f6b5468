//! Property tests (proptest) of what compose-manager sends back: the NDJSON line reader, the
//! stream judge and the dry-run plan normaliser. No input may panic them, and a stream is a
//! success only if its last event is `done` with `success: true`. See docs/fuzzing.md.

use proptest::prelude::*;
use serde_json::{json, Value};

use crate::compose::lines::LineSplitter;
use crate::compose::plan::{normalise_plan, raw_plan_from_event, RawPlan};
use crate::compose::stream::{StreamOutcome, Transcript};
use crate::domain::fuzz::config;
use crate::domain::plan_gate;

/// NDJSON lines as compose-manager sends them, and as a broken one might.
fn line() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        "\\PC{0,40}".prop_map(|d| json!({"event": "stderr", "data": d})
            .to_string()
            .into_bytes()),
        "\\PC{0,40}".prop_map(|d| json!({"event": "stdout", "data": d})
            .to_string()
            .into_bytes()),
        (any::<bool>(), proptest::option::of(any::<i64>())).prop_map(|(ok, code)| {
            let mut v = json!({"event": "done", "success": ok});
            if let Some(code) = code {
                v["exit_code"] = json!(code);
            }
            v.to_string().into_bytes()
        }),
        plan_value().prop_map(|p| json!({"event": "plan", "plan": p, "success": true})
            .to_string()
            .into_bytes()),
        Just(b"{\"event\":\"staged\",\"images\":[]}".to_vec()),
        Just(b"{\"event\":\"error\",\"data\":\"x\"}".to_vec()),
        Just(b"{\"event\":".to_vec()),
        Just(b"".to_vec()),
        Just(b"   ".to_vec()),
        Just(vec![0xff, 0xfe, b'{']),
        proptest::collection::vec(any::<u8>(), 0..60),
    ]
}

fn plan_entry() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z][a-z0-9_.-]{0,20}".prop_map(|n| format!("Container {n}")),
        "[a-z][a-z0-9_.-]{0,12}".prop_map(|n| format!("Container work-{n}-1")),
        "[a-z][a-z0-9_]{0,12}".prop_map(|n| format!("Network work_{n}")),
        "[a-z][a-z0-9_]{0,12}".prop_map(|n| format!("Volume {n}")),
        "[a-z][a-z0-9_-]{0,20}",
        "\\PC{0,30}",
    ]
}

fn plan_value() -> impl Strategy<Value = Value> {
    let list = || proptest::collection::vec(plan_entry(), 0..5);
    (list(), list(), list(), list(), any::<bool>())
        .prop_map(|(create, recreate, remove, unchanged, extra)| {
            let mut v = json!({"create": create, "recreate": recreate, "remove": remove, "unchanged": unchanged});
            if extra {
                v["remove"] = json!(null);
                v["other"] = json!(1);
            }
            v
        })
}

/// The last line that is not blank, parsed.
fn last_event(lines: &[Vec<u8>]) -> Option<Value> {
    let last = lines
        .iter()
        .rev()
        .find(|l| !String::from_utf8_lossy(l).trim().is_empty())?;
    serde_json::from_slice(last).ok()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_stream_is_judged_without_panicking_and_success_needs_a_final_done_true(
        lines in proptest::collection::vec(line(), 0..12)
    ) {
        let mut t = Transcript::new("/compose/up");
        for l in &lines {
            t.feed(l);
        }
        if let Ok(streamed) = t.finish(None) {
            let last = last_event(&lines);
            let done_true = last.as_ref().is_some_and(|v| v["event"] == "done" && v["success"] == true);
            prop_assert_eq!(streamed.result.outcome == StreamOutcome::Succeeded, done_true);
            prop_assert!(streamed.result.transcript_tail.len() <= crate::compose::TRANSCRIPT_TAIL_LINES + 1);
            if last.as_ref().is_none_or(|v| v["event"] != "done") {
                prop_assert_eq!(streamed.result.outcome, StreamOutcome::Unknown);
            }
        }
    }

    #[test]
    fn a_cut_stream_is_never_a_success(lines in proptest::collection::vec(line(), 0..12)) {
        let mut t = Transcript::new("/compose/down");
        for l in &lines {
            t.feed(l);
        }
        if let Ok(streamed) = t.finish(Some("connection lost".into())) {
            // Only a stream that already ended in `done` can be judged; a cut one never is.
            let done = last_event(&lines).is_some_and(|v| v["event"] == "done");
            prop_assert!(done || streamed.result.outcome == StreamOutcome::Unknown);
        }
    }

    #[test]
    fn lines_come_out_the_same_whatever_the_chunking(
        bytes in proptest::collection::vec(prop_oneof![Just(b'\n'), Just(b'\r'), any::<u8>()], 0..300),
        cuts in proptest::collection::vec(0usize..300, 0..10)
    ) {
        let whole = {
            let mut s = LineSplitter::default();
            let mut out = s.push(&bytes);
            out.extend(s.finish());
            out
        };
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
        cuts.sort_unstable();
        let mut s = LineSplitter::default();
        let mut chunked = Vec::new();
        let mut from = 0;
        for c in cuts.into_iter().chain([bytes.len()]) {
            chunked.extend(s.push(&bytes[from..c]));
            from = c;
        }
        chunked.extend(s.finish());
        prop_assert_eq!(&whole, &chunked);
        for l in &whole {
            prop_assert!(!l.contains(&b'\n'));
        }
    }

    #[test]
    fn a_normalised_plan_has_each_name_once_and_no_container_prefix_on_well_formed_names(
        plan in plan_value(),
        target in prop_oneof![Just("model-sg-glm53-w4afp8-tp4-r2".to_owned()), "[a-z]{1,8}"]
    ) {
        let event = json!({"event": "plan", "plan": plan});
        let Value::Object(map) = event else { return Ok(()) };
        let Ok((_, raw)) = raw_plan_from_event(&map) else { return Ok(()) };
        let norm = normalise_plan(&raw, "work");
        let services: Vec<&String> = norm.create.iter().chain(&norm.recreate).chain(&norm.remove).chain(&norm.unchanged).collect();
        let unique: std::collections::BTreeSet<&String> = services.iter().copied().collect();
        prop_assert_eq!(unique.len(), services.len(), "a service sits in one bucket");
        for list in [&norm.create, &norm.recreate, &norm.remove, &norm.unchanged, &norm.resources] {
            prop_assert!(list.windows(2).all(|w| w[0] < w[1]), "sorted and unique");
        }
        let well_formed = |e: &str| {
            e.strip_prefix("Container ").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b)))
        };
        let all_well_formed = [&raw.create, &raw.recreate, &raw.remove, &raw.unchanged]
            .iter()
            .all(|l| l.iter().all(|e| well_formed(e) || !e.starts_with("Container")));
        if all_well_formed {
            for s in &services {
                prop_assert!(!s.contains("Container "), "{s}");
            }
        }
        // The gate passes only a plan that changes exactly the target and removes nothing.
        if plan_gate::check(&norm, &target, &[]).is_ok() {
            let changed: Vec<&String> = norm.create.iter().chain(&norm.recreate).collect();
            prop_assert_eq!(changed, vec![&target]);
            prop_assert!(norm.remove.is_empty());
        }
    }
}

#[test]
fn an_empty_raw_plan_normalises_to_an_empty_plan() {
    let norm = normalise_plan(&RawPlan::default(), "work");
    assert_eq!(norm, plan_gate::DryRunPlan::default());
}
