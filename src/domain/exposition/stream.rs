//! A page read as it arrives: only the lines of the families an analysis reads are kept, so
//! a scrape never holds an engine's whole page (~200 KiB for ~2,000 series) — 200 canaries
//! scraping target and peer at once would otherwise hold 400 of them, twice over.

use super::{is_family_line, ExpositionError, Page};

/// How much of the page's start is kept to tell an exposition page without the families
/// (an empty verdict) from something else (an error), as [`Page::parse_families`] does.
const HEAD_BYTES: usize = 1024;

/// The lines of `families` of a page fed in chunks; [`FamilyLines::finish`] parses them
/// like [`Page::parse_families`] parses a whole page.
#[derive(Debug)]
pub struct FamilyLines<'a> {
    families: &'a [&'a str],
    /// The current line's bytes so far (a chunk may end mid-line, or mid-character).
    partial: Vec<u8>,
    kept: String,
    head: String,
}

impl<'a> FamilyLines<'a> {
    pub fn new(families: &'a [&'a str]) -> Self {
        FamilyLines {
            families,
            partial: Vec::new(),
            kept: String::new(),
            head: String::new(),
        }
    }

    /// Feeds the next chunk of the body.
    pub fn push(&mut self, chunk: &[u8]) {
        let Some(last) = chunk.iter().rposition(|b| *b == b'\n') else {
            self.partial.extend_from_slice(chunk);
            return;
        };
        let (mut complete, rest) = (&chunk[..last], &chunk[last + 1..]);
        if !self.partial.is_empty() {
            // The line the previous chunk ended in.
            let end = complete
                .iter()
                .position(|b| *b == b'\n')
                .unwrap_or(complete.len());
            self.partial.extend_from_slice(&complete[..end]);
            let line = std::mem::take(&mut self.partial);
            self.line(&line);
            complete = complete.get(end + 1..).unwrap_or_default();
        }
        if !complete.is_empty() {
            // Whole lines only: `\n` never falls inside a UTF-8 character.
            match std::str::from_utf8(complete) {
                Ok(text) => text.split('\n').for_each(|l| self.line_str(l)),
                Err(_) => complete.split(|b| *b == b'\n').for_each(|l| self.line(l)),
            }
        }
        self.partial.extend_from_slice(rest);
    }

    fn line(&mut self, bytes: &[u8]) {
        self.line_str(&String::from_utf8_lossy(bytes));
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
}
