//! The mount plan of a sandbox's root, as data.
//!
//! [`plan`] is a pure function from the launch configuration to a list of operations, so what a
//! sandbox can see is unit-tested without root; [`apply`] carries one operation out.

use super::LaunchConfig;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountOp {
    /// Stop every mount event from propagating back to the host.
    MakePrivate,
    /// Mount the sandbox's disk image (its own file system, sized to its quota).
    Disk {
        image: PathBuf,
        target: PathBuf,
        /// The loop device whose file system the disk pool mounted ahead for this image: it is
        /// mounted again, sharing that file system ([`crate::disk::mount_attached`]).
        device: Option<PathBuf>,
    },
    /// Make the overlay's upper and work directories and write the sandbox's own `/etc/hostname`
    /// and `/etc/hosts` into the upper layer.
    PrepareUpper {
        upper: PathBuf,
        work: PathBuf,
        hostname: String,
        /// Host id owning what this makes (the user namespace's root; 0 without one).
        owner: u32,
    },
    /// Bring the ids of the writable layer at `layer` (its `upper` and layered binds' uppers)
    /// to base `to`, as [`crate::userns::MARKER`] records (see [`crate::userns::shift_tree`]).
    ShiftIds {
        layer: PathBuf,
        upper: PathBuf,
        to: u32,
    },
    /// Directories beside the upper layer (outside the sandbox's view), made if missing; a
    /// directory made here is given to `owner` (0: left to the host's root).
    MakeDirs {
        dirs: Vec<PathBuf>,
        owner: u32,
    },
    /// Attach an id-mapped copy of the mount at `src` on `target` (the sandbox's user
    /// namespace's mapping: files owned by 0 on disk are its root).
    Idmap {
        src: PathBuf,
        target: PathBuf,
    },
    Overlay {
        lower: Vec<PathBuf>,
        upper: PathBuf,
        work: PathBuf,
        target: PathBuf,
        /// nosuid and nodev (the layered binds: the host's files never count as set-uid there).
        restricted: bool,
    },
    Bind {
        src: PathBuf,
        target: PathBuf,
        readonly: bool,
        file: bool,
    },
    Proc {
        target: PathBuf,
    },
    Sysfs {
        target: PathBuf,
    },
    Tmpfs {
        target: PathBuf,
        data: String,
        flags: MsFlags,
    },
    Devpts {
        target: PathBuf,
        /// Host gid of the `tty` group.
        tty_gid: u32,
    },
    /// Hide a path: an empty read-only tmpfs over a directory, `/dev/null` over a file.
    /// Skipped when the kernel does not have the path.
    Mask {
        target: PathBuf,
    },
    /// A character device node of its own, mode 0666.
    DevNode {
        target: PathBuf,
        major: u32,
        minor: u32,
        owner: u32,
    },
    /// Make a path read-only (bind it onto itself, then remount). Skipped when absent.
    ReadOnly {
        target: PathBuf,
    },
    Symlink {
        link: PathBuf,
        to: PathBuf,
        owner: u32,
    },
    /// Make `root` the root of the mount namespace and drop the old one.
    PivotRoot {
        root: PathBuf,
    },
}

/// Paths OCI runtimes hide from a container: kernel memory, keyrings, timers, firmware.
pub const MASKED: &[&str] = &[
    "proc/acpi",
    "proc/asound",
    "proc/kcore",
    "proc/keys",
    "proc/latency_stats",
    "proc/timer_list",
    "proc/timer_stats",
    "proc/sched_debug",
    "proc/scsi",
    "sys/firmware",
    "sys/devices/virtual/powercap",
];

/// Paths OCI runtimes make read-only: kernel tunables, the SysRq trigger, bus and irq settings.
pub const READ_ONLY: &[&str] = &[
    "proc/bus",
    "proc/fs",
    "proc/irq",
    "proc/sys",
    "proc/sysrq-trigger",
];

/// Device nodes made in a sandbox's `/dev`: its own nodes (made with mknod, not bound from the
/// host, whose nodes the sandbox's root could otherwise chmod or chown for everyone).
pub const DEVICES: &[(&str, u32, u32)] = &[
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("random", 1, 8),
    ("urandom", 1, 9),
    ("tty", 5, 0),
];

fn inside(root: &Path, p: &Path) -> PathBuf {
    root.join(p.strip_prefix("/").unwrap_or(p))
}

/// Where a sandbox's id-mapped views of its layers are attached (beside its root, on the host
/// side, in its own mount namespace only).
pub fn idmap_dir(cfg: &LaunchConfig) -> PathBuf {
    cfg.rootfs.parent().unwrap_or(Path::new("/")).join("idmap")
}

