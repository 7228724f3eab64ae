//! Child processes in process groups of their own: spawning, signalling the group, exit codes.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};

/// Makes `cmd` start in a new process group (its pid is the group's id) and die with SIGKILL
/// when the thread that spawned it ends (the supervisor dying must not leave an agent behind).
pub fn own_group(cmd: &mut Command) {
    cmd.process_group(0);
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            );
            Ok(())
        });
    }
}

/// Sends `sig` to the process group led by `child` (errors, e.g. the group is gone, ignored).
pub fn signal_group(child: &Child, sig: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(child.id()) else {
        return;
    };
    if pid > 1 {
        // SAFETY: kill(2) on a negative pid signals that process group only.
        unsafe {
            libc::kill(-pid, sig);
        }
    }
}

/// The shell's convention: the exit code, or 128 + the signal that killed the process.
pub fn exit_code(status: ExitStatus) -> i32 {
    if let Some(c) = status.code() {
        c
    } else if let Some(s) = status.signal() {
        128 + s
    } else {
        1
    }
}
