//! Rollback initiation latency, `POST /v1/rollbacks` to the first compose-manager call
//! of the rollback (its snapshot's `GET /docker/ps`), as the simulated host records it.
//!
//! `cargo bench --bench rollback` (results and method: docs/performance.md). The daemon runs
//! in this process (`App::build` on 127.0.0.1:0, as the integration tests do) against one
//! simulated host, first on an empty database, then on one holding `ROLLBACK_ROWS` historic
//! rollouts (`Store::bulk_fill`, plus deployments and 1% of the history on the replicas under
//! test). Each rollback runs to its end before the next starts (one operation per host); they
//! alternate r2 between two tags.
//!
//! Knobs (env, defaults in brackets): `ROLLBACK_ROWS` [100000], `ROLLBACK_N` [200] rollbacks on
//! the full database, `ROLLBACK_N_EMPTY` [50] on the empty one; `ROLLBACK_KEEP_DIR` keeps the
//! databases in that folder.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use canaryd::app::App;
use canaryd::config::sim::dev_config;
use canaryd::domain::runbook::{self, Runbook};
use canaryd::store::{BulkSpec, Store};
use canaryd::testing::{self, Timings};
use canaryd_sim::{SimConfig, SimHost};
use chrono::Utc;
use common::{env_usize, ms_between, pct};
use serde_json::json;
use sqlx::Connection;

const HOST: &str = "gpu02";
const FILE: &str = "prod/GLM-5.3-Flash-SGL-TP4-W4AFP8-LongContext.yaml";
const R2: &str = "model-sg-glm53-w4afp8-tp4-r2";
const TARGET_P99_MS: f64 = 50.0;

/// The shipped canary and rollback sequences with millisecond timings.
const TIMINGS: Timings = Timings {
    peers: Duration::from_secs(5),
    compose: Duration::from_secs(10),
    wait: Duration::from_secs(10),
    interval: Duration::from_millis(10),
    consecutive: 1,
    soak: Duration::from_millis(50),
};

fn runbooks() -> anyhow::Result<BTreeMap<String, Runbook>> {
    let mut out = BTreeMap::new();
    for (name, text) in [
        (
            "single-replica-canary",
            testing::canary("benchmark canary (millisecond timings)", &TIMINGS),
        ),
        (
            "single-replica-rollback",
            testing::canary_until(
                "benchmark rollback (millisecond timings)",
                &TIMINGS,
                "startup-logs",
            ),
        ),
    ] {
        out.insert(name.to_owned(), runbook::parse(name, name, &text)?);
    }
    Ok(out)
}

