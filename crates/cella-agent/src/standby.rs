//! The next exec's process, started ahead: forked, in its exec cgroup and confined as far as it
//! can be before its command is known, waiting for the command.
//!
//! An exec's start used to be a `fork` of the agent and, in the child, a write of itself into its
//! exec cgroup: the fork costs about a millisecond, and on cgroup v1 the move waits for an RCU
//! grace period (several milliseconds) unless the hierarchy was mounted with `favordynmods`.
//! Both now happen when the previous exec is over (and when the agent starts): a [`Standby`] is a
//! forked child that has joined the next exec cgroup (see [`crate::execcg`]), made a session of
//! its own, become a child subreaper, given up the agent's immunity to the OOM killer, reset its
//! signal mask, put the ends of its output pipes on descriptors 1 and 2 and closed every other
//! descriptor of the agent's. It then blocks on a pipe. The exec writes its command (program,
//! argv, environment, working directory, user, whether stdin is `/dev/null`) into a shared
//! mapping made before the fork, so it is at the same address in both, as ready-made C strings
//! and pointer arrays: the child builds nothing and allocates nothing. One byte on the pipe sends
//! the child on: stdin, `chdir`, [`Jail::enter`] (user, capabilities, limits; the seccomp filter
//! and bounding set are the agent's own, inherited), `execvp` with the command's environment.
//! It reports a failure as its `errno` on a status pipe that closes on a successful `execve`;
//! the exec does not wait for that before it goes on to the command's output, and turns an
//! `errno` read there into the shell's 126/127 and message, like any spawn failure.
//!
//! Everything that held for an exec holds the same: one exec, one cgroup (the child is its first
//! member, or the second after one forked again at a claim that exited having run nothing); the
//! same confinement, in the same order relative to `execve`. A standby that died,
//! never got ready, or cannot carry the command (too big for its mapping, a NUL in a string)
//! is dropped and the exec forks as before ([`crate::spawn::command`]).
//!
//! The child is forked without the agent's heap (its `brk` area marked `MADV_DONTFORK` for the
//! moment of the fork) where the jail needs nothing of it: the agent runs under the jail's
//! filter and bounding set already, so the child enters a [`Confinement`], plain values on its
//! own stack. Why: after a fork every page of the agent's that both hold is copied at the
//! agent's first write to it (7-9 µs a page on the development host), and the agent wrote 45
//! pages in each exec of `true`, on the exec's path; now 14 (its stack and statics). The fork
//! copies fewer page tables too, and the command's `execve` has less to tear down. Nothing in
//! the child reads the heap: the command is in the mapping, and the child allocates nothing
//! and calls no code that could. So that nothing else does either: the fork is the system
//! call itself, not glibc's `fork`, whose child handlers reset state kept partly on the heap
//! (stdio's locks, the name service's); every signal is blocked across it and the child sets
//! the agent's handlers back to the default before it unblocks any (a root command's
//! `kill -CHLD` would otherwise run the agent's handler there, on memory it lacks); and every
//! other fork of the agent (a `Command` with a `pre_exec`) takes [`forks`] first, so none
//! happens on another thread while the heap is marked. The heap is where `/proc/self/stat`'s
//! `start_brk` says, never the program's own data next to it.
//!
//! A standby that waited long runs its command from cold caches (half a millisecond more on
//! the development host than one forked a moment before). A warm pool sandbox waits for its
//! claim for seconds or hours, so a `Ping` to a sealed, untouched agent (the claim's; a probe
//! at the server's start asks too) makes the agent fork it again once it has answered, in the
//! same exec cgroup, when it is older than 10 ms
//! ([`crate::execcg::ExecCgroups::refresh_standby`]). Only where moving a process into a cgroup
//! is fast (`favordynmods`, [`crate::AgentConfig::refresh_standby`]): elsewhere the new one's
//! move waits for an RCU grace period and the first exec would wait for it.

