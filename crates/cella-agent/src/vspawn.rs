//! Starting a command without copying the agent: `clone(CLONE_VM | CLONE_VFORK)`.
//!
//! A command that no process was made ahead for ([`crate::standby`]: every exec on gVisor, a
//! background process, an exec that finds none waiting) used to start with a `fork` of the
//! agent. On gVisor's `ptrace` platform a fork is a new address space in a new host stub
//! process, and every page the child then touched was a trap into gVisor's kernel: an exec of
//! `true` took 26-34 ms at the agent there, against 17-19 ms for `posix_spawn` of the same
//! `true` (which shares the parent's memory until `execve`). On the host kernel the fork is the
//! copy of the agent's page tables and the copy-on-write faults after it.
//!
//! So the child shares the agent's memory and the calling thread waits (`CLONE_VFORK`) until
//! the child ran `execve` or exited. That is usually the thread of the agent's async work; the
//! agent's other threads (the blocking pool's file work, and the async work itself when the
//! spawn runs on a thread of the pool: the warm-up `true` of
//! [`crate::AgentConfig::warm_first_command`]) write nothing the child reads: what it reads is
//! the calling thread's, or set once before any spawn. Each spawn takes the kept stack or makes
//! one, so two at once never share one. The child runs on a stack
//! of its own (kept for the next spawn) and builds nothing: the program's candidate paths (the
//! command's own `PATH`, searched as `execvp` searches it), argv, the environment and the
//! working directory were made ready in the parent. It sets every signal handler of the agent
//! back to the default (they would run on the agent's memory; which ones the agent has is asked
//! once, see [`HANDLED`]), puts its pipes on descriptors 0-2, marks every other descriptor
//! close-on-exec, `chdir`s, makes its own session, becomes a child subreaper when asked, gives up
//! the agent's immunity to the OOM killer (a `vfork` child's `oom_score_adj` is its own, the
//! kernel does not share it with its parent), enters the [`Jail`], then `execve`s. A failure before the command
//! runs is its `errno` on a status pipe that closes on a successful `execve`, read once the
//! agent goes on: the caller gets it as the `io::Error` a spawn gives (127 and 126 as a
//! shell's). Only a failure of the jail allocates (its error's text, through glibc's `malloc`,
//! whose arena locks work across the two since the memory is shared; a child the watchdog kills
//! while it holds one would leave it held, which only a jail failure followed by a `SIGSTOP`
//! could do).
//!
//! The memory is the agent's, so it must not be reachable while the child runs with a command's
//! ids: the agent is not dumpable (see `serve`), a flag of the memory, so reading or writing it
//! through the child (`ptrace`, `/proc/<pid>/mem`, its descriptors) takes `CAP_SYS_PTRACE`, which
//! no root inside has; [`Jail::enter`] sets it again after its change of ids.
//!
//! Commands that join a cgroup start this way only where the move is cheap (gVisor's own
//! hierarchy): on Linux moving itself into a cgroup can wait for an RCU grace period, which would
//! hold the agent up with it (those keep [`std::process::Command`]).
//! A process of the same user can stop the child (`SIGSTOP`) before its `execve`, which would hold
//! the agent: a watchdog kills a child that has not run its `execve` within [`EXEC_WITHIN`]
//! (the command then ends as killed, 137).

use crate::fds::pipe;
use crate::harden::Jail;
use crate::proto::ExecSpec;
use crate::spawn::Reaper;
use crate::standby::Started;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The child's stack (its lowest page a guard). Used by one spawn at a time.
const STACK: usize = 256 << 10;

/// How long a child may take to reach its `execve` before the watchdog kills it.
const EXEC_WITHIN: Duration = Duration::from_secs(if cfg!(test) { 1 } else { 10 });

/// The shell a file that is not an executable is run with, as `execvp` runs it.
const SHELL: &CStr = c"/bin/sh";

struct Stack {
    base: *mut u8,
}

// SAFETY: a private mapping owned by whoever holds the `Stack`.
unsafe impl Send for Stack {}

