//! The repository stands alone: a fresh clone, with nothing beside it, builds, tests and reads.
//! Nothing may read or link a folder beside it (such as a `shared` sibling), and no comment or
//! document may cite a specification a reader of the repository cannot open: the product's own
//! reference is docs/reference.md, docs/safety.md and docs/compose-manager.md.

use std::path::{Path, PathBuf};

/// Files another branch was changing when the citations were swept: their citations are
/// cleaned when those branches merge. Remove an entry once its file is clean.
const PENDING_SWEEP: &[&str] = &[];

/// What may not appear, and why (spelled in pieces so that this file does not match itself).
fn forbidden() -> Vec<(String, &'static str)> {
    vec![
        (
            format!("..{}shared", '/'),
            "reads or links a folder outside the repository",
        ),
        (
            format!("compose-manager{}api", '-'),
            "cites a document outside the repository: see docs/compose-manager.md",
        ),
        (
            format!("rollout{}practice", '-'),
            "cites a document outside the repository: see docs/reference.md",
        ),
        (
            '\u{a7}'.to_string(),
            "cites a section of a document outside the repository: link docs/reference.md, \
             docs/safety.md (\"safety rule N\") or docs/compose-manager.md instead",
        ),
    ]
}

/// The capitalised word on its own (not inside a longer word, not in lower case).
fn cites_spec(line: &str) -> bool {
    let word = format!("SP{}", "EC");
    line.match_indices(&word).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + word.len()..].chars().next();
        let part_of_word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !part_of_word(before) && !part_of_word(after)
    })
}

/// Every text file of the repository, as a path relative to its root: not `target/`, not
/// `.git`, not the databases a local run leaves, not the third-party compose files (copied
/// verbatim, see tests/fixtures/real-compose/PROVENANCE.md).
fn text_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![PathBuf::new()];
    while let Some(rel) = dirs.pop() {
        let entries = std::fs::read_dir(root.join(&rel)).expect("readable folder");
        for entry in entries {
            let entry = entry.expect("readable entry");
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = rel.join(&name);
            let skip = matches!(name.as_str(), "target" | ".git")
                || path == Path::new("tests/fixtures/real-compose")
                || name.ends_with(".db")
                || name.contains(".db-");
            if skip {
                continue;
            }
            let kind = entry.file_type().expect("file type");
            if kind.is_dir() {
                dirs.push(path);
            } else if kind.is_file() {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn nothing_in_the_repository_reads_a_sibling_folder_or_cites_an_outside_spec() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let forbidden = forbidden();
    let mut found = Vec::new();
    let mut scanned = 0;
    for rel in text_files(root) {
        let Ok(text) = std::fs::read_to_string(root.join(&rel)) else {
            continue; // not UTF-8 text
        };
        scanned += 1;
        let shown = rel.display().to_string();
        if PENDING_SWEEP.contains(&shown.as_str()) {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            let mut why: Vec<&str> = forbidden
                .iter()
                .filter(|(needle, _)| line.contains(needle.as_str()))
                .map(|(_, why)| *why)
                .collect();
            if cites_spec(line) {
                why.push(
                    "cites a specification outside the repository: link docs/reference.md instead",
                );
            }
            if !why.is_empty() {
                found.push(format!(
                    "{shown}:{}: {} ({})",
                    n + 1,
                    line.trim(),
                    why.join("; ")
                ));
            }
        }
    }
    assert!(
        scanned > 50,
        "the walk found the repository's files ({scanned})"
    );
    assert!(
        found.is_empty(),
        "{} line(s) point outside the repository:\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn the_spec_check_matches_the_word_only() {
    let word = format!("SP{}", "EC");
    assert!(cites_spec(&format!("see {word} 4")));
    assert!(cites_spec(&format!("({word})")));
    assert!(!cites_spec(&format!("{word}IAL")));
    assert!(!cites_spec("the spec of a plan"));
}
