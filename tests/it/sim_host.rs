//! The simulated host on its own, driven over raw HTTP: scoped operations touch only their
//! target, and the contract's details (auth, lock, tags, streams, plan, version) hold.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use canaryd_sim::{SimConfig, SimHost, SimOp, EXAMPLE_FILE};
use serde_json::{json, Value};

const R1: &str = "model-sg-glm53-w4afp8-tp4-r1";
const R2: &str = "model-sg-glm53-w4afp8-tp4-r2";

async fn start_with(change: impl FnOnce(&mut SimConfig)) -> SimHost {
    let mut cfg = SimConfig::example();
    cfg.cold_start = Duration::from_millis(200);
    cfg.stream_line_delay = Duration::from_millis(1);
    change(&mut cfg);
    SimHost::start(cfg)
        .await
        .expect("the simulated host starts")
}

async fn start() -> SimHost {
    start_with(|_| {}).await
}

/// The host's full env map, as canaryd sends it.
fn env() -> Value {
    json!(SimConfig::example().initial_env)
}

struct Reply {
    status: u16,
    content_type: String,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// The NDJSON lines of a stream.
    fn lines(&self) -> Vec<Value> {
        self.body
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}")))
            .collect()
    }

    fn last(&self) -> Value {
        self.lines().pop().expect("the stream has lines")
    }

    fn stderr(&self) -> Vec<String> {
        self.lines()
            .iter()
            .filter(|l| l["event"] == "stderr")
            .map(|l| l["data"].as_str().unwrap_or_default().to_string())
            .collect()
    }
}

async fn send(
    sim: &SimHost,
    method: &str,
    path: &str,
    body: Option<Value>,
    token: Option<&str>,
) -> Reply {
    let client = reqwest::Client::new();
    let url = format!("{}{path}", sim.url());
    let mut req = match method {
        "GET" => client.get(url),
        _ => client.post(url),
    };
    if let Some(token) = token {
        req = req.header("Authorization", format!("Bearer {token}"));
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.expect("the request is answered");
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = resp.text().await.expect("the body is read to its end");
    Reply {
        status,
        content_type,
        body,
    }
}

async fn post(sim: &SimHost, path: &str, body: Value) -> Reply {
    send(sim, "POST", path, Some(body), Some(sim.token())).await
}

async fn get(sim: &SimHost, path: &str) -> Value {
    let reply = send(sim, "GET", path, None, Some(sim.token())).await;
    assert_eq!(reply.status, 200, "{path}: {}", reply.body);
    reply.json()
}

fn up(tag: &str, services: &[&str], dry_run: bool) -> Value {
    json!({"tag": tag, "file": EXAMPLE_FILE, "services": services, "env": env(),
           "force_recreate": false, "dry_run": dry_run})
}

fn down(tag: &str, services: &[&str]) -> Value {
    json!({"tag": tag, "file": EXAMPLE_FILE, "services": services, "env": env()})
}

fn assert_done(reply: &Reply, success: bool) {
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.content_type, "application/x-ndjson");
    let done = reply.last();
    assert_eq!(done["event"], "done", "{}", reply.body);
    assert_eq!(done["success"], success, "{}", reply.body);
    assert_eq!(done["exit_code"], if success { 0 } else { 1 });
}

/// `docker ps` as name → (ID, Image).
async fn ps(sim: &SimHost) -> BTreeMap<String, (String, String)> {
    let out = get(sim, "/docker/ps").await;
    let text = out["output"].as_str().expect("ps output is text");
    text.lines()
        .map(|l| {
            let row: Value = serde_json::from_str(l).expect("one JSON object per line");
            let field = |k: &str| row[k].as_str().expect("docker ps field").to_string();
            (field("Names"), (field("ID"), field("Image")))
        })
        .collect()
}