impl Stack {
    fn new() -> Option<Stack> {
        // SAFETY: a fresh anonymous mapping; its lowest page made inaccessible (a guard).
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                STACK,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return None;
            }
            let page = usize::try_from(libc::sysconf(libc::_SC_PAGESIZE)).unwrap_or(4096);
            if libc::mprotect(base, page, libc::PROT_NONE) != 0 {
                libc::munmap(base, STACK);
                return None;
            }
            Some(Stack { base: base.cast() })
        }
    }

    fn top(&self) -> *mut c_void {
        // SAFETY: one past the end of the mapping, where a stack that grows down starts.
        unsafe { self.base.add(STACK).cast() }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, used by nothing else.
        unsafe { libc::munmap(self.base.cast(), STACK) };
    }
}

/// The stack kept between spawns.
static KEPT: Mutex<Option<Stack>> = Mutex::new(None);

/// Spawns whose child may not have run `execve` yet: where the kernel writes its pid
/// (`CLONE_PARENT_SETTID`), and since when.
struct Watchdog {
    running: Mutex<Vec<(Arc<AtomicI32>, Instant)>>,
    changed: Condvar,
}

static WATCHDOG: Watchdog = Watchdog {
    running: Mutex::new(Vec::new()),
    changed: Condvar::new(),
};

impl Watchdog {
    /// Starts the watchdog's thread (once it could); false when it cannot be had (the caller
    /// forks).
    fn started() -> bool {
        static STARTED: Mutex<bool> = Mutex::new(false);
        let mut started = STARTED.lock().unwrap_or_else(PoisonError::into_inner);
        if !*started {
            *started = std::thread::Builder::new()
                .name("vspawn-watchdog".into())
                .spawn(|| WATCHDOG.watch())
                .is_ok();
        }
        *started
    }