/// Historic rows: `Store::bulk_fill`, then (own connection, same file) every unfinished row
/// finished, 1% of the history moved onto the replicas under test, and a deployment recorded
/// for every succeeded rollout.
async fn fill(db: &Path, rows: usize) -> anyhow::Result<()> {
    if rows == 0 {
        Store::open(db).await?;
        return Ok(());
    }
    let spacing = 300;
    let start = Utc::now().timestamp() - rows as i64 * spacing - 86_400;
    let store = Store::open(db).await?;
    store
        .bulk_fill(BulkSpec {
            rollouts: rows as i64,
            steps_per_rollout: 10,
            hosts: 50,
            services_per_host: 2,
            start_unix: start,
            spacing_secs: spacing,
        })
        .await?;
    drop(store);
    let url = format!("sqlite://{}", db.display());
    let mut conn = sqlx::SqliteConnection::connect(&url).await?;
    let mut tx = conn.begin().await?;
    for sql in [
        "update rollout set status = 'aborted', active_host = null, \
           finished_at = coalesce(finished_at, started_at), abort_reason = 'benchmark history' \
         where status in ('pending', 'running')",
        "update step set status = 'skipped' where status in ('pending', 'running')",
        "update rollout set host = 'gpu02', service = case when rowid % 200 = 0 \
           then 'model-sg-glm53-w4afp8-tp4-r2' else 'model-sg-glm53-w4afp8-tp4-r1' end \
         where rowid % 100 = 0",
        "insert into deployment (deployment_id, host, service, file, tag, env_overrides, \
           env_sha256, commit_sha, file_sha256, image, source, rollout_id, deployed_at) \
         select 'dp_' || substr(rollout_id, 4), host, service, file, tag, env_overrides, \
           env_sha256, lower(hex(randomblob(20))), lower(hex(randomblob(32))), \
           'lmsysorg/sglang:glm53-history', 'rollout', rollout_id, finished_at \
         from rollout where status = 'succeeded'",
    ] {
        sqlx::query(sql).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    sqlx::query("pragma wal_checkpoint(truncate)")
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    Ok(())
}

struct Measured {
    rows: usize,
    rollbacks: usize,
    /// Request sent → first compose-manager call of the rollback, ms.
    initiation_ms: Vec<f64>,
    /// Request sent → `201` received, ms.
    answer_ms: Vec<f64>,
    db_mib: f64,
    fill_s: f64,
}

async fn measure(rows: usize, n: usize) -> anyhow::Result<Measured> {
    let dir = tempfile::tempdir()?;
    // `ROLLBACK_KEEP_DIR` keeps the databases there (to inspect query plans afterwards).
    let db = match std::env::var("ROLLBACK_KEEP_DIR") {
        Ok(keep) => {
            let path = Path::new(&keep).join(format!("canaryd-{rows}.db"));
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
            path
        }
        Err(_) => dir.path().join("canaryd.db"),
    };
    let t = Instant::now();
    fill(&db, rows).await?;
    let fill_s = t.elapsed().as_secs_f64();
    let db_mib = std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0) as f64 / (1 << 20) as f64;

    let mut sim_cfg = SimConfig::example();
    sim_cfg.cold_start = Duration::from_millis(20);
    sim_cfg.stream_line_delay = Duration::ZERO;
    let env = sim_cfg.initial_env.clone();
    let sim = SimHost::start(sim_cfg).await?;
    let config = dev_config(&sim, "127.0.0.1:0".parse()?, db.clone(), env);
    let app = App::build(config, runbooks()?).await?;
    let url = format!("http://{}", app.local_addr()?);
    let engine = app.engine();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until_stopped(async {
        let _ = stopped.await;
    }));
    let http = reqwest::Client::new();

    let result = async {
        // Two canaries, so that r2 has a prior deployment to go back to.
        for tag in ["v0.0.451", "v0.0.452"] {
            let plan = json!({"host": HOST, "file": FILE, "service": R2, "tag": tag,
                "reason": "benchmark: deployment history"});
            let res = http
                .post(format!("{url}/v1/rollouts"))
                .json(&plan)
                .send()
                .await?;
            ensure!(
                res.status().as_u16() == 201,
                "canary refused: {}",
                res.text().await?
            );
            let body: serde_json::Value = res.json().await?;
            let id = body["id"].as_str().context("id")?.to_owned();
            let done = engine.wait_terminal(&id, Duration::from_secs(30)).await?;
            ensure!(
                done.status.as_str() == "succeeded",
                "canary {id} ended {:?}",
                done.status
            );
        }
        let mut initiation = Vec::with_capacity(n);
        let mut answer = Vec::with_capacity(n);
        for i in 0..n {
            let body = json!({"host": HOST, "service": R2,
                "reason": format!("benchmark rollback {i}")});
            let sent = Utc::now();
            let res = http
                .post(format!("{url}/v1/rollbacks"))
                .json(&body)
                .send()
                .await?;
            let answered = Utc::now();
            if res.status().as_u16() != 201 {
                bail!("rollback {i} refused: {}", res.text().await?);
            }
            let created: serde_json::Value = res.json().await?;
            let id = created["id"].as_str().context("id")?.to_owned();
            let done = engine.wait_terminal(&id, Duration::from_secs(30)).await?;
            ensure!(
                done.status.as_str() == "succeeded",
                "rollback {id} ended {:?}: {:?}",
                done.status,
                done.error_message
            );
            let first = sim
                .calls()
                .into_iter()
                .filter(|c| c.at >= sent)
                .map(|c| c.at)
                .min()
                .context("a compose-manager call after the request")?;
            initiation.push(ms_between(sent, first));
            answer.push(ms_between(sent, answered));
        }
        Ok::<_, anyhow::Error>((initiation, answer))
    }
    .await;
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
    sim.shutdown().await;
    let (initiation_ms, answer_ms) = result?;
    Ok(Measured {
        rows,
        rollbacks: n,
        initiation_ms,
        answer_ms,
        db_mib,
        fill_s,
    })
}

async fn run() -> anyhow::Result<bool> {
    let rows = env_usize("ROLLBACK_ROWS", 100_000);
    let n = env_usize("ROLLBACK_N", 200).max(1);
    let n_empty = env_usize("ROLLBACK_N_EMPTY", 50);
    println!("rollback initiation benchmark: {}", common::machine());
    if let Ok(filter) = std::env::var("ROLLBACK_TRACE") {
        // e.g. `sqlx=debug` shows every statement with its time.
        canaryd::telemetry::init(canaryd::telemetry::LogFormat::Text, &filter);
    }
    let mut results = Vec::new();
    if n_empty > 0 {
        results.push(measure(0, n_empty).await?);
    }
    results.push(measure(rows, n).await?);
    println!(
        "\n{:>9} {:>8} {:>9} {:>10} | {:>41} | {:>26} {:>14}",
        "rollouts",
        "db MiB",
        "fill s",
        "rollbacks",
        "request -> first compose call p50/p90/p99/max",
        "request -> 201 p50/p99 ms",
        "target p99"
    );
    let mut ok = true;
    for m in &results {
        let v = &m.initiation_ms;
        let p99 = pct(v, 99.0);
        let good = p99 < TARGET_P99_MS;
        if m.rows == rows {
            ok &= good;
        }
        println!(
            "{:>9} {:>8.1} {:>9.1} {:>10} | {:>41} | {:>26} {:>14}",
            m.rows,
            m.db_mib,
            m.fill_s,
            m.rollbacks,
            format!(
                "{:.1} / {:.1} / {:.1} / {:.1} ms",
                pct(v, 50.0),
                pct(v, 90.0),
                p99,
                common::max(v)
            ),
            format!(
                "{:.1} / {:.1}",
                pct(&m.answer_ms, 50.0),
                pct(&m.answer_ms, 99.0)
            ),
            format!(
                "< {TARGET_P99_MS:.0} ms {}",
                if good { "yes" } else { "NO" }
            ),
        );
    }
    Ok(ok)
}

fn main() -> ExitCode {
    // `cargo bench` passes `--bench`; this harness takes its knobs from the environment.
    common::run_main("rollback", "target missed (see the table)", run())
}
