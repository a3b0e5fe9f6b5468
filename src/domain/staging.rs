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

/// The binary units a size is written in, largest first.
const UNITS: [(&str, u64); 5] = [
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
    ("B", 1),
];

/// A size as written in a config or a runbook: a whole number and a binary unit (`250GiB`,
/// `1TiB`, `512MiB`).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let bad = || {
        format!(
            "`{text}` is not a size: a whole number and a unit, B, KiB, MiB, GiB or TiB (`250GiB`)"
        )
    };
    let (number, unit) = UNITS
        .iter()
        .find_map(|(unit, n)| text.strip_suffix(unit).map(|num| (num, *n)))
        .ok_or_else(bad)?;
    let number: u64 = number.trim().parse().map_err(|_| bad())?;
    number.checked_mul(unit).ok_or_else(bad)
}

/// Bytes in the largest binary unit that keeps one decimal readable: `165.0 GiB`.
pub fn format_size(bytes: u64) -> String {
    let (unit, n) = UNITS
        .iter()
        .find(|(_, n)| bytes >= *n)
        .copied()
        .unwrap_or(("B", 1));
    if n == 1 {
        format!("{bytes} B")
    } else {
        format!("{:.1} {unit}", bytes as f64 / n as f64)
    }
}

#[cfg(test)]
mod tests;
