//! The agent's side: PID 1 of a sandbox.

use crate::execcg::ExecCgroups;
use crate::files;
use crate::harden::Jail;
use crate::procs::Procs;
use crate::proto::{self, ErrorKind, ExecSpec, ExitInfo, FrameKind, Request, Response};
use crate::pty;
use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::net::UnixStream;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::oneshot;

/// How long an exec waits, after its command exited, for output still buffered in its pipes.
/// Background children that keep the pipes open do not hold the answer longer than this.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Default)]
pub struct AgentConfig {
    /// `RLIMIT_NOFILE` of every process the agent starts (0: the agent's own).
    pub nofile: u64,
    /// The sandbox's cgroup, delegated for a cgroup per exec (see [`crate::execcg`]); None:
    /// timeouts kill by process tree.
    pub exec_cgroups: Option<Arc<ExecCgroups>>,
}

/// Runs the agent on an already bound listener; never returns.
pub fn serve(listener: std::os::unix::net::UnixListener, config: AgentConfig) -> ! {
    // The agent must be the last thing the OOM killer picks inside its sandbox.
    let _ = std::fs::write("/proc/self/oom_score_adj", "-1000");
    // The agent itself may use all the descriptors it is allowed (its commands get fewer).
    // SAFETY: plain system calls on this process.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cella-agent: cannot start runtime: {e}");
            std::process::exit(1)
        }
    };
    if let Err(e) = rt.block_on(run(listener, config)) {
        eprintln!("cella-agent: {e}");
    }
    std::process::exit(1)
}

/// Collects exit statuses of every child, ours and orphans alike, as an init must.
#[derive(Default)]
pub(crate) struct Reaper {
    waiters: Mutex<HashMap<i32, oneshot::Sender<i32>>>,
}

impl Reaper {
    pub(crate) fn register(&self, pid: i32) -> oneshot::Receiver<i32> {
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().expect("reaper lock").insert(pid, tx);
        rx
    }

    fn reap(&self) {
        loop {
            let (pid, code) = match waitpid(
                Pid::from_raw(-1),
                Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL),
            ) {
                Ok(WaitStatus::Exited(pid, code)) => (pid, code),
                Ok(WaitStatus::Signaled(pid, sig, _)) => (pid, 128 + sig as i32),
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(_) => continue,
            };
            if let Some(tx) = self
                .waiters
                .lock()
                .expect("reaper lock")
                .remove(&pid.as_raw())
            {
                let _ = tx.send(code);
            }
        }
    }
}

async fn run(
    listener: std::os::unix::net::UnixListener,
    config: AgentConfig,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::UnixListener::from_std(listener)?;
    let reaper = Arc::new(Reaper::default());
    let jail = Arc::new(
        Jail::new()
            .map_err(std::io::Error::other)?
            .with_nofile(config.nofile),
    );
    let procs = Arc::new(Procs::default());
    let kernels = Arc::new(crate::kernel::Kernels::new());
    let file_ops = Arc::new(tokio::sync::Semaphore::new(files::MAX_FILE_OPS));
    let mut sigchld = signal(SignalKind::child())?;
    let r = reaper.clone();
    tokio::spawn(async move {
        loop {
            r.reap();
            if sigchld.recv().await.is_none() {
                return;
            }
        }
    });
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(handle(
            stream,
            reaper.clone(),
            jail.clone(),
            procs.clone(),
            kernels.clone(),
            file_ops.clone(),
            config.exec_cgroups.clone(),
        ));
    }
}

/// Requests that ran or changed anything since the agent started (see [`Request::touches`]);
/// a request that does not parse counts too.
static TOUCHED: AtomicU64 = AtomicU64::new(0);
/// [`TOUCHED`] at the last `Seal`; `u64::MAX`: never sealed.
static SEALED_AT: AtomicU64 = AtomicU64::new(u64::MAX);

fn pong() -> Response {
    let sealed = SEALED_AT.load(Ordering::SeqCst);
    Response::Pong {
        version: proto::PROTOCOL_VERSION,
        touched: (sealed != u64::MAX)
            .then(|| TOUCHED.load(Ordering::SeqCst).saturating_sub(sealed)),
    }
}

