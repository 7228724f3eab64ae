//! Token counts from the upstream's own figures, per API.
//!
//! - OpenAI chat completions: `usage.prompt_tokens` and `usage.completion_tokens` (for a stream,
//!   the last chunk's, which the gateway asks for with `stream_options.include_usage`).
//!   `cached_tokens` and `reasoning_tokens` are parts of these, not added to them.
//! - OpenAI responses: `usage.input_tokens` and `usage.output_tokens` (for a stream, the
//!   `response` of `response.completed`, `response.incomplete` or `response.failed`).
//! - Anthropic messages: input is `input_tokens + cache_creation_input_tokens +
//!   cache_read_input_tokens` (Anthropic's `input_tokens` leaves the cached ones out), output
//!   `output_tokens`. For a stream, `message_start`'s `message.usage` and then each
//!   `message_delta`'s `usage`, which is cumulative: the latest value wins, never the sum.

use serde_json::Value;

/// Which API a request speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    ChatCompletions,
    Responses,
    Messages,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

fn n(v: &Value, k: &str) -> Option<u64> {
    v.get(k).and_then(Value::as_u64)
}

fn anthropic_input(u: &Value) -> Option<u64> {
    let base = n(u, "input_tokens")?;
    Some(
        base.saturating_add(n(u, "cache_creation_input_tokens").unwrap_or(0))
            .saturating_add(n(u, "cache_read_input_tokens").unwrap_or(0)),
    )
}

/// The usage of a whole (non-streamed) answer.
pub fn from_body(api: Api, body: &Value) -> Option<Usage> {
    let u = body.get("usage")?;
    match api {
        Api::ChatCompletions => Some(Usage {
            input_tokens: n(u, "prompt_tokens")?,
            output_tokens: n(u, "completion_tokens").unwrap_or(0),
        }),
        Api::Responses => Some(Usage {
            input_tokens: n(u, "input_tokens")?,
            output_tokens: n(u, "output_tokens").unwrap_or(0),
        }),
        Api::Messages => Some(Usage {
            input_tokens: anthropic_input(u)?,
            output_tokens: n(u, "output_tokens").unwrap_or(0),
        }),
    }
}

/// Follows a stream's events and keeps the usage they report.
#[derive(Debug, Clone)]
pub struct StreamUsage {
    api: Api,
    usage: Option<Usage>,
}

impl StreamUsage {
    pub fn new(api: Api) -> StreamUsage {
        StreamUsage { api, usage: None }
    }

    /// The usage seen so far (None: the stream reported none).
    pub fn get(&self) -> Option<Usage> {
        self.usage
    }

