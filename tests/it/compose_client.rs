//! The compose-manager client against the simulated host: every call, and the faults the
//! engine has to tell apart.

use std::collections::BTreeMap;
use std::time::Duration;

use canaryd::compose::{
    ClientOptions, ComposeClient, ComposeError, ComposeRequest, LogsRequest, StreamOutcome,
};
use canaryd_sim::{SimConfig, SimHost, SimOp, EXAMPLE_FILE};
use serde_json::json;

const R1: &str = "model-sg-glm53-w4afp8-tp4-r1";
const R2: &str = "model-sg-glm53-w4afp8-tp4-r2";

struct Fixture {
    sim: SimHost,
    client: ComposeClient,
    env: BTreeMap<String, String>,
}

async fn fixture() -> Fixture {
    let cfg = SimConfig {
        cold_start: Duration::from_millis(50),
        stream_line_delay: Duration::from_millis(1),
        ..SimConfig::example()
    };
    let env = cfg.initial_env.clone();
    let sim = SimHost::start(cfg).await.expect("sim starts");
    let opts = ClientOptions {
        request_timeout: Duration::from_secs(5),
        stream_idle_timeout: Duration::from_secs(5),
        ..ClientOptions::default()
    };
    let client = ComposeClient::new(&sim.url(), sim.token(), opts).expect("client");
    Fixture { sim, client, env }
}

impl Fixture {
    fn up(&self, tag: &str, service: &str) -> ComposeRequest {
        ComposeRequest {
            tag: tag.parse().expect("a valid name"),
            file: EXAMPLE_FILE.parse().expect("a valid name"),
            services: canaryd::compose::Services::one(service.parse().expect("a valid name")),
            env: self.env.clone(),
            force_recreate: None,
        }
    }

    fn down(&self, tag: &str, service: &str) -> ComposeRequest {
        ComposeRequest {
            tag: tag.parse().expect("a valid name"),
            file: EXAMPLE_FILE.parse().expect("a valid name"),
            services: canaryd::compose::Services::one(service.parse().expect("a valid name")),
            env: self.env.clone(),
            force_recreate: None,
        }
    }

    fn image_of(&self, service: &str) -> Option<String> {
        self.sim
            .containers()
            .into_iter()
            .find(|c| c.service == service)
            .map(|c| c.image)
    }
}

#[tokio::test]
async fn version_ps_and_status_describe_the_initial_deployment() {
    let f = fixture().await;
    let version = f.client.version().await.expect("version");
    let work = version.projects.get("work").expect("work project");
    let current = work.current.as_ref().expect("deployed at start");
    assert_eq!(current.tag.as_deref(), Some("v0.0.450"));
    assert_eq!(current.file.as_deref(), Some(EXAMPLE_FILE));

    let ps = f.client.ps().await.expect("ps");
    for name in [R1, R2] {
        let entry = ps.iter().find(|e| e.names == name).expect("replica listed");
        assert_eq!(entry.state, "running");
        assert!(!entry.id.is_empty() && !entry.image.is_empty());
    }
    assert!(f.client.status().await.expect("status").in_flight.is_none());
}

#[tokio::test]
async fn the_probe_tells_the_newest_host_from_a_legacy_one() {
    let f = fixture().await;
    assert_eq!(f.client.supports_dry_run().await, Ok(true));
    f.sim.faults().set_legacy(true);
    assert_eq!(f.client.supports_dry_run().await, Ok(false));
}