async fn handle(
    mut stream: UnixStream,
    reaper: Arc<Reaper>,
    jail: Arc<Jail>,
    procs: Arc<Procs>,
    kernels: Arc<crate::kernel::Kernels>,
    file_ops: Arc<tokio::sync::Semaphore>,
    cgroups: Option<Arc<ExecCgroups>>,
) {
    let req = match proto::read_frame(&mut stream).await {
        Ok(Some((FrameKind::Json, body))) => serde_json::from_slice::<Request>(&body),
        _ => return,
    };
    if req.as_ref().map_or(true, Request::touches) {
        TOUCHED.fetch_add(1, Ordering::SeqCst);
    }
    // File operations hold a slot of the blocking pool each: a bounded number runs at once, so
    // that operations a client abandoned can never starve the others.
    let _slot = match &req {
        Ok(
            Request::Stat { .. }
            | Request::List { .. }
            | Request::Mkdir { .. }
            | Request::Move { .. }
            | Request::Remove { .. }
            | Request::Read { .. }
            | Request::Write { .. },
        ) => match file_ops.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                let msg = Response::Error {
                    kind: ErrorKind::Busy,
                    message: format!(
                        "{} file operations are already in progress in this sandbox; retry later",
                        files::MAX_FILE_OPS
                    ),
                };
                let _ = proto::write_json(&mut stream, &msg).await;
                return;
            }
        },
        _ => None,
    };
    let result = match req {
        Ok(Request::Ping) => proto::write_json(&mut stream, &pong()).await,
        Ok(Request::Seal) => {
            SEALED_AT.store(TOUCHED.load(Ordering::SeqCst), Ordering::SeqCst);
            proto::write_json(&mut stream, &pong()).await
        }
        Ok(Request::Exec(spec)) => exec(stream, spec, reaper, jail, cgroups).await,
        Ok(Request::Spawn { spec, tag }) => {
            proto::write_json(&mut stream, &procs.spawn(spec, tag, &reaper, &jail)).await
        }
        Ok(Request::Processes) => proto::write_json(&mut stream, &procs.list()).await,
        Ok(Request::Process { pid }) => proto::write_json(&mut stream, &procs.get(pid)).await,
        Ok(Request::Signal { pid, signal }) => {
            proto::write_json(&mut stream, &procs.signal(pid, signal)).await
        }
        Ok(Request::Stdin { pid, data, close }) => {
            proto::write_json(&mut stream, &procs.stdin(pid, data, close).await).await
        }
        Ok(Request::Follow { pid, from_start }) => procs.follow(&mut stream, pid, from_start).await,
        Ok(Request::Code {
            language,
            action,
            spec,
        }) => {
            let answer = kernels.call(language, action, spec, jail).await;
            proto::write_json(&mut stream, &answer).await
        }
        Ok(Request::Connect { port }) => {
            match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                Ok(mut tcp) => match proto::write_json(&mut stream, &Response::Connected).await {
                    Ok(()) => tokio::io::copy_bidirectional(&mut stream, &mut tcp)
                        .await
                        .map(|_| ())
                        .map_err(proto::ProtoError::from),
                    Err(e) => Err(e),
                },
                Err(e) => {
                    let msg = Response::Error {
                        kind: ErrorKind::NotFound,
                        message: format!("nothing accepts connections on port {port}: {e}"),
                    };
                    proto::write_json(&mut stream, &msg).await
                }
            }
        }
        Ok(Request::Activity) => proto::write_json(&mut stream, &procs.activity()).await,
        Ok(Request::Watch { path, recursive }) => {
            crate::watch::watch(&mut stream, path, recursive).await
        }
        Ok(Request::Pty { spec, cols, rows }) => {
            pty::run(stream, spec, cols, rows, reaper, jail).await
        }
        Ok(Request::Stat { path }) => {
            proto::write_json(&mut stream, &files::stat(path).await).await
        }
        Ok(Request::List {
            path,
            recursive,
            limit,
        }) => proto::write_json(&mut stream, &files::list(path, recursive, limit).await).await,
        Ok(Request::Mkdir { path, uid, gid }) => {
            proto::write_json(&mut stream, &files::mkdir(path, uid, gid).await).await
        }
        Ok(Request::Move { from, to }) => {
            proto::write_json(&mut stream, &files::rename(from, to).await).await
        }
        Ok(Request::Remove { path, recursive }) => {
            proto::write_json(&mut stream, &files::remove(path, recursive).await).await
        }
        Ok(Request::Read {
            path,
            offset,
            length,
            nofollow,
        }) => files::read(&mut stream, path, offset, length, nofollow).await,
        Ok(Request::Write {
            path,
            uid,
            gid,
            mode,
            max_bytes,
        }) => files::write(&mut stream, path, uid, gid, mode, max_bytes).await,
        Err(e) => {
            let msg = Response::Error {
                kind: ErrorKind::BadRequest,
                message: e.to_string(),
            };
            proto::write_json(&mut stream, &msg).await
        }
    };
    if let Err(e) = result {
        tracing::debug!("agent connection ended: {e}");
    }
}

