//! Rust client for the Cella HTTP API. The `cella` CLI is built on it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), cella_client::Error> {
//! let client = cella_client::Client::from_env()?;
//! let sb = client.create_sandbox(&Default::default()).await?;
//! let out = client.exec(&sb.id, &cella_client::types::ExecRequest {
//!     command: Some("echo hello".into()), ..Default::default() }).await?;
//! assert_eq!(out.stdout, "hello\n");
//! client.destroy_sandbox(&sb.id).await?;
//! # Ok(()) }
//! ```

pub use cella_types as types;
use cella_types::*;
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Serialize;

pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7070";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with the error envelope.
    #[error("{code}: {message} (HTTP {status}, request id {request_id})")]
    Api {
        status: u16,
        code: String,
        message: String,
        details: Option<serde_json::Value>,
        request_id: String,
    },
    #[error("cannot reach the Cella server at {server}: {}", connect_cause(.source, .server))]
    Connect {
        server: String,
        source: reqwest::Error,
    },
    #[error("unexpected answer from the server: {0}")]
    Decode(String),
    #[error("no API key: set CELLA_API_KEY or pass one")]
    NoKey,
}

/// What stopped a request from reaching the server, in the words a user acts on: the DNS
/// lookup, a refused connection, a timeout, or else the innermost cause.
fn connect_cause(e: &reqwest::Error, server: &str) -> String {
    use std::error::Error as _;
    let host = reqwest::Url::parse(server)
        .ok()
        .and_then(|u| u.host_str().map(String::from))
        .unwrap_or_else(|| server.to_string());
    if e.is_timeout() {
        return "the request timed out".into();
    }
    let mut innermost = e.to_string();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = e.source();
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => {
                    return format!("connection refused (is `cella serve` running on {host}?)")
                }
                std::io::ErrorKind::TimedOut => return "the connection timed out".into(),
                _ => {}
            }
        }
        let text = err.to_string();
        if text.contains("dns error") || text.contains("failed to lookup address") {
            return format!("DNS lookup of {host} failed");
        }
        innermost = text;
        cur = err.source();
    }
    innermost
}

#[derive(Clone)]
pub struct Client {
    base: String,
    key: Option<String>,
    http: reqwest::Client,
}

impl Client {
    pub fn new(server: &str, api_key: Option<String>) -> Client {
        Client {
            base: server.trim_end_matches('/').to_string(),
            key: api_key,
            http: reqwest::Client::new(),
        }
    }

    /// A client that signs its requests with a session of `POST /api/v1/sessions` (the
    /// `cella_session` cookie's value) instead of a key, sending the session's CSRF token with
    /// every request. `cella login` keeps these.
    pub fn with_session(server: &str, session: &str, csrf_token: &str) -> Result<Client, Error> {
        let mut headers = reqwest::header::HeaderMap::new();
        let bad = |_| Error::Decode("a stored session that is not a header value".into());
        let mut cookie =
            reqwest::header::HeaderValue::from_str(&format!("cella_session={session}"))
                .map_err(bad)?;
        cookie.set_sensitive(true);
        let mut csrf = reqwest::header::HeaderValue::from_str(csrf_token).map_err(bad)?;
        csrf.set_sensitive(true);
        headers.insert(reqwest::header::COOKIE, cookie);
        headers.insert("x-csrf-token", csrf);
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .build()
            .map_err(|e| Error::Decode(e.to_string()))?;
        Ok(Client {
            base: server.trim_end_matches('/').to_string(),
            key: None,
            http,
        })
    }

    /// Server from `CELLA_SERVER` (default `http://127.0.0.1:7070`), key from `CELLA_API_KEY`.
    pub fn from_env() -> Result<Client, Error> {
        let server = std::env::var("CELLA_SERVER").unwrap_or_else(|_| DEFAULT_SERVER.into());
        let key = std::env::var("CELLA_API_KEY")
            .ok()
            .filter(|k| !k.is_empty())
            .ok_or(Error::NoKey)?;
        Ok(Client::new(&server, Some(key)))
    }

