//! The node <-> agent wire protocol.
//!
//! A connection carries one request. Every message is a frame: one kind byte, a big-endian u32
//! length, then the payload. Control messages are JSON; output is raw bytes, so binary output
//! costs nothing extra.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The version both sides speak; `Ping` answers it.
pub const PROTOCOL_VERSION: u32 = 1;

impl Request {
    /// Whether this request runs anything or changes anything in the sandbox (reads, listings,
    /// watches and pings do not).
    pub fn touches(&self) -> bool {
        !matches!(
            self,
            Request::Ping
                | Request::Seal
                | Request::Quiesce
                | Request::SetHostname { .. }
                | Request::Stat { .. }
                | Request::List { .. }
                | Request::Read { .. }
                | Request::Processes
                | Request::Process { .. }
                | Request::Follow { .. }
                | Request::Activity
                | Request::Watch { .. }
        )
    }
}

/// Largest frame either side accepts.
pub const MAX_FRAME: usize = 64 * 1024 * 1024;

impl ExecSpec {
    /// The `true` the platform runs to ready a gVisor sandbox's first command (see
    /// `AgentConfig::warm_first_command`): the template's own, found through the default
    /// `PATH`, as `nobody` (65534, which owns nothing), in `/`, with nothing else of the
    /// environment, its output dropped, killed after 5 s.
    pub fn warm_up() -> ExecSpec {
        ExecSpec {
            argv: vec!["true".into()],
            env: [(
                "PATH".to_string(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
            )]
            .into(),
            cwd: "/".into(),
            uid: 65534,
            gid: 65534,
            stdin: None,
            timeout_ms: 5_000,
            output_cap: Some(0),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    Json = 1,
    Stdout = 2,
    Stderr = 3,
    /// File bytes, either way (upload to the agent, download from it).
    Data = 4,
    /// The end of an upload: everything was sent.
    DataEnd = 5,
}

impl FrameKind {
    fn from_u8(b: u8) -> Option<FrameKind> {
        match b {
            1 => Some(FrameKind::Json),
            2 => Some(FrameKind::Stdout),
            3 => Some(FrameKind::Stderr),
            4 => Some(FrameKind::Data),
            5 => Some(FrameKind::DataEnd),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Answers `Pong`, with `touched` once the agent was sealed.
    Ping,
    /// Marks the sandbox as untouched from now on: `Pong.touched` counts the requests that run
    /// or change anything (exec, processes, terminals, code, file writes, connections) made
    /// since. The warm pool seals a sandbox once it is booted and hands it out only while
    /// nothing touched it. Answers `Pong`.
    Seal,
    /// Before a checkpoint (gVisor's pause to disk): the agent closes its listener and every
    /// other connection, answers `Pong` on this one, closes it, and waits for `SIGUSR2` to bind
    /// its socket again. Refused (`Unsupported`) by an agent that cannot bind again.
    Quiesce,
    /// Sets the sandbox's hostname (its UTS namespace's): a gVisor sandbox restored from
    /// another's checkpoint takes its own. Answers `Pong`.
    SetHostname {
        name: String,
    },
    Exec(ExecSpec),
    /// Metadata of one path.
    Stat {
        path: String,
    },
    /// Entries of a directory (and below, when recursive), at most `limit`.
    List {
        path: String,
        recursive: bool,
        limit: usize,
    },
    /// `mkdir -p`; new directories belong to `uid`/`gid`.
    Mkdir {
        path: String,
        uid: u32,
        gid: u32,
    },
    Move {
        from: String,
        to: String,
    },
    Remove {
        path: String,
        recursive: bool,
    },
    /// Sends `FileStart`, then the bytes from `offset` (at most `length`) as `Data` frames,
    /// then `Done`.
    Read {
        path: String,
        offset: u64,
        length: Option<u64>,
        /// Refuse a symlink as the last component (artifact collection).
        #[serde(default)]
        nofollow: bool,
    },
    /// Starts a process that outlives this connection; answers `Started`.
    Spawn {
        spec: ExecSpec,
        tag: Option<String>,
    },
    /// Every process started with `Spawn` that is running or exited recently.
    Processes,
    Process {
        pid: i32,
    },
    Signal {
        pid: i32,
        signal: i32,
    },
    /// Writes to a process's standard input; `close` closes it afterwards.
    Stdin {
        pid: i32,
        data: Vec<u8>,
        close: bool,
    },
    /// Streams a process's output (`Stdout`/`Stderr` frames; from the start of what the ring
    /// buffer holds, or from now), then `Exit` once it ends.
    Follow {
        pid: i32,
        from_start: bool,
    },
    /// When a spawned process last wrote output.
    Activity,
    /// Watches a path (and, when recursive, every directory below it, new ones included);
    /// answers `Done` once watching, then one `FsEvent` per change until the node hangs up.
    Watch {
        path: String,
        recursive: bool,
    },
    /// Starts a program on a new terminal and relays it: the node sends `Data` (keyboard input)
    /// and `Json` [`PtyControl`] frames; the agent sends `Stdout` (screen output), then `Exit`.
    /// When the node hangs up, the program gets SIGHUP (and SIGKILL shortly after).
    Pty {
        spec: ExecSpec,
        cols: u16,
        rows: u16,
        /// The node takes an `Error` frame during the session as a problem to log (a resize
        /// that did not take), not as the end. Absent (false) from an older node, which would
        /// hang up on one: the agent then sends none.
        #[serde(default)]
        report_problems: bool,
    },
    /// A code interpreter operation for `language`'s kernel (see `kernel.rs`); `spec` gives
    /// the user, environment and directory the kernel starts with if it has to. Answers `Code`.
    Code {
        language: String,
        action: CodeOp,
        spec: ExecSpec,
    },
    /// Opens a TCP connection to `port` on the sandbox's own loopback; answers `Connected`,
    /// after which the connection carries the raw bytes both ways (the preview proxy's way to an
    /// app that listens on 127.0.0.1 only).
    Connect {
        port: u16,
    },
    /// Followed by `Data` frames and one `DataEnd`; the file is replaced only when all of it
    /// arrived (a broken upload leaves nothing behind). Parents are created.
    Write {
        path: String,
        uid: u32,
        gid: u32,
        mode: u32,
        max_bytes: u64,
    },
    /// The host found the sandbox over its memory limit, which its kernel does not enforce
    /// (gVisor): the agent kills the process with the most resident memory, as a kernel's OOM
    /// killer would, and answers `OomKilled`; `Error` `NotFound` when none holds `at_least`
    /// bytes (killing a small one would not bring the sandbox back under its limit: its memory
    /// is elsewhere, files in a memory file system say).
    OomKill {
        #[serde(default)]
        at_least: u64,
    },
}

/// What to do with a language's kernel.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum CodeOp {
    /// Run one cell in a context (made if missing).
    Run {
        context: String,
        code: String,
        timeout_ms: u64,
    },
    /// Make a context if it does not exist.
    Create { context: String },
    /// Forget one context.
    Reset { context: String },
    /// Forget every context of the language (the kernel ends).
    ResetAll,
    /// Report every kernel's state; starts nothing.
    State,
}

/// One language's kernel as the agent knows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KernelState {
    pub language: String,
    pub running: bool,
    pub busy: bool,
    pub contexts: Vec<String>,
}

/// What the node sends on a terminal connection besides input.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum PtyControl {
    Resize { cols: u16, rows: u16 },
}

/// A process started with `Spawn`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProcessInfo {
    /// Its pid inside the sandbox.
    pub pid: i32,
    pub argv: Vec<String>,
    pub tag: Option<String>,
    pub uid: u32,
    pub cwd: String,
    /// Unix milliseconds.
    pub started_at: i64,
    pub running: bool,
    pub exit_code: Option<i32>,
    pub ended_at: Option<i64>,
    /// Output bytes the ring buffer no longer holds.
    pub dropped_bytes: u64,
}

/// What the files routes answer about a path.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FileInfo {
    pub name: String,
    pub path: String,
    /// `file`, `dir`, `symlink` or `other` (not named `type`: `Response` is tagged by it).
    pub kind: String,
    pub size: u64,
    /// Permission bits, e.g. 0o644.
    pub mode: u32,
    /// Unix seconds.
    pub modified: i64,
    pub uid: u32,
    pub gid: u32,
    /// Where a symlink points.
    pub target: Option<String>,
}

