//! Containers coming and going, and the simulated engines inside them: each engine service
//! has one loopback port for the host's whole life, answering `/health` 503 while its
//! container is absent, exited or cold-starting (or forever, with `set_health_never`) and
//! 200 once ready; its log grows over the cold start and keeps growing afterwards. The same
//! port serves the engine's OpenAI-compatible API (`openai.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use chrono::Utc;
use tokio::time::Instant;

use super::compose_file::{is_replica_name, ComposeFile, ServiceDef};
use super::dry_run::{Change, Desired, Step};
use super::state::{Container, Shared};

/// How often a ready engine logs a decode batch.
const DECODE_EVERY: Duration = Duration::from_millis(200);
/// What the fake host reports as available RAM for a percentage budget.
const AVAILABLE_BYTES: u64 = 1_114_550_976_512;
const RESERVE_BYTES: u64 = 10 * (1 << 30);

/// Whether a service runs a simulated engine: it has a tensor-parallel flag, or it is a
/// `model-*` replica. (`model-downloader` is neither.)
pub(crate) fn is_engine(def: &ServiceDef) -> bool {
    tp_of(def.command.as_deref().unwrap_or_default()).is_some()
        || (def.name.starts_with("model-") && is_replica_name(&def.name))
}

/// Whether a service runs to completion instead of staying up (`restart: "no"`).
pub(crate) fn is_one_shot(def: &ServiceDef) -> bool {
    def.raw.get("restart").and_then(|v| v.as_str()) == Some("no")
}

/// The tensor-parallel size from `--tp N`, `--tp-size N`, `--tensor-parallel-size N` or
/// their `=N` forms.
pub(crate) fn tp_of(command: &str) -> Option<u64> {
    let words: Vec<&str> = command.split_whitespace().collect();
    const FLAGS: [&str; 3] = ["--tp", "--tp-size", "--tensor-parallel-size"];
    words.iter().enumerate().find_map(|(i, w)| {
        if FLAGS.contains(w) {
            return words.get(i + 1).and_then(|n| n.parse().ok());
        }
        let (flag, value) = w.split_once('=')?;
        FLAGS.contains(&flag).then(|| value.parse().ok()).flatten()
    })
}

/// A HiCache budget (`406GiB`, `500GB`, `80%`, plain bytes) in bytes.
pub(crate) fn budget_bytes(value: &str) -> Option<u64> {
    let v = value.trim();
    if let Some(pct) = v.strip_suffix('%') {
        let pct: f64 = pct.trim().parse().ok()?;
        return (0.0..=100.0)
            .contains(&pct)
            .then(|| (AVAILABLE_BYTES as f64 * pct / 100.0) as u64);
    }
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (number, unit) = v.split_at(split);
    let number: f64 = number.parse().ok()?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => return None,
    };
    Some((number * scale as f64) as u64)
}

/// The usual engine startup lines, each with the fraction of the cold start it appears at.
fn default_startup(c: &Container) -> Vec<(f64, String)> {
    let tp = tp_of(&c.command).unwrap_or(1);
    let mut lines = vec![
        (0.0, format!("Init torch distributed begin. tp_size={tp}")),
        (0.1, "Load weight begin. avail mem=139.05 GB".to_string()),
        (
            0.3,
            "Load weight end. type=GlmMoeDsaForCausalLM, avail mem=97.61 GB".to_string(),
        ),
    ];
    if let Some(budget) = c.env.get("SGLANG_HICACHE_RAM_BUDGET") {
        match budget_bytes(budget) {
            Some(total) => {
                lines.push((
                    0.4,
                    format!(
                        "HiCache startup RAM: config={budget} available_bytes={AVAILABLE_BYTES} \
                         total_budget_bytes={total} ranks={tp} rank_budget_bytes={} \
                         reserve_bytes={RESERVE_BYTES}",
                        total / tp.max(1)
                    ),
                ));
                lines.push((0.5, "HiCache startup RAM allocated".to_string()));
            }
            None => lines.push((
                0.4,
                format!("HiCache startup RAM: invalid SGLANG_HICACHE_RAM_BUDGET={budget:?}"),
            )),
        }
    }
    lines.push((
        0.7,
        "Capture cuda graph end. Time elapsed: 41.27 s.".to_string(),
    ));
    lines.push((
        0.9,
        "event-loop stall dump armed: stall=30s repeat=60s (pid 1, loop thread 0x7f3a2c1fe740)"
            .to_string(),
    ));
    lines.push((1.0, "The server is fired up and ready to roll!".to_string()));
    lines
}

