//! Renamed replicas (docs/reference.md#renamed-replicas): the simulated host serving a compose
//! file per tag (the real long-context file, r2 renamed between tags), a canary that renames
//! r2, its one-click rollback, the shipped `long-context-rollout` runbook end to end, a failing
//! perception check, and the refusals of a bad `replaces`.

use std::collections::BTreeMap;
use std::time::Duration;

use canaryd::compose::{ClientOptions, ComposeClient, ComposeRequest, Services};
use canaryd::sim::{
    SimConfig, SimHost, EXAMPLE_FILE, LONG_CONTEXT_NEW_R2 as NEW, LONG_CONTEXT_OLD_R2 as OLD,
    LONG_CONTEXT_R1 as R1,
};

const DOWNLOADER: &str = "model-downloader";

fn long_context() -> SimConfig {
    let mut cfg = SimConfig::long_context();
    cfg.cold_start = Duration::from_millis(300);
    cfg.stream_line_delay = Duration::from_millis(1);
    cfg
}

fn request(env: &BTreeMap<String, String>, tag: &str, service: &str) -> ComposeRequest {
    ComposeRequest {
        tag: tag.into(),
        file: EXAMPLE_FILE.into(),
        services: Services::one(service),
        env: env.clone(),
        force_recreate: None,
    }
}

fn running(sim: &SimHost) -> Vec<String> {
    sim.containers()
        .into_iter()
        .filter(|c| c.state == "running")
        .map(|c| c.service)
        .collect()
}

#[tokio::test]
async fn the_long_context_host_serves_each_tag_its_own_file_so_a_tag_renames_r2() {
    let cfg = long_context();
    let env = cfg.initial_env.clone();
    let sim = SimHost::start(cfg)
        .await
        .expect("the simulated host starts");
    let client =
        ComposeClient::new(&sim.url(), sim.token(), ClientOptions::default()).expect("client");
    // v0.0.451 deployed: every default service of the old file, none of the profiles.
    let up = running(&sim);
    for service in [
        R1,
        OLD,
        "model-sg-glm53-w4afp8-tp2-r2a",
        "model-sg-glm53-w4afp8-tp2-r2b",
        "proxy-glm53",
        "nginx",
        "model-proxy-registrar",
        "dcgm-glm53",
        "otelcol-contrib",
    ] {
        assert!(up.contains(&service.to_string()), "{service} runs: {up:?}");
    }
    for absent in [
        NEW,
        "glm53-perception-check",
        "glm53-soak-relay",
        "hf-cleanup",
    ] {
        assert!(
            sim.containers().iter().all(|c| c.service != absent),
            "{absent}"
        );
    }
    let old_health = sim.health_url(OLD).expect("old r2 has a port");
    assert_eq!(
        Some(old_health.clone()),
        sim.health_url(NEW),
        "a renamed replica keeps its host port"
    );
    assert_eq!(
        reqwest::get(&old_health).await.expect("health").status(),
        200
    );

    // The new tag's file does not define the old name: compose sees it as an orphan.
    let dry = client
        .dry_run(&request(&env, "v0.0.452", NEW))
        .await
        .expect("dry run");
    let plan = dry.plan.expect("plan");
    assert_eq!(plan.create, [DOWNLOADER, NEW], "{plan:?}");
    assert_eq!(plan.remove, [OLD], "{plan:?}");
    assert!(plan.recreate.is_empty(), "{plan:?}");
    // That dry run wrote the new file to disk: a down of the old name now fails…
    let down = client
        .down(&request(&env, "v0.0.451", OLD))
        .await
        .expect("down");
    assert!(!down.succeeded(), "no such service in the file on disk");
    assert!(
        up.iter().all(|s| running(&sim).contains(s)),
        "nothing was stopped"
    );
    // …until a dry run at the old tag puts the old file back (read-only: it plans nothing).
    let dry = client
        .dry_run(&request(&env, "v0.0.451", OLD))
        .await
        .expect("dry run");
    let plan = dry.plan.expect("plan");
    assert!(
        plan.recreate.is_empty() && plan.remove.is_empty(),
        "{plan:?}"
    );
    assert_eq!(plan.unchanged, [OLD], "{plan:?}");
    let down = client
        .down(&request(&env, "v0.0.451", OLD))
        .await
        .expect("down");
    assert!(down.succeeded(), "{down:?}");
    assert!(sim.containers().iter().all(|c| c.service != OLD));
    let up = client
        .up(&request(&env, "v0.0.452", NEW))
        .await
        .expect("up");
    assert!(up.succeeded(), "{up:?}");
    let new = sim
        .containers()
        .into_iter()
        .find(|c| c.service == NEW)
        .expect("new r2");
    assert_eq!(new.tag, "v0.0.452");
    sim.shutdown().await;
}
