//! A cgroup per exec, so that a timeout (or a caller hanging up) kills everything the exec
//! started, whatever sessions, process groups or parents its processes made for themselves.
//!
//! The launcher hands the agent a directory descriptor of the sandbox's own cgroup (the freezer
//! hierarchy on cgroup v1, the unified one on v2), opened before the root was pivoted and
//! delegated to the sandbox's root: only that directory and its `cgroup.procs`, never a limit
//! file. Nothing inside the sandbox can name it: no cgroup file system is mounted there and
//! mounting is refused.
//!
//! For each exec the agent makes a child cgroup `exec-<n>` and opens its `cgroup.procs`; the
//! command writes itself into it between fork and exec (before it drops to its user), so it and
//! every process it ever forks are members. A process cannot leave: moving needs write access to
//! another cgroup's `cgroup.procs`, which only the agent holds. At a timeout the group is killed
//! with `cgroup.kill` (v2) or frozen, killed and thawed (v1: frozen processes cannot fork while the
//! members are read). An exec that ends on its own leaves its leftovers running, as documented;
//! its cgroup is removed once empty (tried again at every later exec).
//!
//! The `mkdir` is off an exec's path: once an exec has answered, or its command has run a few
//! milliseconds (and when the agent starts), the agent makes the next exec's cgroup ahead, with its `cgroup.procs` open and the
//! next command's process already waiting in it ([`crate::standby`]); the next exec takes both
//! (a fresh group all the same: no process of another exec was ever in it). An exec that ends
//! removes its own cgroup, or leaves it to be removed once its leftovers have ended.
//!
//! No descriptor (an agent run outside a sandbox, a host without a freezer): [`ExecCgroups`] is
//! absent and the agent falls back to [`crate::spawn::kill_tree`], a process-tree walk.

use crate::harden::Jail;
use crate::spawn::Reaper;
use crate::standby::Standby;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The sandbox's cgroup directory, under which exec cgroups are made.
pub struct ExecCgroups {
    dir: OwnedFd,
    v2: bool,
    /// A v1 hierarchy with the freezer (the host's); false for gVisor's `pids` hierarchy, whose
    /// groups are killed by reading and killing their members until none is left.
    freezer: bool,
    /// Whether the next exec's process may be forked ahead ([`crate::standby`]).
    prefork: bool,
    /// Whether a process moves into a group without waiting (gVisor's hierarchy; on Linux a move
    /// can wait for an RCU grace period): then a command joins its group from a child that
    /// shares the agent's memory ([`crate::vspawn`]).
    cheap_moves: bool,
    next: AtomicU64,
    /// Exec cgroups whose processes outlived the exec; removed once empty.
    stale: Mutex<Vec<String>>,
    /// The next exec's cgroup, made ahead (its name and open `cgroup.procs`), and the next
    /// exec's process waiting in it (see [`crate::standby`]).
    ready: Mutex<Option<Ready>>,
    /// What a [`Standby`] needs; set once the agent runs (none: execs fork as before).
    standby: OnceLock<(Arc<Reaper>, Arc<Jail>)>,
}

struct Ready {
    name: String,
    procs: OwnedFd,
    standby: Option<Standby>,
}

/// One exec's cgroup.
pub struct ExecGroup<'a> {
    parent: &'a ExecCgroups,
    name: String,
    procs: OwnedFd,
    standby: Option<Standby>,
}

fn cstr(s: &str) -> CString {
    CString::new(s).expect("cgroup names have no NUL")
}

impl std::fmt::Debug for ExecCgroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecCgroups")
            .field("dir", &self.dir)
            .field("v2", &self.v2)
            .finish_non_exhaustive()
    }
}

impl ExecCgroups {
    /// `dir`: the sandbox's cgroup directory (v1 freezer or v2 unified), writable by the agent.
    pub fn new(dir: OwnedFd, v2: bool) -> ExecCgroups {
        ExecCgroups {
            dir,
            v2,
            freezer: !v2,
            prefork: true,
            cheap_moves: false,
            next: AtomicU64::new(1),
            stale: Mutex::new(Vec::new()),
            ready: Mutex::new(None),
            standby: OnceLock::new(),
        }
    }

    /// `dir`: the root of gVisor's own `pids` cgroup hierarchy, which the agent mounted inside
    /// the sandbox (runsc 20221219 has no freezer there, nor `cgroup.kill`; membership follows
    /// every fork, `setsid` or not). No process is forked ahead there: a fork of the agent
    /// holds its host-backed sockets until its `execve`, and gVisor's checkpoint refuses those.
    pub fn gvisor(dir: OwnedFd) -> ExecCgroups {
        ExecCgroups {
            freezer: false,
            prefork: false,
            cheap_moves: true,
            ..ExecCgroups::new(dir, false)
        }
    }

