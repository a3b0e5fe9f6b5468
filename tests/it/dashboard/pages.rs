//! The rollout page (`/rollouts/{id}`) and the replica page (`/replicas/{host}/{service}`) in
//! real headless Chromium: every step's bar with its duration and status, a failed analysis
//! drawn with the canary's line above its threshold, a running step's bar growing while the
//! test watches, and the dashboard's links to both pages. With `CANARYD_SCREENSHOTS=1` the
//! pages are saved into `docs/img/` for the user docs.

use std::time::Duration;

use serde_json::{json, Value};

use super::{browser_slot, canary_held_in_health, failed_analysis, Browser, Daemon};
use crate::helpers::{HOST, R1, R2};

/// Saves the page as `docs/img/<name>.png` when CANARYD_SCREENSHOTS=1.
async fn screenshot(browser: &Browser, name: &str) {
    if std::env::var("CANARYD_SCREENSHOTS").as_deref() != Ok("1") {
        return;
    }
    let height = browser
        .eval("return Math.min(document.documentElement.scrollHeight, 4000)")
        .await
        .as_u64()
        .unwrap_or(1200);
    browser
        .call(
            "POST",
            &browser.at("/window/rect"),
            Some(json!({"width": 1280, "height": height + 120})),
        )
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let png = browser.call("GET", &browser.at("/screenshot"), None).await;
    let bytes = base64_decode(png.as_str().expect("base64 PNG"));
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/img");
    std::fs::create_dir_all(&dir).expect("docs/img");
    std::fs::write(dir.join(format!("{name}.png")), bytes).expect("screenshot written");
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let clean: Vec<u8> = text.bytes().filter(|c| *c != b'=' && *c != b'\n').collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let v: Vec<u32> = chunk.iter().map(|c| u32::from(value(*c))).collect();
        let n = v
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, x)| n | (x << (18 - 6 * i)));
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

/// `[[x, y], ...]` of a drawn polyline of chart `check`.
fn line(check: &str, name: &str) -> String {
    format!(
        "const e = document.querySelector('figure[data-chart=\"{check}\"] polyline[data-line=\"{name}\"]'); \
         return e && {{points: e.getAttribute('points').split(' ').map(p => p.split(',').map(Number)), \
                      times: e.getAttribute('data-times').split(',').map(Number), \
                      values: e.getAttribute('data-values').split(',').map(Number)}};"
    )
}

