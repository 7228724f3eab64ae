//! The tools: their names, one-line descriptions, the scope each needs, their input and output
//! JSON schemas, and what each does (one or a few calls of the public API).
//!
//! Every successful result carries `structuredContent` that follows the tool's output schema,
//! and the same JSON as a text block (for clients that read only text); `run_code` adds each
//! image its cell displayed as an image block. An API error, bad arguments or a scope the key
//! lacks come back as a tool error (`isError: true`) whose text names the API's error code and
//! message: never a protocol error, so the session goes on.

use crate::api::{Api, ApiError, ApiRequest, ApiResponse};
use axum::http::{HeaderValue, Method, StatusCode};
use base64::Engine;
use futures_util::StreamExt;
use rmcp::model::{CallToolResult, ContentBlock, ProgressNotificationParam, ProgressToken};
use rmcp::{Peer, RoleServer};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::time::{Duration, Instant};

/// The most output `exec` returns per stream unless asked for less (and at most, if asked for
/// more: [`MAX_OUTPUT_CAP`]).
pub const DEFAULT_OUTPUT_CAP: usize = 64 * 1024;
pub const MAX_OUTPUT_CAP: usize = 1024 * 1024;
/// The most of a file `file_read` returns.
pub const DEFAULT_READ_CAP: usize = 1024 * 1024;
pub const MAX_READ_CAP: usize = 8 * 1024 * 1024;
/// `exec`'s timeout when the call gives none (the API's own default is an hour).
pub const DEFAULT_EXEC_TIMEOUT_SEC: u32 = 300;

/// One tool.
pub struct ToolDef {
    pub name: &'static str,
    pub description: &'static str,
    /// The scope the key needs (`admin` holds every scope).
    pub scope: &'static str,
    pub read_only: bool,
    pub destructive: bool,
    pub input: fn() -> Value,
    pub output: fn() -> Value,
}

impl ToolDef {
    /// Whether a key with `scopes` may use the tool.
    pub fn allowed(&self, scopes: &[String]) -> bool {
        scopes.iter().any(|s| s == self.scope || s == "admin")
    }

    pub fn to_tool(&self) -> rmcp::model::Tool {
        let obj = |v: Value| match v {
            Value::Object(m) => std::sync::Arc::new(m),
            _ => std::sync::Arc::new(Map::new()),
        };
        let mut t = rmcp::model::Tool::default();
        t.name = self.name.into();
        t.description = Some(self.description.into());
        t.input_schema = obj((self.input)());
        t.output_schema = Some(obj((self.output)()));
        let mut a = rmcp::model::ToolAnnotations::new();
        a.read_only_hint = Some(self.read_only);
        a.destructive_hint = Some(self.destructive);
        a.open_world_hint = Some(false);
        t.annotations = Some(a);
        t
    }
}

fn object(props: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": props, "required": required, "additionalProperties": false})
}

fn sandbox_id() -> Value {
    json!({"type": "string", "description": "The sandbox's id (from sandbox_create or sandbox_list)."})
}

fn abs_path(what: &str) -> Value {
    json!({"type": "string", "description": format!("Absolute path inside the sandbox {what}.")})
}

fn sandbox_schema() -> Value {
    json!({
        "type": "object",
        "description": "A sandbox, as the API's sandbox object.",
        "properties": {
            "id": {"type": "string"},
            "state": {"type": "string", "enum": ["provisioning", "running", "paused", "stopped", "destroyed", "error"]},
            "template_id": {"type": "string"},
            "size": {"type": ["string", "null"]},
            "cpu_count": {"type": "number"},
            "memory_mb": {"type": "number"},
            "disk_size_mb": {"type": "number"},
            "ready": {"type": "boolean"},
            "timeout_sec": {"type": ["number", "null"]},
            "metadata": {"type": ["object", "null"]},
            "created_at": {"type": "string"},
            "destroyed_at": {"type": ["string", "null"]}
        },
        "required": ["id", "state"]
    })
}

fn wrap(name: &str, inner: Value) -> Value {
    json!({"type": "object", "properties": {name: inner}, "required": [name]})
}

fn task_schema() -> Value {
    json!({
        "type": "object",
        "description": "A task run, as the API's task object.",
        "properties": {
            "id": {"type": "string"},
            "state": {"type": "string", "enum": ["queued", "provisioning", "running", "stopped", "failed", "cancelled"]},
            "repository": {"type": "string"},
            "base_branch": {"type": ["string", "null"]},
            "branch": {"type": ["string", "null"]},
            "failure_reason": {"type": ["string", "null"]},
            "pull_request": {"type": ["object", "null"]}
        },
        "required": ["id", "state"]
    })
}

fn entry_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "path": {"type": "string"},
            "type": {"type": "string", "enum": ["file", "dir", "symlink", "other"]},
            "size": {"type": "number"},
            "mode": {"type": "string"},
            "modified_at": {"type": "string"}
        },
        "required": ["name", "path", "type", "size"]
    })
}

/// Every tool, in the order `tools/list` gives them.
pub fn all() -> &'static [ToolDef] {
    &TOOLS
}

pub fn find(name: &str) -> Option<&'static ToolDef> {
    TOOLS.iter().find(|t| t.name == name)
}

