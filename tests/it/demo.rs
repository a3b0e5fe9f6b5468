//! `canaryd dev --demo`, the real binary end to end: a canary whose analysis passes, a
//! one-click rollback, a canary whose engine answers twice as slowly (its analysis fails)
//! and the automatic rollback that restores r2; each verdict printed as a table; then a
//! release of r2 (the canary) and r1, a progress line per target; exit 0.

use std::process::Command;
use std::time::Duration;

use canaryd::domain::release::ReleaseStatus;
use canaryd::domain::state::{RolloutKind, RolloutStatus, StepStatus};
use canaryd::store::{ReleaseFilter, RolloutFilter, Store};

use crate::helpers::{HOST, R1, R2};

#[tokio::test]
async fn the_demo_fails_a_canary_twice_as_slow_on_its_analysis_and_rolls_it_back() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).expect("tmp");
    let db = dir.path().join("demo.db");
    let out_path = dir.path().join("stdout");
    let err_path = dir.path().join("stderr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_canaryd"))
        .args(["dev", "--demo", "--db"])
        .arg(&db)
        .env("TMPDIR", &tmp)
        .env_remove("CANARYD_TOKEN")
        .env_remove("CANARYD_SERVER")
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .spawn()
        .expect("canaryd dev --demo starts");
    // Bounded: 6 rollouts of seconds each; 240 s leaves room for a loaded CI machine.
    let mut status = None;
    for _ in 0..2400 {
        if let Some(s) = child.try_wait().expect("wait") {
            status = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let out = std::fs::read_to_string(&out_path).unwrap_or_default();
    let err = std::fs::read_to_string(&err_path).unwrap_or_default();
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the demo did not end within 240 s:\n{out}\n{err}");
    };
    assert!(status.success(), "the demo exits 0: {status}\n{out}\n{err}");
    assert!(out.contains("demo finished"), "{out}");
    // Each analysis prints its verdict as a table: the good build passes, the bad one fails.
    assert!(out.contains("    ttft_p95: pass\n"), "{out}");
    assert!(out.contains("    ttft_p95: FAIL\n"), "{out}");
    assert!(out.contains("      ratio to the median"), "{out}");

    let store = Store::open(&db).await.expect("the demo's database");
    let mut all = store
        .list_rollouts(&RolloutFilter {
            limit: 10,
            ..RolloutFilter::default()
        })
        .await
        .expect("rollouts");
    all.sort_by_key(|r| r.created_at);
    let summary: Vec<(RolloutKind, RolloutStatus, &str)> = all
        .iter()
        .map(|r| (r.kind, r.status, r.tag.as_str()))
        .collect();
    assert_eq!(
        summary,
        vec![
            (RolloutKind::Canary, RolloutStatus::Succeeded, "v0.0.452"),
            (RolloutKind::Rollback, RolloutStatus::Succeeded, "v0.0.450"),
            (RolloutKind::Canary, RolloutStatus::Failed, "v0.0.451"),
            (RolloutKind::Rollback, RolloutStatus::Succeeded, "v0.0.450"),
            (RolloutKind::Canary, RolloutStatus::Succeeded, "v0.0.452"),
            (RolloutKind::Canary, RolloutStatus::Succeeded, "v0.0.452"),
        ],
        "{out}"
    );
    // The release: r2 alone first, r1 only after it, each shown as it went.
    let releases = store
        .list_releases(&ReleaseFilter {
            limit: 10,
            ..ReleaseFilter::default()
        })
        .await
        .expect("releases");
    assert_eq!(releases.len(), 1, "{out}");
    let release = &releases[0];
    assert_eq!(release.status, ReleaseStatus::Succeeded, "{out}");
    let order: Vec<(&str, Option<&str>)> = release
        .targets
        .iter()
        .map(|t| (t.service.as_str(), t.rollout_id.as_deref()))
        .collect();
    assert_eq!(
        order,
        [
            (R2, Some(all[4].id.as_str())),
            (R1, Some(all[5].id.as_str()))
        ]
    );
    assert!(
        all[5].created_at >= all[4].finished_at.expect("the canary finished"),
        "r1 started only after its canary r2 succeeded"
    );
    for line in [
        format!("canary {HOST}/{R2}: succeeded ({})", all[4].id),
        format!("{HOST}/{R1}: waiting"),
        format!("{HOST}/{R1}: succeeded ({})", all[5].id),
        format!("{} succeeded", release.id),
    ] {
        assert!(out.contains(&line), "{line:?} in:\n{out}");
    }
    let bad = &all[2];
    assert_eq!(bad.service, R2);
    assert_eq!(
        bad.error_code.as_deref(),
        Some("analysis_failed"),
        "{bad:?}"
    );
    let message = bad.error_message.as_deref().unwrap_or_default();
    assert!(message.contains("ttft_p95"), "{message}");
    assert_eq!(bad.rolled_back_by.as_deref(), Some(all[3].id.as_str()));
    assert_eq!(all[3].rollback_of.as_deref(), Some(bad.id.as_str()));
    let steps = store.steps(&bad.id).await.expect("steps");
    let analysis = steps
        .iter()
        .find(|s| s.kind.as_str() == "analyze")
        .expect("an analyze step");
    assert_eq!(analysis.status, StepStatus::Failed);
    let ttft = analysis.detail["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "ttft_p95"))
        .expect("the ttft check");
    assert_eq!(ttft["verdict"], "fail", "{ttft:#}");
    assert!(ttft["ratio"].as_f64().is_some_and(|r| r > 1.2), "{ttft:#}");
    store.close().await;
}
