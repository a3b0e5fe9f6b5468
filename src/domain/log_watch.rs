//! Watches successive `compose/logs` tails for required and forbidden lines.
//!
//! compose-manager's `compose/logs` answers a buffered tail (`--tail N`), so each poll sees a
//! window that moves: lines repeat between polls and old ones scroll away. `LogWatch` keeps what
//! it has learnt across polls: a required pattern, once matched, stays matched (with the line
//! and the time of the poll that first showed it); a forbidden line is reported at first sight
//! and the verdict stays `Forbidden` from then on, even after the line scrolls away.
//!
//! Lines may carry compose's `service  | ` prefix (and ANSI colours); patterns are tried on
//! both the raw line and the message without the prefix, so `re:^ready$` works on the message.
//! Scoping to the new container's lines (not the previous container's) is the engine's job.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::pattern::{LogPattern, SeenLine};

/// Reported lines are cut to this many bytes, to keep step evidence small.
pub const MAX_LINE_BYTES: usize = 1000;

/// The state of the watch after a poll.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum LogVerdict {
    /// Some required pattern has not appeared yet.
    Pending,
    /// Every required pattern has appeared and no forbidden line has (for a forbid-only watch,
    /// as in `soak`: nothing forbidden so far).
    Satisfied,
    /// A forbidden line appeared; the step fails at once.
    Forbidden {
        /// The forbidden pattern as written.
        pattern: String,
        /// The offending line (prefix stripped, cut to `MAX_LINE_BYTES`).
        line: String,
    },
}

/// Required and forbidden patterns, and what has been seen of them so far.
#[derive(Debug, Clone)]
pub struct LogWatch {
    require: Vec<LogPattern>,
    forbid: Vec<LogPattern>,
    seen: Vec<Option<SeenLine>>,
    forbidden: Option<(String, String)>,
}

impl LogWatch {
    /// A watch for `require` (all must appear) and `forbid` (none may appear). Duplicate
    /// patterns are kept once. Empty `require` makes a forbid-only watch, as used by `soak`.
    pub fn new(require: Vec<LogPattern>, forbid: Vec<LogPattern>) -> Self {
        let require = dedup(require);
        let seen = vec![None; require.len()];
        Self {
            require,
            forbid: dedup(forbid),
            seen,
            forbidden: None,
        }
    }

    /// Looks at one `compose/logs` output, taken at `now`, and answers the verdict.
    pub fn observe(&mut self, output: &str, now: DateTime<Utc>) -> LogVerdict {
        if self.forbidden.is_some() || self.nothing_to_find_in(output) {
            return self.verdict();
        }
        self.scan_lines(output, now);
        self.verdict()
    }

    /// Whether no line of `output` can match a pattern still watched: each is a substring
    /// that the whole output does not contain, and no line has ANSI codes (removing them
    /// could join text). Every line (without its `\r`, with or without its prefix) is a
    /// piece of `output`, so a substring absent from `output` is absent from every line:
    /// one search of the output per pattern instead of one per line (a soak
    /// reads 500 lines per probe, nearly all of them seen before and matching nothing).
    fn nothing_to_find_in(&self, output: &str) -> bool {
        if output.contains('\u{1b}') {
            return false;
        }
        let unseen = self
            .require
            .iter()
            .zip(&self.seen)
            .filter(|(_, seen)| seen.is_none())
            .map(|(pattern, _)| pattern);
        self.forbid
            .iter()
            .chain(unseen)
            .all(|pattern| match pattern {
                LogPattern::Substring(needle) => !output.contains(needle.as_str()),
                LogPattern::Regex { .. } => false,
            })
    }