#[tokio::test]
async fn a_dry_run_plans_only_the_target_and_changes_nothing() {
    let f = fixture().await;
    let before = f.sim.containers();
    let result = f
        .client
        .dry_run(&f.up("v0.0.452", R2))
        .await
        .expect("dry run");
    assert!(result.stream.succeeded(), "{:?}", result.stream);
    let plan = result.plan.expect("plan event");
    assert_eq!(plan.recreate, vec![R2.to_owned()], "{plan:?}");
    // compose-manager never passes --no-deps: the exited one-shot dependency is `create`.
    assert_eq!(plan.create, vec!["model-downloader".to_owned()], "{plan:?}");
    assert!(plan.remove.is_empty(), "{plan:?}");
    assert!(result.raw_plan.is_some());
    assert_eq!(f.sim.containers(), before, "a dry run changed containers");

    let call = f.sim.calls().into_iter().last().expect("recorded");
    assert_eq!(
        (call.method.as_str(), call.path.as_str()),
        ("POST", "/compose/up")
    );
    assert_eq!(call.body["services"], json!([R2]));
    assert_eq!(call.body["dry_run"], json!(true));
    assert!(call.body.get("force_recreate").is_none());
    assert_eq!(
        call.body["env"].as_object().map(|m| m.len()),
        Some(f.env.len())
    );
}

#[tokio::test]
async fn dry_run_faults_show_up_as_extra_and_removed_services() {
    let f = fixture().await;
    f.sim.faults().set_dry_run_extra(Some("nginx".into()));
    f.sim
        .faults()
        .set_dry_run_removal(Some("model-sg-old-r9".into()));
    let plan = f
        .client
        .dry_run(&f.up("v0.0.452", R2))
        .await
        .expect("dry run")
        .plan
        .expect("plan event");
    assert!(plan.recreate.contains(&"nginx".to_owned()), "{plan:?}");
    assert_eq!(plan.remove, vec!["model-sg-old-r9".to_owned()], "{plan:?}");
}

#[tokio::test]
async fn down_then_up_moves_only_the_target_to_the_new_tag() {
    let f = fixture().await;
    let r1_before = f.image_of(R1);
    let down = f.client.down(&f.down("v0.0.450", R2)).await.expect("down");
    assert_eq!(down.outcome, StreamOutcome::Succeeded, "{down:?}");
    let up = f.client.up(&f.up("v0.0.452", R2)).await.expect("up");
    assert_eq!(up.outcome, StreamOutcome::Succeeded, "{up:?}");
    assert!(up.n_lines > 0 && !up.transcript_tail.is_empty());
    assert_eq!(
        f.image_of(R2).as_deref(),
        Some("lmsysorg/sglang:glm53-v452")
    );
    assert_eq!(f.image_of(R1), r1_before, "the peer was touched");

    let bodies: Vec<_> = f
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.path.starts_with("/compose/"))
        .map(|c| c.body)
        .collect();
    assert_eq!(bodies.len(), 2);
    for body in &bodies {
        assert_eq!(body["services"], json!([R2]));
        assert!(body.get("force_recreate").is_none() && body.get("dry_run").is_none());
    }
    let version = f.client.version().await.expect("version");
    assert_eq!(version.tag.as_deref(), Some("v0.0.452"));
}