#[tokio::test]
async fn a_finished_canarys_page_shows_every_step_bar_with_its_duration_and_status_and_is_linked() {
    let Some(slot) = browser_slot("the rollout page test").await else {
        return;
    };
    let daemon = Daemon::start(Vec::new()).await;
    let id = daemon.start_canary("v0.0.451", None).await;
    let r = daemon
        .wait_rollout(&id, None, |r| r["status"] == "succeeded")
        .await;
    let steps = r["steps"].as_array().expect("steps");

    let browser = slot.browser().await;
    // From the dashboard: the history row's id links to the page.
    browser.open(&format!("{}/", daemon.url)).await;
    let href = browser
        .wait_for(
            "the history row's link",
            &format!("const e = document.querySelector('[data-history=\"{id}\"] a[data-page-link]'); return e && e.getAttribute('href');"),
            |v| v.is_string(),
        )
        .await;
    assert_eq!(href, format!("/rollouts/{id}"));
    // The replica row links the rollout that deployed what runs, and the replica's page.
    let deployed_by = browser
        .wait_for(
            "r2's deploying rollout linked",
            &format!("const e = document.querySelector('[data-replica=\"{HOST}/{R2}\"] [data-field=deployed-by] a'); return e && e.getAttribute('href');"),
            |v| v.is_string(),
        )
        .await;
    assert_eq!(deployed_by, format!("/rollouts/{id}"));
    browser
        .click(&format!("[data-history=\"{id}\"] a[data-page-link]"))
        .await;

    let shown = browser
        .wait_for(
            "every step on the timeline",
            "return [...document.querySelectorAll('#timeline details[data-step]')].map(d => ({name: d.getAttribute('data-step'), status: d.getAttribute('data-status'), ms: Number(d.getAttribute('data-duration-ms')), bar: (() => { const b = d.querySelector('rect.step-bar'); return b ? Number(b.getAttribute('width')) : null; })(), label: d.querySelector('[data-label]').textContent, color: getComputedStyle(d.querySelector('[data-label]')).color}))",
            |v| v.as_array().is_some_and(|a| a.len() == steps.len()),
        )
        .await;
    assert_eq!(
        browser.eval("return location.pathname").await,
        format!("/rollouts/{id}"),
        "the link is a real link"
    );
    // The replica's downtime, as the API gives it, with its parts.
    let total = r["downtime"]["total_ms"].as_i64().expect("a downtime");
    let down = browser
        .eval("const e = document.querySelector('[data-field=\"replica down\"] [data-downtime]'); return e && {ms: Number(e.getAttribute('data-downtime')), text: e.textContent};")
        .await;
    assert_eq!(down["ms"].as_i64(), Some(total), "{down}");
    let text = down["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("cold start")
            && text.contains("down call ")
            && text.contains("pull and build "),
        "{text}"
    );
    // The timeline shades the same span behind every step: from the down step's start to
    // the health wait's end, at most.
    let band = browser
        .eval("return [...document.querySelectorAll('#timeline rect.out')].map(b => ({x: Number(b.getAttribute('x')), w: Number(b.getAttribute('width'))})).concat([...['down', 'health'].map(n => { const b = document.querySelector('#timeline [data-step=\"' + n + '\"] rect.step-bar'); return {x: Number(b.getAttribute('x')), w: Number(b.getAttribute('width'))}; })])")
        .await;
    let band = band.as_array().expect("bands");
    assert_eq!(
        band.len(),
        steps.len() + 2,
        "a band on every step's row: {band:?}"
    );
    let (x, w) = (
        band[0]["x"].as_f64().expect("x"),
        band[0]["w"].as_f64().expect("w"),
    );
    assert!(
        band[..steps.len()].iter().all(|b| b == &band[0]),
        "{band:?}"
    );
    let (down, health) = (&band[steps.len()], &band[steps.len() + 1]);
    let end_of =
        |b: &serde_json::Value| b["x"].as_f64().unwrap_or(0.0) + b["w"].as_f64().unwrap_or(0.0);
    assert!(w > 0.0, "{band:?}");
    assert!(
        x + 0.5 >= down["x"].as_f64().unwrap_or(0.0),
        "starts at the down: {band:?}"
    );
    assert!(
        x + w <= end_of(health) + 0.5,
        "ends by the health wait's end: {band:?}"
    );
    for (s, want) in shown.as_array().expect("steps").iter().zip(steps) {
        let name = want["name"].as_str().expect("name");
        assert_eq!(s["name"], want["name"]);
        assert_eq!(s["status"], "succeeded", "{name}: {s}");
        let bar = s["bar"]
            .as_f64()
            .unwrap_or_else(|| panic!("{name} has no bar: {s}"));
        assert!(bar >= 2.0, "{name}: a bar of width {bar}");
        let label = s["label"].as_str().expect("label");
        assert!(label.starts_with("succeeded · "), "{name}: {label}");
        assert!(
            label.ends_with(" ms") || label.ends_with(" s"),
            "{name}: {label}"
        );
        assert_eq!(
            s["color"], "rgb(26, 127, 55)",
            "{name}: green as well as labelled"
        );
        // Its duration is the API's, to the millisecond.
        let api_ms =
            (chrono::DateTime::parse_from_rfc3339(want["finished_at"].as_str().expect("end"))
                .expect("time")
                - chrono::DateTime::parse_from_rfc3339(
                    want["started_at"].as_str().expect("start"),
                )
                .expect("time"))
            .num_milliseconds();
        assert_eq!(s["ms"].as_i64(), Some(api_ms), "{name}");
    }
    // The longest step's bar is the widest: drawn to scale.
    let rows = shown.as_array().expect("steps");
    let longest = rows
        .iter()
        .max_by_key(|s| s["ms"].as_i64())
        .expect("a step");
    let widest = rows
        .iter()
        .max_by(|a, b| {
            a["bar"]
                .as_f64()
                .partial_cmp(&b["bar"].as_f64())
                .expect("numbers")
        })
        .expect("a step");
    assert_eq!(longest["name"], widest["name"]);
    // A step opens with Enter to its evidence: the up step's compose call.
    browser
        .eval("document.querySelector('[data-step-summary=\"up\"]').focus(); return 0")
        .await;
    let summary = browser.element("[data-step-summary=\"up\"]").await;
    browser
        .call(
            "POST",
            &browser.at(&format!("/element/{summary}/value")),
            Some(json!({"text": "\u{E007}"})),
        )
        .await;
    let call = browser
        .wait_for(
            "the up step's compose call",
            "const e = document.querySelector('[data-evidence=\"up\"] [data-call=\"1\"]'); return e && e.textContent;",
            |v| v.is_string(),
        )
        .await;
    assert!(
        call.as_str()
            .is_some_and(|t| t.contains("compose/up") && t.contains("succeeded")),
        "{call}"
    );
    screenshot(&browser, "rollout-page").await;

    // The replica's page: the deployment this canary made, and what a rollback redeploys.
    browser
        .click(&format!("[data-replica-link=\"{HOST}/{R2}\"]"))
        .await;
    let by = browser
        .wait_for(
            "the replica's deployments",
            "const e = document.querySelector('#deployments tr a[data-rollout-link]'); return e && e.getAttribute('data-rollout-link');",
            |v| v.is_string(),
        )
        .await;
    assert_eq!(by, Value::String(id.clone()));
    assert_eq!(
        browser
            .eval("const e = document.querySelector('[data-rollback-to]'); return e && e.getAttribute('data-rollback-to');")
            .await,
        "v0.0.450",
        "a rollback redeploys the tag before the canary"
    );
    screenshot(&browser, "replica-page").await;
    browser.quit().await;
    daemon.stop().await;
}