/// One command to run inside the sandbox.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ExecSpec {
    /// Program and arguments; the program is looked up in `PATH` when it has no slash.
    pub argv: Vec<String>,
    /// The whole environment of the command.
    pub env: BTreeMap<String, String>,
    pub cwd: String,
    pub uid: u32,
    pub gid: u32,
    /// Bytes for standard input; `None` gives `/dev/null`.
    pub stdin: Option<Vec<u8>>,
    /// Kill the command (and its process group and session) after this many milliseconds.
    pub timeout_ms: u64,
    /// Forward at most this many bytes per stream; the rest is read and dropped.
    pub output_cap: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Response {
    /// The process an `OomKill` ended.
    OomKilled {
        pid: i32,
        /// Its resident memory when it was chosen.
        rss_bytes: u64,
        /// Its name (`comm`).
        name: String,
    },
    Pong {
        version: u32,
        /// Requests that ran or changed anything since the last `Seal`; None: never sealed.
        #[serde(default)]
        touched: Option<u64>,
    },
    /// The command started with this pid (as seen inside the sandbox).
    Started {
        pid: i32,
    },
    Exit(ExitInfo),
    /// A `Connect` reached its port; raw bytes follow.
    Connected,
    /// A kernel's answer (see `kernel.rs` for its fields).
    Code {
        answer: serde_json::Value,
    },
    /// The request could not be carried out; `kind` is machine-readable.
    Error {
        kind: ErrorKind,
        message: String,
    },
    Stat(FileInfo),
    Entries {
        entries: Vec<FileInfo>,
        truncated: bool,
    },
    /// A read begins: the file's whole size, and where this answer starts and how much it sends.
    FileStart {
        size: u64,
        offset: u64,
        length: u64,
    },
    Processes {
        processes: Vec<ProcessInfo>,
    },
    Process(ProcessInfo),
    /// Milliseconds since a spawned process last wrote output (None: never).
    Activity {
        idle_ms: Option<u64>,
    },
    /// A change under a watched path: `create`, `modify`, `delete` or `rename` (with `from`).
    FsEvent {
        event: String,
        path: String,
        from: Option<String>,
        dir: bool,
    },
    /// A file operation is done; `bytes` is what a write stored.
    Done {
        bytes: u64,
    },
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The working directory does not exist inside the sandbox.
    BadCwd,
    /// The request itself was malformed.
    BadRequest,
    /// The path does not exist.
    NotFound,
    /// The path exists, or is of the wrong type for the operation, or a directory is not empty.
    Conflict,
    /// An upload went past its limit.
    TooLarge,
    /// The sandbox's disk (or its inodes, or a quota) is full.
    NoSpace,
    /// Too many operations of this kind are in progress in the sandbox; retry later.
    Busy,
    /// The agent is out of descriptors or memory; retry later.
    Unavailable,
    Internal,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExitInfo {
    /// Exit code; 128 + N when killed by signal N.
    pub exit_code: i32,
    pub timed_out: bool,
    pub duration_ms: u64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("agent connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("agent sent an unknown frame kind {0}")]
    BadKind(u8),
    #[error("agent frame of {0} bytes is over the limit")]
    TooLarge(usize),
    #[error("agent message is not valid: {0}")]
    BadJson(#[from] serde_json::Error),
}

pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    kind: FrameKind,
    payload: &[u8],
) -> Result<(), ProtoError> {
    if payload.len() > MAX_FRAME {
        return Err(ProtoError::TooLarge(payload.len()));
    }
    if payload.len() <= SMALL_FRAME {
        // One write: a reader is woken once, not for the head and again for the payload.
        let mut buf = Vec::with_capacity(5 + payload.len());
        push_frame(&mut buf, kind, payload);
        w.write_all(&buf).await?;
        return Ok(());
    }
    let mut head = [0u8; 5];
    head[0] = kind as u8;
    head[1..].copy_from_slice(&(payload.len() as u32).to_be_bytes());
    w.write_all(&head).await?;
    w.write_all(payload).await?;
    Ok(())
}

/// Frames up to this size are written with their head in one write.
const SMALL_FRAME: usize = 64 * 1024;

/// Appends one frame (head and payload) to `buf`, for a caller that writes several at once.
pub fn push_frame(buf: &mut Vec<u8>, kind: FrameKind, payload: &[u8]) {
    buf.push(kind as u8);
    buf.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    buf.extend_from_slice(payload);
}

pub async fn write_json<W: AsyncWrite + Unpin, T: Serialize>(
    w: &mut W,
    msg: &T,
) -> Result<(), ProtoError> {
    let bytes = serde_json::to_vec(msg)?;
    write_frame(w, FrameKind::Json, &bytes).await?;
    w.flush().await?;
    Ok(())
}

/// Reads one frame; `Ok(None)` at a clean end of stream.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
) -> Result<Option<(FrameKind, Vec<u8>)>, ProtoError> {
    let mut head = [0u8; 5];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let kind = FrameKind::from_u8(head[0]).ok_or(ProtoError::BadKind(head[0]))?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > MAX_FRAME {
        return Err(ProtoError::TooLarge(len));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).await?;
    Ok(Some((kind, buf)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A terminal request of an older node (no `report_problems`) still opens a terminal, with
    /// no problem frames sent to it (it would take one for the end); a newer node asks for them.
    #[test]
    fn a_terminal_request_without_report_problems_is_read_as_false() {
        let mut v = serde_json::to_value(Request::Pty {
            spec: ExecSpec::default(),
            cols: 80,
            rows: 24,
            report_problems: true,
        })
        .unwrap();
        assert_eq!(v["report_problems"], true);
        v.as_object_mut().unwrap().remove("report_problems");
        match serde_json::from_value::<Request>(v).unwrap() {
            Request::Pty {
                cols: 80,
                rows: 24,
                report_problems,
                ..
            } => assert!(!report_problems),
            other => panic!("read as {other:?}"),
        }
    }

    #[tokio::test]
    async fn frames_round_trip() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        write_json(&mut a, &Request::Ping).await.unwrap();
        write_frame(&mut a, FrameKind::Stdout, b"\xff\x00bytes")
            .await
            .unwrap();
        drop(a);
        let (k, p) = read_frame(&mut b).await.unwrap().unwrap();
        assert_eq!(k, FrameKind::Json);
        assert!(matches!(
            serde_json::from_slice::<Request>(&p).unwrap(),
            Request::Ping
        ));
        let (k, p) = read_frame(&mut b).await.unwrap().unwrap();
        assert_eq!(
            (k, p.as_slice()),
            (FrameKind::Stdout, &b"\xff\x00bytes"[..])
        );
        assert!(read_frame(&mut b).await.unwrap().is_none());
    }

    #[test]
    fn file_answers_round_trip() {
        let info = FileInfo {
            name: "a".into(),
            path: "/a".into(),
            kind: "file".into(),
            size: 1,
            mode: 0o644,
            modified: 0,
            uid: 0,
            gid: 0,
            target: None,
        };
        for r in [
            Response::Stat(info.clone()),
            Response::Entries {
                entries: vec![info],
                truncated: false,
            },
        ] {
            let back: Response = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
            assert_eq!(back, r);
        }
    }

    #[tokio::test]
    async fn oversized_and_unknown_frames_are_refused() {
        let (mut a, mut b) = tokio::io::duplex(64);
        tokio::spawn(async move {
            a.write_all(&[9, 0, 0, 0, 0]).await.unwrap();
        });
        assert!(matches!(
            read_frame(&mut b).await,
            Err(ProtoError::BadKind(9))
        ));
        let (mut a, mut b) = tokio::io::duplex(64);
        tokio::spawn(async move {
            a.write_all(&[1, 0xff, 0xff, 0xff, 0xff]).await.unwrap();
        });
        assert!(matches!(
            read_frame(&mut b).await,
            Err(ProtoError::TooLarge(_))
        ));
    }
}
