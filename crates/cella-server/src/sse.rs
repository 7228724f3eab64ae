//! Server-sent events for streamed output.
//!
//! Every event's data is JSON: `stdout`/`stderr` carry a JSON string when the bytes are UTF-8
//! text, or `{"b64": "..."}` when they are not; `exit` carries the exit object; `error` carries
//! the error envelope. A multi-byte character split across two reads is held back until it is
//! whole, so text never turns into base64 by accident.

use axum::response::sse::Event;
use base64::Engine;
use cella_runtime::ExecEvent;
use serde_json::json;
use std::collections::VecDeque;

/// Bytes of one stream not yet sent because they end inside a UTF-8 character.
#[derive(Default)]
pub struct Utf8Carry {
    buf: Vec<u8>,
}

impl Utf8Carry {
    /// The event data for `bytes` (after what was held back), if there is any to send now.
    pub fn push(&mut self, bytes: &[u8]) -> Option<serde_json::Value> {
        self.buf.extend_from_slice(bytes);
        match std::str::from_utf8(&self.buf) {
            Ok(text) => {
                let v = json!(text);
                self.buf.clear();
                Some(v)
            }
            Err(e) if e.error_len().is_none() && self.buf.len() - e.valid_up_to() < 4 => {
                // An incomplete character at the end: send the whole ones, keep the tail.
                let tail = self.buf.split_off(e.valid_up_to());
                let head = std::mem::replace(&mut self.buf, tail);
                (!head.is_empty()).then(|| json!(String::from_utf8_lossy(&head)))
            }
            Err(_) => Some(self.flush_b64()),
        }
    }

    fn flush_b64(&mut self) -> serde_json::Value {
        let v = json!({ "b64": base64::engine::general_purpose::STANDARD.encode(&self.buf) });
        self.buf.clear();
        v
    }

    /// Whatever is still held back, as bytes.
    pub fn finish(&mut self) -> Option<serde_json::Value> {
        (!self.buf.is_empty()).then(|| self.flush_b64())
    }
}

pub fn event(name: &str, data: &serde_json::Value) -> Event {
    Event::default().event(name).data(data.to_string())
}

/// Turns output events into SSE events, in order, keeping each stream's characters whole.
#[derive(Default)]
pub struct OutputEncoder {
    out: Utf8Carry,
    err: Utf8Carry,
    pub pending: VecDeque<Event>,
}

impl OutputEncoder {
    pub fn push(&mut self, ev: ExecEvent) {
        let (name, carry, bytes) = match ev {
            ExecEvent::Stdout(b) => ("stdout", &mut self.out, b),
            ExecEvent::Stderr(b) => ("stderr", &mut self.err, b),
        };
        if let Some(d) = carry.push(&bytes) {
            self.pending.push_back(event(name, &d));
        }
    }

    pub fn finish(&mut self) {
        if let Some(d) = self.out.finish() {
            self.pending.push_back(event("stdout", &d));
        }
        if let Some(d) = self.err.finish() {
            self.pending.push_back(event("stderr", &d));
        }
    }
}

/// How a command whose output was streamed ended: its exit, nothing (the listener left, or
/// the process goes on), or an error to report.
pub type Outcome = Result<Option<cella_runtime::ExitInfo>, crate::error::ApiError>;

/// The SSE stream of a command's output: `stdout`/`stderr` events as they come, then one `exit`
/// (or `error`) event from `done`.
pub fn output_stream(
    events: tokio::sync::mpsc::Receiver<ExecEvent>,
    done: tokio::sync::oneshot::Receiver<Outcome>,
) -> impl futures_util::Stream<Item = Result<Event, std::convert::Infallible>> {
    let start = (events, Some(done), OutputEncoder::default());
    futures_util::stream::unfold(start, |(mut rx, mut done, mut enc)| async move {
        loop {
            if let Some(ev) = enc.pending.pop_front() {
                return Some((Ok(ev), (rx, done, enc)));
            }
            if let Some(out) = rx.recv().await {
                enc.push(out);
                continue;
            }
            // Output is over: what was held back, then the exit (or error).
            let done_rx = done.take()?;
            enc.finish();
            let last = match done_rx.await {
                Ok(Ok(Some(info))) => event(
                    "exit",
                    &json!({ "exit_code": info.exit_code, "duration_ms": info.duration_ms, "timed_out": info.timed_out }),
                ),
                Ok(Err(e)) => event(
                    "error",
                    &json!({ "error": { "code": e.code.as_str(), "message": e.message, "details": e.details } }),
                ),
                Ok(Ok(None)) | Err(_) => {
                    if enc.pending.is_empty() {
                        return None;
                    }
                    continue;
                }
            };
            enc.pending.push_back(last);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_characters_stay_text_and_binary_becomes_base64() {
        let mut c = Utf8Carry::default();
        let e = "é".as_bytes();
        assert_eq!(c.push(b"ab"), Some(json!("ab")));
        assert_eq!(c.push(&e[..1]), None);
        assert_eq!(c.push(&e[1..]), Some(json!("é")));
        assert_eq!(c.push(b"x\r\ny"), Some(json!("x\r\ny")));
        assert_eq!(c.push(&[0xff, 0x00]), Some(json!({ "b64": "/wA=" })));
        assert_eq!(c.push(&e[..1]), None);
        assert_eq!(c.finish(), Some(json!({ "b64": "ww==" })));
        assert_eq!(c.finish(), None);
    }
}