pub(crate) fn spawn_failure(argv0: &str, err: &std::io::Error) -> (i32, String) {
    match err.kind() {
        std::io::ErrorKind::NotFound => (127, format!("cella: {argv0}: command not found\n")),
        std::io::ErrorKind::PermissionDenied => {
            (126, format!("cella: {argv0}: permission denied\n"))
        }
        _ => (126, format!("cella: {argv0}: cannot run: {err}\n")),
    }
}

/// The command for `spec`, confined by `jail`, in a session of its own, with piped output.
///
/// With `join_cgroup` (the `cgroup.procs` of an exec's cgroup, see [`crate::execcg`]) the
/// command joins that cgroup before it runs anything, so all it starts can be killed at once.
///
/// With `hold_tree` (an exec, whose timeout must kill all it started), the command is made a
/// child subreaper (`PR_SET_CHILD_SUBREAPER`, kept across `execve`): a descendant orphaned
/// while the command runs (`(setsid sleep 300 &)` forks and its parent exits) is re-parented
/// to the command instead of to the agent, so the whole tree stays reachable through parent
/// links, whatever sessions and process groups it made, until the command itself ends; then
/// what is left is re-parented to the agent and keeps running.
pub(crate) fn command(
    spec: &ExecSpec,
    jail: &Arc<Jail>,
    pipe_stdin: bool,
    hold_tree: bool,
    join_cgroup: Option<std::os::fd::RawFd>,
) -> std::process::Command {
    // Images without bash (Alpine, distroless with a shell) still run shell command lines.
    let program = if spec.argv[0] == "/bin/bash" && !std::path::Path::new("/bin/bash").exists() {
        "/bin/sh"
    } else {
        spec.argv[0].as_str()
    };
    let mut cmd = std::process::Command::new(program);
    cmd.args(&spec.argv[1..])
        .env_clear()
        .envs(&spec.env)
        .current_dir(&spec.cwd)
        .stdin(if pipe_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (uid, gid) = (spec.uid, spec.gid);
    let jail = jail.clone();
    // SAFETY: between fork and exec the child makes only system calls (`Jail::enter` was
    // prepared before the fork and allocates nothing).
    unsafe {
        cmd.pre_exec(move || {
            // Into the exec's cgroup first, while still the sandbox's root (the group's
            // `cgroup.procs` was opened by the agent; the kernel lets a process move itself).
            if let Some(fd) = join_cgroup {
                libc::write(fd, b"0".as_ptr().cast(), 1);
            }
            // Own session and process group: the whole tree can be killed at a timeout.
            libc::setsid();
            if hold_tree {
                libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
            }
            // Children must not inherit the agent's immunity to the OOM killer.
            let fd = libc::open(c"/proc/self/oom_score_adj".as_ptr(), libc::O_WRONLY);
            if fd >= 0 {
                libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
            }
            jail.enter(uid, gid)
        });
    }
    cmd
}

/// Why `uid`/`gid` cannot work in `cwd`, if they cannot: it must be a directory that every
/// component of the path lets them search.
pub(crate) fn cwd_problem(cwd: &str, uid: u32, gid: u32) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let path = std::path::Path::new(cwd);
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Some(format!("working directory {cwd} is not a directory")),
        Err(_) => return Some(format!("working directory {cwd} does not exist")),
    }
    if uid == 0 {
        return None;
    }
    for dir in path.ancestors() {
        let Ok(m) = std::fs::metadata(dir) else {
            continue;
        };
        let bit = if m.uid() == uid {
            0o100
        } else if m.gid() == gid {
            0o010
        } else {
            0o001
        };
        if m.mode() & bit == 0 {
            return Some(format!(
                "working directory {cwd} is not accessible to this user ({} is not searchable)",
                dir.display()
            ));
        }
    }
    None
}

