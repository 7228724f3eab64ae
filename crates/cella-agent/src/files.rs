//! File operations, done by the agent inside the sandbox.
//!
//! The agent's root directory is the sandbox's root, so every path resolves inside the sandbox:
//! the host's files are not in the agent's mount namespace at all. What is left to guard against
//! is the agent's own privileges (the kernel file systems it could read, its own descriptors
//! reached through `/proc` magic links) and races with a sandbox that swaps paths while the
//! agent works on them. So every operation works on directory descriptors, never on path
//! strings resolved twice:
//!
//! - a path is cleaned by text first (`.` and `..` resolved lexically, as `filepath.Clean`
//!   does), then opened from a descriptor of the sandbox's root with `openat2`
//!   (`RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`): symlinks are followed only inside the root and
//!   never through a magic link (on gVisor's kernel, which has no `openat2`, a plain `openat`
//!   from the agent's root, which is the sandbox's; see `openat_without_openat2`);
//! - every directory opened that way is checked with `fstatfs`: descriptors on `/proc`, `/sys` or
//!   another kernel file system are refused, whatever path led there (a directory swapped for a
//!   symlink to `/proc/1` with `RENAME_EXCHANGE` lands here, after the check cannot be raced);
//! - the last component is handled relative to its parent's descriptor (`fstatat`, `mkdirat`,
//!   `renameat`, `unlinkat`, `openat` with `O_NOFOLLOW`), and a recursive listing or removal
//!   descends by descriptor (`openat(O_NOFOLLOW | O_DIRECTORY)`, then `getdents` on it);
//! - downloads and upload targets must be regular files: a download is opened `O_PATH` first and
//!   checked, then opened `O_NONBLOCK | O_NOCTTY` and checked again (same inode), so a FIFO or a
//!   device never blocks an agent thread; anything else is refused as "not a regular file".
//!
//! Blocking file work runs on tokio's blocking pool so that one large file never holds up other
//! requests; [`MAX_FILE_OPS`] of them run at once per sandbox, more are refused (`Busy`).

use crate::proto::{self, ErrorKind, FileInfo, FrameKind, ProtoError, Response};
use std::ffi::{CStr, CString};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

/// Bytes per `Data` frame of a download.
const CHUNK: usize = 256 * 1024;

/// File operations (stat, list, mkdir, move, remove, read, write) in progress at once; one more
/// is answered `Busy` at once instead of queueing behind them.
pub const MAX_FILE_OPS: usize = 64;

/// How deep a recursive removal descends at most.
const MAX_DEPTH: usize = 1024;

/// Uploads are written to a file of this name beside the target, then renamed over it.
pub(crate) const UPLOAD_PREFIX: &str = ".cella-upload-";

/// Why the files API refuses a path, beyond what an errno says.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The path leads into `/proc`, `/sys` or another kernel file system.
    KernelFs,
    /// A download or an upload target that is a FIFO, a device, a socket or a directory.
    NotRegular,
    /// A directory tree deeper than [`MAX_DEPTH`].
    TooDeep,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::KernelFs => "not accessible through the files API",
            Refusal::NotRegular => "not a regular file",
            Refusal::TooDeep => "the directory tree is too deep",
        })
    }
}

impl std::error::Error for Refusal {}

fn refused(r: Refusal) -> std::io::Error {
    std::io::Error::other(r)
}

pub fn error(kind: ErrorKind, message: impl Into<String>) -> Response {
    Response::Error {
        kind,
        message: message.into(),
    }
}

/// The kind of answer for an error a file operation met. Everything here can be caused by
/// what is inside the sandbox, so only errors that say the agent itself is broken are
/// `Internal`.
fn kind_of(e: &std::io::Error) -> ErrorKind {
    if let Some(r) = e.get_ref().and_then(|x| x.downcast_ref::<Refusal>()) {
        return match r {
            Refusal::KernelFs => ErrorKind::BadRequest,
            Refusal::NotRegular | Refusal::TooDeep => ErrorKind::Conflict,
        };
    }
    match e.raw_os_error() {
        Some(libc::ENOENT) => ErrorKind::NotFound,
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => ErrorKind::NoSpace,
        Some(libc::EFBIG) => ErrorKind::TooLarge,
        Some(libc::EINVAL) | Some(libc::ENAMETOOLONG) => ErrorKind::BadRequest,
        // The agent ran out of descriptors or memory: try again later.
        Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOMEM) => ErrorKind::Unavailable,
        // The agent's own mistakes.
        Some(libc::EBADF) | Some(libc::EFAULT) | Some(libc::ENOSYS) => ErrorKind::Internal,
        // Everything else is the sandbox's file system saying no: exists, not empty, wrong
        // type, read-only, in use, busy, permission, a magic link refused (ELOOP), a device
        // without its driver (ENXIO, ENODEV), another file system (EXDEV), I/O errors of the
        // sandbox's own disk, ...
        Some(_) => ErrorKind::Conflict,
        None => ErrorKind::Internal,
    }
}