    /// Tries every line of `output` against the patterns still watched.
    fn scan_lines(&mut self, output: &str, now: DateTime<Utc>) {
        for raw in output.lines() {
            let raw = strip_ansi(raw.trim_end_matches('\r'));
            let message = strip_compose_prefix(&raw);
            let hit = |p: &LogPattern| p.matches_line_or_part(&raw, message);
            if let Some(pattern) = self.forbid.iter().find(|p| hit(p)) {
                self.forbidden = Some((pattern.as_str().to_string(), clip(message)));
                break;
            }
            for (pattern, seen) in self.require.iter().zip(self.seen.iter_mut()) {
                if seen.is_none() && hit(pattern) {
                    *seen = Some(SeenLine {
                        pattern: pattern.as_str().to_string(),
                        line: clip(message),
                        first_seen_at: now,
                    });
                }
            }
        }
    }

    /// The verdict from everything observed so far.
    pub fn verdict(&self) -> LogVerdict {
        if let Some((pattern, line)) = &self.forbidden {
            LogVerdict::Forbidden {
                pattern: pattern.clone(),
                line: line.clone(),
            }
        } else if self.seen.iter().all(Option::is_some) {
            LogVerdict::Satisfied
        } else {
            LogVerdict::Pending
        }
    }

    /// The required patterns seen so far, in the order they were required.
    pub fn seen(&self) -> Vec<SeenLine> {
        self.seen.iter().flatten().cloned().collect()
    }

    /// The required patterns not seen yet, as written.
    pub fn missing(&self) -> Vec<String> {
        self.require
            .iter()
            .zip(&self.seen)
            .filter(|(_, seen)| seen.is_none())
            .map(|(pattern, _)| pattern.as_str().to_string())
            .collect()
    }
}

fn dedup(patterns: Vec<LogPattern>) -> Vec<LogPattern> {
    let mut out: Vec<LogPattern> = Vec::with_capacity(patterns.len());
    for p in patterns {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// The message of a compose log line: `model-sg-r2  | text` → `text`. Lines without the
/// prefix come back unchanged.
pub fn strip_compose_prefix(line: &str) -> &str {
    let name_end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
        .unwrap_or(line.len());
    if name_end == 0 {
        return line;
    }
    let after_name = &line[name_end..];
    let rest = after_name.trim_start_matches(' ');
    match rest.strip_prefix('|') {
        // compose pads the name with at least one space before the bar.
        Some(message) if rest.len() < after_name.len() => {
            message.strip_prefix(' ').unwrap_or(message)
        }
        _ => line,
    }
}

/// Removes ANSI colour sequences (`ESC [ ... m`), which compose adds on a terminal.
/// Borrowed when there is nothing to strip: a soak reads 500 lines per probe.
fn strip_ansi(line: &str) -> std::borrow::Cow<'_, str> {
    if !line.contains('\u{1b}') {
        return std::borrow::Cow::Borrowed(line);
    }
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

fn clip(line: &str) -> String {
    if line.len() <= MAX_LINE_BYTES {
        return line.to_string();
    }
    let mut end = MAX_LINE_BYTES;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &line[..end])
}

/// Lines of a block kept at most (an event-loop stall dump is tens of lines).
pub const MAX_BLOCK_LINES: usize = 200;

/// The whole multi-line block a forbidden `line` (as the watch reported it) begins in
/// `output`: that line and the lines after it up to the next log record (a message that
/// starts with a timestamp, `[2026-…` or `2026-…`) or a blank line, at most
/// [`MAX_BLOCK_LINES`], prefixes stripped. Just the line when it is not found.
pub fn block_at(output: &str, line: &str) -> Vec<String> {
    let messages: Vec<String> = output
        .lines()
        .map(|raw| strip_compose_prefix(&strip_ansi(raw.trim_end_matches('\r'))).to_owned())
        .collect();
    let Some(start) = messages.iter().position(|m| clip(m) == line) else {
        return vec![line.to_owned()];
    };
    let starts_record = |m: &str| {
        let m = m.strip_prefix('[').unwrap_or(m);
        m.len() >= 5 && m.as_bytes()[..4].iter().all(u8::is_ascii_digit) && m.as_bytes()[4] == b'-'
    };
    let mut block = vec![clip(&messages[start])];
    for m in messages[start + 1..].iter().take(MAX_BLOCK_LINES - 1) {
        if m.trim().is_empty() || starts_record(m) {
            break;
        }
        block.push(clip(m));
    }
    block
}

/// A companion's log read again (the proxy's): the lines after `cursor` (the [`line_id`] of
/// the line the previous read ended on, found at its last occurrence; every line when it is
/// absent or has rolled out of the tail) that match one of `patterns` and name `name`, and the
/// cursor for the next read (this read's last line). The cursor is an id, not the line: a
/// line kept in evidence is masked, and would no longer be found.
pub fn new_lines_naming<'a>(
    output: &'a str,
    cursor: Option<&str>,
    patterns: &[LogPattern],
    name: &str,
) -> (Vec<&'a str>, Option<String>) {
    let lines: Vec<&str> = output.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = cursor
        .and_then(|c| lines.iter().rposition(|l| line_id(l) == c))
        .map_or(0, |i| i + 1);
    let found = lines[start..]
        .iter()
        .copied()
        .filter(|l| l.contains(name) && patterns.iter().any(|p| p.matches(l)))
        .collect();
    let next = lines
        .last()
        .map(|l| line_id(l))
        .or_else(|| cursor.map(str::to_owned));
    (found, next)
}