use crate::fds::{close_all_but, pipe};
use crate::harden::{Confinement, Jail};
use crate::proto::ExecSpec;
use crate::spawn::Reaper;
use std::ffi::{c_char, CString};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

/// Bytes of the shared mapping that carries a command; a bigger command forks as before.
const REGION: usize = 4 << 20;

/// The command's layout at the start of the mapping; every pointer points into the mapping.
#[repr(C)]
struct Header {
    program: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    cwd: *const c_char,
    uid: u32,
    gid: u32,
    stdin_null: u32,
}

extern "C" {
    static mut environ: *const *const c_char;
}

/// A started command: its pid, its exit (from the reaper), its pipes.
pub(crate) struct Started {
    pub pid: i32,
    pub exit: oneshot::Receiver<i32>,
    pub stdin: Option<OwnedFd>,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// For a command started by a [`Standby`]: its status pipe, which gives the child's `errno`
    /// if `chdir`, the confinement or `execve` failed, and closes when `execve` succeeded.
    pub launch: Option<pipe::Receiver>,
}

/// A forked child waiting for the next exec's command (see the module docs).
pub(crate) struct Standby {
    pid: i32,
    exit: oneshot::Receiver<i32>,
    /// One byte here sends the child on; closing it makes the child exit.
    go: OwnedFd,
    /// `R` once the child is ready; then its `errno` if it failed, EOF once it ran `execve`
    /// (or exited).
    status: OwnedFd,
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    region: *mut u8,
    /// When it was forked (see [`Standby::age`]).
    made: std::time::Instant,
}

// SAFETY: the mapping is owned by the standby alone (the child's copy is its own process's).
unsafe impl Send for Standby {}
unsafe impl Sync for Standby {}