    /// Kills the child of every spawn older than [`EXEC_WITHIN`] (once: it leaves the list).
    ///
    /// A sandbox frozen (a pause, a snapshot's copy) freezes this thread too: a wake that comes
    /// well after its time starts every clock again, so a thaw kills nothing that was on time.
    fn watch(&self) {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let mut due: Option<Instant> = None;
        loop {
            let now = Instant::now();
            if due.is_some_and(|d| now > d + Duration::from_secs(1)) {
                for (_, since) in running.iter_mut() {
                    *since = now;
                }
            }
            running.retain(|(pid, since)| {
                if now.duration_since(*since) < EXEC_WITHIN {
                    return true;
                }
                let pid = pid.load(Ordering::SeqCst);
                if pid > 0 {
                    // SAFETY: a signal to our own child, whose parent still waits in `clone`.
                    // Reaped it can only be in the instant between its exit and that return,
                    // by a reaper on another thread (an off-thread start, see `Reaper`); pids
                    // are handed out in order, so its pid is not another's that soon.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                false
            });
            let wait = running
                .iter()
                .map(|(_, since)| EXEC_WITHIN.saturating_sub(now.duration_since(*since)))
                .min();
            due = wait.map(|w| now + w);
            running = match wait {
                None => self
                    .changed
                    .wait(running)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(w) => {
                    self.changed
                        .wait_timeout(running, w)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
    }

    fn add(&self, pid: &Arc<AtomicI32>) {
        let mut r = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        r.push((pid.clone(), Instant::now()));
        self.changed.notify_one();
    }

    fn remove(&self, pid: &Arc<AtomicI32>) {
        let mut r = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        r.retain(|(p, _)| !Arc::ptr_eq(p, pid));
    }
}

/// Whether a change of ids leaves a process's memory dumpable: the host's `fs.suid_dumpable`
/// not 0 (gVisor has no such file, and makes such a memory not dumpable). Then a command that
/// changes ids forks instead: between its change of ids and the [`Jail`]'s flag it would
/// otherwise show the agent's own memory to processes of its user.
fn ids_change_leaves_dumpable() -> bool {
    static LEAVES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LEAVES.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/fs/suid_dumpable")
            .map(|v| v.trim() != "0")
            .unwrap_or(false)
    })
}

/// The signals the agent's process handles (bit `n - 1` for signal `n`), and `SIGPIPE`, which
/// the Rust runtime ignores and a spawned command gets back at its default.
///
/// Asked of the kernel once ([`handlers_installed`], when the agent has installed its handlers,
/// before it serves; else at the first spawn) instead of in each child: on gVisor every system
/// call of the child is a trap, and the 33 queries and resets cost an exec about 5 ms there.
static HANDLED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// Notes the handlers the agent installed (call once they all are; see [`HANDLED`]).
pub(crate) fn handlers_installed() {
    handled();
}

pub(crate) fn handled() -> u64 {
    *HANDLED.get_or_init(|| {
        let mut mask = 1u64 << (libc::SIGPIPE - 1);
        for s in 1..libc::SIGRTMIN() {
            // SAFETY: a query of a disposition into our own struct.
            let caught = unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                libc::sigaction(s, std::ptr::null(), &mut old) == 0
                    && old.sa_sigaction != libc::SIG_DFL
                    && old.sa_sigaction != libc::SIG_IGN
            };
            if caught {
                mask |= 1 << (s - 1);
            }
        }
        mask
    })
}

/// Sets the signals of `handled` ([`handled`]) back to their default action, in a child
/// between fork and exec (their handlers are the agent's, on its memory).
///
/// # Safety
/// Only system calls: callable between fork and exec.
pub(crate) unsafe fn default_handlers(handled: u64) {
    for s in 1..=64 {
        if handled & (1 << (s - 1)) != 0 {
            libc::signal(s, libc::SIG_DFL);
        }
    }
}

/// What the child reads, made ready by the parent.
struct Args<'a> {
    jail: &'a Jail,
    uid: u32,
    gid: u32,
    candidates: &'a [CString],
    argv: *const *const c_char,
    envp: *const *const c_char,
    /// `[SHELL, <the candidate>, argv[1..], NULL]`: slot 1 is written by the child.
    sh_argv: *mut *const c_char,
    cwd: &'a CStr,
    stdin: RawFd,
    stdout: RawFd,
    stderr: RawFd,
    status: RawFd,
    hold_tree: bool,
    /// The `cgroup.procs` the child writes itself into first (see `join` of [`spawn`]); -1:
    /// none.
    join: RawFd,
    /// The signals to set back to their default ([`HANDLED`]).
    handled: u64,
    /// Tests: the child stops itself first, as a process of its user could stop it.
    stop_self: bool,
}

/// The paths `execvp` would try for `program` with the command's `PATH` (glibc's default
/// `/bin:/usr/bin` without one; an empty entry is the working directory).
fn candidates(program: &str, path: Option<&str>) -> Option<Vec<CString>> {
    if program.is_empty() {
        return Some(Vec::new());
    }
    if program.contains('/') {
        return Some(vec![CString::new(program).ok()?]);
    }
    path.unwrap_or("/bin:/usr/bin")
        .split(':')
        .map(|dir| match dir {
            "" => CString::new(program).ok(),
            d => CString::new(format!("{d}/{program}")).ok(),
        })
        .collect()
}