#[tokio::test]
async fn a_failed_analysis_is_drawn_with_the_canarys_line_above_its_threshold() {
    let Some(slot) = browser_slot("the analysis chart test").await else {
        return;
    };
    let (daemon, r) = failed_analysis("2s").await;
    let id = r["id"].as_str().expect("id").to_owned();

    let browser = slot.browser().await;
    browser.open(&format!("{}/rollouts/{id}", daemon.url)).await;
    browser
        .wait_for(
            "the ttft_p95 chart",
            "const e = document.querySelector('figure[data-chart=\"ttft_p95\"]'); return e && e.getAttribute('data-verdict');",
            |v| v == "fail",
        )
        .await;
    let target = browser.eval(&line("ttft_p95", "target")).await;
    let threshold = browser.eval(&line("ttft_p95", "threshold")).await;
    let peer = browser.eval(&line("ttft_p95", &format!("peer:{R1}"))).await;
    let points = |v: &Value, key: &str| -> Vec<Value> {
        v[key]
            .as_array()
            .unwrap_or_else(|| panic!("no {key} in {v}"))
            .clone()
    };
    let (t_times, t_values, t_xy) = (
        points(&target, "times"),
        points(&target, "values"),
        points(&target, "points"),
    );
    let (h_times, h_values, h_xy) = (
        points(&threshold, "times"),
        points(&threshold, "values"),
        points(&threshold, "points"),
    );
    assert!(t_times.len() >= 5, "a point per interval: {target}");
    assert_eq!(t_times, h_times, "the threshold is drawn at every interval");
    assert_eq!(points(&peer, "times"), t_times);
    let peer_values = points(&peer, "values");
    for i in 0..t_times.len() {
        let (tv, hv, pv) = (
            t_values[i].as_f64().expect("n"),
            h_values[i].as_f64().expect("n"),
            peer_values[i].as_f64().expect("n"),
        );
        assert!(
            (hv - 1.2 * pv).abs() < 1e-9,
            "threshold = 1.2 × the peer: {hv} {pv}"
        );
        assert!(
            tv > hv,
            "interval {i}: the canary {tv} is above the threshold {hv}"
        );
        // As drawn: same x, and the canary's y is above (smaller in SVG) the threshold's.
        assert_eq!(t_xy[i][0], h_xy[i][0], "interval {i}");
        assert!(
            t_xy[i][1].as_f64() < h_xy[i][1].as_f64(),
            "interval {i}: drawn above: {} vs {}",
            t_xy[i][1],
            h_xy[i][1]
        );
    }
    // Its stored series are what is drawn.
    let analysis = r["steps"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "analysis"))
        .expect("the analysis step");
    let stored: Vec<Value> = analysis["detail"]["series"]["ttft_p95"]["points"][R2]
        .as_array()
        .expect("stored series")
        .iter()
        .filter(|p| !p[1].is_null())
        .map(|p| p[1].clone())
        .collect();
    assert_eq!(stored, t_values, "the drawn values are the stored ones");
    let warmup = browser
        .eval("const e = document.querySelector('figure[data-chart=\"ttft_p95\"] [data-shade=warmup]'); return e && Number(e.getAttribute('width'));")
        .await;
    assert!(
        warmup.as_f64().is_some_and(|w| w > 0.0),
        "the warm-up is shaded: {warmup}"
    );
    let verdict = browser
        .eval("return document.querySelector('figure[data-chart=\"ttft_p95\"] [data-label=verdict]').textContent")
        .await;
    let ratio = analysis["detail"]["checks"][0]["ratio"]
        .as_f64()
        .expect("ratio");
    assert_eq!(
        verdict,
        Value::String(format!("FAIL · {ratio:.3}× (limit 1.2×)")),
        "the verdict and ratio are written on the chart"
    );
    let bars = browser
        .eval("return document.querySelectorAll('figure[data-chart=\"took_traffic\"] rect[data-bar]').length")
        .await;
    assert!(
        bars.as_u64().is_some_and(|n| n >= 10),
        "a counter is drawn as bars: {bars}"
    );
    // Every bar inside the plot (x from 56 to 548 of 560): none over the axis labels.
    let outside = browser
        .eval(
            "return [...document.querySelectorAll('figure[data-chart=\"took_traffic\"] rect[data-bar]')]\
             .filter(b => Number(b.getAttribute('x')) < 56 || Number(b.getAttribute('x')) + Number(b.getAttribute('width')) > 548.05)\
             .map(b => b.getAttribute('x') + '+' + b.getAttribute('width'));",
        )
        .await;
    assert_eq!(outside, serde_json::json!([]), "bars outside the plot");
    // Round ticks, with a unit on the latency axis.
    let ticks = browser
        .eval(
            "return [...document.querySelectorAll('figure[data-chart=\"ttft_p95\"] [data-tick]')]\
             .map(t => [Number(t.getAttribute('data-tick')), t.textContent]);",
        )
        .await;
    let ticks = ticks.as_array().expect("ticks").clone();
    assert_eq!(ticks.len(), 3, "{ticks:?}");
    let top = ticks
        .iter()
        .filter_map(|t| t[0].as_f64())
        .fold(0.0, f64::max);
    let mantissa = top / 10f64.powf(top.log10().floor());
    assert!(
        [1.0, 2.0, 4.0, 5.0]
            .iter()
            .any(|m| (mantissa - m).abs() < 1e-6),
        "the top tick {top} is round: {ticks:?}"
    );
    for t in &ticks {
        let text = t[1].as_str().unwrap_or_default();
        assert!(
            text.ends_with(" ms") || text.ends_with(" s"),
            "a unit: {ticks:?}"
        );
        assert!(text.len() <= 8, "rounded: {ticks:?}");
    }
    // The timeline's legend draws its swatches as the bars are drawn.
    let legend = browser
        .eval(
            "const css = (sel, prop) => { const e = document.querySelector(sel); return e ? getComputedStyle(e)[prop] : null; };\
             return {\
               swatch_ok: css('.legend .swatch.succeeded', 'backgroundColor'), bar_ok: css('rect.step-bar.succeeded', 'fill'),\
               swatch_bad: css('.legend .swatch.failed', 'backgroundColor'), bar_bad: css('rect.step-bar.failed', 'fill'),\
               swatch_wait: css('.legend .swatch.wait', 'borderTopColor'), bar_wait: css('rect.step-bar.wait.succeeded', 'stroke')};",
        )
        .await;
    for (swatch, bar) in [
        ("swatch_ok", "bar_ok"),
        ("swatch_bad", "bar_bad"),
        ("swatch_wait", "bar_wait"),
    ] {
        assert!(legend[swatch].is_string(), "{legend}");
        assert_eq!(
            legend[swatch], legend[bar],
            "{swatch} is drawn like {bar}: {legend}"
        );
    }
    // The on-call hint keeps the star of `detail.replicas.*.last_error`.
    let hint = browser
        .eval("const h = document.querySelector('[data-hint]'); return h && h.textContent;")
        .await;
    assert!(
        hint.as_str()
            .is_some_and(|h| h.contains("detail.replicas.*.last_error")),
        "{hint}"
    );
    screenshot(&browser, "rollout-failed-analysis").await;
    // The replica's page lists the failed canary between the deployment before it and the one
    // its rollback made, marked as rolled back.
    let rb = r["rolled_back_by"]
        .as_str()
        .expect("rolled back")
        .to_owned();
    browser
        .open(&format!("{}/replicas/{HOST}/{R2}", daemon.url))
        .await;
    let rows = browser
        .wait_for(
            "the failed canary among the deployments",
            "const rows = [...document.querySelectorAll('#deployments tr')]; return rows.some(r => r.hasAttribute('data-attempt')) ? rows.map(r => [r.getAttribute('data-attempt') || r.getAttribute('data-deployment'), r.textContent]) : null;",
            |v| v.is_array(),
        )
        .await;
    let rows = rows.as_array().expect("rows");
    let at = rows
        .iter()
        .position(|r| r[0] == id.as_str())
        .unwrap_or_else(|| panic!("{rows:?}"));
    assert!(
        at >= 1 && at + 1 < rows.len(),
        "between two deployments: {rows:?}"
    );
    let text = rows[at][1].as_str().unwrap_or_default();
    assert!(
        text.contains("canary failed")
            && text.contains(&format!("rolled back by {rb}"))
            && text.contains("analysis_failed"),
        "{text}"
    );
    assert!(
        rows[at - 1][1]
            .as_str()
            .is_some_and(|t| t.contains("rollback") && t.contains(&rb)),
        "the rollback's deployment above it: {rows:?}"
    );
    // A rollout that does not exist, on a daemon without tokens: not found, no token asked.
    browser
        .open(&format!("{}/rollouts/ro_doesnotexist", daemon.url))
        .await;
    let said = browser
        .wait_for(
            "the page's message",
            "const m = document.getElementById('message').textContent; return m ? m : null;",
            |v| v.is_string(),
        )
        .await;
    let said = said.as_str().unwrap_or_default();
    assert!(said.contains("not_found"), "{said}");
    assert!(!said.contains("API token"), "{said}");
    browser.quit().await;
    daemon.stop().await;
}

