//! Scriptable faults: a handle that tests and `canaryd dev` use to make the simulated host
//! misbehave while it runs.
//!
//! Which faults last:
//! - one-shot (consumed by the next stream of that operation that passes validation):
//!   [`SimFaults::fail_phase`], [`SimFaults::cut_stream`], [`SimFaults::cut_after_lines`],
//!   [`SimFaults::stall_stream`], [`SimFaults::garbage_line`];
//! - counted (the next `n` requests of an operation, before any validation but auth):
//!   [`SimFaults::answer_status`], [`SimFaults::delay_answer`];
//! - sticky: [`SimFaults::set_line_delay`], [`SimFaults::set_health_flap`];
//! - sticky until changed: [`SimFaults::move_tag`], [`SimFaults::set_dry_run_extra`], [`SimFaults::set_dry_run_removal`],
//!   [`SimFaults::set_health_never`], [`SimFaults::set_cold_start`], [`SimFaults::set_legacy`],
//!   [`SimFaults::set_logs_on_start`];
//! - counted: [`SimFaults::rate_limit_tags`];
//! - one-shot: [`SimFaults::abandon_up`];
//! - sticky until changed: [`SimFaults::set_host_env`];
//! - timed: [`SimFaults::busy_for`];
//! - immediate: [`SimFaults::emit_log_line`], [`SimFaults::restart_engine`],
//!   [`SimFaults::recreate_container`], [`SimFaults::release_stalls`];
//! - sticky until changed, on the engines' simulated traffic (`metrics.rs`):
//!   [`SimFaults::set_engine_slowdown`], [`SimFaults::set_engine_traffic`],
//!   [`SimFaults::set_traffic_rate`], [`SimFaults::set_metrics_padding`],
//!   [`SimFaults::set_metrics_status`].
//!
//! The engines' OpenAI-compatible API has its own faults in `api_fault.rs`
//! ([`SimFaults::set_api_fault`], [`SimFaults::require_api_token`]).

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::time::Instant;

use super::api_fault::{ApiFault, ScopedApiFault};
use super::fault_state::SimOp;
use super::state::Shared;

/// A clonable handle on the simulated host's faults. Every setter takes effect at once, also
/// while a stream is running.
#[derive(Clone)]
pub struct SimFaults {
    pub(crate) shared: Arc<Shared>,
}

impl SimFaults {
    /// Sticky: `tag` now points at `new_commit`, whose file text differs (a force-pushed tag):
    /// later ups of that tag report the new commit and another `file_sha256`.
    pub fn move_tag(&self, tag: &str, new_commit: &str) {
        self.shared
            .state()
            .faults
            .moved_tags
            .insert(tag.to_owned(), new_commit.to_owned());
    }

    /// Sticky: every dry run also plans `Container <name> Recreate` (`None` clears it).
    pub fn set_dry_run_extra(&self, name: Option<String>) {
        self.shared.state().faults.dry_run_extra = name;
    }

    /// Sticky: every dry run also plans `Container <name> Removing`/`Removed`, i.e. a removal
    /// (`None` clears it).
    pub fn set_dry_run_removal(&self, name: Option<String>) {
        self.shared.state().faults.dry_run_removal = name;
    }

    /// One-shot: the next stream of `op` fails in `phase` with exit code 1 and ends with
    /// `done` `success:false`. For `Up` the phase is `"pull"`, `"build"` or `"up"` (anything
    /// else means `"up"`); `DryRun` and `Down` have one phase each, which fails whatever the
    /// name. `None` disarms it.
    pub fn fail_phase(&self, op: SimOp, phase: Option<String>) {
        let mut st = self.shared.state();
        match phase {
            Some(p) => {
                st.faults.fail_phase.insert(op, p);
            }
            None => {
                st.faults.fail_phase.remove(&op);
            }
        }
    }

    /// One-shot: the next stream of `op` ends without `done`. An `Up` still does its work
    /// (containers recreated) but does not rotate the deployed records, like a client
    /// disconnect on the real server. `None` disarms every armed cut.
    pub fn cut_stream(&self, op: Option<SimOp>) {
        let mut st = self.shared.state();
        match op {
            Some(op) => {
                st.faults.cut_stream.insert(op);
            }
            None => st.faults.cut_stream.clear(),
        }
    }

    /// Timed: for `duration` from now, mutating calls answer 409 (`compose_up` in flight) and
    /// `/status` shows an operation in flight. A zero duration ends it.
    pub fn busy_for(&self, duration: Duration) {
        self.shared.state().faults.busy = Some((Instant::now() + duration, Utc::now()));
    }