    pub fn server(&self) -> &str {
        &self.base
    }

    async fn call<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(String, String)],
        body: Option<&B>,
    ) -> Result<T, Error> {
        let mut req = self
            .http
            .request(method, format!("{}{}", self.base, path))
            .query(query);
        if let Some(k) = &self.key {
            req = req.bearer_auth(k);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let res = req.send().await.map_err(self.connect_err())?;
        let bytes = self
            .check(res)
            .await?
            .bytes()
            .await
            .map_err(|e| Error::Decode(e.to_string()))?;
        serde_json::from_slice(&bytes).map_err(|e| Error::Decode(e.to_string()))
    }

    async fn data<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, Error> {
        Ok(self.call::<B, Data<T>>(method, path, &[], body).await?.data)
    }

    pub async fn health(&self) -> Result<Health, Error> {
        self.call::<(), Health>(Method::GET, "/healthz", &[], None)
            .await
    }

    pub async fn templates(&self) -> Result<TemplateCatalog, Error> {
        self.call::<(), _>(Method::GET, "/api/v1/templates", &[], None)
            .await
    }

    /// Imports an image archive (an OCI layout or `docker save` tar); answers its reference
    /// (`upload:<id>`) for a template spec's `image`.
    pub async fn import_image(&self, name: &str, archive: reqwest::Body) -> Result<String, Error> {
        let res = self
            .authed(Method::POST, "/api/v1/images")
            .query(&[("name", name)])
            .header("content-type", "application/x-tar")
            .body(archive)
            .send()
            .await
            .map_err(self.connect_err())?;
        let res = self.check(res).await?;
        let v: serde_json::Value = res.json().await.map_err(|e| Error::Decode(e.to_string()))?;
        v["data"]["reference"]
            .as_str()
            .map(String::from)
            .ok_or_else(|| Error::Decode("no reference in the answer".into()))
    }

    /// Starts a custom template build.
    pub async fn build_template(
        &self,
        spec: &cella_types::TemplateSpec,
    ) -> Result<cella_types::TemplateBuild, Error> {
        self.data(Method::POST, "/api/v1/templates", Some(spec))
            .await
    }

    /// A build's state, and its log after `log_offset` bytes.
    pub async fn template_build(
        &self,
        template: &str,
        build: &str,
        log_offset: u64,
    ) -> Result<cella_types::TemplateBuild, Error> {
        self.data::<(), _>(
            Method::GET,
            &format!("/api/v1/templates/{template}/builds/{build}?log_offset={log_offset}"),
            None,
        )
        .await
    }

    pub async fn create_sandbox(&self, req: &CreateSandbox) -> Result<Sandbox, Error> {
        self.data(Method::POST, "/api/v1/sandboxes", Some(req))
            .await
    }

    /// One page of sandboxes; `query` takes `state`, `metadata.<key>`, `limit` and `cursor`.
    pub async fn list_sandboxes(&self, query: &[(String, String)]) -> Result<List<Sandbox>, Error> {
        self.call::<(), _>(Method::GET, "/api/v1/sandboxes", query, None)
            .await
    }

    pub async fn get_sandbox(&self, id: &str) -> Result<Sandbox, Error> {
        self.data::<(), _>(Method::GET, &format!("/api/v1/sandboxes/{id}"), None)
            .await
    }

    pub async fn destroy_sandbox(&self, id: &str) -> Result<Sandbox, Error> {
        self.data::<(), _>(Method::DELETE, &format!("/api/v1/sandboxes/{id}"), None)
            .await
    }

    pub async fn exec(&self, id: &str, req: &ExecRequest) -> Result<ExecResult, Error> {
        self.data(
            Method::POST,
            &format!("/api/v1/sandboxes/{id}/exec"),
            Some(req),
        )
        .await
    }

    /// Runs one cell in the sandbox's code interpreter.
    pub async fn run_code(
        &self,
        id: &str,
        req: &cella_types::CodeRunRequest,
    ) -> Result<cella_types::CodeResult, Error> {
        self.data(
            Method::POST,
            &format!("/api/v1/sandboxes/{id}/code/run"),
            Some(req),
        )
        .await
    }

    pub async fn pause(&self, id: &str) -> Result<Sandbox, Error> {
        self.data::<(), _>(Method::POST, &format!("/api/v1/sandboxes/{id}/pause"), None)
            .await
    }

    pub async fn resume(&self, id: &str) -> Result<Sandbox, Error> {
        self.data::<(), _>(
            Method::POST,
            &format!("/api/v1/sandboxes/{id}/resume"),
            None,
        )
        .await
    }

    pub async fn stop(&self, id: &str) -> Result<Sandbox, Error> {
        self.data::<(), _>(Method::POST, &format!("/api/v1/sandboxes/{id}/stop"), None)
            .await
    }

    pub async fn set_timeout(&self, id: &str, timeout_sec: u32) -> Result<Sandbox, Error> {
        let body = SetTimeout { timeout_sec };
        self.data(
            Method::POST,
            &format!("/api/v1/sandboxes/{id}/timeout"),
            Some(&body),
        )
        .await
    }

    pub async fn usage(&self, id: &str) -> Result<Usage, Error> {
        self.data::<(), _>(Method::GET, &format!("/api/v1/sandboxes/{id}/usage"), None)
            .await
    }

    fn authed(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let rb = self.http.request(method, format!("{}{}", self.base, path));
        match &self.key {
            Some(k) => rb.bearer_auth(k),
            None => rb,
        }
    }

    async fn check(&self, res: reqwest::Response) -> Result<reqwest::Response, Error> {
        let status = res.status().as_u16();
        if status < 400 {
            return Ok(res);
        }
        let request_id = res
            .headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let bytes = res
            .bytes()
            .await
            .map_err(|e| Error::Decode(e.to_string()))?;
        Err(match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(e) => Error::Api {
                status,
                code: e.error.code,
                message: e.error.message,
                details: e.error.details,
                request_id,
            },
            Err(_) => Error::Decode(format!(
                "HTTP {status}: {}",
                String::from_utf8_lossy(&bytes)
            )),
        })
    }

    fn connect_err(&self) -> impl Fn(reqwest::Error) -> Error + '_ {
        move |source| Error::Connect {
            server: self.base.clone(),
            source,
        }
    }

    /// Runs a command and hands its output to `on_output` as it comes; returns its exit.
    pub async fn exec_stream(
        &self,
        id: &str,
        req: &ExecRequest,
        on_output: impl FnMut(Output),
    ) -> Result<ExecExit, Error> {
        let res = self
            .authed(Method::POST, &format!("/api/v1/sandboxes/{id}/exec/stream"))
            .json(req)
            .send()
            .await
            .map_err(self.connect_err())?;
        self.follow(res, on_output).await
    }

    /// Reads a stream of output events (`stdout`, `stderr`, then `exit` or `error`).
    async fn follow(
        &self,
        res: reqwest::Response,
        mut on_output: impl FnMut(Output),
    ) -> Result<ExecExit, Error> {
        use futures_util::StreamExt;
        let res = self.check(res).await?;
        let mut body = res.bytes_stream();
        let mut buf: Vec<u8> = Vec::new();
        while let Some(chunk) = body.next().await {
            buf.extend_from_slice(&chunk.map_err(|e| Error::Decode(e.to_string()))?);
            while let Some(end) = find_event_end(&buf) {
                let block = String::from_utf8_lossy(&buf[..end]).into_owned();
                buf.drain(..end + 2);
                let Some((name, data)) = parse_event(&block) else {
                    continue;
                };
                match name.as_str() {
                    "stdout" | "stderr" => {
                        let bytes = decode_output(&data)?;
                        on_output(if name == "stdout" {
                            Output::Stdout(bytes)
                        } else {
                            Output::Stderr(bytes)
                        });
                    }
                    "exit" => {
                        return serde_json::from_value(data)
                            .map_err(|e| Error::Decode(e.to_string()))
                    }
                    "error" => {
                        let e: ErrorBody = serde_json::from_value(data)
                            .map_err(|e| Error::Decode(e.to_string()))?;
                        return Err(Error::Api {
                            status: 0,
                            code: e.error.code,
                            message: e.error.message,
                            details: e.error.details,
                            request_id: String::new(),
                        });
                    }
                    _ => {}
                }
            }
        }
        Err(Error::Decode(
            "the stream ended without an exit event".into(),
        ))
    }

    /// Uploads a file; `body` may be a `tokio::fs::File` (streamed) or bytes.
    pub async fn upload(
        &self,
        id: &str,
        path: &str,
        body: impl Into<reqwest::Body>,
    ) -> Result<FileEntry, Error> {
        let res = self
            .authed(Method::PUT, &format!("/api/v1/sandboxes/{id}/files"))
            .query(&[("path", path)])
            .body(body)
            .send()
            .await
            .map_err(self.connect_err())?;
        let res = self.check(res).await?;
        let d: Data<FileEntry> = res.json().await.map_err(|e| Error::Decode(e.to_string()))?;
        Ok(d.data)
    }

    /// A one-shot run: create, write files, run, collect artifacts, destroy.
    pub async fn run(
        &self,
        req: &cella_types::RunRequest,
    ) -> Result<cella_types::RunResult, Error> {
        self.data(Method::POST, "/api/v1/sandboxes/run", Some(req))
            .await
    }

    /// The URLs of a sandbox's port through the preview proxy.
    pub async fn expose(&self, id: &str, port: u16) -> Result<cella_types::Exposed, Error> {
        self.data(
            Method::POST,
            &format!("/api/v1/sandboxes/{id}/expose"),
            Some(&serde_json::json!({ "port": port })),
        )
        .await
    }

    /// Starts the download of an artifact.
    pub async fn download_artifact(&self, id: &str) -> Result<reqwest::Response, Error> {
        let res = self
            .authed(Method::GET, &format!("/api/v1/artifacts/{id}"))
            .send()
            .await
            .map_err(self.connect_err())?;
        self.check(res).await
    }

    /// Starts a download; read the bytes from the response (`chunk()` or `bytes_stream()`).
    pub async fn download(&self, id: &str, path: &str) -> Result<reqwest::Response, Error> {
        let res = self
            .authed(Method::GET, &format!("/api/v1/sandboxes/{id}/files"))
            .query(&[("path", path)])
            .send()
            .await
            .map_err(self.connect_err())?;
        self.check(res).await
    }

    pub async fn list_files(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<FileList, Error> {
        let q = [
            ("path".to_string(), path.to_string()),
            ("recursive".to_string(), recursive.to_string()),
        ];
        self.call::<(), _>(
            Method::GET,
            &format!("/api/v1/sandboxes/{id}/files/list"),
            &q,
            None,
        )
        .await
    }

    pub async fn stat_file(&self, id: &str, path: &str) -> Result<FileEntry, Error> {
        let q = [("path".to_string(), path.to_string())];
        Ok(self
            .call::<(), Data<FileEntry>>(
                Method::GET,
                &format!("/api/v1/sandboxes/{id}/files/stat"),
                &q,
                None,
            )
            .await?
            .data)
    }

    pub async fn make_dir(&self, id: &str, path: &str) -> Result<FileEntry, Error> {
        let body = MkdirRequest {
            path: path.to_string(),
        };
        self.data(
            Method::POST,
            &format!("/api/v1/sandboxes/{id}/files/mkdir"),
            Some(&body),
        )
        .await
    }

    pub async fn move_file(&self, id: &str, from: &str, to: &str) -> Result<FileEntry, Error> {
        let body = MoveRequest {
            from: from.to_string(),
            to: to.to_string(),
        };
        self.data(
            Method::POST,
            &format!("/api/v1/sandboxes/{id}/files/move"),
            Some(&body),
        )
        .await
    }

    pub async fn remove_file(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<Deleted, Error> {
        let q = [
            ("path".to_string(), path.to_string()),
            ("recursive".to_string(), recursive.to_string()),
        ];
        Ok(self
            .call::<(), Data<Deleted>>(
                Method::DELETE,
                &format!("/api/v1/sandboxes/{id}/files"),
                &q,
                None,
            )
            .await?
            .data)
    }

    pub async fn start_process(&self, id: &str, req: &StartProcess) -> Result<Process, Error> {
        self.data(
            Method::POST,
            &format!("/api/v1/sandboxes/{id}/processes"),
            Some(req),
        )
        .await
    }

    pub async fn list_processes(&self, id: &str) -> Result<List<Process>, Error> {
        self.call::<(), _>(
            Method::GET,
            &format!("/api/v1/sandboxes/{id}/processes"),
            &[],
            None,
        )
        .await
    }

    pub async fn signal_process(&self, id: &str, pid: i32, signal: &str) -> Result<Process, Error> {
        let body = SignalRequest {
            signal: serde_json::Value::String(signal.to_string()),
        };
        self.data(
            Method::POST,
            &format!("/api/v1/sandboxes/{id}/processes/{pid}/signal"),
            Some(&body),
        )
        .await
    }

    /// The WebSocket URL of a sandbox's terminal, and the header value that authorizes it.
    pub fn pty_url(&self, id: &str, query: &str) -> (String, Option<String>) {
        let ws = if let Some(rest) = self.base.strip_prefix("https://") {
            format!("wss://{rest}")
        } else {
            format!("ws://{}", self.base.trim_start_matches("http://"))
        };
        (
            format!("{ws}/api/v1/sandboxes/{id}/pty?{query}"),
            self.key.as_ref().map(|k| format!("Bearer {k}")),
        )
    }

    /// Follows a background process's output (from the start of what the agent keeps, or only
    /// new output) until it exits.
    pub async fn process_output(
        &self,
        id: &str,
        pid: i32,
        from_start: bool,
        on_output: impl FnMut(Output),
    ) -> Result<ExecExit, Error> {
        let from = if from_start { "start" } else { "now" };
        let res = self
            .authed(
                Method::GET,
                &format!("/api/v1/sandboxes/{id}/processes/{pid}/output"),
            )
            .query(&[("from", from)])
            .send()
            .await
            .map_err(self.connect_err())?;
        self.follow(res, on_output).await
    }

    /// Writes bytes to a background process's standard input (and closes it with `close`).
    pub async fn process_stdin(
        &self,
        id: &str,
        pid: i32,
        data: Vec<u8>,
        close: bool,
    ) -> Result<Process, Error> {
        let res = self
            .authed(
                Method::POST,
                &format!("/api/v1/sandboxes/{id}/processes/{pid}/stdin"),
            )
            .query(&[("close", close.to_string())])
            .body(data)
            .send()
            .await
            .map_err(self.connect_err())?;
        let res = self.check(res).await?;
        let d: Data<Process> = res.json().await.map_err(|e| Error::Decode(e.to_string()))?;
        Ok(d.data)
    }

    pub async fn snapshot(&self, id: &str) -> Result<Snapshot, Error> {
        self.data::<(), _>(
            Method::POST,
            &format!("/api/v1/sandboxes/{id}/snapshots"),
            None,
        )
        .await
    }

    pub async fn fork(&self, id: &str, req: &ForkRequest) -> Result<ForkResult, Error> {
        self.call(
            Method::POST,
            &format!("/api/v1/sandboxes/{id}/fork"),
            &[],
            Some(req),
        )
        .await
    }

    pub async fn list_snapshots(
        &self,
        query: &[(String, String)],
    ) -> Result<List<Snapshot>, Error> {
        self.call::<(), _>(Method::GET, "/api/v1/snapshots", query, None)
            .await
    }

    pub async fn delete_snapshot(&self, id: &str) -> Result<serde_json::Value, Error> {
        self.data::<(), _>(Method::DELETE, &format!("/api/v1/snapshots/{id}"), None)
            .await
    }

    pub async fn template(&self, id: &str) -> Result<Template, Error> {
        self.data::<(), _>(Method::GET, &format!("/api/v1/templates/{id}"), None)
            .await
    }

    /// A custom template's builds, newest first (without their logs).
    pub async fn template_builds(&self, id: &str) -> Result<List<TemplateBuild>, Error> {
        self.call::<(), _>(
            Method::GET,
            &format!("/api/v1/templates/{id}/builds"),
            &[],
            None,
        )
        .await
    }

    pub async fn delete_template(&self, id: &str) -> Result<serde_json::Value, Error> {
        self.data::<(), _>(Method::DELETE, &format!("/api/v1/templates/{id}"), None)
            .await
    }

    pub async fn create_workspace(&self, req: &CreateWorkspace) -> Result<Workspace, Error> {
        self.data(Method::POST, "/api/v1/workspaces", Some(req))
            .await
    }

    pub async fn create_api_key(&self, req: &CreateApiKey) -> Result<ApiKey, Error> {
        self.data(Method::POST, "/api/v1/api-keys", Some(req)).await
    }

    /// Makes a user (the operator's key, or none on a server with open sign-up).
    pub async fn create_user(&self, req: &CreateUser) -> Result<User, Error> {
        self.data(Method::POST, "/api/v1/users", Some(req)).await
    }

    /// Signs in; answers the session and its token (the `cella_session` cookie's value), for
    /// [`Client::with_session`].
    pub async fn sign_in(&self, email: &str, password: &str) -> Result<(Session, String), Error> {
        let res = self
            .http
            .post(format!("{}/api/v1/sessions", self.base))
            .json(&CreateSession {
                email: email.to_string(),
                password: password.to_string(),
            })
            .send()
            .await
            .map_err(self.connect_err())?;
        let res = self.check(res).await?;
        let token = res
            .headers()
            .get_all(reqwest::header::SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(|c| {
                c.split(';')
                    .next()
                    .and_then(|kv| kv.trim().strip_prefix("cella_session="))
                    .map(String::from)
            })
            .filter(|t| !t.is_empty())
            .ok_or_else(|| Error::Decode("no session cookie in the answer".into()))?;
        let body: Data<Session> = res.json().await.map_err(|e| Error::Decode(e.to_string()))?;
        Ok((body.data, token))
    }

    /// Ends this client's session (one of [`Client::with_session`]).
    pub async fn sign_out(&self) -> Result<serde_json::Value, Error> {
        self.data::<(), _>(Method::DELETE, "/api/v1/sessions/current", None)
            .await
    }

    /// The signed-in user and their workspaces.
    pub async fn me(&self) -> Result<Me, Error> {
        self.data::<(), _>(Method::GET, "/api/v1/me", None).await
    }

    /// Starts a task run (`POST /api/v1/tasks`): queued at once, or refused with nothing queued.
    pub async fn create_task(&self, req: &CreateTask) -> Result<Task, Error> {
        self.data(Method::POST, "/api/v1/tasks", Some(req)).await
    }

    /// One page of the workspace's task runs, newest first.
    pub async fn list_tasks(&self, filter: &TaskFilter) -> Result<List<Task>, Error> {
        self.call::<(), _>(Method::GET, "/api/v1/tasks", &filter.query(), None)
            .await
    }

    /// Every task run matching `filter` (its `limit` is the page size), following the cursor.
    pub async fn all_tasks(&self, filter: &TaskFilter) -> Result<Vec<Task>, Error> {
        let mut f = filter.clone();
        let mut out = Vec::new();
        loop {
            let page = self.list_tasks(&f).await?;
            out.extend(page.data);
            match page.next_cursor {
                Some(c) if Some(&c) != f.cursor.as_ref() => f.cursor = Some(c),
                _ => return Ok(out),
            }
        }
    }

    pub async fn get_task(&self, id: &str) -> Result<Task, Error> {
        self.data::<(), _>(Method::GET, &format!("/api/v1/tasks/{}", seg(id)), None)
            .await
    }

    /// Cancels a run (idempotent; a run that has ended comes back unchanged).
    pub async fn cancel_task(&self, id: &str) -> Result<Task, Error> {
        self.data::<(), _>(
            Method::POST,
            &format!("/api/v1/tasks/{}/cancel", seg(id)),
            None,
        )
        .await
    }

    /// Follows a run's events (`GET /api/v1/tasks/{id}/events`): the current state first, then
    /// each change and progress count, until the stream ends after a terminal state. Returns the
    /// last state seen.
    pub async fn task_events(
        &self,
        id: &str,
        mut on_event: impl FnMut(&TaskEvent),
    ) -> Result<Option<TaskState>, Error> {
        let res = self
            .authed(Method::GET, &format!("/api/v1/tasks/{}/events", seg(id)))
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .send()
            .await
            .map_err(self.connect_err())?;
        let mut last = None;
        self.sse(res, |name, data| {
            if let Some(ev) = task_event(name, data) {
                if let TaskEvent::State { state, .. } = &ev {
                    last = Some(*state);
                }
                on_event(&ev);
            }
        })
        .await?;
        Ok(last)
    }

    /// Follows a run's live log (`GET /api/v1/tasks/{id}/log`) while it runs; ends when the run
    /// does. A run that has ended answers `GONE` (410): its output was never kept.
    pub async fn task_log(&self, id: &str, mut on_output: impl FnMut(Output)) -> Result<(), Error> {
        let res = self
            .authed(Method::GET, &format!("/api/v1/tasks/{}/log", seg(id)))
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .send()
            .await
            .map_err(self.connect_err())?;
        self.sse(res, |name, data| {
            if name != "output" {
                return;
            }
            let text = data["text"].as_str().unwrap_or("").as_bytes().to_vec();
            on_output(if data["stream"] == "stderr" {
                Output::Stderr(text)
            } else {
                Output::Stdout(text)
            });
        })
        .await
    }

    /// Reads a stream of server-sent events until it ends, handing each (name, JSON data) on.
    async fn sse(
        &self,
        res: reqwest::Response,
        mut on_event: impl FnMut(&str, &serde_json::Value),
    ) -> Result<(), Error> {
        use futures_util::StreamExt;
        let res = self.check(res).await?;
        let mut body = res.bytes_stream();
        let mut buf: Vec<u8> = Vec::new();
        while let Some(chunk) = body.next().await {
            buf.extend_from_slice(&chunk.map_err(|e| Error::Decode(e.to_string()))?);
            // Normalise CRLF framing so `\n\n` ends every event.
            if buf.contains(&b'\r') {
                buf.retain(|b| *b != b'\r');
            }
            while let Some(end) = find_event_end(&buf) {
                let block = String::from_utf8_lossy(&buf[..end]).into_owned();
                buf.drain(..end + 2);
                if let Some((name, data)) = parse_event(&block) {
                    if name == "error" {
                        if let Ok(e) = serde_json::from_value::<ErrorBody>(data.clone()) {
                            return Err(Error::Api {
                                status: 0,
                                code: e.error.code,
                                message: e.error.message,
                                details: e.error.details,
                                request_id: String::new(),
                            });
                        }
                    }
                    on_event(&name, &data);
                }
            }
        }
        Ok(())
    }
}

/// Filters and paging of `GET /api/v1/tasks`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFilter {
    pub state: Option<TaskState>,
    /// `owner/name`.
    pub repository: Option<String>,
    /// 1-1000 (the server's default: 100).
    pub limit: Option<u32>,
    pub cursor: Option<String>,
}

impl TaskFilter {
    fn query(&self) -> Vec<(String, String)> {
        let mut q = Vec::new();
        if let Some(s) = self.state {
            q.push(("state".to_string(), s.as_str().to_string()));
        }
        if let Some(r) = &self.repository {
            q.push(("repository".to_string(), r.clone()));
        }
        if let Some(l) = self.limit {
            q.push(("limit".to_string(), l.to_string()));
        }
        if let Some(c) = &self.cursor {
            q.push(("cursor".to_string(), c.clone()));
        }
        q
    }
}

/// An id as one path segment: anything but the id alphabet is percent-encoded, so a bad id is
/// a 404 of the route, never another route.
fn seg(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A task event from its SSE name and data (the data is the `TaskEvent` JSON; its `event`
/// field is taken from the SSE name when absent). Unknown events are skipped.
fn task_event(name: &str, data: &serde_json::Value) -> Option<TaskEvent> {
    let mut data = data.clone();
    if let Some(o) = data.as_object_mut() {
        o.entry("event")
            .or_insert_with(|| serde_json::Value::String(name.to_string()));
    }
    serde_json::from_value(data).ok()
}

/// Output of a streamed command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
}

fn find_event_end(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\n\n")
}

/// One server-sent event: its name and its JSON data.
fn parse_event(block: &str) -> Option<(String, serde_json::Value)> {
    let mut name = None;
    let mut data = String::new();
    for line in block.lines() {
        if let Some(v) = line.strip_prefix("event:") {
            name = Some(v.trim().to_string());
        } else if let Some(v) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(v.strip_prefix(' ').unwrap_or(v));
        }
    }
    Some((name?, serde_json::from_str(&data).ok()?))
}

fn decode_output(data: &serde_json::Value) -> Result<Vec<u8>, Error> {
    use base64::Engine;
    match data {
        serde_json::Value::String(s) => Ok(s.clone().into_bytes()),
        other => {
            let b64 = other["b64"]
                .as_str()
                .ok_or_else(|| Error::Decode("output event without text or b64".into()))?;
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| Error::Decode(e.to_string()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_parse_text_and_bytes() {
        let (n, d) = parse_event("event: stdout\ndata: \"hi\\n\"").unwrap();
        assert_eq!(
            (n.as_str(), decode_output(&d).unwrap()),
            ("stdout", b"hi\n".to_vec())
        );
        let (_, d) = parse_event("event: stderr\ndata: {\"b64\":\"/wA=\"}").unwrap();
        assert_eq!(decode_output(&d).unwrap(), vec![0xff, 0]);
        assert_eq!(find_event_end(b"event: a\ndata: 1\n\nrest"), Some(16));
    }

    #[test]
    fn task_events_parse_with_or_without_their_tag() {
        let d = serde_json::json!({"state": "running", "at": "2026-01-01T00:00:00Z",
            "failure_reason": null, "stop_reason": null});
        match task_event("state", &d) {
            Some(TaskEvent::State { state, .. }) => assert_eq!(state, TaskState::Running),
            other => panic!("{other:?}"),
        }
        let d = serde_json::json!({"event": "progress", "steps": 2, "commits": 1,
            "files_changed": 1});
        assert_eq!(
            task_event("progress", &d),
            Some(TaskEvent::Progress(TaskProgress {
                steps: 2,
                commits: 1,
                files_changed: 1
            }))
        );
        assert_eq!(task_event("nonsense", &serde_json::json!({})), None);
    }

    #[test]
    fn task_filters_become_the_query_and_ids_stay_one_segment() {
        let f = TaskFilter {
            state: Some(TaskState::Queued),
            repository: Some("acme/web".into()),
            limit: Some(5),
            cursor: None,
        };
        assert_eq!(
            f.query(),
            vec![
                ("state".to_string(), "queued".to_string()),
                ("repository".to_string(), "acme/web".to_string()),
                ("limit".to_string(), "5".to_string()),
            ]
        );
        assert_eq!(seg("tsk_abc-1"), "tsk_abc-1");
        assert_eq!(seg("../x?y"), "%2E%2E%2Fx%3Fy");
    }
}