    /// Lets execs start in a process made ahead ([`Standby`]), and makes the first exec's
    /// cgroup and process now.
    pub(crate) fn enable_standby(&self, reaper: Arc<Reaper>, jail: Arc<Jail>) {
        if !self.prefork {
            return;
        }
        let _ = self.standby.set((reaper, jail));
        self.make_ready();
    }

    fn open(&self, rel: &str, flags: libc::c_int) -> std::io::Result<OwnedFd> {
        let c = cstr(rel);
        // SAFETY: a plain system call on a descriptor we own and a NUL-terminated path.
        let fd = unsafe {
            libc::openat(
                self.dir.as_raw_fd(),
                c.as_ptr(),
                flags | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn rmdir(&self, name: &str) -> bool {
        let c = cstr(name);
        // SAFETY: as above.
        unsafe { libc::unlinkat(self.dir.as_raw_fd(), c.as_ptr(), libc::AT_REMOVEDIR) == 0 }
    }

    /// A fresh cgroup for one exec (None when it cannot be made: the caller falls back): the
    /// one made ahead, else a new one.
    pub fn group(&self) -> Option<ExecGroup<'_>> {
        self.sweep();
        let ready = match self.ready.lock().expect("exec cgroup lock").take() {
            Some(made) => made,
            None => self.make()?,
        };
        Some(ExecGroup {
            parent: self,
            name: ready.name,
            procs: ready.procs,
            standby: ready.standby,
        })
    }

    /// A new cgroup of its own, not the one made ahead for the next exec (a terminal's
    /// session: its programs are killed as one at a hang-up). None when it cannot be made.
    pub fn fresh_group(&self) -> Option<ExecGroup<'_>> {
        self.sweep();
        let made = self.make()?;
        Some(ExecGroup {
            parent: self,
            name: made.name,
            procs: made.procs,
            standby: None,
        })
    }

    /// Makes the next exec's cgroup now, and its process in it, unless made already.
    pub(crate) fn make_ready(&self) {
        let mut ready = self.ready.lock().expect("exec cgroup lock");
        if ready.is_none() {
            *ready = self.make();
            if let (Some(r), Some((reaper, jail))) = (ready.as_mut(), self.standby.get()) {
                r.standby = Standby::start(jail, r.procs.as_raw_fd(), reaper);
            }
        }
    }

    /// Forks the next exec's process again when the one waiting is older than `older_than`
    /// (or gone), in the same exec cgroup: the old one exits without having run anything, so
    /// no command ever ran in that group. Called when a warm pool sandbox is claimed, after
    /// the answer: its first exec then starts in a process made a moment before.
    pub(crate) fn refresh_standby(&self, older_than: Duration) {
        let Some((reaper, jail)) = self.standby.get() else {
            return;
        };
        let mut ready = self.ready.lock().expect("exec cgroup lock");
        let Some(r) = ready.as_mut() else {
            return;
        };
        if r.standby.as_ref().is_some_and(|s| s.age() < older_than) {
            return;
        }
        // Dropped first: its `go` pipe closes and it exits (the reaper collects it).
        r.standby = None;
        r.standby = Standby::start(jail, r.procs.as_raw_fd(), reaper);
    }

    /// A new, empty exec cgroup and its `cgroup.procs`, open for writing.
    fn make(&self) -> Option<Ready> {
        let name = format!("exec-{}", self.next.fetch_add(1, Ordering::Relaxed));
        let c = cstr(&name);
        // SAFETY: as above.
        if unsafe { libc::mkdirat(self.dir.as_raw_fd(), c.as_ptr(), 0o755) } != 0 {
            return None;
        }
        match self.open(&format!("{name}/cgroup.procs"), libc::O_WRONLY) {
            Ok(procs) => Some(Ready {
                name,
                procs,
                standby: None,
            }),
            Err(_) => {
                self.rmdir(&name);
                None
            }
        }
    }

    /// Removes the exec cgroups whose last process has ended.
    fn sweep(&self) {
        let mut stale = self.stale.lock().expect("exec cgroup lock");
        stale.retain(|name| !self.rmdir(name));
    }
}

impl ExecGroup<'_> {
    /// The descriptor the command writes `0` (itself) into between fork and exec.
    pub fn procs_fd(&self) -> RawFd {
        self.procs.as_raw_fd()
    }