    /// Sticky: the engine of `service` keeps answering `/health` with 503.
    pub fn set_health_never(&self, service: &str, never: bool) {
        let mut st = self.shared.state();
        if never {
            st.faults.health_never.insert(service.to_string());
        } else {
            st.faults.health_never.remove(service);
        }
    }

    /// Sticky: the cold start of engines started from now on.
    pub fn set_cold_start(&self, cold_start: Duration) {
        self.shared.state().faults.cold_start = cold_start;
    }

    /// Sticky: how long an up or a stage takes to pull an image the host does not hold yet
    /// (the images of the initial deployment are held; a pulled image stays).
    pub fn set_pull_time(&self, pull_time: Duration) {
        self.shared.state().faults.pull_time = pull_time;
    }

    /// Sticky: how long pulling `image` (`lmsysorg/sglang:glm53-v452`) takes when the host
    /// does not hold it, instead of [`Self::set_pull_time`]'s time (images pull in parallel:
    /// an up waits for the slowest one it pulls).
    pub fn set_image_pull_time(&self, image: &str, pull_time: Duration) {
        let mut st = self.shared.state();
        st.faults.pull_times.insert(image.to_owned(), pull_time);
    }

    /// Sticky: from now on the one-shot downloader, when an up runs it, fetches `repo`
    /// (`org/repo`) in `time` unless the model cache holds it: its log says `Downloading
    /// {repo}...` at once and `Download complete.` after `time`, and the repo is cached then,
    /// `bytes` more used on the model-cache volume. An up of an engine that depends on it waits
    /// for it (`service_completed_successfully`); an up of the downloader alone does not.
    pub fn set_download(&self, repo: &str, time: Duration, bytes: u64) {
        self.shared.state().faults.download = Some((repo.to_owned(), time, bytes));
    }

    /// Immediate: appends `line` to the log of the container of `service` (ignored when the
    /// service has no container).
    pub fn emit_log_line(&self, service: &str, line: &str) {
        if let Some(c) = self.shared.state().containers.get_mut(service) {
            c.push_log(line.to_string());
        }
    }