pub fn plan(cfg: &LaunchConfig) -> Vec<MountOp> {
    let mut ops = root_plan(cfg);
    ops.extend(kernel_plan(cfg));
    ops
}

/// The first part of [`plan`]: the sandbox's files at `cfg.rootfs` (the disk, the overlay of the
/// template's layers and the writable layer, the template's binds), without the kernel's file
/// systems, devices or the pivot. The gVisor driver serves this tree to `runsc` as the root.
pub fn root_plan(cfg: &LaunchConfig) -> Vec<MountOp> {
    let r = &cfg.rootfs;
    // With a user namespace, what the sandbox makes belongs to its root's host id.
    let owner = cfg.userns.map_or(0, |m| m.base);
    let mut ops = vec![MountOp::MakePrivate];
    if let Some(image) = &cfg.disk {
        ops.push(MountOp::Disk {
            image: image.clone(),
            target: cfg.disk_mount.clone(),
            device: cfg.disk_device.clone(),
        });
    }
    ops.push(MountOp::ShiftIds {
        layer: layer_root(cfg),
        upper: cfg.upper.clone(),
        to: owner,
    });
    ops.push(MountOp::PrepareUpper {
        upper: cfg.upper.clone(),
        work: cfg.work.clone(),
        hostname: cfg.hostname.clone(),
        owner,
    });
    // The read-only layers and host directories, as the sandbox sees them: through id-mapped
    // mounts when it has a user namespace (their files hold ids from 0 on disk).
    let (layers, bind_srcs): (Vec<PathBuf>, Vec<PathBuf>) = match cfg.userns {
        None => (
            cfg.layers.clone(),
            cfg.binds.iter().map(|b| b.src.clone()).collect(),
        ),
        Some(_) => {
            let dir = idmap_dir(cfg);
            let layers: Vec<PathBuf> = (0..cfg.layers.len())
                .map(|i| dir.join(format!("l{i}")))
                .collect();
            let binds: Vec<PathBuf> = (0..cfg.binds.len())
                .map(|i| dir.join(format!("b{i}")))
                .collect();
            ops.push(MountOp::MakeDirs {
                dirs: layers.iter().chain(&binds).cloned().collect(),
                owner: 0,
            });
            let srcs = cfg.layers.iter().chain(cfg.binds.iter().map(|b| &b.src));
            for (src, target) in srcs.zip(layers.iter().chain(&binds)) {
                ops.push(MountOp::Idmap {
                    src: src.clone(),
                    target: target.clone(),
                });
            }
            (layers, binds)
        }
    };
    ops.extend([MountOp::Overlay {
        lower: layers.clone(),
        upper: cfg.upper.clone(),
        work: cfg.work.clone(),
        target: r.clone(),
        restricted: false,
    }]);
    for (b, src) in cfg.binds.iter().zip(&bind_srcs) {
        if b.layered {
            // An overlay of its own: the template layers' files under `dst` over the host's.
            let (upper, work) = bind_layer(cfg, &b.dst);
            let mut lower: Vec<PathBuf> = cfg
                .layers
                .iter()
                .zip(&layers)
                .filter(|(real, _)| inside(real, &b.dst).is_dir())
                .map(|(_, seen)| inside(seen, &b.dst))
                .collect();
            lower.push(src.clone());
            ops.push(MountOp::MakeDirs {
                dirs: vec![upper.clone()],
                owner,
            });
            ops.push(MountOp::MakeDirs {
                dirs: vec![work.clone()],
                owner: 0,
            });
            ops.push(MountOp::Overlay {
                lower,
                upper,
                work,
                target: inside(r, &b.dst),
                restricted: true,
            });
        } else {
            ops.push(MountOp::Bind {
                src: src.clone(),
                target: inside(r, &b.dst),
                // Through an id-mapped mount the sandbox's root would write as the host's.
                readonly: b.readonly || cfg.userns.is_some(),
                file: false,
            });
        }
    }
    ops
}

