//! `plan`, `down`, `up` and `verify_neighbours`: what each sends to the host (always scoped to
//! the target), the plan gate's verdicts, an unknown outcome never resent, and a neighbour
//! that changed.

use std::collections::VecDeque;

use super::fakes::{cut, planned};
use super::{ended, message, Bench, PROXY, R1, R2, TAG};
use crate::compose::{ComposeError, StreamOutcome, StreamResult};
use crate::domain::plan_gate::DryRunPlan;
use serde_json::json;

const PLAN: &str = "  - {name: plan, kind: plan}\n";
/// A runbook keeps a down behind a peer check and a plan; the tests run its `down` (2) and its
/// `up` (3).
const DOWN_UP: &str = "  - {name: peers, kind: peers_healthy}\n  - {name: plan, kind: plan}\n  - {name: down, kind: down, timeout: 2s}\n  - {name: up, kind: up, timeout: 2s}\n";

fn plan_of(recreate: &[&str], remove: &[&str]) -> DryRunPlan {
    DryRunPlan {
        recreate: recreate.iter().map(|s| s.to_string()).collect(),
        remove: remove.iter().map(|s| s.to_string()).collect(),
        ..DryRunPlan::default()
    }
}

#[tokio::test]
async fn the_plan_gate_passes_a_dry_run_of_the_target_alone_and_fails_any_other() {
    // (what the dry run plans, the step's status, its code, a word of its message)
    let table: [(DryRunPlan, &str, Option<&str>, &str); 4] = [
        (plan_of(&[R2], &[]), "succeeded", None, ""),
        (
            plan_of(&[R2, R1], &[]),
            "failed",
            Some("plan_gate_failed"),
            R1,
        ),
        (
            plan_of(&[R2], &[PROXY]),
            "failed",
            Some("plan_gate_failed"),
            PROXY,
        ),
        (
            plan_of(&[], &[]),
            "failed",
            Some("plan_gate_failed"),
            "target",
        ),
    ];
    for (plan, want_status, want_code, word) in table {
        let bench = Bench::new(PLAN);
        *bench.host.plans.lock().expect("plans") = VecDeque::from([Ok(planned(plan.clone()))]);
        let end = bench.run(0, None).await;
        let (status, code, detail) = ended(&end);
        assert_eq!(
            (status, code.as_deref()),
            (want_status, want_code),
            "{plan:?}: {detail}"
        );
        assert!(message(&end).contains(word), "{plan:?}: {}", message(&end));
        assert!(detail["plan"].is_object(), "the plan is kept: {detail}");
        let sent = bench.host.compose_calls();
        assert_eq!(sent.len(), 1, "one dry run and nothing else: {sent:?}");
        assert_eq!(sent[0].endpoint, "compose/up?dry_run");
        assert_eq!(
            (sent[0].services.as_slice(), sent[0].tag.as_str()),
            ([R2.to_owned()].as_slice(), TAG)
        );
        let attempts = bench.store.attempts.lock().expect("attempts").clone();
        assert_eq!(attempts.len(), 1, "the dry run's attempt was written first");
        assert!(attempts[0].outcome.is_some(), "and closed");
    }
}