pub(crate) fn io_error(path: &str, e: &std::io::Error) -> Response {
    let kind = kind_of(e);
    let message = match kind {
        ErrorKind::NoSpace => format!("{path}: the sandbox's disk is full ({e})"),
        ErrorKind::Unavailable => format!("{path}: the sandbox is out of resources ({e})"),
        _ => format!("{path}: {e}"),
    };
    error(kind, message)
}

/// `path` with `.` and `..` resolved by text alone (a `..` at the root stays at the root).
fn normalize(path: &str) -> PathBuf {
    let mut out = PathBuf::from("/");
    for part in Path::new(path).components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(p) => out.push(p),
            _ => {}
        }
    }
    out
}

/// Paths the files API refuses by their text (their descriptors are checked too).
fn is_agent_proc(p: &Path) -> bool {
    // The files API serves no kernel file system at all: the agent holds privileges (it could
    // read /proc/kmsg, kallsyms, other processes' pagemap, its own links to the host). Commands
    // run through exec see /proc and /sys as a sandbox's processes do.
    p.starts_with("/proc") || p.starts_with("/sys")
}

/// Paths must be absolute; `.` and `..` are resolved by text, the rest by descriptor.
// The error is the agent's answer as it goes on the wire; boxing it buys nothing here.
#[allow(clippy::result_large_err)]
pub(crate) fn check(path: &str) -> Result<PathBuf, Response> {
    if !path.starts_with('/') || path.contains('\0') {
        return Err(error(
            ErrorKind::BadRequest,
            format!("path must be absolute: {path:?}"),
        ));
    }
    let clean = normalize(path);
    if is_agent_proc(&clean) {
        return Err(error(
            ErrorKind::BadRequest,
            format!("{path} is not accessible through the files API"),
        ));
    }
    Ok(clean)
}

// ---------------------------------------------------------------------------------------------
// Descriptors
// ---------------------------------------------------------------------------------------------

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Do not follow /proc "magic links" (`/proc/PID/fd/N`, `/proc/PID/root`, `/proc/PID/exe`):
/// they could lead an open by the agent to a file outside the sandbox.
const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
/// Resolve as if the directory descriptor were the root: `..` and absolute symlinks stay
/// beneath it.
const RESOLVE_IN_ROOT: u64 = 0x10;

fn cstring(b: &[u8]) -> std::io::Result<CString> {
    CString::new(b).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
}