/// The second part of [`plan`]: `/proc`, `/sys`, `/dev` and `/run` of a namespace sandbox, then
/// the pivot.
fn kernel_plan(cfg: &LaunchConfig) -> Vec<MountOp> {
    let r = &cfg.rootfs;
    let owner = cfg.userns.map_or(0, |m| m.base);
    let mut ops = vec![MountOp::Proc {
        target: r.join("proc"),
    }];
    ops.push(MountOp::Sysfs {
        target: r.join("sys"),
    });
    for p in MASKED {
        ops.push(MountOp::Mask { target: r.join(p) });
    }
    for p in READ_ONLY {
        ops.push(MountOp::ReadOnly { target: r.join(p) });
    }
    let ids = match owner {
        0 => String::new(),
        o => format!(",uid={o},gid={o}"),
    };
    ops.push(MountOp::Tmpfs {
        target: r.join("dev"),
        data: format!("mode=755,size=65536k{ids}"),
        flags: MsFlags::MS_NOSUID | MsFlags::MS_STRICTATIME,
    });
    for (name, major, minor) in DEVICES {
        ops.push(MountOp::DevNode {
            target: r.join("dev").join(name),
            major: *major,
            minor: *minor,
            owner,
        });
    }
    ops.push(MountOp::Devpts {
        target: r.join("dev/pts"),
        tty_gid: owner + 5,
    });
    ops.push(MountOp::Tmpfs {
        target: r.join("dev/shm"),
        data: format!("mode=1777,size=65536k{ids}"),
        flags: MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
    });
    for (link, to) in [
        ("dev/ptmx", "pts/ptmx"),
        ("dev/fd", "/proc/self/fd"),
        ("dev/stdin", "/proc/self/fd/0"),
        ("dev/stdout", "/proc/self/fd/1"),
        ("dev/stderr", "/proc/self/fd/2"),
    ] {
        ops.push(MountOp::Symlink {
            link: r.join(link),
            to: to.into(),
            owner,
        });
    }
    ops.push(MountOp::Tmpfs {
        target: r.join("run"),
        data: format!("mode=755,size=65536k{ids}"),
        flags: MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
    });
    ops.push(MountOp::PivotRoot { root: r.clone() });
    ops
}

/// The cause of a failed step: an `std::io::Error` or a `nix` errno, kept as it came (so the
/// message reads as the call's own).
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// Why a mount operation failed. The messages name the step and its path; they reach the
/// launcher's answer, so the boot's error (and the server's log) reads them.
#[derive(Debug, thiserror::Error)]
pub enum MountOpError {
    /// A step on a path (`what` names it: "creating", "binding", "mounting proc on", ...).
    #[error("{what} {}: {source}", .path.display())]
    At {
        what: &'static str,
        path: PathBuf,
        source: Cause,
    },
    /// A step on no path of its own (`what` names it).
    #[error("{what}: {source}")]
    Step { what: &'static str, source: Cause },
    #[error("overlay paths must not contain ',' or ':'")]
    OverlayPath,
    #[error("an id-mapped mount needs the user namespace")]
    NoUserns,
    #[error(transparent)]
    Userns(#[from] crate::userns::UsernsError),
    #[error(transparent)]
    Disk(#[from] crate::disk::MountError),
}

fn err(what: &'static str, target: &Path, e: impl Into<Cause>) -> MountOpError {
    MountOpError::At {
        what,
        path: target.to_path_buf(),
        source: e.into(),
    }
}

fn step(what: &'static str) -> impl FnOnce(nix::errno::Errno) -> MountOpError {
    move |e| MountOpError::Step {
        what,
        source: e.into(),
    }
}

/// Creates `p` anew, never through a link, with `data` and mode 0644.
fn write_new(p: &Path, data: &[u8]) -> Result<(), MountOpError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(p)
        .map_err(|e| err("creating", p, e))?;
    f.write_all(data).map_err(|e| err("writing", p, e))
}

/// A short name of an operation's kind, for timing logs.
pub fn label(op: &MountOp) -> &'static str {
    match op {
        MountOp::MakePrivate => "private",
        MountOp::Disk { .. } => "disk",
        MountOp::PrepareUpper { .. } | MountOp::MakeDirs { .. } => "upper",
        MountOp::ShiftIds { .. } => "ids",
        MountOp::Idmap { .. } => "idmap",
        MountOp::Overlay { .. } => "overlay",
        MountOp::Bind { .. } => "bind",
        MountOp::Proc { .. } => "proc",
        MountOp::Sysfs { .. } => "sysfs",
        MountOp::Tmpfs { .. } => "tmpfs",
        MountOp::Devpts { .. } => "devpts",
        MountOp::DevNode { .. } => "devnode",
        MountOp::Mask { .. } => "mask",
        MountOp::ReadOnly { .. } => "readonly",
        MountOp::Symlink { .. } => "symlink",
        MountOp::PivotRoot { .. } => "pivot",
    }
}

/// The upper and work directories of a layered bind at `dst`, beside the sandbox's own upper
/// layer (`<layer>/binds/<name>/{upper,work}`).
pub fn bind_layer(cfg: &LaunchConfig, dst: &Path) -> (PathBuf, PathBuf) {
    let dir = layer_root(cfg).join("binds").join(bind_name(dst));
    (dir.join("upper"), dir.join("work"))
}

/// The directory holding the sandbox's writable layer: `upper`, `work`, `binds/` and the
/// [`crate::userns::MARKER`] (the disk image's root, or the sandbox's directory).
pub fn layer_root(cfg: &LaunchConfig) -> PathBuf {
    cfg.upper.parent().unwrap_or(Path::new("/")).to_path_buf()
}

/// Brings a writable layer's ids to base `to` (see [`MountOp::ShiftIds`]).
fn shift_layer(layer: &Path, upper: &Path, to: u32) -> Result<(), MountOpError> {
    let recorded = crate::userns::recorded_base(layer);
    // No record: a layer with files is from before user namespaces (ids from 0); a new one
    // is made with `to` from the start.
    let from = recorded.unwrap_or(if upper.exists() { 0 } else { to });
    if from != to {
        let mut trees = vec![upper.to_path_buf()];
        if let Ok(rd) = std::fs::read_dir(layer.join("binds")) {
            trees.extend(rd.flatten().map(|e| e.path().join("upper")));
        }
        for t in trees.iter().filter(|t| t.exists()) {
            crate::userns::shift_tree(t, from, to, crate::userns::IdMap::COUNT)
                .map_err(|e| err("shifting the ids of", t, e))?;
        }
    }
    if recorded != Some(to) {
        // Not fatal (a full disk has no room for the record): the shift is idempotent, so the
        // next boot shifts nothing more and records again.
        if let Err(e) = crate::userns::record_base(layer, to) {
            // Dropped when the setup log cannot be written (a full disk): see `launch::log_line`.
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "{}", err("recording ids in", layer, e));
        }
    }
    Ok(())
}

