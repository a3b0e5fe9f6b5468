//! Answers of compose-manager's JSON (non-streaming) endpoints, as the engine keeps them.

use std::collections::BTreeMap;

use std::fmt;

use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use super::error::ComposeError;

/// One container from `GET /docker/ps` (`docker ps --format json`); missing keys are empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PsEntry {
    /// `ID`.
    pub id: String,
    /// `Names` (the container name, e.g. `model-sg-glm53-w4afp8-tp4-r2`).
    pub names: String,
    /// `Image`.
    pub image: String,
    /// `State`, e.g. `running`.
    pub state: String,
    /// `Status`, e.g. `Up 3 hours (healthy)`.
    pub status: String,
    /// `Labels`, docker's comma-separated `k=v` text.
    pub labels: String,
}

impl PsEntry {
    /// Whether this is the container of compose service `service`: its name, or its
    /// `com.docker.compose.service` label.
    pub fn is_service(&self, service: &str) -> bool {
        is_service(&self.names, &self.labels, service)
    }
}

/// [`PsEntry::is_service`] on a container's `Names` and `Labels`.
fn is_service(names: &str, labels: &str, service: &str) -> bool {
    names == service
        || labels
            .split(',')
            .any(|l| l.strip_prefix("com.docker.compose.service=") == Some(service))
}

/// `GET /host/cache` (newest compose-manager): each volume's used size and the cached weight
/// repos (`models--org--repo`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostCache {
    #[serde(default)]
    pub volumes: Vec<CacheVolume>,
    #[serde(default)]
    pub weights: Vec<String>,
}

/// One volume of [`HostCache`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheVolume {
    pub name: String,
    pub size_bytes: u64,
}

/// `GET /status`: the operation holding the host's lock, if any.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostStatus {
    /// `None` when the host is idle.
    #[serde(default)]
    pub in_flight: Option<InFlight>,
}

/// The operation in flight on a host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InFlight {
    /// `compose_up` (also dry runs), `compose_down`, `docker_restart`, ...
    #[serde(default)]
    pub action: String,
    /// RFC 3339.
    #[serde(default)]
    pub started_at: Option<String>,
    /// Tag of a compose operation.
    #[serde(default)]
    pub tag: Option<String>,
    /// Compose file of a compose operation.
    #[serde(default)]
    pub file: Option<String>,
    /// Services it was scoped to (empty when unscoped).
    #[serde(default)]
    pub services: Vec<String>,
}

/// `GET /version`: the top-level fields are the last *attempted* up; `projects` the last
/// *successful* ones per compose project.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionInfo {
    /// Tag of the last attempted up.
    #[serde(default)]
    pub tag: Option<String>,
    /// Commit SHA the tag resolved to.
    #[serde(default)]
    pub commit: Option<String>,
    /// Compose file of the last attempted up.
    #[serde(default)]
    pub file: Option<String>,
    /// SHA-256 of that compose file.
    #[serde(default)]
    pub file_sha256: Option<String>,
    /// compose-manager's own image digest.
    #[serde(default)]
    pub image: Option<String>,
    /// Keyed by compose project (`work` by default).
    #[serde(default)]
    pub projects: BTreeMap<String, ProjectDeployments>,
}

/// The current and previous successful deployment of one compose project.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProjectDeployments {
    /// The last successful deployment.
    #[serde(default)]
    pub current: Option<DeployedRecord>,
    /// The one before it; absent until a second success.
    #[serde(default)]
    pub previous: Option<DeployedRecord>,
}

/// One deployment record of compose-manager.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeployedRecord {
    /// Tag deployed.
    #[serde(default)]
    pub tag: Option<String>,
    /// Commit SHA of the tag.
    #[serde(default)]
    pub commit: Option<String>,
    /// Compose file deployed.
    #[serde(default)]
    pub file: Option<String>,
    /// SHA-256 of the compose file.
    #[serde(default)]
    pub file_sha256: Option<String>,
}

