//! User namespaces: a sandbox's root is an unprivileged uid range on the host.
//!
//! Every sandbox gets a user namespace of its own that maps ids `0..count` inside to
//! `base..base + count` on the host (one shared range, kept above the host's real users). The
//! kernel charges per-user counters (inotify instances and watches, processes, user namespaces)
//! at every level up to the host, at the host's level to the uid that made the namespace: so a
//! sandbox's namespace is made by an accounting uid of its own ([`IdMap::owner`], from the span
//! above the range, owned by no process), and a sandbox that uses up its inotify instances
//! leaves the host's root and the other sandboxes theirs. Only the
//! sandbox's processes live in it: its mount, network, PID, UTS and IPC namespaces stay owned by
//! the host's user namespace, so its root has no capability over any of them (it cannot mount,
//! change network settings or the hostname, whatever seccomp allows).
//!
//! Files keep two forms:
//! - read-only layers (the base image, OCI layers, exported build steps, the host's `/usr`) hold
//!   ids from 0 on disk and reach the sandbox through idmapped mounts ([`idmapped_clone`]);
//! - a sandbox's writable layer holds host ids (`base + n`), so everything a sandbox writes is
//!   owned by the range on the host. A layer records the base its ids use ([`MARKER`]);
//!   [`shift_tree`] moves a layer from one base to another (a layer from before user
//!   namespaces, a build step exported as a template layer).
//!
//! Why hand-written system calls: neither nix nor rustix wraps `mount_setattr` with an idmap;
//! the three calls below are the kernel's documented interface (`open_tree`, `mount_setattr`,
//! `move_mount`).
//!
//! The layer's id base is recorded in a file `ids` in its root (the disk's root, or the sandbox's
//! directory for a plain layer; outside the sandbox's view); `ShiftIds` at boot moves a layer from
//! another base (set-uid bits kept), and `export_layer` moves a build step's layer back to ids from
//! 0. `/dev`, `/dev/shm` and `/run` are tmpfs mounts owned by the base, and `devpts` uses gid
//! base+5 for `tty`. A bind that is neither layered nor read-only is made read-only. At start the
//! server probes ([`probe`], in a throwaway mount namespace of a forked child) that it can make
//! such a namespace and mount an overlay on id-mapped copies of its layers (overlayfs before 5.19
//! refuses id-mapped layers); `[isolation] userns` unset uses them when it can (warning when not),
//! `true` refuses to start without, `false` turns them off. `DATA/userns` records that a data
//! directory's sandboxes run with them: a later probe failure then stops the server instead of
//! quietly running sandboxes as the host's root. [`shift_tree`] walks by directory descriptors
//! (`O_NOFOLLOW`, one file system, hard links once) and runs only while no process of the sandbox
//! does; file capabilities and ACL entries are not moved.

