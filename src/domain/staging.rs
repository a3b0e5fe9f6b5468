//! Pre-staging weights before a replica goes down (seed 003's "Deploy (after merge; engines
//! untouched)"): the free-space gate read from compose-manager's `GET /host/cache`, before
//! anything is sent. The model-cache volume and its capacity are host configuration; the
//! space required is a runbook setting a plan may raise.

/// What the gate answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpaceVerdict {
    /// The weights are cached already: nothing to download (`already_staged`).
    AlreadyStaged,
    /// Enough room: the download may start. `free` bytes before it.
    Enough { free: u64 },
    /// Too little room: fail `insufficient_space`, nothing sent.
    Insufficient { free: u64, required: u64 },
    /// The host does not report the volume: fail, nothing sent (the config names another
    /// volume than the host has, or the host's cache report is older).
    VolumeMissing,
}

/// The cache directory of a Hugging Face repo (`org/repo` → `models--org--repo`), as
/// `/host/cache` lists the cached weights.
pub fn cache_dir(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

/// The gate: `weights` (the cached repos) holding `repo` answers [`SpaceVerdict::AlreadyStaged`];
/// otherwise the free space of `volume` (its `capacity` less its used bytes in `volumes`) is
/// compared with `required`.
pub fn verdict(
    volumes: &[(String, u64)],
    weights: &[String],
    volume: &str,
    capacity: u64,
    required: u64,
    repo: &str,
) -> SpaceVerdict {
    if weights.iter().any(|w| *w == cache_dir(repo)) {
        return SpaceVerdict::AlreadyStaged;
    }
    let Some((_, used)) = volumes.iter().find(|(name, _)| name == volume) else {
        return SpaceVerdict::VolumeMissing;
    };
    let free = capacity.saturating_sub(*used);
    if free < required {
        SpaceVerdict::Insufficient { free, required }
    } else {
        SpaceVerdict::Enough { free }
    }
}

#[cfg(test)]
mod tests;
