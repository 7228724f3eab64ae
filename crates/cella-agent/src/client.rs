//! The node's side of the agent protocol.
//!
//! Every operation has deadlines, so a silent or stuck agent never holds a request forever
//! (callers answer [`ClientError::Timeout`] as 503): connecting takes at most
//! [`CONNECT_TIMEOUT`], a one-answer request [`ANSWER_TIMEOUT`], and each frame of a streamed
//! download or upload [`FRAME_TIMEOUT`]. An exec ends by its own timeout plus [`EXEC_GRACE`]
//! even when the agent never answers (an agent stuck in its sandbox's memory reclaim, say).
//! Streams that are quiet by nature (a followed process, a terminal, a watch, a port) have
//! deadlines on their setup only.

use crate::proto::{self, ErrorKind, ExecSpec, ExitInfo, FrameKind, ProtoError, Request, Response};
use std::path::PathBuf;
use std::time::Duration;
use tokio::net::UnixStream;
use tokio::sync::mpsc;

/// Output of a running command, in the order the agent read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the sandbox agent is not reachable: {0}")]
    Unreachable(std::io::Error),
    #[error("the sandbox agent did not answer in time")]
    Timeout,
    #[error(transparent)]
    Proto(#[from] ProtoError),
    #[error("the sandbox agent refused the request ({kind:?}): {message}")]
    Refused { kind: ErrorKind, message: String },
    #[error("the sandbox agent hung up before the command ended")]
    HungUp,
    #[error("the receiver of the command's output went away")]
    ConsumerGone,
    #[error("the sandbox agent sent an unexpected message")]
    Unexpected,
}

/// Longest wait for the agent to accept a connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for the answer to a request with one answer (stat, list, mkdir, ...), or for
/// the first answer of a stream.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest wait for one frame of a download, or to send one frame of an upload.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(60);
/// How long past a command's own timeout an exec may take to answer: the agent kills the
/// command's whole tree at its timeout, and a tree holding gigabytes takes a while to go.
pub const EXEC_GRACE: Duration = Duration::from_secs(30);

async fn deadline<T>(
    d: Duration,
    f: impl std::future::Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    tokio::time::timeout(d, f)
        .await
        .map_err(|_| ClientError::Timeout)?
}

#[derive(Debug, Clone)]
pub struct AgentClient {
    socket: PathBuf,
}

