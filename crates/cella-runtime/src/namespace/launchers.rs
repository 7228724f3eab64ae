//! A launcher started ahead: `cella __sandbox-init`, spawned before a boot needs it and waiting
//! for its start ([`super::launch::Start`]).
//!
//! Starting the launcher is a spawn from the server (a `vfork` of a large, threaded process), an
//! `exec` of the whole `cella` binary, its dynamic linking and some hundreds of page faults
//! before `main`: 1.5-3 ms of a cold boot on a host whose page faults are slow (a nested VM).
//! One is kept ready, so a boot starts by writing a line. The next one is started on a thread of
//! its own once a boot took the last, off the boot's path, [`REFILL_DELAY`] after the boot
//! answered (so it does not take a core from the new sandbox's first command); a boot that
//! finds none ready starts one itself, as before.
//!
//! A waiting launcher holds nothing of a sandbox: it is in the server's cgroup, with an empty
//! environment and its standard error on `/dev/null` (its start names the setup log it
//! opens), and has made only what needs no sandbox (its mount, UTS, IPC and network namespaces,
//! `super::launch::ahead`, the user namespace for the server's id map and the network link of
//! a free slot, given on a line written as it starts: `super::launch::Ahead`). That link holds
//! one slot of the sandbox subnet while it waits (its host end down, without a firewall chain). When its standard input closes (the server
//! stopped, or was killed: the pipe goes with the process) it reads the end of it, answers an
//! error nobody reads and exits, its namespaces with it, so nothing outlives a server.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// How long after a boot the next launcher is started. Its start is some milliseconds of CPU
/// (see the module docs), which on a host of two cores came out of the end of the boot (the
/// agent's ping, the answer) and the first command sent to the sandbox just made: cold creates
/// 250 ms apart, each followed by an exec (three rounds of 30, each a fresh server), took
/// 12.9-13.8 ms + 3.1-3.3 ms for the exec with the start at once, and 10.0-12.5 + 2.4-3.0 with
/// it 30 ms later. A boot within the delay starts its own launcher, as one finding none ready
/// always did.
pub(crate) const REFILL_DELAY: std::time::Duration = std::time::Duration::from_millis(30);

/// The launcher kept ready (none while `on` is false: each boot starts its own).
#[derive(Clone)]
pub(crate) struct Launchers {
    inner: Arc<Inner>,
}

struct Inner {
    exe: PathBuf,
    on: bool,
    /// Written to every launcher as soon as it is started (a [`super::launch::AheadLine`], or
    /// nothing): made at each start (its network slot is the driver's guess of the moment).
    prelude: Prelude,
    ready: Mutex<Option<Child>>,
    /// A thread is starting the next one.
    starting: AtomicBool,
}

/// Makes the line written to a launcher as it starts.
pub(crate) type Prelude = Box<dyn Fn() -> Vec<u8> + Send + Sync>;

impl Launchers {
    pub(crate) fn new(exe: PathBuf, on: bool, prelude: Prelude) -> Launchers {
        Launchers {
            inner: Arc::new(Inner {
                exe,
                on,
                prelude,
                ready: Mutex::new(None),
                starting: AtomicBool::new(false),
            }),
        }
    }

    /// A launcher waiting for its start: the one kept ready (a new one is then started
    /// behind it), or one started now.
    pub(crate) fn take(&self) -> std::io::Result<Child> {
        let ready = self
            .inner
            .ready
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match ready {
            // Still waiting (it exits only when its input closes, or if killed from outside).
            Some(mut c) => match c.try_wait() {
                Ok(None) => Ok(c),
                _ => {
                    let _ = c.wait();
                    spawn(&self.inner.exe, &(self.inner.prelude)())
                }
            },
            None => spawn(&self.inner.exe, &(self.inner.prelude)()),
        }
    }

    /// Starts the next launcher on a thread of its own, unless one is ready or starting.
    pub(crate) fn refill(&self) {
        if !self.inner.on || self.inner.starting.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = self.inner.clone();
        let started = std::thread::Builder::new()
            .name("cella-launcher".into())
            .spawn(move || {
                std::thread::sleep(REFILL_DELAY);
                let empty = inner
                    .ready
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .is_none();
                if empty {
                    match spawn(&inner.exe, &(inner.prelude)()) {
                        Ok(c) => {
                            let mut slot = inner.ready.lock().unwrap_or_else(|p| p.into_inner());
                            // Taken and refilled meanwhile: the newer one stays.
                            if let Some(extra) = slot.replace(c) {
                                end(extra);
                            }
                        }
                        Err(e) => tracing::warn!("starting a launcher ahead: {e}"),
                    }
                }
                inner.starting.store(false, Ordering::Release);
            });
        if started.is_err() {
            self.inner.starting.store(false, Ordering::Release);
        }
    }

    /// The pid of the launcher kept ready (tests).
    #[cfg(test)]
    fn ready_pid(&self) -> Option<u32> {
        self.inner
            .ready
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|c| c.id())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(c) = self
            .ready
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            end(c);
        }
    }
}

