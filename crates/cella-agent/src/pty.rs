//! Terminals: a program on a new pseudo-terminal, relayed over the agent connection.

use crate::harden::Jail;
use crate::proto::{
    self, ErrorKind, ExecSpec, ExitInfo, FrameKind, ProtoError, PtyControl, Response,
};
use crate::spawn::{cwd_problem, kill_tree, spawn_failure, Reaper};
use nix::pty::{openpty, Winsize};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::net::UnixStream;

/// The terminal's size as (cols, rows); None if it cannot be read.
fn size_of(fd: &OwnedFd) -> Option<(u16, u16)> {
    let mut ws = Winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ into a winsize we own, on a terminal we own.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
    (rc == 0).then_some((ws.ws_col, ws.ws_row))
}

/// Sets the terminal's size and reads it back (a second try if it read otherwise); whether it
/// changed, or what went wrong (for the node's log: nothing else would show a resize that did
/// not take).
fn set_size(fd: &OwnedFd, cols: u16, rows: u16) -> Result<bool, String> {
    let before = size_of(fd);
    let ws = Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let mut read = None;
    for _ in 0..2 {
        // SAFETY: TIOCSWINSZ with a valid winsize on a terminal we own.
        if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &ws) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(format!("resizing the terminal to {cols}x{rows}: {e}"));
        }
        read = size_of(fd);
        if read == Some((cols, rows)) {
            return Ok(before != read);
        }
    }
    Err(format!(
        "the terminal read {read:?} after a resize to {cols}x{rows}"
    ))
}

/// Sends `SIGWINCH` to every process group of the terminal's session (its leader `session`),
/// where the kernel does not ([`crate::AgentConfig::signal_resize`]). Linux signals only the
/// foreground group, but gVisor refuses `TIOCGPGRP` on the master to a process outside the
/// session and shows no `tpgid` in `/proc`, so the agent cannot tell which group that is; a
/// background job that did not ask for the signal ignores it (its default action). Only groups
/// of that session: a process can join a group of its own session only.
fn signal_resize(session: i32) {
    // SAFETY: getpgrp has no preconditions.
    let own = unsafe { libc::getpgrp() };
    let mut groups: Vec<i32> = crate::spawn::process_table()
        .iter()
        .filter(|p| p.sid == session && p.pgid > 1 && p.pgid != own)
        .map(|p| p.pgid)
        .collect();
    groups.sort_unstable();
    groups.dedup();
    for g in groups {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(g),
            nix::sys::signal::Signal::SIGWINCH,
        );
    }
}

/// The `SIGWINCH`es of one terminal ([`signal_resize`]): at most one scan of `/proc` runs and
/// one waits, however fast resizes come, and none starts once the session is over (its
/// leader's pid may then be another's).
#[derive(Default)]
struct Winches {
    /// A scan is asked for and has not started yet.
    pending: std::sync::atomic::AtomicBool,
    /// The scan running (its task), so that the next waits for it.
    running: std::sync::Mutex<()>,
    ended: std::sync::atomic::AtomicBool,
}

impl Winches {
    fn ask(self: &Arc<Self>, session: i32) {
        use std::sync::atomic::Ordering;
        if self.pending.swap(true, Ordering::SeqCst) {
            return; // the waiting scan will see this resize too
        }
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let _one = this.running.lock();
            this.pending.store(false, Ordering::SeqCst);
            if !this.ended.load(Ordering::SeqCst) {
                signal_resize(session);
            }
        });
    }
}

/// Marks a terminal's [`Winches`] over when dropped (however its session ends).
struct Ended(Arc<Winches>);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0
            .ended
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// How a terminal is opened ([`proto::Request::Pty`] and the agent's configuration).
pub struct Options {
    /// (cols, rows) at the start.
    pub size: (u16, u16),
    /// [`proto::Request::Pty`]'s `report_problems`.
    pub report_problems: bool,
    /// [`crate::AgentConfig::signal_resize`].
    pub signal_resize: bool,
}

/// The most problems one terminal reports to the node (each is a line in its log).
const MAX_PROBLEMS: usize = 8;

fn set_nonblocking(fd: &OwnedFd) -> std::io::Result<()> {
    let flags = nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFL)?;
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(flags))?;
    Ok(())
}

async fn read_master(master: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        let mut guard = master.readable().await?;
        match guard
            .try_io(|fd| nix::unistd::read(fd.as_raw_fd(), buf).map_err(std::io::Error::from))
        {
            Ok(r) => return r,
            Err(_would_block) => continue,
        }
    }
}