static TOOLS: [ToolDef; 12] = [
    ToolDef {
        name: "sandbox_create",
        description: "Create a new Linux sandbox (an isolated machine with bash, python3 and node) and wait until it is running; returns its id.",
        scope: "sandboxes:write",
        read_only: false,
        destructive: false,
        input: || object(json!({
            "template_id": {"type": "string", "description": "Template to start from (default \"base\")."},
            "size": {"type": "string", "enum": ["xs", "small", "medium", "large", "xl"], "description": "Size (default small: 2 vCPU, 4 GiB)."},
            "timeout_sec": {"type": "integer", "minimum": 1, "maximum": 86400, "description": "Seconds of activity before it pauses (default 3600)."},
            "metadata": {"type": "object", "additionalProperties": {"type": "string"}, "description": "String labels to find it by."},
            "env": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Environment variables for its commands."}
        }), &[]),
        output: || wrap("sandbox", sandbox_schema()),
    },
    ToolDef {
        name: "sandbox_list",
        description: "List this workspace's sandboxes (newest first), optionally only those in one state.",
        scope: "sandboxes:read",
        read_only: true,
        destructive: false,
        input: || object(json!({
            "state": {"type": "string", "enum": ["provisioning", "running", "paused", "stopped", "destroyed", "error"]},
            "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "At most this many (default 100)."}
        }), &[]),
        output: || json!({"type": "object", "properties": {
            "sandboxes": {"type": "array", "items": sandbox_schema()},
            "next_cursor": {"type": ["string", "null"]}
        }, "required": ["sandboxes"]}),
    },
    ToolDef {
        name: "sandbox_destroy",
        description: "Destroy a sandbox: its processes end and its files are deleted (idempotent).",
        scope: "sandboxes:write",
        read_only: false,
        destructive: true,
        input: || object(json!({"sandbox_id": sandbox_id()}), &["sandbox_id"]),
        output: || wrap("sandbox", sandbox_schema()),
    },
    ToolDef {
        name: "exec",
        description: "Run a shell command in a running sandbox and return its exit code, stdout and stderr (output capped; the result says when it was cut).",
        scope: "sandboxes:exec",
        read_only: false,
        destructive: false,
        input: || object(json!({
            "sandbox_id": sandbox_id(),
            "command": {"type": "string", "description": "A bash command line, e.g. \"ls -la /home/user\"."},
            "cwd": {"type": "string", "description": "Working directory (default /home/user)."},
            "env": {"type": "object", "additionalProperties": {"type": "string"}},
            "stdin": {"type": "string", "description": "Text written to the command's standard input."},
            "user": {"type": "string", "enum": ["user", "root"], "description": "Run as the unprivileged user (default) or root."},
            "timeout_sec": {"type": "integer", "minimum": 1, "maximum": 86400, "description": "Kill the command after this many seconds (default 300)."},
            "max_output_bytes": {"type": "integer", "minimum": 1, "maximum": MAX_OUTPUT_CAP, "description": "Keep at most this many bytes of each of stdout and stderr (default 65536)."}
        }), &["sandbox_id", "command"]),
        output: || json!({"type": "object", "properties": {
            "exit_code": {"type": ["integer", "null"], "description": "null when the call was cancelled"},
            "stdout": {"type": "string"},
            "stderr": {"type": "string"},
            "stdout_truncated": {"type": "boolean"},
            "stderr_truncated": {"type": "boolean"},
            "stdout_bytes": {"type": "integer", "description": "All the bytes the command wrote to stdout, kept or not"},
            "stderr_bytes": {"type": "integer"},
            "timed_out": {"type": "boolean"},
            "duration_ms": {"type": ["integer", "null"]}
        }, "required": ["exit_code", "stdout", "stderr", "stdout_truncated", "stderr_truncated", "timed_out"]}),
    },
    ToolDef {
        name: "file_read",
        description: "Read a file from a sandbox (UTF-8 text as text, anything else as base64; large files are cut and say so).",
        scope: "sandboxes:read",
        read_only: true,
        destructive: false,
        input: || object(json!({
            "sandbox_id": sandbox_id(),
            "path": abs_path("of the file"),
            "max_bytes": {"type": "integer", "minimum": 1, "maximum": MAX_READ_CAP, "description": "Read at most this many bytes (default 1048576)."}
        }), &["sandbox_id", "path"]),
        output: || json!({"type": "object", "properties": {
            "path": {"type": "string"},
            "encoding": {"type": "string", "enum": ["utf8", "base64"]},
            "content": {"type": "string"},
            "bytes": {"type": "integer", "description": "Bytes returned"},
            "truncated": {"type": "boolean"}
        }, "required": ["path", "encoding", "content", "bytes", "truncated"]}),
    },
    ToolDef {
        name: "file_write",
        description: "Write a file in a sandbox (creating parent directories, replacing what was there).",
        scope: "sandboxes:exec",
        read_only: false,
        destructive: false,
        input: || object(json!({
            "sandbox_id": sandbox_id(),
            "path": abs_path("to write"),
            "content": {"type": "string", "description": "The file's content."},
            "encoding": {"type": "string", "enum": ["utf8", "base64"], "description": "How content is written (default utf8)."}
        }), &["sandbox_id", "path", "content"]),
        output: || json!({"type": "object", "properties": {
            "path": {"type": "string"},
            "bytes": {"type": "integer"}
        }, "required": ["path", "bytes"]}),
    },
    ToolDef {
        name: "file_list",
        description: "List a directory in a sandbox: names, types, sizes, modes, times.",
        scope: "sandboxes:read",
        read_only: true,
        destructive: false,
        input: || object(json!({
            "sandbox_id": sandbox_id(),
            "path": abs_path("of the directory (default /home/user)"),
            "recursive": {"type": "boolean", "description": "Include everything below (default false)."}
        }), &["sandbox_id"]),
        output: || json!({"type": "object", "properties": {
            "entries": {"type": "array", "items": entry_schema()}
        }, "required": ["entries"]}),
    },
    ToolDef {
        name: "run_code",
        description: "Run a Python (default) or JavaScript cell in the sandbox's persistent interpreter; returns stdout, the last value, errors, and images (e.g. matplotlib plots) as image content.",
        scope: "sandboxes:exec",
        read_only: false,
        destructive: false,
        input: || object(json!({
            "sandbox_id": sandbox_id(),
            "code": {"type": "string", "description": "The cell's source."},
            "language": {"type": "string", "enum": ["python", "javascript"]},
            "context": {"type": "string", "description": "Interpreter context whose variables persist between cells (default \"default\")."},
            "timeout_sec": {"type": "number", "exclusiveMinimum": 0, "maximum": 300, "description": "Seconds before the cell is interrupted (default and at most 300)."}
        }), &["sandbox_id", "code"]),
        output: || json!({"type": "object", "properties": {
            "ok": {"type": "boolean"},
            "stdout": {"type": "string"},
            "stderr": {"type": "string"},
            "result": {"type": ["string", "null"]},
            "language": {"type": "string"},
            "error": {"type": ["object", "null"], "properties": {
                "name": {"type": "string"}, "value": {"type": "string"}, "traceback": {"type": "string"}
            }},
            "outputs": {"type": "array", "items": {"type": "object", "properties": {
                "mime": {"type": "string"}, "data": {"type": "string"}
            }, "required": ["mime", "data"]}, "description": "Rich outputs; images are also returned as image content"}
        }, "required": ["ok", "stdout", "stderr", "language", "outputs"]}),
    },
    ToolDef {
        name: "expose_port",
        description: "Get the public preview URL of a TCP port a server listens on inside a sandbox.",
        scope: "sandboxes:write",
        read_only: false,
        destructive: false,
        input: || object(json!({
            "sandbox_id": sandbox_id(),
            "port": {"type": "integer", "minimum": 1, "maximum": 65535}
        }), &["sandbox_id", "port"]),
        output: || json!({"type": "object", "properties": {
            "port": {"type": "integer"},
            "url": {"type": "string"}
        }, "required": ["port", "url"]}),
    },
    ToolDef {
        name: "task_start",
        description: "Start a task run: a coding agent works on a repository in a fresh sandbox and opens a draft pull request.",
        scope: "tasks:write",
        read_only: false,
        destructive: false,
        input: || object(json!({
            "repository": {"type": "string", "description": "owner/name"},
            "task": {"type": "string", "description": "What the agent should do."},
            "base_branch": {"type": "string", "description": "Default: the repository's default branch."},
            "forge": {"type": "string"},
            "agent": {"type": "string"},
            "metadata": {"type": "object", "additionalProperties": {"type": "string"}}
        }), &["repository", "task"]),
        output: || wrap("task", task_schema()),
    },
    ToolDef {
        name: "task_get",
        description: "Get a task run's state, branch, pull request and costs.",
        scope: "tasks:read",
        read_only: true,
        destructive: false,
        input: || object(json!({"task_id": {"type": "string"}}), &["task_id"]),
        output: || wrap("task", task_schema()),
    },
    ToolDef {
        name: "task_cancel",
        description: "Cancel a task run that has not finished (idempotent).",
        scope: "tasks:write",
        read_only: false,
        destructive: true,
        input: || object(json!({"task_id": {"type": "string"}}), &["task_id"]),
        output: || wrap("task", task_schema()),
    },
];