#[tokio::test]
async fn a_plan_sends_nothing_to_a_server_that_would_ignore_dry_run() {
    let bench = Bench::new(PLAN);
    bench
        .host
        .no_dry_run
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let end = bench.run(0, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!(status, "failed", "{detail}");
    assert_eq!(
        code.as_deref(),
        Some("compose_manager_unsupported"),
        "{detail}"
    );
    assert!(bench.host.compose_calls().is_empty());
}

#[tokio::test]
async fn a_failed_dry_run_and_one_without_a_plan_fail_the_plan() {
    let bench = Bench::new(PLAN);
    let mut failed = planned(plan_of(&[R2], &[]));
    failed.stream.outcome = StreamOutcome::Failed { exit_code: Some(1) };
    let mut no_plan = planned(plan_of(&[R2], &[]));
    no_plan.plan = None;
    *bench.host.plans.lock().expect("plans") = VecDeque::from([Ok(failed), Ok(no_plan)]);
    let end = bench.run(0, None).await;
    let (_, code, detail) = ended(&end);
    assert_eq!(code.as_deref(), Some("dry_run_failed"), "{detail}");
    let end = bench.run(0, None).await;
    let (_, code, detail) = ended(&end);
    assert_eq!(code.as_deref(), Some("dry_run_no_plan"), "{detail}");
}

#[tokio::test]
async fn a_down_and_an_up_are_scoped_to_the_target_and_replace_its_container_alone() {
    let bench = Bench::new(DOWN_UP);
    let (r1, proxy) = (bench.host.id_of(R1), bench.host.id_of(PROXY));
    let end = bench.run(2, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!((status, code), ("succeeded", None), "{detail}");
    assert_eq!(bench.host.id_of(R2), None, "r2 is down");
    let end = bench.run(3, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!((status, code), ("succeeded", None), "{detail}");
    assert!(
        detail.to_string().contains("done"),
        "the stream's tail is kept: {detail}"
    );
    assert!(
        bench.host.id_of(R2).is_some_and(|id| id != "c2"),
        "r2 runs a new container"
    );
    assert_eq!((bench.host.id_of(R1), bench.host.id_of(PROXY)), (r1, proxy));
    let sent: Vec<(&str, Vec<String>)> = bench
        .host
        .compose_calls()
        .iter()
        .map(|s| (s.endpoint, s.services.clone()))
        .collect();
    assert_eq!(
        sent,
        [
            ("compose/down", vec![R2.to_owned()]),
            ("compose/up", vec![R2.to_owned()])
        ]
    );
}

#[tokio::test]
async fn an_up_whose_stream_ends_failed_fails_with_its_exit_code_and_tail() {
    let bench = Bench::new(DOWN_UP);
    let failed = StreamResult {
        outcome: StreamOutcome::Failed {
            exit_code: Some(17),
        },
        transcript_tail: vec!["stderr: pull access denied".to_owned()],
        n_lines: 1,
        pulled_at: None,
    };
    *bench.host.streams.lock().expect("streams") = VecDeque::from([Ok(failed)]);
    let end = bench.run(3, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!(status, "failed", "{detail}");
    assert_eq!(code.as_deref(), Some("compose_failed"), "{detail}");
    assert!(
        detail.to_string().contains("pull access denied"),
        "{detail}"
    );
    assert_eq!(
        bench.host.compose_calls().len(),
        1,
        "a failed up is not resent"
    );
}

#[tokio::test]
async fn a_down_whose_outcome_is_unknown_is_never_resent() {
    for answer in [
        Ok(cut()),
        Err(ComposeError::Timeout {
            endpoint: "compose/down".to_owned(),
        }),
    ] {
        let bench = Bench::new(DOWN_UP);
        *bench.host.streams.lock().expect("streams") = VecDeque::from([answer.clone()]);
        let end = bench.run(2, None).await;
        let (status, code, detail) = ended(&end);
        assert_eq!(status, "failed", "{answer:?}: {detail}");
        assert_eq!(
            code.as_deref(),
            Some("compose_outcome_unknown"),
            "{answer:?}: {detail}"
        );
        assert!(message(&end).contains("not resent"), "{}", message(&end));
        let downs = bench.host.compose_calls();
        assert_eq!(
            downs.len(),
            1,
            "{answer:?}: one down, never a blind resend: {downs:?}"
        );
        // The evidence as the step and the attempt row keep it, key for key (the API shows it).
        let mut kept = detail.clone();
        assert!(kept["waited_ms"].is_i64(), "{detail}");
        kept["waited_ms"] = json!(0);
        let reads = kept["settle"]["ps_reads"].as_u64().unwrap_or_default();
        assert!(reads >= 2, "two docker ps reads settle the host: {detail}");
        kept["settle"]["ps_reads"] = json!(2);
        // The cut down left the container running; no snapshot step ran before it.
        assert_eq!(kept["target_container"]["id"], "c2", "{detail}");
        kept["target_container"] = json!("c2");
        let call = match &answer {
            Ok(_) => json!({"endpoint": "compose/down", "lines": 0,
                            "tail": ["canaryd: the stream ended without `done`"]}),
            Err(e) => json!({"error": e.to_string()}),
        };
        assert_eq!(
            kept,
            json!({"call": call, "host_idle": true, "target_settled": true,
                   "settle": {"settled": true, "host_idle": true, "ps_reads": 2, "target_changes": 0},
                   "waited_ms": 0, "target_container": "c2", "target_before": null,
                   "target_changed_since_snapshot": true}),
            "{answer:?}"
        );
        let attempts = bench.store.attempts.lock().expect("attempts");
        assert_eq!(attempts[0].detail, call, "the attempt row keeps the call");
    }
}

#[tokio::test]
async fn verify_neighbours_passes_when_only_the_target_changed_and_fails_on_any_other() {
    let steps = "  - {name: snap, kind: snapshot}\n  - {name: peers, kind: peers_healthy}\n  - {name: plan, kind: plan}\n  - {name: down, kind: down, timeout: 2s}\n  - {name: up, kind: up, timeout: 2s}\n  - {name: verify, kind: verify_neighbours}\n";
    let bench = Bench::new(steps);
    let end = bench.run_through(5).await;
    let (status, code, detail) = ended(&end);
    assert_eq!((status, code), ("succeeded", None), "{detail}");
    assert_eq!(detail["checked"], 2, "r1 and the proxy: {detail}");

    let bench = Bench::new(steps);
    let mut run = bench.step_run();
    let end = bench.run_in(&mut run, 0, None).await;
    assert_eq!(ended(&end).0, "succeeded");
    // Someone recreated the proxy while the canary ran.
    for c in bench.host.ps.lock().expect("ps").iter_mut() {
        if c.names == PROXY {
            c.id = "c9".to_owned();
        }
    }
    let end = bench.run_in(&mut run, 5, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!(status, "failed", "{detail}");
    assert_eq!(code.as_deref(), Some("neighbour_changed"), "{detail}");
    assert_eq!(detail["changed"][0]["container"], PROXY, "{detail}");
    assert_eq!(detail["changed"][0]["after"]["id"], "c9", "{detail}");
}
