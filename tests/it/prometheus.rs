//! The `analyze` step with `source: prometheus`, against a real Prometheus: the test starts
//! Debian's `prometheus` (`.ci/run` installs it) on a loopback port with a temp config and
//! storage, scraping the simulated engines' `/metrics` every second with the `host` and
//! `container_name` labels the queries select on, then runs canaries through the daemon.
//! Without the binary these tests FAIL, unless CANARYD_SKIP_PROMETHEUS=1.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use canaryd::api::RolloutOut;
use canaryd::config::PrometheusConfig;
use canaryd::domain::runbook::{self, Runbook};
use canaryd::probe::prometheus::Prometheus;
use canaryd_sim::SimHost;
use serde_json::Value;

use crate::helpers::{check, number, step};
use crate::helpers::{fast_runbooks, sim_config, TestApp, TestOptions, FAST_CANARY, HOST, R1, R2};

const BINARY: &str = "/usr/bin/prometheus";

/// The judged window of the test analyses (`{{window}}` is `5s`).
const WINDOW: &str = "5s";

const TTFT: &str = r#"{name: ttft_p95, query: 'histogram_quantile(0.95, sum by (le) (rate(sglang:time_to_first_token_seconds_bucket{host="{{host}}",container_name="{{service}}"}[{{window}}])))', max_ratio_to_peers: 1.2}"#;
const TRAFFIC: &str = r#"{name: took_traffic, query: 'sum(increase(sglang:num_requests_total{host="{{host}}",container_name="{{service}}"}[{{window}}]))', min: 1}"#;
/// A parenthesis left open: Prometheus answers 400 `bad_data`.
const BROKEN: &str = r#"{name: broken, query: 'sum(rate(sglang:num_requests_total{container_name="{{service}}"}[{{window}}])', max: 1000}"#;

/// The binary, `None` to skip (only with CANARYD_SKIP_PROMETHEUS=1), or a failing test.
fn require_prometheus(test: &str) -> Option<PathBuf> {
    let path = PathBuf::from(BINARY);
    if path.is_file() {
        return Some(path);
    }
    if std::env::var("CANARYD_SKIP_PROMETHEUS").as_deref() == Ok("1") {
        eprintln!(
            "\n!!!!!!!! SKIPPED {test}: no {BINARY} and CANARYD_SKIP_PROMETHEUS=1 !!!!!!!!\n\
             !!!!!!!! install it: apt-get install -y --no-install-recommends prometheus\n"
        );
        return None;
    }
    panic!(
        "{test} needs a real Prometheus at {BINARY}: apt-get install -y --no-install-recommends \
         prometheus (or set CANARYD_SKIP_PROMETHEUS=1 to skip on a dev machine)"
    );
}

/// A Prometheus process of this test, killed on drop.
struct PromServer {
    child: Child,
    url: String,
    dir: tempfile::TempDir,
}

