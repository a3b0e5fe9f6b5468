//! Every unknown key of a document at once, in the order written: the one way canaryd finds
//! them, in configs, runbooks (and each step), plans and API bodies.
//!
//! A type with `#[serde(deny_unknown_fields)]` refuses the first unknown key it meets and stops
//! there, so a file with three typos needs three edits and three runs to learn of them. Here
//! the document is read again without each key serde refused (an unknown one, or one whose
//! value it refused, so that the keys after it are still read), until it refuses none, and
//! every unknown key is answered with its path, its line and serde's own message.

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
/// [`MAX_REPORTED`]). A key whose value serde refuses is set aside the same way, so that the
/// unknown keys after it are still found (that error is reported when there is no unknown
/// key); the search ends at an error no key can be blamed for (a missing field). Empty when
/// there is no unknown key.
pub(crate) fn refused_keys<T: DeserializeOwned>(mut doc: Value) -> Vec<Refused> {
    let mut found = Vec::new();
    for _ in 0..2 * MAX_REPORTED {
        let Err(err) = serde_path_to_error::deserialize::<_, T>(doc.clone()) else {
            break;
        };
        let message = err.inner().to_string();
        let Some(mut parent) = path_of(err.path()) else {
            break;
        };
        let unknown = refused_key(&message);
        // The path ends at the refused key itself (or at the key whose value is refused).
        let key = match (unknown.clone(), parent.last()) {
            (Some(key), Some(Step::Key(k))) if *k == key => parent.pop().map(|_| key),
            (Some(key), _) => Some(key),
            (None, Some(Step::Key(_))) => match parent.pop() {
                Some(Step::Key(k)) => Some(k),
                _ => None,
            },
            (None, _) => None,
        };
        let Some(key) = key.filter(|key| remove(&mut doc, &parent, key)) else {
            break;
        };
        if unknown.is_some() {
            found.push(Refused {
                parent,
                key,
                message,
            });
            if found.len() == MAX_REPORTED {
                break;
            }
        }
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
    use serde::Deserialize;

    use super::refused_keys;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Doc {
        count: u32,
        #[serde(default)]
        inner: Option<Inner>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        name: String,
    }

    /// Each document: the unknown keys found, as `parent.key`, in the order written.
    #[test]
    fn every_unknown_key_is_found_in_order_even_after_a_value_serde_refuses() {
        let cases: [(&str, &[&str]); 7] = [
            ("count: 1\n", &[]),
            ("count: 1\nzeal: 2\n", &["zeal"]),
            (
                "zeal: 2\ncount: 1\ninner: {name: a, colour: b}\n",
                &["zeal", "inner.colour"],
            ),
            // The wrong count comes first: the keys after it are still reported.
            (
                "count: many\nzeal: 2\ninner: {name: 7, colour: b}\n",
                &["zeal", "inner.colour"],
            ),
            // A wrong value alone is no unknown key (its own error is reported instead).
            ("count: many\n", &[]),
            ("zeal: 1\n", &["zeal"]),
            // A mapping missing a field is set aside like a wrong value; a document missing
            // one ends the search, what was found before it kept.
            ("inner: {}\ncount: 1\nzeal: 1\n", &["zeal"]),
        ];
        for (yaml, want) in cases {
            let doc: serde_yaml::Value = serde_yaml::from_str(yaml).expect("yaml");
            let got: Vec<String> = refused_keys::<Doc>(doc)
                .into_iter()
                .map(|r| match r.parent_shown() {
                    p if p.is_empty() => r.key,
                    p => format!("{p}.{}", r.key),
                })
                .collect();
            assert_eq!(got, want, "{yaml}");
        }
    }
}