async fn logs(sim: &SimHost, service: &str, tail: u32) -> String {
    let reply = post(
        sim,
        "/compose/logs",
        json!({"file": EXAMPLE_FILE, "tail": tail, "services": [service]}),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.json()["output"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Polls `check` every 20 ms, at most 150 times.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    for _ in 0..150 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

async fn health(url: &str) -> u16 {
    match reqwest::get(url).await {
        Ok(resp) => resp.status().as_u16(),
        Err(_) => 0,
    }
}

fn plan_of(reply: &Reply) -> Value {
    let lines = reply.lines();
    let plan = lines
        .iter()
        .find(|l| l["event"] == "plan")
        .unwrap_or_else(|| panic!("no plan event in {}", reply.body));
    plan["plan"].clone()
}

#[tokio::test]
async fn a_scoped_down_dry_run_and_up_of_r2_replace_only_r2s_container() {
    let sim = start().await;
    let before = ps(&sim).await;
    assert!(
        before.contains_key(R1) && before.contains_key(R2),
        "{before:?}"
    );

    let reply = post(&sim, "/compose/down", down("v0.0.450", &[R2])).await;
    assert_done(&reply, true);
    assert!(reply
        .stderr()
        .contains(&format!(" Container {R2}  Removed")));
    let after_down = ps(&sim).await;
    assert!(!after_down.contains_key(R2));
    assert_eq!(after_down[R1], before[R1]);

    let reply = post(&sim, "/compose/up", up("v0.0.451", &[R2], true)).await;
    assert_done(&reply, true);
    let plan = plan_of(&reply);
    // The exited one-shot dependency is planned too, reported `Created` (no --no-deps).
    assert_eq!(
        plan["create"],
        json!(["Container model-downloader", format!("Container {R2}")])
    );
    assert_eq!(plan["recreate"], json!([]));
    assert_eq!(plan["remove"], json!([]));
    assert_eq!(plan["unchanged"], json!([]));
    assert_eq!(ps(&sim).await, after_down, "a dry run changes nothing");

    let reply = post(&sim, "/compose/up", up("v0.0.451", &[R2], false)).await;
    assert_done(&reply, true);
    let after_up = ps(&sim).await;
    assert_eq!(after_up[R2].1, "lmsysorg/sglang:glm53-v451");
    assert_ne!(after_up[R2].0, before[R2].0, "r2 has a new container id");
    assert_eq!(after_up[R2].0.len(), 12, "docker ps shows short ids");
    for (name, id_image) in &before {
        if name != R2 {
            assert_eq!(after_up.get(name), Some(id_image), "{name} is untouched");
        }
    }
    let version = get(&sim, "/version").await;
    assert_eq!(version["projects"]["work"]["current"]["tag"], "v0.0.451");
    assert_eq!(version["projects"]["work"]["previous"]["tag"], "v0.0.450");
}

#[tokio::test]
async fn a_dry_run_with_an_empty_service_list_at_a_new_tag_plans_recreating_both_replicas() {
    let sim = start().await;
    let reply = post(&sim, "/compose/up", up("v0.0.452", &[], true)).await;
    assert_done(&reply, true);
    let plan = plan_of(&reply);
    assert_eq!(
        plan["recreate"],
        json!([format!("Container {R1}"), format!("Container {R2}")])
    );
    let unchanged = plan["unchanged"].as_array().expect("array");
    assert!(unchanged.contains(&json!("Container nginx")));
    assert!(!unchanged.contains(&json!("Container glm53-perception-check")));
    assert!(reply
        .stderr()
        .iter()
        .all(|l| l.starts_with(" DRY-RUN MODE -  Container ")));
}

#[tokio::test]
async fn the_plan_event_has_four_sorted_arrays_in_key_order_right_before_done() {
    let sim = start().await;
    sim.faults().set_dry_run_extra(Some("nginx".into()));
    sim.faults()
        .set_dry_run_removal(Some("otelcol-contrib".into()));
    let reply = post(&sim, "/compose/up", up("v0.0.451", &[R2], true)).await;
    let raw: Vec<&str> = reply.body.lines().collect();
    let plan_line = raw[raw.len() - 2];
    assert!(
        plan_line.starts_with(
            r#"{"event":"plan","exit_code":0,"plan":{"create":["Container model-downloader"],"recreate":["#
        ),
        "{plan_line}"
    );
    assert!(plan_line.ends_with(r#"},"success":true}"#), "{plan_line}");
    assert_eq!(
        raw[raw.len() - 1],
        r#"{"event":"done","success":true,"exit_code":0}"#
    );
    let plan = plan_of(&reply);
    assert_eq!(
        plan["recreate"],
        json!([format!("Container {R2}"), "Container nginx"])
    );
    assert_eq!(plan["remove"], json!(["Container otelcol-contrib"]));
}

#[tokio::test]
async fn requests_without_the_right_bearer_token_get_the_documented_401s() {
    let sim = start().await;
    let missing = send(&sim, "GET", "/status", None, None).await;
    assert_eq!(missing.status, 401);
    assert_eq!(
        missing.json(),
        json!({"status": "error", "error": "Missing or invalid Authorization header"})
    );
    let wrong = send(
        &sim,
        "POST",
        "/compose/up",
        Some(up("v0.0.451", &[R2], true)),
        Some("nope"),
    )
    .await;
    assert_eq!(wrong.status, 401);
    assert_eq!(
        wrong.json(),
        json!({"status": "error", "error": "Invalid token"})
    );
    let version = send(&sim, "GET", "/version", None, None).await;
    assert_eq!(version.status, 200, "/version needs no auth");

    let basic = reqwest::Client::new()
        .get(format!("{}/docker/ps", sim.url()))
        .header("Authorization", format!("Basic {}", sim.token()))
        .send()
        .await
        .expect("answered");
    assert_eq!(basic.status().as_u16(), 401);
    let no_tag = send(
        &sim,
        "POST",
        "/compose/up",
        Some(json!({"file": EXAMPLE_FILE})),
        Some("nope"),
    )
    .await;
    assert_eq!(no_tag.status, 422, "a bad body beats a bad token");
    assert!(no_tag.content_type.starts_with("text/plain"));
    let not_json = reqwest::Client::new()
        .post(format!("{}/compose/down", sim.url()))
        .body("tag=v1")
        .send()
        .await
        .expect("answered");
    assert_eq!(not_json.status().as_u16(), 415);
    let unknown = send(&sim, "GET", "/nope", None, Some(sim.token())).await;
    assert_eq!((unknown.status, unknown.body.as_str()), (404, ""));
}

#[tokio::test]
async fn a_mutating_call_during_a_running_stream_gets_409_and_status_shows_the_stream() {
    let sim = start_with(|c| c.stream_line_delay = Duration::from_millis(40)).await;
    let first = reqwest::Client::new()
        .post(format!("{}/compose/up", sim.url()))
        .bearer_auth(sim.token())
        .json(&up("v0.0.451", &[R2], false))
        .send()
        .await
        .expect("the stream starts");
    assert_eq!(first.status().as_u16(), 200);

    let second = post(&sim, "/compose/down", down("v0.0.450", &[R1])).await;
    assert_eq!(second.status, 409);
    assert_eq!(
        second.json(),
        json!({"status": "error", "error": "another docker operation is already in progress: compose_up"})
    );
    let status = get(&sim, "/status").await;
    let in_flight = &status["in_flight"];
    assert_eq!(in_flight["action"], "compose_up");
    assert_eq!(in_flight["tag"], "v0.0.451");
    assert_eq!(in_flight["file"], EXAMPLE_FILE);
    assert_eq!(in_flight["services"], json!([R2]));
    assert!(in_flight["started_at"].is_string());

    let body = first.text().await.expect("the stream ends");
    assert!(body
        .trim_end()
        .ends_with(r#"{"event":"done","success":true,"exit_code":0}"#));
    assert_eq!(
        get(&sim, "/status").await,
        json!({"status": "ok", "in_flight": null})
    );
    assert_done(
        &post(&sim, "/compose/down", down("v0.0.450", &[R1])).await,
        true,
    );
}

#[tokio::test]
async fn a_host_made_busy_answers_409_until_the_period_ends() {
    let sim = start().await;
    sim.faults().busy_for(Duration::from_millis(1000));
    let reply = post(&sim, "/compose/up", up("v0.0.451", &[R2], true)).await;
    assert_eq!(reply.status, 409);
    assert_eq!(
        reply.json()["error"],
        "another docker operation is already in progress: compose_up"
    );
    assert_eq!(
        get(&sim, "/status").await["in_flight"]["action"],
        "compose_up"
    );
    eventually("the busy period to end", || async {
        get(&sim, "/status").await["in_flight"].is_null()
    })
    .await;
    assert_done(
        &post(&sim, "/compose/up", up("v0.0.451", &[R2], true)).await,
        true,
    );
}

#[tokio::test]
async fn bad_tags_files_and_env_are_refused_with_the_documented_messages() {
    let sim = start().await;
    let refused = |reply: Reply| {
        assert_eq!(reply.status, 400, "{}", reply.body);
        reply.json()["error"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(
        refused(post(&sim, "/compose/up", up("v9.9.9", &[R2], true)).await),
        "tag not found: v9.9.9"
    );
    let recent = refused(post(&sim, "/compose/up", up("v0.0.453", &[R2], false)).await);
    let pattern = regex::Regex::new(
        r"^tag too recent: \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC is less than 48 hours old$",
    )
    .expect("regex");
    assert!(pattern.is_match(&recent), "{recent}");
    let down_recent = refused(post(&sim, "/compose/down", down("v0.0.453", &[R2])).await);
    assert!(
        down_recent.starts_with("tag too recent: "),
        "a down checks the age too"
    );
    let mut other_file = up("v0.0.451", &[R2], true);
    other_file["file"] = json!("prod/nope.yaml");
    assert_eq!(
        refused(post(&sim, "/compose/up", other_file).await),
        "file 'prod/nope.yaml' not found at tag 'v0.0.451'"
    );
    let mut bad_key = up("v0.0.451", &[R2], true);
    bad_key["env"] = json!({"1BAD": "x"});
    assert_eq!(
        refused(post(&sim, "/compose/up", bad_key).await),
        "invalid env var key: '1BAD' (must match [A-Za-z_][A-Za-z0-9_]*)"
    );
    let mut newline = up("v0.0.451", &[R2], true);
    newline["env"] = json!({"A": "x\ny"});
    assert_eq!(
        refused(post(&sim, "/compose/up", newline).await),
        "env var 'A' value must not contain newlines"
    );
    assert!(
        get(&sim, "/status").await["in_flight"].is_null(),
        "refusals free the lock"
    );
}

#[tokio::test]
async fn a_legacy_host_has_no_evict_route_and_really_deploys_on_a_dry_run() {
    let sim = start().await;
    let probe = post(&sim, "/docker/evict", json!({})).await;
    assert_eq!(
        probe.status, 422,
        "the newest server rejects a body without model"
    );
    assert!(probe.content_type.starts_with("text/plain"));

    sim.faults().set_legacy(true);
    assert_eq!(post(&sim, "/docker/evict", json!({})).await.status, 404);
    let r2_before = ps(&sim).await[R2].clone();
    let reply = post(&sim, "/compose/up", up("v0.0.451", &[R2], true)).await;
    assert_done(&reply, true);
    assert!(
        reply.lines().iter().all(|l| l["event"] != "plan"),
        "no plan event"
    );
    assert!(reply.stderr().iter().all(|l| !l.contains("DRY-RUN")));
    let r2_after = ps(&sim).await[R2].clone();
    assert_ne!(r2_after.0, r2_before.0, "the dry run deployed r2 for real");
    assert_eq!(r2_after.1, "lmsysorg/sglang:glm53-v451");
    assert_eq!(
        get(&sim, "/version").await["projects"]["work"]["current"]["tag"],
        "v0.0.451"
    );
}

#[tokio::test]
async fn a_cut_stream_ends_without_done_after_the_work_but_leaves_deployed_records_alone() {
    let sim = start().await;
    sim.faults().cut_stream(Some(SimOp::Up));
    let r2_before = ps(&sim).await[R2].clone();
    let reply = post(&sim, "/compose/up", up("v0.0.451", &[R2], false)).await;
    assert_eq!(reply.status, 200);
    assert!(
        reply.lines().iter().all(|l| l["event"] != "done"),
        "{}",
        reply.body
    );
    assert_ne!(
        ps(&sim).await[R2].0,
        r2_before.0,
        "the containers were recreated"
    );
    let version = get(&sim, "/version").await;
    assert_eq!(
        version["tag"], "v0.0.451",
        "top-level fields are the last attempt"
    );
    assert_eq!(version["projects"]["work"]["current"]["tag"], "v0.0.450");
    assert!(version["projects"]["work"].get("previous").is_none());
    eventually("the host to be idle", || async {
        get(&sim, "/status").await["in_flight"].is_null()
    })
    .await;
    assert_done(
        &post(&sim, "/compose/up", up("v0.0.451", &[R2], false)).await,
        true,
    );
}

#[tokio::test]
async fn a_failing_phase_ends_the_stream_with_done_success_false() {
    let sim = start().await;
    let r2_before = ps(&sim).await[R2].clone();
    sim.faults().fail_phase(SimOp::Up, Some("pull".into()));
    let reply = post(&sim, "/compose/up", up("v0.0.451", &[R2], false)).await;
    assert_done(&reply, false);
    assert!(reply
        .stderr()
        .iter()
        .any(|l| l.contains("manifest unknown")));
    assert_eq!(
        ps(&sim).await[R2],
        r2_before,
        "a failed pull changes nothing"
    );

    sim.faults().fail_phase(SimOp::DryRun, Some("up".into()));
    let dry = post(&sim, "/compose/up", up("v0.0.451", &[R2], true)).await;
    assert_done(&dry, false);
    let plan_line = dry
        .lines()
        .into_iter()
        .find(|l| l["event"] == "plan")
        .expect("plan even on failure");
    assert_eq!(plan_line["success"], false);

    sim.faults().fail_phase(SimOp::Up, Some("up".into()));
    assert_done(
        &post(&sim, "/compose/up", up("v0.0.451", &[R2], false)).await,
        false,
    );
    assert!(
        !ps(&sim).await.contains_key(R2),
        "r2 was created but did not start"
    );
    let r2 = sim
        .containers()
        .into_iter()
        .find(|c| c.service == R2)
        .expect("r2 exists");
    assert_eq!(r2.state, "exited");

    sim.faults().fail_phase(SimOp::Down, Some("down".into()));
    assert_done(
        &post(&sim, "/compose/down", down("v0.0.450", &[R1])).await,
        false,
    );
    assert!(ps(&sim).await.contains_key(R1));
    assert_done(
        &post(&sim, "/compose/up", up("v0.0.451", &[R2], false)).await,
        true,
    );
}

#[tokio::test]
async fn version_rotates_only_on_a_successful_up_and_a_down_changes_nothing() {
    let sim = start().await;
    let fresh = get(&sim, "/version").await;
    assert_eq!(fresh["tag"], "v0.0.450");
    assert_eq!(fresh["file"], EXAMPLE_FILE);
    assert_eq!(fresh["commit"].as_str().map(str::len), Some(40));
    assert_eq!(fresh["file_sha256"].as_str().map(str::len), Some(64));
    assert_eq!(
        fresh["projects"]["work"]["current"],
        json!({
            "tag": fresh["tag"], "commit": fresh["commit"], "file": fresh["file"], "file_sha256": fresh["file_sha256"]
        })
    );

    sim.faults().fail_phase(SimOp::Up, Some("up".into()));
    assert_done(
        &post(&sim, "/compose/up", up("v0.0.451", &[R2], false)).await,
        false,
    );
    let failed = get(&sim, "/version").await;
    assert_eq!(failed["tag"], "v0.0.451");
    assert_eq!(failed["projects"], fresh["projects"]);

    assert_done(
        &post(&sim, "/compose/up", up("v0.0.452", &[R2], true)).await,
        true,
    );
    assert_eq!(
        get(&sim, "/version").await,
        failed,
        "a dry run changes nothing"
    );
    assert_done(
        &post(&sim, "/compose/down", down("v0.0.450", &[R2])).await,
        true,
    );
    assert_eq!(
        get(&sim, "/version").await,
        failed,
        "a down changes nothing"
    );

    assert_done(
        &post(&sim, "/compose/up", up("v0.0.452", &[R2], false)).await,
        true,
    );
    let done = get(&sim, "/version").await;
    assert_eq!(done["projects"]["work"]["current"]["tag"], "v0.0.452");
    assert_eq!(
        done["projects"]["work"]["previous"],
        fresh["projects"]["work"]["current"]
    );
    assert_ne!(
        done["file_sha256"], fresh["file_sha256"],
        "each tag's text is its own"
    );
}

#[tokio::test]
async fn an_engine_answers_503_during_its_cold_start_and_200_after() {
    let sim = start_with(|c| c.cold_start = Duration::from_millis(800)).await;
    let url = sim.health_url(R2).expect("r2 is an engine");
    assert!(sim.health_url("nginx").is_none());
    assert!(sim.health_url("model-downloader").is_none());
    assert_eq!(health(&url).await, 200, "the initial deployment is warm");

    assert_done(
        &post(&sim, "/compose/down", down("v0.0.450", &[R2])).await,
        true,
    );
    assert_eq!(health(&url).await, 503, "no container, same port");
    assert_done(
        &post(&sim, "/compose/up", up("v0.0.451", &[R2], false)).await,
        true,
    );
    assert_eq!(
        sim.health_url(R2).as_deref(),
        Some(url.as_str()),
        "the port is stable"
    );
    assert_eq!(health(&url).await, 503, "cold");
    eventually("r2 to become healthy", || async {
        health(&url).await == 200
    })
    .await;
    assert_eq!(health(&sim.health_url(R1).expect("r1")).await, 200);

    sim.faults().set_health_never(R1, true);
    assert_eq!(health(&sim.health_url(R1).expect("r1")).await, 503);
}

#[tokio::test]
async fn a_started_engine_logs_its_startup_lines_over_time_and_its_tail_keeps_moving() {
    let sim = start_with(|c| c.cold_start = Duration::from_millis(1000)).await;
    assert_done(
        &post(&sim, "/compose/up", up("v0.0.451", &[R2], false)).await,
        true,
    );
    let early = logs(&sim, R2, 100).await;
    assert!(!early.contains("fired up and ready to roll"), "{early}");
    eventually("the startup lines", || async {
        logs(&sim, R2, 100)
            .await
            .contains("The server is fired up and ready to roll!")
    })
    .await;
    let full = logs(&sim, R2, 1000).await;
    let at = |needle: &str| {
        full.find(needle)
            .unwrap_or_else(|| panic!("{needle} missing:\n{full}"))
    };
    assert!(at("rank_budget_bytes=108984795136") < at("HiCache startup RAM allocated"));
    assert!(at("HiCache startup RAM allocated") < at("event-loop stall dump armed"));
    assert!(at("event-loop stall dump armed") < at("The server is fired up and ready to roll!"));
    assert!(
        full.lines().all(|l| l.starts_with(&format!("{R2}  | "))),
        "{full}"
    );

    let first = logs(&sim, R2, 2).await;
    eventually("the tail to move", || async {
        logs(&sim, R2, 2).await != first
    })
    .await;
    sim.faults()
        .emit_log_line(R2, "CUDA error 801: operation not supported");
    assert!(logs(&sim, R2, 100).await.contains("CUDA error 801"));

    let mut bigger = up("v0.0.451", &[R2], false);
    bigger["env"]["GLM53_R2_HICACHE_RAM_BUDGET"] = json!("650GiB");
    sim.faults().set_cold_start(Duration::from_millis(50));
    assert_done(&post(&sim, "/compose/up", bigger).await, true);
    eventually("the new budget line", || async {
        logs(&sim, R2, 100)
            .await
            .contains("rank_budget_bytes=174483046400")
    })
    .await;
    assert!(
        !logs(&sim, R2, 1000).await.contains("CUDA error 801"),
        "a new container, a new log"
    );
}

#[tokio::test]
async fn startup_lines_can_be_replaced_to_leave_out_a_required_line() {
    let sim = start_with(|c| c.cold_start = Duration::from_millis(100)).await;
    sim.faults()
        .set_logs_on_start(R2, Some(vec!["booting".into(), "ready".into()]));
    assert_done(
        &post(&sim, "/compose/up", up("v0.0.451", &[R2], false)).await,
        true,
    );
    eventually("the custom lines", || async {
        logs(&sim, R2, 100).await.contains("ready")
    })
    .await;
    assert!(!logs(&sim, R2, 1000).await.contains("rank_budget_bytes="));
}

#[tokio::test]
async fn ps_and_logs_speak_dockers_formats_and_every_call_is_recorded() {
    let sim = start().await;
    let out = get(&sim, "/docker/ps").await;
    let rows: Vec<Value> = out["output"]
        .as_str()
        .expect("text")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    let r1 = rows.iter().find(|r| r["Names"] == R1).expect("r1 listed");
    for key in ["ID", "Names", "Image", "State", "Status", "Labels"] {
        assert!(r1[key].is_string(), "{key} in {r1}");
    }
    assert_eq!(r1["State"], "running");
    assert!(r1["Status"].as_str().is_some_and(|s| s.starts_with("Up ")));
    assert!(r1["Labels"].as_str().is_some_and(|l| l.contains(&format!(
        "com.docker.compose.service={R1},com.docker.compose.project=work"
    ))));
    assert!(
        rows.iter().all(|r| r["Names"] != "model-downloader"),
        "exited one-shots are not listed"
    );

    let both = post(
        &sim,
        "/compose/logs",
        json!({"file": EXAMPLE_FILE, "tail": 1, "services": [R1, R2]}),
    )
    .await;
    let output = both.json()["output"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(output.lines().count(), 2, "{output}");
    let defaults = send(&sim, "POST", "/compose/logs", None, Some(sim.token())).await;
    assert_eq!(
        defaults.status, 500,
        "no body: defaults, and docker-compose.yml is not on disk"
    );
    assert!(defaults.json()["error"]
        .as_str()
        .is_some_and(|e| e.starts_with("docker compose failed (exit 1):")));

    let calls = sim.calls();
    let paths: Vec<(&str, &str)> = calls
        .iter()
        .map(|c| (c.method.as_str(), c.path.as_str()))
        .collect();
    assert_eq!(
        paths,
        [
            ("GET", "/docker/ps"),
            ("POST", "/compose/logs"),
            ("POST", "/compose/logs")
        ]
    );
    assert_eq!(calls[1].body["services"], json!([R1, R2]));
    assert_eq!(calls[2].body, Value::Null);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_client_that_hangs_up_mid_stream_frees_the_lock() {
    let sim = start_with(|c| c.stream_line_delay = Duration::from_millis(40)).await;
    let resp = reqwest::Client::new()
        .post(format!("{}/compose/up", sim.url()))
        .bearer_auth(sim.token())
        .json(&up("v0.0.451", &[R2], false))
        .send()
        .await
        .expect("the stream starts");
    assert_eq!(
        get(&sim, "/status").await["in_flight"]["action"],
        "compose_up"
    );
    drop(resp);
    eventually("the lock to be released", || async {
        get(&sim, "/status").await["in_flight"].is_null()
    })
    .await;
    let version = get(&sim, "/version").await;
    assert_eq!(version["projects"]["work"]["current"]["tag"], "v0.0.450");
}

/// The p95 of family `name` over a window of 1,000 requests served at `slowdown`, as the
/// analysis reads the simulated engine's pages.
fn p95_of(slowdown: f64, name: &str) -> f64 {
    use canaryd::domain::exposition::{histogram_series_delta, quantile, Page};
    let (before, after) = canaryd_sim::pages_around_traffic(slowdown, 200, 1_200);
    let a = Page::parse(&before).expect("page parses");
    let b = Page::parse(&after).expect("page parses");
    let window = histogram_series_delta(&a.histogram(name), &b.histogram(name));
    assert_eq!(
        window.count, 1_000.0,
        "the stale placeholder is not counted"
    );
    quantile(0.95, &window).expect("observations")
}

#[test]
fn a_slowdown_moves_the_p95_the_way_the_analysis_will_see_it() {
    for name in [
        "sglang:time_to_first_token_seconds",
        "sglang:inter_token_latency_seconds",
    ] {
        let base = p95_of(1.0, name);
        let slight = p95_of(1.1, name) / base;
        let double = p95_of(2.0, name) / base;
        assert!((1.0..1.2).contains(&slight), "{name}: 1.1x reads {slight}");
        assert!(double > 1.4, "{name}: 2x reads {double}");
    }
}

#[test]
fn the_example_page_has_the_size_asked_for() {
    let page = canaryd::domain::exposition::Page::parse(&canaryd_sim::example_metrics_page(2_000))
        .expect("parses");
    // Histograms count once per series here; the text has ~2,000 series lines besides the
    // buckets.
    assert!(
        (1_900..=2_100).contains(&page.series_count()),
        "{}",
        page.series_count()
    );
}