fn stamp(line: &str) -> String {
    format!("[{} TP0] {line}", Utc::now().format("%Y-%m-%d %H:%M:%S"))
}

/// Startup lines of a service that is not an engine (written at once).
fn plain_startup(service: &str, one_shot: bool) -> Vec<String> {
    if service.ends_with("perception-check") {
        // The perception check qualifies the replicas and prints its verdict as one JSON line.
        return vec![
            format!("{service}: started"),
            r#"{"event": "qualification_finished", "ok": true, "replicas": 2}"#.to_string(),
        ];
    }
    if one_shot {
        return vec![
            format!("{service}: starting"),
            "Downloading graphistry/GLM-5.3-Flash-W4AFP8...".to_string(),
            "Download complete.".to_string(),
        ];
    }
    vec![format!("{service}: started"), format!("{service}: ready")]
}

/// How a container is started by [`apply_steps`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StartMode {
    /// Started now, engines cold-start.
    Normal,
    /// Already warm: started an hour ago, engines ready, startup lines already logged.
    Warm,
    /// Created but never started (the `up` phase failed).
    CreateOnly,
}

/// Applies planned changes to the containers and starts the engines' log writers.
pub(crate) fn apply_steps(
    shared: &Arc<Shared>,
    file: &ComposeFile,
    steps: &[Step],
    desired: &BTreeMap<String, Desired>,
    tag: &str,
    mode: StartMode,
) {
    let mut writers = Vec::new();
    let mut downloads = Vec::new();
    {
        let mut st = shared.state();
        let cold = st.faults.cold_start;
        for step in steps {
            let def = file.services.get(&step.service);
            let one_shot = def.is_some_and(is_one_shot);
            let engine = def.is_some_and(is_engine);
            // A downloader with a download to make runs a changed command (the tag added the
            // download): compose recreates it, with a log of its own.
            let change = match step.change {
                Change::Start if one_shot && pending_download(&st).is_some() => Change::Recreate,
                other => other,
            };
            match change {
                Change::Keep => continue,
                Change::RemoveOrphan => {
                    st.containers.remove(&step.service);
                    continue;
                }
                Change::Create | Change::Recreate => {
                    let Some(want) = desired.get(&step.service) else {
                        continue;
                    };
                    let id = st.new_id(&step.service);
                    let now = Utc::now();
                    let c = Container {
                        service: step.service.clone(),
                        name: want.container.clone(),
                        id,
                        image: want.image.clone(),
                        running: false,
                        created_at: now,
                        started_at: now,
                        tag: tag.to_string(),
                        fingerprint: want.fingerprint.clone(),
                        env: want.env.clone(),
                        command: want.command.clone(),
                        ready_at: Instant::now(),
                        generation: 0,
                        log: Default::default(),
                    };
                    st.containers.insert(step.service.clone(), c);
                }
                Change::Start => {}
            }
            if mode == StartMode::CreateOnly {
                continue;
            }
            st.gen_seq += 1;
            let generation = st.gen_seq;
            let Some(c) = st.containers.get_mut(&step.service) else {
                continue;
            };
            let (started_at, ready_at) = match mode {
                StartMode::Warm => (Utc::now() - chrono::Duration::hours(1), Instant::now()),
                _ => (
                    Utc::now(),
                    Instant::now() + if engine { cold } else { Duration::ZERO },
                ),
            };
            c.started_at = started_at;
            c.ready_at = ready_at;
            c.generation = generation;
            c.running = !one_shot;
            if mode == StartMode::Warm && change != Change::Start {
                c.created_at = started_at;
            }
            if engine {
                writers.push((step.service.clone(), generation, mode == StartMode::Warm));
            } else {
                // `SimFaults::set_logs_on_start` replaces a plain service's lines too (the
                // perception check's failing verdict).
                let lines = st.faults.logs_on_start.get(&step.service).cloned();
                // A downloader with a download to make logs its end when it is done.
                let download = one_shot
                    .then(|| pending_download(&st))
                    .flatten()
                    .filter(|_| lines.is_none());
                let Some(c) = st.containers.get_mut(&step.service) else {
                    continue;
                };
                let lines = match &download {
                    Some((repo, ..)) => vec![
                        format!("{}: starting", step.service),
                        format!("Downloading {repo}..."),
                    ],
                    None => lines.unwrap_or_else(|| plain_startup(&step.service, one_shot)),
                };
                for line in lines {
                    c.push_log(line);
                }
                if let Some((repo, time, bytes)) = download {
                    c.running = true;
                    downloads.push((step.service.clone(), generation, repo, time, bytes));
                }
            }
        }
    }
    for (service, generation, warm) in writers {
        tokio::spawn(write_engine_log(shared.clone(), service, generation, warm));
    }
    for (service, generation, repo, time, bytes) in downloads {
        tokio::spawn(finish_download(
            shared.clone(),
            service,
            generation,
            repo,
            time,
            bytes,
        ));
    }
}