impl Drop for PromServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl PromServer {
    /// Starts Prometheus scraping every simulated engine of `sim` every second, and waits
    /// (bounded) until it holds samples of both replicas.
    async fn start(binary: &Path, port: u16, sim: &SimHost) -> PromServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut targets = String::new();
        for service in [R1, R2] {
            let url = sim.metrics_url(service).expect("an engine port");
            let address = url
                .trim_start_matches("http://")
                .trim_end_matches("/metrics");
            targets.push_str(&format!(
                "      - targets: ['{address}']\n        labels: {{host: {HOST}, container_name: {service}}}\n"
            ));
        }
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: sim\n    static_configs:\n{targets}"
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write prometheus.yml");
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{BINARY} starts: {e}"));
        let server = PromServer {
            child,
            url: format!("http://127.0.0.1:{port}"),
            dir,
        };
        server.wait_for_samples().await;
        server
    }

    fn client(&self) -> Prometheus {
        let config = PrometheusConfig {
            url: self.url.clone(),
            token: None,
        };
        Prometheus::new(&config, Duration::from_secs(2))
    }

    /// Until both replicas' request counters have two samples or more (bounded: 60 × 500 ms).
    async fn wait_for_samples(&self) {
        let prom = self.client();
        let query = "count(count_over_time(sglang:num_requests_total{priority=\"0\"}[1m]) >= 2)";
        for _ in 0..60 {
            if let Ok(Some(s)) = prom.instant(query, chrono::Utc::now()).await {
                if s.value >= 2.0 {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let log =
            std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default();
        panic!(
            "Prometheus at {} has no samples of both replicas after 30 s; its log:\n{log}",
            self.url
        );
    }
}

/// The fast canary followed by an analysis by Prometheus with these checks.
fn with_analysis(checks: &[&str]) -> BTreeMap<String, Runbook> {
    let mut text = format!(
        "{}  - name: analysis\n    kind: analyze\n    source: prometheus\n    warmup: 1s\n    duration: {WINDOW}\n    interval: 500ms\n    checks:\n",
        FAST_CANARY.as_str()
    );
    for check in checks {
        text.push_str(&format!("      - {check}\n"));
    }
    let mut books = fast_runbooks();
    let rb = runbook::parse("single-replica-canary", "test", &text).expect("test runbook");
    books.insert("single-replica-canary".to_owned(), rb);
    books
}

/// The daemon with `prometheus:` configured, its simulated host, and a Prometheus scraping
/// the host's engines. The daemon needs the server's URL and the server the host's ports, so
/// the port is chosen first.
async fn setup(test: &str, checks: &[&str]) -> Option<(TestApp, PromServer)> {
    let binary = require_prometheus(test)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let opts = TestOptions {
        runbooks: Some(with_analysis(checks)),
        prometheus: Some(PrometheusConfig {
            url: format!("http://127.0.0.1:{port}"),
            token: None,
        }),
        ..TestOptions::default()
    };
    let app = TestApp::spawn_custom(sim_config(), opts).await;
    let prom = PromServer::start(&binary, port, &app.sim).await;
    Some((app, prom))
}

/// Polls until the rollout is terminal (bounded: 1,200 × 50 ms; the analysis alone takes
/// 6 s).
async fn wait_done(app: &TestApp, id: &str) -> RolloutOut {
    for _ in 0..1_200 {
        let r = app.rollout(id).await;
        if matches!(r.status.as_str(), "succeeded" | "failed" | "aborted") {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "rollout {id} did not finish in 60 s: {:#?}",
        app.rollout(id).await
    );
}

fn code(r: &RolloutOut) -> Option<&str> {
    r.error.as_ref().map(|e| e.code.as_str())
}

/// The stored evidence of one query: (replica, the query as sent, its raw value).
fn queries(r: &RolloutOut, check: &str) -> Vec<(String, String, Value)> {
    step(r, "analysis").detail["queries"]
        .as_array()
        .expect("queries stored")
        .iter()
        .filter(|q| q["check"] == check)
        .map(|q| {
            (
                q["replica"].as_str().unwrap_or_default().to_owned(),
                q["query"].as_str().unwrap_or_default().to_owned(),
                q["value"].clone(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_healthy_canary_passes_with_every_query_and_value_stored() {
    let Some((app, _prom)) = setup("prometheus healthy", &[TTFT, TRAFFIC]).await else {
        return;
    };
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = wait_done(&app, &id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let detail = &step(&r, "analysis").detail;
    assert_eq!(detail["source"], "prometheus");
    assert_eq!(detail["window"], WINDOW);
    let ttft = check(&r, "ttft_p95");
    assert_eq!(ttft["verdict"], "pass", "{ttft:#}");
    let ratio = number(&ttft["ratio"]);
    assert!((0.8..=1.2).contains(&ratio), "same speed reads {ratio}");
    let target = number(&ttft["target"]["value"]);
    assert!(
        (0.1..=0.4).contains(&target),
        "a TTFT p95 in seconds: {target}"
    );
    assert!(ttft["target"].get("requests").is_none(), "{ttft:#}");
    assert_eq!(
        number(&ttft["peer_median"]),
        number(&ttft["peers"][R1]["value"])
    );
    let sent = queries(&r, "ttft_p95");
    assert_eq!(sent.len(), 2, "the target and its peer: {sent:?}");
    for (replica, query, value) in &sent {
        let selector = format!("{{host=\"{HOST}\",container_name=\"{replica}\"}}[{WINDOW}]");
        assert!(query.contains(&selector), "{query}");
        assert!(!query.contains("{{"), "every placeholder filled: {query}");
        let value: f64 = value
            .as_str()
            .and_then(|v| v.parse().ok())
            .expect("a value");
        assert!(value > 0.0, "{replica}: {value}");
        assert_eq!(ttft["queries"][replica].as_str(), Some(query.as_str()));
    }
    let traffic = check(&r, "took_traffic");
    assert_eq!(traffic["verdict"], "pass", "{traffic:#}");
    assert!(number(&traffic["target"]["value"]) >= 1.0, "{traffic:#}");
    let sent = queries(&r, "took_traffic");
    assert_eq!(
        sent.len(),
        1,
        "a min check queries the target only: {sent:?}"
    );
    assert_eq!(sent[0].0, R2);
    app.stop().await;
}

#[tokio::test]
async fn a_canary_twice_as_slow_fails_the_ratio_and_is_rolled_back() {
    let Some((app, _prom)) = setup("prometheus slow", &[TTFT, TRAFFIC]).await else {
        return;
    };
    app.sim.faults().set_engine_slowdown(R2, 2.0);
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = wait_done(&app, &id).await;
    assert_eq!(code(&r), Some("analysis_failed"), "{r:#?}");
    let message = &r.error.as_ref().expect("error").message;
    assert!(message.contains("ttft_p95"), "{message}");
    assert!(!message.contains("took_traffic"), "{message}");
    let ttft = check(&r, "ttft_p95");
    assert_eq!(ttft["verdict"], "fail", "{ttft:#}");
    let ratio = number(&ttft["ratio"]);
    assert!(ratio > 1.4, "2x slower reads {ratio}");
    let (target, median) = (
        number(&ttft["target"]["value"]),
        number(&ttft["peer_median"]),
    );
    assert!((ratio - target / median).abs() < 1e-9, "{ttft:#}");
    assert_eq!(number(&ttft["max_ratio_to_peers"]), 1.2);
    let rb = wait_done(&app, r.rolled_back_by.as_deref().expect("rolled back")).await;
    assert_eq!(rb.status, "succeeded", "{rb:#?}");
    let r2 = app.sim.containers().into_iter().find(|c| c.service == R2);
    assert_eq!(
        r2.map(|c| c.tag).as_deref(),
        Some("v0.0.450"),
        "the prior tag"
    );
    app.stop().await;
}

/// The checks' queries are asked once before the target's `down` (safety rule 20): one that
/// Prometheus refuses fails the canary there, with nothing sent to r2 and nothing to roll back.
#[tokio::test]
async fn a_query_prometheus_refuses_fails_the_canary_before_its_down_with_the_message() {
    let Some((app, _prom)) = setup("prometheus error", &[TRAFFIC, BROKEN]).await else {
        return;
    };
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = wait_done(&app, &id).await;
    assert_eq!(code(&r), Some("signal_unavailable"), "{r:#?}");
    let message = &r.error.as_ref().expect("error").message;
    assert!(
        message.contains("check \"broken\"")
            && message.contains("bad_data")
            && message.contains("parse error"),
        "Prometheus's own words: {message}"
    );
    let down = step(&r, "down");
    assert_eq!(down.status, "failed");
    let broken = down.detail["signals"]["sources"]
        .as_array()
        .and_then(|q| q.iter().find(|q| q["check"] == "broken"))
        .expect("the failed query is stored");
    assert_eq!(broken["source"], "prometheus");
    assert!(
        broken["error"]
            .as_str()
            .is_some_and(|e| e.contains("HTTP 400")),
        "{broken:#}"
    );
    assert!(
        broken["query"].as_str().is_some_and(|q| q.contains(R2)),
        "{broken:#}"
    );
    assert_eq!(step(&r, "analysis").status, "skipped");
    assert!(
        app.compose_calls().iter().all(crate::helpers::is_dry_run),
        "nothing but dry runs"
    );
    assert!(r.rolled_back_by.is_none(), "nothing to roll back");
    app.stop().await;
}

#[tokio::test]
async fn an_idle_canary_is_inconclusive_on_nan_and_fails_took_traffic() {
    let Some((app, _prom)) = setup("prometheus idle", &[TTFT, TRAFFIC]).await else {
        return;
    };
    app.sim.faults().set_engine_traffic(R2, false);
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let r = wait_done(&app, &id).await;
    assert_eq!(code(&r), Some("analysis_failed"), "{r:#?}");
    let ttft = check(&r, "ttft_p95");
    assert_eq!(ttft["verdict"], "inconclusive", "{ttft:#}");
    assert_eq!(ttft["fails_step"], true);
    assert!(
        ttft["target"]["value"].is_null(),
        "NaN is no data: {ttft:#}"
    );
    let target = queries(&r, "ttft_p95")
        .into_iter()
        .find(|(replica, _, _)| replica == R2)
        .expect("the target's query");
    assert_eq!(target.2, "NaN", "the raw answer is kept");
    let traffic = check(&r, "took_traffic");
    assert_eq!(traffic["verdict"], "fail", "{traffic:#}");
    assert_eq!(number(&traffic["target"]["value"]), 0.0);
    app.stop().await;
}

/// `serve` and `check config` refuse, before anything starts, a runbook asking Prometheus
/// under a config without `prometheus:`, naming the runbook file, line and step (no
/// Prometheus needed).
#[test]
fn a_runbook_asking_prometheus_stops_start_up_without_a_server() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir_all(dir.path().join("runbooks")).expect("mkdir");
    std::fs::write(dir.path().join("gpu02.env"), "A=b\n").expect("env file");
    let config = dir.path().join("canaryd.yaml");
    std::fs::write(
        &config,
        "listen: 127.0.0.1:0\ndatabase: canaryd.db\nrunbooks_dir: runbooks\nhosts:\n  gpu02:\n    compose_manager_url: http://127.0.0.1:9\n    token_env: PROM_TEST_CM_TOKEN\n    env_file: gpu02.env\n    replicas:\n      r1: {group: g, health_url: http://127.0.0.1:9/health}\n"
    )
    .expect("config");
    let runbook = format!(
        "description: judged by Prometheus\nsteps:\n  - {{name: snapshot, kind: snapshot}}\n  - name: analysis\n    kind: analyze\n    source: prometheus\n    checks:\n      - {TTFT}\n"
    );
    let file = dir.path().join("runbooks/judged.yaml");
    std::fs::write(&file, runbook).expect("runbook");
    let expected = format!(
        "{}:6: step 2 \"analysis\": `source: prometheus` needs a `prometheus:` server in the daemon config",
        file.display()
    );
    let config = config.to_str().expect("utf-8 path");
    for args in [
        vec!["check", "config", config],
        vec!["serve", "--config", config],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_canaryd"))
            .args(&args)
            .env("PROM_TEST_CM_TOKEN", "cm-token")
            .output()
            .expect("the canaryd binary runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(&expected),
            "{args:?}:\n  got:      {err}\n  expected: {expected}"
        );
        assert!(
            !dir.path().join("canaryd.db").exists(),
            "{args:?}: no database created"
        );
    }
}
