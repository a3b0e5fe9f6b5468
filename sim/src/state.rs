//! What the simulated host remembers: containers, the files on disk, the deployed records
//! behind `/version`, the one-operation lock, faults, and every request received.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Utc};
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio::time::Instant;

use super::compose_file::ComposeFile;
use super::fault_state::FaultState;
use super::{RecordedCall, SimApiCall, SimContainer, SimTag};

/// Lines kept per container log; older lines fall off, as with a rotated json-file log.
pub(crate) const LOG_CAP: usize = 5_000;
/// Engine API calls kept; the oldest fall off beyond this.
pub(crate) const CALLS_CAP: usize = 10_000;
/// The compose project every call uses (WORK_DIR `/app/work`).
pub(crate) const PROJECT: &str = "work";
/// The HuggingFace cache volume of project `work`.
pub(crate) const HF_VOLUME: &str = "work_huggingface_cache";

/// Everything the handlers, engines and the `SimHost` handle share.
pub(crate) struct Shared {
    pub token: String,
    /// File path in the repo → its text at every tag without files of its own (apart from
    /// image pins).
    pub files: BTreeMap<String, String>,
    /// The same files, parsed.
    pub parsed: BTreeMap<String, ComposeFile>,
    /// Tag name → path → the parsed file, for each tag that carries its own files
    /// ([`SimTag::files`]).
    pub tag_parsed: BTreeMap<String, BTreeMap<String, ComposeFile>>,
    pub tags: Vec<TagEntry>,
    pub min_tag_age: chrono::Duration,
    pub stream_line_delay: std::time::Duration,
    /// Engine service → its stable loopback health port.
    pub engine_ports: BTreeMap<String, u16>,
    pub shutdown: watch::Receiver<bool>,
    /// When the host started (compose-manager's own container dates from then).
    pub booted_at: DateTime<Utc>,
    /// The mutable part; use [`Shared::state`].
    pub inner: Mutex<State>,
    /// How many streams are held by a stall fault now.
    pub stalled: watch::Sender<usize>,
    /// Bumped to let every held stream go on.
    pub release_stalls: watch::Sender<u64>,
}

/// A tag of the fake compose repo, with its committer date fixed at start.
pub(crate) struct TagEntry {
    pub tag: SimTag,
    pub committed_at: DateTime<Utc>,
}

/// `{tag, commit, file, file_sha256}`, as `/version` shows a deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct DeployRecord {
    pub tag: String,
    pub commit: String,
    pub file: String,
    pub file_sha256: String,
}

/// The mutable part, behind one mutex that is never held across an await.
#[derive(Default)]
pub(crate) struct State {
    pub containers: BTreeMap<String, Container>,
    /// `<WORK_DIR>/<file>` as last written by an up or a dry run.
    pub disk: BTreeMap<String, String>,
    /// The tag each file on disk was fetched at (what a down or a logs call parses).
    pub disk_tags: BTreeMap<String, String>,
    /// Top-level `/version` fields: the last attempted up.
    pub attempted: Option<DeployRecord>,
    pub current: Option<DeployRecord>,
    pub previous: Option<DeployRecord>,
    pub in_flight: Option<InFlight>,
    pub lock_seq: u64,
    pub calls: VecDeque<RecordedCall>,
    pub faults: FaultState,
    pub id_seq: u64,
    /// Source of [`Container::generation`].
    pub gen_seq: u64,
    /// The host's own env files (`.env`, `.env.host`): what `/compose/logs` interpolates the
    /// file with, since logs run without the request's env.
    pub host_env: BTreeMap<String, String>,
    /// Every call of an engine's OpenAI-compatible API (the latest [`CALLS_CAP`]).
    pub api_calls: VecDeque<SimApiCall>,
    /// Every `/health` and `/metrics` read of an engine (the latest [`CALLS_CAP`]).
    pub engine_reads: VecDeque<super::SimEngineRead>,
    /// The simulated requests every engine serves (its `/metrics`).
    pub traffic: super::traffic::Traffic,
    /// `GET /host/cache`: each volume's used bytes, and the weight repos cached
    /// (`models--org--repo`).
    pub cache_volumes: BTreeMap<String, u64>,
    pub cached_weights: Vec<String>,
    /// Images on the host (`docker images`): an up or a stage pulls only the others, each
    /// taking [`super::fault_state::FaultState::pull_time`].
    pub pulled_images: BTreeSet<String>,
}

/// The operation holding the lock, as `/status` shows it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct InFlight {
    pub action: String,
    pub started_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<String>,
    /// For `docker_evict`, the model id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    #[serde(skip)]
    pub seq: u64,
}

/// One container of project `work`.
#[derive(Debug, Clone)]
pub(crate) struct Container {
    pub service: String,
    pub name: String,
    pub id: String,
    pub image: String,
    pub running: bool,
    pub created_at: DateTime<Utc>,
    pub started_at: DateTime<Utc>,
    pub tag: String,
    /// Hash of the effective config (image, interpolated env and command).
    pub fingerprint: String,
    pub env: BTreeMap<String, String>,
    pub command: String,
    /// `/health` answers 200 from this instant on (engines only).
    pub ready_at: Instant,
    /// Bumped on every (re)start, so a stale log writer stops.
    pub generation: u64,
    pub log: VecDeque<String>,
}

