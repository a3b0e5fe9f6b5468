//! Host env files: the host's full env map, one `KEY=VALUE` per line.
//!
//! `#` comments and blank lines are allowed; anything else is an error naming `file:line`.
//! The value is everything after the first `=`, verbatim (no quote removal, no `export`, no
//! interpolation): compose-manager writes it to its own env file unchanged. Values are secrets
//! and never appear in an error message.

use std::collections::BTreeMap;
use std::path::Path;

use super::ConfigError;
use crate::domain::plan::is_env_key;

/// Parses the text of an env file; `path` is only used in errors.
pub(super) fn parse(path: &Path, text: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut env = BTreeMap::new();
    let mut first_line = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let number = i + 1;
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let line = if i == 0 {
            line.strip_prefix('\u{feff}').unwrap_or(line)
        } else {
            line
        };
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let error = |message: String| ConfigError {
            file: Some(path.to_path_buf()),
            line: Some(number),
            key: None,
            message,
        };
        let Some((key, value)) = line.split_once('=') else {
            return Err(error(
                "expected KEY=VALUE, a `#` comment or a blank line".to_string(),
            ));
        };
        if !is_env_key(key) {
            let shown: String = key.chars().take(64).collect();
            return Err(error(format!(
                "invalid key `{shown}`: must match [A-Za-z_][A-Za-z0-9_]* with no spaces around `=`"
            )));
        }
        if value.contains('\0') {
            return Err(error(format!("the value of {key} contains a NUL byte")));
        }
        if let Some(first) = first_line.insert(key.to_string(), number) {
            return Err(error(format!(
                "duplicate key {key} (first on line {first})"
            )));
        }
        env.insert(key.to_string(), value.to_string());
    }
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_text(text: &str) -> Result<BTreeMap<String, String>, String> {
        parse(Path::new("gpu02.env"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn key_value_lines_comments_and_blank_lines_are_read() {
        let text = "# gpu02\n\nGLM53_HICACHE_RAM_BUDGET=406GiB\r\nURLS=http://a:8000,http://b:8000\nEMPTY=\nEQ=a=b\n  # indented comment\n";
        let env = parse_text(text).expect("valid");
        assert_eq!(env["GLM53_HICACHE_RAM_BUDGET"], "406GiB");
        assert_eq!(env["URLS"], "http://a:8000,http://b:8000");
        assert_eq!(env["EMPTY"], "");
        assert_eq!(env["EQ"], "a=b");
        assert_eq!(env.len(), 4);
    }

    #[test]
    fn anything_else_is_refused_with_file_and_line_and_without_the_value() {
        let cases = [
            ("A=1\njust words\n", "gpu02.env:2: expected KEY=VALUE"),
            ("export A=1\n", "gpu02.env:1: invalid key `export A`"),
            ("A = 1\n", "gpu02.env:1: invalid key `A `"),
            ("1A=x\n", "gpu02.env:1: invalid key `1A`"),
            (
                "A=1\n\nA=2\n",
                "gpu02.env:3: duplicate key A (first on line 1)",
            ),
            (
                "A=x\0y\n",
                "gpu02.env:1: the value of A contains a NUL byte",
            ),
        ];
        for (text, expected) in cases {
            let err = parse_text(text).expect_err(text);
            assert!(err.starts_with(expected), "{text:?}: {err}");
        }
        let err = parse_text("TOKEN=s3cret\nnot a line s3cret\n").expect_err("bad line");
        assert!(!err.contains("s3cret"), "values are secrets: {err}");
    }
}
