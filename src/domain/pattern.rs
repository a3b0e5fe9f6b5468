//! Log patterns: a plain substring, or a regular expression when written `re:<regex>`.
//!
//! Matching is case-sensitive (log lines are machine-written; `CUDA error 801` is exact).
//! A pattern serialises back to the text it was written as, so plans, runbooks and step
//! evidence show operators exactly what they typed.

use std::fmt;

use chrono::{DateTime, Utc};
use regex::Regex;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A required pattern and the line that first satisfied it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeenLine {
    /// The required pattern as written.
    pub pattern: String,
    /// The matching line (prefix stripped, cut to `log_watch::MAX_LINE_BYTES`).
    pub line: String,
    /// When the poll that first showed it was made.
    pub first_seen_at: DateTime<Utc>,
}

/// The prefix that marks a pattern as a regular expression.
pub const REGEX_PREFIX: &str = "re:";

/// One required or forbidden log line pattern.
#[derive(Clone)]
pub enum LogPattern {
    /// Matches a line that contains this text.
    Substring(String),
    /// Matches a line the regex finds a match in. `source` is the original text, including
    /// the `re:` prefix.
    Regex {
        /// The pattern as written, `re:` included.
        source: String,
        /// The compiled expression (without the prefix).
        re: Regex,
    },
}

impl LogPattern {
    /// Parses a pattern; empty or whitespace-only patterns and invalid regexes are refused.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            return Err("empty log pattern (it would match every line)".to_string());
        }
        match text.strip_prefix(REGEX_PREFIX) {
            Some(expr) => {
                if expr.is_empty() {
                    return Err(format!(
                        "empty regular expression in `{text}` (it would match every line)"
                    ));
                }
                let re = Regex::new(expr)
                    .map_err(|e| format!("invalid regular expression in `{text}`: {e}"))?;
                Ok(Self::Regex {
                    source: text.to_string(),
                    re,
                })
            }
            None => Ok(Self::Substring(text.to_string())),
        }
    }

    /// Whether `line` matches.
    pub fn matches(&self, line: &str) -> bool {
        match self {
            Self::Substring(needle) => line.contains(needle.as_str()),
            Self::Regex { re, .. } => re.is_match(line),
        }
    }

    /// Whether `line`, or `part` of it, matches: what a log watch asks of a line and its
    /// message without the compose prefix. `part` must be a piece of `line` (the message
    /// is its end); a substring found in `part` is then found in `line`, so only `line` is
    /// searched for one (a soak searches 500 lines per probe). A regex can tell
    /// them apart (`^`), so it is tried on both.
    pub fn matches_line_or_part(&self, line: &str, part: &str) -> bool {
        match self {
            Self::Substring(_) => {
                debug_assert!(line.contains(part), "{part:?} is not a piece of {line:?}");
                self.matches(line)
            }
            Self::Regex { .. } => self.matches(line) || self.matches(part),
        }
    }

    /// The pattern exactly as written (with `re:` for a regex).
    pub fn as_str(&self) -> &str {
        match self {
            Self::Substring(text) => text,
            Self::Regex { source, .. } => source,
        }
    }
}

impl fmt::Debug for LogPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LogPattern({:?})", self.as_str())
    }
}

impl fmt::Display for LogPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Two patterns are equal when they were written the same way.
impl PartialEq for LogPattern {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for LogPattern {}

impl Serialize for LogPattern {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for LogPattern {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// A companion's log (the proxy's) watched by a `soak` or an `analyze` step: its new lines
/// that match one of `patterns` and name the target are counted and kept; more than `max`
/// fail the step `companion_log_limit`. Lines printed before the step began (or, in an
/// analysis, during its warm-up) are not counted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompanionWatch {
    /// The compose service whose log is read (`proxy-glm53`).
    pub service: crate::domain::names::ServiceName,
    /// The lines counted (`Backend marked unhealthy`), when they also name the target.
    pub patterns: Vec<LogPattern>,
    /// How many may appear during the step (an analysis: past its warm-up).
    #[serde(default)]
    pub max: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_or_its_message_matches_as_either_alone_would() {
        let line = "model-sg-r2  | ready: CUDA error 801";
        let message = &line["model-sg-r2  | ".len()..];
        let patterns = [
            "CUDA error",
            "model-sg",
            "r2  | re",
            "ready",
            "absent",
            "re:^ready",
            "re:^model",
            "re:801$",
            "re:^r2",
            "re:x^",
        ];
        for text in patterns {
            let p = pattern(text);
            for (whole, part) in [
                (line, message),
                (line, line),
                (line, ""),
                (message, message),
            ] {
                assert_eq!(
                    p.matches_line_or_part(whole, part),
                    p.matches(whole) || p.matches(part),
                    "{text} on {whole:?} / {part:?}"
                );
            }
        }
    }

    fn pattern(text: &str) -> LogPattern {
        LogPattern::parse(text).expect("valid pattern")
    }

    #[test]
    fn substrings_and_regexes_match_as_documented() {
        let cases = [
            (
                "CUDA error 801",
                "RuntimeError: CUDA error 801: operation not supported",
                true,
            ),
            ("CUDA error 801", "cuda error 801", false),
            ("[event-loop-stall]", "WARN [event-loop-stall] 3.2s", true),
            (
                "re:rank_budget_bytes=\\d+",
                "HiCache startup RAM: rank_budget_bytes=108984795136",
                true,
            ),
            ("re:^ready$", "not ready", false),
            ("re:(?i)out of memory", "CUDA Out Of Memory", true),
        ];
        for (text, line, expected) in cases {
            assert_eq!(pattern(text).matches(line), expected, "{text} vs {line}");
        }
    }

    #[test]
    fn a_pattern_keeps_the_text_it_was_written_as() {
        assert_eq!(pattern("re:a+b").as_str(), "re:a+b");
        assert_eq!(pattern("plain").as_str(), "plain");
        assert_eq!(pattern("re:x"), pattern("re:x"));
        assert_ne!(pattern("re:x"), pattern("x"));
        assert_eq!(format!("{:?}", pattern("re:x")), "LogPattern(\"re:x\")");
    }

    #[test]
    fn empty_and_invalid_patterns_are_refused_with_the_pattern_quoted() {
        let cases = [
            ("", "empty log pattern"),
            ("   ", "empty log pattern"),
            ("re:", "empty regular expression in `re:`"),
            (
                "re:(unclosed",
                "invalid regular expression in `re:(unclosed`",
            ),
        ];
        for (text, expected) in cases {
            let err = LogPattern::parse(text).expect_err(text);
            assert!(err.contains(expected), "{text}: {err}");
        }
    }

    #[test]
    fn patterns_serialise_as_their_original_text() {
        let list: Vec<LogPattern> =
            serde_json::from_str(r#"["a", "re:b.c"]"#).expect("valid patterns");
        assert!(matches!(list[1], LogPattern::Regex { .. }));
        assert_eq!(
            serde_json::to_string(&list).expect("serialises"),
            r#"["a","re:b.c"]"#
        );
        let err = serde_json::from_str::<Vec<LogPattern>>(r#"["re:("]"#).expect_err("bad regex");
        assert!(
            err.to_string().contains("invalid regular expression"),
            "{err}"
        );
    }
}
