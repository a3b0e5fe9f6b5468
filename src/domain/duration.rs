//! Durations as written in runbooks and the config file: an integer and a unit.
//!
//! The grammar is deliberately tiny: `<digits><unit>` with unit `ms`, `s`, `m` or `h`
//! (`200ms`, `5s`, `45m`, `1h`). No fractions, no signs, no spaces, no days, no bare numbers:
//! a timeout is read by people at 3 a.m., and `5` (seconds? minutes?) is how outages start.

use std::time::Duration;

/// Parses `200ms`, `5s`, `45m` or `1h`. `0s` is a valid duration; callers that need a
/// positive one check for zero themselves.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(digits_end);
    if digits.is_empty() {
        return Err(format!(
            "invalid duration `{s}`: expected an integer and a unit (ms, s, m, h), e.g. `5s` or `45m`"
        ));
    }
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "" => {
            return Err(format!(
                "invalid duration `{s}`: missing unit (ms, s, m, h), e.g. `{s}s`"
            ))
        }
        other => {
            return Err(format!(
                "invalid duration `{s}`: unknown unit `{other}` (expected ms, s, m or h, with no fraction or space)"
            ))
        }
    };
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("invalid duration `{s}`: number too large"))?;
    let millis = value
        .checked_mul(millis_per_unit)
        .ok_or_else(|| format!("invalid duration `{s}`: number too large"))?;
    Ok(Duration::from_millis(millis))
}

/// Formats a duration in the largest unit that represents it exactly (`90s`, `45m`, `1h`,
/// `1500ms`), so that `parse_duration(&format_duration(d)) == d` for whole milliseconds.
/// Sub-millisecond parts are truncated.
pub fn format_duration(d: Duration) -> String {
    let millis = d.as_millis();
    if millis == 0 {
        return "0s".to_string();
    }
    for (unit, per) in [("h", 3_600_000u128), ("m", 60_000), ("s", 1_000)] {
        if millis.is_multiple_of(per) {
            return format!("{}{unit}", millis / per);
        }
    }
    format!("{millis}ms")
}

/// `#[serde(with = "crate::domain::duration::serde_duration")]` for `Duration` fields written
/// as `5s`/`45m` strings.
pub mod serde_duration {
    use std::time::Duration;

    use serde::{Deserializer, Serializer};

    /// Writes the duration as a string such as `45m`.
    pub fn serialize<S: Serializer>(d: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&super::format_duration(*d))
    }

    /// Reads a string such as `45m`; anything else is "expected a duration such as `5s` or
    /// `45m`".
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        deserializer.deserialize_str(DurationText)
    }

    struct DurationText;

    impl serde::de::Visitor<'_> for DurationText {
        type Value = Duration;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a duration such as `5s` or `45m`")
        }

        fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Duration, E> {
            super::parse_duration(text).map_err(E::custom)
        }
    }

    /// The same for `Option<Duration>` (`null` or absent is `None`; pair with `#[serde(default)]`).
    pub mod option {
        use std::time::Duration;

        use serde::{Deserialize, Deserializer, Serializer};

        /// Writes `Some(d)` as a string such as `45m`, `None` as null.
        pub fn serialize<S: Serializer>(
            d: &Option<Duration>,
            serializer: S,
        ) -> Result<S::Ok, S::Error> {
            match d {
                Some(d) => serializer.serialize_str(&super::super::format_duration(*d)),
                None => serializer.serialize_none(),
            }
        }

        /// Reads an optional string such as `45m`.
        pub fn deserialize<'de, D: Deserializer<'de>>(
            deserializer: D,
        ) -> Result<Option<Duration>, D::Error> {
            match Option::<String>::deserialize(deserializer)? {
                Some(text) => super::super::parse_duration(&text)
                    .map(Some)
                    .map_err(serde::de::Error::custom),
                None => Ok(None),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_with_a_unit_parse() {
        let cases = [
            ("200ms", Duration::from_millis(200)),
            ("5s", Duration::from_secs(5)),
            ("45m", Duration::from_secs(45 * 60)),
            ("1h", Duration::from_secs(3600)),
            ("0s", Duration::ZERO),
            ("05s", Duration::from_secs(5)),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_duration(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn anything_else_is_refused_with_the_text_quoted() {
        let cases = [
            ("0.5s", "unknown unit `.5s`"),
            ("5", "missing unit"),
            ("-1s", "expected an integer and a unit"),
            ("+1s", "expected an integer and a unit"),
            ("5 s", "unknown unit ` s`"),
            ("1d", "unknown unit `d`"),
            ("5S", "unknown unit `S`"),
            ("", "expected an integer and a unit"),
            ("s", "expected an integer and a unit"),
            ("99999999999999999999s", "number too large"),
            ("18446744073709551615h", "number too large"),
        ];
        for (text, expected) in cases {
            let err = parse_duration(text).expect_err(text);
            assert!(err.contains(expected), "{text}: {err}");
            assert!(err.contains(&format!("`{text}`")), "{text}: {err}");
        }
    }

    #[test]
    fn formatting_picks_the_largest_exact_unit_and_round_trips() {
        let cases = [
            (Duration::from_millis(200), "200ms"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_secs(600), "10m"),
            (Duration::from_secs(7200), "2h"),
            (Duration::ZERO, "0s"),
        ];
        for (d, text) in cases {
            assert_eq!(format_duration(d), text);
            assert_eq!(parse_duration(text), Ok(d));
        }
    }

    #[test]
    fn serde_helpers_read_and_write_strings() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct T {
            #[serde(with = "serde_duration")]
            a: Duration,
            #[serde(default, with = "serde_duration::option")]
            b: Option<Duration>,
        }
        let t: T = serde_json::from_str(r#"{"a": "5s"}"#).expect("valid");
        assert_eq!(
            t,
            T {
                a: Duration::from_secs(5),
                b: None
            }
        );
        let json = serde_json::to_string(&T {
            a: Duration::from_secs(60),
            b: Some(Duration::from_millis(5)),
        })
        .expect("serialises");
        assert_eq!(json, r#"{"a":"1m","b":"5ms"}"#);
        let err = serde_json::from_str::<T>(r#"{"a": "5"}"#).expect_err("no unit");
        assert!(err.to_string().contains("missing unit"), "{err}");
    }
}
