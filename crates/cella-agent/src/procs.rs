//! Background processes: started by `Spawn`, they belong to the agent, not to a connection.
//! Each keeps its last output in a bounded ring buffer that followers replay, and stays listed
//! after it exits (the most recent [`KEEP_EXITED`]) so that its exit code can be read.
//!
//! A process starts with the same `Jail` as an exec, keeps stdin open, and pumps output into its
//! ring buffer ([`RING_BYTES`]) and a broadcast channel; `Follow` replays the ring (or not) and
//! streams frames until `Exit`, which the server sends on as server-sent events.

use crate::harden::Jail;
use crate::proto::{
    self, ErrorKind, ExecSpec, ExitInfo, FrameKind, ProcessInfo, ProtoError, Response,
};
use crate::spawn::{cwd_problem, spawn_failure, start, Reaper};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::net::UnixStream;
use tokio::sync::broadcast;

/// Output bytes kept per process.
pub const RING_BYTES: usize = 1 << 20;
/// Exited processes kept in the list.
pub const KEEP_EXITED: usize = 64;

#[derive(Clone, Debug)]
enum Event {
    Output(FrameKind, Arc<Vec<u8>>),
    Exit(ExitInfo),
}

struct Proc {
    info: ProcessInfo,
    ring: VecDeque<(FrameKind, Arc<Vec<u8>>)>,
    ring_bytes: usize,
    stdin: Arc<tokio::sync::Mutex<Option<pipe::Sender>>>,
    events: broadcast::Sender<Event>,
    exit: Option<ExitInfo>,
}

#[derive(Default)]
pub struct Procs {
    map: Mutex<HashMap<i32, Proc>>,
    exited: Mutex<VecDeque<i32>>,
    /// Unix ms of the last output of any spawned process (0: none yet).
    last_output: AtomicI64,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn not_found(pid: i32) -> Response {
    Response::Error {
        kind: ErrorKind::NotFound,
        message: format!("no process {pid} was started through the API"),
    }
}

impl Procs {
    fn push_output(&self, pid: i32, kind: FrameKind, data: Vec<u8>) {
        self.last_output.store(now_ms(), Ordering::Relaxed);
        let mut map = self.map.lock().expect("procs lock");
        let Some(p) = map.get_mut(&pid) else { return };
        let data = Arc::new(data);
        p.ring_bytes += data.len();
        p.ring.push_back((kind, data.clone()));
        while p.ring_bytes > RING_BYTES {
            match p.ring.pop_front() {
                Some((_, old)) => {
                    p.ring_bytes -= old.len();
                    p.info.dropped_bytes += old.len() as u64;
                }
                None => break,
            }
        }
        let _ = p.events.send(Event::Output(kind, data));
    }

    fn finish(&self, pid: i32, exit: ExitInfo) {
        let mut map = self.map.lock().expect("procs lock");
        if let Some(p) = map.get_mut(&pid) {
            p.info.running = false;
            p.info.exit_code = Some(exit.exit_code);
            p.info.ended_at = Some(now_ms());
            p.exit = Some(exit.clone());
            let _ = p.events.send(Event::Exit(exit));
        }
        let mut exited = self.exited.lock().expect("procs lock");
        exited.push_back(pid);
        while exited.len() > KEEP_EXITED {
            if let Some(old) = exited.pop_front() {
                if map.get(&old).is_some_and(|p| !p.info.running) {
                    map.remove(&old);
                }
            }
        }
    }

    pub fn list(&self) -> Response {
        let map = self.map.lock().expect("procs lock");
        let mut processes: Vec<ProcessInfo> = map.values().map(|p| p.info.clone()).collect();
        processes.sort_by_key(|p| p.started_at);
        Response::Processes { processes }
    }

    pub fn get(&self, pid: i32) -> Response {
        match self.map.lock().expect("procs lock").get(&pid) {
            Some(p) => Response::Process(p.info.clone()),
            None => not_found(pid),
        }
    }

    pub fn activity(&self) -> Response {
        let last = self.last_output.load(Ordering::Relaxed);
        Response::Activity {
            idle_ms: (last > 0).then(|| (now_ms() - last).max(0) as u64),
        }
    }

    pub fn signal(&self, pid: i32, signal: i32) -> Response {
        let map = self.map.lock().expect("procs lock");
        let Some(p) = map.get(&pid) else {
            return not_found(pid);
        };
        if !p.info.running {
            return Response::Error {
                kind: ErrorKind::Conflict,
                message: format!("process {pid} has exited"),
            };
        }
        let Ok(sig) = nix::sys::signal::Signal::try_from(signal) else {
            return Response::Error {
                kind: ErrorKind::BadRequest,
                message: format!("unknown signal {signal}"),
            };
        };
        match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig) {
            Ok(()) => Response::Process(p.info.clone()),
            // It exited a moment ago and is not reaped (recorded) yet.
            Err(nix::errno::Errno::ESRCH) => Response::Error {
                kind: ErrorKind::Conflict,
                message: format!("process {pid} has exited"),
            },
            Err(e) => Response::Error {
                kind: ErrorKind::Internal,
                message: format!("signal {pid}: {e}"),
            },
        }
    }