impl Standby {
    /// Forks a child into the exec cgroup whose `cgroup.procs` is `procs` and leaves it
    /// waiting. None when a pipe, the mapping or the fork cannot be had.
    pub(crate) fn start(jail: &Jail, procs: RawFd, reaper: &Reaper) -> Option<Standby> {
        let (go_r, go_w) = pipe().ok()?;
        let (st_r, st_w) = pipe().ok()?;
        let (in_r, in_w) = pipe().ok()?;
        let (out_r, out_w) = pipe().ok()?;
        let (err_r, err_w) = pipe().ok()?;
        // SAFETY: a fresh anonymous shared mapping; pages are taken only as they are written.
        let region = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                REGION,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if region == libc::MAP_FAILED {
            return None;
        }
        let region = region.cast::<u8>();
        // Without the agent's heap where the jail needs nothing of it (see the module docs).
        let plain = jail.inherited();
        let guard = plain.map(|_| forks());
        let heap = plain.and_then(|_| heap()).filter(|&(start, len)| {
            // SAFETY: a flag on the agent's own heap, cleared again right after the fork.
            let marked = unsafe { libc::madvise(start.cast(), len, libc::MADV_DONTFORK) == 0 };
            if !marked {
                // It may have marked what of the range is mapped (a heap that shrank meanwhile).
                unmark(start, len);
            }
            marked
        });
        let enter = match (plain, heap) {
            (Some(c), Some(_)) => Enter::Plain(c),
            _ => Enter::Full(jail),
        };
        // Every signal blocked across the fork: the child sets the agent's handlers back to the
        // default before any can run in it (they would read the heap it lacks).
        let handled = crate::vspawn::handled();
        // SAFETY: an all-zero `sigset_t` is a valid value, overwritten below.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: plain signal-mask calls on the calling thread; `old` is restored below.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        }
        // SAFETY: the child makes only system calls until `execve` or `_exit`, and reads only
        // what it was given here (the jail prepared before, the mapping, descriptors). Without
        // the heap, the system call itself, not glibc's `fork`: the child handlers glibc runs
        // after its fork reset state some of which lives on the heap (stdio locks, the name
        // service's), and the child needs none of it.
        let pid = unsafe {
            match enter {
                Enter::Plain(_) => {
                    libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0, 0, 0, 0)
                        as i32
                }
                Enter::Full(_) => libc::fork(),
            }
        };
        if pid != 0 {
            if let Some((start, len)) = heap {
                unmark(start, len);
            }
            drop(guard);
            // SAFETY: the mask saved above.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
        }
        if pid < 0 {
            // SAFETY: the mapping made above, used by nobody.
            unsafe { libc::munmap(region.cast(), REGION) };
            return None;
        }
        if pid == 0 {
            // SAFETY: in the child, see above.
            unsafe {
                child(
                    enter,
                    handled,
                    procs,
                    go_r.as_raw_fd(),
                    st_w.as_raw_fd(),
                    in_r.as_raw_fd(),
                    out_w.as_raw_fd(),
                    err_w.as_raw_fd(),
                    region.cast::<Header>(),
                )
            }
        }
        // Registered before anything can reap it: the reaper runs on this same thread.
        let exit = reaper.register(pid);
        Some(Standby {
            pid,
            exit,
            go: go_w,
            status: st_r,
            stdin: in_w,
            stdout: out_r,
            stderr: err_r,
            region,
            made: std::time::Instant::now(),
        })
    }

    /// How long ago it was forked. A standby that waited long (in a warm pool sandbox) runs
    /// its command from cold caches: its first exec took half a millisecond more here than
    /// one forked a moment before, so the agent forks it again when the sandbox is claimed
    /// (see [`crate::execcg::ExecCgroups::refresh_standby`]).
    pub(crate) fn age(&self) -> std::time::Duration {
        self.made.elapsed()
    }

    /// Writes the command into the mapping; false when it does not fit or has a NUL.
    fn write_spec(&mut self, program: &str, spec: &ExecSpec) -> bool {
        let mut w = Writer {
            base: self.region,
            used: std::mem::size_of::<Header>().next_multiple_of(16),
        };
        let Some(program) = w.string(program) else {
            return false;
        };
        let Some(cwd) = w.string(&spec.cwd) else {
            return false;
        };
        // argv[0] is the program run, as `Command` gives it (`/bin/sh` standing in for bash).
        let argv: Option<Vec<_>> = std::iter::once(Some(program))
            .chain(spec.argv[1..].iter().map(|a| w.string(a)))
            .collect();
        let envs: Option<Vec<_>> = spec
            .env
            .iter()
            .map(|(k, v)| {
                if k.contains('=') {
                    return None;
                }
                w.string(&format!("{k}={v}"))
            })
            .collect();
        let (Some(argv), Some(envs)) = (argv, envs) else {
            return false;
        };
        let (Some(argv), Some(envp)) = (w.pointers(&argv), w.pointers(&envs)) else {
            return false;
        };
        // SAFETY: the header lies at the start of the mapping, which is ours and big enough.
        unsafe {
            self.region.cast::<Header>().write(Header {
                program,
                argv,
                envp,
                cwd,
                uid: spec.uid,
                gid: spec.gid,
                stdin_null: spec.stdin.is_none() as u32,
            });
        }
        true
    }

    /// Sends the waiting child on to run `spec` (its program being `program`).
    ///
    /// None: the standby cannot be used (dead, not ready within [`READY_WAIT`], the command
    /// does not fit); the caller forks as before. The answer does not wait for the child's
    /// `execve`: [`Started::launch`] tells how it went, read with the command's output.
    pub(crate) async fn run(mut self, program: &str, spec: &ExecSpec) -> Option<Started> {
        let mut status = pipe::Receiver::from_owned_fd(self.status.try_clone().ok()?).ok()?;
        let mut byte = [0u8; 1];
        // Ready at once unless it was made just now (its cgroup move can take a grace period);
        // a child stopped or gone is given up.
        match tokio::time::timeout(READY_WAIT, status.read(&mut byte)).await {
            Ok(Ok(1)) if byte[0] == b'R' => {}
            _ => return None,
        }
        if self.exit.try_recv().is_ok() || !self.write_spec(program, spec) {
            return None;
        }
        // SAFETY: a plain write of one byte on our pipe.
        if unsafe { libc::write(self.go.as_raw_fd(), b"G".as_ptr().cast(), 1) } != 1 {
            return None;
        }
        let (_, exit) = oneshot::channel();
        let exit = std::mem::replace(&mut self.exit, exit);
        let stdin = spec
            .stdin
            .is_some()
            .then(|| self.stdin.try_clone().ok())
            .flatten();
        let (Ok(stdout), Ok(stderr)) = (self.stdout.try_clone(), self.stderr.try_clone()) else {
            // Sent on already: it runs, and its output is lost; the exit is still waited for.
            return None;
        };
        Some(Started {
            pid: self.pid,
            exit,
            stdin,
            stdout,
            stderr,
            launch: Some(status),
        })
    }
}

