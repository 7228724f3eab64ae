//! The kernel's new mount API (Linux 5.2): `fsopen`, `fspick`, `fsconfig`, `fsmount`, as raw
//! system calls (the `libc` crate has their numbers, not wrappers). Used to mount disk images
//! ahead as detached mounts ([`crate::disk::premount`]) and to reconfigure a cgroup2 superblock
//! without touching its mounts ([`crate::dynmods`]).

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSPICK_CLOEXEC: libc::c_uint = 1;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_SET_FLAG: libc::c_uint = 0;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSCONFIG_CMD_RECONFIGURE: libc::c_uint = 7;
pub const MOUNT_ATTR_NOSUID: libc::c_uint = 0x2;
pub const MOUNT_ATTR_NODEV: libc::c_uint = 0x4;

fn check(r: libc::c_long) -> std::io::Result<libc::c_int> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r as libc::c_int)
    }
}

fn cstring(s: &str) -> std::io::Result<CString> {
    CString::new(s).map_err(std::io::Error::other)
}

/// A file system context of type `fstype` (a new superblock to configure).
pub fn open(fstype: &CStr) -> std::io::Result<OwnedFd> {
    // SAFETY: fsopen with a valid C string; the descriptor is owned at once.
    unsafe {
        Ok(OwnedFd::from_raw_fd(check(libc::syscall(
            libc::SYS_fsopen,
            fstype.as_ptr(),
            FSOPEN_CLOEXEC,
        ))?))
    }
}

/// A context for reconfiguring the superblock of the file system mounted at `point`.
pub fn pick(point: &Path) -> std::io::Result<OwnedFd> {
    let path = cstring(&point.to_string_lossy())?;
    // SAFETY: fspick with a valid C string; the descriptor is owned at once.
    unsafe {
        Ok(OwnedFd::from_raw_fd(check(libc::syscall(
            libc::SYS_fspick,
            libc::AT_FDCWD,
            path.as_ptr(),
            FSPICK_CLOEXEC,
        ))?))
    }
}

/// Sets parameter `key` of context `fs`: a flag (`None`) or a string.
pub fn set(fs: BorrowedFd<'_>, key: &str, value: Option<&str>) -> std::io::Result<()> {
    let k = cstring(key)?;
    let v = value.map(cstring).transpose()?;
    let (cmd, vp) = match &v {
        None => (FSCONFIG_SET_FLAG, std::ptr::null()),
        Some(v) => (FSCONFIG_SET_STRING, v.as_ptr()),
    };
    // SAFETY: fsconfig with valid C strings (or null for a flag's value).
    check(unsafe { libc::syscall(libc::SYS_fsconfig, fs.as_raw_fd(), cmd, k.as_ptr(), vp, 0) })?;
    Ok(())
}

fn command(fs: BorrowedFd<'_>, cmd: libc::c_uint) -> std::io::Result<()> {
    let null = std::ptr::null::<libc::c_char>();
    // SAFETY: fsconfig's commands take no key or value.
    check(unsafe { libc::syscall(libc::SYS_fsconfig, fs.as_raw_fd(), cmd, null, null, 0) })?;
    Ok(())
}

/// Makes the superblock of a context from [`open`].
pub fn create(fs: BorrowedFd<'_>) -> std::io::Result<()> {
    command(fs, FSCONFIG_CMD_CREATE)
}

/// Applies the parameters set on a context from [`pick`] to its superblock.
pub fn reconfigure(fs: BorrowedFd<'_>) -> std::io::Result<()> {
    command(fs, FSCONFIG_CMD_RECONFIGURE)
}

/// A detached mount of a created context's file system, with `attrs` (`MOUNT_ATTR_*`): in no
/// mount namespace, held by the descriptor only.
pub fn mount(fs: BorrowedFd<'_>, attrs: libc::c_uint) -> std::io::Result<OwnedFd> {
    // SAFETY: fsmount of a context we own; the descriptor is owned at once.
    unsafe {
        Ok(OwnedFd::from_raw_fd(check(libc::syscall(
            libc::SYS_fsmount,
            fs.as_raw_fd(),
            FSMOUNT_CLOEXEC,
            attrs,
        ))?))
    }
}