#[tokio::test]
async fn logs_return_the_replicas_startup_lines() {
    let f = fixture().await;
    let logs = LogsRequest {
        file: EXAMPLE_FILE.parse().expect("a valid name"),
        service: R2.parse().expect("a valid name"),
        tail: 200,
    };
    // The engine writes its lines in the background: poll like `wait_logs` does.
    let mut output = String::new();
    for _ in 0..100 {
        output = f.client.logs(&logs).await.expect("logs");
        if output.contains("event-loop stall dump armed") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(output.contains("event-loop stall dump armed"), "{output}");
    assert!(output.lines().all(|l| l.starts_with(R2)), "{output}");
}

#[tokio::test]
async fn refusals_of_the_host_map_to_their_errors() {
    let f = fixture().await;
    let err = f
        .client
        .up(&f.up("v0.0.453", R2))
        .await
        .expect_err("too recent");
    assert_eq!(err.code(), "tag_too_recent", "{err}");
    let err = f
        .client
        .up(&f.up("v9.9.9", R2))
        .await
        .expect_err("unknown tag");
    assert_eq!(err.code(), "tag_not_found", "{err}");
    let mut req = f.up("v0.0.452", R2);
    req.file = "prod/missing.yaml".parse().expect("a valid name");
    let err = f.client.up(&req).await.expect_err("unknown file");
    assert_eq!(err.code(), "file_not_found", "{err}");

    let intruder =
        ComposeClient::new(&f.sim.url(), "wrong", ClientOptions::default()).expect("client");
    let err = intruder.status().await.expect_err("bad token");
    assert!(matches!(err, ComposeError::Unauthorized { .. }), "{err:?}");
}

#[tokio::test]
async fn a_busy_host_answers_409_and_shows_its_operation_in_flight() {
    let f = fixture().await;
    f.sim.faults().busy_for(Duration::from_secs(30));
    let in_flight = f.client.status().await.expect("status").in_flight;
    assert!(in_flight.is_some_and(|op| !op.action.is_empty()));
    let err = f
        .client
        .down(&f.down("v0.0.450", R2))
        .await
        .expect_err("busy");
    assert!(matches!(err, ComposeError::Busy { .. }), "{err:?}");
    f.sim.faults().busy_for(Duration::ZERO);
    assert!(f.client.status().await.expect("status").in_flight.is_none());
}

#[tokio::test]
async fn a_failed_phase_is_a_failure_and_a_cut_stream_is_unknown() {
    let f = fixture().await;
    f.sim.faults().fail_phase(SimOp::Up, Some("pull".into()));
    let failed = f.client.up(&f.up("v0.0.452", R2)).await.expect("stream");
    assert_eq!(failed.outcome, StreamOutcome::Failed { exit_code: Some(1) });
    f.sim.faults().cut_stream(Some(SimOp::Up));
    let cut = f.client.up(&f.up("v0.0.452", R2)).await.expect("stream");
    assert_eq!(cut.outcome, StreamOutcome::Unknown, "{cut:?}");
}

#[tokio::test]
async fn the_host_cache_reports_volumes_and_weights_and_the_gate_reads_it() {
    use canaryd::domain::staging::{cache_dir, verdict, SpaceVerdict};
    const GIB: u64 = 1 << 30;
    const VOLUME: &str = "work_huggingface_cache";
    const REPO: &str = "zai-org/GLM-5.3-W4AFP8";
    let f = fixture().await;
    let gate = |cache: &canaryd::compose::HostCache| {
        let volumes: Vec<(String, u64)> = cache
            .volumes
            .iter()
            .map(|v| (v.name.clone(), v.size_bytes))
            .collect();
        verdict(
            &volumes,
            &cache.weights,
            VOLUME,
            1000 * GIB,
            250 * GIB,
            REPO,
        )
    };
    let cache = f.client.host_cache().await.expect("host cache");
    assert!(cache.volumes.iter().any(|v| v.name == VOLUME), "{cache:?}");
    assert!(!cache.weights.contains(&cache_dir(REPO)), "{cache:?}");

    f.sim.faults().set_cache(VOLUME, Some(900 * GIB), None);
    let full = f.client.host_cache().await.expect("host cache");
    assert_eq!(
        gate(&full),
        SpaceVerdict::Insufficient {
            free: 100 * GIB,
            required: 250 * GIB
        }
    );
    f.sim.faults().set_cache(VOLUME, Some(400 * GIB), None);
    let room = f.client.host_cache().await.expect("host cache");
    assert_eq!(gate(&room), SpaceVerdict::Enough { free: 600 * GIB });
    let dir = cache_dir(REPO);
    f.sim
        .faults()
        .set_cache(VOLUME, Some(990 * GIB), Some(&[dir.as_str()]));
    let staged = f.client.host_cache().await.expect("host cache");
    assert_eq!(gate(&staged), SpaceVerdict::AlreadyStaged);
    // Reading the cache is a read: nothing was sent that acts on the host.
    let acting: Vec<_> = f
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.method == "POST")
        .collect();
    assert!(acting.is_empty(), "{acting:?}");
}