impl AgentClient {
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        AgentClient {
            socket: socket.into(),
        }
    }

    async fn connect(&self) -> Result<UnixStream, ClientError> {
        deadline(CONNECT_TIMEOUT, async {
            UnixStream::connect(&self.socket)
                .await
                .map_err(ClientError::Unreachable)
        })
        .await
    }

    /// Answers the agent's protocol version.
    pub async fn ping(&self, timeout: Duration) -> Result<u32, ClientError> {
        let work = async {
            let mut s = self.connect().await?;
            proto::write_json(&mut s, &Request::Ping).await?;
            match proto::read_frame(&mut s).await? {
                Some((FrameKind::Json, body)) => {
                    match serde_json::from_slice(&body).map_err(ProtoError::from)? {
                        Response::Pong { version, .. } => Ok(version),
                        _ => Err(ClientError::Unexpected),
                    }
                }
                _ => Err(ClientError::Unexpected),
            }
        };
        tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| ClientError::Timeout)?
    }

    /// Sets the sandbox's hostname (see `Request::SetHostname`).
    pub async fn set_hostname(&self, name: &str, timeout: Duration) -> Result<(), ClientError> {
        let work = async {
            let mut s = self.connect().await?;
            let req = Request::SetHostname { name: name.into() };
            proto::write_json(&mut s, &req).await?;
            match Self::answer(&mut s).await? {
                Response::Pong { .. } => Ok(()),
                _ => Err(ClientError::Unexpected),
            }
        };
        tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| ClientError::Timeout)?
    }

    /// Asks the agent to close its socket and every connection (see `Request::Quiesce`);
    /// returns once it answered and closed this connection too, the last one.
    pub async fn quiesce(&self, timeout: Duration) -> Result<(), ClientError> {
        let work = async {
            let mut s = self.connect().await?;
            proto::write_json(&mut s, &Request::Quiesce).await?;
            match Self::answer(&mut s).await? {
                Response::Pong { .. } => {}
                _ => return Err(ClientError::Unexpected),
            }
            // The agent closes the connection right after its answer.
            while proto::read_frame(&mut s).await?.is_some() {}
            Ok(())
        };
        tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| ClientError::Timeout)?
    }

    /// Asks the agent to kill the sandbox's process with the most resident memory, if it holds
    /// `at_least` bytes (see `Request::OomKill`); answers its pid, resident bytes and name.
    pub async fn oom_kill(
        &self,
        at_least: u64,
        timeout: Duration,
    ) -> Result<(i32, u64, String), ClientError> {
        let work = async {
            match self.call(&Request::OomKill { at_least }).await? {
                Response::OomKilled {
                    pid,
                    rss_bytes,
                    name,
                } => Ok((pid, rss_bytes, name)),
                _ => Err(ClientError::Unexpected),
            }
        };
        tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| ClientError::Timeout)?
    }

    /// Runs a command and sends its output to `events` as it comes. When the receiver of
    /// `events` is dropped, the connection is closed and the agent kills the command.
    pub async fn exec(
        &self,
        spec: ExecSpec,
        events: mpsc::Sender<ExecEvent>,
    ) -> Result<ExitInfo, ClientError> {
        let limit = Duration::from_millis(spec.timeout_ms) + EXEC_GRACE;
        // Dropping the connection at the deadline makes the agent kill the command.
        deadline(limit, self.exec_until_exit(spec, events)).await
    }

    async fn exec_until_exit(
        &self,
        spec: ExecSpec,
        events: mpsc::Sender<ExecEvent>,
    ) -> Result<ExitInfo, ClientError> {
        let mut s = self.connect().await?;
        proto::write_json(&mut s, &Request::Exec(spec)).await?;
        loop {
            let frame = tokio::select! {
                f = proto::read_frame(&mut s) => f?,
                _ = events.closed() => return Err(ClientError::ConsumerGone),
            };
            match frame {
                None => return Err(ClientError::HungUp),
                Some((FrameKind::Data | FrameKind::DataEnd, _)) => {
                    return Err(ClientError::Unexpected)
                }
                Some((FrameKind::Stdout, data)) => {
                    if events.send(ExecEvent::Stdout(data)).await.is_err() {
                        return Err(ClientError::ConsumerGone);
                    }
                }
                Some((FrameKind::Stderr, data)) => {
                    if events.send(ExecEvent::Stderr(data)).await.is_err() {
                        return Err(ClientError::ConsumerGone);
                    }
                }
                Some((FrameKind::Json, body)) => {
                    match serde_json::from_slice(&body).map_err(ProtoError::from)? {
                        Response::Started { .. } => {}
                        Response::Exit(info) => return Ok(info),
                        Response::Error { kind, message } => {
                            return Err(ClientError::Refused { kind, message })
                        }
                        _ => return Err(ClientError::Unexpected),
                    }
                }
            }
        }
    }
}

/// A download in progress: the file's size and range, then its bytes chunk by chunk.
pub struct FileReader {
    stream: UnixStream,
    pub size: u64,
    pub offset: u64,
    pub length: u64,
    done: bool,
}

impl FileReader {
    /// The next chunk, or `None` at the end.
    pub async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, ClientError>> {
        if self.done {
            return None;
        }
        let frame =
            match tokio::time::timeout(FRAME_TIMEOUT, proto::read_frame(&mut self.stream)).await {
                Ok(f) => f,
                Err(_) => {
                    self.done = true;
                    return Some(Err(ClientError::Timeout));
                }
            };
        match frame {
            Ok(Some((FrameKind::Data, data))) => Some(Ok(data)),
            Ok(Some((FrameKind::Json, _))) => {
                self.done = true;
                None
            }
            Ok(_) => {
                self.done = true;
                Some(Err(ClientError::HungUp))
            }
            Err(e) => {
                self.done = true;
                Some(Err(e.into()))
            }
        }
    }
}

impl AgentClient {
    async fn answer(s: &mut UnixStream) -> Result<Response, ClientError> {
        deadline(ANSWER_TIMEOUT, Self::answer_now(s)).await
    }

    async fn answer_now(s: &mut UnixStream) -> Result<Response, ClientError> {
        match proto::read_frame(s).await? {
            Some((FrameKind::Json, body)) => {
                let r: Response = serde_json::from_slice(&body).map_err(ProtoError::from)?;
                if let Response::Error { kind, message } = r {
                    return Err(ClientError::Refused { kind, message });
                }
                Ok(r)
            }
            Some(_) => Err(ClientError::Unexpected),
            None => Err(ClientError::HungUp),
        }
    }