/// Starts `cella __sandbox-init` (its name in the process table is `cella`, with no host path)
/// and writes `prelude` to it (a line well under a pipe's buffer: the write never waits).
pub(crate) fn spawn(exe: &std::path::Path, prelude: &[u8]) -> std::io::Result<Child> {
    let mut c = Command::new(exe)
        .arg0("cella")
        // The sandbox's PID 1 must carry nothing of the server's environment (keys, paths).
        .env_clear()
        .arg("__sandbox-init")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    if !prelude.is_empty() {
        use std::io::Write;
        let sent = match c.stdin.as_mut() {
            Some(input) => input.write_all(prelude),
            None => Err(std::io::Error::other("no launcher stdin")),
        };
        if let Err(e) = sent {
            end(c);
            return Err(e);
        }
    }
    Ok(c)
}

/// Waits for a launcher that answered, on the reaping thread, then drops `after` (the disk
/// pool's detached mount of the sandbox's file system, which the sandbox's own mount holds by
/// then: dissolving a mount can wait for an RCU grace period). Both are off the boot's path; the
/// sandbox the launcher started is not its child. Done here when that thread cannot be had.
pub(crate) fn reap<T: Send + 'static>(c: Child, after: T) {
    static REAPER: crate::serial::Serial = crate::serial::Serial::new("cella-reap");
    let mut c = c;
    REAPER.run(move || {
        let _ = c.wait();
        drop(after);
    });
}

/// Ends a launcher that was never given a start: its input closes and it exits (after letting
/// its user namespace's helper go and reaping it, if it was making that namespace: killed
/// then, the helper would be left to the server, a subreaper, as a zombie); killed if it has
/// not within [`END_GRACE`]. Reaped.
fn end(mut c: Child) {
    drop(c.stdin.take());
    let deadline = std::time::Instant::now() + END_GRACE;
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let _ = c.kill();
    let _ = c.wait();
}

/// How long a launcher whose input closed has to exit on its own (see [`end`]).
const END_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

#[cfg(test)]
mod tests {
    use super::*;

    /// `sh` stands in for the launcher: it waits on its input like one.
    fn fake() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("launcher");
        std::fs::write(&exe, "#!/bin/sh\nread line\necho \"got $line\"\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        (dir, exe)
    }

    fn wait_ready(l: &Launchers) -> u32 {
        for _ in 0..500 {
            if let Some(pid) = l.ready_pid() {
                return pid;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("no launcher was started ahead");
    }

    fn alive(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.contains(") Z "))
            .unwrap_or(false)
    }

    #[test]
    fn a_take_gets_the_one_started_ahead_and_the_next_follows() {
        use std::io::{Read, Write};
        let (_dir, exe) = fake();
        let l = Launchers::new(exe, true, Box::new(Vec::new));
        // Nothing ready yet: a take starts one at once.
        let mut first = l.take().unwrap();
        assert_eq!(l.ready_pid(), None);
        l.refill();
        let ahead = wait_ready(&l);
        // The next take is the one started ahead; it waited for its line and answers it.
        let mut c = l.take().unwrap();
        assert_eq!(c.id(), ahead);
        assert_eq!(l.ready_pid(), None);
        writeln!(c.stdin.take().unwrap(), "start").unwrap();
        let mut out = String::new();
        c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        assert_eq!(out, "got start\n");
        assert!(c.wait().unwrap().success());
        drop(first.stdin.take());
        first.wait().unwrap();
        // A refill while one is ready changes nothing.
        l.refill();
        let again = wait_ready(&l);
        l.refill();
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert_eq!(l.ready_pid(), Some(again));
        // Dropping the last handle ends the one kept ready (a refill's thread holds a handle
        // until it has looked: under load that can outlast the sleep above).
        drop(l);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while alive(again) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!alive(again), "a launcher kept ready outlived its pool");
    }

    #[test]
    fn a_launcher_that_died_while_waiting_is_not_handed_out() {
        let (_dir, exe) = fake();
        let l = Launchers::new(exe, true, Box::new(Vec::new));
        l.refill();
        let pid = wait_ready(&l);
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let c = l.take().unwrap();
        assert_ne!(c.id(), pid);
        assert!(!alive(pid));
        end(c);
    }

    /// Each launcher gets the line as it is at its start (the network slot guessed then).
    #[test]
    fn each_launcher_gets_its_prelude_made_at_its_start() {
        use std::io::Read;
        let (_dir, exe) = fake();
        let n = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let count = n.clone();
        let prelude =
            move || format!("slot{}\n", count.fetch_add(1, Ordering::SeqCst)).into_bytes();
        let l = Launchers::new(exe, true, Box::new(prelude));
        for want in ["got slot0\n", "got slot1\n"] {
            let mut c = l.take().unwrap();
            drop(c.stdin.take());
            let mut out = String::new();
            c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
            assert_eq!(out, want);
            c.wait().unwrap();
        }
    }

    #[test]
    fn off_starts_none_ahead() {
        let (_dir, exe) = fake();
        let l = Launchers::new(exe, false, Box::new(Vec::new));
        l.refill();
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert_eq!(l.ready_pid(), None);
        end(l.take().unwrap());
    }
}
