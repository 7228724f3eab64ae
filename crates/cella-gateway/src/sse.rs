//! An incremental reader of server-sent events, on the side of a stream that is forwarded as
//! it comes: the upstream's bytes go on to the client as they arrive, and a copy of nothing
//! but the unfinished line is kept here, to read the `event` and `data` fields of the events
//! they complete (for usage). Events may be split across chunks anywhere; line endings are
//! `\n` or `\r\n`. A line or an event's data longer than [`MAX_FIELD_BYTES`] is forwarded but
//! not read (usage events are small), so what is held stays bounded whatever the upstream sends.

/// The most of one line, or of one event's joined `data`, that is read.
pub const MAX_FIELD_BYTES: usize = 1024 * 1024;

/// One event's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The `event:` field (None: the default, `message`).
    pub event: Option<String>,
    /// The `data:` lines joined by `\n` (empty when they were longer than [`MAX_FIELD_BYTES`]).
    pub data: String,
}

#[derive(Debug, Default)]
pub struct Parser {
    /// The line begun and not ended yet.
    line: Vec<u8>,
    /// The line begun is longer than [`MAX_FIELD_BYTES`]: skipped up to its end.
    skipping: bool,
    event: Option<String>,
    data: String,
    has_data: bool,
    /// The event's data went past [`MAX_FIELD_BYTES`]: it is not read.
    oversized: bool,
}

impl Parser {
    pub fn new() -> Parser {
        Parser::default()
    }

    /// Reads the bytes of a chunk (which the caller forwards as they are); returns the events
    /// they completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<Event> {
        let mut out = Vec::new();
        let mut rest = chunk;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            let (piece, after) = (&rest[..nl], &rest[nl + 1..]);
            rest = after;
            if self.skipping {
                self.skipping = false;
                self.line.clear();
                continue;
            }
            if self.line.is_empty() {
                self.line_done(piece, &mut out);
            } else if self.line.len() + piece.len() > MAX_FIELD_BYTES {
                self.line.clear();
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(piece);
                self.line_done(&line, &mut out);
                line.clear();
                self.line = line; // keeps its allocation
            }
        }
        if !self.skipping {
            if self.line.len() + rest.len() > MAX_FIELD_BYTES {
                self.line.clear();
                self.skipping = true;
            } else {
                self.line.extend_from_slice(rest);
            }
        }
        out
    }

    fn line_done(&mut self, line: &[u8], out: &mut Vec<Event>) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            // A blank line: the event ends (one with no fields at all is a keep-alive).
            if self.has_data || self.event.is_some() {
                let data = std::mem::take(&mut self.data);
                out.push(Event {
                    event: self.event.take(),
                    data: if self.oversized { String::new() } else { data },
                });
                self.has_data = false;
                self.oversized = false;
            }
            return;
        }
        if line[0] == b':' {
            return; // a comment
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"event" => self.event = Some(String::from_utf8_lossy(value).into_owned()),
            b"data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.has_data = true;
                if self.data.len() + value.len() > MAX_FIELD_BYTES {
                    self.oversized = true;
                    self.data.clear();
                }
                if !self.oversized {
                    self.data.push_str(&String::from_utf8_lossy(value));
                }
            }
            _ => {} // id, retry: forwarded, not needed here
        }
    }

    /// Whether an event was begun and not finished (its bytes went to the client already).
    pub fn mid_event(&self) -> bool {
        self.has_data || self.event.is_some() || self.mid_line()
    }

    /// Whether a line was begun and not ended.
    pub fn mid_line(&self) -> bool {
        !self.line.is_empty() || self.skipping
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
        assert!(!p.mid_event());
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
    fn an_unfinished_event_is_seen_as_one() {
        let mut p = Parser::new();
        let ev = p.feed(b"data: {\"x\":1}\n\ndata: {\"y\"");
        assert_eq!(ev.len(), 1);
        assert!(p.mid_event() && p.mid_line());
        let ev = p.feed(b":2}\n");
        assert!(ev.is_empty() && p.mid_event() && !p.mid_line());
        let ev = p.feed(b"\n");
        assert_eq!(ev[0].data, "{\"y\":2}");
        assert!(!p.mid_event());
    }

    #[test]
    fn huge_lines_are_forwarded_unread_and_hold_nothing() {
        let mut p = Parser::new();
        let big = vec![b'x'; MAX_FIELD_BYTES + 10];
        assert!(p.feed(b"data: ").is_empty());
        assert!(p.feed(&big).is_empty());
        assert!(p.line.is_empty());
        assert!(p.feed(&big).is_empty());
        assert!(p.line.is_empty());
        // The line ends: the next event reads normally.
        let ev = p.feed(b"\n\ndata: {\"usage\":1}\n\n");
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].data, "{\"usage\":1}");
        // Many data lines of one event past the bound: the event comes, its data unread.
        let line = format!("data: {}\n", "y".repeat(1000));
        let mut ev = Vec::new();
        for _ in 0..(MAX_FIELD_BYTES / 1000 + 2) {
            ev.extend(p.feed(line.as_bytes()));
        }
        ev.extend(p.feed(b"\n"));
        assert_eq!(ev.len(), 1);
        assert!(ev[0].data.is_empty());
        assert!(p.data.capacity() <= 2 * MAX_FIELD_BYTES);
    }
}