/// Lays out a new writable layer at `root` (an empty file system's root, never a sandbox's) as
/// a first boot whose root is `owner` would: the ids marker, `upper` and its `etc` (given to
/// `owner`), `work`. The disk pool does this ahead, so that `ShiftIds` and `PrepareUpper` find
/// them made and have only `/etc/hostname` and `/etc/hosts` left to write (their first creations
/// on a new ext4 cost a boot about 1 ms here).
///
/// The marker comes last: a layout cut short has none, so a boot takes what it finds for a layer
/// from before user namespaces and shifts it to its root (the entries are then its own all the
/// same).
pub fn lay_out(root: &Path, owner: u32) -> Result<(), MountOpError> {
    let upper = root.join("upper");
    for d in [&upper, &root.join("work"), &upper.join("etc")] {
        std::fs::create_dir(d).map_err(|e| err("creating", d, e))?;
    }
    give(&upper, owner)?;
    give(&upper.join("etc"), owner)?;
    crate::userns::record_base(root, owner).map_err(|e| err("recording ids in", root, e))
}

/// Gives `p` to `owner` (without following a link); owner 0 leaves it to the host's root.
fn give(p: &Path, owner: u32) -> Result<(), MountOpError> {
    if owner == 0 {
        return Ok(());
    }
    std::os::unix::fs::lchown(p, Some(owner), Some(owner)).map_err(|e| err("chown", p, e))
}

/// `/usr/local` -> `usr_local`.
pub fn bind_name(dst: &Path) -> String {
    dst.to_string_lossy().trim_matches('/').replace('/', "_")
}

