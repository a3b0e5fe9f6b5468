//! Secrets kept out of evidence: any text from a host (log lines, answers, error bodies) is
//! shown with the env values it may echo masked.

/// Env values shorter than this are not masked in details (they would mask ordinary words).
const MASK_MIN_CHARS: usize = 8;

/// `text` with every secret of at least [`MASK_MIN_CHARS`] characters replaced by `***`.
pub fn mask(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_owned();
    let mut secrets: Vec<&String> = secrets
        .iter()
        .filter(|s| s.chars().count() >= MASK_MIN_CHARS)
        .collect();
    // Longest first, so a secret containing another is masked whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    for secret in secrets {
        out = out.replace(secret.as_str(), "***");
    }
    out
}