/// Kills a command and everything it started: its process group, every process in its session,
/// and every descendant (found through parent links, which also catches children that made a
/// session of their own). The tree is stopped first and scanned again until it stops growing, so
/// nothing forks away or is re-parented to PID 1 between the scan and the kill. A command made
/// with `hold_tree` (see [`command`]) is a subreaper: while it lives (stopped, here), orphans of
/// its tree are its children, so parent links reach every process it started.
pub(crate) fn kill_tree(pid: i32) {
    let mut doomed: Vec<i32> = vec![pid];
    let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
    for _ in 0..20 {
        let procs = process_table();
        let before = doomed.len();
        let mut i = 0;
        while i < doomed.len() {
            let parent = doomed[i];
            for p in &procs {
                if p.ppid == parent && !doomed.contains(&p.pid) {
                    doomed.push(p.pid);
                }
            }
            i += 1;
        }
        for p in &procs {
            if (p.sid == pid || p.pgid == pid) && !doomed.contains(&p.pid) {
                doomed.push(p.pid);
            }
        }
        for p in &doomed[before..] {
            if *p != 1 {
                let _ = kill(Pid::from_raw(*p), Signal::SIGSTOP);
            }
        }
        if doomed.len() == before {
            break;
        }
    }
    for p in doomed {
        if p != 1 {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
    }
    let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
}

struct ProcInfo {
    pid: i32,
    ppid: i32,
    pgid: i32,
    sid: i32,
}

fn process_table() -> Vec<ProcInfo> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // Fields after the command name, which is in parentheses and may contain anything:
            // state ppid pgrp session ...
            let rest = &stat[stat.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split(' ').collect();
            Some(ProcInfo {
                pid,
                ppid: f.get(1)?.parse().ok()?,
                pgid: f.get(2)?.parse().ok()?,
                sid: f.get(3)?.parse().ok()?,
            })
        })
        .collect()
}

/// Forwards output up to the cap; returns false when the node has gone away.
async fn forward(
    wr: &mut tokio::net::unix::OwnedWriteHalf,
    kind: FrameKind,
    data: &[u8],
    sent: &mut u64,
    cap: Option<u64>,
    truncated: &mut bool,
) -> bool {
    let room = cap.map(|c| c.saturating_sub(*sent)).unwrap_or(u64::MAX);
    let take = (data.len() as u64).min(room) as usize;
    if take < data.len() {
        *truncated = true;
    }
    *sent += take as u64;
    if take == 0 {
        return true;
    }
    proto::write_frame(wr, kind, &data[..take]).await.is_ok()
}

