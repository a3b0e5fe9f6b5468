//! Audit queries at scale: `cargo bench --bench audit` (optional argument: rollouts, default
//! 100000). Fills a temp database with N rollouts, 10 steps and 10 step attempts each (1M at
//! the default) and the audit events they would have written, then measures
//!
//! - filtered list p50/p99 (store: the page query plus its steps; HTTP: the whole request),
//! - CSV export of every row over HTTP,
//! - daemon start: `Store::open` (migrate) plus the recovery scan (`unfinished_rollouts`),
//! - database size per 1k rollouts.
//!
//! Targets: list p99 < 10 ms, CSV < 2 s, start < 300 ms.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use canaryd::app::App;
use canaryd::cli::dev_runbooks;
use canaryd::config::sim::dev_config;
use canaryd::domain::state::{RolloutKind, RolloutStatus};
use canaryd::store::{fmt_time, BulkSpec, RolloutFilter, Store};
use canaryd_sim::{SimConfig, SimHost};
use chrono::{TimeZone, Utc};

const STEPS: i64 = 10;
const HOSTS: i64 = 20;
const SERVICES: i64 = 4;
const START_UNIX: i64 = 1_704_067_200; // 2024-01-01
const SPACING_SECS: i64 = 300;
const QUERIES_PER_SHAPE: usize = 100;

