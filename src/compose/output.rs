//! The `output` text of a logs or ps answer (`{"status":"ok","output":"..."}`), decoded into a
//! buffer of the right size at once.
//!
//! serde_json decodes an escaped string into a scratch buffer that starts empty and doubles
//! as it fills: for a soak's 94 KB logs answer and every `docker ps`, at each probe, that is
//! about 8 % of a 1,000-canary soak's CPU. Here the object is parsed as serde reads it (any other
//! keys ignored, a missing `output` is empty), `output` is kept as its raw JSON text, and that
//! text is unescaped into a `String` as long as the raw text, which it can never outgrow.

use serde::Deserialize;
use serde_json::value::RawValue;

/// The answer with `output` still raw (a missing one is empty).
#[derive(Deserialize)]
struct Answer<'a> {
    #[serde(borrow, default)]
    output: Option<&'a RawValue>,
}

/// `output` of the JSON object `text`, decoded; serde_json's message when it is not such an
/// object or `output` is not a string.
pub(crate) fn output_of(text: &str) -> Result<String, String> {
    let answer: Answer<'_> = serde_json::from_str(text).map_err(|e| e.to_string())?;
    match answer.output.map(RawValue::get) {
        None | Some("null") => Ok(String::new()),
        Some(raw) => unescape(raw),
    }
}

/// The text of the JSON string literal `raw` (quotes included, already checked by serde_json
/// as far as `ignore_str` checks: the escapes' letters and hex digits).
fn unescape(raw: &str) -> Result<String, String> {
    let Some(body) = raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) else {
        return Err(format!(
            "invalid type: {}, expected a string",
            raw.chars().take(20).collect::<String>()
        ));
    };
    let bytes = body.as_bytes();
    let mut out = String::with_capacity(body.len());
    let mut at = 0;
    while let Some(found) = memchr::memchr(b'\\', &bytes[at..]) {
        let slash = at + found;
        out.push_str(&body[at..slash]);
        let Some(&letter) = bytes.get(slash + 1) else {
            return Err("a string ends in a lone backslash".into());
        };
        at = slash + 2;
        let c = match letter {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let (c, used) = unicode_escape(&body[at..])?;
                at += used;
                c
            }
            other => return Err(format!("invalid escape \\{}", char::from(other))),
        };
        out.push(c);
    }
    out.push_str(&body[at..]);
    Ok(out)
}

/// The character of `XXXX` (after `\u`) at the start of `rest`, with the bytes it used: a
/// surrogate pair is `XXXX\uYYYY`. A lone surrogate is an error, as serde_json has it.
fn unicode_escape(rest: &str) -> Result<(char, usize), String> {
    let hex = |s: Option<&str>| {
        s.and_then(|h| u32::from_str_radix(h, 16).ok())
            .ok_or_else(|| "invalid \\u escape".to_owned())
    };
    let first = hex(rest.get(..4))?;
    if !(0xD800..0xE000).contains(&first) {
        return char::from_u32(first)
            .map(|c| (c, 4))
            .ok_or_else(|| "invalid \\u escape".to_owned());
    }
    if first >= 0xDC00 || rest.get(4..6) != Some("\\u") {
        return Err("lone surrogate in \\u escape".into());
    }
    let second = hex(rest.get(6..10))?;
    if !(0xDC00..0xE000).contains(&second) {
        return Err("lone surrogate in \\u escape".into());
    }
    let code = 0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00);
    char::from_u32(code)
        .map(|c| (c, 10))
        .ok_or_else(|| "invalid \\u escape".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_decoded_exactly_as_serde_json_decodes_it() {
        let outputs = [
            "",
            "plain",
            "r2-1  | line one\nr2-1  | line \"two\"\n",
            "tab\tcr\rback\\slash/solidus\u{8}\u{c}",
            "{\"ID\":\"abc\",\"Labels\":\"a=b,c=d\"}\n{\"ID\":\"def\"}",
            "unicode é ✓ 😀 \u{1} \u{1f}",
            "\\",
            "ends with an escape\n",
        ];
        for output in outputs {
            // As serde_json writes it, and with every character escaped as \uXXXX.
            let written = serde_json::json!({"status": "ok", "output": output}).to_string();
            assert_eq!(output_of(&written).as_deref(), Ok(output), "{written}");
            let mut escaped = String::from("{\"output\":\"");
            for unit in output.encode_utf16() {
                escaped.push_str(&format!("\\u{unit:04x}"));
            }
            escaped.push_str("\",\"status\":\"ok\"}");
            assert_eq!(output_of(&escaped).as_deref(), Ok(output), "{escaped}");
        }
    }

    #[test]
    fn answers_that_are_not_an_object_with_a_string_output_are_refused() {
        // (answer, decoded output or None for an error)
        let table: [(&str, Option<&str>); 10] = [
            (r#"{"status":"ok"}"#, Some("")),
            (r#"{"output":null}"#, Some("")),
            (r#"{"output":"a","extra":{"nested":[1,2]}}"#, Some("a")),
            (r#"{"output":"\ud83d\ude00"}"#, Some("😀")),
            (r#"{"output":5}"#, None),
            (r#"{"output":["a"]}"#, None),
            (r#"{"output":"\ud83d"}"#, None),
            (r#"{"output":"\ude00x"}"#, None),
            (r#"{"output":"a""#, None),
            ("not json", None),
        ];
        for (answer, want) in table {
            let got = output_of(answer);
            assert_eq!(got.as_deref().ok(), want, "{answer}: {got:?}");
            // serde_json agrees on every one of them.
            let theirs: Result<Option<String>, _> =
                serde_json::from_str::<serde_json::Value>(answer)
                    .map(|v| v.get("output").and_then(|o| o.as_str()).map(str::to_owned));
            if let Some(want) = want {
                assert_eq!(theirs.ok().flatten().unwrap_or_default(), want, "{answer}");
            }
        }
    }
}