use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Why a user namespace, or an id-mapped mount, could not be made. The messages name the step
/// that failed and its cause (they reach the server's log and the boot's error).
#[derive(Debug, thiserror::Error)]
pub enum UsernsError {
    /// `[isolation] uid_base` leaves no room for the range and its accounting uids.
    #[error("uid_base {base} must be at least {min} and leave room for {room} ids above it")]
    BadBase { base: u32, min: u32, room: u32 },
    /// The helper child could not unshare a user namespace as this uid.
    #[error("making a user namespace as uid {0} failed")]
    Refused(u32),
    /// A system call failed (`step` names it).
    #[error("{step}: {source}")]
    Sys {
        step: &'static str,
        source: nix::errno::Errno,
    },
    /// A host-side step failed (`what` names it and its path).
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// A system call failed, without a step named.
    #[error(transparent)]
    Errno(#[from] nix::errno::Errno),
    /// A directory of the probe could not be made.
    #[error(transparent)]
    Dir(#[from] std::io::Error),
    /// A path holds a NUL byte.
    #[error(transparent)]
    Nul(#[from] std::ffi::NulError),
}

impl UsernsError {
    fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> UsernsError {
        let what = what.into();
        move |source| UsernsError::Io { what, source }
    }

    fn sys(step: &'static str) -> impl FnOnce(nix::errno::Errno) -> UsernsError {
        move |source| UsernsError::Sys { step, source }
    }
}

/// Ids a sandbox's user namespace maps: `0..count` inside is `base..base + count` on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdMap {
    pub base: u32,
    pub count: u32,
}

impl IdMap {
    /// The default range: 65536 ids from one billion (`ls -n` on the host shows a sandbox's
    /// root as 1000000000 and its uid 1000 as 1000001000).
    pub const DEFAULT_BASE: u32 = 1_000_000_000;
    pub const COUNT: u32 = 65536;

    pub fn new(base: u32) -> Result<IdMap, UsernsError> {
        // The range, then as many accounting uids (see [`IdMap::owner`]), all below 2^31 (ids
        // some programs keep in a signed int, and the most `ping_group_range` takes).
        if base < Self::COUNT || base > i32::MAX as u32 - 2 * Self::COUNT {
            return Err(UsernsError::BadBase {
                base,
                min: Self::COUNT,
                room: 2 * Self::COUNT,
            });
        }
        Ok(IdMap {
            base,
            count: Self::COUNT,
        })
    }

    /// The host uid that makes a sandbox's user namespace (`key`: its id): its own budget of
    /// per-user kernel resources at the host's level. One of `count` uids just above the range, picked by
    /// a hash of the id (of the launcher's pid, `launcher-<pid>`, when a launcher makes it while
    /// it waits for its sandbox; two sandboxes that share one share that budget, nothing else: the
    /// owner's powers over a namespace belong to processes of that uid on the host, and none
    /// runs as it).
    pub fn owner(&self, key: &str) -> u32 {
        // FNV-1a.
        let mut h: u32 = 0x811c_9dc5;
        for b in key.bytes() {
            h = (h ^ b as u32).wrapping_mul(0x0100_0193);
        }
        self.base + self.count + h % self.count
    }
}

/// The file in a writable layer's root (outside the sandbox's view) naming the base of its ids.
pub const MARKER: &str = "ids";

/// Makes a user namespace with `map`, owned by host uid `owner`, and returns a descriptor of
/// it. Where the host refuses user namespaces to other uids than root, root owns it.
pub fn create(map: &IdMap, owner: u32) -> Result<OwnedFd, UsernsError> {
    let (ns, note) = create_noting(map, owner)?;
    if let Some(note) = note {
        eprintln!("cella: {note}");
    }
    Ok(ns)
}

/// [`create`], with what it would say (that the host's root made the namespace instead of
/// `owner`) returned instead of printed: for a caller whose standard error goes nowhere yet.
pub fn create_noting(map: &IdMap, owner: u32) -> Result<(OwnedFd, Option<String>), UsernsError> {
    match create_as(map, owner) {
        Ok(ns) => Ok((ns, None)),
        Err(e) if owner != 0 => {
            let ns = create_as(map, 0)?;
            Ok((ns, Some(format!("{e}; the host's root makes it instead"))))
        }
        Err(e) => Err(e),
    }
}

/// [`create`] with exactly this owner. A helper process creates the namespace and is gone when
/// this returns; the namespace lives on as long as the descriptor (or a process in it). The
/// helper makes only raw system calls, so the caller may be multi-threaded.
fn create_as(map: &IdMap, owner: u32) -> Result<OwnedFd, UsernsError> {
    // Close-on-exec: a child another thread of the caller starts meanwhile must not keep the
    // helper waiting.
    let pipe =
        || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(UsernsError::sys("pipe"));
    let (ready_r, ready_w) = pipe()?;
    let (hold_r, hold_w) = pipe()?;
    // SAFETY: the child makes only raw system calls (not the C library's set*id wrappers, which
    // synchronise threads) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(UsernsError::Io {
            what: "fork".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    if pid == 0 {
        // SAFETY: raw system calls on descriptors this process owns.
        unsafe {
            let become_owner = owner == 0
                || (libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) == 0
                    && libc::syscall(libc::SYS_setresgid, owner, owner, owner) == 0
                    && libc::syscall(libc::SYS_setresuid, owner, owner, owner) == 0);
            let ok: u8 = if become_owner && libc::unshare(libc::CLONE_NEWUSER) == 0 {
                1
            } else {
                0
            };
            libc::write(ready_w.as_raw_fd(), (&ok as *const u8).cast(), 1);
            // Wait until the parent has what it needs (it closes its end).
            let mut b = 0u8;
            libc::close(hold_w.as_raw_fd());
            libc::read(hold_r.as_raw_fd(), (&mut b as *mut u8).cast(), 1);
            libc::_exit(0);
        }
    }
    drop(ready_w);
    drop(hold_r);
    let res = (|| {
        let mut ok = [0u8; 1];
        let n = nix::unistd::read(ready_r.as_raw_fd(), &mut ok)?;
        if n != 1 || ok[0] != 1 {
            return Err(UsernsError::Refused(owner));
        }
        let line = format!("0 {} {}\n", map.base, map.count);
        for f in ["uid_map", "gid_map"] {
            std::fs::write(format!("/proc/{pid}/{f}"), &line)
                .map_err(UsernsError::io(format!("writing {f}")))?;
        }
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/user"))
            .map_err(UsernsError::io("opening the user namespace"))?;
        Ok(OwnedFd::from(ns))
    })();
    drop(hold_w);
    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
    res
}

/// A detached copy of the mount at `src` whose files appear through `userns`'s id mapping
/// (owner 0 on disk is the range's base). Attach it with [`attach`].
pub fn idmapped_clone(src: &Path, userns: BorrowedFd<'_>) -> Result<OwnedFd, UsernsError> {
    let path = CString::new(src.as_os_str().as_bytes())?;
    // SAFETY: valid pointers; a returned descriptor is ours.
    match unsafe { raw_idmapped_clone(&path, &idmap_attr(userns.as_raw_fd())) } {
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
        Err(step) => Err(UsernsError::Io {
            what: format!("{step} {}", src.display()),
            source: std::io::Error::last_os_error(),
        }),
    }
}

/// Attaches a detached mount (from [`idmapped_clone`]) at `target`.
pub fn attach(tree: &OwnedFd, target: &Path) -> Result<(), UsernsError> {
    let path = CString::new(target.as_os_str().as_bytes())?;
    // SAFETY: valid pointers.
    if !unsafe { raw_attach(tree.as_raw_fd(), &path) } {
        return Err(UsernsError::Io {
            what: format!("attaching the id-mapped mount at {}", target.display()),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

fn idmap_attr(userns: libc::c_int) -> libc::mount_attr {
    libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns as u64,
    }
}

/// `open_tree` + `mount_setattr`, with no allocation (also for a forked child): the new
/// descriptor, or the step that failed (errno says why).
///
/// # Safety
/// Plain system calls; `src` must be a valid C string.
unsafe fn raw_idmapped_clone(
    src: &std::ffi::CStr,
    attr: &libc::mount_attr,
) -> Result<libc::c_int, &'static str> {
    let fd = libc::syscall(
        libc::SYS_open_tree,
        libc::AT_FDCWD,
        src.as_ptr(),
        libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC as libc::c_uint,
    );
    if fd < 0 {
        return Err("cloning the mount of");
    }
    if libc::syscall(
        libc::SYS_mount_setattr,
        fd,
        c"".as_ptr(),
        libc::AT_EMPTY_PATH as libc::c_uint,
        attr as *const libc::mount_attr,
        std::mem::size_of::<libc::mount_attr>(),
    ) != 0
    {
        let e = *libc::__errno_location();
        libc::close(fd as libc::c_int);
        *libc::__errno_location() = e;
        return Err("id-mapping (the file system may not support it)");
    }
    Ok(fd as libc::c_int)
}

/// `move_mount` of a detached tree onto `target`, with no allocation.
///
/// # Safety
/// Plain system call; `target` must be a valid C string.
unsafe fn raw_attach(tree: libc::c_int, target: &std::ffi::CStr) -> bool {
    libc::syscall(
        libc::SYS_move_mount,
        tree,
        c"".as_ptr(),
        libc::AT_FDCWD,
        target.as_ptr(),
        libc::MOVE_MOUNT_F_EMPTY_PATH,
    ) == 0
}

/// Moves the calling (single-threaded) process into `userns` as its root: uid and gid 0 there,
/// no supplementary groups, every capability in that namespace and none outside it.
pub fn enter(userns: OwnedFd) -> Result<(), UsernsError> {
    nix::sched::setns(&userns, nix::sched::CloneFlags::CLONE_NEWUSER)
        .map_err(UsernsError::sys("entering the user namespace"))?;
    drop(userns);
    let root_u = nix::unistd::Uid::from_raw(0);
    let root_g = nix::unistd::Gid::from_raw(0);
    nix::unistd::setgroups(&[]).map_err(UsernsError::sys("setgroups"))?;
    nix::unistd::setresgid(root_g, root_g, root_g).map_err(UsernsError::sys("setresgid"))?;
    nix::unistd::setresuid(root_u, root_u, root_u).map_err(UsernsError::sys("setresuid"))?;
    Ok(())
}

/// Whether this host can give sandboxes user namespaces with `map` over files in `dirs`: in a
/// throwaway mount namespace, each directory is id-mapped and the lot mounted as the lower
/// layers of an overlay, as a boot does (kernels before 5.19 take id-mapped mounts but refuse
/// them as overlay layers). `scratch` is a directory to work in, removed after.
pub fn probe(map: &IdMap, dirs: &[&Path], scratch: &Path) -> Result<(), UsernsError> {
    let ns = create(map, map.owner("probe"))?;
    let _ = std::fs::remove_dir_all(scratch);
    let res = probe_overlay(&ns, dirs, scratch);
    let _ = std::fs::remove_dir_all(scratch);
    res
}

fn probe_overlay(ns: &OwnedFd, dirs: &[&Path], scratch: &Path) -> Result<(), UsernsError> {
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes());
    let mut srcs = Vec::new();
    let mut targets = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        let t = scratch.join(format!("l{i}"));
        std::fs::create_dir_all(&t).map_err(UsernsError::io(t.display().to_string()))?;
        srcs.push(c(d)?);
        targets.push(c(&t)?);
    }
    for d in ["upper", "work", "merged"] {
        std::fs::create_dir_all(scratch.join(d))?;
    }
    let lower: Vec<String> = (0..dirs.len())
        .map(|i| scratch.join(format!("l{i}")).display().to_string())
        .collect();
    let data = CString::new(format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.join(":"),
        scratch.join("upper").display(),
        scratch.join("work").display()
    ))?;
    let merged = c(&scratch.join("merged"))?;
    let attr = idmap_attr(ns.as_raw_fd());
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    // SAFETY: everything the child needs is allocated above; it makes only raw system calls,
    // reports the step that failed and its errno, and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(UsernsError::Io {
            what: "fork".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    if pid == 0 {
        unsafe {
            let fail = |step: i32| {
                let report = [step, *libc::__errno_location()];
                libc::write(w.as_raw_fd(), report.as_ptr().cast(), 8);
                libc::_exit(1);
            };
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                fail(1);
            }
            let root = c"/";
            let flags = libc::MS_REC | libc::MS_PRIVATE;
            if libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                flags,
                std::ptr::null(),
            ) != 0
            {
                fail(2);
            }
            for (src, target) in srcs.iter().zip(&targets) {
                match raw_idmapped_clone(src, &attr) {
                    Err(_) => fail(3),
                    Ok(fd) if !raw_attach(fd, target) => fail(4),
                    Ok(_) => {}
                }
            }
            let overlay = c"overlay";
            if libc::mount(
                overlay.as_ptr(),
                merged.as_ptr(),
                overlay.as_ptr(),
                0,
                data.as_ptr().cast(),
            ) != 0
            {
                fail(6);
            }
            libc::_exit(0);
        }
    }
    drop(w);
    let mut report = [0u8; 8];
    let n = nix::unistd::read(r.as_raw_fd(), &mut report).unwrap_or(0);
    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
    if n < 8 {
        return Ok(());
    }
    let step = i32::from_ne_bytes([report[0], report[1], report[2], report[3]]);
    let errno = i32::from_ne_bytes([report[4], report[5], report[6], report[7]]);
    let what = match step {
        1 | 2 => "making a mount namespace",
        3 => "id-mapping a mount (the file system may not support it)",
        4 => "attaching an id-mapped mount",
        _ => "mounting an overlay on id-mapped layers (this kernel may not support it: 5.19 or later does)",
    };
    Err(UsernsError::Io {
        what: what.into(),
        source: std::io::Error::from_raw_os_error(errno),
    })
}