    /// Ends an upload early and waits until the agent has thrown the partial file away, so that
    /// when the caller answers, nothing is left behind.
    async fn abort(s: &mut UnixStream) {
        use tokio::io::AsyncWriteExt;
        let _ = s.shutdown().await;
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), Self::answer(s)).await;
    }

    /// Sends a request that has one answer (stat, list, mkdir, move, remove).
    pub async fn call(&self, req: &Request) -> Result<Response, ClientError> {
        let mut s = self.connect().await?;
        deadline(FRAME_TIMEOUT, async {
            Ok(proto::write_json(&mut s, req).await?)
        })
        .await?;
        // A code cell answers when it is done: its own timeout, plus the kernel's grace.
        let wait = match req {
            Request::Code {
                action: crate::proto::CodeOp::Run { timeout_ms, .. },
                ..
            } => Duration::from_millis(*timeout_ms) + crate::kernel::GRACE + ANSWER_TIMEOUT,
            _ => ANSWER_TIMEOUT,
        };
        deadline(wait, Self::answer_now(&mut s)).await
    }

    /// Starts a download of `path` from `offset`, at most `length` bytes.
    pub async fn read_file(
        &self,
        path: &str,
        offset: u64,
        length: Option<u64>,
    ) -> Result<FileReader, ClientError> {
        self.read_file_with(path, offset, length, false).await
    }

    /// Like [`read_file`](Self::read_file); with `nofollow`, a symlink as the last component is
    /// refused instead of followed.
    pub async fn read_file_with(
        &self,
        path: &str,
        offset: u64,
        length: Option<u64>,
        nofollow: bool,
    ) -> Result<FileReader, ClientError> {
        let mut s = self.connect().await?;
        let req = Request::Read {
            path: path.to_string(),
            offset,
            length,
            nofollow,
        };
        deadline(FRAME_TIMEOUT, async {
            Ok(proto::write_json(&mut s, &req).await?)
        })
        .await?;
        match Self::answer(&mut s).await? {
            Response::FileStart {
                size,
                offset,
                length,
            } => Ok(FileReader {
                stream: s,
                size,
                offset,
                length,
                done: false,
            }),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// Uploads a file from `chunks`; the file appears only once every chunk arrived. A chunk
    /// source that fails (or passes `max_bytes`) aborts the upload and leaves nothing behind.
    pub async fn write_file<S, E>(
        &self,
        path: &str,
        uid: u32,
        gid: u32,
        mode: u32,
        max_bytes: u64,
        mut chunks: S,
    ) -> Result<u64, WriteError<E>>
    where
        S: futures_core::Stream<Item = Result<Vec<u8>, E>> + Unpin,
    {
        use std::future::poll_fn;
        use std::pin::Pin;
        let mut s = self.connect().await.map_err(WriteError::Agent)?;
        let req = Request::Write {
            path: path.to_string(),
            uid,
            gid,
            mode,
            max_bytes,
        };
        deadline(FRAME_TIMEOUT, async {
            Ok(proto::write_json(&mut s, &req).await?)
        })
        .await
        .map_err(WriteError::Agent)?;
        let mut total = 0u64;
        loop {
            let next = poll_fn(|cx| Pin::new(&mut chunks).poll_next(cx)).await;
            match next {
                Some(Ok(data)) => {
                    total += data.len() as u64;
                    if total > max_bytes {
                        Self::abort(&mut s).await;
                        return Err(WriteError::TooLarge);
                    }
                    for piece in data.chunks(proto::MAX_FRAME) {
                        let sent = tokio::time::timeout(
                            FRAME_TIMEOUT,
                            proto::write_frame(&mut s, FrameKind::Data, piece),
                        )
                        .await;
                        match sent {
                            Ok(Ok(())) => {}
                            // The agent answered early (an error) and closed: read why.
                            Ok(Err(e)) => {
                                return Err(WriteError::Agent(
                                    Self::answer(&mut s).await.err().unwrap_or(e.into()),
                                ))
                            }
                            Err(_) => return Err(WriteError::Agent(ClientError::Timeout)),
                        }
                    }
                }
                Some(Err(e)) => {
                    Self::abort(&mut s).await;
                    return Err(WriteError::Source(e));
                }
                None => break,
            }
        }
        let end = tokio::time::timeout(
            FRAME_TIMEOUT,
            proto::write_frame(&mut s, FrameKind::DataEnd, &[]),
        )
        .await;
        match end {
            Ok(Ok(())) => {}
            // The agent refused the upload before its end and closed: its answer says why.
            Ok(Err(e)) => {
                return Err(WriteError::Agent(
                    Self::answer(&mut s).await.err().unwrap_or(e.into()),
                ))
            }
            Err(_) => return Err(WriteError::Agent(ClientError::Timeout)),
        }
        match Self::answer(&mut s).await.map_err(WriteError::Agent)? {
            Response::Done { bytes } => Ok(bytes),
            _ => Err(WriteError::Agent(ClientError::Unexpected)),
        }
    }
}

/// Why an upload failed.
#[derive(Debug)]
pub enum WriteError<E> {
    /// The body went past `max_bytes`.
    TooLarge,
    /// Reading the body failed (the client went away).
    Source(E),
    Agent(ClientError),
}

impl AgentClient {
    /// Follows a spawned process's output into `events` until it exits (`Some(exit)`), or the
    /// receiver goes away (`None`; the process carries on).
    pub async fn follow(
        &self,
        pid: i32,
        from_start: bool,
        events: mpsc::Sender<ExecEvent>,
    ) -> Result<Option<ExitInfo>, ClientError> {
        let mut s = self.connect().await?;
        proto::write_json(&mut s, &Request::Follow { pid, from_start }).await?;
        match Self::answer(&mut s).await? {
            Response::Started { .. } => {}
            _ => return Err(ClientError::Unexpected),
        }
        loop {
            let frame = tokio::select! {
                f = proto::read_frame(&mut s) => f?,
                _ = events.closed() => return Ok(None),
            };
            let ev = match frame {
                None => return Err(ClientError::HungUp),
                Some((FrameKind::Stdout, d)) => ExecEvent::Stdout(d),
                Some((FrameKind::Stderr, d)) => ExecEvent::Stderr(d),
                Some((FrameKind::Json, body)) => {
                    return match serde_json::from_slice(&body).map_err(ProtoError::from)? {
                        Response::Exit(info) => Ok(Some(info)),
                        Response::Error { kind, message } => {
                            Err(ClientError::Refused { kind, message })
                        }
                        _ => Err(ClientError::Unexpected),
                    };
                }
                Some(_) => return Err(ClientError::Unexpected),
            };
            if events.send(ev).await.is_err() {
                return Ok(None);
            }
        }
    }
}

/// The sending half of a terminal: keyboard input and resizes.
pub struct PtyWriter {
    half: tokio::net::unix::OwnedWriteHalf,
}

/// The receiving half of a terminal: screen output, then the exit.
pub struct PtyReader {
    half: tokio::net::unix::OwnedReadHalf,
}

#[derive(Debug)]
pub enum PtyEvent {
    Output(Vec<u8>),
    /// Something the agent could not do for the terminal (a resize that did not take), for the
    /// node's log; the session goes on.
    Problem(String),
    Exit(ExitInfo),
}

impl PtyWriter {
    pub async fn input(&mut self, data: &[u8]) -> Result<(), ClientError> {
        for piece in data.chunks(proto::MAX_FRAME) {
            proto::write_frame(&mut self.half, FrameKind::Data, piece).await?;
        }
        Ok(())
    }

    pub async fn resize(&mut self, cols: u16, rows: u16) -> Result<(), ClientError> {
        Ok(proto::write_json(
            &mut self.half,
            &crate::proto::PtyControl::Resize { cols, rows },
        )
        .await?)
    }
}

impl PtyReader {
    /// The next output or the exit; `None` when the agent hung up.
    pub async fn next(&mut self) -> Option<PtyEvent> {
        match proto::read_frame(&mut self.half).await {
            Ok(Some((FrameKind::Stdout, d))) => Some(PtyEvent::Output(d)),
            Ok(Some((FrameKind::Json, body))) => match serde_json::from_slice(&body) {
                Ok(Response::Exit(info)) => Some(PtyEvent::Exit(info)),
                Ok(Response::Error { message, .. }) => Some(PtyEvent::Problem(message)),
                _ => None,
            },
            _ => None,
        }
    }
}

impl AgentClient {
    /// Starts `spec` on a new terminal of `cols` x `rows`; returns its pid and the two halves.
    /// Dropping the writer hangs the terminal up.
    /// A byte stream to `port` on the sandbox's own loopback (see `Request::Connect`).
    pub async fn connect_port(&self, port: u16) -> Result<UnixStream, ClientError> {
        let mut s = self.connect().await?;
        proto::write_json(&mut s, &Request::Connect { port }).await?;
        match Self::answer(&mut s).await? {
            Response::Connected => Ok(s),
            _ => Err(ClientError::Unexpected),
        }
    }

    pub async fn open_pty(
        &self,
        spec: ExecSpec,
        cols: u16,
        rows: u16,
    ) -> Result<(i32, PtyWriter, PtyReader), ClientError> {
        let mut s = self.connect().await?;
        let req = Request::Pty {
            spec,
            cols,
            rows,
            report_problems: true,
        };
        proto::write_json(&mut s, &req).await?;
        let pid = match Self::answer(&mut s).await? {
            Response::Started { pid } => pid,
            _ => return Err(ClientError::Unexpected),
        };
        let (r, w) = s.into_split();
        Ok((pid, PtyWriter { half: w }, PtyReader { half: r }))
    }
}

/// A watch in progress: one change after another.
pub struct Watcher {
    stream: UnixStream,
}

/// A change under a watched path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsChange {
    pub event: String,
    pub path: String,
    pub from: Option<String>,
    pub dir: bool,
}