/// A tiny deterministic generator (no dependency needed for picking query parameters).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n.max(1)
    }
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort_unstable();
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[i]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// The filter shapes an operator uses, with random values and a random page depth.
fn filters(rng: &mut Lcg, rollouts: i64) -> Vec<(&'static str, RolloutFilter)> {
    let t = |i: i64| {
        Utc.timestamp_opt(START_UNIX + i * SPACING_SECS, 0)
            .single()
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for _ in 0..QUERIES_PER_SHAPE {
        let i = rng.next(rollouts as u64) as i64;
        let host = format!("host{:02}", rng.next(HOSTS as u64));
        let service = format!(
            "model-sg-glm53-w4afp8-tp4-h{:02}-r{}",
            rng.next(HOSTS as u64),
            rng.next(SERVICES as u64) + 1
        );
        let actor = ["ops-alice", "ops-bob", "oncall", "canaryd", "ops-carol"]
            [rng.next(5) as usize]
            .to_owned();
        let cursor = Some((fmt_time(t(i)), "ro_~".to_owned()));
        let base = RolloutFilter {
            limit: 51,
            ..Default::default()
        };
        out.extend([
            ("newest", base.clone()),
            (
                "host",
                RolloutFilter {
                    host: Some(host.clone()),
                    ..base.clone()
                },
            ),
            (
                "host+service",
                RolloutFilter {
                    host: Some(host),
                    service: Some(service.clone()),
                    ..base.clone()
                },
            ),
            (
                "service+cursor",
                RolloutFilter {
                    service: Some(service),
                    before: cursor.clone(),
                    ..base.clone()
                },
            ),
            (
                "status=failed",
                RolloutFilter {
                    status: Some(RolloutStatus::Failed),
                    before: cursor.clone(),
                    ..base.clone()
                },
            ),
            (
                "kind=rollback",
                RolloutFilter {
                    kind: Some(RolloutKind::Rollback),
                    before: cursor.clone(),
                    ..base.clone()
                },
            ),
            (
                "tag",
                RolloutFilter {
                    tag: Some(format!("v0.{}.{}", i / 1000, i % 1000)),
                    ..base.clone()
                },
            ),
            (
                "actor+since",
                RolloutFilter {
                    actor: Some(actor),
                    since: Some(t(i)),
                    ..base.clone()
                },
            ),
            (
                "since+until",
                RolloutFilter {
                    since: Some(t(i)),
                    until: Some(t(i + 2000)),
                    ..base.clone()
                },
            ),
            (
                "cursor (deep page)",
                RolloutFilter {
                    before: cursor,
                    ..base.clone()
                },
            ),
        ]);
    }
    out
}

fn query_string(f: &RolloutFilter) -> String {
    let mut q = vec!["limit=50".to_owned()];
    let enc = |s: &str| s.replace(':', "%3A").replace('~', "%7E");
    if let Some(v) = &f.host {
        q.push(format!("host={v}"));
    }
    if let Some(v) = &f.service {
        q.push(format!("service={v}"));
    }
    if let Some(v) = f.status {
        q.push(format!("status={}", v.as_str()));
    }
    if let Some(v) = f.kind {
        q.push(format!("kind={}", v.as_str()));
    }
    if let Some(v) = &f.tag {
        q.push(format!("tag={v}"));
    }
    if let Some(v) = &f.actor {
        q.push(format!("actor={v}"));
    }
    if let Some(v) = f.since {
        q.push(format!("since={}", enc(&fmt_time(v))));
    }
    if let Some(v) = f.until {
        q.push(format!("until={}", enc(&fmt_time(v))));
    }
    if let Some((t, id)) = &f.before {
        q.push(format!("cursor={}", enc(&format!("{t}~{id}"))));
    }
    q.join("&")
}

fn file_size(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let rollouts: i64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(100_000);
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("audit-bench.db");
    println!("audit bench: {rollouts} rollouts, {STEPS} steps and attempts each");

    let store = Store::open(&db).await?;
    let started = Instant::now();
    let spec = BulkSpec {
        rollouts,
        steps_per_rollout: STEPS,
        hosts: HOSTS,
        services_per_host: SERVICES,
        start_unix: START_UNIX,
        spacing_secs: SPACING_SECS,
    };
    store.bulk_fill(spec).await?;
    store.bulk_checkpoint().await?;
    let size = file_size(&db) + file_size(&db.with_extension("db-wal"));
    println!(
        "fill: {:.1} s; database {:.1} MiB = {:.2} MiB per 1k rollouts",
        started.elapsed().as_secs_f64(),
        size as f64 / 1_048_576.0,
        size as f64 / 1_048_576.0 / (rollouts as f64 / 1000.0)
    );

    // Filtered list, store level: the page query and the steps of its 50 items.
    let mut rng = Lcg(42);
    let shapes = filters(&mut rng, rollouts);
    let mut all = Vec::new();
    let mut by_shape: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
    for (name, f) in &shapes {
        let t = Instant::now();
        let rows = store.list_rollouts(f).await?;
        let ids: Vec<String> = rows.iter().take(50).map(|r| r.id.clone()).collect();
        store.steps_of(&ids).await?;
        let d = t.elapsed();
        all.push(d);
        by_shape.entry(name).or_default().push(d);
    }
    println!(
        "list (store, page of 50 with steps), {} queries: p50 {}, p99 {}",
        all.len(),
        ms(percentile(&mut all, 0.5)),
        ms(percentile(&mut all, 0.99))
    );
    for (name, mut v) in by_shape {
        println!("  {name:<20} p99 {}", ms(percentile(&mut v, 0.99)));
    }

    let mut pages = Vec::new();
    for (_, f) in &shapes {
        let t = Instant::now();
        store.list_rollouts(f).await?;
        pages.push(t.elapsed());
    }
    println!(
        "  of which the page query alone: p50 {}, p99 {}",
        ms(percentile(&mut pages, 0.5)),
        ms(percentile(&mut pages, 0.99))
    );

    // Daemon start: open + migrate + recovery scan, on the filled database.
    store.bulk_checkpoint().await?;
    drop(store);
    let mut starts = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let s = Store::open(&db).await?;
        let unfinished = s.unfinished_rollouts().await?;
        starts.push(t.elapsed());
        anyhow::ensure!(
            unfinished.len() as i64 == HOSTS,
            "the running rollouts are found"
        );
        drop(s);
    }
    println!(
        "daemon start (open + migrate + recovery scan): median {}, max {}",
        ms(percentile(&mut starts, 0.5)),
        ms(percentile(&mut starts, 1.0))
    );

    // The real daemon, over HTTP: list p99 and the CSV export.
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
    let mut all = Vec::new();
    for (_, f) in &shapes {
        let t = Instant::now();
        let res = http
            .get(format!("{url}/v1/rollouts?{}", query_string(f)))
            .send()
            .await?;
        anyhow::ensure!(res.status().is_success(), "list answered {}", res.status());
        res.bytes().await?;
        all.push(t.elapsed());
    }
    println!(
        "list (HTTP, JSON page of 50 with steps), {} requests: p50 {}, p99 {}",
        all.len(),
        ms(percentile(&mut all, 0.5)),
        ms(percentile(&mut all, 0.99))
    );
    let t = Instant::now();
    let csv = http
        .get(format!("{url}/v1/rollouts?format=csv"))
        .send()
        .await?
        .bytes()
        .await?;
    let lines = csv.iter().filter(|b| **b == b'\n').count();
    println!(
        "CSV export (HTTP): {} rows, {:.1} MiB in {}",
        lines.saturating_sub(1),
        csv.len() as f64 / 1_048_576.0,
        ms(t.elapsed())
    );
    let _ = stop.send(());
    let _ = server.await;
    sim.shutdown().await;
    Ok(())
}