/// The cache directory of a Hugging Face repo, as `/host/cache` lists it.
pub(crate) fn cache_dir(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

/// The download the downloader would make now (`SimFaults::set_download`), unless cached.
pub(crate) fn pending_download(st: &super::state::State) -> Option<(String, Duration, u64)> {
    st.faults
        .download
        .clone()
        .filter(|(repo, _, _)| !st.cached_weights.contains(&cache_dir(repo)))
}

/// Marks a finished download: the repo cached, its bytes used on the model cache.
pub(crate) fn cache_download(st: &mut super::state::State, repo: &str, bytes: u64) {
    let dir = cache_dir(repo);
    if !st.cached_weights.contains(&dir) {
        st.cached_weights.push(dir);
        *st.cache_volumes
            .entry(super::state::HF_VOLUME.to_owned())
            .or_default() += bytes;
    }
}

/// A downloader started alone: after `time`, `Download complete.` in its log (unless it was
/// recreated meanwhile) and the repo cached.
async fn finish_download(
    shared: Arc<Shared>,
    service: String,
    generation: u64,
    repo: String,
    time: Duration,
    bytes: u64,
) {
    tokio::time::sleep(time).await;
    let mut st = shared.state();
    let Some(c) = st
        .containers
        .get_mut(&service)
        .filter(|c| c.generation == generation)
    else {
        return;
    };
    c.push_log("Download complete.".to_owned());
    c.running = false;
    cache_download(&mut st, &repo, bytes);
}

/// Writes an engine's startup lines over its cold start, then a decode line every 200 ms,
/// until the container is recreated or removed or the host shuts down.
async fn write_engine_log(shared: Arc<Shared>, service: String, generation: u64, warm: bool) {
    let start = Instant::now();
    let (lines, cold) = {
        let st = shared.state();
        let Some(c) = st.containers.get(&service) else {
            return;
        };
        let cold = if warm {
            Duration::ZERO
        } else {
            c.ready_at.saturating_duration_since(start)
        };
        let lines = match st.faults.logs_on_start.get(&service) {
            Some(custom) => {
                let n = custom.len().max(1) as f64;
                custom
                    .iter()
                    .enumerate()
                    .map(|(i, l)| ((i + 1) as f64 / n, l.clone()))
                    .collect()
            }
            None => default_startup(c)
                .into_iter()
                .map(|(f, l)| (f, stamp(&l)))
                .collect::<Vec<_>>(),
        };
        (lines, cold)
    };
    let mut shutdown = shared.shutdown.clone();
    for (fraction, line) in lines {
        let at = start + cold.mul_f64(fraction);
        tokio::select! {
            _ = tokio::time::sleep_until(at) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        if !append_if_current(&shared, &service, generation, line) {
            return;
        }
    }
    for n in 1u64.. {
        tokio::select! {
            _ = tokio::time::sleep(DECODE_EVERY) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        let line = stamp(&format!(
            "Decode batch. #running-req: {}, #token: {}, token usage: 0.{:02}, cuda graph: True, \
             gen throughput (token/s): {}.{:02}, #queue-req: 0",
            n % 7 + 1,
            4096 + (n * 37) % 60_000,
            n % 90,
            180 + n % 50,
            n % 100
        ));
        if !append_if_current(&shared, &service, generation, line) {
            return;
        }
    }
}

fn append_if_current(shared: &Shared, service: &str, generation: u64, line: String) -> bool {
    let mut st = shared.state();
    match st.containers.get_mut(service) {
        Some(c) if c.generation == generation && c.running => {
            c.push_log(line);
            true
        }
        _ => false,
    }
}

/// Whether the engine of `service` answers `/health` with 200 right now.
pub(crate) fn engine_ready(shared: &Shared, service: &str) -> bool {
    let mut st = shared.state();
    let ready = !st.faults.health_never.contains(service)
        && st
            .containers
            .get(service)
            .is_some_and(|c| c.running && Instant::now() >= c.ready_at);
    if ready && st.faults.health_flap.contains(service) {
        st.faults.flap_seq += 1;
        return st.faults.flap_seq.is_multiple_of(2);
    }
    ready
}

/// What an engine's handlers know: the host and which services answer on their port (one,
/// or a renamed replica's names: [`SimConfig::port_aliases`](super::SimConfig)).
#[derive(Clone)]
pub(super) struct EngineCtx {
    pub shared: Arc<Shared>,
    pub names: Vec<String>,
}

impl EngineCtx {
    /// The service the port serves now: of its names, the one with a running container,
    /// else one with a container, else the first.
    pub fn service_with(&self, st: &super::state::State) -> String {
        let container = |running: bool| {
            self.names
                .iter()
                .find(|n| st.containers.get(*n).is_some_and(|c| c.running || !running))
        };
        container(true)
            .or_else(|| container(false))
            .or(self.names.first())
            .cloned()
            .unwrap_or_default()
    }

    /// [`Self::service_with`] on the current state.
    pub fn service(&self) -> String {
        if let [one] = self.names.as_slice() {
            return one.clone();
        }
        self.service_with(&self.shared.state())
    }
}

pub(crate) async fn health(State(ctx): State<EngineCtx>) -> StatusCode {
    let service = ctx.service();
    let status = if engine_ready(&ctx.shared, &service) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    ctx.shared
        .state()
        .record_engine_read(&service, "/health", status.as_u16());
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tensor_parallel_size_is_read_from_any_spelling() {
        let cases = [
            ("sglang serve --tp 4 --port 8000", Some(4)),
            ("sglang serve --tp-size 2", Some(2)),
            ("vllm serve --tensor-parallel-size 8", Some(8)),
            ("x --tp=4", Some(4)),
            ("x --tp", None),
            ("x --tpx 4", None),
            ("sh -c 'echo hi'", None),
        ];
        for (command, want) in cases {
            assert_eq!(tp_of(command), want, "{command}");
        }
    }

    #[test]
    fn hicache_budgets_resolve_to_bytes() {
        assert_eq!(budget_bytes("406GiB"), Some(435_939_180_544));
        assert_eq!(budget_bytes("406GiB").map(|b| b / 4), Some(108_984_795_136));
        assert_eq!(budget_bytes("650GiB").map(|b| b / 4), Some(174_483_046_400));
        assert_eq!(budget_bytes("1GB"), Some(1_000_000_000));
        assert_eq!(budget_bytes("1024"), Some(1024));
        assert_eq!(budget_bytes("80%"), Some(891_640_781_209));
        assert_eq!(budget_bytes("lots"), None);
        assert_eq!(budget_bytes("406 parsecs"), None);
        assert_eq!(budget_bytes("120%"), None);
    }
}