impl Container {
    /// Appends one log line, dropping the oldest past the cap.
    pub fn push_log(&mut self, line: String) {
        if self.log.len() >= LOG_CAP {
            self.log.pop_front();
        }
        self.log.push_back(line);
    }

    /// The public view.
    pub fn view(&self) -> SimContainer {
        SimContainer {
            service: self.service.clone(),
            name: self.name.clone(),
            id: self.id.clone(),
            image: self.image.clone(),
            state: if self.running { "running" } else { "exited" }.to_string(),
            started_at: self.started_at,
            tag: self.tag.clone(),
        }
    }
}

impl Shared {
    /// The state, even if a panicking holder poisoned the mutex (the data stays usable).
    pub fn state(&self) -> MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A tag by name, or by its commit SHA (GitHub resolves both).
    pub fn find_tag(&self, name: &str) -> Option<&TagEntry> {
        self.tags
            .iter()
            .find(|t| t.tag.name == name || t.tag.commit == name)
    }

    /// The files `tag` serves: its own, or the host's.
    fn files_of<'a>(&'a self, tag: &'a SimTag) -> &'a BTreeMap<String, String> {
        tag.files.as_ref().unwrap_or(&self.files)
    }

    /// `file` as compose parses it at tag `tag` (a name or a commit): the tag's own file
    /// when it carries files, else the host's.
    pub fn parsed_at(&self, file: &str, tag: &str) -> Option<&ComposeFile> {
        let name = self.find_tag(tag).map_or(tag, |t| t.tag.name.as_str());
        match self.tag_parsed.get(name) {
            Some(files) => files.get(file),
            None => self.parsed.get(file),
        }
    }

    /// The parsed file on disk at `file` (as the tag that wrote it defines it).
    pub fn parsed_on_disk(&self, st: &State, file: &str) -> Option<&ComposeFile> {
        st.disk.get(file)?;
        match st.disk_tags.get(file) {
            Some(tag) => self.parsed_at(file, tag),
            None => self.parsed.get(file),
        }
    }

    /// The text of `file` at `tag`: the tag's own file or the configured one, plus a
    /// comment naming the tag's image pins so that each tag's text (and SHA-256) is its own.
    pub fn file_at(&self, file: &str, tag: &SimTag) -> Option<String> {
        let base = self.files_of(tag).get(file)?;
        if tag.images.is_empty() {
            return Some(base.clone());
        }
        let mut text = base.clone();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!("# at {}, these services run:\n", tag.name));
        for (service, image) in &tag.images {
            text.push_str(&format!("#   {service}: {image}\n"));
        }
        Some(text)
    }

    /// Takes the one-operation lock (released when the [`HeldLock`] drops), or says which
    /// action holds it.
    pub fn try_lock(self: &Arc<Self>, mut entry: InFlight) -> Result<HeldLock, String> {
        let mut st = self.state();
        if st.faults.busy_now() {
            return Err("compose_up".to_string());
        }
        if let Some(held) = &st.in_flight {
            return Err(held.action.clone());
        }
        st.lock_seq += 1;
        entry.seq = st.lock_seq;
        let seq = entry.seq;
        st.in_flight = Some(entry);
        Ok(HeldLock {
            shared: self.clone(),
            seq,
        })
    }

    /// Releases the lock taken as `seq`; a no-op if it was already released.
    pub fn release(&self, seq: u64) {
        let mut st = self.state();
        if st.in_flight.as_ref().is_some_and(|f| f.seq == seq) {
            st.in_flight = None;
        }
    }

    /// What `/status` shows: the held lock, or the scripted busy period.
    pub fn in_flight(&self) -> Option<InFlight> {
        let st = self.state();
        if let Some(f) = &st.in_flight {
            return Some(f.clone());
        }
        st.faults.busy_since().map(|started_at| InFlight {
            action: "compose_up".to_string(),
            started_at,
            tag: st.attempted.as_ref().map(|r| r.tag.clone()),
            file: st.attempted.as_ref().map(|r| r.file.clone()),
            services: Vec::new(),
            container: None,
            seq: 0,
        })
    }
}

/// Releases the lock when dropped: lives inside a response stream, so a finished stream or a
/// client that hangs up frees the host, as on the real server.
pub(crate) struct HeldLock {
    pub shared: Arc<Shared>,
    pub seq: u64,
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        self.shared.release(self.seq);
    }
}

impl State {
    /// Records a read of an engine's `/health` or `/metrics`.
    pub fn record_engine_read(&mut self, service: &str, path: &str, status: u16) {
        if self.engine_reads.len() >= CALLS_CAP {
            self.engine_reads.pop_front();
        }
        self.engine_reads.push_back(super::SimEngineRead {
            service: service.to_owned(),
            path: path.to_owned(),
            status,
            at: Utc::now(),
        });
    }

    /// A fresh 64-hex container id.
    pub fn new_id(&mut self, service: &str) -> String {
        self.id_seq += 1;
        let nanos = Utc::now().timestamp_nanos_opt().unwrap_or_default();
        sha256_hex(format!("{service}/{}/{nanos}", self.id_seq).as_bytes())
    }
}

/// Lowercase hex SHA-256.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