fn openat2(
    dir: RawFd,
    path: &CStr,
    flags: i32,
    mode: u32,
    resolve: u64,
) -> std::io::Result<OwnedFd> {
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: mode as u64,
        resolve,
    };
    loop {
        // SAFETY: openat2 with a valid path and an open_how of the size we pass.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir,
                path.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        if fd >= 0 {
            // SAFETY: a descriptor the kernel just gave us.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOSYS) {
            return openat_without_openat2(dir, path, flags, mode);
        }
        // The kernel asks to retry when a rename raced with the walk.
        if e.raw_os_error() != Some(libc::EAGAIN) && e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Where the kernel has no `openat2` (gVisor's, which the agent runs on as the sandbox's init):
/// a plain `openat`. The agent's root is then the sandbox's root, so `..` and absolute symlinks
/// stay inside it as `RESOLVE_IN_ROOT` would keep them; what `RESOLVE_NO_MAGICLINKS` guarded
/// against (a `/proc/<pid>/fd` link to a host file the agent holds) does not exist there, as
/// the agent holds no host file, and the `fstatfs` and regular-file checks still apply.
fn openat_without_openat2(
    dir: RawFd,
    path: &CStr,
    flags: i32,
    mode: u32,
) -> std::io::Result<OwnedFd> {
    loop {
        // SAFETY: openat with a valid path.
        let fd = unsafe { libc::openat(dir, path.as_ptr(), flags | libc::O_CLOEXEC, mode) };
        if fd >= 0 {
            // SAFETY: a descriptor the kernel just gave us.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// `openat` of one name in `dir`, never following a symlink in that last name.
/// Creates `name` in the directory `dir` for writing: a new file only (`O_EXCL`), never
/// through a symlink.
fn create_new_at(dir: RawFd, name: &CStr, mode: u32) -> std::io::Result<std::fs::File> {
    // SAFETY: a valid descriptor and NUL-terminated name.
    let fd = unsafe {
        libc::openat(
            dir,
            name.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just gave us.
    Ok(std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

fn open_child(dir: &OwnedFd, name: &CStr, flags: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: a valid descriptor and NUL-terminated name.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just gave us.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    refuse_kernel_fs(&fd)?;
    Ok(fd)
}

/// Kernel file systems the files API never serves.
const KERNEL_FS: &[i64] = &[
    0x9fa0,      // proc
    0x6265_6572, // sysfs
    0x6462_6720, // debugfs
    0x7472_6163, // tracefs
    0x7363_6673, // securityfs
    0x0027_e0eb, // cgroup
    0x6367_7270, // cgroup2
    0xcafe_4a11, // bpf
    0x6165_676c, // pstore
    0xde5e_81e4, // efivarfs
    0x6265_6570, // configfs
];

fn refuse_kernel_fs(fd: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: statfs is plain data; the kernel fills it.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a buffer of the right type.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut s) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if KERNEL_FS.contains(&(s.f_type as i64)) {
        return Err(refused(Refusal::KernelFs));
    }
    Ok(())
}

/// Opens the clean absolute `path` from the sandbox's root: symlinks are followed inside the
/// root only, magic links never, and a descriptor on a kernel file system is refused.
pub(crate) fn open_in_root(path: &Path, flags: i32) -> std::io::Result<OwnedFd> {
    let root = openat2(libc::AT_FDCWD, c"/", libc::O_PATH | libc::O_DIRECTORY, 0, 0)?;
    let rel = path.strip_prefix("/").unwrap_or(path);
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let fd = openat2(
        root.as_raw_fd(),
        &cstring(rel.as_os_str().as_bytes())?,
        flags,
        0,
        RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
    )?;
    refuse_kernel_fs(&fd)?;
    Ok(fd)
}

/// The directory holding the last component of the clean `path`, by descriptor, and that
/// component; `/` has none (EINVAL).
fn open_parent(path: &Path) -> std::io::Result<(OwnedFd, CString)> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    };
    let dir = open_in_root(parent, libc::O_PATH | libc::O_DIRECTORY)?;
    Ok((dir, cstring(name.as_bytes())?))
}

pub(crate) fn fstatat(dir: &OwnedFd, name: &CStr) -> std::io::Result<libc::stat> {
    // SAFETY: stat is plain data; the kernel fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor, name and buffer.
    let r = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

fn fstat(fd: RawFd) -> std::io::Result<libc::stat> {
    // SAFETY: stat is plain data; the kernel fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and buffer.
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

fn readlinkat(dir: &OwnedFd, name: &CStr) -> Option<String> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: a valid descriptor, name and buffer of the given length.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    (n >= 0).then(|| String::from_utf8_lossy(&buf[..n as usize]).into_owned())
}

pub(crate) fn is_dir(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

fn is_reg(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG
}

fn is_link(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFLNK
}

/// Names in the directory open at `dir` (a descriptor opened for reading), sorted, without `.`
/// and `..`.
pub(crate) fn names(dir: &OwnedFd) -> std::io::Result<Vec<CString>> {
    let dup = nix::unistd::dup(dir.as_raw_fd()).map_err(std::io::Error::from)?;
    let mut d = nix::dir::Dir::from_fd(dup).map_err(|e| {
        // SAFETY: from_fd failed, so the duplicate is still ours to close.
        unsafe { libc::close(dup) };
        std::io::Error::from(e)
    })?;
    let mut out = Vec::new();
    for e in d.iter() {
        let e = e.map_err(std::io::Error::from)?;
        let n = e.file_name();
        if n.to_bytes() != b"." && n.to_bytes() != b".." {
            out.push(n.to_owned());
        }
    }
    out.sort();
    Ok(out)
}

/// Opens a subdirectory `name` of `dir` for reading its entries (no symlink followed, no
/// kernel file system).
pub(crate) fn open_subdir(dir: &OwnedFd, name: &CStr) -> std::io::Result<OwnedFd> {
    open_child(dir, name, libc::O_RDONLY | libc::O_DIRECTORY)
}

fn info_of(path: &Path, st: &libc::stat, target: Option<String>) -> FileInfo {
    let kind = if is_link(st) {
        "symlink"
    } else if is_dir(st) {
        "dir"
    } else if is_reg(st) {
        "file"
    } else {
        "other"
    };
    FileInfo {
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "/".into()),
        path: path.display().to_string(),
        kind: kind.into(),
        size: st.st_size.max(0) as u64,
        mode: st.st_mode & 0o7777,
        modified: st.st_mtime,
        uid: st.st_uid,
        gid: st.st_gid,
        target,
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("file task panicked")
}

// ---------------------------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------------------------

fn stat_path(p: &Path) -> std::io::Result<FileInfo> {
    if p == Path::new("/") {
        let root = open_in_root(p, libc::O_PATH | libc::O_DIRECTORY)?;
        return Ok(info_of(p, &fstat(root.as_raw_fd())?, None));
    }
    let (dir, name) = open_parent(p)?;
    let st = fstatat(&dir, &name)?;
    let target = is_link(&st).then(|| readlinkat(&dir, &name)).flatten();
    Ok(info_of(p, &st, target))
}

pub async fn stat(path: String) -> Response {
    let p = match check(&path) {
        Ok(p) => p,
        Err(r) => return r,
    };
    blocking(move || match stat_path(&p) {
        Ok(i) => Response::Stat(i),
        Err(e) => io_error(&path, &e),
    })
    .await
}

fn list_blocking(path: &str, p: &Path, recursive: bool, limit: usize) -> Response {
    let top = match open_in_root(p, libc::O_RDONLY | libc::O_DIRECTORY) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
            return error(ErrorKind::Conflict, format!("{path} is not a directory"))
        }
        Err(e) => return io_error(path, &e),
    };
    let mut entries = Vec::new();
    let mut truncated = false;
    // Directories still to read: an open parent and the name in it, opened when their turn
    // comes (so a wide tree does not hold a descriptor per directory).
    let mut pending: Vec<(Arc<OwnedFd>, CString, PathBuf)> = Vec::new();
    let mut current = Some((Arc::new(top), p.to_path_buf()));
    loop {
        let (dir, dpath) = match current.take() {
            Some(x) => x,
            None => match pending.pop() {
                None => break,
                Some((parent, name, dpath)) => match open_subdir(&parent, &name) {
                    Ok(fd) => (Arc::new(fd), dpath),
                    Err(_) => continue, // gone, swapped for a link, or a kernel file system
                },
            },
        };
        let list = match names(&dir) {
            Ok(l) => l,
            Err(e) if dpath == p => return io_error(path, &e),
            Err(_) => continue,
        };
        for name in list {
            let Ok(st) = fstatat(&dir, &name) else {
                continue;
            };
            if entries.len() >= limit {
                truncated = true;
                break;
            }
            let full = dpath.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
            if is_agent_proc(&full) {
                continue;
            }
            let target = is_link(&st).then(|| readlinkat(&dir, &name)).flatten();
            entries.push(info_of(&full, &st, target));
            if recursive && is_dir(&st) {
                pending.push((dir.clone(), name, full));
            }
        }
        if truncated {
            break;
        }
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Response::Entries { entries, truncated }
}

pub async fn list(path: String, recursive: bool, limit: usize) -> Response {
    let p = match check(&path) {
        Ok(p) => p,
        Err(r) => return r,
    };
    blocking(move || list_blocking(&path, &p, recursive, limit)).await
}

/// `mkdir -p` by descriptor: each missing directory is made in its parent's descriptor and
/// handed to `uid`/`gid` without following a link; answers the last one (`O_PATH`).
fn make_dirs(p: &Path, uid: u32, gid: u32) -> std::io::Result<OwnedFd> {
    let mut fd = open_in_root(Path::new("/"), libc::O_PATH | libc::O_DIRECTORY)?;
    let mut cur = PathBuf::from("/");
    for part in p.components() {
        let Component::Normal(name) = part else {
            continue;
        };
        cur.push(name);
        fd = match open_in_root(&cur, libc::O_PATH | libc::O_DIRECTORY) {
            Ok(next) => next,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                let c = cstring(name.as_bytes())?;
                // SAFETY: a valid descriptor and name.
                if unsafe { libc::mkdirat(fd.as_raw_fd(), c.as_ptr(), 0o755) } < 0 {
                    let e = std::io::Error::last_os_error();
                    if e.raw_os_error() != Some(libc::EEXIST) {
                        return Err(e);
                    }
                } else {
                    // SAFETY: as above; a link put in its place meanwhile is not followed.
                    if unsafe {
                        libc::fchownat(
                            fd.as_raw_fd(),
                            c.as_ptr(),
                            uid,
                            gid,
                            libc::AT_SYMLINK_NOFOLLOW,
                        )
                    } < 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                open_child(&fd, &c, libc::O_PATH | libc::O_DIRECTORY)?
            }
            Err(e) => return Err(e),
        };
    }
    Ok(fd)
}

pub async fn mkdir(path: String, uid: u32, gid: u32) -> Response {
    let p = match check(&path) {
        Ok(p) => p,
        Err(r) => return r,
    };
    blocking(move || match make_dirs(&p, uid, gid) {
        Ok(_) => Response::Done { bytes: 0 },
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => error(
            ErrorKind::Conflict,
            format!("{path} exists and is not a directory"),
        ),
        Err(e) => io_error(&path, &e),
    })
    .await
}

pub async fn rename(from: String, to: String) -> Response {
    let (f, t) = match (check(&from), check(&to)) {
        (Ok(f), Ok(t)) => (f, t),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    blocking(move || {
        let (fdir, fname) = match open_parent(&f).and_then(|(d, n)| fstatat(&d, &n).map(|_| (d, n)))
        {
            Ok(x) => x,
            Err(e) => return io_error(&from, &e),
        };
        let (tdir, tname) = match open_parent(&t) {
            Ok(x) => x,
            Err(e) => return io_error(&to, &e),
        };
        // SAFETY: valid descriptors and names.
        let r = unsafe {
            libc::renameat(
                fdir.as_raw_fd(),
                fname.as_ptr(),
                tdir.as_raw_fd(),
                tname.as_ptr(),
            )
        };
        if r < 0 {
            return io_error(&to, &std::io::Error::last_os_error());
        }
        Response::Done { bytes: 0 }
    })
    .await
}

fn unlinkat(dir: &OwnedFd, name: &CStr, flags: i32) -> std::io::Result<()> {
    // SAFETY: a valid descriptor and name.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Removes the directory `name` of `dir` and everything in it, by descriptor: nothing it holds
/// is followed, whatever is swapped in meanwhile.
fn remove_tree(dir: &OwnedFd, name: &CStr, depth: usize) -> std::io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(refused(Refusal::TooDeep));
    }
    let sub = open_subdir(dir, name)?;
    for n in names(&sub)? {
        let st = match fstatat(&sub, &n) {
            Ok(st) => st,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(e),
        };
        if is_dir(&st) {
            remove_tree(&sub, &n, depth + 1)?;
        } else {
            match unlinkat(&sub, &n, 0) {
                Err(e) if e.raw_os_error() != Some(libc::ENOENT) => return Err(e),
                _ => {}
            }
        }
    }
    drop(sub);
    unlinkat(dir, name, libc::AT_REMOVEDIR)
}

pub async fn remove(path: String, recursive: bool) -> Response {
    let p = match check(&path) {
        Ok(p) => p,
        Err(r) => return r,
    };
    if p == Path::new("/") {
        return error(ErrorKind::BadRequest, "refusing to remove /");
    }
    blocking(move || {
        let (dir, name) = match open_parent(&p) {
            Ok(x) => x,
            Err(e) => return io_error(&path, &e),
        };
        let st = match fstatat(&dir, &name) {
            Ok(st) => st,
            Err(e) => return io_error(&path, &e),
        };
        let r = if is_dir(&st) {
            if recursive {
                remove_tree(&dir, &name, 0)
            } else {
                unlinkat(&dir, &name, libc::AT_REMOVEDIR)
            }
        } else {
            unlinkat(&dir, &name, 0)
        };
        match r {
            Ok(()) => Response::Done { bytes: 0 },
            Err(e)
                if is_dir(&st)
                    && !recursive
                    && matches!(e.raw_os_error(), Some(libc::ENOTEMPTY) | Some(libc::EEXIST)) =>
            {
                error(
                    ErrorKind::Conflict,
                    format!("{path} is a directory that is not empty; remove it recursively"),
                )
            }
            Err(e) => io_error(&path, &e),
        }
    })
    .await
}

/// Opens a regular file for reading without ever blocking on it: `O_PATH` first to see what
/// it is, then `O_NONBLOCK` (a FIFO swapped in meanwhile does not block either) and the same
/// inode again. With `nofollow`, a symlink as the last component is refused too.
fn open_regular(p: &Path, nofollow: bool) -> std::io::Result<(std::fs::File, u64)> {
    let open = |flags: i32| -> std::io::Result<OwnedFd> {
        if nofollow {
            let (dir, name) = open_parent(p)?;
            open_child(&dir, &name, flags)
        } else {
            open_in_root(p, flags)
        }
    };
    let probe = open(libc::O_PATH)?;
    let first = fstat(probe.as_raw_fd())?;
    if is_dir(&first) {
        return Err(std::io::Error::from_raw_os_error(libc::EISDIR));
    }
    if !is_reg(&first) {
        return Err(refused(Refusal::NotRegular));
    }
    let fd = open(libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY)?;
    let st = fstat(fd.as_raw_fd())?;
    if !is_reg(&st) || st.st_dev != first.st_dev || st.st_ino != first.st_ino {
        return Err(refused(Refusal::NotRegular));
    }
    // Regular files never block; clear the flag all the same.
    // SAFETY: a valid descriptor.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, 0) };
    Ok((std::fs::File::from(fd), st.st_size.max(0) as u64))
}

/// Streams a file (or a range of it) to the node.
pub async fn read(
    stream: &mut UnixStream,
    path: String,
    offset: u64,
    length: Option<u64>,
    nofollow: bool,
) -> Result<(), ProtoError> {
    let p = match check(&path) {
        Ok(p) => p,
        Err(r) => return proto::write_json(stream, &r).await,
    };
    let opened = blocking(move || open_regular(&p, nofollow)).await;
    let (mut file, size) = match opened {
        Ok(x) => x,
        Err(e) => return proto::write_json(stream, &io_error(&path, &e)).await,
    };
    let offset = offset.min(size);
    let length = length.unwrap_or(u64::MAX).min(size - offset);
    proto::write_json(
        stream,
        &Response::FileStart {
            size,
            offset,
            length,
        },
    )
    .await?;
    let mut left = length;
    let mut pos = offset;
    while left > 0 {
        let want = (left as usize).min(CHUNK);
        let (f, buf) = blocking(move || {
            let mut buf = vec![0u8; want];
            let n = file
                .seek(SeekFrom::Start(pos))
                .and_then(|_| file.read(&mut buf));
            (
                file,
                n.map(|n| {
                    buf.truncate(n);
                    buf
                }),
            )
        })
        .await;
        file = f;
        let buf = buf?;
        if buf.is_empty() {
            break; // the file shrank meanwhile
        }
        proto::write_frame(stream, FrameKind::Data, &buf).await?;
        left -= buf.len() as u64;
        pos += buf.len() as u64;
    }
    stream.flush().await?;
    proto::write_json(
        stream,
        &Response::Done {
            bytes: length - left,
        },
    )
    .await
}

/// The parent of an upload (made if missing) and a new temporary file in it.
fn create_upload(
    p: &Path,
    tmp: &CStr,
    uid: u32,
    gid: u32,
) -> std::io::Result<(OwnedFd, CString, std::fs::File)> {
    let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    };
    let dir = make_dirs(parent, uid, gid)?;
    let name = cstring(name.as_bytes())?;
    match fstatat(&dir, &name) {
        // A file is replaced, and so is a symlink (the link itself, never what it points to).
        Ok(st) if is_reg(&st) || is_link(&st) => {}
        Ok(st) if is_dir(&st) => return Err(std::io::Error::from_raw_os_error(libc::EISDIR)),
        Ok(_) => return Err(refused(Refusal::NotRegular)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) => return Err(e),
    }
    let file = create_new_at(dir.as_raw_fd(), tmp, 0o600)?;
    Ok((dir, name, file))
}

/// Receives a file from the node into a temporary file beside the target, then renames it
/// into place; anything short of a complete upload leaves nothing behind.
pub async fn write(
    stream: &mut UnixStream,
    path: String,
    uid: u32,
    gid: u32,
    mode: u32,
    max_bytes: u64,
) -> Result<(), ProtoError> {
    let p = match check(&path) {
        Ok(p) => p,
        Err(r) => return proto::write_json(stream, &r).await,
    };
    if p == Path::new("/") {
        return proto::write_json(stream, &error(ErrorKind::BadRequest, "cannot write /")).await;
    }
    let tmp = match cstring(
        format!("{UPLOAD_PREFIX}{}-{}", std::process::id(), rand_suffix()).as_bytes(),
    ) {
        Ok(t) => t,
        Err(e) => return proto::write_json(stream, &io_error(&path, &e)).await,
    };
    let tmp2 = tmp.clone();
    let created = blocking(move || create_upload(&p, &tmp2, uid, gid)).await;
    let (dir, name, mut file) = match created {
        Ok(x) => x,
        Err(e) => return proto::write_json(stream, &io_error(&path, &e)).await,
    };
    let dir = Arc::new(dir);
    // Removed unless renamed into place: also when this task is dropped mid-upload (a
    // `Quiesce` before gVisor's checkpoint closes every connection).
    let partial = PartialUpload {
        dir: dir.clone(),
        name: Some(tmp.clone()),
    };
    let mut total: u64 = 0;
    let outcome: Result<(), Response> = loop {
        match proto::read_frame(stream).await {
            Ok(Some((FrameKind::Data, data))) => {
                total += data.len() as u64;
                if total > max_bytes {
                    break Err(error(
                        ErrorKind::TooLarge,
                        format!("upload is larger than {max_bytes} bytes"),
                    ));
                }
                let (f, r) = blocking(move || {
                    let r = file.write_all(&data);
                    (file, r)
                })
                .await;
                file = f;
                if let Err(e) = r {
                    break Err(io_error(&path, &e));
                }
            }
            Ok(Some((FrameKind::DataEnd, _))) => break Ok(()),
            // The node went away or sent nonsense: the upload is incomplete.
            _ => break Err(error(ErrorKind::BadRequest, "upload ended early")),
        }
    };
    let (dir2, tmp3) = (dir.clone(), tmp.clone());
    let finished = match outcome {
        Ok(()) => blocking(move || -> std::io::Result<()> {
            use std::os::unix::fs::PermissionsExt;
            // On the open file, not by name: the name may have been swapped for a link. The
            // owner first: a change of owner clears the setuid and setgid bits (Linux's kernel
            // does so for root too, gVisor's not), and the mode is applied as given. (Commands
            // run with `no_new_privs`: such a bit gives nobody privileges.)
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
            file.set_permissions(std::fs::Permissions::from_mode(mode))?;
            file.sync_all()?;
            drop(file);
            // SAFETY: a valid descriptor and names; renameat never follows either name.
            if unsafe {
                libc::renameat(
                    dir2.as_raw_fd(),
                    tmp3.as_ptr(),
                    dir2.as_raw_fd(),
                    name.as_ptr(),
                )
            } < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
        .await
        .map_err(|e| io_error(&path, &e)),
        Err(r) => Err(r),
    };
    match finished {
        Ok(()) => {
            partial.renamed();
            proto::write_json(stream, &Response::Done { bytes: total }).await
        }
        Err(r) => {
            drop(partial);
            proto::write_json(stream, &r).await
        }
    }
}

/// An upload's temporary file, removed when dropped unless it was renamed into place.
struct PartialUpload {
    dir: Arc<OwnedFd>,
    name: Option<CString>,
}

impl PartialUpload {
    fn renamed(mut self) {
        self.name = None;
    }
}

impl Drop for PartialUpload {
    fn drop(&mut self) {
        if let Some(name) = self.name.take() {
            let _ = unlinkat(&self.dir, &name, 0);
        }
    }
}

/// Writes `contents` as `/run/<dir>/<name>` (mode 0644, owned by the agent), for the agent's
/// own use (the interpreter's drivers). `/run` is opened inside the sandbox's root without magic
/// links; `<dir>` is made a real directory (a symlink or file planted there is removed first)
/// and opened without following links; the file is written under a new name with `O_EXCL |
/// O_NOFOLLOW` and renamed over `<name>` (a symlink there is replaced, never followed).
pub(crate) fn install_run_file(dir: &str, name: &str, contents: &[u8]) -> std::io::Result<()> {
    let run = open_in_root(Path::new("/run"), libc::O_PATH | libc::O_DIRECTORY)?;
    let d = cstring(dir.as_bytes())?;
    let sub = match open_child(&run, &d, libc::O_PATH | libc::O_DIRECTORY) {
        Ok(fd) => fd,
        Err(_) => {
            // Missing, or something other than a directory: make it anew.
            match fstatat(&run, &d) {
                Ok(st) if is_dir(&st) => remove_tree(&run, &d, 0)?,
                Ok(_) => unlinkat(&run, &d, 0)?,
                Err(_) => {}
            }
            // SAFETY: a valid descriptor and name.
            if unsafe { libc::mkdirat(run.as_raw_fd(), d.as_ptr(), 0o755) } < 0 {
                return Err(std::io::Error::last_os_error());
            }
            open_child(&run, &d, libc::O_PATH | libc::O_DIRECTORY)?
        }
    };
    let tmp = cstring(format!(".{name}.{}-{}", std::process::id(), rand_suffix()).as_bytes())?;
    let mut file = create_new_at(sub.as_raw_fd(), &tmp, 0o644)?;
    let name = cstring(name.as_bytes())?;
    let written = file.write_all(contents).and_then(|_| {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o644))
    });
    drop(file);
    let renamed = written.and_then(|_| {
        // SAFETY: a valid descriptor and names; renameat follows neither.
        if unsafe {
            libc::renameat(
                sub.as_raw_fd(),
                tmp.as_ptr(),
                sub.as_raw_fd(),
                name.as_ptr(),
            )
        } < 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    });
    if renamed.is_err() {
        let _ = unlinkat(&sub, &tmp, 0);
    }
    renamed
}

fn rand_suffix() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uploads_in(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }

    /// An upload whose task is dropped mid-way (a `Quiesce` before gVisor's checkpoint closes
    /// every connection so) leaves no temporary file; a whole one is renamed into place.
    #[tokio::test]
    async fn an_upload_dropped_mid_way_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("up.bin").to_string_lossy().into_owned();
        let (uid, gid) = (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        );
        let (mut node, mut agent) = UnixStream::pair().unwrap();
        let p = path.clone();
        let task =
            tokio::spawn(async move { write(&mut agent, p, uid, gid, 0o640, 1 << 20).await });
        proto::write_frame(&mut node, FrameKind::Data, b"partial")
            .await
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !uploads_in(dir.path())
            .iter()
            .any(|n| n.starts_with(UPLOAD_PREFIX))
        {
            assert!(std::time::Instant::now() < deadline, "no temporary file");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        task.abort();
        let _ = task.await;
        assert_eq!(uploads_in(dir.path()), Vec::<String>::new());

        let (mut node, mut agent) = UnixStream::pair().unwrap();
        let p = path.clone();
        let task =
            tokio::spawn(async move { write(&mut agent, p, uid, gid, 0o640, 1 << 20).await });
        proto::write_frame(&mut node, FrameKind::Data, b"whole")
            .await
            .unwrap();
        proto::write_frame(&mut node, FrameKind::DataEnd, b"")
            .await
            .unwrap();
        task.await.unwrap().unwrap();
        assert_eq!(uploads_in(dir.path()), ["up.bin"]);
        assert_eq!(std::fs::read(&path).unwrap(), b"whole");
    }

    #[test]
    fn dot_dot_cannot_hide_the_root_or_the_agent() {
        assert_eq!(normalize("/.."), Path::new("/"));
        assert_eq!(normalize("/a/../../b/./c"), Path::new("/b/c"));
        assert!(is_agent_proc(&normalize("/tmp/../proc/1/fd/2")));
        assert!(is_agent_proc(&normalize("/proc/self/exe")));
        assert!(is_agent_proc(&normalize("/proc/kmsg")));
        assert!(is_agent_proc(&normalize("/sys/kernel")));
        assert!(!is_agent_proc(&normalize("/process")));
        assert!(check("/proc/thread-self/root").is_err());
    }

    #[test]
    fn kernel_file_systems_are_refused_by_descriptor() {
        // Through a symlink: the text looks harmless, the descriptor is on procfs.
        let dir = std::env::temp_dir().join(format!("cella-resolve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join("p");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("/proc/self", &link).unwrap();
        let e = open_in_root(&link, libc::O_PATH | libc::O_DIRECTORY).unwrap_err();
        assert!(matches!(kind_of(&e), ErrorKind::BadRequest), "{e}");
        let e = stat_path(&link.join("status")).unwrap_err();
        assert!(matches!(kind_of(&e), ErrorKind::BadRequest), "{e}");
        // The symlink itself is fine to describe.
        assert_eq!(stat_path(&link).unwrap().kind, "symlink");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn magic_links_and_special_files_are_not_opened() {
        assert!(open_regular(Path::new("/proc/self/fd/0"), false).is_err());
        assert!(open_regular(Path::new("/etc/hostname"), false).is_ok());
        let e = open_regular(Path::new("/dev/null"), false).unwrap_err();
        assert!(matches!(kind_of(&e), ErrorKind::Conflict), "{e}");
        assert!(e.to_string().contains("not a regular file"));
        // A FIFO with no writer: refused at once, not waited on.
        let dir = std::env::temp_dir().join(format!("cella-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("f");
        let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = open_regular(&fifo, false).unwrap_err();
        assert!(e.to_string().contains("not a regular file"));
        // With nofollow, a symlink to a regular file is refused too.
        let link = dir.join("l");
        std::os::unix::fs::symlink("/etc/hostname", &link).unwrap();
        assert!(open_regular(&link, false).is_ok());
        assert!(open_regular(&link, true).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn errors_a_sandbox_can_cause_are_not_internal() {
        for errno in [
            libc::ENXIO,
            libc::ENODEV,
            libc::EACCES,
            libc::EPERM,
            libc::EROFS,
            libc::EXDEV,
            libc::ELOOP,
            libc::EIO,
            libc::EOPNOTSUPP,
        ] {
            let e = std::io::Error::from_raw_os_error(errno);
            assert!(matches!(kind_of(&e), ErrorKind::Conflict), "{e}");
        }
        for errno in [libc::ENOSPC, libc::EDQUOT] {
            let e = std::io::Error::from_raw_os_error(errno);
            assert!(matches!(kind_of(&e), ErrorKind::NoSpace), "{e}");
        }
    }

    #[test]
    fn recursive_removal_works_by_descriptor() {
        let dir = std::env::temp_dir().join(format!("cella-rm-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::write(dir.join("a/b/f"), b"x").unwrap();
        let keep = std::env::temp_dir().join(format!("cella-keep-{}", std::process::id()));
        std::fs::create_dir_all(&keep).unwrap();
        std::fs::write(keep.join("k"), b"k").unwrap();
        std::os::unix::fs::symlink(&keep, dir.join("a/link")).unwrap();
        let (d, n) = open_parent(&dir).unwrap();
        remove_tree(&d, &n, 0).unwrap();
        assert!(!dir.exists());
        assert!(keep.join("k").exists(), "a symlink's target survives");
        std::fs::remove_dir_all(&keep).unwrap();
    }
}