#[tokio::test]
async fn a_running_rollouts_timeline_grows_while_the_test_watches() {
    let Some(slot) = browser_slot("the live timeline test").await else {
        return;
    };
    let (daemon, id) = canary_held_in_health().await;
    let browser = slot.browser().await;
    browser.open(&format!("{}/rollouts/{id}", daemon.url)).await;
    let bar = "const d = document.querySelector('details[data-step=\"health\"]'); const b = d && d.querySelector('rect.step-bar'); \
               return b && d.getAttribute('data-status') === 'running' ? {ms: Number(b.getAttribute('data-duration-ms')), width: Number(b.getAttribute('width'))} : null;";
    let first = browser
        .wait_for("the running health step's bar", bar, |v| v.is_object())
        .await;
    // Bounded: up to 300 × 50 ms for the bar to grow by a second.
    let later = browser
        .wait_for("the bar grown by a second", bar, |v| {
            v["ms"].as_f64().unwrap_or(0.0) >= first["ms"].as_f64().unwrap_or(0.0) + 1000.0
        })
        .await;
    assert!(
        later["width"].as_f64() > first["width"].as_f64(),
        "the running bar is drawn longer: {first} then {later}"
    );
    // The engine comes up: the same page (no reload) follows the rollout to its end.
    daemon.sim.faults().set_health_never(R2, false);
    browser
        .wait_for(
            "the rollout succeeded on the page",
            "const e = document.querySelector('#status [data-status]'); return e && e.getAttribute('data-status');",
            |v| v == "succeeded",
        )
        .await;
    assert_eq!(
        browser
            .eval("return document.querySelector('details[data-step=\"soak\"]').getAttribute('data-status')")
            .await,
        "succeeded"
    );
    browser.quit().await;
    daemon.stop().await;
}