/// Splits the `output` of `GET /docker/ps` (one JSON object per line) into entries.
pub(crate) fn parse_ps_output(endpoint: &str, output: &str) -> Result<Vec<PsEntry>, ComposeError> {
    let mut entries = Vec::new();
    for_each_ps_line(endpoint, output, |line| {
        entries.push(line.to_entry());
    })?;
    Ok(entries)
}

/// The first entry of the `GET /docker/ps` output that is `service`'s container, after every
/// line was checked as [`parse_ps_output`] checks it (the same errors); only that entry is
/// copied out of the answer.
pub(crate) fn find_service_entry(
    endpoint: &str,
    output: &str,
    service: &str,
) -> Result<Option<PsEntry>, ComposeError> {
    let mut found = None;
    for_each_ps_line(endpoint, output, |line| {
        if found.is_none() && is_service(line.names(), line.labels(), service) {
            found = Some(line.to_entry());
        }
    })?;
    Ok(found)
}

/// Parses every non-blank line of a `docker ps` output, in order, into a [`PsLine`] that
/// borrows from `output` (a soak reads `docker ps` at every probe). A line that is
/// not JSON, or not a JSON object, is the same protocol error as ever, naming the line.
fn for_each_ps_line<'a>(
    endpoint: &str,
    output: &'a str,
    mut each: impl FnMut(&PsLine<'a>),
) -> Result<(), ComposeError> {
    for (index, line) in output.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let parsed: PsLineOrNot<'a> = serde_json::from_str(line).map_err(|e| {
            ComposeError::protocol(endpoint, index + 1, line, format!("not JSON: {e}"))
        })?;
        let PsLineOrNot::Object(parsed) = parsed else {
            return Err(ComposeError::protocol(
                endpoint,
                index + 1,
                line,
                "not a JSON object",
            ));
        };
        each(&parsed);
    }
    Ok(())
}

/// One line of `docker ps --format json`, borrowing its text from the answer where it can:
/// only the six keys [`PsEntry`] keeps are read, every other value is parsed and dropped.
/// Read exactly as a `serde_json::Value` object reads: a missing or `null`
/// key is empty, a string is its text, any other value its JSON text, and a key given
/// twice keeps its last value.
#[derive(Debug, Default)]
pub(crate) struct PsLine<'a> {
    id: Text<'a>,
    names: Text<'a>,
    image: Text<'a>,
    state: Text<'a>,
    status: Text<'a>,
    labels: Text<'a>,
}

impl PsLine<'_> {
    /// `Names`.
    pub(crate) fn names(&self) -> &str {
        self.names.as_str()
    }

    /// `Labels`.
    pub(crate) fn labels(&self) -> &str {
        self.labels.as_str()
    }

    fn to_entry(&self) -> PsEntry {
        PsEntry {
            id: self.id.as_str().to_owned(),
            names: self.names.as_str().to_owned(),
            image: self.image.as_str().to_owned(),
            state: self.state.as_str().to_owned(),
            status: self.status.as_str().to_owned(),
            labels: self.labels.as_str().to_owned(),
        }
    }
}

/// A value's text: borrowed from the line unless it had escapes or was not a string.
#[derive(Debug)]
enum Text<'a> {
    Borrowed(&'a str),
    Owned(String),
}

impl Default for Text<'_> {
    fn default() -> Self {
        Self::Borrowed("")
    }
}

impl Text<'_> {
    fn as_str(&self) -> &str {
        match self {
            Self::Borrowed(s) => s,
            Self::Owned(s) => s,
        }
    }
}

/// A whole `docker ps` line: an object, or any other JSON value (an error for the caller).
enum PsLineOrNot<'a> {
    Object(PsLine<'a>),
    NotObject,
}