/// The base a writable layer's ids use, as its marker records (None: no marker; a layer that
/// has files but no marker is from before user namespaces, base 0).
pub fn recorded_base(layer_root: &Path) -> Option<u32> {
    std::fs::read_to_string(layer_root.join(MARKER))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// Records `base` as the base of the ids in the layer at `layer_root`.
pub fn record_base(layer_root: &Path, base: u32) -> std::io::Result<()> {
    let tmp = layer_root.join(format!("{MARKER}.tmp"));
    std::fs::write(&tmp, format!("{base}\n"))?;
    std::fs::rename(&tmp, layer_root.join(MARKER))
}

/// Moves every owner and group in `root` (itself included) from `from..from + count` to
/// `to..to + count`; ids outside that span stay. Returns how many inodes changed.
///
/// The tree may be a sandbox's, so it is walked by descriptors: each directory opened with
/// `O_NOFOLLOW` relative to its parent's descriptor, each entry changed with `fchownat(...,
/// AT_SYMLINK_NOFOLLOW)` in its directory, never through a path or a link, and never across
/// into another file system; an inode with several links is changed once. Set-uid and set-gid
/// bits, which the kernel clears on a chown, are put back through an `O_NOFOLLOW` descriptor of
/// the file. (Extended attributes that name ids, file capabilities and ACLs, are not moved: the
/// chown drops a file capability.)
pub fn shift_tree(root: &Path, from: u32, to: u32, count: u32) -> std::io::Result<u64> {
    use nix::fcntl::OFlag;
    use nix::sys::stat::Mode;
    if from != to && from.abs_diff(to) < count && from != 0 && to != 0 {
        return Err(std::io::Error::other(format!(
            "the id ranges from {from} and {to} overlap"
        )));
    }
    let map = |id: u32| {
        if id >= from && id - from < count {
            id - from + to
        } else {
            id
        }
    };
    let dir_flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let top = match nix::dir::Dir::open(root, dir_flags, Mode::empty()) {
        Ok(d) => d,
        Err(nix::errno::Errno::ENOENT) => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    let st = nix::sys::stat::fstat(top.as_raw_fd())?;
    let mut walk = Walk {
        map: &map,
        dev: st.st_dev,
        seen: std::collections::HashSet::new(),
        changed: 0,
        dir_flags,
    };
    let (uid, gid) = (map(st.st_uid), map(st.st_gid));
    if (uid, gid) != (st.st_uid, st.st_gid) {
        nix::unistd::fchown(
            top.as_raw_fd(),
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        )?;
        walk.changed += 1;
    }
    walk.dir(top)?;
    Ok(walk.changed)
}

struct Walk<'a> {
    map: &'a dyn Fn(u32) -> u32,
    dev: libc::dev_t,
    seen: std::collections::HashSet<(libc::dev_t, libc::ino_t)>,
    changed: u64,
    dir_flags: nix::fcntl::OFlag,
}

impl Walk<'_> {
    fn dir(&mut self, mut dir: nix::dir::Dir) -> std::io::Result<()> {
        use nix::fcntl::{AtFlags, OFlag};
        use nix::sys::stat::{Mode, SFlag};
        let fd = dir.as_raw_fd();
        let names: Vec<CString> = dir
            .iter()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_owned())
            .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
            .collect();
        for name in names {
            let st = match nix::sys::stat::fstatat(
                Some(fd),
                name.as_c_str(),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            ) {
                Ok(st) => st,
                Err(nix::errno::Errno::ENOENT) => continue,
                Err(e) => return Err(e.into()),
            };
            if st.st_dev != self.dev {
                continue;
            }
            let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
            let is_dir = kind == SFlag::S_IFDIR;
            if !is_dir && st.st_nlink > 1 && !self.seen.insert((st.st_dev, st.st_ino)) {
                continue; // another link of an inode already moved
            }
            let (uid, gid) = ((self.map)(st.st_uid), (self.map)(st.st_gid));
            if (uid, gid) != (st.st_uid, st.st_gid) {
                nix::unistd::fchownat(
                    Some(fd),
                    name.as_c_str(),
                    Some(nix::unistd::Uid::from_raw(uid)),
                    Some(nix::unistd::Gid::from_raw(gid)),
                    AtFlags::AT_SYMLINK_NOFOLLOW,
                )?;
                self.changed += 1;
                if kind == SFlag::S_IFREG && st.st_mode & 0o6000 != 0 {
                    let f = nix::fcntl::openat(
                        Some(fd),
                        name.as_c_str(),
                        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
                        Mode::empty(),
                    )?;
                    // SAFETY: a descriptor just opened, owned here.
                    let f = unsafe { OwnedFd::from_raw_fd(f) };
                    nix::sys::stat::fchmod(
                        f.as_raw_fd(),
                        Mode::from_bits_truncate(st.st_mode & 0o7777),
                    )?;
                }
            }
            if is_dir {
                let sub = nix::dir::Dir::openat(
                    Some(fd),
                    name.as_c_str(),
                    self.dir_flags,
                    Mode::empty(),
                )?;
                self.dir(sub)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn the_range_must_fit_above_the_first_ids() {
        assert!(IdMap::new(1000).is_err());
        assert!(IdMap::new(u32::MAX - 10).is_err());
        assert!(IdMap::new(u32::MAX - 100_000).is_err());
        assert!(IdMap::new(2_147_400_000).is_err());
        assert!(IdMap::new(2_147_000_000).is_ok());
        let m = IdMap::new(IdMap::DEFAULT_BASE).unwrap();
        let owners: Vec<u32> = ["sba", "sbb", "sbc"].iter().map(|id| m.owner(id)).collect();
        for o in &owners {
            assert!((1_000_065_536..1_000_131_072).contains(o), "{o}");
        }
        assert!(owners[0] != owners[1] && owners[1] != owners[2]);
        assert_eq!((m.base, m.count), (1_000_000_000, 65536));
    }

    #[test]
    fn shifting_moves_ids_in_the_span_and_keeps_links_and_setuid_bits() {
        if !nix::unistd::geteuid().is_root() {
            return; // chown needs root
        }
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        std::fs::create_dir(r.join("d")).unwrap();
        std::fs::write(r.join("d/f"), "x").unwrap();
        std::os::unix::fs::chown(r.join("d/f"), Some(1000), Some(1000)).unwrap();
        std::fs::write(r.join("suid"), "x").unwrap();
        std::fs::set_permissions(r.join("suid"), std::fs::Permissions::from_mode(0o4755)).unwrap();
        std::fs::write(r.join("far"), "x").unwrap();
        std::os::unix::fs::chown(r.join("far"), Some(70000), Some(70000)).unwrap();
        // A link to a host file: its target must not change.
        let outside = tempfile::NamedTempFile::new().unwrap();
        std::os::unix::fs::symlink(outside.path(), r.join("link")).unwrap();
        let n = shift_tree(r, 0, 5_000_000, 65536).unwrap();
        assert_eq!(n, 5); // root, d, d/f, suid, link (far is out of the span)
        let m = |p: &str| std::fs::symlink_metadata(r.join(p)).unwrap();
        assert_eq!((m("d/f").uid(), m("d/f").gid()), (5_001_000, 5_001_000));
        assert_eq!(m("suid").uid(), 5_000_000);
        assert_eq!(m("suid").mode() & 0o7777, 0o4755);
        assert_eq!(m("far").uid(), 70000);
        assert_eq!(m("link").uid(), 5_000_000);
        assert_eq!(std::fs::metadata(outside.path()).unwrap().uid(), 0);
        // And back.
        shift_tree(r, 5_000_000, 0, 65536).unwrap();
        assert_eq!(m("d/f").uid(), 1000);
        assert_eq!(m("").uid(), 0);
    }

    #[test]
    fn a_user_namespace_maps_the_range_and_ids_mount_through_it() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let map = IdMap::new(IdMap::DEFAULT_BASE).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        probe(
            &map,
            &[dir.path(), Path::new("/usr")],
            &scratch.path().join("p"),
        )
        .unwrap();
        assert!(!scratch.path().join("p").exists());
        let ns = create(&map, map.owner("sbtest")).unwrap();
        let tree = idmapped_clone(dir.path(), ns.as_fd()).unwrap();
        // The detached tree shows the directory (owned by 0 on disk) as owned by the base.
        let st = nix::sys::stat::fstat(tree.as_raw_fd()).unwrap();
        assert_eq!(st.st_uid, IdMap::DEFAULT_BASE);
        assert_eq!(dir.path().metadata().unwrap().uid(), 0);
    }
}
