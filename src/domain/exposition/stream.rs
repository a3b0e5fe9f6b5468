//! A page read as it arrives: only the lines of the families an analysis reads are kept, so
//! a scrape never holds an engine's whole page (~200 KiB for ~2,000 series) — 200 canaries
//! scraping target and peer at once would otherwise hold 400 of them, twice over.

use memchr::{memchr, memmem, memrchr};

use super::{is_family_line, ExpositionError, Page};

/// How much of the page's start is kept to tell an exposition page without the families
/// (an empty verdict) from something else (an error), as [`Page::parse_families`] does.
const HEAD_BYTES: usize = 1024;

/// The lines of `families` of a page fed in chunks; [`FamilyLines::finish`] parses them
/// like [`Page::parse_families`] parses a whole page.
///
/// Past the page's first lines (its head, read line by line), a chunk's lines are not
/// visited one by one: the families' names are searched for in the chunk (SIMD substring
/// search), and only the lines they occur in are judged by the same test as a line-by-line reading
/// (`is_family_line`). Every line of a family holds its name, so no line of one is missed;
/// the ~2,000 other lines of an SGLang page cost a scan, not a visit each.
#[derive(Debug)]
pub struct FamilyLines<'a> {
    families: &'a [&'a str],
    /// One searcher per family; empty when a family is named `""` (every line holds that
    /// name: the lines are then visited one by one).
    finders: Vec<memmem::Finder<'a>>,
    /// The current line's bytes so far (a chunk may end mid-line, or mid-character).
    partial: Vec<u8>,
    kept: String,
    head: String,
    /// The starts of a chunk's lines that hold a family's name (kept for its allocation).
    starts: Vec<usize>,
}

