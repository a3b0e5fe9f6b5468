//! Every unknown key of a YAML document at once, in file order.
//!
//! A type with `#[serde(deny_unknown_fields)]` refuses the first unknown key it meets and stops
//! there, so a file with three typos needs three edits and three runs to learn of them. Here
//! the document is read again without each key serde refused, until it refuses none, and every
//! refused key is answered with its path, its line and serde's own message (which lists the
//! keys that type takes).

use serde::de::DeserializeOwned;
use serde_yaml::Value;

use super::yaml_line::{locate, Seg};

/// At most this many unknown keys are reported (each costs one more read of the document).
const MAX_REPORTED: usize = 50;

/// One key a type does not take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownKey {
    /// Where the mapping that holds the key is: `hosts.gpu02`, `steps[2]`; empty at the top.
    pub parent: String,
    /// The key as written.
    pub key: String,
    /// 1-based line of the key in the source, when it can be found.
    pub line: Option<usize>,
    /// serde's message: "unknown field `sudo`, expected one of `url`, `token_env`".
    pub message: String,
}

/// One step of a path, owned.
#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Index(usize),
}

/// Every key of `source` that `T` refuses as unknown, in file order. Empty when there is none,
/// and when the document does not parse or fails for another reason first: the caller's own
/// read then reports that as it always does.
pub fn unknown_keys<T: DeserializeOwned>(source: &str) -> Vec<UnknownKey> {
    let Ok(doc) = serde_yaml::from_str::<Value>(source) else {
        return Vec::new();
    };
    let mut found: Vec<UnknownKey> = refused_keys::<T>(doc)
        .into_iter()
        .map(|r| UnknownKey {
            parent: r.parent_shown(),
            line: locate(source, &r.at(&[])),
            key: r.key,
            message: r.message,
        })
        .collect();
    found.sort_by_key(|k| k.line.unwrap_or(usize::MAX));
    found
}

/// A key `T` refused, found by [`refused_keys`].
#[derive(Debug, Clone)]
pub(crate) struct Refused {
    /// The path of the mapping that holds the key, from the document read.
    parent: Vec<Step>,
    /// The key as written.
    pub key: String,
    /// serde's message.
    pub message: String,
}

impl Refused {
    /// The key's path below `prefix`, for [`locate`].
    pub fn at<'a>(&'a self, prefix: &[Seg<'a>]) -> Vec<Seg<'a>> {
        let mut at = prefix.to_vec();
        at.extend(self.parent.iter().map(|s| match s {
            Step::Key(k) => Seg::Key(k),
            Step::Index(i) => Seg::Index(*i),
        }));
        at.push(Seg::Key(&self.key));
        at
    }

    /// `hosts.gpu02`, `checks[0]`; empty when the key is at the top of the document read.
    pub fn parent_shown(&self) -> String {
        shown(&self.parent)
    }
}

/// Every key of `doc` that `T` refuses as unknown, in the order serde meets them (at most
/// [`MAX_REPORTED`]). Empty when there is none, and when `doc` fails for another reason first.
pub(crate) fn refused_keys<T: DeserializeOwned>(mut doc: Value) -> Vec<Refused> {
    let mut found = Vec::new();
    while found.len() < MAX_REPORTED {
        let Err(err) = serde_path_to_error::deserialize::<_, T>(doc.clone()) else {
            break;
        };
        let message = err.inner().to_string();
        let Some(key) = refused_key(&message) else {
            break;
        };
        let Some(mut parent) = path_of(err.path()) else {
            break;
        };
        // The path ends at the refused key itself.
        if matches!(parent.last(), Some(Step::Key(k)) if *k == key) {
            parent.pop();
        }
        if !remove(&mut doc, &parent, &key) {
            break;
        }
        found.push(Refused {
            parent,
            key,
            message,
        });
    }
    found
}

/// The key of serde's "unknown field `x`, expected ..." message.
fn refused_key(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    Some(rest[..rest.find('`')?].to_string())
}

/// The path serde_path_to_error gives for an unknown key (ending at the key). `None`
/// for a path through an enum or an unknown step, which this cannot walk.
fn path_of(path: &serde_path_to_error::Path) -> Option<Vec<Step>> {
    use serde_path_to_error::Segment;
    path.iter()
        .map(|segment| match segment {
            Segment::Map { key } => Some(Step::Key(key.clone())),
            Segment::Seq { index } => Some(Step::Index(*index)),
            Segment::Enum { .. } | Segment::Unknown => None,
        })
        .collect()
}

/// Removes `key` from the mapping at `parent`; whether it was there.
fn remove(doc: &mut Value, parent: &[Step], key: &str) -> bool {
    let mut here = doc;
    for step in parent {
        let next = match (step, here) {
            (Step::Key(k), Value::Mapping(map)) => map.get_mut(k.as_str()),
            (Step::Index(i), Value::Sequence(items)) => items.get_mut(*i),
            _ => None,
        };
        match next {
            Some(value) => here = value,
            None => return false,
        }
    }
    match here {
        Value::Mapping(map) => map.shift_remove(key).is_some(),
        _ => false,
    }
}

/// `hosts.gpu02.replicas[1]`.
fn shown(path: &[Step]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Key(k) if out.is_empty() => out.push_str(k),
            Step::Key(k) => {
                out.push('.');
                out.push_str(k);
            }
            Step::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::*;

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
        let found = unknown_keys::<Top>(source);
        let seen: Vec<(&str, &str, Option<usize>)> = found
            .iter()
            .map(|k| (k.parent.as_str(), k.key.as_str(), k.line))
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
    fn a_document_without_unknown_keys_or_failing_otherwise_gives_none() {
        assert!(unknown_keys::<Top>("name: x\nhosts: {a: {url: u}}\n").is_empty());
        assert!(
            unknown_keys::<Top>("name: [\n").is_empty(),
            "a syntax error"
        );
        assert!(
            unknown_keys::<Top>("name: [1]\n").is_empty(),
            "a type error"
        );
    }
}