fn pointers(list: &[CString]) -> Vec<*const c_char> {
    list.iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// Starts `spec` (its program being `program`) in a child that shares the agent's memory until
/// its `execve` (see the module docs).
///
/// None: this way could not be tried (a NUL in a string, no stack or descriptors, `clone`
/// refused); the caller starts it with [`std::process::Command`], which gives the same command
/// the same outcome. `Some(Err)`: the command could not start (its `errno`).
/// `join`: a `cgroup.procs` the child moves itself into, only where that move is cheap
/// (gVisor's own hierarchy, see [`crate::execcg::ExecCgroups::gvisor`]): on Linux a move can
/// wait for an RCU grace period, and the agent would wait with it.
pub(crate) fn spawn(
    spec: &ExecSpec,
    program: &str,
    jail: &Jail,
    pipe_stdin: bool,
    hold_tree: bool,
    join: Option<RawFd>,
    reaper: &Reaper,
) -> Option<std::io::Result<Started>> {
    spawn_with(
        spec, program, jail, pipe_stdin, hold_tree, join, reaper, false,
    )
}

#[allow(clippy::too_many_arguments)]
fn spawn_with(
    spec: &ExecSpec,
    program: &str,
    jail: &Jail,
    pipe_stdin: bool,
    hold_tree: bool,
    join: Option<RawFd>,
    reaper: &Reaper,
    stop_self: bool,
) -> Option<std::io::Result<Started>> {
    let candidates = candidates(program, spec.env.get("PATH").map(String::as_str))?;
    // argv[0] is the program run, as `Command` gives it (`/bin/sh` standing in for bash).
    let args: Vec<CString> = std::iter::once(program)
        .chain(spec.argv[1..].iter().map(String::as_str))
        .map(|a| CString::new(a).ok())
        .collect::<Option<_>>()?;
    let envs: Vec<CString> = spec
        .env
        .iter()
        .map(|(k, v)| CString::new(format!("{k}={v}")).ok())
        .collect::<Option<_>>()?;
    let cwd = CString::new(spec.cwd.as_str()).ok()?;
    let argv = pointers(&args);
    let envp = pointers(&envs);
    let mut sh_argv: Vec<*const c_char> = [SHELL.as_ptr(), std::ptr::null()]
        .into_iter()
        .chain(argv[1..].iter().copied())
        .collect();

    let (out_r, out_w) = pipe().ok()?;
    let (err_r, err_w) = pipe().ok()?;
    let (st_r, st_w) = pipe().ok()?;
    let (in_r, in_w) = if pipe_stdin {
        let (r, w) = pipe().ok()?;
        (r, Some(w))
    } else {
        let null = std::fs::File::open("/dev/null").ok()?;
        (OwnedFd::from(null), None)
    };
    if !Watchdog::started() || ((spec.uid != 0 || spec.gid != 0) && ids_change_leaves_dumpable()) {
        return None;
    }
    let stack = KEPT
        .lock()
        .ok()
        .and_then(|mut k| k.take())
        .or_else(Stack::new)?;
    let child_pid = Arc::new(AtomicI32::new(0));

    let a = Args {
        jail,
        uid: spec.uid,
        gid: spec.gid,
        candidates: &candidates,
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        sh_argv: sh_argv.as_mut_ptr(),
        cwd: &cwd,
        stdin: in_r.as_raw_fd(),
        stdout: out_w.as_raw_fd(),
        stderr: err_w.as_raw_fd(),
        status: st_w.as_raw_fd(),
        hold_tree,
        join: join.unwrap_or(-1),
        handled: handled(),
        stop_self,
    };
    WATCHDOG.add(&child_pid);
    // SAFETY: every signal is blocked around the clone, so none runs an agent's handler in the
    // child before the child reset it; the parent waits (CLONE_VFORK) while the child uses
    // `a`, the stack and the strings, all of which outlive the call. The kernel writes the
    // child's pid into `child_pid` (an `AtomicI32` is an `i32` in memory) before it runs.
    let (pid, clone_err) = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            entry,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PARENT_SETTID | libc::SIGCHLD,
            (&a as *const Args).cast_mut().cast(),
            child_pid.as_ptr(),
        );
        let clone_err = std::io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        (pid, clone_err)
    };
    WATCHDOG.remove(&child_pid);
    if let Ok(mut k) = KEPT.lock() {
        *k = Some(stack);
    }
    // The child's ends: it has its own copies, or has exited.
    drop((in_r, out_w, err_w, st_w));
    if pid < 0 {
        tracing::debug!("clone(CLONE_VM | CLONE_VFORK): {clone_err}; forking instead");
        return None;
    }
    // The child ran `execve` (the pipe closes with it, a moment after the agent was let go) or
    // exited after writing its `errno`. Nothing else holds the pipe's other end; the wait is
    // bounded all the same.
    let mut errno = [0u8; 4];
    let mut got = 0;
    let deadline = Instant::now() + Duration::from_secs(1);
    while got < errno.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut pfd = libc::pollfd {
            fd: st_r.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: a poll of our pipe, then a read into our buffer from it.
        let n = unsafe {
            match libc::poll(&mut pfd, 1, left.as_millis() as c_int) {
                0 => break,
                n if n < 0 => {
                    if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    break;
                }
                _ => {}
            }
            libc::read(
                st_r.as_raw_fd(),
                errno[got..].as_mut_ptr().cast(),
                errno.len() - got,
            )
        };
        match n {
            0 => break,
            n if n > 0 => got += n as usize,
            _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            _ => break,
        }
    }
    if got == errno.len() {
        // It exited: the reaper collects it (nothing waits for it).
        return Some(Err(std::io::Error::from_raw_os_error(i32::from_ne_bytes(
            errno,
        ))));
    }
    // Registered before the reaper's thread can reap it, or held for it (see [`Reaper`]).
    let exit = reaper.register(pid);
    Some(Ok(Started {
        pid,
        exit,
        stdin: in_w,
        stdout: out_r,
        stderr: err_r,
        launch: None,
    }))
}

