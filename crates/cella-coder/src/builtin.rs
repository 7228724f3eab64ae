//! Cella's built-in coding agent: a tool-calling loop over the gateway's OpenAI-compatible
//! `POST /chat/completions`, bounded in steps. Tools: `list_files`, `read_file`, `write_file`,
//! `edit_file` (replace one exact, unique passage), `run_command` (with a timeout, output capped)
//! and `finish`. A change is committed as it is made, with the model's message.
//!
//! One step is one model turn: the conversation so far (a system prompt, the task as the first
//! user message, then the model's replies and the tools' results, each answering its
//! `tool_call_id`) goes to `{OPENAI_BASE_URL}/chat/completions` (non-streaming) with
//! `Authorization: Bearer {OPENAI_API_KEY}`, the model `CELLA_MODEL` and the tools' schemas;
//! the tool calls of the reply are run in order. Tool errors (a bad path, an ambiguous edit, bad
//! arguments) go back to the model as results; they never end the loop. A reply without tool
//! calls gets one nudge; a second one is taken as the end.
//!
//! Standard output gets one line per tool call (`step 3: edit_file src/app.py`), never a file's
//! content; the model's closing summary is printed at the end.
//!
//! Exit codes: 0 when the model calls `finish` (or stops calling tools) and when the step limit
//! is reached; 3 when the gateway answers 402 (the run's money is spent); 4 when the gateway
//! keeps failing (a 5xx, 429 or a transport error, tried three times with a short backoff) or
//! refuses the request (another 4xx); 128 + the signal when the supervisor was told to stop
//! (the loop stops after the current step; a command being run is killed).
//!
//! HTTP: reqwest's blocking client, already a dependency of the workspace (rustls, kept by a
//! large project): the loop is sequential, so a blocking client needs no async runtime here.
//! Proxy variables are ignored: the gateway is always reached directly.

use crate::tools::{self, Outcome, Tools};
use crate::{Control, StopCause};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

/// What the built-in agent needs.
#[derive(Clone)]
pub struct BuiltinOptions {
    pub base_url: String,
    pub api_key: String,
    pub model: String,
    pub max_steps: u32,
}

/// Never shows the key.
impl std::fmt::Debug for BuiltinOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuiltinOptions")
            .field("base_url", &self.base_url)
            .field("api_key", &"<redacted>")
            .field("model", &self.model)
            .field("max_steps", &self.max_steps)
            .finish()
    }
}

pub const EXIT_FINISHED: i32 = 0;
pub const EXIT_NO_FUNDS: i32 = 3;
pub const EXIT_GATEWAY: i32 = 4;

/// How long one model request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);
/// The waits before the second and third attempts.
const BACKOFF: [Duration; 2] = [Duration::from_millis(500), Duration::from_millis(1500)];

const SYSTEM_PROMPT: &str = "You are a coding agent working in a git checkout of a repository \
(your working directory) on one task, which the user gives you. Use the tools: list and read files \
to understand the code, change files with edit_file (for a small change) or write_file (for a new \
or rewritten file), and run the repository's tests or other commands with run_command. Every write \
or edit is committed at once with the commit_message you give, so give each a clear message \
saying what changed and why. Paths are relative to the checkout. Work in small steps and check \
your work. You must end by calling finish with a short summary of what you did (or why the task \
cannot be done); do not end with a plain message.";

const NUDGE: &str = "Continue the task using the tools. When the work is done, call finish \
with a summary.";

enum GatewayError {
    /// 402: the run's money is spent.
    Funds,
    /// Anything else, one line.
    Failed(String),
}