/// How long an exec waits for a standby that is not ready yet before it forks instead.
const READY_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

impl Drop for Standby {
    /// Unmaps the command (the child has its own copy, or ran `execve`); an unused child reads
    /// EOF on its closed `go` pipe and exits, and the reaper collects it.
    fn drop(&mut self) {
        // SAFETY: the mapping made in `start`, used by nothing else of ours.
        unsafe { libc::munmap(self.region.cast(), REGION) };
    }
}

/// Lays strings and pointer arrays into the mapping.
struct Writer {
    base: *mut u8,
    used: usize,
}

impl Writer {
    fn take(&mut self, len: usize, align: usize) -> Option<*mut u8> {
        let at = self.used.next_multiple_of(align);
        if at + len > REGION {
            return None;
        }
        self.used = at + len;
        // SAFETY: within the mapping (checked above).
        Some(unsafe { self.base.add(at) })
    }

    fn string(&mut self, s: &str) -> Option<*const c_char> {
        let c = CString::new(s).ok()?;
        let bytes = c.as_bytes_with_nul();
        let at = self.take(bytes.len(), 1)?;
        // SAFETY: `at` has room for `bytes` (see `take`).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), at, bytes.len()) };
        Some(at.cast_const().cast())
    }

    fn pointers(&mut self, list: &[*const c_char]) -> Option<*const *const c_char> {
        let size = std::mem::size_of::<*const c_char>();
        let at = self
            .take((list.len() + 1) * size, size)?
            .cast::<*const c_char>();
        // SAFETY: `at` is aligned and has room for the list and its NULL.
        unsafe {
            for (i, p) in list.iter().enumerate() {
                at.add(i).write(*p);
            }
            at.add(list.len()).write(std::ptr::null());
        }
        Some(at.cast_const())
    }
}

/// Reports `errno` on the status pipe and exits.
unsafe fn fail(status: RawFd) -> ! {
    let e = *libc::__errno_location();
    libc::write(status, e.to_ne_bytes().as_ptr().cast(), 4);
    libc::_exit(127)
}