impl<'a> FamilyLines<'a> {
    pub fn new(families: &'a [&'a str]) -> Self {
        let finders = if families.iter().any(|f| f.is_empty()) {
            Vec::new()
        } else {
            families.iter().map(memmem::Finder::new).collect()
        };
        FamilyLines {
            families,
            finders,
            partial: Vec::new(),
            kept: String::new(),
            head: String::new(),
            starts: Vec::new(),
        }
    }

    /// Feeds the next chunk of the body.
    pub fn push(&mut self, chunk: &[u8]) {
        let Some(last) = memrchr(b'\n', chunk) else {
            self.partial.extend_from_slice(chunk);
            return;
        };
        let (mut complete, rest) = (&chunk[..last], &chunk[last + 1..]);
        if !self.partial.is_empty() {
            // The line the previous chunk ended in.
            let end = memchr(b'\n', complete).unwrap_or(complete.len());
            self.partial.extend_from_slice(&complete[..end]);
            let line = std::mem::take(&mut self.partial);
            self.line(&line);
            complete = complete.get(end + 1..).unwrap_or_default();
        }
        if !complete.is_empty() {
            self.lines(complete);
        }
        self.partial.extend_from_slice(rest);
    }

    /// Whole lines, `\n` between them (never inside a UTF-8 character).
    fn lines(&mut self, mut complete: &[u8]) {
        // The head, and every line when a family is `""`: one by one.
        while self.head.len() < HEAD_BYTES || self.finders.is_empty() {
            match memchr(b'\n', complete) {
                Some(end) => {
                    self.line(&complete[..end]);
                    complete = &complete[end + 1..];
                }
                None => {
                    self.line(complete);
                    return;
                }
            }
        }
        // The rest: only the lines a family's name occurs in, in the page's order.
        let mut starts = std::mem::take(&mut self.starts);
        starts.clear();
        for finder in &self.finders {
            for at in finder.find_iter(complete) {
                starts.push(memrchr(b'\n', &complete[..at]).map_or(0, |nl| nl + 1));
            }
        }
        starts.sort_unstable();
        starts.dedup();
        for &start in &starts {
            let end = memchr(b'\n', &complete[start..]).map_or(complete.len(), |n| start + n);
            self.line(&complete[start..end]);
        }
        self.starts = starts;
    }

    fn line(&mut self, bytes: &[u8]) {
        match std::str::from_utf8(bytes) {
            Ok(line) => self.line_str(line),
            // What `from_utf8_lossy` answers too, without its slower walk of valid text.
            Err(_) => self.line_str(&String::from_utf8_lossy(bytes)),
        }
    }

    fn line_str(&mut self, line: &str) {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if self.head.len() < HEAD_BYTES {
            self.head.push_str(line);
            self.head.push('\n');
        }
        if is_family_line(line, self.families) {
            self.kept.push_str(line);
            self.kept.push('\n');
        }
    }

    /// The page's families, parsed; an error for a body that is not exposition text.
    pub fn finish(mut self) -> Result<Page, ExpositionError> {
        if !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            self.line(&line);
        }
        if self.kept.is_empty() {
            // Nothing of the families: an empty page, or not exposition at all.
            return Page::parse_families(&self.head, self.families);
        }
        Page::parse(&self.kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAMILIES: [&str; 2] = ["req_seconds", "requests_total"];

    fn page() -> String {
        let mut text = String::from("# HELP req_seconds Latency.\n# TYPE req_seconds histogram\n");
        for p in ["", "0", "1"] {
            let mut cumulative = 0;
            for (i, le) in ["0.1", "0.5", "1.0", "+Inf"].iter().enumerate() {
                cumulative += 3 + i;
                text.push_str(&format!(
                    "req_seconds_bucket{{model=\"m é\",priority=\"{p}\",le=\"{le}\"}} {cumulative}\r\n"
                ));
            }
            text.push_str(&format!(
                "req_seconds_sum{{model=\"m é\",priority=\"{p}\"}} 4.5\nreq_seconds_count{{model=\"m é\",priority=\"{p}\"}} {cumulative}\n"
            ));
        }
        text.push_str("# TYPE padding gauge\n");
        for i in 0..200 {
            text.push_str(&format!("padding{{i=\"{i}\"}} {i}\n"));
        }
        text.push_str("# TYPE requests_total counter\nrequests_total{priority=\"0\"} 7\nrequests_total{priority=\"1\"} 5");
        text
    }

    #[test]
    fn a_page_fed_in_chunks_of_any_size_parses_like_the_whole_page() {
        let text = page();
        let whole = Page::parse_families(&text, &FAMILIES).expect("whole page");
        assert!(!whole.histogram("req_seconds").is_empty());
        assert_eq!(whole.counter("requests_total").len(), 2);
        for size in [1, 2, 3, 7, 64, 1000, text.len()] {
            let mut lines = FamilyLines::new(&FAMILIES);
            for chunk in text.as_bytes().chunks(size) {
                lines.push(chunk);
            }
            let streamed = lines.finish().expect("streamed page");
            assert_eq!(
                streamed.histogram("req_seconds"),
                whole.histogram("req_seconds"),
                "chunks of {size}"
            );
            assert_eq!(
                streamed.counter("requests_total"),
                whole.counter("requests_total"),
                "chunks of {size}"
            );
            assert_eq!(streamed.series_count(), whole.series_count());
        }
    }

    #[test]
    fn a_body_that_is_not_exposition_is_an_error_and_a_page_without_the_families_is_empty() {
        let mut html = FamilyLines::new(&FAMILIES);
        html.push(b"<html><body>502 Bad Gateway</body></html>\n");
        assert!(html.finish().is_err());
        let mut other = FamilyLines::new(&FAMILIES);
        other.push(b"# TYPE padding gauge\npadding 1\n");
        let page = other.finish().expect("an exposition page");
        assert_eq!(page.series_count(), 0);
    }
    /// The kept lines as the filter kept them before it searched for the names: every line
    /// of the body, one by one, through `is_family_line`.
    fn kept_line_by_line(body: &[u8], families: &[&str]) -> String {
        String::from_utf8_lossy(body)
            .split('\n')
            .map(|l| l.strip_suffix('\r').unwrap_or(l))
            .filter(|l| is_family_line(l, families))
            .map(|l| format!("{l}\n"))
            .collect()
    }

    mod searched_like_visited {
        use super::*;
        use proptest::prelude::*;

        /// Lines of a page: the families' own, lines that only mention their names (in a
        /// `HELP` text, a label value, a longer name), and others; some with `\r`, invalid
        /// UTF-8, leading blanks.
        fn line() -> impl Strategy<Value = Vec<u8>> {
            let text = prop::sample::select(vec![
                "# HELP req_seconds Latency.",
                "# TYPE req_seconds histogram",
                "req_seconds_bucket{le=\"1\",priority=\"0\"} 3",
                "req_seconds_bucket{le=\"1\",priority=\"\"} 3",
                "req_seconds_sum 2.5\r",
                "req_seconds_count{p=\"é\"} 3",
                "  req_seconds_count 3",
                "req_seconds_created 17",
                "xreq_seconds 1",
                "other{a=\"req_seconds\"} 1",
                "# HELP other The req_seconds of others.",
                "#TYPE requests_total counter",
                "requests_total{priority=\"1\"} 5",
                "requests_total_total 5",
                "padding{i=\"7\"} 7",
                "",
                "\u{1F600} req_seconds",
            ])
            .prop_map(|l| l.as_bytes().to_vec());
            let invalid = Just(b"req_seconds{a=\"\xff\xfe\"} 1".to_vec());
            prop_oneof![9 => text, 1 => invalid]
        }

        proptest! {
            #[test]
            fn the_lines_kept_are_those_a_line_by_line_filter_keeps(
                lines in prop::collection::vec(line(), 0..200),
                chunk in 1..300usize,
                newline in any::<bool>(),
            ) {
                let mut body = lines.join(&b'\n');
                if newline {
                    body.push(b'\n');
                }
                let mut filter = FamilyLines::new(&FAMILIES);
                for piece in body.chunks(chunk) {
                    filter.push(piece);
                }
                if !filter.partial.is_empty() {
                    let line = std::mem::take(&mut filter.partial);
                    filter.line(&line);
                }
                prop_assert_eq!(&filter.kept, &kept_line_by_line(&body, &FAMILIES));
            }
        }
    }
}