async fn write_master(master: &AsyncFd<OwnedFd>, mut data: &[u8]) -> std::io::Result<()> {
    while !data.is_empty() {
        let mut guard = master.writable().await?;
        match guard
            .try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(std::io::Error::from))
        {
            Ok(Ok(n)) => data = &data[n..],
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
    Ok(())
}

pub async fn run(
    stream: UnixStream,
    spec: ExecSpec,
    opts: Options,
    reaper: Arc<Reaper>,
    jail: Arc<Jail>,
) -> Result<(), ProtoError> {
    let (mut rd, mut wr) = stream.into_split();
    let (cols, rows) = opts.size;
    let refuse = |kind, message: String| Response::Error { kind, message };
    if spec.argv.is_empty() {
        return proto::write_json(
            &mut wr,
            &refuse(ErrorKind::BadRequest, "argv is empty".into()),
        )
        .await;
    }
    if let Some(problem) = cwd_problem(&spec.cwd, spec.uid, spec.gid) {
        return proto::write_json(&mut wr, &refuse(ErrorKind::BadCwd, problem)).await;
    }
    let ws = Winsize {
        ws_row: rows.max(1),
        ws_col: cols.max(1),
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = openpty(Some(&ws), None).map_err(std::io::Error::from)?;
    let (master, slave) = (pty.master, pty.slave);
    // No other command the agent starts may inherit this terminal.
    for fd in [&master, &slave] {
        nix::fcntl::fcntl(
            fd.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .map_err(std::io::Error::from)?;
    }
    let mut cmd = std::process::Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..])
        .env_clear()
        .envs(&spec.env)
        .current_dir(&spec.cwd)
        .stdin(Stdio::from(slave.try_clone()?))
        .stdout(Stdio::from(slave.try_clone()?))
        .stderr(Stdio::from(slave));
    let (uid, gid) = (spec.uid, spec.gid);
    let j = jail.clone();
    // SAFETY: only system calls between fork and exec (see `spawn::command`).
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            // The terminal on stdin becomes the session's controlling terminal: job control works.
            libc::ioctl(0, libc::TIOCSCTTY, 0);
            let fd = libc::open(c"/proc/self/oom_score_adj".as_ptr(), libc::O_WRONLY);
            if fd >= 0 {
                libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
            }
            j.enter(uid, gid)
        });
    }
    let started = Instant::now();
    let spawned = {
        let _forks = crate::standby::forks();
        cmd.spawn()
    };
    let child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let (_, msg) = spawn_failure(&spec.argv[0], &e);
            return proto::write_json(
                &mut wr,
                &refuse(ErrorKind::BadRequest, msg.trim().to_string()),
            )
            .await;
        }
    };
    drop(cmd); // closes the agent's copies of the terminal's slave side
    let pid = child.id() as i32;
    drop(child);
    let mut exit_rx = reaper.register(pid);
    proto::write_json(&mut wr, &Response::Started { pid }).await?;
    set_nonblocking(&master)?;
    // SAFETY: `master` is an open descriptor owned by the AsyncFd for its whole life.
    let master =
        unsafe { AsyncFd::register(master) }.map_err(|e| std::io::Error::other(e.to_string()))?;
    let master = Arc::new(master);

    // Keyboard input and resizes from the node; a resize that did not take goes back to it.
    let input_master = master.clone();
    let (problem_tx, mut problems) = tokio::sync::mpsc::channel::<String>(MAX_PROBLEMS);
    let winches = Arc::new(Winches::default());
    let input_winches = winches.clone();
    let _ended = Ended(winches);
    let mut input = tokio::spawn(async move {
        let mut reported = 0;
        let mut report = |problem: String| {
            if opts.report_problems && reported < MAX_PROBLEMS {
                reported += 1;
                let _ = problem_tx.try_send(problem);
            }
        };
        loop {
            match proto::read_frame(&mut rd).await {
                Ok(Some((FrameKind::Data, data))) => {
                    if write_master(&input_master, &data).await.is_err() {
                        return;
                    }
                }
                Ok(Some((FrameKind::Json, body))) => match serde_json::from_slice(&body) {
                    Ok(PtyControl::Resize { cols, rows }) => {
                        let changed =
                            match set_size(input_master.get_ref(), cols.max(1), rows.max(1)) {
                                Ok(changed) => changed,
                                Err(problem) => {
                                    report(problem);
                                    true // perhaps: the programs look for themselves
                                }
                            };
                        if changed && opts.signal_resize {
                            input_winches.ask(pid);
                        }
                    }
                    Err(e) => report(format!("a terminal control it cannot read: {e}")),
                },
                _ => return, // the node hung up
            }
        }
    });
    let mut buf = vec![0u8; 32 * 1024];
    let mut status = None;
    let mut output_open = true;
    loop {
        tokio::select! {
            r = read_master(&master, &mut buf), if output_open => match r {
                Ok(n) if n > 0 => proto::write_frame(&mut wr, FrameKind::Stdout, &buf[..n]).await?,
                // EIO: every program holding the terminal is gone.
                _ => output_open = false,
            },
            Some(problem) = problems.recv() => {
                proto::write_json(&mut wr, &refuse(ErrorKind::Internal, problem)).await?;
            },
            code = &mut exit_rx, if status.is_none() => {
                status = Some(code.unwrap_or(255));
                // Give the last output a moment to arrive, then finish.
                let deadline = tokio::time::sleep(Duration::from_millis(100));
                tokio::pin!(deadline);
                loop {
                    tokio::select! {
                        r = read_master(&master, &mut buf) => match r {
                            Ok(n) if n > 0 => proto::write_frame(&mut wr, FrameKind::Stdout, &buf[..n]).await?,
                            _ => break,
                        },
                        _ = &mut deadline => break,
                    }
                }
                break;
            },
            _ = &mut input => {
                // The node left: hang up the terminal's programs, then make sure they are gone.
                let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGHUP);
                tokio::time::sleep(Duration::from_millis(200)).await;
                kill_tree(pid);
                return Ok(());
            }
        }
    }
    input.abort();
    let exit = ExitInfo {
        exit_code: status.unwrap_or(255),
        timed_out: false,
        duration_ms: started.elapsed().as_millis() as u64,
        stdout_truncated: false,
        stderr_truncated: false,
    };
    proto::write_json(&mut wr, &Response::Exit(exit)).await
}