/// Carries out `op`; `userns` is the sandbox's user namespace (needed by [`MountOp::Idmap`]).
pub fn apply(op: &MountOp, userns: Option<BorrowedFd<'_>>) -> Result<(), MountOpError> {
    const NONE: Option<&str> = None;
    match op {
        MountOp::MakeDirs { dirs, owner } => {
            for d in dirs {
                if !d.exists() {
                    std::fs::create_dir_all(d).map_err(|e| err("creating", d, e))?;
                    give(d, *owner)?;
                }
            }
            Ok(())
        }
        MountOp::ShiftIds { layer, upper, to } => shift_layer(layer, upper, *to),
        MountOp::Idmap { src, target } => {
            let ns = userns.ok_or(MountOpError::NoUserns)?;
            let tree = crate::userns::idmapped_clone(src, ns)?;
            Ok(crate::userns::attach(&tree, target)?)
        }
        MountOp::MakePrivate => mount(NONE, "/", NONE, MsFlags::MS_REC | MsFlags::MS_PRIVATE, NONE)
            .map_err(step("making / private")),
        MountOp::Overlay {
            lower,
            upper,
            work,
            target,
            restricted,
        } => {
            let all: Vec<&Path> = lower
                .iter()
                .map(|p| p.as_path())
                .chain([upper.as_path(), work.as_path()])
                .collect();
            if all.iter().any(|p| p.to_string_lossy().contains([',', ':'])) {
                return Err(MountOpError::OverlayPath);
            }
            let lower = lower
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(":");
            let data = format!(
                "lowerdir={lower},upperdir={},workdir={}",
                upper.display(),
                work.display()
            );
            let flags = if *restricted {
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV
            } else {
                MsFlags::empty()
            };
            mount(
                Some("overlay"),
                target,
                Some("overlay"),
                flags,
                Some(data.as_str()),
            )
            .map_err(|e| err("mounting overlay on", target, e))
        }
        MountOp::Bind {
            src,
            target,
            readonly,
            file,
        } => {
            if *file {
                if !target.exists() {
                    std::fs::File::create(target).map_err(|e| err("creating", target, e))?;
                }
            } else {
                std::fs::create_dir_all(target).map_err(|e| err("creating", target, e))?;
            }
            mount(
                Some(src.as_path()),
                target,
                NONE,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                NONE,
            )
            .map_err(|e| err("binding", target, e))?;
            if *readonly {
                let flags = MsFlags::MS_BIND
                    | MsFlags::MS_REMOUNT
                    | MsFlags::MS_RDONLY
                    | MsFlags::MS_NOSUID
                    | MsFlags::MS_NODEV;
                mount(NONE, target, NONE, flags, NONE)
                    .map_err(|e| err("making read-only", target, e))?;
            }
            Ok(())
        }
        MountOp::Proc { target } => {
            std::fs::create_dir_all(target).map_err(|e| err("creating", target, e))?;
            let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
            mount(Some("proc"), target, Some("proc"), flags, NONE)
                .map_err(|e| err("mounting proc on", target, e))
        }
        MountOp::Sysfs { target } => {
            std::fs::create_dir_all(target).map_err(|e| err("creating", target, e))?;
            let flags =
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | MsFlags::MS_RDONLY;
            mount(Some("sysfs"), target, Some("sysfs"), flags, NONE)
                .map_err(|e| err("mounting sysfs on", target, e))
        }
        MountOp::Tmpfs {
            target,
            data,
            flags,
        } => {
            std::fs::create_dir_all(target).map_err(|e| err("creating", target, e))?;
            mount(
                Some("tmpfs"),
                target,
                Some("tmpfs"),
                *flags,
                Some(data.as_str()),
            )
            .map_err(|e| err("mounting tmpfs on", target, e))
        }
        MountOp::Devpts { target, tty_gid } => {
            std::fs::create_dir_all(target).map_err(|e| err("creating", target, e))?;
            let flags = MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC;
            let data = format!("newinstance,ptmxmode=0666,mode=0620,gid={tty_gid}");
            mount(
                Some("devpts"),
                target,
                Some("devpts"),
                flags,
                Some(data.as_str()),
            )
            .map_err(|e| err("mounting devpts on", target, e))
        }
        MountOp::Symlink { link, to, owner } => {
            let _ = std::fs::remove_file(link);
            std::os::unix::fs::symlink(to, link).map_err(|e| err("linking", link, e))?;
            give(link, *owner)
        }
        MountOp::Disk {
            image,
            target,
            device: None,
        } => Ok(crate::disk::mount_image(image, target)?),
        MountOp::Disk {
            image,
            target,
            device: Some(dev),
        } => Ok(crate::disk::mount_attached(dev, image, target)?),
        MountOp::PrepareUpper {
            upper,
            work,
            hostname,
            owner,
        } => {
            // The upper layer belongs to the sandbox, whose root may have left symlinks where
            // these entries go. No sandbox process runs during boot (no race): whatever stands in
            // the way is removed, never followed, and the files are made anew with O_NOFOLLOW.
            if !upper.exists() {
                std::fs::create_dir_all(upper).map_err(|e| err("creating", upper, e))?;
                // The sandbox's `/`.
                give(upper, *owner)?;
            }
            std::fs::create_dir_all(work).map_err(|e| err("creating", work, e))?;
            let etc = upper.join("etc");
            match std::fs::symlink_metadata(&etc) {
                Ok(m) if m.is_dir() => {} // the sandbox's own /etc changes: kept
                Ok(_) => std::fs::remove_file(&etc).map_err(|e| err("removing", &etc, e))?,
                Err(_) => {}
            }
            if std::fs::symlink_metadata(&etc).is_err() {
                std::fs::create_dir(&etc).map_err(|e| err("creating", &etc, e))?;
                give(&etc, *owner)?;
            }
            let hosts = crate::rootfs::hosts_file(hostname);
            for (name, text) in [("hostname", format!("{hostname}\n")), ("hosts", hosts)] {
                let f = etc.join(name);
                match std::fs::symlink_metadata(&f) {
                    Ok(m) if m.is_dir() => {
                        std::fs::remove_dir_all(&f).map_err(|e| err("removing", &f, e))?
                    }
                    Ok(_) => std::fs::remove_file(&f).map_err(|e| err("removing", &f, e))?,
                    Err(_) => {}
                }
                write_new(&f, text.as_bytes())?;
                give(&f, *owner)?;
            }
            Ok(())
        }
        MountOp::DevNode {
            target,
            major,
            minor,
            owner,
        } => {
            use std::os::unix::fs::PermissionsExt;
            nix::sys::stat::mknod(
                target.as_path(),
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o666),
                nix::sys::stat::makedev(*major as u64, *minor as u64),
            )
            .map_err(|e| err("making device", target, e))?;
            // mknod is subject to the umask.
            std::fs::set_permissions(target, std::fs::Permissions::from_mode(0o666))
                .map_err(|e| err("chmod", target, e))?;
            give(target, *owner)
        }
        MountOp::Mask { target } => match std::fs::symlink_metadata(target) {
            Err(_) => Ok(()),
            Ok(m) if m.is_dir() => {
                let flags = MsFlags::MS_RDONLY
                    | MsFlags::MS_NOSUID
                    | MsFlags::MS_NODEV
                    | MsFlags::MS_NOEXEC;
                mount(
                    Some("tmpfs"),
                    target,
                    Some("tmpfs"),
                    flags,
                    Some("size=0,mode=0555"),
                )
                .map_err(|e| err("masking", target, e))
            }
            Ok(_) => mount(Some("/dev/null"), target, NONE, MsFlags::MS_BIND, NONE)
                .map_err(|e| err("masking", target, e)),
        },
        MountOp::ReadOnly { target } => {
            if std::fs::symlink_metadata(target).is_err() {
                return Ok(());
            }
            mount(
                Some(target.as_path()),
                target,
                NONE,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                NONE,
            )
            .map_err(|e| err("binding", target, e))?;
            let flags = MsFlags::MS_BIND
                | MsFlags::MS_REMOUNT
                | MsFlags::MS_RDONLY
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV
                | MsFlags::MS_NOEXEC;
            mount(NONE, target, NONE, flags, NONE).map_err(|e| err("making read-only", target, e))
        }
        MountOp::PivotRoot { root } => {
            nix::unistd::chdir(root.as_path()).map_err(|e| err("entering", root, e))?;
            // Stack the old root under the new one, then detach it.
            nix::unistd::pivot_root(".", ".").map_err(|e| err("pivot_root to", root, e))?;
            umount2(".", MntFlags::MNT_DETACH).map_err(step("detaching the old root"))?;
            nix::unistd::chdir("/").map_err(step("chdir /"))
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::rootfs::Bind;

    pub(crate) fn cfg() -> LaunchConfig {
        LaunchConfig {
            id: "sbtest".into(),
            hostname: "sbtest".into(),
            layers: vec!["/data/templates/base/v1/rootfs".into()],
            upper: "/data/sandboxes/sbtest/upper".into(),
            work: "/data/sandboxes/sbtest/work".into(),
            rootfs: "/data/sandboxes/sbtest/rootfs".into(),
            binds: vec![
                Bind {
                    src: "/usr".into(),
                    dst: "/usr".into(),
                    readonly: true,
                    layered: false,
                },
                Bind {
                    src: "/opt/host-lib".into(),
                    dst: "/usr/lib/extra".into(),
                    readonly: true,
                    layered: true,
                },
            ],
            socket: "/data/run/sbtest.sock".into(),
            cgroup: "cella/x/sbtest".into(),
            disk: None,
            disk_mount: "/data/sandboxes/sbtest/disk".into(),
            disk_device: None,
            network: None,
            userns: None,
            nofile: 0,
            fast_cgroup_moves: false,
        }
    }

    #[test]
    fn kernel_interfaces_are_masked_or_read_only_after_proc_and_sys() {
        let ops = plan(&cfg());
        let sys_at = ops
            .iter()
            .position(|o| matches!(o, MountOp::Sysfs { .. }))
            .unwrap();
        let r = Path::new("/data/sandboxes/sbtest/rootfs");
        for p in ["proc/kcore", "proc/keys", "sys/firmware"] {
            let at = ops
                .iter()
                .position(|o| o == &MountOp::Mask { target: r.join(p) })
                .unwrap();
            assert!(at > sys_at, "{p} masked before /proc and /sys exist");
        }
        for p in ["proc/sys", "proc/sysrq-trigger"] {
            assert!(ops.contains(&MountOp::ReadOnly { target: r.join(p) }));
        }
    }

    #[test]
    fn root_is_private_overlay_then_pivot() {
        let mut c = cfg();
        c.disk = Some("/data/sandboxes/sbtest/disk.img".into());
        let with_disk = plan(&c);
        assert!(
            matches!(&with_disk[1], MountOp::Disk { target, .. } if target == Path::new("/data/sandboxes/sbtest/disk"))
        );
        assert!(
            matches!(&with_disk[2], MountOp::ShiftIds { layer, .. } if layer == Path::new("/data/sandboxes/sbtest"))
        );
        assert!(matches!(&with_disk[3], MountOp::PrepareUpper { .. }));
        let ops = plan(&cfg());
        assert_eq!(ops[0], MountOp::MakePrivate);
        assert!(matches!(&ops[1], MountOp::ShiftIds { to: 0, .. }));
        assert!(matches!(&ops[2], MountOp::PrepareUpper { owner: 0, .. }));
        assert!(
            matches!(&ops[3], MountOp::Overlay { target, .. } if target == Path::new("/data/sandboxes/sbtest/rootfs"))
        );
        assert!(matches!(ops.last(), Some(MountOp::PivotRoot { .. })));
    }

    #[test]
    fn only_template_binds_come_from_the_host_and_devices_are_made() {
        let ops = plan(&cfg());
        let binds: Vec<_> = ops
            .iter()
            .filter_map(|o| match o {
                MountOp::Bind {
                    src,
                    target,
                    readonly,
                    ..
                } => Some((src.clone(), target.clone(), *readonly)),
                _ => None,
            })
            .collect();
        assert_eq!(
            binds,
            vec![(
                "/usr".into(),
                "/data/sandboxes/sbtest/rootfs/usr".into(),
                true
            )]
        );
        // A layered bind is an overlay whose bottom layer is the host directory, with its
        // upper and work directories beside the sandbox's own upper layer.
        let layered = ops
            .iter()
            .find_map(|o| match o {
                MountOp::Overlay {
                    lower,
                    upper,
                    work,
                    target,
                    restricted: true,
                } if target == Path::new("/data/sandboxes/sbtest/rootfs/usr/lib/extra") => {
                    Some((lower.clone(), upper.clone(), work.clone()))
                }
                _ => None,
            })
            .unwrap();
        assert_eq!(layered.0.last().unwrap(), Path::new("/opt/host-lib"));
        assert_eq!(
            layered.1,
            Path::new("/data/sandboxes/sbtest/binds/usr_lib_extra/upper")
        );
        assert_eq!(
            layered.2,
            Path::new("/data/sandboxes/sbtest/binds/usr_lib_extra/work")
        );
        let nodes: Vec<_> = ops
            .iter()
            .filter(|o| matches!(o, MountOp::DevNode { .. }))
            .collect();
        assert_eq!(nodes.len(), DEVICES.len());
        // Every target lies inside the sandbox's root.
        for op in &ops {
            if let MountOp::Bind { target, .. }
            | MountOp::Tmpfs { target, .. }
            | MountOp::Proc { target }
            | MountOp::DevNode { target, .. } = op
            {
                assert!(target.starts_with("/data/sandboxes/sbtest/rootfs"));
            }
        }
    }
}

#[cfg(test)]
mod userns_tests {
    use super::*;

    #[test]
    fn with_a_user_namespace_every_lower_layer_is_seen_through_an_idmapped_mount() {
        let dir = tempfile::tempdir().unwrap();
        let layer = dir.path().join("layer");
        std::fs::create_dir_all(layer.join("usr/lib/extra")).unwrap();
        let mut c = super::tests::cfg();
        c.layers = vec![layer.clone()];
        c.userns = Some(crate::userns::IdMap::new(1_000_000_000).unwrap());
        let ops = plan(&c);
        let staging = Path::new("/data/sandboxes/sbtest/idmap");
        let idmaps: Vec<(PathBuf, PathBuf)> = ops
            .iter()
            .filter_map(|o| match o {
                MountOp::Idmap { src, target } => Some((src.clone(), target.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(
            idmaps,
            vec![
                (layer.clone(), staging.join("l0")),
                ("/usr".into(), staging.join("b0")),
                ("/opt/host-lib".into(), staging.join("b1")),
            ]
        );
        // No overlay or bind reads a layer or host directory other than through its mapping.
        for op in &ops {
            match op {
                MountOp::Overlay { lower, .. } => {
                    assert!(lower.iter().all(|l| l.starts_with(staging)), "{lower:?}")
                }
                MountOp::Bind { src, .. } => assert!(src.starts_with(staging)),
                _ => {}
            }
        }
        // The layer's files under a layered bind join that bind's overlay, mapped too; the
        // sandbox's own mounts and files belong to its root.
        assert!(ops
            .iter()
            .any(|o| matches!(o, MountOp::Overlay { lower, .. }
            if lower == &vec![staging.join("l0/usr/lib/extra"), staging.join("b1")])));
        assert!(ops.iter().any(|o| matches!(o, MountOp::Tmpfs { data, .. }
            if data.ends_with(",uid=1000000000,gid=1000000000"))));
        assert!(ops.iter().any(|o| matches!(
            o,
            MountOp::Devpts {
                tty_gid: 1_000_000_005,
                ..
            }
        )));
        assert!(ops.iter().any(|o| matches!(
            o,
            MountOp::ShiftIds {
                to: 1_000_000_000,
                ..
            }
        )));
    }

    /// Every entry under `root`: its path, type and mode bits, owner, group, and a file's bytes.
    fn listing(root: &Path) -> Vec<(String, u32, u32, u32, Vec<u8>)> {
        use std::os::unix::fs::MetadataExt;
        let mut out = Vec::new();
        let mut dirs = vec![root.to_path_buf()];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                let m = std::fs::symlink_metadata(&p).unwrap();
                let bytes = if m.is_file() {
                    std::fs::read(&p).unwrap()
                } else {
                    Vec::new()
                };
                if m.is_dir() {
                    dirs.push(p.clone());
                }
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.push((rel, m.mode(), m.uid(), m.gid(), bytes));
            }
        }
        out.sort();
        out
    }

    /// What a boot does to a writable layer at `root` before its mounts: `ShiftIds`, then
    /// `PrepareUpper` (hostname `sbtest`).
    fn boot_layer(root: &Path, owner: u32) {
        let upper = root.join("upper");
        let steps = [
            MountOp::ShiftIds {
                layer: root.to_path_buf(),
                upper: upper.clone(),
                to: owner,
            },
            MountOp::PrepareUpper {
                upper,
                work: root.join("work"),
                hostname: "sbtest".into(),
                owner,
            },
        ];
        for op in &steps {
            apply(op, None).unwrap();
        }
    }

    #[test]
    fn a_layer_laid_out_ahead_boots_to_the_files_of_a_fresh_one() {
        // Giving entries to a sandbox's root takes the host's root; as anyone else, owner 0.
        let owner = if nix::unistd::geteuid().is_root() {
            1_000_000_000
        } else {
            0
        };
        let fresh = tempfile::tempdir().unwrap();
        let ahead = tempfile::tempdir().unwrap();
        lay_out(ahead.path(), owner).unwrap();
        assert_eq!(crate::userns::recorded_base(ahead.path()), Some(owner));
        boot_layer(fresh.path(), owner);
        boot_layer(ahead.path(), owner);
        let (a, b) = (listing(fresh.path()), listing(ahead.path()));
        assert_eq!(a, b);
        let names: Vec<&str> = a.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "ids",
                "upper",
                "upper/etc",
                "upper/etc/hostname",
                "upper/etc/hosts",
                "work"
            ]
        );
        // Cut short before its marker (entries made, none given yet), it still boots to the
        // same files: taken for a layer from before user namespaces, shifted to this root.
        let cut = tempfile::tempdir().unwrap();
        for d in ["upper", "work", "upper/etc"] {
            std::fs::create_dir(cut.path().join(d)).unwrap();
        }
        boot_layer(cut.path(), owner);
        assert_eq!(listing(cut.path()), a);
        // Laid out for another root, it still boots: its entries are shifted to this one's.
        if owner != 0 {
            let other = tempfile::tempdir().unwrap();
            lay_out(other.path(), owner + 65536).unwrap();
            boot_layer(other.path(), owner);
            assert_eq!(listing(other.path()), a);
        }
    }
}