async fn exec(
    stream: UnixStream,
    spec: ExecSpec,
    reaper: Arc<Reaper>,
    jail: Arc<Jail>,
    cgroups: Option<Arc<ExecCgroups>>,
) -> Result<(), proto::ProtoError> {
    let (mut rd, mut wr) = stream.into_split();
    if spec.argv.is_empty() {
        let msg = Response::Error {
            kind: ErrorKind::BadRequest,
            message: "argv is empty".into(),
        };
        return proto::write_json(&mut wr, &msg).await;
    }
    if let Some(problem) = cwd_problem(&spec.cwd, spec.uid, spec.gid) {
        let msg = Response::Error {
            kind: ErrorKind::BadCwd,
            message: problem,
        };
        return proto::write_json(&mut wr, &msg).await;
    }
    let started = Instant::now();
    // Everything the command starts is in its own cgroup, killed as one at a timeout.
    let group = cgroups.as_deref().and_then(ExecCgroups::group);
    let kill_all = |pid: i32| match &group {
        Some(g) => g.kill(),
        None => kill_tree(pid),
    };
    let mut cmd = command(
        &spec,
        &jail,
        spec.stdin.is_some(),
        true,
        group.as_ref().map(|g| g.procs_fd()),
    );
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let (code, msg) = spawn_failure(&spec.argv[0], &e);
            let mut sent = 0;
            let mut trunc = false;
            forward(
                &mut wr,
                FrameKind::Stderr,
                msg.as_bytes(),
                &mut sent,
                spec.output_cap,
                &mut trunc,
            )
            .await;
            let exit = ExitInfo {
                exit_code: code,
                timed_out: false,
                duration_ms: started.elapsed().as_millis() as u64,
                stdout_truncated: false,
                stderr_truncated: trunc,
            };
            return proto::write_json(&mut wr, &Response::Exit(exit)).await;
        }
    };
    let pid = child.id() as i32;
    let mut exit_rx = reaper.register(pid);
    proto::write_json(&mut wr, &Response::Started { pid }).await?;

    if let (Some(input), Some(stdin)) = (spec.stdin.clone(), child.stdin.take()) {
        let fd: OwnedFd = stdin.into();
        if let Ok(mut tx) = pipe::Sender::from_owned_fd(fd) {
            tokio::spawn(async move {
                let _ = tx.write_all(&input).await;
            });
        }
    }
    let mut out = child
        .stdout
        .take()
        .map(|s| pipe::Receiver::from_owned_fd(s.into()))
        .transpose()?;
    let mut err = child
        .stderr
        .take()
        .map(|s| pipe::Receiver::from_owned_fd(s.into()))
        .transpose()?;
    drop(child);

    let deadline = tokio::time::sleep(Duration::from_millis(spec.timeout_ms.max(1)));
    tokio::pin!(deadline);
    let drain = tokio::time::sleep(Duration::from_secs(86400 * 365));
    tokio::pin!(drain);
    let (mut obuf, mut ebuf) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    let (mut osent, mut esent, mut otrunc, mut etrunc) = (0u64, 0u64, false, false);
    let mut status: Option<i32> = None;
    let mut timed_out = false;
    let mut ctl = [0u8; 64];
    loop {
        if status.is_some() && out.is_none() && err.is_none() {
            break;
        }
        tokio::select! {
            n = async { out.as_mut().expect("guarded").read(&mut obuf).await }, if out.is_some() => match n {
                Ok(n) if n > 0 => {
                    if !forward(&mut wr, FrameKind::Stdout, &obuf[..n], &mut osent, spec.output_cap, &mut otrunc).await {
                        kill_all(pid);
                        return Ok(());
                    }
                }
                _ => out = None,
            },
            n = async { err.as_mut().expect("guarded").read(&mut ebuf).await }, if err.is_some() => match n {
                Ok(n) if n > 0 => {
                    if !forward(&mut wr, FrameKind::Stderr, &ebuf[..n], &mut esent, spec.output_cap, &mut etrunc).await {
                        kill_all(pid);
                        return Ok(());
                    }
                }
                _ => err = None,
            },
            code = &mut exit_rx, if status.is_none() => {
                status = Some(code.unwrap_or(255));
                drain.as_mut().reset(tokio::time::Instant::now() + DRAIN_AFTER_EXIT);
            },
            _ = &mut deadline, if status.is_none() && !timed_out => {
                timed_out = true;
                kill_all(pid);
            },
            _ = &mut drain, if status.is_some() => break,
            r = rd.read(&mut ctl) => {
                // The node sends nothing more; a read that returns means it hung up.
                if matches!(r, Ok(0) | Err(_)) {
                    kill_all(pid);
                    return Ok(());
                }
            }
        }
    }
    let exit = ExitInfo {
        exit_code: status.unwrap_or(255),
        timed_out,
        duration_ms: started.elapsed().as_millis() as u64,
        stdout_truncated: otrunc,
        stderr_truncated: etrunc,
    };
    proto::write_json(&mut wr, &Response::Exit(exit)).await
}