/// The keys of [`PsLine`]; any other is `Other`.
enum Key {
    Id,
    Names,
    Image,
    State,
    Status,
    Labels,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, key: &str) -> Result<Key, E> {
                Ok(match key {
                    "ID" => Key::Id,
                    "Names" => Key::Names,
                    "Image" => Key::Image,
                    "State" => Key::State,
                    "Status" => Key::Status,
                    "Labels" => Key::Labels,
                    _ => Key::Other,
                })
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

impl<'de> Deserialize<'de> for PsLineOrNot<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct LineVisitor;
        impl<'de> Visitor<'de> for LineVisitor {
            type Value = PsLineOrNot<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut line = PsLine::default();
                while let Some(key) = map.next_key::<Key>()? {
                    let slot = match key {
                        Key::Id => &mut line.id,
                        Key::Names => &mut line.names,
                        Key::Image => &mut line.image,
                        Key::State => &mut line.state,
                        Key::Status => &mut line.status,
                        Key::Labels => &mut line.labels,
                        Key::Other => {
                            map.next_value::<Skip>()?;
                            continue;
                        }
                    };
                    *slot = map.next_value::<Text<'de>>()?;
                }
                Ok(PsLineOrNot::Object(line))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<Skip>()?.is_some() {}
                Ok(PsLineOrNot::NotObject)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(PsLineOrNot::NotObject)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(PsLineOrNot::NotObject)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(PsLineOrNot::NotObject)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(PsLineOrNot::NotObject)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(PsLineOrNot::NotObject)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(PsLineOrNot::NotObject)
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(PsLineOrNot::NotObject)
            }
        }
        deserializer.deserialize_any(LineVisitor)
    }
}

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(Text::Borrowed(s))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Text::Owned(s.to_owned()))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
                Ok(Text::Owned(s))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Text::default())
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Text::default())
            }
            fn visit_bool<E: de::Error>(self, b: bool) -> Result<Self::Value, E> {
                Ok(Text::Owned(b.to_string()))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Self::Value, E> {
                Ok(Text::Owned(Value::from(n).to_string()))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
                Ok(Text::Owned(Value::from(n).to_string()))
            }
            fn visit_f64<E: de::Error>(self, n: f64) -> Result<Self::Value, E> {
                // As `Value` reads it: a float JSON cannot hold is `null`, shown empty.
                Ok(match serde_json::Number::from_f64(n) {
                    Some(n) => Text::Owned(n.to_string()),
                    None => Text::default(),
                })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                let value = Value::deserialize(de::value::SeqAccessDeserializer::new(seq))?;
                Ok(Text::Owned(value.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                let value = Value::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(Text::Owned(value.to_string()))
            }
        }
        deserializer.deserialize_any(TextVisitor)
    }
}

/// Any JSON value, parsed (as strictly as a `Value` would be) and dropped.
struct Skip;