    /// Sticky: every `every`, the proxy `proxy`'s log says `Backend marked unhealthy: {replica}`
    /// then, `every` later, `Backend recovered: {replica}`, and so on (at most 1,000 lines),
    /// until the host stops or `None` ends it: a proxy that ejects the canary now and then.
    pub fn set_proxy_flap(&self, proxy: &str, replica: &str, every: Option<Duration>) {
        let generation = {
            let mut st = self.shared.state();
            st.faults.proxy_flap += 1;
            st.faults.proxy_flap
        };
        let Some(every) = every else {
            return;
        };
        let (shared, proxy, replica) = (self.shared.clone(), proxy.to_owned(), replica.to_owned());
        tokio::spawn(async move {
            let mut shutdown = shared.shutdown.clone();
            for n in 0..1_000u32 {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = shutdown.wait_for(|stop| *stop) => return,
                }
                let mut st = shared.state();
                if st.faults.proxy_flap != generation {
                    return;
                }
                let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.3fZ");
                let what = if n % 2 == 0 {
                    "Backend marked unhealthy"
                } else {
                    "Backend recovered"
                };
                if let Some(c) = st.containers.get_mut(&proxy) {
                    c.push_log(format!("{now} {what}: {replica}"));
                }
            }
        });
    }

    /// Immediate: appends an event-loop stall dump to the log of `service`'s container, as the
    /// engine prints it: a stamped `[event-loop-stall]` line, then the stacks, unstamped.
    pub fn emit_stall_block(&self, service: &str) {
        let now = chrono::Utc::now().format("%Y-%m-%d %H:%M:%S");
        let lines = [
            format!("[{now} TP0] [event-loop-stall] loop stalled 31.2s; dumping stacks (pid 1, loop thread 0x7f3a)"),
            "Thread 0x7f3a (most recent call first):".to_owned(),
            "  File \"/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py\", line 812 in event_loop_overlap".to_owned(),
            "  File \"/sgl-workspace/sglang/python/sglang/srt/managers/tp_worker.py\", line 190 in forward_batch_generation".to_owned(),
            "  File \"/usr/lib/python3.12/threading.py\", line 355 in wait".to_owned(),
        ];
        if let Some(c) = self.shared.state().containers.get_mut(service) {
            for line in lines {
                c.push_log(line);
            }
        }
    }

    /// Sticky: behave like an older server (`/docker/evict` is 404, `dry_run` and
    /// `materialize_only` are ignored, so a dry run deploys for real).
    pub fn set_legacy(&self, legacy: bool) {
        self.shared.state().faults.legacy = legacy;
    }

    /// One-shot: the next stream of `op` ends after `lines` NDJSON lines, without `done` (the
    /// operation stops there, like compose-manager's body dying mid-way). `0` cuts before
    /// the first line.
    pub fn cut_after_lines(&self, op: SimOp, lines: usize) {
        self.shared.state().faults.cut_after.insert(op, lines);
    }

    /// One-shot: the next stream of `op` does all its work, then holds before `done` until
    /// [`SimFaults::release_stalls`] or until the client hangs up (then it ends without
    /// `done`, the lock is freed and the deployed records are not rotated).
    pub fn stall_stream(&self, op: SimOp) {
        self.shared.state().faults.stall.insert(op);
    }

    /// How many streams are held by [`SimFaults::stall_stream`] right now.
    pub fn stalled_streams(&self) -> usize {
        *self.shared.stalled.borrow()
    }

    /// Immediate: every held stream goes on to `done`.
    pub fn release_stalls(&self) {
        self.shared.release_stalls.send_modify(|n| *n += 1);
    }

    /// One-shot: the next stream of `op` carries `line` (not an NDJSON event) after its first
    /// line, and goes on as usual.
    pub fn garbage_line(&self, op: SimOp, line: &str) {
        self.shared
            .state()
            .faults
            .garbage
            .insert(op, line.to_owned());
    }

    /// Counted: the next `times` requests of `op` answer `status` (JSON error body) before any
    /// stream, with no effect. `times == 0` disarms it.
    pub fn answer_status(&self, op: SimOp, status: u16, times: u32) {
        let mut st = self.shared.state();
        if times == 0 {
            st.faults.answer_status.remove(&op);
        } else {
            st.faults.answer_status.insert(op, (status, times));
        }
    }

    /// Counted: the next `times` requests of `op` wait `delay` before answering (before the
    /// lock is taken: nothing happens if the client gives up).
    pub fn delay_answer(&self, op: SimOp, delay: Duration, times: u32) {
        let mut st = self.shared.state();
        if times == 0 {
            st.faults.delay_answer.remove(&op);
        } else {
            st.faults.delay_answer.insert(op, (delay, times));
        }
    }

    /// Sticky: pause `delay` before each NDJSON line (`None`: the host's usual pace).
    pub fn set_line_delay(&self, delay: Option<Duration>) {
        self.shared.state().faults.line_delay = delay;
    }

    /// Sticky: the engine of `service` answers `/health` 200 and 503 in turn.
    pub fn set_health_flap(&self, service: &str, flap: bool) {
        let mut st = self.shared.state();
        if flap {
            st.faults.health_flap.insert(service.to_string());
        } else {
            st.faults.health_flap.remove(service);
        }
    }

    /// Immediate: the engine of `service` restarts in place (same container, like `docker
    /// restart`): `/health` answers 503 for `down_for`, and a restart line is logged.
    pub fn restart_engine(&self, service: &str, down_for: Duration) {
        let mut st = self.shared.state();
        if let Some(c) = st.containers.get_mut(service) {
            c.ready_at = Instant::now() + down_for;
            c.started_at = Utc::now();
            c.push_log("[sim] engine process restarted".to_string());
        }
    }

    /// Immediate: the container of `service` is replaced by a new one (another id, started
    /// now, a fresh log), as a `docker compose up --force-recreate` by someone else would;
    /// its engine answers `/health` at once.
    pub fn recreate_container(&self, service: &str) {
        let mut st = self.shared.state();
        let id = st.new_id(service);
        if let Some(c) = st.containers.get_mut(service) {
            c.id = id;
            c.created_at = Utc::now();
            c.started_at = c.created_at;
            c.generation += 1;
            c.log.clear();
            c.push_log("[sim] container recreated".to_string());
        }
    }

    /// Sticky: engines of `service` started from now on print these lines over their cold
    /// start instead of the usual ones (`None` restores the usual lines); a plain service
    /// (the perception check) prints them at its start.
    pub fn set_logs_on_start(&self, service: &str, lines: Option<Vec<String>>) {
        let mut st = self.shared.state();
        match lines {
            Some(lines) => {
                st.faults.logs_on_start.insert(service.to_string(), lines);
            }
            None => {
                st.faults.logs_on_start.remove(service);
            }
        }
    }

    /// Sticky: `GET /host/cache` reports `volume` using `used_bytes` (`None` removes it)
    /// and, when given, exactly these cached weight repos (`models--org--repo`).
    pub fn set_cache(&self, volume: &str, used_bytes: Option<u64>, weights: Option<&[&str]>) {
        let mut st = self.shared.state();
        match used_bytes {
            Some(bytes) => {
                st.cache_volumes.insert(volume.to_owned(), bytes);
            }
            None => {
                st.cache_volumes.remove(volume);
            }
        }
        if let Some(weights) = weights {
            st.cached_weights = weights.iter().map(|w| (*w).to_owned()).collect();
        }
    }

    /// Sticky: the host's own env files set `name` to `value` (`None` removes it). They are
    /// what `/compose/logs` interpolates the file with; the example file requires
    /// `PROXY_TOKEN`, so removing it makes every logs call answer 500, as on the real server.
    pub fn set_host_env(&self, name: &str, value: Option<&str>) {
        let mut st = self.shared.state();
        match value {
            Some(v) => {
                st.host_env.insert(name.to_owned(), v.to_owned());
            }
            None => {
                st.host_env.remove(name);
            }
        }
    }

    /// Counted: the next `times` up, down and dry-run requests answer
    /// `400 {"error":"tag not found: <tag>"}`, with no effect: the git host's rate limit,
    /// which the real server maps to a missing tag. `0` disarms it.
    pub fn rate_limit_tags(&self, times: u32) {
        self.shared.state().faults.tag_rate_limited = times;
    }

    /// One-shot: the next real up streams its first lines, then ends without `done` and frees
    /// the lock at once (the real server's lock follows the HTTP stream), while the abandoned
    /// compose child goes on: over `work` after the stream ended, the target is stopped,
    /// removed and recreated. `/status` reads idle all along.
    pub fn abandon_up(&self, work: Duration) {
        self.shared.state().faults.abandon_up = Some(work);
    }
}

