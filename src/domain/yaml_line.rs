//! How runbooks and plans are read from YAML: [`read`] (a document) and [`read_node`] (a part
//! of one, such as a runbook's step) deserialise a type with serde and answer every error
//! with its line; [`locate`] finds the line of a key or list item in YAML source text.
//!
//! `serde_yaml` reports a line for syntax and type errors, but errors found after
//! deserialisation (a duplicate step name, a missing env var) only know a path such as
//! `steps[3].interval`. This module scans the source for that path. It understands block
//! mappings and sequences (including a sequence at the same indent as its key) and finds keys
//! inside one-line or wrapped flow mappings (`- {name: up, kind: up, timeout: 30m}`). It is a
//! best-effort locator, not a parser: when a segment cannot be found it answers the line of the
//! deepest segment that was.

use serde::de::DeserializeOwned;
use serde_yaml::Value;

use super::unknown_keys::{refused_keys, Refused, Step};

/// Something wrong in a YAML document read by [`read`] or [`read_node`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YamlError {
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// Where, below the node read: `timeout`, `checks[0].name`; empty for the node itself.
    /// For an unknown key, the mapping that holds it.
    pub path: String,
    /// The key the type does not take, when that is the error.
    pub unknown: Option<String>,
    /// serde's message, without its own ` at line N column M`.
    pub message: String,
}

/// Reads `T` from the YAML document `source`: a syntax error, or every key `T` does not take
/// (at once, in file order), or the first other error, each with its line.
pub fn read<T: DeserializeOwned>(source: &str) -> Result<T, Vec<YamlError>> {
    let doc: Value = serde_yaml::from_str(source).map_err(|e| {
        let (line, message) = describe_yaml_error(&e);
        vec![YamlError {
            line,
            path: String::new(),
            unknown: None,
            message,
        }]
    })?;
    read_node(source, &[], doc)
}

