//! Every unknown key of a YAML document at once, in file order.
//!
//! A type with `#[serde(deny_unknown_fields)]` refuses the first unknown key it meets and stops
//! there, so a file with three typos needs three edits and three runs to learn of them. Here
//! the document is read again without each key serde refused, until it refuses none, and every
//! refused key is answered with its path, its line and serde's own message (which lists the
//! keys that type takes).

use serde::de::DeserializeOwned;
use serde_yaml::Value;

/// At most this many unknown keys are reported (each costs one more read of the document).
const MAX_REPORTED: usize = 50;

/// One step of a path, owned.
#[derive(Debug, Clone)]
pub(crate) enum Step {
    Key(String),
    Index(usize),
}

/// A key `T` refused, found by [`refused_keys`].
#[derive(Debug, Clone)]
pub(crate) struct Refused {
    /// The path of the mapping that holds the key, from the document read.
    pub parent: Vec<Step>,
    /// The key as written.
    pub key: String,
    /// serde's message.
    pub message: String,
}

impl Refused {
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