/// What a call runs with: the API, the caller's credentials, progress and cancellation.
pub struct Call<'a> {
    pub api: &'a dyn Api,
    pub authorization: Option<HeaderValue>,
    pub extensions: Option<axum::http::Extensions>,
    pub progress: Option<(Peer<RoleServer>, ProgressToken)>,
}

/// A failed call: what the tool error says.
#[derive(Debug)]
pub struct ToolFail {
    pub text: String,
    pub structured: Option<Value>,
}

impl ToolFail {
    pub fn msg(text: impl Into<String>) -> Self {
        ToolFail {
            text: text.into(),
            structured: None,
        }
    }
}

impl From<ApiError> for ToolFail {
    fn from(e: ApiError) -> Self {
        ToolFail::msg(e.to_string())
    }
}

pub type ToolResult = Result<CallToolResult, ToolFail>;

impl Call<'_> {
    fn req(&self, method: Method, path: impl Into<String>) -> ApiRequest {
        let mut r = ApiRequest::new(method, path);
        r.authorization = self.authorization.clone();
        r.extensions = self.extensions.clone();
        r
    }

    async fn send(&self, req: ApiRequest) -> Result<ApiResponse, ToolFail> {
        let res = self.api.send(req).await?;
        if res.status.is_success() {
            return Ok(res);
        }
        Err(api_failure(res).await)
    }

    /// A JSON call; the answer's `data` (or the whole body when it has none).
    async fn data(&self, req: ApiRequest) -> Result<Value, ToolFail> {
        let v = self.send(req).await?.json().await?;
        Ok(match v {
            Value::Object(mut m) if m.contains_key("data") => {
                let d = m.remove("data").unwrap_or(Value::Null);
                if let Some(c) = m.remove("next_cursor") {
                    json!({"items": d, "next_cursor": c})
                } else {
                    d
                }
            }
            other => other,
        })
    }

    async fn progress(&self, progress: f64, total: Option<f64>, message: impl Into<String>) {
        if let Some((peer, token)) = &self.progress {
            let mut p =
                ProgressNotificationParam::new(token.clone(), progress).with_message(message);
            if let Some(t) = total {
                p = p.with_total(t);
            }
            // A client that went away misses its progress; the call goes on.
            let _ = peer.notify_progress(p).await;
        }
    }
}