/// The forked child (see the module docs). Only system calls until `execve` or `_exit`.
#[allow(clippy::too_many_arguments)]
unsafe fn child(
    enter: Enter<'_>,
    handled: u64,
    procs: RawFd,
    go: RawFd,
    status: RawFd,
    stdin: RawFd,
    stdout: RawFd,
    stderr: RawFd,
    header: *const Header,
) -> ! {
    // The agent's handlers back to the default while every signal is still blocked (ignored
    // ones stay ignored, but for `SIGPIPE`; the mask is emptied below).
    crate::vspawn::default_handlers(handled);
    // Into the exec's cgroup first, while still the sandbox's root; a child that cannot join
    // exits without saying it is ready, and the exec forks as before.
    if libc::write(procs, b"0".as_ptr().cast(), 1) != 1 {
        libc::_exit(1);
    }
    libc::setsid();
    libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    let fd = libc::open(c"/proc/self/oom_score_adj".as_ptr(), libc::O_WRONLY);
    if fd >= 0 {
        libc::write(fd, b"0".as_ptr().cast(), 1);
        libc::close(fd);
    }
    // As a spawned command starts: no blocked signal, SIGPIPE back to its default.
    let mut none: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut none);
    libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    if libc::dup2(stdout, 1) < 0 || libc::dup2(stderr, 2) < 0 {
        libc::_exit(1);
    }
    // Nothing of the agent's stays open while this child waits (another exec's pipe held
    // here would never see its end).
    let mut keep = [go, status, stdin];
    keep.sort_unstable();
    close_all_but(&keep);
    if libc::write(status, b"R".as_ptr().cast(), 1) != 1 {
        libc::_exit(1);
    }
    let mut byte = 0u8;
    loop {
        match libc::read(go, (&mut byte as *mut u8).cast(), 1) {
            1 => break,
            n if n < 0 && *libc::__errno_location() == libc::EINTR => continue,
            // The agent dropped this standby.
            _ => libc::_exit(0),
        }
    }
    libc::close(go);
    let h = &*header;
    if h.stdin_null != 0 {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null < 0 || libc::dup2(null, 0) < 0 {
            fail(status);
        }
        libc::close(null);
    } else if libc::dup2(stdin, 0) < 0 {
        fail(status);
    }
    libc::close(stdin);
    if libc::chdir(h.cwd) != 0 {
        fail(status);
    }
    let entered = match enter {
        Enter::Plain(c) => c.enter(h.uid, h.gid),
        Enter::Full(jail) => jail.enter(h.uid, h.gid),
    };
    if let Err(e) = entered {
        *libc::__errno_location() = e.raw_os_error().unwrap_or(libc::EPERM);
        fail(status);
    }
    environ = h.envp;
    libc::execvp(h.program, h.argv);
    fail(status)
}

/// Held by whoever forks the agent: a standby forked without the agent's heap, and every
/// `Command` spawn (which forks when it has a `pre_exec`, and whose child then runs code that
/// reads the heap). A fork on another thread while the heap is marked would give its child
/// none.
pub(crate) fn forks() -> std::sync::MutexGuard<'static, ()> {
    static FORKS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    FORKS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How the child confines itself: with a [`Confinement`] when it was forked without the
/// agent's heap, else with the whole [`Jail`] (on the heap, which it then has).
#[derive(Clone, Copy)]
enum Enter<'a> {
    Plain(Confinement),
    Full(&'a Jail),
}

/// Whether the heap may be marked for a standby's fork: false for good once a mark could not
/// be cleared (never seen; every later `Command` child would lack the heap otherwise).
static MARKING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Clears the heap's mark after a standby's fork; a failure is tried once more, then marking
/// stops.
fn unmark(start: *mut u8, len: usize) {
    // SAFETY: a flag on the agent's own heap.
    let clear = || unsafe { libc::madvise(start.cast(), len, libc::MADV_DOFORK) == 0 };
    if !clear() && !clear() {
        MARKING.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The agent's heap (the `brk` area, where its allocator keeps the main arena): where it
/// starts (`start_brk` in `/proc/self/stat`, read once) and its length now. None without one,
/// or once marking stopped ([`unmark`]).
fn heap() -> Option<(*mut u8, usize)> {
    static START: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    if !MARKING.load(std::sync::atomic::Ordering::SeqCst) {
        return None;
    }
    let start = (*START.get_or_init(|| {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Field 47, `start_brk`: the 45th after the command's name in parentheses.
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(44)?
            .parse()
            .ok()
    }))?;
    // SAFETY: `sbrk(0)` only reads the current end of the heap.
    let end = unsafe { libc::sbrk(0) } as usize;
    // The child needs its thread's own block (errno, the stack's canary): in a dynamically
    // linked program the loader maps it apart, but a static one keeps it on the heap.
    // SAFETY: the address of the calling thread's errno.
    let tls = unsafe { libc::__errno_location() } as usize;
    (start > 0 && end > start && !(start..end).contains(&tls))
        .then_some((start as *mut u8, end - start))
}
