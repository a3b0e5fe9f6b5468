//! Splits a byte stream into lines, whatever its chunking.

/// Splits a byte stream into lines, whatever the chunking; strips `\r\n`.
#[derive(Debug, Default)]
pub(crate) struct LineSplitter {
    pending: Vec<u8>,
}

impl LineSplitter {
    /// Adds a chunk and returns the lines it completed.
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Vec<Vec<u8>> {
        let mut lines = Vec::new();
        // `split` yields at most chunk.len() + 1 pieces; all but the last end in '\n'.
        let mut pieces = chunk.split(|&b| b == b'\n').peekable();
        while let Some(piece) = pieces.next() {
            self.pending.extend_from_slice(piece);
            if pieces.peek().is_some() {
                let mut line = std::mem::take(&mut self.pending);
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                lines.push(line);
            }
        }
        lines
    }

    /// Bytes of the line not yet ended.
    pub(crate) fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Drops the line not yet ended.
    pub(crate) fn discard_pending(&mut self) {
        self.pending.clear();
    }

    /// The final line when the body ends without `\n`.
    pub(crate) fn finish(&mut self) -> Option<Vec<u8>> {
        let mut line = std::mem::take(&mut self.pending);
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        (!line.is_empty()).then_some(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_all(chunks: &[&str]) -> Vec<String> {
        let mut splitter = LineSplitter::default();
        let mut lines: Vec<String> = chunks
            .iter()
            .flat_map(|c| splitter.push(c.as_bytes()))
            .map(|l| String::from_utf8(l).expect("utf8"))
            .collect();
        lines.extend(
            splitter
                .finish()
                .map(|l| String::from_utf8(l).expect("utf8")),
        );
        lines
    }

    #[test]
    fn lines_come_out_whole_whatever_the_chunking() {
        let want = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let cases: &[(&[&str], &[&str])] = &[
            (&["a\nb\n"], &["a", "b"]),
            (&["a", "\nb\n"], &["a", "b"]),
            (&["a\n", "b"], &["a", "b"]),
            (
                &["{\"ev", "ent\":", "\"done\"}\n"],
                &["{\"event\":\"done\"}"],
            ),
            (&["a\r\n", "b\r", "\n"], &["a", "b"]),
            (&["", "a", "", "\n", ""], &["a"]),
            (&["a\n\nb"], &["a", "", "b"]),
            (&["\n"], &[""]),
            (&[], &[]),
        ];
        for (chunks, lines) in cases {
            assert_eq!(split_all(chunks), want(lines), "{chunks:?}");
        }
        // A multi-byte character split across chunks survives.
        let bytes = "é\n".as_bytes();
        let mut splitter = LineSplitter::default();
        assert!(splitter.push(&bytes[..1]).is_empty());
        assert_eq!(splitter.push(&bytes[1..]), vec!["é".as_bytes().to_vec()]);
    }
}
