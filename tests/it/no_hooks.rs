//! The shipped binary carries no test hooks: every mention in `src/` of the crash-matrix hooks
//! (`pause_at`, `PauseHandle`, `hooks`), the benches' database filler (`bulk`, `BulkSpec`) or
//! the `testing` module sits inside an item gated by `#[cfg(feature = "testing")]` (or
//! `#[cfg(test)]`), outside the files that are the hooks themselves. The build of
//! `cargo build --release` was checked by hand with `strings` (ARCHITECTURE.md); this keeps
//! the source true to it.

use std::path::{Path, PathBuf};

/// The words that name a hook (whole identifiers, outside comments and strings).
const HOOK_NAMES: &[&str] = &[
    "pause_at",
    "PauseHandle",
    "hooks",
    "Hooks",
    "bulk",
    "BulkSpec",
    "bulk_fill",
    "bulk_checkpoint",
    "testing",
];

/// The hooks themselves: declared (gated) in their parent module, so wholly absent without
/// the feature.
const HOOK_FILES: &[&str] = &["src/engine/hooks.rs", "src/store/bulk.rs", "src/testing.rs"];

/// The code of `src`, comments and the insides of string and char literals blanked (line
/// breaks kept), so that only code is left to scan.
fn code_only(src: &str) -> String {
    let chars: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&chars, i) {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            out.push('"');
            j += 1;
            let close: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            while j < chars.len() && !chars[j..].starts_with(&close.chars().collect::<Vec<_>>()) {
                out.push(blank(chars[j]));
                j += 1;
            }
            out.push('"');
            i = j + close.chars().count();
        } else if c == '"' {
            out.push('"');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            out.push('"');
            i += 1;
        } else if c == '\'' && is_char_literal(&chars, i) {
            // '{', '\'', '\u{a7}': blanked; a lifetime ('a) is left alone.
            out.push('\'');
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                out.push(' ');
                i += 1;
            }
            out.push('\'');
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

fn is_char_literal(chars: &[char], i: usize) -> bool {
    matches!(
        (chars.get(i + 1), chars.get(i + 2)),
        (Some('\\'), _) | (Some(_), Some('\''))
    )
}

fn words(line: &str) -> impl Iterator<Item = &str> {
    line.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
}

/// The lines (1-based) of `src` that name a hook outside a gated item. An item is gated when
/// `#[cfg(feature = "testing")]` or `#[cfg(test)]` stands among the attributes right above
/// it, or when it sits in the braces of a gated item.
fn ungated_mentions(src: &str) -> Vec<(usize, String)> {
    let code = code_only(src);
    let originals: Vec<&str> = src.lines().collect();
    let mut found = Vec::new();
    // One entry per open brace: whether what it opened is gated.
    let mut open: Vec<bool> = Vec::new();
    // A gate was read and the item it gates has not ended (`;` or `,` outside parentheses)
    // nor opened its braces yet.
    let mut pending_gate = false;
    let mut parens = 0i32;
    for (n, line) in code.lines().enumerate() {
        let trimmed = line.trim();
        let compact: String = trimmed.chars().filter(|c| !c.is_whitespace()).collect();
        if compact.starts_with("#[cfg(feature=\"") || compact == "#[cfg(test)]" {
            // The feature's name is blanked with the string: only one feature exists.
            pending_gate = true;
            parens = 0;
            continue;
        }
        let gated = pending_gate || open.last().copied().unwrap_or(false);
        if !gated && words(trimmed).any(|w| HOOK_NAMES.contains(&w)) {
            let shown = originals.get(n).copied().unwrap_or("").trim().to_owned();
            found.push((n + 1, shown));
        }
        if trimmed.starts_with("#[") {
            continue;
        }
        for c in trimmed.chars() {
            match c {
                '(' | '[' => parens += 1,
                ')' | ']' => parens -= 1,
                '{' => {
                    open.push(pending_gate || open.last().copied().unwrap_or(false));
                    pending_gate = false;
                }
                '}' => {
                    open.pop();
                }
                ';' | ',' if parens <= 0 => pending_gate = false,
                _ => {}
            }
        }
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("readable folder")
        .map(|e| e.expect("readable entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_mention_of_a_test_hook_in_src_is_gated_by_the_testing_feature() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let mut found = Vec::new();
    let mut gated_files = 0;
    for path in &files {
        let rel = path
            .strip_prefix(root)
            .expect("below the root")
            .to_string_lossy()
            .replace('\\', "/");
        if HOOK_FILES.contains(&rel.as_str()) {
            gated_files += 1;
            continue;
        }
        let text = std::fs::read_to_string(path).expect("UTF-8 source");
        for (line, shown) in ungated_mentions(&text) {
            found.push(format!("{rel}:{line}: {shown}"));
        }
    }
    assert!(
        files.len() > 50,
        "the walk found the sources ({})",
        files.len()
    );
    assert_eq!(gated_files, HOOK_FILES.len(), "every hook file exists");
    assert!(
        found.is_empty(),
        "{} mention(s) of a test hook outside #[cfg(feature = \"testing\")]:\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn the_scan_finds_an_ungated_hook_and_passes_gated_ones() {
    let src = r##"
//! pause_at in a comment is no code.
#[cfg(feature = "testing")]
mod hooks;

pub struct Inner {
    #[cfg(feature = "testing")]
    pub hooks: hooks::Hooks,
    pub name: String, // "{"
}

impl Engine {
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn pause_at(
        &self,
        point: &str,
    ) -> PauseHandle {
        let text = "}}}";
        self.inner.hooks.arm(point)
    }

    pub fn leak(&self) -> PauseHandle {
        let brace = '{';
        self.inner.hooks.arm("x")
    }
}

#[cfg(test)]
mod tests {
    fn f() { let _ = crate::testing::canary("", &T); }
}
pub use bulk::BulkSpec;
"##;
    let lines: Vec<usize> = ungated_mentions(src).into_iter().map(|(n, _)| n).collect();
    assert_eq!(lines, [23, 25, 33]);
}
