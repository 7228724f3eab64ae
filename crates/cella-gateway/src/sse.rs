//! An incremental parser of server-sent events: bytes go in as the upstream sends them, whole
//! events come out, each with its exact bytes (forwarded as they are) and its `event` and
//! `data` fields (read for usage). Only the unfinished tail of the stream is held; events may be
//! split across chunks anywhere, line endings are `\n` or `\r\n`.

/// One event: its bytes as received (the blank line that ends it included), and its fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub raw: Vec<u8>,
    /// The `event:` field (None: the default, `message`).
    pub event: Option<String>,
    /// The `data:` lines joined by `\n`.
    pub data: String,
}

#[derive(Debug, Default)]
pub struct Parser {
    buf: Vec<u8>,
    /// Where the next unread line starts in `buf`.
    line_start: usize,
    event: Option<String>,
    data: String,
    has_data: bool,
}

impl Parser {
    pub fn new() -> Parser {
        Parser::default()
    }

    /// Feeds bytes; returns the events they completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<Event> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        let mut consumed = 0; // bytes of `buf` that belong to events returned
        while let Some(nl) = self.buf[self.line_start..].iter().position(|&b| b == b'\n') {
            let end = self.line_start + nl; // index of '\n'
            let mut line = &self.buf[self.line_start..end];
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            self.line_start = end + 1;
            if line.is_empty() {
                // A blank line: the event ends (one with no fields at all is a keep-alive
                // blank line; it is forwarded with the next event, or at the end).
                if self.has_data || self.event.is_some() {
                    out.push(Event {
                        raw: self.buf[consumed..self.line_start].to_vec(),
                        event: self.event.take(),
                        data: std::mem::take(&mut self.data),
                    });
                    self.has_data = false;
                    consumed = self.line_start;
                }
                continue;
            }
            if line[0] == b':' {
                continue; // a comment
            }
            let (field, value) = match line.iter().position(|&b| b == b':') {
                Some(i) => {
                    let v = &line[i + 1..];
                    (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
                }
                None => (line, &b""[..]),
            };
            let value = String::from_utf8_lossy(value);
            match field {
                b"event" => self.event = Some(value.into_owned()),
                b"data" => {
                    if self.has_data {
                        self.data.push('\n');
                    }
                    self.data.push_str(&value);
                    self.has_data = true;
                }
                _ => {} // id, retry: passed through in `raw`, not needed here
            }
        }
        if consumed > 0 {
            self.buf.drain(..consumed);
            self.line_start -= consumed;
        }
        out
    }

    /// Bytes received that complete no event yet (at the end of a stream: forwarded as they are).
    pub fn rest(&self) -> &[u8] {
        &self.buf
    }

    /// Whether an event was begun and not finished.
    pub fn mid_event(&self) -> bool {
        self.has_data || self.event.is_some() || self.line_start < self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &[u8] = b"event: message_start\ndata: {\"a\":1}\n\n: keep-alive\n\nevent: ping\r\ndata: {}\r\n\r\ndata: line1\ndata: line2\nid: 7\n\ndata: [DONE]\n\n";

    fn all(chunks: &[&[u8]]) -> Vec<Event> {
        let mut p = Parser::new();
        let mut out = Vec::new();
        for c in chunks {
            out.extend(p.feed(c));
        }
        assert!(
            p.rest().is_empty(),
            "rest {:?}",
            String::from_utf8_lossy(p.rest())
        );
        out
    }

    #[test]
    fn whole_stream_at_once() {
        let ev = all(&[STREAM]);
        assert_eq!(ev.len(), 4);
        assert_eq!(ev[0].event.as_deref(), Some("message_start"));
        assert_eq!(ev[0].data, "{\"a\":1}");
        assert_eq!(ev[1].event.as_deref(), Some("ping"));
        assert_eq!(ev[2].data, "line1\nline2");
        assert_eq!(ev[3].data, "[DONE]");
        // Every byte is forwarded, in order, once.
        let joined: Vec<u8> = ev.iter().flat_map(|e| e.raw.clone()).collect();
        assert_eq!(joined, STREAM);
    }

    #[test]
    fn events_split_at_every_byte() {
        let whole = all(&[STREAM]);
        for split in 1..STREAM.len() {
            let (a, b) = STREAM.split_at(split);
            assert_eq!(all(&[a, b]), whole, "split at {split}");
        }
        let bytes: Vec<&[u8]> = STREAM.chunks(1).collect();
        assert_eq!(all(&bytes), whole);
    }

    #[test]
    fn an_unfinished_event_stays_in_rest() {
        let mut p = Parser::new();
        let ev = p.feed(b"data: {\"x\":1}\n\ndata: {\"y\"");
        assert_eq!(ev.len(), 1);
        assert!(p.mid_event());
        assert_eq!(p.rest(), b"data: {\"y\"");
    }
}
