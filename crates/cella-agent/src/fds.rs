//! Descriptors for the agent's children: a close-on-exec pipe, and closing every descriptor
//! but a few between fork and exec (`close_range`, with a bound gVisor takes too).

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// A pipe, both ends close-on-exec.
pub(crate) fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: a plain system call filling `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both were just made and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The `last` of a `close_range` that reaches every descriptor: Linux takes any number and
/// stops at its table's end, gVisor refuses one past `i32::MAX` (EINVAL: nothing closed).
pub(crate) const LAST_FD: u32 = i32::MAX as u32;

/// Closes every descriptor from 3 up but those in `keep` (sorted).
///
/// # Safety
/// Only system calls: callable between fork and exec.
pub(crate) unsafe fn close_all_but(keep: &[RawFd]) {
    let mut from: u32 = 3;
    for &k in keep {
        let k = k as u32;
        if k > from {
            libc::syscall(libc::SYS_close_range, from, k - 1, 0u32);
        }
        from = from.max(k + 1);
    }
    libc::syscall(libc::SYS_close_range, from, LAST_FD, 0u32);
}
