//! Every relative link of README.md, ARCHITECTURE.md and docs/*.md resolves: the file exists,
//! and an `#anchor` is the GitHub slug of a heading of the file it points to.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use regex::Regex;

/// The markdown files a reader of the repository opens.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    for entry in std::fs::read_dir(root.join("docs")).expect("docs/ readable") {
        let path = entry.expect("dir entry").path();
        if path.extension().and_then(|e| e.to_str()) == Some("md") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// The lines outside fenced code blocks, with inline code spans blanked.
fn prose_lines(text: &str) -> Vec<String> {
    let code_span = Regex::new(r"`[^`]*`").expect("pattern");
    let mut in_fence = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if !in_fence {
            lines.push(code_span.replace_all(line, "``").into_owned());
        }
    }
    lines
}

/// GitHub's heading anchor: lowercase; punctuation dropped (letters, digits, `-`, `_` and
/// spaces stay); each space a `-`; a repeated heading gets `-1`, `-2`, ...
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut in_fence = false;
    let mut seen = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// Every broken relative link, as `file: target (why)`.
fn broken_links(root: &Path) -> Vec<String> {
    let inline = Regex::new(r"\]\(([^)\s]+)(?:\s+[^)]*)?\)").expect("pattern");
    let reference = Regex::new(r"^\s*\[[^\]]+\]:\s*(\S+)").expect("pattern");
    let mut broken = Vec::new();
    for file in markdown_files(root) {
        let text = std::fs::read_to_string(&file).expect("markdown readable");
        let name = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        for line in prose_lines(&text) {
            let targets = inline
                .captures_iter(&line)
                .chain(reference.captures_iter(&line))
                .map(|c| c[1].trim_matches(['<', '>']).to_owned());
            for target in targets {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let dest = if path.is_empty() {
                    file.clone()
                } else {
                    file.parent().expect("a folder").join(path)
                };
                if !dest.exists() {
                    broken.push(format!("{name}: {target} (no such file)"));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                if dest.extension().and_then(|e| e.to_str()) != Some("md") {
                    continue;
                }
                let dest_text = std::fs::read_to_string(&dest).expect("markdown readable");
                if !anchors(&dest_text).contains(anchor) {
                    broken.push(format!("{name}: {target} (no heading with that anchor)"));
                }
            }
        }
    }
    broken
}

#[test]
fn headings_slug_as_github_does() {
    assert_eq!(slug(" 7. Running it"), "7-running-it");
    assert_eq!(slug(" `compose` (all optional)"), "compose-all-optional");
    assert_eq!(slug(" Notifications: webhooks"), "notifications-webhooks");
    let text = "# A\n## Twice\n```\n# not a heading\n```\n## Twice\n";
    let found: Vec<String> = anchors(text).into_iter().collect();
    assert_eq!(found, ["a", "twice", "twice-1"]);
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let broken = broken_links(root);
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The operator guide's example plan overrides only variables its replica reads: an override
/// of another replica's variable is silently a no-op on the one being rolled.
#[test]
fn the_operator_guides_example_overrides_only_variables_its_replica_reads() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let guide = std::fs::read_to_string(root.join("docs/operator-guide.md")).expect("guide");
    let block = guide
        .split("```yaml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the guide's first YAML block is the example plan");
    let plan: serde_yaml::Value = serde_yaml::from_str(block).expect("the example plan parses");
    let service = plan["service"].as_str().expect("service");
    let file = plan["file"].as_str().expect("file");
    let compose: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(root.join(file)).expect("compose file"))
            .expect("compose YAML");
    let environment = serde_yaml::to_string(&compose["services"][service]["environment"])
        .expect("the replica's environment");
    let mut overrides: Vec<String> = plan["env"]
        .as_mapping()
        .expect("env overrides")
        .keys()
        .filter_map(|k| k.as_str().map(str::to_owned))
        .collect();
    let flags = guide
        .lines()
        .filter_map(|l| l.split_once("--env ").map(|(_, rest)| rest))
        .filter_map(|rest| rest.split('=').next().map(str::to_owned));
    overrides.extend(flags);
    assert!(!overrides.is_empty());
    for key in overrides {
        assert!(
            environment.contains(&format!("${{{key}")),
            "{key} is not read by {service} in {file}"
        );
    }
}