    /// Reads one event (its `event` field and its data). Cheap for the events that carry no
    /// usage: their data is not parsed.
    pub fn observe(&mut self, event: Option<&str>, data: &str) {
        match self.api {
            Api::ChatCompletions => {
                if !data.contains("\"usage\"") {
                    return;
                }
                let Ok(v) = serde_json::from_str::<Value>(data) else {
                    return;
                };
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    if let Some(input) = n(u, "prompt_tokens") {
                        self.usage = Some(Usage {
                            input_tokens: input,
                            output_tokens: n(u, "completion_tokens").unwrap_or(0),
                        });
                    }
                }
            }
            Api::Responses => {
                let terminal = matches!(
                    event,
                    Some("response.completed" | "response.incomplete" | "response.failed")
                ) || (event.is_none() && data.contains("\"response.completed\""));
                if !terminal {
                    return;
                }
                let Ok(v) = serde_json::from_str::<Value>(data) else {
                    return;
                };
                if let Some(u) = v
                    .get("response")
                    .and_then(|r| r.get("usage"))
                    .filter(|u| u.is_object())
                {
                    if let Some(input) = n(u, "input_tokens") {
                        self.usage = Some(Usage {
                            input_tokens: input,
                            output_tokens: n(u, "output_tokens").unwrap_or(0),
                        });
                    }
                }
            }
            Api::Messages => {
                let kind = match event {
                    Some(k @ ("message_start" | "message_delta")) => k,
                    Some(_) => return,
                    None if data.contains("\"message_start\"") => "message_start",
                    None if data.contains("\"message_delta\"") => "message_delta",
                    None => return,
                };
                let Ok(v) = serde_json::from_str::<Value>(data) else {
                    return;
                };
                let u = if kind == "message_start" {
                    v.get("message").and_then(|m| m.get("usage"))
                } else {
                    v.get("usage")
                };
                let Some(u) = u.filter(|u| u.is_object()) else {
                    return;
                };
                let mut now = self.usage.unwrap_or_default();
                if let Some(i) = anthropic_input(u) {
                    now.input_tokens = i;
                }
                if let Some(o) = n(u, "output_tokens") {
                    now.output_tokens = o;
                }
                self.usage = Some(now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bodies() {
        let chat = json!({"usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17,
            "prompt_tokens_details": {"cached_tokens": 4}}});
        assert_eq!(
            from_body(Api::ChatCompletions, &chat),
            Some(Usage {
                input_tokens: 12,
                output_tokens: 5
            })
        );
        let resp = json!({"usage": {"input_tokens": 9, "output_tokens": 3, "total_tokens": 12}});
        assert_eq!(
            from_body(Api::Responses, &resp),
            Some(Usage {
                input_tokens: 9,
                output_tokens: 3
            })
        );
        let msg = json!({"usage": {"input_tokens": 10, "cache_read_input_tokens": 100,
            "cache_creation_input_tokens": 5, "output_tokens": 7}});
        assert_eq!(
            from_body(Api::Messages, &msg),
            Some(Usage {
                input_tokens: 115,
                output_tokens: 7
            })
        );
        assert_eq!(from_body(Api::Messages, &json!({"id": "x"})), None);
        assert_eq!(
            from_body(Api::ChatCompletions, &json!({"usage": null})),
            None
        );
    }

    #[test]
    fn chat_stream_takes_the_usage_chunk() {
        let mut s = StreamUsage::new(Api::ChatCompletions);
        s.observe(
            None,
            r#"{"choices":[{"delta":{"content":"hi"}}],"usage":null}"#,
        );
        assert_eq!(s.get(), None);
        s.observe(
            None,
            r#"{"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":2}}"#,
        );
        s.observe(None, "[DONE]");
        assert_eq!(
            s.get(),
            Some(Usage {
                input_tokens: 8,
                output_tokens: 2
            })
        );
    }

    #[test]
    fn responses_stream_takes_the_completed_event() {
        let mut s = StreamUsage::new(Api::Responses);
        s.observe(
            Some("response.created"),
            r#"{"type":"response.created","response":{"usage":null}}"#,
        );
        s.observe(Some("response.output_text.delta"), r#"{"delta":"usage"}"#);
        assert_eq!(s.get(), None);
        s.observe(
            Some("response.completed"),
            r#"{"type":"response.completed","response":{"usage":{"input_tokens":4,"output_tokens":6}}}"#,
        );
        assert_eq!(
            s.get(),
            Some(Usage {
                input_tokens: 4,
                output_tokens: 6
            })
        );
    }

    #[test]
    fn messages_stream_takes_start_input_and_latest_delta_output() {
        let mut s = StreamUsage::new(Api::Messages);
        s.observe(
            Some("message_start"),
            r#"{"type":"message_start","message":{"usage":{"input_tokens":25,"output_tokens":1}}}"#,
        );
        assert_eq!(
            s.get(),
            Some(Usage {
                input_tokens: 25,
                output_tokens: 1
            })
        );
        s.observe(
            Some("content_block_delta"),
            r#"{"type":"content_block_delta","delta":{"text":"x"}}"#,
        );
        s.observe(
            Some("message_delta"),
            r#"{"type":"message_delta","usage":{"output_tokens":10}}"#,
        );
        // Cumulative: a later delta replaces, never adds.
        s.observe(
            Some("message_delta"),
            r#"{"type":"message_delta","usage":{"output_tokens":15}}"#,
        );
        assert_eq!(
            s.get(),
            Some(Usage {
                input_tokens: 25,
                output_tokens: 15
            })
        );
    }
}