/// A log line's id: the first 16 hex digits of its SHA-256.
pub fn line_id(line: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(line.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use proptest::prelude::*;

    use super::*;

    fn at(second: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 10, 8, 12, 0, second)
            .single()
            .expect("valid time")
    }

    fn patterns(list: &[&str]) -> Vec<LogPattern> {
        list.iter()
            .map(|p| LogPattern::parse(p).expect("valid pattern"))
            .collect()
    }

    fn canary_watch() -> LogWatch {
        LogWatch::new(
            patterns(&[
                "event-loop stall dump armed",
                "re:rank_budget_bytes=108984795136\\b",
            ]),
            patterns(&[
                "CUDA error 801",
                "Traceback (most recent call last)",
                "out of memory",
            ]),
        )
    }

    const R2: &str = "model-sg-glm53-w4afp8-tp4-r2  | ";

    /// `observe` without the whole-output search: every line tried: the reference the fuzz test holds `observe` to.
    fn observe_every_line(watch: &mut LogWatch, output: &str, now: DateTime<Utc>) -> LogVerdict {
        if watch.forbidden.is_none() {
            watch.scan_lines(output, now);
        }
        watch.verdict()
    }

    /// Lines with and without the compose prefix, ANSI codes, `\r`, and pieces of the
    /// patterns below (whole, split by a colour code, across two lines).
    fn log_line() -> impl Strategy<Value = String> {
        let text = prop_oneof![
            Just("Decode batch. #running-req: 3".to_owned()),
            Just("CUDA error 801".to_owned()),
            Just("CUDA \u{1b}[31merror\u{1b}[0m 801".to_owned()),
            Just("CUDA".to_owned()),
            Just("error 801".to_owned()),
            Just("ready".to_owned()),
            Just("\u{1b}[32mready\u{1b}[0m".to_owned()),
            Just("not ready".to_owned()),
            Just("WARN [event-loop-stall] blocked".to_owned()),
            Just("out of".to_owned()),
            Just("memory".to_owned()),
            "\\PC{0,12}",
        ];
        (text, 0..3u8, any::<bool>()).prop_map(|(text, prefix, cr)| {
            let prefix = ["", "svc-1  | ", "svc-1 |"][prefix as usize];
            format!("{prefix}{text}{}", if cr { "\r" } else { "" })
        })
    }

    proptest! {
        #![proptest_config(crate::domain::fuzz::config())]

        #[test]
        fn searching_the_whole_output_first_gives_the_verdicts_of_trying_every_line(
            reads in proptest::collection::vec(proptest::collection::vec(log_line(), 0..6), 1..5),
            require in proptest::sample::subsequence(vec!["ready", "re:^ready$", "CUDA error", "out of\nmemory"], 0..3),
            forbid in proptest::sample::subsequence(vec!["CUDA error 801", "[event-loop-stall]", "re:error \\d+", "out of memory"], 0..3),
        ) {
            let mut fast = LogWatch::new(patterns(&require), patterns(&forbid));
            let mut every = fast.clone();
            for (i, lines) in reads.iter().enumerate() {
                let output = lines.join("\n");
                let now = at(i as u32);
                prop_assert_eq!(fast.observe(&output, now), observe_every_line(&mut every, &output, now));
                prop_assert_eq!(fast.seen(), every.seen());
                prop_assert_eq!(fast.missing(), every.missing());
            }
        }
    }

    #[test]
    fn required_lines_are_remembered_across_moving_windows() {
        let mut watch = canary_watch();
        let first = format!("{R2}loading weights\n{R2}HiCache startup RAM: ranks=4 rank_budget_bytes=108984795136 reserve_bytes=10737418240\n");
        assert_eq!(watch.observe(&first, at(0)), LogVerdict::Pending);
        assert_eq!(watch.missing(), vec!["event-loop stall dump armed"]);
        // The budget line has scrolled away; the stall line arrives.
        let second =
            format!("{R2}KV pool ready\n{R2}event-loop stall dump armed: path=/tmp/stall\n");
        assert_eq!(watch.observe(&second, at(5)), LogVerdict::Satisfied);
        assert!(watch.missing().is_empty());
        let seen = watch.seen();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].pattern, "event-loop stall dump armed");
        assert_eq!(seen[0].line, "event-loop stall dump armed: path=/tmp/stall");
        assert_eq!(seen[0].first_seen_at, at(5));
        assert_eq!(seen[1].first_seen_at, at(0));
        // The same lines again do not move the first sighting.
        assert_eq!(watch.observe(&second, at(10)), LogVerdict::Satisfied);
        assert_eq!(watch.seen()[0].first_seen_at, at(5));
    }

    #[test]
    fn a_forbidden_line_fails_at_once_and_stays_failed() {
        let mut watch = canary_watch();
        let output = format!(
            "{R2}event-loop stall dump armed\n{R2}rank_budget_bytes=108984795136\n{R2}RuntimeError: CUDA error 801: operation not supported\n"
        );
        let expected = LogVerdict::Forbidden {
            pattern: "CUDA error 801".to_string(),
            line: "RuntimeError: CUDA error 801: operation not supported".to_string(),
        };
        assert_eq!(watch.observe(&output, at(0)), expected);
        assert_eq!(watch.observe("all quiet now", at(5)), expected);
        assert_eq!(watch.verdict(), expected);
    }

    #[test]
    fn a_forbid_only_watch_is_satisfied_until_something_forbidden_appears() {
        let mut soak = LogWatch::new(vec![], patterns(&["[event-loop-stall]", "CUDA error"]));
        assert_eq!(soak.observe("", at(0)), LogVerdict::Satisfied);
        assert_eq!(
            soak.observe(&format!("{R2}200 OK"), at(5)),
            LogVerdict::Satisfied
        );
        let verdict = soak.observe(&format!("{R2}WARN [event-loop-stall] blocked 3.1s"), at(10));
        assert!(
            matches!(verdict, LogVerdict::Forbidden { ref pattern, .. } if pattern == "[event-loop-stall]")
        );
    }

    #[test]
    fn anchored_regexes_see_the_message_without_the_compose_prefix() {
        let mut watch = LogWatch::new(patterns(&["re:^ready$"]), vec![]);
        assert_eq!(
            watch.observe("svc-1  | not ready\r\n", at(0)),
            LogVerdict::Pending
        );
        assert_eq!(
            watch.observe("svc-1  | \u{1b}[32mready\u{1b}[0m\r\n", at(1)),
            LogVerdict::Satisfied
        );
    }

    #[test]
    fn the_compose_prefix_is_stripped_only_when_it_is_one() {
        let cases = [
            ("model-sg-glm53-w4afp8-tp4-r2  | hello", "hello"),
            ("svc | x | y", "x | y"),
            ("svc  |", ""),
            ("plain line", "plain line"),
            ("a|b", "a|b"),
            ("| leading bar", "| leading bar"),
            ("", ""),
        ];
        for (line, expected) in cases {
            assert_eq!(strip_compose_prefix(line), expected, "{line}");
        }
    }

    #[test]
    fn duplicate_patterns_are_watched_once_and_long_lines_are_cut() {
        let mut watch = LogWatch::new(patterns(&["x", "x"]), vec![]);
        assert_eq!(watch.missing(), vec!["x"]);
        let long = format!("x{}", "é".repeat(MAX_LINE_BYTES));
        assert_eq!(watch.observe(&long, at(0)), LogVerdict::Satisfied);
        let line = &watch.seen()[0].line;
        assert!(line.len() <= MAX_LINE_BYTES + "…".len() && line.ends_with('…'));
    }

    #[test]
    fn a_companions_new_lines_naming_the_target_are_found_after_the_cursor() {
        let patterns = [LogPattern::parse("Backend marked unhealthy").expect("pattern")];
        let log = "t1 Backend marked unhealthy r2\nt2 Backend recovered r2\nt3 Backend marked unhealthy r1\nt4 Backend marked unhealthy r2\n";
        let id = |l: &str| line_id(l);
        let (t2, t4) = (
            id("t2 Backend recovered r2"),
            id("t4 Backend marked unhealthy r2"),
        );
        let gone = id("t0 gone");
        // (cursor, lines found, next cursor)
        let both = vec![
            "t1 Backend marked unhealthy r2",
            "t4 Backend marked unhealthy r2",
        ];
        let table: [(Option<&str>, Vec<&str>); 4] = [
            (None, both.clone()),
            (Some(&t2), vec!["t4 Backend marked unhealthy r2"]),
            (Some(&t4), vec![]),
            // A cursor rolled out of the tail: every line is new.
            (Some(&gone), both),
        ];
        for (cursor, found) in table {
            let (got, cur) = new_lines_naming(log, cursor, &patterns, "r2");
            assert_eq!(got, found, "after {cursor:?}");
            assert_eq!(cur.as_deref(), Some(t4.as_str()), "after {cursor:?}");
        }
        assert_eq!(
            new_lines_naming("", Some("x"), &patterns, "r2"),
            (vec![], Some("x".to_owned()))
        );
    }

    #[test]
    fn a_forbidden_line_keeps_its_whole_block_up_to_the_next_record() {
        let log = "r2  | [2026-12-06 05:00:00] decode batch\n\
r2  | [2026-12-06 05:00:01] [event-loop-stall] loop stalled 31.2s; dumping stacks\n\
r2  | Thread 0x7f01 (most recent call first):\n\
r2  |   File \"scheduler.py\", line 812 in event_loop\n\
r2  |   File \"tp_worker.py\", line 90 in forward\n\
r2  | [2026-12-06 05:00:02] decode batch\n";
        let line = "[2026-12-06 05:00:01] [event-loop-stall] loop stalled 31.2s; dumping stacks";
        assert_eq!(
            block_at(log, line),
            [
                line,
                "Thread 0x7f01 (most recent call first):",
                "  File \"scheduler.py\", line 812 in event_loop",
                "  File \"tp_worker.py\", line 90 in forward",
            ]
        );
        assert_eq!(
            block_at(log, "absent"),
            ["absent"],
            "just the line when not found"
        );
        let last = "r2  | 2026-12-06T05:00:03Z Traceback (most recent call last):\nr2  |   x\n";
        assert_eq!(
            block_at(
                last,
                "2026-12-06T05:00:03Z Traceback (most recent call last):"
            )
            .len(),
            2
        );
    }
}
