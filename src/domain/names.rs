//! The three names canaryd forwards to compose-manager, each a type that can only hold a
//! valid value: [`Tag`] (a git tag of the compose repo), [`ComposeFile`] (a compose file's path
//! in it) and [`ServiceName`] (one compose service). Each is parsed once where it enters
//! (a plan, a release, a rollback, a CLI flag, a stored row) by its one rule below, and is
//! used as it is after: a compose call cannot be built from an unchecked string.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A value that breaks its name's rule: which name (`tag`), why, and the value as shown back
/// (cut, escaped).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {why}, got \"{shown}\"")]
pub struct InvalidName {
    pub what: &'static str,
    pub why: &'static str,
    pub shown: String,
}

macro_rules! checked_name {
    ($(#[$doc:meta])* $name:ident, $what:literal, $rule:ident, $shown_chars:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// `value`, when it keeps the rule.
            pub fn parse(value: impl Into<String>) -> Result<Self, InvalidName> {
                let value = value.into();
                match $rule(&value) {
                    None => Ok(Self(value)),
                    Some(why) => Err(InvalidName {
                        what: $what,
                        why,
                        shown: shown(&value, $shown_chars),
                    }),
                }
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = InvalidName;
            fn try_from(value: String) -> Result<Self, InvalidName> {
                Self::parse(value)
            }
        }

        impl std::str::FromStr for $name {
            type Err = InvalidName;
            fn from_str(value: &str) -> Result<Self, InvalidName> {
                Self::parse(value)
            }
        }

        impl From<$name> for String {
            fn from(name: $name) -> String {
                name.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

    };
}

checked_name!(
    /// A git tag of the compose repo (`v0.0.452`), by [`tag_problem`]'s rule.
    Tag, "tag", tag_problem, 64
);
checked_name!(
    /// A compose file's path in the compose repo (`prod/NAME.yaml`), by [`file_problem`]'s rule.
    ComposeFile, "file", file_problem, 160
);
checked_name!(
    /// One compose service (`model-sg-glm53-w4afp8-tp4-r2`), by [`service_problem`]'s rule.
    ServiceName, "service", service_problem, 160
);

/// A command-line value of `T`, checked by its one rule and kept as the string given (clap's
/// `value_parser`: a refused value is a usage error naming the flag).
pub fn arg<T: std::str::FromStr<Err = InvalidName>>(value: &str) -> Result<String, String> {
    value
        .parse::<T>()
        .map(|_| value.to_owned())
        .map_err(|e| format!("{}, got \"{}\"", e.why, e.shown))
}

/// `value` as a message shows it: escaped, at most `chars` characters, `...` when cut.
fn shown(value: &str, chars: usize) -> String {
    let escaped: String = value.escape_debug().take(chars).collect();
    if value.escape_debug().nth(chars).is_some() {
        format!("{escaped}...")
    } else {
        escaped
    }
}

/// Why `file` is not a compose file canaryd names to compose-manager: a relative path under
/// `prod/` of the compose repo, in `[A-Za-z0-9._/-]`, with no `..`, empty or `.` segment,
/// ending `.yaml` or `.yml`; `None` when it is one. compose-manager builds the raw-file URL of
/// the git host from it, and a URL parser decodes `%2e` and resolves the dots: so no `%` at
/// all, nor a backslash (a slash to some parsers), nor any character outside the set (a
/// full-width dot, NUL, a control character), and `..` in no spelling (safety rule 24). The
/// one rule: plans, releases, rollbacks' `replaces` and every compose call check it.
pub fn file_problem(file: &str) -> Option<&'static str> {
    if file.is_empty() {
        return Some("must be a compose file path such as prod/NAME.yaml");
    }
    if file.starts_with('/') || file.starts_with('\\') || file.starts_with('~') {
        return Some("must be a path relative to the compose repo (not absolute)");
    }
    if file.contains('%') {
        return Some("must not be percent-encoded (`%`): compose-manager's URL would decode it");
    }
    if file.contains('\\') {
        return Some("must not contain backslashes");
    }
    if file.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Some("must not contain spaces, NUL or control characters");
    }
    if file.contains("..") {
        return Some("must not contain `..`");
    }
    if !file
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-'))
    {
        return Some("may only contain letters, digits and `._/-`");
    }
    if !file.starts_with("prod/") {
        return Some("must be under prod/");
    }
    if file.split('/').any(|seg| seg.is_empty() || seg == ".") {
        return Some("must not contain empty or `.` path segments");
    }
    if !(file.ends_with(".yaml") || file.ends_with(".yml")) {
        return Some("must be a .yaml or .yml file");
    }
    None
}

/// The longest tag accepted: git allows more, but no release tag comes close, and a tag ends
/// up in compose-manager's URLs to the git host.
pub const MAX_TAG_BYTES: usize = 128;

/// Why `tag` is not a git tag name canaryd forwards (`git check-ref-format` for
/// `refs/tags/<tag>`, in the letters compose-manager accepts, not starting with `-`, at most
/// [`MAX_TAG_BYTES`]); `None` when it is one.
pub fn tag_problem(tag: &str) -> Option<&'static str> {
    if tag.is_empty() {
        return Some("must be a git tag of the compose repo such as v0.0.452");
    }
    if tag.len() > MAX_TAG_BYTES {
        return Some("must be at most 128 bytes");
    }
    if !tag
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-'))
    {
        return Some("may only contain letters, digits and `._/-`");
    }
    if tag.starts_with('-') {
        return Some("must not start with `-`");
    }
    if tag.starts_with('/') || tag.ends_with('/') || tag.contains("//") {
        return Some("must not start or end with `/` or contain `//` (git ref rules)");
    }
    if tag.contains("..") {
        return Some("must not contain `..` (git ref rules)");
    }
    if tag.ends_with('.') {
        return Some("must not end with `.` (git ref rules)");
    }
    for part in tag.split('/') {
        if part.starts_with('.') {
            return Some("no `/`-separated part may start with `.` (git ref rules)");
        }
        if part.ends_with(".lock") {
            return Some("no `/`-separated part may end with `.lock` (git ref rules)");
        }
    }
    None
}

/// Why `service` is not one compose service name (`[A-Za-z0-9._-]+`: never empty, a list or
/// a pattern, so no call can be unscoped); `None` when it is one.
pub fn service_problem(service: &str) -> Option<&'static str> {
    if service.trim().is_empty() {
        return Some("must name one compose service");
    }
    if service.contains(',') || service.chars().any(char::is_whitespace) {
        return Some("must be exactly one compose service name (no commas or spaces)");
    }
    if !service
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Some("must be a compose service name ([A-Za-z0-9._-])");
    }
    None
}

#[cfg(test)]
mod tests;