impl Watcher {
    /// The next change; `None` when the agent hung up.
    pub async fn next(&mut self) -> Option<FsChange> {
        match proto::read_frame(&mut self.stream).await {
            Ok(Some((FrameKind::Json, body))) => match serde_json::from_slice(&body) {
                Ok(Response::FsEvent {
                    event,
                    path,
                    from,
                    dir,
                }) => Some(FsChange {
                    event,
                    path,
                    from,
                    dir,
                }),
                _ => None,
            },
            _ => None,
        }
    }
}

impl AgentClient {
    /// Starts watching `path`; refusals (not found, not a directory) come back here.
    pub async fn watch(&self, path: &str, recursive: bool) -> Result<Watcher, ClientError> {
        let mut s = self.connect().await?;
        proto::write_json(
            &mut s,
            &Request::Watch {
                path: path.to_string(),
                recursive,
            },
        )
        .await?;
        match Self::answer(&mut s).await? {
            Response::Done { .. } => Ok(Watcher { stream: s }),
            _ => Err(ClientError::Unexpected),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use tokio::io::AsyncReadExt;

    /// What the agent could not do for a terminal comes to the node as a problem, and the
    /// session goes on to its output and exit.
    #[tokio::test]
    async fn a_terminals_problem_is_reported_and_the_session_goes_on() {
        let (node, agent) = tokio::net::UnixStream::pair().unwrap();
        let (half, _keep) = node.into_split();
        let mut reader = PtyReader { half };
        let (_rd, mut wr) = agent.into_split();
        let problem = Response::Error {
            kind: crate::proto::ErrorKind::Internal,
            message: "resizing the terminal to 100x40: Interrupted".into(),
        };
        proto::write_json(&mut wr, &problem).await.unwrap();
        proto::write_frame(&mut wr, FrameKind::Stdout, b"$ ")
            .await
            .unwrap();
        let exit = ExitInfo {
            exit_code: 3,
            timed_out: false,
            duration_ms: 1,
            stdout_truncated: false,
            stderr_truncated: false,
        };
        proto::write_json(&mut wr, &Response::Exit(exit))
            .await
            .unwrap();
        match reader.next().await {
            Some(PtyEvent::Problem(m)) => assert!(m.contains("100x40"), "{m}"),
            other => panic!("expected the problem, got {other:?}"),
        }
        assert!(matches!(reader.next().await, Some(PtyEvent::Output(b)) if b == b"$ "));
        assert!(matches!(reader.next().await, Some(PtyEvent::Exit(e)) if e.exit_code == 3));
    }

    /// An agent that takes the command and never answers: the exec still ends, at the
    /// command's timeout plus the grace, as a timeout (the caller's 503), and the agent sees
    /// its connection closed (which is what makes a real agent kill the command).
    #[tokio::test(start_paused = true)]
    async fn an_exec_whose_agent_never_answers_ends_after_its_timeout_and_the_grace() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let silent = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            // Reads the request, answers nothing; returns once the client hangs up.
            s.read_to_end(&mut buf).await.unwrap();
            buf.len()
        });
        let spec = ExecSpec {
            argv: vec!["sleep".into(), "infinity".into()],
            env: BTreeMap::new(),
            cwd: "/".into(),
            uid: 1000,
            gid: 1000,
            stdin: None,
            timeout_ms: 5_000,
            output_cap: None,
        };
        let (tx, _rx) = mpsc::channel(4);
        let start = tokio::time::Instant::now();
        let r = AgentClient::new(&path).exec(spec, tx).await;
        assert!(matches!(r, Err(ClientError::Timeout)), "{r:?}");
        let took = start.elapsed();
        let limit = Duration::from_millis(5_000) + EXEC_GRACE;
        assert!(
            took >= limit && took < limit + Duration::from_secs(1),
            "ends at its timeout plus the grace, not {took:?}"
        );
        assert!(
            silent.await.unwrap() > 0,
            "the agent got the request, then the hang-up"
        );
    }
}
