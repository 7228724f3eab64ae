//! Reaping a sandbox's first process.
//!
//! The first process of a sandbox (the namespace runtime's init, gVisor's `runsc`) is the
//! server's child: the launcher that starts it exits at once, and the server is a child
//! subreaper. At a destroy, a stop or a pause to disk the driver kills it and must collect its
//! exit status, or it stays a zombie for as long as the server runs. Killed PID 1 of a PID
//! namespace exits only once the kernel has torn the namespace's other processes down, which on
//! a loaded host can take longer than a caller should wait; [`reap`] then leaves the wait to a
//! thread of its own.
//!
//! Only a process that is still the one the handle recorded (the server's child, with the
//! recorded start time; a zombie keeps both) is waited for: a pid that has been reused since,
//! by another child of the server say, is never collected here behind its owner's back.

use std::time::Duration;

/// How long [`reap`] waits for the process to exit before leaving the wait to a thread.
const INLINE_WAIT: Duration = Duration::from_millis(200);

/// Collects the exit status of `pid` if it is the server's child started at `start_time`
/// (clock ticks after boot, as in `/proc/<pid>/stat`): at once if it has exited, else after up
/// to [`INLINE_WAIT`], else on a thread that waits until it has.
pub fn reap(pid: i32, start_time: u64) {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    if !is_own_child(pid, start_time) {
        return;
    }
    let target = nix::unistd::Pid::from_raw(pid);
    let until = std::time::Instant::now() + INLINE_WAIT;
    loop {
        match waitpid(target, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) if std::time::Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Ok(WaitStatus::StillAlive) => break,
            _ => return,
        }
    }
    tracing::debug!(pid, "still exiting: reaped on a thread of its own");
    let spawned = std::thread::Builder::new()
        .name("cella-reap".into())
        .spawn(move || {
            let _ = waitpid(target, None);
        });
    if let Err(e) = spawned {
        tracing::warn!(pid, "no thread to reap a sandbox's process: {e}");
    }
}

/// Whether `pid` is this process's child started at `start_time` (exited and not yet
/// collected counts: a zombie keeps its parent and start time).
fn is_own_child(pid: i32, start_time: u64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return false;
    };
    // After the command: state (field 3), parent (4), ..., start time (22).
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let parent = fields.get(1).and_then(|f| f.parse::<u32>().ok());
    let started = fields.get(19).and_then(|f| f.parse::<u64>().ok());
    parent == Some(std::process::id()) && started == Some(start_time)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state_and_start(pid: i32) -> Option<(String, u64)> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = stat.rsplit_once(')')?.1.to_string();
        let f: Vec<&str> = rest.split_whitespace().collect();
        Some((f[0].to_string(), f[19].parse().ok()?))
    }

    /// A child that takes longer to exit than the inline wait is still collected: it leaves
    /// no zombie.
    #[test]
    fn a_slow_child_is_reaped_and_leaves_no_zombie() {
        let child = std::process::Command::new("sleep")
            .arg("0.6")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        // The driver knows only the pid and its start time, not the `Child`.
        std::mem::forget(child);
        let (_, start) = state_and_start(pid).unwrap();
        let t = std::time::Instant::now();
        reap(pid, start);
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "reap waited inline"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while state_and_start(pid).is_some() {
            assert!(
                std::time::Instant::now() < deadline,
                "pid {pid} stays: {:?}",
                state_and_start(pid)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A pid whose start time is not the recorded one (reused) is left to its owner.
    #[test]
    fn a_reused_pid_is_not_collected() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        // Exited, not yet collected by its owner.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while state_and_start(pid).map(|s| s.0) != Some("Z".into()) {
            assert!(std::time::Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(5));
        }
        let (_, start) = state_and_start(pid).unwrap();
        reap(pid, start + 1);
        // Its owner still gets its status.
        assert!(child.wait().unwrap().success());
    }
}