/// The tool error for an API error answer: its code and message (and the details, when any).
pub async fn api_failure(res: ApiResponse) -> ToolFail {
    let status = res.status;
    let body = res.json().await.unwrap_or(Value::Null);
    let err = body.get("error").cloned().unwrap_or(Value::Null);
    let code = err
        .get("code")
        .and_then(Value::as_str)
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("ERROR"));
    let message = err.get("message").and_then(Value::as_str).unwrap_or("");
    let mut text = format!("{code} ({}): {message}", status.as_u16());
    if let Some(d) = err.get("details").filter(|d| !d.is_null()) {
        text.push_str(&format!(" (details: {d})"));
    }
    if status == StatusCode::TOO_MANY_REQUESTS {
        if let Some(s) = res_retry_after(&body) {
            text.push_str(&format!("; retry after {s} s"));
        }
    }
    ToolFail {
        text,
        structured: Some(json!({"status": status.as_u16(), "error": err})),
    }
}

fn res_retry_after(body: &Value) -> Option<u64> {
    body.pointer("/error/details/retry_after_sec")
        .and_then(Value::as_u64)
}

/// Arguments into a tool's input type: unknown or mistyped fields are a tool error naming them.
pub fn args<T: DeserializeOwned>(tool: &str, a: Option<Map<String, Value>>) -> Result<T, ToolFail> {
    let v = Value::Object(a.unwrap_or_default());
    serde_json::from_value(v)
        .map_err(|e| ToolFail::msg(format!("invalid arguments for {tool}: {e}")))
}

/// A successful result: the value as structured content and as JSON text.
pub fn ok(v: Value) -> CallToolResult {
    let text = serde_json::to_string_pretty(&v).unwrap_or_default();
    let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
    r.structured_content = Some(v);
    r
}

/// Percent-encodes a query value or path segment.
pub fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// An id as a path segment: ids are DNS-label safe, so anything else is refused here (a `/` or
/// `..` in an id never reaches another route).
fn id_seg(field: &str, s: &str) -> Result<String, ToolFail> {
    if s.is_empty()
        || s.len() > 128
        || !s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(ToolFail::msg(format!(
            "invalid arguments: {field} must be an id (letters, digits, '-' or '_')"
        )));
    }
    Ok(s.to_string())
}

