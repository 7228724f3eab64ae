//! Terminals: a program on a new pseudo-terminal, relayed over the agent connection.
//!
//! Where the kernel sends no signals for a terminal (gVisor's), a signaller process in the
//! terminal's session sends them for the agent ([`start_signaller`]); a resize is read back,
//! and one that did not take goes to the node as a problem for its log.

use crate::harden::Jail;
use crate::proto::{
    self, ErrorKind, ExecSpec, ExitInfo, FrameKind, ProtoError, PtyControl, Response,
};
use crate::spawn::{cwd_problem, kill_tree, spawn_failure, Reaper};
use nix::pty::{openpty, Winsize};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
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

/// What the agent asks of a terminal's signaller: one byte per signal.
const ASK_INT: u8 = b'I';
const ASK_QUIT: u8 = b'Q';
const ASK_TSTP: u8 = b'Z';
const ASK_WINCH: u8 = b'W';
/// The program ended: the signaller lets go of the terminal, so its last output is read to
/// the end (EIO) without a wait.
const ASK_END: u8 = b'X';

/// Starts the terminal's signaller, where the kernel sends no signals for a terminal
/// ([`crate::AgentConfig::terminal_signals`]: gVisor's, runsc 20221219, neither `SIGWINCH` on a
/// resize nor `SIGINT`, `SIGQUIT`, `SIGTSTP` for `^C`, `^\`, `^Z`). Only a process of the
/// terminal's session may ask which process group is in its foreground (gVisor refuses
/// `TIOCGPGRP` to others and shows no `tpgid` in `/proc`), so the signaller is one: cloned
/// from the program's process once its session, controlling terminal and jail are set (so it
/// has the program's rights and no more; not dumpable, as the jail leaves it), in a process
/// group of its own (the signals it sends are not its own), holding nothing but the terminal
/// (as standard input) and the read end of `asks`. For each byte it reads it asks for the
/// foreground group and signals it, as the kernel would; it ends when the program does
/// ([`ASK_END`]) or the agent closes its end. Unlike Linux it neither echoes the key (`^C`)
/// nor discards what was typed ahead and not yet read: the signal is not ordered with the
/// bytes typed after the key, which a discard could then take.
///
/// # Safety
/// Only system calls: called between fork and exec (`pre_exec`), with `handled` from
/// [`crate::vspawn::handled`].
unsafe fn start_signaller(asks: RawFd, handled: u64) {
    // The agent's handlers off first (this process execs next, which would drop them anyway):
    // neither it nor the signaller may run a copy of one.
    crate::vspawn::default_handlers(handled);
    // A sibling, not a child (`CLONE_PARENT`): nothing here waits for it, and the agent reaps
    // it. Otherwise as `fork` (the same stack, copied).
    let flags = (libc::CLONE_PARENT | libc::SIGCHLD) as libc::c_ulong;
    if libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) != 0 {
        return;
    }
    // First of all the agent's descriptors, the spawn's exec-status pipe among them (the
    // agent's spawn waits for its every copy to close). Standard input, the terminal, is
    // kept: gVisor answers `TIOCGPGRP` there only (neither on the master nor on `/dev/tty`).
    libc::close(1);
    libc::close(2);
    crate::fds::close_all_but(&[asks]);
    let mut none: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut none);
    libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    libc::setpgid(0, 0);
    libc::prctl(libc::PR_SET_NAME, c"cella-tty".as_ptr());
    let own = libc::getpgrp();
    loop {
        let mut ask = 0u8;
        let n = libc::read(asks, (&mut ask as *mut u8).cast(), 1);
        if n == 0 || (n < 0 && *libc::__errno_location() != libc::EINTR) {
            libc::_exit(0);
        }
        let sig = match ask {
            ASK_INT => libc::SIGINT,
            ASK_QUIT => libc::SIGQUIT,
            ASK_TSTP => libc::SIGTSTP,
            ASK_WINCH => libc::SIGWINCH,
            ASK_END => libc::_exit(0),
            _ => continue,
        };
        // Not its own group, which a program may have made the foreground one.
        let group = libc::tcgetpgrp(0);
        if group > 1 && group != own {
            libc::kill(-group, sig);
        }
    }
}

/// The agent's end of a terminal's signaller ([`start_signaller`]).
struct Signaller(OwnedFd);

