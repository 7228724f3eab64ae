//! A stand-in model provider for the task-run suite: OpenAI chat completions with tool calls.
//! This machine cannot reach a model provider, so the server's `[[gateway.upstreams]]` points
//! here. Each test scripts the assistant's turns (a tool call, or a final text); the stand-in
//! answers them in order, whole or streamed (with the usage chunk when asked), and records each
//! request (the upstream key it came with, the model, the tools offered, the messages) so a test
//! can check what the built-in agent sent. A request without the upstream key gets the 401 a
//! provider gives.
#![allow(dead_code)]

use super::forges::serve;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// One scripted assistant turn.
#[derive(Debug, Clone)]
pub enum Turn {
    /// Call the tool `name` with `args`.
    Tool(&'static str, Value),
    /// Answer with text and no tool call.
    Text(String),
}

#[derive(Debug, Clone)]
pub struct Recorded {
    pub authorization: Option<String>,
    pub model: String,
    pub tools: Vec<String>,
    pub body: Value,
}

#[derive(Default)]
pub struct ModelInner {
    pub script: Mutex<VecDeque<Turn>>,
    pub requests: Mutex<Vec<Recorded>>,
}

pub struct Model {
    pub inner: Arc<ModelInner>,
    pub port: u16,
}

/// The upstream key the server is configured with.
pub const UPSTREAM_KEY: &str = "sk-standin-upstream-key-0123";
/// The model it serves.
pub const MODEL: &str = "standin-coder";
/// Usage figures of every answer.
pub const PROMPT_TOKENS: u64 = 1000;
pub const COMPLETION_TOKENS: u64 = 100;

impl Model {
    pub fn start(script: Vec<Turn>) -> Model {
        let inner = Arc::new(ModelInner {
            script: Mutex::new(script.into()),
            requests: Mutex::new(Vec::new()),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/v1/models", get(models))
            .with_state(inner.clone());
        let port = serve(app);
        Model { inner, port }
    }

    /// The `[gateway]` upstream and price for this stand-in: 1.000000 per million input tokens,
    /// 2.000000 per million output, so every answer costs 0.001200.
    pub fn gateway_toml(&self) -> String {
        format!(
            "[[gateway.upstreams]]\nname = \"standin\"\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:{}/v1\"\napi_key = \"{UPSTREAM_KEY}\"\nmodels = [\"{MODEL}\"]\n\n[gateway.prices.\"{MODEL}\"]\ninput = \"1.000000\"\noutput = \"2.000000\"\n",
            self.port
        )
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.inner.requests.lock().unwrap().clone()
    }
}

async fn models() -> Response {
    axum::Json(json!({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "standin"}]}))
        .into_response()
}

async fn chat(State(m): State<Arc<ModelInner>>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let tools = v["tools"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| t["function"]["name"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    m.requests.lock().unwrap().push(Recorded {
        authorization: auth.clone(),
        model: v["model"].as_str().unwrap_or("").to_string(),
        tools,
        body: v.clone(),
    });
    if auth.as_deref() != Some(&format!("Bearer {UPSTREAM_KEY}")) {
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error", "code": "invalid_api_key"}})),
        )
            .into_response();
    }
    let n = m.requests.lock().unwrap().len();
    let turn = m
        .script
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or_else(|| Turn::Text("Done.".into()));
    let (message, finish) = match &turn {
        Turn::Tool(name, args) => (
            json!({"role": "assistant", "content": null, "tool_calls": [{
                "id": format!("call_{n}"), "type": "function",
                "function": {"name": name, "arguments": args.to_string()}
            }]}),
            "tool_calls",
        ),
        Turn::Text(t) => (json!({"role": "assistant", "content": t}), "stop"),
    };
    let usage = json!({"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS,
        "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS});
    let model = v["model"].as_str().unwrap_or(MODEL).to_string();
    if v["stream"] == true {
        let mut delta = message.clone();
        if let Some(calls) = delta["tool_calls"].as_array_mut() {
            for (i, c) in calls.iter_mut().enumerate() {
                c["index"] = json!(i);
            }
        }
        let chunk = |choices: Value, usage: Value| {
            format!(
                "data: {}\n\n",
                json!({"id": format!("chatcmpl-{n}"), "object": "chat.completion.chunk",
                    "created": 1_700_000_000, "model": model, "choices": choices, "usage": usage})
            )
        };
        let mut s = chunk(
            json!([{"index": 0, "delta": delta, "finish_reason": null}]),
            Value::Null,
        );
        s += &chunk(
            json!([{"index": 0, "delta": {}, "finish_reason": finish}]),
            Value::Null,
        );
        if v["stream_options"]["include_usage"] == true {
            s += &chunk(json!([]), usage);
        }
        s += "data: [DONE]\n\n";
        return ([("content-type", "text/event-stream")], s).into_response();
    }
    axum::Json(json!({
        "id": format!("chatcmpl-{n}"), "object": "chat.completion", "created": 1_700_000_000,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage
    }))
    .into_response()
}
