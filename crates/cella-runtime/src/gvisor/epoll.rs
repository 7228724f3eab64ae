//! Why the agent in gVisor quiets an epoll interest before it deletes it.
//!
//! runsc 20221219 can resurrect deleted epoll interests at a restore. Its epoll keeps interests
//! on intrusive lists: `epoll_wait` moves the edge-triggered ones it reported to a local list and
//! never unlinks them from it, so an interest keeps pointers to the others reported in the same
//! call. An interest deleted later (`EPOLL_CTL_DEL`, then `close`) stays reachable through such a
//! pointer from a live one; the checkpoint saves it, and the restore marks every saved interest
//! ready again. The first `epoll_wait` after the restore then reports the deleted one too (a pipe
//! whose writers are gone reads as `EPOLLHUP`) with its old user data. For tokio that data is the
//! address of the registration's `ScheduledIo`, freed since: its I/O driver dereferences it and
//! the agent (PID 1) dies of a `SIGSEGV` right after the restore, every time that image is
//! restored. gVisor fixed it upstream in 2026 (the local lists are emptied, and deleted interests
//! are skipped at a restore); Debian's runsc predates that.
//!
//! Seen with runsc's `--strace`: the restored agent's first `epoll_wait` returned `EPOLLHUP`
//! for two addresses that the agent had registered for an exec's stdout and stderr pipes and
//! deleted before the checkpoint; tokio's `dispatch_event` faulted on the first of them.
//!
//! The work-around: in the gVisor agent, every `EPOLL_CTL_DEL` is preceded by an
//! `EPOLL_CTL_MOD` that sets the interest's user data to 0, so an interest that comes back
//! reports token 0, which tokio's driver takes as a plain wake-up; and makes it edge-triggered
//! and one-shot ([`QUIET_EVENTS`]), so it wakes the agent once. Level-triggered (events none, as
//! this first did), a hung-up pipe's interest reported `EPOLLHUP`, which needs no asking, at
//! every `epoll_wait`: a restored agent now and then spun at 100% of a core for good.
//! This wraps libc's `epoll_ctl` for the whole executable (mio calls it by that name), and does
//! nothing more than libc's unless [`quiet_deleted_interests`] was called, which only the gVisor
//! agent does, before its runtime starts.

use std::sync::atomic::{AtomicBool, Ordering};

static QUIET: AtomicBool = AtomicBool::new(false);

/// What an interest is set to before its deletion: edge-triggered and one-shot, no events
/// asked for (the ones that need no asking, `EPOLLHUP` and `EPOLLERR`, are reported once).
pub const QUIET_EVENTS: u32 = (libc::EPOLLET | libc::EPOLLONESHOT) as u32;

/// From now on, an `EPOLL_CTL_DEL` in this process first sets the interest's user data to 0.
pub fn quiet_deleted_interests() {
    QUIET.store(true, Ordering::SeqCst);
    // Keeps the wrapper below in the link (its object defines `epoll_ctl`).
    std::hint::black_box(epoll_ctl as *const () as usize);
}

/// libc's `epoll_ctl`, made as the system call, with the quieting above when it is on.
///
/// # Safety
/// As for libc's `epoll_ctl`: `event` points to a valid `epoll_event` where `op` needs one.
#[no_mangle]
pub unsafe extern "C" fn epoll_ctl(
    epfd: libc::c_int,
    op: libc::c_int,
    fd: libc::c_int,
    event: *mut libc::epoll_event,
) -> libc::c_int {
    if op == libc::EPOLL_CTL_DEL && QUIET.load(Ordering::Relaxed) {
        let mut quiet = libc::epoll_event {
            events: QUIET_EVENTS,
            u64: 0,
        };
        // Fails as the deletion will (not registered, bad descriptor): its error is that one's.
        // SAFETY: `quiet` is a valid event for the call's duration.
        unsafe {
            libc::syscall(
                libc::SYS_epoll_ctl,
                epfd,
                libc::EPOLL_CTL_MOD,
                fd,
                &mut quiet as *mut libc::epoll_event,
            )
        };
    }
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe { libc::syscall(libc::SYS_epoll_ctl, epfd, op, fd, event) as libc::c_int }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// The wrapper behaves as libc's: add, modify, delete, and the errors of a bad call.
    #[test]
    fn the_wrapper_adds_modifies_and_deletes_as_libc_does() {
        quiet_deleted_interests();
        // SAFETY: plain system calls on descriptors this test owns.
        unsafe {
            let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            assert!(ep >= 0);
            let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: 77,
            };
            assert_eq!(
                epoll_ctl(ep, libc::EPOLL_CTL_ADD, a.as_raw_fd(), &mut ev),
                0
            );
            std::io::Write::write_all(&mut &b, b"x").unwrap();
            let mut out = [libc::epoll_event { events: 0, u64: 0 }; 4];
            assert_eq!(libc::epoll_wait(ep, out.as_mut_ptr(), 4, 1000), 1);
            let data = out[0].u64;
            assert_eq!(data, 77);
            assert_eq!(
                epoll_ctl(ep, libc::EPOLL_CTL_DEL, a.as_raw_fd(), std::ptr::null_mut()),
                0
            );
            assert_eq!(libc::epoll_wait(ep, out.as_mut_ptr(), 4, 0), 0);
            // Deleting again: ENOENT, as libc's.
            assert_eq!(
                epoll_ctl(ep, libc::EPOLL_CTL_DEL, a.as_raw_fd(), std::ptr::null_mut()),
                -1
            );
            assert_eq!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::ENOENT)
            );
            libc::close(ep);
        }
    }

    /// An interest as a restore brings it back (quieted, its file hung up) wakes a waiter once,
    /// with token 0; not at every wait, as a level-triggered one does (the spin this fixed).
    #[test]
    fn a_quieted_interest_that_comes_back_wakes_once() {
        // SAFETY: plain system calls on descriptors this test owns.
        unsafe {
            let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            assert!(ep >= 0);
            let mut fds = [0; 2];
            assert_eq!(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC), 0);
            let waits = |events: u32| {
                let mut ev = libc::epoll_event { events, u64: 0 };
                assert_eq!(libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fds[0], &mut ev), 0);
                let mut out = [libc::epoll_event { events: 0, u64: 9 }; 4];
                let n: Vec<i32> = (0..3)
                    .map(|_| libc::epoll_wait(ep, out.as_mut_ptr(), 4, 0))
                    .collect();
                assert_eq!(
                    libc::epoll_ctl(ep, libc::EPOLL_CTL_DEL, fds[0], std::ptr::null_mut()),
                    0
                );
                (n, out[0].u64, out[0].events)
            };
            libc::close(fds[1]);
            let (n, data, events) = waits(QUIET_EVENTS);
            assert_eq!(n, vec![1, 0, 0], "woken once");
            assert_eq!(data, 0);
            assert_ne!(events & libc::EPOLLHUP as u32, 0);
            // What the work-around first set: reported at every wait.
            let (n, _, _) = waits(0);
            assert_eq!(n, vec![1, 1, 1]);
            libc::close(fds[0]);
            libc::close(ep);
        }
    }
}
