//! Starting processes inside the sandbox, and reaping and killing them.
//!
//! Every way the agent runs something (an exec, a background process, a terminal, a code
//! kernel) builds its command here: [`command`] confines it with the [`Jail`] (its uid and gid,
//! capabilities, seccomp, descriptor limit), gives it a session of its own, takes back the agent's
//! immunity to the OOM killer and, for an exec, joins its cgroup (see [`crate::execcg`]) and
//! makes it a subreaper so its tree stays reachable. [`cwd_problem`] and [`spawn_failure`] turn
//! the usual reasons a command cannot start into the shell's answers (126/127 and a message).
//!
//! The agent is PID 1 of its sandbox, so every orphan ends up its child: the [`Reaper`] collects
//! all exit statuses on `SIGCHLD` and hands each waited-for one to whoever registered its pid.
//! [`kill_tree`] kills a command and everything it started by walking the process table, used
//! where no exec cgroup is available (and for processes that have none).

use crate::harden::Jail;
use crate::proto::ExecSpec;
use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Collects exit statuses of every child, ours and orphans alike, as an init must.
///
/// A start registers its child's pid once it has it. On the thread the reaper runs on (the
/// agent's async work) nothing can reap the child before that; a start on another thread (the
/// warm-up `true`, [`crate::AgentConfig::warm_first_command`]) holds an [`OffThread`] from
/// before its child exists until it registered it, and meanwhile the statuses of children
/// nobody waits for are kept, for a `register` that comes after the reap.
#[derive(Default)]
pub(crate) struct Reaper {
    state: Mutex<ReaperState>,
}

#[derive(Default)]
struct ReaperState {
    waiters: HashMap<i32, oneshot::Sender<i32>>,
    /// Statuses reaped while an off-thread start ran, that nobody had registered.
    held: HashMap<i32, i32>,
    /// Off-thread starts in flight.
    off_thread: usize,
}

/// An off-thread start in flight (see [`Reaper`]); dropped once its child is registered.
pub(crate) struct OffThread(std::sync::Arc<Reaper>);

impl Drop for OffThread {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.off_thread = st.off_thread.saturating_sub(1);
        if st.off_thread == 0 {
            st.held.clear();
        }
    }
}

impl Reaper {
    fn lock(&self) -> std::sync::MutexGuard<'_, ReaperState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn register(&self, pid: i32) -> oneshot::Receiver<i32> {
        let (tx, rx) = oneshot::channel();
        let mut st = self.lock();
        match st.held.remove(&pid) {
            Some(code) => {
                let _ = tx.send(code);
            }
            None => {
                st.waiters.insert(pid, tx);
            }
        }
        rx
    }

    /// Marks a start on a thread other than the reaper's as in flight (see [`Reaper`]).
    pub(crate) fn off_thread(self: &std::sync::Arc<Self>) -> OffThread {
        self.lock().off_thread += 1;
        OffThread(self.clone())
    }

    /// Hands the exit `code` of reaped child `pid` to whoever registered it, or keeps it while
    /// an off-thread start is in flight.
    fn collected(&self, pid: i32, code: i32) {
        let mut st = self.lock();
        match st.waiters.remove(&pid) {
            Some(tx) => {
                let _ = tx.send(code);
            }
            None if st.off_thread > 0 => {
                st.held.insert(pid, code);
            }
            None => {}
        }
    }

    /// Collects every child that has exited; called at start and on each `SIGCHLD`.
    pub(crate) fn reap(&self) {
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
            self.collected(pid.as_raw(), code);
        }
    }
}

/// The exit code and message of a command that could not start, as a shell gives them:
/// 127 when it does not exist, 126 when it cannot be run.
pub(crate) fn spawn_failure(argv0: &str, err: &std::io::Error) -> (i32, String) {
    match err.kind() {
        std::io::ErrorKind::NotFound => (127, format!("cella: {argv0}: command not found\n")),
        std::io::ErrorKind::PermissionDenied => {
            (126, format!("cella: {argv0}: permission denied\n"))
        }
        _ => (126, format!("cella: {argv0}: cannot run: {err}\n")),
    }
}

/// The program `spec` runs: its `argv[0]`, but images without bash (Alpine, distroless with a
/// shell) still run shell command lines.
pub(crate) fn program(spec: &ExecSpec) -> &str {
    if spec.argv[0] == "/bin/bash" && !std::path::Path::new("/bin/bash").exists() {
        "/bin/sh"
    } else {
        spec.argv[0].as_str()
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
    let mut cmd = std::process::Command::new(program(spec));
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

/// A cgroup an exec's command joins: its `cgroup.procs`, and whether moving into it is cheap
/// (gVisor's own hierarchy; on Linux a move can wait for an RCU grace period).
#[derive(Clone, Copy)]
pub(crate) struct Join {
    pub fd: std::os::fd::RawFd,
    pub cheap: bool,
}

/// Starts `spec` where no process was made ahead for it (see [`crate::standby`]): in a child
/// sharing the agent's memory until its `execve` ([`crate::vspawn`]) unless it joins a cgroup
/// whose move is not cheap (`join_cgroup`, see [`command`]), else by a fork. Its exit is
/// registered with `reaper`.
pub(crate) fn start(
    spec: &ExecSpec,
    jail: &Arc<Jail>,
    pipe_stdin: bool,
    hold_tree: bool,
    join_cgroup: Option<Join>,
    reaper: &Reaper,
) -> std::io::Result<crate::standby::Started> {
    if join_cgroup.is_none_or(|j| j.cheap) {
        let prog = program(spec);
        let join = join_cgroup.map(|j| j.fd);
        if let Some(r) = crate::vspawn::spawn(spec, prog, jail, pipe_stdin, hold_tree, join, reaper)
        {
            return r;
        }
    }
    let join_cgroup = join_cgroup.map(|j| j.fd);
    let mut cmd = command(spec, jail, pipe_stdin, hold_tree, join_cgroup);
    let mut child = {
        let _forks = crate::standby::forks();
        cmd.spawn()?
    };
    let pid = child.id() as i32;
    // Registered before the reaper's thread can reap it, or held for it (see [`Reaper`]).
    let exit = reaper.register(pid);
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(std::io::Error::other("no output pipes"));
    };
    Ok(crate::standby::Started {
        pid,
        exit,
        stdin: child.stdin.take().map(std::os::fd::OwnedFd::from),
        stdout: stdout.into(),
        stderr: stderr.into(),
        launch: None,
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_child_reaped_before_its_off_thread_start_registers_it_keeps_its_exit() {
        let reaper = Arc::new(Reaper::default());
        // On the reaper's own thread nothing is kept for a pid nobody waits for.
        reaper.collected(100, 1);
        let mut late = reaper.register(100);
        assert!(late.try_recv().is_err(), "an orphan's status is not kept");
        // While an off-thread start is in flight, its child's exit waits for the register.
        let in_flight = reaper.off_thread();
        reaper.collected(101, 7);
        let mut exit = reaper.register(101);
        assert_eq!(exit.try_recv().ok(), Some(7));
        // A registered pid gets its status as before.
        let mut waiting = reaper.register(102);
        reaper.collected(102, 3);
        assert_eq!(waiting.try_recv().ok(), Some(3));
        // Once no start is in flight, what was kept and never asked for goes.
        reaper.collected(103, 9);
        drop(in_flight);
        let mut gone = reaper.register(103);
        assert!(gone.try_recv().is_err());
    }
}