/// Reads `T` from `node`, the part of the document `source` at `at` (a runbook's step):
/// every key `T` does not take, in file order, or the first other error, each with its line.
pub fn read_node<T: DeserializeOwned>(
    source: &str,
    at: &[Seg<'_>],
    node: Value,
) -> Result<T, Vec<YamlError>> {
    let mut unknown: Vec<YamlError> = refused_keys::<T>(node.clone())
        .into_iter()
        .map(|r| YamlError {
            line: locate(source, &refused_at(&r, at)),
            path: r.parent_shown(),
            message: r.message.clone(),
            unknown: Some(r.key),
        })
        .collect();
    if !unknown.is_empty() {
        unknown.sort_by_key(|e| e.line.unwrap_or(usize::MAX));
        return Err(unknown);
    }
    serde_path_to_error::deserialize(node).map_err(|e| {
        use serde_path_to_error::Segment;
        let mut path = at.to_vec();
        path.extend(e.path().iter().filter_map(|segment| match segment {
            Segment::Map { key } => Some(Seg::Key(key)),
            Segment::Seq { index } => Some(Seg::Index(*index)),
            Segment::Enum { .. } | Segment::Unknown => None,
        }));
        let shown = e.path().to_string();
        vec![YamlError {
            line: locate(source, &path),
            path: if shown == "." { String::new() } else { shown },
            unknown: None,
            message: e.inner().to_string(),
        }]
    })
}

/// The path of the key `r` refused, below `prefix`, for [`locate`].
fn refused_at<'a>(r: &'a Refused, prefix: &[Seg<'a>]) -> Vec<Seg<'a>> {
    let mut at = prefix.to_vec();
    at.extend(r.parent.iter().map(|s| match s {
        Step::Key(k) => Seg::Key(k),
        Step::Index(i) => Seg::Index(*i),
    }));
    at.push(Seg::Key(&r.key));
    at
}

/// One step of a path into a YAML document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seg<'a> {
    /// A mapping key.
    Key(&'a str),
    /// The n-th (0-based) item of a sequence.
    Index(usize),
}

/// A region of the source: from line `start` (at column `col` on that line, or from the first
/// non-blank line's indent when `None`) up to line `end` (exclusive).
#[derive(Debug, Clone, Copy)]
struct Block {
    start: usize,
    col: Option<usize>,
    end: usize,
}

/// The 1-based line of `path` in `source`, or of its deepest segment that could be found;
/// `None` when not even the first segment is there.
pub fn locate(source: &str, path: &[Seg<'_>]) -> Option<usize> {
    let lines: Vec<&str> = source.lines().collect();
    let mut block = Block {
        start: 0,
        col: None,
        end: lines.len(),
    };
    let mut anchor = None;
    for seg in path {
        let found = match seg {
            Seg::Key(key) => find_key(&lines, block, key),
            Seg::Index(n) => find_item(&lines, block, *n),
        };
        match found {
            Some((line, inner)) => {
                anchor = Some(line + 1);
                block = inner;
            }
            None => break,
        }
    }
    anchor
}

/// The line and message of a `serde_yaml` error, with the message's own ` at line N column M`
/// removed (callers print `file:line: message`).
pub fn describe_yaml_error(err: &serde_yaml::Error) -> (Option<usize>, String) {
    let line = err.location().map(|l| l.line());
    let mut message = err.to_string();
    while let Some(at) = message.find(" at line ") {
        let rest = &message[at + " at line ".len()..];
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let Some(after_col) = rest[digits..].strip_prefix(" column ") else {
            break;
        };
        let col_digits = after_col
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(after_col.len());
        let end = message.len() - after_col.len() + col_digits;
        message.replace_range(at..end, "");
    }
    (line, message)
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

fn is_blank(text: &str) -> bool {
    let t = text.trim();
    t.is_empty() || t.starts_with('#') || t == "---"
}

/// The (line, column) of every direct child of `block`.
fn children(lines: &[&str], block: Block) -> (Vec<(usize, usize)>, Option<usize>) {
    let mut child_col = None;
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate().take(block.end).skip(block.start) {
        let (col, text) = match block.col {
            Some(c) if i == block.start => (c, line.get(c..).unwrap_or("")),
            _ => (indent(line), *line),
        };
        if is_blank(text) {
            continue;
        }
        let want = *child_col.get_or_insert(col);
        if col == want {
            out.push((i, col));
        } else if col < want {
            break;
        }
    }
    (out, child_col)
}

/// Where the child at `line` (at column `col`) ends: the next non-blank line at or left of
/// `col`, except that `- ` lines at exactly `col` belong to a key whose value starts below it.
fn child_end(
    lines: &[&str],
    line: usize,
    col: usize,
    block_end: usize,
    value_below: bool,
) -> usize {
    for (i, text) in lines.iter().enumerate().take(block_end).skip(line + 1) {
        if is_blank(text) {
            continue;
        }
        let ind = indent(text);
        let same_level_item = ind == col && value_below && text[ind..].starts_with('-');
        if ind < col || (ind == col && !same_level_item) {
            return i;
        }
    }
    block_end
}

fn key_len_at(text: &str, key: &str) -> Option<usize> {
    for quoted in [key.to_string(), format!("\"{key}\""), format!("'{key}'")] {
        if let Some(rest) = text.strip_prefix(quoted.as_str()) {
            let rest_trimmed = rest.trim_start_matches(' ');
            if let Some(after) = rest_trimmed.strip_prefix(':') {
                if after.is_empty() || after.starts_with([' ', '\t']) {
                    return Some(text.len() - after.len());
                }
            }
        }
    }
    None
}

fn find_key(lines: &[&str], block: Block, key: &str) -> Option<(usize, Block)> {
    let (kids, _) = children(lines, block);
    for (line, col) in kids {
        let text = &lines[line][col..];
        if let Some(len) = key_len_at(text, key) {
            let rest = &text[len..];
            let value_col = col + len + (rest.len() - rest.trim_start().len());
            let value_below = is_blank(rest);
            let end = child_end(lines, line, col, block.end, value_below);
            let inner = if value_below {
                Block {
                    start: line + 1,
                    col: None,
                    end,
                }
            } else {
                Block {
                    start: line,
                    col: Some(value_col),
                    end,
                }
            };
            return Some((line, inner));
        }
    }
    find_flow_key(lines, block, key)
}

/// A key inside a flow mapping: preceded by `{`, `,`, a quote or a space, followed by `: `.
fn find_flow_key(lines: &[&str], block: Block, key: &str) -> Option<(usize, Block)> {
    for (i, line) in lines.iter().enumerate().take(block.end).skip(block.start) {
        let mut search = match block.col {
            Some(c) if i == block.start => c.min(line.len()),
            _ => 0,
        };
        while let Some(pos) = line[search..].find(key) {
            let at = search + pos;
            let prev = line[..at].chars().next_back();
            let before_ok = matches!(prev, None | Some('{' | ',' | ' ' | '\t' | '"' | '\''));
            let after = line[at + key.len()..]
                .trim_start_matches(['"', '\''])
                .trim_start_matches(' ');
            let after_ok = after
                .strip_prefix(':')
                .is_some_and(|a| a.is_empty() || a.starts_with([' ', '\t']));
            if before_ok && after_ok {
                let inner = Block {
                    start: i,
                    col: Some(at),
                    end: i + 1,
                };
                return Some((i, inner));
            }
            search = at + key.len();
        }
    }
    None
}

fn find_item(lines: &[&str], block: Block, n: usize) -> Option<(usize, Block)> {
    let (kids, _) = children(lines, block);
    let items: Vec<(usize, usize)> = kids
        .into_iter()
        .filter(|&(line, col)| {
            let text = &lines[line][col..];
            text == "-" || text.starts_with("- ")
        })
        .collect();
    let &(line, col) = items.get(n)?;
    let text = &lines[line][col + 1..];
    let content_col = col + 1 + (text.len() - text.trim_start().len());
    let end = child_end(lines, line, col, block.end, false);
    let inner = Block {
        start: line,
        col: if is_blank(text) {
            None
        } else {
            Some(content_col)
        },
        end,
    };
    Some((line, inner))
}

#[cfg(test)]
mod tests {
    use super::Seg::{Index, Key};
    use super::*;
    use std::collections::BTreeMap;

    use serde::Deserialize;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Top {
        name: String,
        #[serde(default)]
        hosts: BTreeMap<String, Host>,
        #[serde(default)]
        list: Vec<Host>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Host {
        url: String,
        #[serde(default)]
        token_env: Option<String>,
    }

    #[test]
    fn every_unknown_key_is_found_in_file_order_with_its_line_and_path() {
        let source = "\
colour: blue
name: x
hosts:
  b:
    url: u
    sudo: true
  a:
    url: u
    tokn: T
list:
  - {url: u, port: 1}
zzz: 1
";
        let found = read::<Top>(source).err().expect("unknown keys");
        let seen: Vec<(&str, &str, Option<usize>)> = found
            .iter()
            .map(|e| (e.path.as_str(), e.unknown.as_deref().unwrap_or("-"), e.line))
            .collect();
        assert_eq!(
            seen,
            [
                ("", "colour", Some(1)),
                ("hosts.b", "sudo", Some(6)),
                ("hosts.a", "tokn", Some(9)),
                ("list[0]", "port", Some(11)),
                ("", "zzz", Some(12)),
            ]
        );
        assert!(
            found[2]
                .message
                .starts_with("unknown field `tokn`, expected `url` or `token_env`"),
            "{:?}",
            found[2]
        );
    }

    #[test]
    fn a_document_without_unknown_keys_reads_and_one_failing_otherwise_gives_that_error() {
        assert!(read::<Top>("name: x\nhosts: {a: {url: u}}\n").is_ok());
        for (source, why) in [
            ("name: [\n", "a syntax error"),
            ("name: [1]\n", "a type error"),
        ] {
            let errors = read::<Top>(source).err().expect(why);
            assert_eq!(errors.len(), 1, "{why}: {errors:?}");
            assert_eq!(errors[0].unknown, None, "{why}: {errors:?}");
        }
    }

    const DOC: &str = "\
# a comment
description: demo
steps:
  - {name: snapshot, kind: snapshot}
  - name: down
    kind: down
    # indented comment
    timeout: 10m

  - {name: logs, kind: wait_logs, timeout: 30m,
     require: [\"x\"]}
hosts:
  gpu02:
    token_env: T
    replicas:
      r1: {group: g, health_url: http://a/health}
list:
- a
- b
";

    #[test]
    fn paths_resolve_to_the_line_that_holds_them() {
        let cases: &[(&[Seg<'_>], Option<usize>)] = &[
            (&[Key("description")], Some(2)),
            (&[Key("steps")], Some(3)),
            (&[Key("steps"), Index(0)], Some(4)),
            (&[Key("steps"), Index(0), Key("kind")], Some(4)),
            (&[Key("steps"), Index(1)], Some(5)),
            (&[Key("steps"), Index(1), Key("timeout")], Some(8)),
            (&[Key("steps"), Index(2)], Some(10)),
            (&[Key("steps"), Index(2), Key("require")], Some(11)),
            (&[Key("hosts"), Key("gpu02"), Key("token_env")], Some(14)),
            (
                &[
                    Key("hosts"),
                    Key("gpu02"),
                    Key("replicas"),
                    Key("r1"),
                    Key("health_url"),
                ],
                Some(16),
            ),
            (&[Key("list"), Index(1)], Some(19)),
            (&[Key("steps"), Index(7)], Some(3)),
            (&[Key("hosts"), Key("gpu02"), Key("env_file")], Some(13)),
            (&[Key("nope")], None),
        ];
        for (path, expected) in cases {
            assert_eq!(locate(DOC, path), *expected, "{path:?}");
        }
    }

    #[test]
    fn yaml_errors_give_their_line_without_repeating_it_in_the_message() {
        let err = serde_yaml::from_str::<serde_yaml::Mapping>("a: 1\nb: [\n").expect_err("bad");
        let (line, message) = describe_yaml_error(&err);
        assert_eq!(line, Some(3));
        assert!(!message.contains(" at line "), "{message}");
        assert!(message.contains("while parsing"), "{message}");
    }

    #[test]
    fn a_key_that_only_prefixes_another_is_not_mistaken_for_it() {
        let doc = "timeouts: 1\ntimeout: 2\n";
        assert_eq!(locate(doc, &[Key("timeout")]), Some(2));
        let flow = "- {max_misses: 1, misses: 2}\n";
        assert_eq!(locate(flow, &[Index(0), Key("misses")]), Some(1));
    }
}
