//! The rollout page's load: `cargo bench --bench pages` (optional argument: runs, default 200).
//! Fills a temp database with a finished rollout of 20 steps, one compose call each, whose last
//! step holds an analysis's evidence of 4 checks over 240 intervals for the target and two
//! peers (the most `series` keeps), serves it with the daemon, and times what a browser fetches
//! to draw `/rollouts/{id}`: the HTML, then its script and style sheet, then the on-call hints,
//! the rollout and its audit events (each group in parallel, as a browser does), p50/p99.
//!
//! Target (the rollout page): the whole load under 200 ms on the dev box.

use std::time::{Duration, Instant};

use anyhow::Context;
use canaryd::app::App;
use canaryd::cli::dev_runbooks;
use canaryd::config::sim::dev_config;
use canaryd::store::{BulkSpec, Store};
use canaryd_sim::{SimConfig, SimHost};
use serde_json::{json, Value};

const STEPS: i64 = 20;
const CHECKS: usize = 4;
const POINTS: i64 = 240;
const REPLICAS: [&str; 3] = [
    "model-sg-glm53-w4afp8-tp4-r2",
    "model-sg-glm53-w4afp8-tp4-r1",
    "model-sg-glm53-w4afp8-tp4-r3",
];

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort_unstable();
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[i]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// An analysis's evidence as the step stores it: 4 checks, 3 replicas, 240 points each.
fn analysis_detail(start_ms: i64) -> Value {
    let names = ["ttft_p95", "itl_p95", "e2e_p99", "took_traffic"];
    let mut series = serde_json::Map::new();
    let mut checks = Vec::new();
    for (c, name) in names.iter().enumerate().take(CHECKS) {
        let counter = *name == "took_traffic";
        let mut points = serde_json::Map::new();
        for (r, replica) in REPLICAS.iter().enumerate() {
            let slow = if r == 0 { 2.0 } else { 1.0 };
            let line: Vec<Value> = (0..POINTS)
                .map(|i| {
                    let v = if counter {
                        (25 + (i * 7 + r as i64) % 9) as f64
                    } else {
                        slow * (0.38 + ((i * 13 + c as i64) % 17) as f64 / 1000.0)
                    };
                    json!([start_ms + i * 1000, v])
                })
                .collect();
            points.insert((*replica).to_owned(), Value::Array(line));
        }
        series.insert(
            (*name).to_owned(),
            json!({"shape": if counter { "counter" } else { "quantile" }, "points": points}),
        );
        checks.push(json!({
            "name": name, "verdict": if counter { "pass" } else { "fail" }, "fails_step": !counter,
            "target": {"value": 0.76, "requests": 7200.0},
            "peers": {REPLICAS[1]: {"value": 0.38, "requests": 7100.0}, REPLICAS[2]: {"value": 0.39, "requests": 7000.0}},
            "peer_median": 0.385, "ratio": 1.97, "max_ratio_to_peers": if counter { Value::Null } else { json!(1.2) },
            "max": null, "min": if counter { json!(1) } else { Value::Null }, "min_requests": 50,
            "on_inconclusive": "fail",
            "reasons": ["1.974× the peers' median (0.385) is above max_ratio_to_peers 1.2"],
        }));
    }
    let replicas: serde_json::Map<String, Value> = REPLICAS
        .iter()
        .enumerate()
        .map(|(i, r)| {
            (
                (*r).to_owned(),
                json!({"role": if i == 0 { "target" } else { "peer" }, "metrics_url": format!("http://10.0.0.{i}:18002/metrics"),
                       "scrapes": 241, "scrape_errors": 0, "window_scrapes": 181, "last_error": null}),
            )
        })
        .collect();
    json!({
        "source": "engine",
        "warmup_ends_at": chrono::DateTime::from_timestamp_millis(start_ms + 60_000),
        "ends_at": chrono::DateTime::from_timestamp_millis(start_ms + POINTS * 1000),
        "replicas": replicas,
        "checks": checks,
        "series": series,
        "error": {"code": "analysis_failed", "message": "analysis failed: ttft_p95 (fail: ...)"},
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let runs: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("pages.db");
    let store = Store::open(&db).await?;
    // Two rollouts on one host: the older one is finished (the newer, running, is not used).
    let start_unix = 1_704_067_200;
    store
        .bulk_fill(BulkSpec {
            rollouts: 2,
            steps_per_rollout: STEPS,
            hosts: 1,
            services_per_host: 1,
            start_unix,
            spacing_secs: 300,
        })
        .await?;
    let id = format!("ro_{:026}", 0);
    let last_step = format!("st_{:026}_{:02}", 0, STEPS - 1);
    let detail = analysis_detail((start_unix + 1) * 1000);
    store.update_step_detail(&last_step, &detail).await?;
    store.close().await;

    let sim = SimHost::start(SimConfig::example())
        .await
        .context("simulated host")?;
    let env = SimConfig::example().initial_env;
    let config = dev_config(&sim, "127.0.0.1:0".parse()?, db.clone(), env);
    let app = App::build(config, dev_runbooks()?).await?;
    let url = format!("http://{}", app.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until_stopped(async {
        let _ = stopped.await;
    }));
    let http = reqwest::Client::new();
    let get = |path: String| {
        let http = http.clone();
        let url = format!("{url}{path}");
        async move {
            let res = http.get(&url).send().await?;
            anyhow::ensure!(res.status().is_success(), "{url} answered {}", res.status());
            Ok::<usize, anyhow::Error>(res.bytes().await?.len())
        }
    };
    let load = || async {
        let html = get(format!("/rollouts/{id}")).await?;
        let (common, js, css) = tokio::try_join!(
            get("/common.js".into()),
            get("/rollout_page.js".into()),
            get("/page.css".into())
        )?;
        let (hints, rollout, audit) = tokio::try_join!(
            get("/oncall_hints.json".into()),
            get(format!("/v1/rollouts/{id}")),
            get(format!("/v1/rollouts/{id}/audit")),
        )?;
        Ok::<_, anyhow::Error>((html + common + js + css + hints + audit, rollout))
    };
    let (_, rollout_bytes) = load().await?; // warm-up
    let mut samples = Vec::with_capacity(runs);
    let mut total_bytes = 0;
    for _ in 0..runs {
        let t = Instant::now();
        let (other, rollout) = load().await?;
        samples.push(t.elapsed());
        total_bytes = other + rollout;
    }
    let p50 = percentile(&mut samples, 0.50);
    let p99 = percentile(&mut samples, 0.99);
    println!(
        "rollout page, {STEPS} steps, {CHECKS} checks × {POINTS} intervals × {} replicas: \
         whole load p50 {} p99 {} over {runs} runs; {} KB fetched, the rollout's JSON {} KB",
        REPLICAS.len(),
        ms(p50),
        ms(p99),
        total_bytes / 1024,
        rollout_bytes / 1024
    );
    let _ = stop.send(());
    let _ = server.await;
    sim.shutdown().await;
    Ok(())
}