impl<'de> Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SkipVisitor;
        impl<'de> Visitor<'de> for SkipVisitor {
            type Value = Skip;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_none<E: de::Error>(self) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Skip, A::Error> {
                while seq.next_element::<Skip>()?.is_some() {}
                Ok(Skip)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Skip, A::Error> {
                while map.next_entry::<Skip, Skip>()?.is_some() {}
                Ok(Skip)
            }
        }
        deserializer.deserialize_any(SkipVisitor)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// `docker ps` lines read as `serde_json::Value` objects: the reference the borrowing
    /// parser is held to.
    fn parse_ps_output_as_values(
        endpoint: &str,
        output: &str,
    ) -> Result<Vec<PsEntry>, ComposeError> {
        let mut entries = Vec::new();
        for (index, line) in output.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let value: Value = serde_json::from_str(line).map_err(|e| {
                ComposeError::protocol(endpoint, index + 1, line, format!("not JSON: {e}"))
            })?;
            let Value::Object(map) = value else {
                return Err(ComposeError::protocol(
                    endpoint,
                    index + 1,
                    line,
                    "not a JSON object",
                ));
            };
            let text = |key: &str| match map.get(key) {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
            };
            entries.push(PsEntry {
                id: text("ID"),
                names: text("Names"),
                image: text("Image"),
                state: text("State"),
                status: text("Status"),
                labels: text("Labels"),
            });
        }
        Ok(entries)
    }

    /// Both parsers' answers, as text: entries or the error (line, excerpt and reason).
    fn both(output: &str) -> (String, String) {
        (
            format!("{:?}", parse_ps_output("/docker/ps", output)),
            format!("{:?}", parse_ps_output_as_values("/docker/ps", output)),
        )
    }

    #[test]
    fn the_borrowing_ps_parser_reads_every_kind_of_line_as_the_value_parser_did() {
        let deep = format!("{{\"Mounts\":{}{}}}", "[".repeat(200), "]".repeat(200));
        let lines = [
            r#"{"ID":"abc","Names":"r2","Image":"sglang@sha256:1","State":"running","Status":"Up 3 hours (healthy)","Labels":"a=b,com.docker.compose.service=r2"}"#,
            // Escapes in values and in keys, unicode, a key given twice (the last wins).
            r#"{"ID":"a\"b\\c\n","Names":"r\u0032","I\u0044":"escaped-key","Status":"Up 1 second","Status":"Up 2 seconds"}"#,
            r#"{"Names":"é ✓ \ud83d\ude00","Labels":""}"#,
            r#"{"ID":"x","ID":7}"#,
            // Non-string values: their JSON text; null and missing: empty.
            r#"{"ID":12,"Names":-0,"Image":1.0,"State":true,"Status":null,"Labels":{"b":[1,2.5e3,"x"],"a":null}}"#,
            r#"{"ID":18446744073709551615,"Names":-9223372036854775808,"Image":123456789012345678901234567890,"State":1e-7,"Labels":[]}"#,
            // Unknown keys of every kind are parsed and dropped.
            r#"{"Command":"\"python3 -m sglang\"","Mounts":[{"a":[[[]]]}],"Ports":null,"Size":0,"ID":"x"}"#,
            "{}",
            "  {\"ID\" : \"spaced\" }  ",
            // Not objects.
            "[]",
            "[1,{\"a\":2}]",
            "\"text\"",
            "42",
            "null",
            "true",
            // Not JSON.
            "not json",
            "{\"ID\":\"a\"",
            "{\"ID\":\"a\"} trailing",
            "{\"ID\":1e400}",
            "{\"Other\":1e400}",
            "{\"ID\":\"bad \\x escape\"}",
            "{\"ID\":\"lone \\ud800 surrogate\"}",
            "{ID:1}",
            "{\"ID\":\"a\",}",
            "[1,2",
            // The recursion limit holds in a skipped value as it did in a `Value`.
            deep.as_str(),
        ];
        for line in lines {
            let (new, old) = both(line);
            assert_eq!(new, old, "{line}");
            let (new, old) = both(&format!("{{\"ID\":\"first\"}}\n\n{line}\n"));
            assert_eq!(new, old, "second line: {line}");
        }
        assert!(both(&deep).0.contains("recursion limit"));
    }

    /// A `docker ps` line as a broken or unusual host might write it.
    fn ps_line() -> impl Strategy<Value = String> {
        let key = prop_oneof![
            Just("ID".to_owned()),
            Just("Names".to_owned()),
            Just("Image".to_owned()),
            Just("State".to_owned()),
            Just("Status".to_owned()),
            Just("Labels".to_owned()),
            Just("Command".to_owned()),
            "\\PC{0,8}",
        ];
        // A key as JSON text, sometimes with every character escaped.
        let key_text = (key, any::<bool>()).prop_map(|(k, escape)| {
            if escape {
                let mut out = String::from("\"");
                for unit in k.encode_utf16() {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
                out.push('"');
                out
            } else {
                serde_json::to_string(&k).expect("a string")
            }
        });
        let leaf = prop_oneof![
            "\\PC{0,12}".prop_map(|s| serde_json::to_string(&s).expect("a string")),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            any::<f64>().prop_map(|n| serde_json::to_string(&n).expect("a number")),
            Just("-0".to_owned()),
            Just("1.0".to_owned()),
            Just("1E5".to_owned()),
            Just("123456789012345678901234567890".to_owned()),
            Just("1e400".to_owned()),
            Just("true".to_owned()),
            Just("null".to_owned()),
            Just(r#""\u00e9\n\t\"\\""#.to_owned()),
        ];
        let value = leaf.prop_recursive(3, 12, 3, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3)
                    .prop_map(|items| format!("[{}]", items.join(","))),
                proptest::collection::vec(("[a-z]{0,3}", inner), 0..3).prop_map(|fields| {
                    let fields: Vec<String> =
                        fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                    format!("{{{}}}", fields.join(","))
                }),
            ]
        });
        let object =
            proptest::collection::vec((key_text, value.clone()), 0..8).prop_map(|fields| {
                let fields: Vec<String> = fields.iter().map(|(k, v)| format!("{k}:{v}")).collect();
                format!("{{{}}}", fields.join(","))
            });
        prop_oneof![
            6 => object.clone(),
            1 => value,
            // Cut short anywhere (on a character boundary).
            1 => (object, any::<proptest::sample::Index>()).prop_map(|(line, at)| {
                let mut end = at.index(line.len() + 1);
                while !line.is_char_boundary(end) {
                    end -= 1;
                }
                line[..end].to_owned()
            }),
            1 => "\\PC{0,20}",
        ]
    }

    proptest! {
        #![proptest_config(crate::domain::fuzz::config())]

        #[test]
        fn the_borrowing_ps_parser_equals_the_value_parser_on_any_output(
            lines in proptest::collection::vec(ps_line(), 0..5)
        ) {
            let output = lines.join("\n");
            let (new, old) = both(&output);
            prop_assert_eq!(new, old, "{}", output);
        }
    }

    #[test]
    fn ps_output_is_split_into_entries_with_missing_keys_empty() {
        let output = concat!(
            r#"{"ID":"abc","Names":"nginx","Image":"nginx:1","State":"running","Status":"Up 1 hour","Labels":"a=b"}"#,
            "\n\n",
            r#"{"ID":"def","Names":"model-sg-glm53-w4afp8-tp4-r2","Image":"sglang@sha256:1"}"#,
            "\n"
        );
        let entries = parse_ps_output("/docker/ps", output).expect("parses");
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].labels, "a=b");
        assert_eq!(entries[1].names, "model-sg-glm53-w4afp8-tp4-r2");
        assert_eq!(entries[1].state, "");
    }

    #[test]
    fn a_ps_line_that_is_not_json_is_a_protocol_error_naming_the_line() {
        let err = parse_ps_output("/docker/ps", "{\"ID\":\"a\"}\nnot json\n").err();
        assert!(
            matches!(err, Some(ComposeError::Protocol { line_no: 2, .. })),
            "{err:?}"
        );
    }

    #[test]
    fn version_and_status_parse_with_omitted_keys() {
        let v: VersionInfo = serde_json::from_str(
            r#"{"status":"ok","tag":"v2","projects":{"work":{"current":{"tag":"v2","file":"prod/a.yaml"}}}}"#,
        )
        .expect("parses");
        assert_eq!(v.tag.as_deref(), Some("v2"));
        let work = &v.projects["work"];
        assert_eq!(
            work.current.as_ref().and_then(|c| c.file.as_deref()),
            Some("prod/a.yaml")
        );
        assert!(work.previous.is_none());
        let fresh: VersionInfo = serde_json::from_str(r#"{"status":"ok"}"#).expect("parses");
        assert_eq!(fresh, VersionInfo::default());

        let idle: HostStatus =
            serde_json::from_str(r#"{"status":"ok","in_flight":null}"#).expect("parses");
        assert!(idle.in_flight.is_none());
        let busy: HostStatus = serde_json::from_str(
            r#"{"status":"ok","in_flight":{"action":"compose_up","started_at":"2026-05-01T00:00:00Z","services":["r2"],"container":"x"}}"#,
        )
        .expect("parses");
        let in_flight = busy.in_flight.expect("busy");
        assert_eq!(in_flight.action, "compose_up");
        assert_eq!(in_flight.services, vec!["r2".to_owned()]);
        assert!(in_flight.tag.is_none());
    }
}