impl SimFaults {
    /// Sticky until changed: the OpenAI-compatible API of `service`'s engine misbehaves as
    /// `fault` while its container runs `tag` (any tag when `None`). One fault per service:
    /// setting one replaces the previous; `None` clears it.
    pub fn set_api_fault(&self, service: &str, tag: Option<&str>, fault: Option<ApiFault>) {
        let mut st = self.shared.state();
        let faults = &mut st.faults.api.by_service;
        match fault {
            Some(fault) => {
                let tag = tag.map(str::to_owned);
                faults.insert(service.to_owned(), ScopedApiFault { tag, fault });
            }
            None => {
                faults.remove(service);
            }
        }
    }

    /// Sticky until changed: every engine answers its API calls with 401 unless they carry
    /// `Authorization: Bearer <token>` (`None`: no auth, the default).
    pub fn require_api_token(&self, token: Option<&str>) {
        self.shared.state().faults.api.token = token.map(str::to_owned);
    }
}

impl SimFaults {
    /// Sticky: the engine of `service` serves its requests `factor`× slower (TTFT and
    /// inter-token latency multiplied; `1.0` restores it).
    pub fn set_engine_slowdown(&self, service: &str, factor: f64) {
        let mut st = self.shared.state();
        if factor == 1.0 {
            st.traffic.slowdown.remove(service);
        } else {
            st.traffic.slowdown.insert(service.to_owned(), factor);
        }
    }

    /// Sticky: whether the engine of `service` receives simulated requests (default true).
    pub fn set_engine_traffic(&self, service: &str, on: bool) {
        let mut st = self.shared.state();
        if on {
            st.traffic.idle.remove(service);
        } else {
            st.traffic.idle.insert(service.to_owned());
        }
    }

    /// Sticky: requests per second each ready engine receives (default [`crate::traffic::DEFAULT_RATE`]).
    pub fn set_traffic_rate(&self, per_second: f64) {
        self.shared.state().traffic.rate = Some(per_second.max(0.0));
    }

    /// Sticky: every `/metrics` page carries `series` extra gauge series (default 0).
    pub fn set_metrics_padding(&self, series: usize) {
        self.shared.state().traffic.padding = series;
    }

    /// Sticky: the `/metrics` page of `service`'s engine answers `status` (its `/health` and
    /// API are unchanged); `None` serves the page again.
    pub fn set_metrics_status(&self, service: &str, status: Option<u16>) {
        let mut st = self.shared.state();
        match status {
            Some(status) => st.traffic.page_status.insert(service.to_owned(), status),
            None => st.traffic.page_status.remove(service),
        };
    }
}