    /// How the command joins this group (see [`crate::spawn::Join`]).
    pub(crate) fn join(&self) -> crate::spawn::Join {
        crate::spawn::Join {
            fd: self.procs.as_raw_fd(),
            cheap: self.parent.cheap_moves,
        }
    }

    /// The process waiting in this cgroup for the exec's command, if one was made ahead.
    pub(crate) fn take_standby(&mut self) -> Option<Standby> {
        self.standby.take()
    }

    fn read(&self, file: &str) -> String {
        let Ok(fd) = self
            .parent
            .open(&format!("{}/{file}", self.name), libc::O_RDONLY)
        else {
            return String::new();
        };
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut std::fs::File::from(fd), &mut s);
        s
    }

    fn write(&self, file: &str, value: &str) -> bool {
        let Ok(fd) = self
            .parent
            .open(&format!("{}/{file}", self.name), libc::O_WRONLY)
        else {
            return false;
        };
        std::io::Write::write_all(&mut std::fs::File::from(fd), value.as_bytes()).is_ok()
    }

    fn members(&self) -> Vec<i32> {
        self.read("cgroup.procs")
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Kills every process of the group (without waiting for them to be reaped), never the
    /// sandbox's init nor the agent, whichever group root inside wrote them into.
    pub fn kill(&self) {
        let own = std::process::id() as i32;
        let spared = move |p: i32| p == 1 || p == own;
        let sigkill = |pids: &[i32]| {
            for p in pids.iter().filter(|p| !spared(**p)) {
                // SAFETY: a plain system call.
                unsafe { libc::kill(*p, libc::SIGKILL) };
            }
        };
        // Members killed again and again (for at most 2 s) until only the dead are left: what
        // one forks meanwhile joins the group.
        let kill_until_empty = || {
            let deadline = Instant::now() + Duration::from_secs(2);
            loop {
                let alive: Vec<i32> = self
                    .members()
                    .into_iter()
                    .filter(|p| !spared(*p) && !dead(*p))
                    .collect();
                if alive.is_empty() || Instant::now() >= deadline {
                    break;
                }
                sigkill(&alive);
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        if self.parent.v2 {
            if !self.write("cgroup.kill", "1") {
                // Kernels before 5.14: freeze, kill what is there, thaw. Frozen once the
                // kernel says so (`cgroup.freeze` holds only the request): a process forked
                // before that would not be among the members read.
                self.write("cgroup.freeze", "1");
                let deadline = Instant::now() + Duration::from_secs(2);
                while !self
                    .read("cgroup.events")
                    .lines()
                    .any(|l| l.trim() == "frozen 1")
                    && Instant::now() < deadline
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
                sigkill(&self.members());
                self.write("cgroup.freeze", "0");
            }
        } else if !self.parent.freezer {
            // Killed until none is left: what a member forks meanwhile joins the group, and
            // the sandbox's task limit bounds how many there can be.
            kill_until_empty();
        } else {
            self.write("freezer.state", "FROZEN");
            let deadline = Instant::now() + Duration::from_secs(2);
            while self.read("freezer.state").trim() != "FROZEN" && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            sigkill(&self.members());
            self.write("freezer.state", "THAWED");
            // A group that kept forking may not have reached FROZEN by the deadline (seen on a
            // loaded host: three processes of a fork loop outlived a timeout); what it forked
            // after the members were read is killed now, until only the dead are left.
            kill_until_empty();
        }
        // Frozen (v1) or killed at once (v2): nothing forked away while the members were read.
        // The dead leave the group when the agent reaps them; the cgroup goes with the group.
    }
}

/// Whether process `pid` has ended (a zombie waiting for the reaper) or is gone.
fn dead(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        // The state follows the command name, which is in parentheses and may hold anything.
        stat.rfind(')')
            .and_then(|i| stat.get(i + 2..i + 3))
            .is_some_and(|state| state == "Z" || state == "X")
    })
}

impl Drop for ExecGroup<'_> {
    /// The exec is over (its answer sent): its cgroup goes now if empty, or once its leftovers
    /// have ended; and the next exec's is made, unless it was made while this one ran.
    fn drop(&mut self) {
        if !self.parent.rmdir(&self.name) {
            self.parent
                .stale
                .lock()
                .expect("exec cgroup lock")
                .push(std::mem::take(&mut self.name));
        }
        self.parent.make_ready();
    }
}