extern "C" fn entry(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the parent's `Args`, alive while the parent waits for this child.
    unsafe { child(&*arg.cast::<Args>()) }
}

fn errno() -> c_int {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() }
}

/// Reports `errno` on the status pipe and exits.
unsafe fn fail(status: RawFd) -> ! {
    let e = errno();
    libc::write(status, e.to_ne_bytes().as_ptr().cast(), 4);
    libc::_exit(127)
}

/// `fd` onto `to`; one already there only loses its close-on-exec flag.
unsafe fn put(fd: RawFd, to: RawFd) -> bool {
    if fd == to {
        libc::fcntl(fd, libc::F_SETFD, 0) != -1
    } else {
        libc::dup2(fd, to) >= 0
    }
}

/// The child (see the module docs): only system calls until `execve` or `_exit`.
unsafe fn child(a: &Args) -> ! {
    // Every handler back to the default while all signals are blocked (ignored ones stay
    // ignored, as across `execve`, but for `SIGPIPE`, which a spawned command gets back).
    default_handlers(a.handled);
    let mut none: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut none);
    libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    if a.stop_self {
        // (The system calls: libc's `raise` would name the parent's thread, whose record this
        // child shares.)
        libc::syscall(
            libc::SYS_kill,
            libc::syscall(libc::SYS_getpid),
            libc::SIGSTOP,
        );
    }
    if !put(a.stdin, 0) || !put(a.stdout, 1) || !put(a.stderr, 2) {
        fail(a.status);
    }
    // Nothing of the agent's beyond 0-2 reaches the command, also a descriptor someone left
    // without close-on-exec (the status pipe has it already). A kernel without
    // `CLOSE_RANGE_CLOEXEC` leaves them as a fork would.
    libc::syscall(
        libc::SYS_close_range,
        3u32,
        crate::fds::LAST_FD,
        libc::CLOSE_RANGE_CLOEXEC,
    );
    if libc::chdir(a.cwd.as_ptr()) != 0 {
        fail(a.status);
    }
    // Its exec's cgroup first: every process it starts is a member.
    if a.join >= 0 {
        libc::write(a.join, b"0".as_ptr().cast(), 1);
    }
    // Own session and process group: the whole tree can be killed at a timeout.
    libc::setsid();
    if a.hold_tree {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
    // Children must not inherit the agent's immunity to the OOM killer.
    let fd = libc::open(c"/proc/self/oom_score_adj".as_ptr(), libc::O_WRONLY);
    if fd >= 0 {
        libc::write(fd, b"0".as_ptr().cast(), 1);
        libc::close(fd);
    }
    if let Err(e) = a.jail.enter(a.uid, a.gid) {
        *libc::__errno_location() = e.raw_os_error().unwrap_or(libc::EINVAL);
        fail(a.status);
    }
    // As `execvp` searches: on to the next directory past a file that is not there or cannot
    // be run (the latter remembered), stopping at any other error; a file the kernel cannot
    // run is run by the shell.
    let mut denied = false;
    let mut last = libc::ENOENT;
    for c in a.candidates {
        libc::execve(c.as_ptr(), a.argv, a.envp);
        if errno() == libc::ENOEXEC {
            *a.sh_argv.add(1) = c.as_ptr();
            libc::execve(SHELL.as_ptr(), a.sh_argv, a.envp);
        }
        last = errno();
        match last {
            libc::EACCES => denied = true,
            libc::ENOENT
            | libc::ESTALE
            | libc::ENOTDIR
            | libc::ENODEV
            | libc::EHOSTUNREACH
            | libc::ETIMEDOUT => {}
            _ => fail(a.status),
        }
    }
    *libc::__errno_location() = if denied { libc::EACCES } else { last };
    fail(a.status)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(v: Option<Vec<CString>>) -> Vec<String> {
        v.unwrap()
            .into_iter()
            .map(|c| c.into_string().unwrap())
            .collect()
    }

    #[test]
    fn candidates_are_the_paths_execvp_tries() {
        assert_eq!(
            strs(candidates("ls", Some("/opt/bin::/usr/bin/"))),
            ["/opt/bin/ls", "ls", "/usr/bin//ls"]
        );
        assert_eq!(strs(candidates("ls", None)), ["/bin/ls", "/usr/bin/ls"]);
        assert_eq!(strs(candidates("./run.sh", Some("/x"))), ["./run.sh"]);
        assert_eq!(strs(candidates("", Some("/x"))), Vec::<String>::new());
        assert!(candidates("a\0b", None).is_none());
    }

    /// Runs `argv` as `id` through [`spawn`]: stdout, stderr and exit code, or the spawn's error.
    fn run(
        argv: &[&str],
        env: &[(&str, &str)],
        cwd: &std::path::Path,
        stdin: Option<&[u8]>,
        id: u32,
    ) -> std::io::Result<(String, String, i32)> {
        use std::io::{Read, Write};
        let spec = ExecSpec {
            argv: argv.iter().map(|a| a.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cwd: cwd.display().to_string(),
            uid: id,
            gid: id,
            stdin: stdin.map(<[u8]>::to_vec),
            ..Default::default()
        };
        let jail = Jail::new().unwrap();
        let reaper = Reaper::default();
        let started = spawn(&spec, argv[0], &jail, stdin.is_some(), false, None, &reaper)
            .expect("this way could be tried")?;
        if let (Some(data), Some(fd)) = (stdin, started.stdin) {
            std::fs::File::from(fd).write_all(data).unwrap();
        }
        let (mut out, mut err) = (String::new(), String::new());
        std::fs::File::from(started.stdout)
            .read_to_string(&mut out)
            .unwrap();
        std::fs::File::from(started.stderr)
            .read_to_string(&mut err)
            .unwrap();
        let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(started.pid), None);
        let code = match status.unwrap() {
            nix::sys::wait::WaitStatus::Exited(_, c) => c,
            nix::sys::wait::WaitStatus::Signaled(_, sig, _) => 128 + sig as i32,
            other => panic!("{other:?}"),
        };
        Ok((out, err, code))
    }

    fn script(path: &std::path::Path, text: &str, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_command_runs_as_a_spawned_one_does_and_fails_as_one_does() {
        if !nix::unistd::geteuid().is_root() {
            return; // the jail switches users
        }
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let path = format!("/no/such/dir:{}:/usr/bin:/bin", bin.display());
        let env = [("PATH", path.as_str()), ("A", "a")];
        // Its argv, only its environment, its working directory, its stdin, its exit code.
        let (out, err, code) = run(
            &[
                "sh",
                "-c",
                "echo \"$A:$0:$1:${HOME-unset}\"; pwd; read l; echo \"in:$l\"; echo e >&2; exit 3",
                "zero",
                "one",
            ],
            &env,
            dir.path(),
            Some(b"hello\n"),
            0,
        )
        .unwrap();
        let cwd = dir.path().canonicalize().unwrap();
        assert_eq!(
            out,
            format!("a:zero:one:unset\n{}\nin:hello\n", cwd.display())
        );
        assert_eq!((err.as_str(), code), ("e\n", 3));
        // Found in the command's own PATH; a file without `#!` run by the shell.
        script(&bin.join("hello"), "#!/bin/sh\necho hi \"$@\"\n", 0o755);
        script(&bin.join("plain"), "echo plain \"$@\"\n", 0o755);
        assert_eq!(
            run(&["hello", "x"], &env, dir.path(), None, 0).unwrap().0,
            "hi x\n"
        );
        assert_eq!(
            run(&["plain", "y"], &env, dir.path(), None, 0).unwrap().0,
            "plain y\n"
        );
        // Not there: NotFound (127); there but not executable: PermissionDenied (126), also
        // when a later directory has none.
        let e = run(&["no-such-command"], &env, dir.path(), None, 0).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
        script(&bin.join("notx"), "echo no\n", 0o644);
        let e = run(&["notx"], &env, dir.path(), None, 0).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
        let notx = bin.join("notx").display().to_string();
        let e = run(&[notx.as_str()], &env, dir.path(), None, 0).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
        // Confined: its user, and no namespaces even as root.
        let (out, _, _) = run(&["id", "-u"], &env, dir.path(), None, 65534).unwrap();
        assert_eq!(out, "65534\n");
        let (_, _, code) = run(&["unshare", "-U", "true"], &env, dir.path(), None, 0).unwrap();
        assert_ne!(code, 0, "unshare worked inside the jail");
        // A stdin of /dev/null when none is given.
        let (out, _, _) = run(&["sh", "-c", "cat; echo end"], &env, dir.path(), None, 0).unwrap();
        assert_eq!(out, "end\n");
        // The signal mask and dispositions a `Command` gives (nothing blocked, nothing of the
        // parent's caught, SIGPIPE not ignored), only its own descriptors (0-2, and the one
        // `ls` reads the directory with), a session of its own.
        let signals = ["grep", "-E", "^Sig(Blk|Ign|Cgt)", "/proc/self/status"];
        let (out, _, _) = run(&signals, &env, dir.path(), None, 0).unwrap();
        // (A fork, as before: `posix_spawn`, which `Command` uses without a `pre_exec`, leaves
        // libc's internal signals ignored.)
        let by_command = unsafe {
            std::os::unix::process::CommandExt::pre_exec(
                &mut std::process::Command::new(signals[0]),
                || Ok(()),
            )
            .args(&signals[1..])
            .output()
            .unwrap()
        };
        assert_eq!(out, String::from_utf8_lossy(&by_command.stdout));
        assert!(out.starts_with("SigBlk:\t0000000000000000\n"), "{out}");
        let (out, _, _) = run(&["ls", "/proc/self/fd"], &env, dir.path(), None, 0).unwrap();
        assert_eq!(out, "0\n1\n2\n3\n");
        let (out, _, _) = run(
            &["sh", "-c", "echo $$; cut -d' ' -f6 /proc/$$/stat"],
            &env,
            dir.path(),
            None,
            0,
        )
        .unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert_eq!(lines[0], lines[1], "not a session of its own: {out}");
    }

    #[test]
    fn a_child_stopped_before_its_execve_is_killed_and_lets_its_caller_go() {
        if !nix::unistd::geteuid().is_root() {
            return; // the jail switches users
        }
        // The child stops itself where a process of its user inside could stop it.
        let spec = ExecSpec {
            argv: vec!["true".into()],
            cwd: "/".into(),
            ..Default::default()
        };
        let jail = Jail::new().unwrap();
        let reaper = Reaper::default();
        let t = Instant::now();
        let started = spawn_with(&spec, "true", &jail, false, false, None, &reaper, true)
            .expect("this way could be tried")
            .expect("a killed child is a command that ended");
        let took = t.elapsed();
        assert!(took >= EXEC_WITHIN, "let go after {took:?}");
        assert!(took < EXEC_WITHIN * 5, "held {took:?}");
        let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(started.pid), None);
        assert_eq!(
            status.unwrap(),
            nix::sys::wait::WaitStatus::Signaled(
                nix::unistd::Pid::from_raw(started.pid),
                nix::sys::signal::Signal::SIGKILL,
                false
            )
        );
    }
}
