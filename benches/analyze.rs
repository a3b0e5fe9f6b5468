//! The `analyze` step's CPU cost per scrape: parsing one SGLang-sized `/metrics` page
//! (~2,000 series, the simulated engine's page with padding) and taking the three families
//! an analysis reads from it. Target: parsing one page p99 < 5 ms.
//!
//! Knobs: `ANALYZE_SERIES` (default 2000), `ANALYZE_PARSES` (default 1000).

mod common;

use std::process::ExitCode;
use std::time::Instant;

use canaryd::domain::exposition::Page;
use common::{env_usize, pct};

const TARGET_P99_MS: f64 = 5.0;

async fn run() -> anyhow::Result<bool> {
    let series = env_usize("ANALYZE_SERIES", 2_000);
    let parses = env_usize("ANALYZE_PARSES", 1_000).max(1);
    println!("analyze benchmark: {}", common::machine());
    let text = canaryd::sim::example_metrics_page(series);
    let page = Page::parse(&text)?;
    let lines = text.lines().filter(|l| !l.starts_with('#')).count();
    println!(
        "page: {:.0} KiB, {} sample lines, {} series",
        text.len() as f64 / 1024.0,
        lines,
        page.series_count()
    );
    let families = [
        "sglang:time_to_first_token_seconds",
        "sglang:inter_token_latency_seconds",
        "sglang:num_requests_total",
    ];
    let (mut whole_ms, mut scrape_ms) = (Vec::new(), Vec::new());
    for _ in 0..parses {
        // What the analysis does per scrape: the families its checks read.
        let t = Instant::now();
        let page = Page::parse_families(&text, &families)?;
        let ttft = page.histogram(families[0]);
        let itl = page.histogram(families[1]);
        let requests = page.counter(families[2]);
        scrape_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(
            !ttft.is_empty() && !itl.is_empty() && !requests.is_empty(),
            "the families are on the page"
        );
        // Every series of the page, for comparison.
        let t = Instant::now();
        let whole = Page::parse(&text)?;
        whole_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(whole.series_count() > 0, "the page parses");
    }
    let p99 = pct(&scrape_ms, 99.0);
    println!("\n| what | p50 | p99 | max | target |\n|---|---|---|---|---|");
    println!(
        "| one scrape: parse the page's TTFT, ITL and request families and read them ({parses}×) | {:.2} ms | {:.2} ms | {:.2} ms | p99 < {TARGET_P99_MS:.0} ms {} |",
        pct(&scrape_ms, 50.0),
        p99,
        common::max(&scrape_ms),
        if p99 < TARGET_P99_MS { "yes" } else { "NO" }
    );
    println!(
        "| parse every series of the page | {:.2} ms | {:.2} ms | {:.2} ms | |",
        pct(&whole_ms, 50.0),
        pct(&whole_ms, 99.0),
        common::max(&whole_ms)
    );
    Ok(p99 < TARGET_P99_MS)
}

fn main() -> ExitCode {
    // `cargo bench` passes `--bench`; this harness takes its knobs from the environment.
    common::run_main("analyze", "target missed (see the table)", run())
}
