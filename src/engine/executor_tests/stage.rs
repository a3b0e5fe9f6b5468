//! `stage`: one `materialize_only` up of the target alone at the rollout's tag, its `staged`
//! event kept; nothing sent to a server that would ignore the flag; a failed or cut stage
//! touches nothing and is not resent.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use super::fakes::cut;
use super::{ended, message, Bench, FILE, PROXY, R1, R2, TAG};
use crate::compose::{StreamOutcome, StreamResult};

const STAGE: &str = "  - {name: stage, kind: stage, timeout: 2s}\n";

#[tokio::test]
async fn a_stage_pulls_the_targets_image_alone_at_the_tag_and_keeps_the_staged_event() {
    let bench = Bench::new(STAGE);
    let ids = [R1, R2, PROXY].map(|s| bench.host.id_of(s));
    let end = bench.run(0, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!((status, code), ("succeeded", None), "{detail}");
    assert_eq!(detail["staged"]["tag"], TAG, "{detail}");
    assert_eq!(detail["staged"]["file"], FILE, "{detail}");
    assert_eq!(detail["endpoint"], "compose/up?materialize_only");
    let sent = bench.host.compose_calls();
    assert_eq!(sent.len(), 1, "one stage and nothing else: {sent:?}");
    assert_eq!(sent[0].endpoint, "compose/up?materialize_only");
    assert_eq!(
        (sent[0].services.as_slice(), sent[0].tag.as_str()),
        ([R2.to_owned()].as_slice(), TAG),
        "scoped to the target alone"
    );
    assert_eq!(
        [R1, R2, PROXY].map(|s| bench.host.id_of(s)),
        ids,
        "every container kept its id, the target's too"
    );
    let attempts = bench.store.attempts.lock().expect("attempts").clone();
    assert_eq!(attempts.len(), 1, "the stage's attempt was written first");
    assert_eq!(attempts[0].endpoint, "compose/up?materialize_only");
    assert!(attempts[0].outcome.is_some(), "and closed");
}

#[tokio::test]
async fn a_stage_sends_nothing_to_a_server_that_would_ignore_materialize_only() {
    let bench = Bench::new(STAGE);
    bench.host.no_dry_run.store(true, Ordering::Relaxed);
    let end = bench.run(0, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!((status, code), ("succeeded", None), "{detail}");
    assert_eq!(detail["skipped"], true, "{detail}");
    let reason = detail["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("materialize_only"), "{detail}");
    assert!(bench.host.compose_calls().is_empty(), "nothing sent");
    assert!(bench.store.attempts.lock().expect("attempts").is_empty());
}

#[tokio::test]
async fn a_failed_or_cut_stage_fails_without_a_resend_and_leaves_the_replica_alone() {
    let failed = StreamResult {
        outcome: StreamOutcome::Failed { exit_code: Some(1) },
        ..cut()
    };
    for (answer, want) in [
        (failed, "compose_failed"),
        (cut(), "compose_outcome_unknown"),
    ] {
        let bench = Bench::new(STAGE);
        let r2 = bench.host.id_of(R2);
        *bench.host.streams.lock().expect("streams") = VecDeque::from([Ok(answer)]);
        let end = bench.run(0, None).await;
        let (status, code, detail) = ended(&end);
        assert_eq!(
            (status, code.as_deref()),
            ("failed", Some(want)),
            "{detail}"
        );
        assert!(
            message(&end).contains("the replica was not touched"),
            "{}",
            message(&end)
        );
        assert!(detail.get("staged").is_none(), "{detail}");
        assert_eq!(bench.host.compose_calls().len(), 1, "sent once, not resent");
        assert_eq!(bench.host.id_of(R2), r2, "the target still runs");
    }
}