/// Runs the loop on `task` in `workdir`; the exit code.
pub fn run(options: &BuiltinOptions, task: &str, workdir: &Path, control: &Control) -> i32 {
    let client = match reqwest::blocking::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cella: cannot make an HTTP client: {}", e.without_url());
            return EXIT_GATEWAY;
        }
    };
    let tools = match Tools::new(workdir, control) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cella: the checkout {}: {e}", workdir.display());
            return 1;
        }
    };
    let url = format!(
        "{}/chat/completions",
        options.base_url.trim_end_matches('/')
    );
    let definitions = tools::definitions();
    let mut messages = vec![
        json!({"role": "system", "content": SYSTEM_PROMPT}),
        json!({"role": "user", "content": task}),
    ];
    println!(
        "cella: built-in agent, model {}, at most {} steps",
        options.model, options.max_steps
    );
    let mut nudged = false;
    for _ in 0..options.max_steps {
        if let Some(cause) = control.stop_cause() {
            return stopped(cause);
        }
        let step = control.add_step();
        let body = json!({
            "model": options.model,
            "messages": messages,
            "tools": definitions,
            "tool_choice": "auto",
        });
        let reply = match chat(&client, &url, &options.api_key, &body, control) {
            Ok(m) => m,
            Err(GatewayError::Funds) => {
                eprintln!(
                    "cella: the model gateway refused the request: the run's funds are spent (HTTP 402); stopping"
                );
                return EXIT_NO_FUNDS;
            }
            Err(GatewayError::Failed(_)) if control.stop_requested() => {
                return stopped(control.stop_cause().unwrap_or(StopCause::Requested));
            }
            Err(GatewayError::Failed(why)) => {
                eprintln!("cella: the model gateway failed: {why}; stopping");
                return EXIT_GATEWAY;
            }
        };
        let calls: Vec<Value> = reply
            .get("tool_calls")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let content = reply.get("content").cloned().unwrap_or(Value::Null);
        if calls.is_empty() {
            messages.push(json!({"role": "assistant", "content": content}));
            if nudged {
                println!("step {step}: no tool call again; taken as finished");
                return EXIT_FINISHED;
            }
            nudged = true;
            println!("step {step}: no tool call; asking the model to use the tools");
            messages.push(json!({"role": "user", "content": NUDGE}));
            continue;
        }
        messages.push(json!({"role": "assistant", "content": content, "tool_calls": calls}));
        for (i, call) in calls.iter().enumerate() {
            let id = call
                .get("id")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| format!("call_{step}_{i}"));
            let function = call.get("function");
            let name = function
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("");
            let args = function
                .and_then(|f| f.get("arguments"))
                .map(|a| match a {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .unwrap_or_default();
            let (label, outcome) = if control.stop_requested() {
                (
                    name.to_string(),
                    Outcome::Error("not run: the run is being stopped".into()),
                )
            } else {
                tools.call(name, &args)
            };
            let result = match outcome {
                Outcome::Finish(summary) => {
                    println!("step {step}: finish");
                    println!("finished: {}", tools::short(&summary, 2000));
                    return EXIT_FINISHED;
                }
                Outcome::Done(text) => {
                    println!("step {step}: {label}{}", result_note(name, &text));
                    text
                }
                Outcome::Error(e) => {
                    println!("step {step}: {label}: error: {}", tools::short(&e, 200));
                    format!("error: {e}")
                }
            };
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
        }
    }
    if let Some(cause) = control.stop_cause() {
        return stopped(cause);
    }
    println!(
        "cella: the step limit ({} steps) is reached; stopping",
        options.max_steps
    );
    EXIT_FINISHED
}

/// A few words on a successful result for the step line (the command's exit, never content).
fn result_note(name: &str, text: &str) -> String {
    match name {
        "run_command" => format!(" ({})", text.lines().next().unwrap_or("")),
        "write_file" | "edit_file" => match text.rsplit_once("; ") {
            Some((_, c)) => format!(" ({c})"),
            None => String::new(),
        },
        _ => String::new(),
    }
}

fn stopped(cause: StopCause) -> i32 {
    println!("cella: stopping the built-in agent (the run is ending)");
    match cause {
        StopCause::Signal(sig) => 128 + sig,
        StopCause::Gone | StopCause::Requested => 128 + libc::SIGTERM,
    }
}

/// One chat completions request, retried on a 5xx, 429 or transport error; the reply's
/// `choices[0].message`.
fn chat(
    client: &reqwest::blocking::Client,
    url: &str,
    key: &str,
    body: &Value,
    control: &Control,
) -> Result<Value, GatewayError> {
    let mut last = String::new();
    for attempt in 0..=BACKOFF.len() {
        if attempt > 0 {
            std::thread::sleep(BACKOFF[attempt - 1]);
            if control.stop_requested() {
                break;
            }
        }
        let res = client.post(url).bearer_auth(key).json(body).send();
        let resp = match res {
            Ok(r) => r,
            Err(e) => {
                last = if e.is_timeout() {
                    "the request timed out".into()
                } else {
                    format!("cannot reach it ({})", e.without_url())
                };
                continue;
            }
        };
        let status = resp.status();
        let text = resp.text().unwrap_or_default();
        if status == reqwest::StatusCode::PAYMENT_REQUIRED {
            return Err(GatewayError::Funds);
        }
        if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            last = format!("HTTP {}{}", status.as_u16(), error_message(&text));
            continue;
        }
        if !status.is_success() {
            return Err(GatewayError::Failed(format!(
                "HTTP {}{}",
                status.as_u16(),
                error_message(&text)
            )));
        }
        let v: Value = match serde_json::from_str(&text) {
            Ok(v) => v,
            Err(_) => {
                last = "the reply is not JSON".into();
                continue;
            }
        };
        match v.pointer("/choices/0/message") {
            Some(m) if m.is_object() => return Ok(m.clone()),
            _ => {
                last = "the reply has no message".into();
                continue;
            }
        }
    }
    Err(GatewayError::Failed(format!(
        "{last} (after {} attempts)",
        BACKOFF.len() + 1
    )))
}

/// `: <message>` from an error envelope (`{"error": {"message"}}`, OpenAI's and Cella's), one
/// line, bounded; empty when there is none.
fn error_message(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .and_then(Value::as_str)
                .map(|m| format!(": {}", tools::short(m, 300)))
        })
        .unwrap_or_default()
}