    pub async fn stdin(&self, pid: i32, data: Vec<u8>, close: bool) -> Response {
        let handle = {
            let map = self.map.lock().expect("procs lock");
            match map.get(&pid) {
                Some(p) if p.info.running => p.stdin.clone(),
                Some(_) => {
                    return Response::Error {
                        kind: ErrorKind::Conflict,
                        message: format!("process {pid} has exited"),
                    }
                }
                None => return not_found(pid),
            }
        };
        let mut guard = handle.lock().await;
        let Some(tx) = guard.as_mut() else {
            return Response::Error {
                kind: ErrorKind::Conflict,
                message: format!("standard input of {pid} is closed"),
            };
        };
        if let Err(e) = tx.write_all(&data).await {
            return Response::Error {
                kind: ErrorKind::Conflict,
                message: format!("standard input of {pid}: {e}"),
            };
        }
        if close {
            *guard = None;
        }
        Response::Done {
            bytes: data.len() as u64,
        }
    }

    /// Starts a background process and answers its pid.
    pub fn spawn(
        self: &Arc<Self>,
        spec: ExecSpec,
        tag: Option<String>,
        reaper: &Arc<Reaper>,
        jail: &Arc<Jail>,
    ) -> Response {
        if spec.argv.is_empty() {
            return Response::Error {
                kind: ErrorKind::BadRequest,
                message: "argv is empty".into(),
            };
        }
        if let Some(problem) = cwd_problem(&spec.cwd, spec.uid, spec.gid) {
            return Response::Error {
                kind: ErrorKind::BadCwd,
                message: problem,
            };
        }
        let child = match start(&spec, jail, true, false, None, reaper) {
            Ok(c) => c,
            Err(e) => {
                let (_, msg) = spawn_failure(&spec.argv[0], &e);
                return Response::Error {
                    kind: ErrorKind::BadRequest,
                    message: msg.trim().to_string(),
                };
            }
        };
        let started = Instant::now();
        let pid = child.pid;
        let exit_rx = child.exit;
        let stdin = child
            .stdin
            .and_then(|s| pipe::Sender::from_owned_fd(s).ok());
        let out = pipe::Receiver::from_owned_fd(child.stdout).ok();
        let err = pipe::Receiver::from_owned_fd(child.stderr).ok();
        let (events, _) = broadcast::channel(1024);
        let info = ProcessInfo {
            pid,
            argv: spec.argv.clone(),
            tag,
            uid: spec.uid,
            cwd: spec.cwd.clone(),
            started_at: now_ms(),
            running: true,
            exit_code: None,
            ended_at: None,
            dropped_bytes: 0,
        };
        let entry = Proc {
            info,
            ring: VecDeque::new(),
            ring_bytes: 0,
            stdin: Arc::new(tokio::sync::Mutex::new(stdin)),
            events,
            exit: None,
        };
        self.map.lock().expect("procs lock").insert(pid, entry);
        let mut pumps = Vec::new();
        for (kind, rx) in [(FrameKind::Stdout, out), (FrameKind::Stderr, err)] {
            let Some(mut rx) = rx else { continue };
            let procs = self.clone();
            pumps.push(tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = rx.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    procs.push_output(pid, kind, buf[..n].to_vec());
                }
            }));
        }
        let procs = self.clone();
        tokio::spawn(async move {
            let code = exit_rx.await.unwrap_or(255);
            // Output still in the pipes comes first; children that keep them open do not hold
            // the exit back for long.
            for p in pumps {
                let _ = tokio::time::timeout(Duration::from_millis(100), p).await;
            }
            let exit = ExitInfo {
                exit_code: code,
                timed_out: false,
                duration_ms: started.elapsed().as_millis() as u64,
                stdout_truncated: false,
                stderr_truncated: false,
            };
            procs.finish(pid, exit);
        });
        Response::Started { pid }
    }

    /// Streams a process's output to `stream` until it exits or the follower leaves.
    pub async fn follow(
        &self,
        stream: &mut UnixStream,
        pid: i32,
        from_start: bool,
    ) -> Result<(), ProtoError> {
        let found = {
            let map = self.map.lock().expect("procs lock");
            map.get(&pid).map(|p| {
                let backlog: Vec<_> = if from_start {
                    p.ring.iter().cloned().collect()
                } else {
                    Vec::new()
                };
                (backlog, p.exit.clone(), p.events.subscribe())
            })
        };
        let Some((backlog, exit, mut rx)) = found else {
            return proto::write_json(stream, &not_found(pid)).await;
        };
        proto::write_json(stream, &Response::Started { pid }).await?;
        for (kind, data) in backlog {
            proto::write_frame(stream, kind, &data).await?;
        }
        if let Some(exit) = exit {
            return proto::write_json(stream, &Response::Exit(exit)).await;
        }
        let mut probe = [0u8; 16];
        loop {
            tokio::select! {
                ev = rx.recv() => match ev {
                    Ok(Event::Output(kind, data)) => proto::write_frame(stream, kind, &data).await?,
                    Ok(Event::Exit(exit)) => return proto::write_json(stream, &Response::Exit(exit)).await,
                    // A follower too slow for the output skips what it missed.
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return Ok(()),
                },
                r = stream.read(&mut probe) => {
                    if matches!(r, Ok(0) | Err(_)) {
                        return Ok(()); // the follower left; the process carries on
                    }
                }
            }
        }
    }
}