type StrMap = std::collections::BTreeMap<String, String>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateArgs {
    template_id: Option<String>,
    size: Option<String>,
    timeout_sec: Option<u32>,
    metadata: Option<StrMap>,
    env: Option<StrMap>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    state: Option<String>,
    limit: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SandboxArgs {
    sandbox_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecArgs {
    sandbox_id: String,
    command: String,
    cwd: Option<String>,
    env: Option<StrMap>,
    stdin: Option<String>,
    user: Option<String>,
    timeout_sec: Option<u32>,
    max_output_bytes: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    sandbox_id: String,
    path: String,
    max_bytes: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    sandbox_id: String,
    path: String,
    content: String,
    encoding: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListFilesArgs {
    sandbox_id: String,
    path: Option<String>,
    recursive: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CodeArgs {
    sandbox_id: String,
    code: String,
    language: Option<String>,
    context: Option<String>,
    timeout_sec: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExposeArgs {
    sandbox_id: String,
    port: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskStartArgs {
    repository: String,
    task: String,
    base_branch: Option<String>,
    forge: Option<String>,
    agent: Option<String>,
    metadata: Option<StrMap>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskArgs {
    task_id: String,
}

/// Drops `null` members (the API rejects some explicit nulls it would default).
fn compact(mut v: Value) -> Value {
    if let Value::Object(m) = &mut v {
        m.retain(|_, x| !x.is_null());
    }
    v
}

/// Runs tool `name` (already checked to exist and be allowed).
pub async fn run(
    call: &Call<'_>,
    cancel: &rmcp::service::RequestContext<RoleServer>,
    name: &str,
    a: Option<Map<String, Value>>,
) -> ToolResult {
    match name {
        "sandbox_create" => {
            let x: CreateArgs = args(name, a)?;
            call.progress(0.0, None, "creating the sandbox").await;
            let body = compact(json!({
                "template_id": x.template_id, "size": x.size, "timeout_sec": x.timeout_sec,
                "metadata": x.metadata, "env": x.env,
            }));
            let sb = call
                .data(call.req(Method::POST, "/api/v1/sandboxes").json(&body))
                .await?;
            call.progress(1.0, Some(1.0), "the sandbox is running")
                .await;
            Ok(ok(json!({"sandbox": sb})))
        }
        "sandbox_list" => {
            let x: ListArgs = args(name, a)?;
            let mut q = vec![format!("limit={}", x.limit.unwrap_or(100))];
            if let Some(s) = x.state {
                q.push(format!("state={}", enc(&s)));
            }
            let v = call
                .data(call.req(Method::GET, format!("/api/v1/sandboxes?{}", q.join("&"))))
                .await?;
            Ok(ok(
                json!({"sandboxes": v["items"], "next_cursor": v["next_cursor"]}),
            ))
        }
        "sandbox_destroy" => {
            let x: SandboxArgs = args(name, a)?;
            let id = id_seg("sandbox_id", &x.sandbox_id)?;
            let sb = call
                .data(call.req(Method::DELETE, format!("/api/v1/sandboxes/{id}")))
                .await?;
            Ok(ok(json!({"sandbox": sb})))
        }
        "exec" => exec(call, cancel, args(name, a)?).await,
        "file_read" => {
            let x: ReadArgs = args(name, a)?;
            let id = id_seg("sandbox_id", &x.sandbox_id)?;
            let cap = x
                .max_bytes
                .unwrap_or(DEFAULT_READ_CAP)
                .clamp(1, MAX_READ_CAP);
            let res = call
                .send(call.req(
                    Method::GET,
                    format!("/api/v1/sandboxes/{id}/files?path={}", enc(&x.path)),
                ))
                .await?;
            let (bytes, truncated) = res.bytes_capped(cap).await?;
            let n = bytes.len();
            let (encoding, content) = match String::from_utf8(bytes) {
                Ok(s) => ("utf8", s),
                Err(e) => {
                    // A cut may split a character: keep the text whole when only its end is.
                    let valid = e.utf8_error().valid_up_to();
                    let b = e.into_bytes();
                    if truncated && b.len() - valid < 4 {
                        ("utf8", String::from_utf8_lossy(&b[..valid]).into_owned())
                    } else {
                        (
                            "base64",
                            base64::engine::general_purpose::STANDARD.encode(&b),
                        )
                    }
                }
            };
            let v = json!({"path": x.path, "encoding": encoding, "content": content, "bytes": n, "truncated": truncated});
            let mut r = ok(v.clone());
            // The text block is the file itself (what a model reads), with a note when cut.
            let mut text = if encoding == "utf8" {
                content
            } else {
                format!("(binary, {n} bytes, base64 in structuredContent)")
            };
            if truncated {
                text.push_str(&format!("\n[file_read: cut after {n} bytes; pass a larger max_bytes, up to {MAX_READ_CAP}, or use exec]"));
            }
            r.content = vec![ContentBlock::text(text)];
            Ok(r)
        }
        "file_write" => {
            let x: WriteArgs = args(name, a)?;
            let id = id_seg("sandbox_id", &x.sandbox_id)?;
            let bytes = match x.encoding.as_deref().unwrap_or("utf8") {
                "utf8" => x.content.into_bytes(),
                "base64" => base64::engine::general_purpose::STANDARD
                    .decode(x.content.as_bytes())
                    .map_err(|e| {
                        ToolFail::msg(format!("invalid arguments: content is not base64: {e}"))
                    })?,
                other => {
                    return Err(ToolFail::msg(format!(
                        "invalid arguments: encoding must be \"utf8\" or \"base64\", not {other:?}"
                    )))
                }
            };
            let n = bytes.len();
            call.send(
                call.req(
                    Method::PUT,
                    format!("/api/v1/sandboxes/{id}/files?path={}", enc(&x.path)),
                )
                .raw(bytes),
            )
            .await?;
            Ok(ok(json!({"path": x.path, "bytes": n})))
        }
        "file_list" => {
            let x: ListFilesArgs = args(name, a)?;
            let id = id_seg("sandbox_id", &x.sandbox_id)?;
            let path = x.path.unwrap_or_else(|| "/home/user".into());
            let v = call
                .data(call.req(
                    Method::GET,
                    format!(
                        "/api/v1/sandboxes/{id}/files/list?path={}&recursive={}",
                        enc(&path),
                        x.recursive.unwrap_or(false)
                    ),
                ))
                .await?;
            let entries = if v.get("items").is_some() {
                v["items"].clone()
            } else {
                v
            };
            Ok(ok(json!({"entries": entries})))
        }
        "run_code" => run_code(call, cancel, args(name, a)?).await,
        "expose_port" => {
            let x: ExposeArgs = args(name, a)?;
            let id = id_seg("sandbox_id", &x.sandbox_id)?;
            let v = call
                .data(
                    call.req(Method::POST, format!("/api/v1/sandboxes/{id}/expose"))
                        .json(&json!({"port": x.port})),
                )
                .await?;
            Ok(ok(v))
        }
        "task_start" => {
            let x: TaskStartArgs = args(name, a)?;
            let body = compact(json!({
                "repository": x.repository, "task": x.task, "base_branch": x.base_branch,
                "forge": x.forge, "agent": x.agent, "metadata": x.metadata,
            }));
            let t = call
                .data(call.req(Method::POST, "/api/v1/tasks").json(&body))
                .await?;
            Ok(ok(json!({"task": t})))
        }
        "task_get" => {
            let x: TaskArgs = args(name, a)?;
            let id = id_seg("task_id", &x.task_id)?;
            let t = call
                .data(call.req(Method::GET, format!("/api/v1/tasks/{id}")))
                .await?;
            Ok(ok(json!({"task": t})))
        }
        "task_cancel" => {
            let x: TaskArgs = args(name, a)?;
            let id = id_seg("task_id", &x.task_id)?;
            let t = call
                .data(call.req(Method::POST, format!("/api/v1/tasks/{id}/cancel")))
                .await?;
            Ok(ok(json!({"task": t})))
        }
        other => Err(ToolFail::msg(format!("unknown tool {other:?}"))),
    }
}

/// One stream's output, kept up to a cap and counted past it.
#[derive(Default)]
struct Kept {
    text: Vec<u8>,
    total: usize,
}

impl Kept {
    fn push(&mut self, b: &[u8], cap: usize) {
        self.total += b.len();
        let room = cap.saturating_sub(self.text.len());
        self.text.extend_from_slice(&b[..b.len().min(room)]);
    }

    fn cut(&self) -> bool {
        self.total > self.text.len()
    }

    fn string(&self) -> String {
        String::from_utf8_lossy(&self.text).into_owned()
    }
}

/// A server-sent event's bytes (`stdout`/`stderr` data: a JSON string, or `{"b64"}`).
fn event_bytes(data: &Value) -> Vec<u8> {
    match data {
        Value::String(s) => s.as_bytes().to_vec(),
        v => v
            .get("b64")
            .and_then(Value::as_str)
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
            .unwrap_or_default(),
    }
}

/// Splits complete SSE events off `buf`: (event name, data).
pub fn take_events(buf: &mut Vec<u8>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    loop {
        let s = buf.windows(2).position(|w| w == b"\n\n");
        let Some(end) = s else { break };
        let block: Vec<u8> = buf.drain(..end + 2).collect();
        let block = String::from_utf8_lossy(&block);
        let (mut name, mut data) = (String::from("message"), Vec::new());
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                name = v.trim_start().to_string();
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push(v.strip_prefix(' ').unwrap_or(v).to_string());
            }
        }
        if !data.is_empty() {
            out.push((name, data.join("\n")));
        }
    }
    out
}

async fn exec(
    call: &Call<'_>,
    ctx: &rmcp::service::RequestContext<RoleServer>,
    x: ExecArgs,
) -> ToolResult {
    let id = id_seg("sandbox_id", &x.sandbox_id)?;
    let cap = x
        .max_output_bytes
        .unwrap_or(DEFAULT_OUTPUT_CAP)
        .clamp(1, MAX_OUTPUT_CAP);
    let body = compact(json!({
        "command": x.command, "cwd": x.cwd, "env": x.env, "stdin": x.stdin, "user": x.user,
        "timeout_sec": x.timeout_sec.unwrap_or(DEFAULT_EXEC_TIMEOUT_SEC),
    }));
    let res = call
        .send(
            call.req(Method::POST, format!("/api/v1/sandboxes/{id}/exec/stream"))
                .json(&body),
        )
        .await?;
    let mut stream = res.body;
    let (mut out, mut err) = (Kept::default(), Kept::default());
    let mut buf = Vec::new();
    let mut exit: Option<Value> = None;
    let mut last_progress = Instant::now();
    call.progress(0.0, None, "running").await;
    'read: loop {
        let chunk = tokio::select! {
            c = stream.next() => c,
            // Cancelled: dropping the stream hangs up, and the API kills the command.
            _ = ctx.ct.cancelled() => {
                drop(stream);
                return Err(ToolFail::msg("exec: the request was cancelled and the command killed"));
            }
        };
        let Some(chunk) = chunk else { break };
        buf.extend_from_slice(&chunk?);
        for (name, data) in take_events(&mut buf) {
            let v: Value = serde_json::from_str(&data).unwrap_or(Value::String(data));
            match name.as_str() {
                "stdout" => out.push(&event_bytes(&v), cap),
                "stderr" => err.push(&event_bytes(&v), cap),
                "exit" => {
                    exit = Some(v);
                    break 'read;
                }
                "error" => {
                    let e = v.get("error").cloned().unwrap_or(Value::Null);
                    return Err(ToolFail {
                        text: format!(
                            "{}: {}",
                            e["code"].as_str().unwrap_or("ERROR"),
                            e["message"].as_str().unwrap_or("")
                        ),
                        structured: Some(json!({"error": e})),
                    });
                }
                _ => {}
            }
        }
        if last_progress.elapsed() >= Duration::from_millis(500) {
            last_progress = Instant::now();
            call.progress(
                (out.total + err.total) as f64,
                None,
                format!("{} bytes of output so far", out.total + err.total),
            )
            .await;
        }
    }
    let exit = exit
        .ok_or_else(|| ToolFail::msg("exec: the command's output ended without its exit status"))?;
    let v = json!({
        "exit_code": exit["exit_code"], "stdout": out.string(), "stderr": err.string(),
        "stdout_truncated": out.cut(), "stderr_truncated": err.cut(),
        "stdout_bytes": out.total, "stderr_bytes": err.total,
        "timed_out": exit["timed_out"].as_bool().unwrap_or(false),
        "duration_ms": exit["duration_ms"],
    });
    let mut r = ok(v.clone());
    let mut text = format!("exit code: {}", exit["exit_code"]);
    if v["timed_out"] == true {
        text.push_str(" (timed out: killed)");
    }
    for (label, k) in [("stdout", &out), ("stderr", &err)] {
        if k.total > 0 {
            text.push_str(&format!("\n--- {label} ---\n{}", k.string()));
            if k.cut() {
                text.push_str(&format!(
                    "\n[{label} cut: {} of {} bytes kept; pass max_output_bytes, up to {MAX_OUTPUT_CAP}, or redirect to a file]",
                    k.text.len(),
                    k.total
                ));
            }
        }
    }
    r.content = vec![ContentBlock::text(text)];
    Ok(r)
}

async fn run_code(
    call: &Call<'_>,
    ctx: &rmcp::service::RequestContext<RoleServer>,
    x: CodeArgs,
) -> ToolResult {
    let id = id_seg("sandbox_id", &x.sandbox_id)?;
    let language = x.language.clone();
    let body = compact(json!({
        "code": x.code, "language": x.language, "context": x.context, "timeout": x.timeout_sec,
    }));
    call.progress(0.0, None, "running the cell").await;
    let fut = call.data(
        call.req(Method::POST, format!("/api/v1/sandboxes/{id}/code/run"))
            .json(&body),
    );
    let v = tokio::select! {
        v = fut => v?,
        _ = ctx.ct.cancelled() => {
            // Cancelled: restart the language's interpreter, which stops the cell.
            let lang = language.as_deref().unwrap_or("python");
            let _ = call.send(call.req(Method::DELETE, format!("/api/v1/sandboxes/{id}/code?language={}", enc(lang)))).await;
            return Err(ToolFail::msg("run_code: the request was cancelled and the interpreter restarted"));
        }
    };
    call.progress(1.0, Some(1.0), "done").await;
    let mut v = v;
    if v.get("outputs").is_none() {
        v["outputs"] = json!([]);
    }
    cap_cell(&mut v, DEFAULT_OUTPUT_CAP, IMAGE_CAP);
    let mut r = ok(v.clone());
    let mut text = String::new();
    for k in ["stdout", "stderr"] {
        if let Some(s) = v[k].as_str().filter(|s| !s.is_empty()) {
            text.push_str(&format!("--- {k} ---\n{s}\n"));
        }
    }
    if let Some(s) = v["result"].as_str() {
        text.push_str(&format!("--- result ---\n{s}\n"));
    }
    if let Some(e) = v.get("error").filter(|e| e.is_object()) {
        text.push_str(&format!(
            "--- error ---\n{}: {}\n{}\n",
            e["name"].as_str().unwrap_or(""),
            e["value"].as_str().unwrap_or(""),
            e["traceback"].as_str().unwrap_or("")
        ));
    }
    if text.is_empty() {
        text.push_str(if v["ok"] == true {
            "(no output)"
        } else {
            "(failed)"
        });
    }
    let mut content = vec![ContentBlock::text(text)];
    for o in v["outputs"].as_array().into_iter().flatten() {
        let mime = o["mime"].as_str().unwrap_or("");
        let data = o["data"].as_str().unwrap_or("");
        if mime.starts_with("image/") && mime != "image/svg+xml" {
            content.push(ContentBlock::image(data, mime));
        } else if !data.is_empty() {
            content.push(ContentBlock::text(format!("[{mime}]\n{data}")));
        }
    }
    r.content = content;
    Ok(r)
}

/// The most bytes of images one `run_code` answer carries (beyond: the image is left out and
/// said so).
pub const IMAGE_CAP: usize = 8 * 1024 * 1024;

/// Cuts `s` to at most `cap` bytes at a character boundary; answers whether it cut.
fn cut(s: &mut String, cap: usize) -> bool {
    if s.len() <= cap {
        return false;
    }
    let mut end = cap;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    true
}

/// Keeps a cell's answer small enough for a model's context: `stdout`, `stderr`, `result`, the
/// error's traceback and each text output at most `cap` bytes (`<field>_truncated: true` where
/// cut), images together at most `images` bytes (one past that is dropped, `dropped: true`).
fn cap_cell(v: &mut Value, cap: usize, images: usize) {
    let cap_field = |obj: &mut Value, key: &str| {
        if let Some(Value::String(s)) = obj.get_mut(key) {
            if cut(s, cap) {
                obj[format!("{key}_truncated")] = Value::Bool(true);
            }
        }
    };
    for k in ["stdout", "stderr", "result"] {
        cap_field(v, k);
    }
    if let Some(e) = v.get_mut("error").filter(|e| e.is_object()) {
        cap_field(e, "traceback");
        cap_field(e, "value");
    }
    let mut image_bytes = 0usize;
    for o in v["outputs"].as_array_mut().into_iter().flatten() {
        let mime = o["mime"].as_str().unwrap_or("").to_string();
        if mime.starts_with("image/") && mime != "image/svg+xml" {
            let n = o["data"].as_str().map_or(0, str::len);
            if image_bytes + n > images {
                o["data"] = Value::String(String::new());
                o["dropped"] = Value::Bool(true);
            } else {
                image_bytes += n;
            }
        } else {
            cap_field(o, "data");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cells_answer_is_cut_to_its_caps_and_says_so() {
        let mut v = json!({
            "stdout": "é".repeat(100), "stderr": "", "result": "r".repeat(10),
            "error": {"name": "E", "value": "v", "traceback": "t".repeat(50)},
            "outputs": [
                {"mime": "text/plain", "data": "x".repeat(40)},
                {"mime": "image/png", "data": "a".repeat(30)},
                {"mime": "image/png", "data": "b".repeat(30)},
            ],
        });
        cap_cell(&mut v, 21, 40);
        // 21 bytes of two-byte characters: 10 of them, never half of one.
        assert_eq!(v["stdout"], "é".repeat(10));
        assert_eq!(v["stdout_truncated"], true);
        assert!(v.get("stderr_truncated").is_none() && v.get("result_truncated").is_none());
        assert_eq!(v["error"]["traceback"].as_str().map(str::len), Some(21));
        assert_eq!(v["error"]["traceback_truncated"], true);
        assert_eq!(v["outputs"][0]["data_truncated"], true);
        assert_eq!(v["outputs"][1]["data"].as_str().map(str::len), Some(30));
        assert_eq!(v["outputs"][2]["data"], "");
        assert_eq!(v["outputs"][2]["dropped"], true);
    }

    #[test]
    fn every_tool_has_object_schemas_and_a_one_line_description() {
        assert_eq!(all().len(), 12);
        for t in all() {
            let i = (t.input)();
            let o = (t.output)();
            assert_eq!(i["type"], "object", "{}", t.name);
            assert_eq!(o["type"], "object", "{}", t.name);
            assert_eq!(i["additionalProperties"], false, "{}", t.name);
            // Every required input is a declared property.
            for r in i["required"].as_array().unwrap() {
                assert!(
                    i["properties"].get(r.as_str().unwrap()).is_some(),
                    "{} {r}",
                    t.name
                );
            }
            assert!(
                !t.description.contains('\n') && t.description.len() < 200,
                "{}",
                t.name
            );
            let tool = t.to_tool();
            assert!(tool.output_schema.is_some());
        }
    }

    #[test]
    fn scopes_filter_tools() {
        let read = vec!["sandboxes:read".to_string()];
        let names: Vec<_> = all()
            .iter()
            .filter(|t| t.allowed(&read))
            .map(|t| t.name)
            .collect();
        assert_eq!(names, ["sandbox_list", "file_read", "file_list"]);
        let admin = vec!["admin".to_string()];
        assert_eq!(all().iter().filter(|t| t.allowed(&admin)).count(), 12);
        let no_exec = vec!["sandboxes:read".into(), "sandboxes:write".into()];
        assert!(!find("exec").unwrap().allowed(&no_exec));
        assert!(!find("run_code").unwrap().allowed(&no_exec));
        assert!(find("sandbox_create").unwrap().allowed(&no_exec));
    }

    #[test]
    fn bad_arguments_are_a_clear_failure() {
        let a = serde_json::from_value(json!({"sandbox_id": "x", "comand": "ls"})).unwrap();
        let e = args::<ExecArgs>("exec", Some(a)).err().unwrap();
        assert!(e.text.contains("comand"), "{}", e.text);
        let a = serde_json::from_value(json!({"sandbox_id": 5, "command": "ls"})).unwrap();
        assert!(args::<ExecArgs>("exec", Some(a)).is_err());
        assert!(id_seg("sandbox_id", "../api-keys").is_err());
        assert!(id_seg("sandbox_id", "sbx1a2").is_ok());
    }

    #[test]
    fn sse_events_split_and_output_is_capped() {
        let mut buf = b"event: stdout\ndata: \"ab\"\n\n: keep-alive\n\nevent: exit\ndata: {\"exit_code\":0}\n\nevent: std".to_vec();
        let ev = take_events(&mut buf);
        assert_eq!(
            ev,
            vec![
                ("stdout".into(), "\"ab\"".into()),
                ("exit".into(), "{\"exit_code\":0}".into())
            ]
        );
        assert_eq!(buf, b"event: std");
        let mut k = Kept::default();
        k.push(b"hello", 3);
        k.push(b"world", 3);
        assert_eq!(k.string(), "hel");
        assert!(k.cut());
        assert_eq!(k.total, 10);
        assert_eq!(event_bytes(&json!({"b64": "AAE="})), vec![0, 1]);
    }

    #[test]
    fn encoding_keeps_paths_in_one_query_value() {
        assert_eq!(enc("/a b/c&d=e"), "%2Fa%20b%2Fc%26d%3De");
    }
}