impl Signaller {
    /// Asks for one signal; dropped if the signaller is behind by a pipe's worth.
    fn ask(&self, ask: u8) {
        // SAFETY: a write of one byte from our own buffer to a descriptor we own.
        unsafe { libc::write(self.0.as_raw_fd(), (&ask as *const u8).cast(), 1) };
    }

    /// Sends `data` to the terminal as the kernel's line discipline would with `ISIG` set:
    /// its interrupt, quit and suspend characters become signals, the rest is typed in.
    async fn input(&self, master: &AsyncFd<OwnedFd>, data: &[u8]) -> std::io::Result<()> {
        let keys = match nix::sys::termios::tcgetattr(master.get_ref()) {
            Ok(t) if t.local_flags.contains(nix::sys::termios::LocalFlags::ISIG) => {
                use nix::sys::termios::SpecialCharacterIndices as I;
                [
                    (t.control_chars[I::VINTR as usize], ASK_INT),
                    (t.control_chars[I::VQUIT as usize], ASK_QUIT),
                    (t.control_chars[I::VSUSP as usize], ASK_TSTP),
                ]
            }
            _ => return write_master(master, data).await,
        };
        // A key set to 0 (`_POSIX_VDISABLE`) is off.
        let key = |b: &u8| {
            keys.iter()
                .find(|(k, _)| *k != 0 && k == b)
                .map(|(_, a)| *a)
        };
        let mut rest = data;
        while let Some((at, ask)) = rest
            .iter()
            .enumerate()
            .find_map(|(i, b)| Some((i, key(b)?)))
        {
            write_master(master, &rest[..at]).await?;
            self.ask(ask);
            rest = &rest[at + 1..];
        }
        write_master(master, rest).await
    }
}

/// How a terminal is opened ([`proto::Request::Pty`] and the agent's configuration).
pub struct Options {
    /// (cols, rows) at the start.
    pub size: (u16, u16),
    /// [`proto::Request::Pty`]'s `report_problems`.
    pub report_problems: bool,
    /// [`crate::AgentConfig::terminal_signals`].
    pub terminal_signals: bool,
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
    cgroups: Option<Arc<crate::execcg::ExecCgroups>>,
) -> Result<(), ProtoError> {
    let (mut rd, mut wr) = stream.into_split();
    let (cols, rows) = opts.size;
    // The session's programs in a cgroup of their own where the sandbox delegated one: a
    // hang-up kills them all, those that left the terminal's session (`setsid`) included.
    let group = cgroups
        .as_deref()
        .and_then(crate::execcg::ExecCgroups::fresh_group);
    let join = group.as_ref().map(crate::execcg::ExecGroup::procs_fd);
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
    // The signaller's pipe: its read end goes to the signaller only (close-on-exec here).
    let signaller = match opts.terminal_signals {
        true => Some(crate::fds::pipe()?),
        false => None,
    };
    let asks = signaller.as_ref().map(|(rd, _)| rd.as_raw_fd());
    let handled = crate::vspawn::handled();
    // SAFETY: only system calls between fork and exec (see `spawn::command`).
    unsafe {
        cmd.pre_exec(move || {
            if let Some(fd) = join {
                libc::write(fd, b"0".as_ptr().cast(), 1);
            }
            libc::setsid();
            // The terminal on stdin becomes the session's controlling terminal: job control works.
            libc::ioctl(0, libc::TIOCSCTTY, 0);
            let fd = libc::open(c"/proc/self/oom_score_adj".as_ptr(), libc::O_WRONLY);
            if fd >= 0 {
                libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
            }
            j.enter(uid, gid)?;
            if let Some(asks) = asks {
                start_signaller(asks, handled);
            }
            Ok(())
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
    let signaller = match signaller {
        // and the read end of the signaller's pipe; the agent never waits on its own end
        Some((rd, wr)) => {
            drop(rd);
            set_nonblocking(&wr)?;
            Some(Arc::new(Signaller(wr)))
        }
        None => None,
    };
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
    let input_signaller = signaller.clone();
    let mut input = tokio::spawn(async move {
        let signaller = input_signaller;
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
                    let typed = match &signaller {
                        Some(s) => s.input(&input_master, &data).await,
                        None => write_master(&input_master, &data).await,
                    };
                    if typed.is_err() {
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
                        if let (true, Some(s)) = (changed, &signaller) {
                            s.ask(ASK_WINCH);
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
                if let Some(s) = &signaller {
                    s.ask(ASK_END);
                }
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
                if let Some(g) = &group {
                    g.kill();
                }
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