#[tokio::test]
async fn a_stall_block_is_shown_whole_downloadable_and_with_the_proxys_lines() {
    let Some(slot) = browser_slot("the stall block test").await else {
        return;
    };
    let soak = r#"  - {name: soak, kind: soak, duration: 300ms, interval: 50ms, max_misses: 3, forbid: ["[event-loop-stall]", "CUDA error"]}"#;
    let watched = r#"  - {name: soak, kind: soak, duration: 5s, interval: 50ms, max_misses: 3, forbid: ["[event-loop-stall]"], watch: {service: proxy-glm53, patterns: ["Backend marked unhealthy"], max: 5}}"#;
    let daemon = Daemon::start_with_canary(Vec::new(), |t| {
        assert!(t.contains(soak), "the canary has its soak");
        t.replace(soak, watched)
    })
    .await;
    let id = daemon.start_canary("v0.0.452", None).await;
    daemon
        .wait_rollout(&id, None, |r| {
            r["steps"].as_array().is_some_and(|s| {
                s.iter()
                    .any(|s| s["name"] == "soak" && s["status"] == "running")
            })
        })
        .await;
    let faults = daemon.sim.faults();
    faults.emit_log_line(
        "proxy-glm53",
        &format!("Backend marked unhealthy: {R2} (3 misses)"),
    );
    faults.emit_stall_block(R2);
    daemon
        .wait_rollout(&id, None, |r| r["status"] == "failed")
        .await;

    let browser = slot.browser().await;
    browser.open(&format!("{}/rollouts/{id}", daemon.url)).await;
    let block = browser
        .wait_for(
            "the stall block",
            "const e = document.querySelector('[data-block=\"soak\"]'); return e && e.textContent;",
            |v| v.is_string(),
        )
        .await;
    let block = block.as_str().unwrap_or_default();
    assert!(
        block.contains("[event-loop-stall]")
            && block.contains("Thread 0x7f3a")
            && block.contains("threading.py"),
        "{block}"
    );
    let href = browser
        .eval("const a = document.querySelector('[data-download=\"soak-block.txt\"]'); return a && a.getAttribute('href');")
        .await;
    assert!(
        href.as_str()
            .is_some_and(|h| h.starts_with("data:text/plain") && h.contains("event-loop-stall")),
        "{href}"
    );
    let around = browser
        .eval("const e = document.querySelector('[data-companion-lines=\"soak\"]'); return e && e.textContent;")
        .await;
    assert!(
        around.as_str().is_some_and(|t| t.contains("(3 misses)")),
        "{around}"
    );
    browser.quit().await;
    daemon.stop().await;
}
