//! The mount plan of a sandbox's root, as data.
//!
//! [`plan`] is a pure function from the launch configuration to a list of operations, so what a
//! sandbox can see is unit-tested without root; [`apply`] carries one operation out.

use super::LaunchConfig;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountOp {
    /// Stop every mount event from propagating back to the host.
    MakePrivate,
    /// Mount the sandbox's disk image (its own file system, sized to its quota).
    Disk {
        image: PathBuf,
        target: PathBuf,
    },
    /// Make the overlay's upper and work directories and write the sandbox's own `/etc/hostname`
    /// and `/etc/hosts` into the upper layer.
    PrepareUpper {
        upper: PathBuf,
        work: PathBuf,
        hostname: String,
    },
    Overlay {
        lower: Vec<PathBuf>,
        upper: PathBuf,
        work: PathBuf,
        target: PathBuf,
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
    },
    /// Hide a path: an empty read-only tmpfs over a directory, `/dev/null` over a file.
    /// Skipped when the kernel does not have the path.
    Mask {
        target: PathBuf,
    },
    /// Make a path read-only (bind it onto itself, then remount). Skipped when absent.
    ReadOnly {
        target: PathBuf,
    },
    Symlink {
        link: PathBuf,
        to: PathBuf,
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

/// Device nodes bound from the host into a sandbox's `/dev`.
pub const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

fn inside(root: &Path, p: &Path) -> PathBuf {
    root.join(p.strip_prefix("/").unwrap_or(p))
}

pub fn plan(cfg: &LaunchConfig) -> Vec<MountOp> {
    let r = &cfg.rootfs;
    let mut ops = vec![MountOp::MakePrivate];
    if let Some(image) = &cfg.disk {
        ops.push(MountOp::Disk {
            image: image.clone(),
            target: cfg.disk_mount.clone(),
        });
    }
    ops.push(MountOp::PrepareUpper {
        upper: cfg.upper.clone(),
        work: cfg.work.clone(),
        hostname: cfg.hostname.clone(),
    });
    ops.extend([MountOp::Overlay {
        lower: cfg.layers.clone(),
        upper: cfg.upper.clone(),
        work: cfg.work.clone(),
        target: r.clone(),
    }]);
    for b in &cfg.binds {
        ops.push(MountOp::Bind {
            src: b.src.clone(),
            target: inside(r, &b.dst),
            readonly: b.readonly,
            file: false,
        });
    }
    ops.push(MountOp::Proc {
        target: r.join("proc"),
    });
    ops.push(MountOp::Sysfs {
        target: r.join("sys"),
    });
    for p in MASKED {
        ops.push(MountOp::Mask { target: r.join(p) });
    }
    for p in READ_ONLY {
        ops.push(MountOp::ReadOnly { target: r.join(p) });
    }
    ops.push(MountOp::Tmpfs {
        target: r.join("dev"),
        data: "mode=755,size=65536k".into(),
        flags: MsFlags::MS_NOSUID | MsFlags::MS_STRICTATIME,
    });
    for d in DEVICES {
        ops.push(MountOp::Bind {
            src: Path::new("/dev").join(d),
            target: r.join("dev").join(d),
            readonly: false,
            file: true,
        });
    }
    ops.push(MountOp::Devpts {
        target: r.join("dev/pts"),
    });
    ops.push(MountOp::Tmpfs {
        target: r.join("dev/shm"),
        data: "mode=1777,size=65536k".into(),
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
        });
    }
    ops.push(MountOp::Tmpfs {
        target: r.join("run"),
        data: "mode=755,size=65536k".into(),
        flags: MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
    });
    ops.push(MountOp::PivotRoot { root: r.clone() });
    ops
}

fn err(what: &str, target: &Path, e: impl std::fmt::Display) -> String {
    format!("{what} {}: {e}", target.display())
}

/// A short name of an operation's kind, for timing logs.
pub fn label(op: &MountOp) -> &'static str {
    match op {
        MountOp::MakePrivate => "private",
        MountOp::Disk { .. } => "disk",
        MountOp::PrepareUpper { .. } => "upper",
        MountOp::Overlay { .. } => "overlay",
        MountOp::Bind { .. } => "bind",
        MountOp::Proc { .. } => "proc",
        MountOp::Sysfs { .. } => "sysfs",
        MountOp::Tmpfs { .. } => "tmpfs",
        MountOp::Devpts { .. } => "devpts",
        MountOp::Mask { .. } => "mask",
        MountOp::ReadOnly { .. } => "readonly",
        MountOp::Symlink { .. } => "symlink",
        MountOp::PivotRoot { .. } => "pivot",
    }
}

pub fn apply(op: &MountOp) -> Result<(), String> {
    const NONE: Option<&str> = None;
    match op {
        MountOp::MakePrivate => mount(NONE, "/", NONE, MsFlags::MS_REC | MsFlags::MS_PRIVATE, NONE)
            .map_err(|e| format!("making / private: {e}")),
        MountOp::Overlay {
            lower,
            upper,
            work,
            target,
        } => {
            let all: Vec<&Path> = lower
                .iter()
                .map(|p| p.as_path())
                .chain([upper.as_path(), work.as_path()])
                .collect();
            if all.iter().any(|p| p.to_string_lossy().contains([',', ':'])) {
                return Err("overlay paths must not contain ',' or ':'".into());
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
            mount(
                Some("overlay"),
                target,
                Some("overlay"),
                MsFlags::empty(),
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
        MountOp::Devpts { target } => {
            std::fs::create_dir_all(target).map_err(|e| err("creating", target, e))?;
            let flags = MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC;
            mount(
                Some("devpts"),
                target,
                Some("devpts"),
                flags,
                Some("newinstance,ptmxmode=0666,mode=0620,gid=5"),
            )
            .map_err(|e| err("mounting devpts on", target, e))
        }
        MountOp::Symlink { link, to } => {
            let _ = std::fs::remove_file(link);
            std::os::unix::fs::symlink(to, link).map_err(|e| err("linking", link, e))
        }
        MountOp::Disk { image, target } => crate::disk::mount_image(image, target),
        MountOp::PrepareUpper {
            upper,
            work,
            hostname,
        } => {
            use std::os::unix::fs::PermissionsExt;
            let etc = upper.join("etc");
            for d in [upper, work, &etc] {
                std::fs::create_dir_all(d).map_err(|e| err("creating", d, e))?;
            }
            let _ = std::fs::set_permissions(&etc, std::fs::Permissions::from_mode(0o755));
            std::fs::write(etc.join("hostname"), format!("{hostname}\n"))
                .map_err(|e| err("writing", &etc, e))?;
            std::fs::write(etc.join("hosts"), crate::rootfs::hosts_file(hostname))
                .map_err(|e| err("writing", &etc, e))
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
            umount2(".", MntFlags::MNT_DETACH)
                .map_err(|e| format!("detaching the old root: {e}"))?;
            nix::unistd::chdir("/").map_err(|e| format!("chdir /: {e}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rootfs::Bind;

    fn cfg() -> LaunchConfig {
        LaunchConfig {
            id: "sbtest".into(),
            hostname: "sbtest".into(),
            layers: vec!["/data/templates/base/v1/rootfs".into()],
            upper: "/data/sandboxes/sbtest/upper".into(),
            work: "/data/sandboxes/sbtest/work".into(),
            rootfs: "/data/sandboxes/sbtest/rootfs".into(),
            binds: vec![Bind {
                src: "/usr".into(),
                dst: "/usr".into(),
                readonly: true,
            }],
            socket: "/data/run/sbtest.sock".into(),
            cgroup: "cella/x/sbtest".into(),
            disk: None,
            disk_mount: "/data/sandboxes/sbtest/disk".into(),
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
        assert!(matches!(&with_disk[2], MountOp::PrepareUpper { .. }));
        let ops = plan(&cfg());
        assert_eq!(ops[0], MountOp::MakePrivate);
        assert!(matches!(&ops[1], MountOp::PrepareUpper { .. }));
        assert!(
            matches!(&ops[2], MountOp::Overlay { target, .. } if target == Path::new("/data/sandboxes/sbtest/rootfs"))
        );
        assert!(matches!(ops.last(), Some(MountOp::PivotRoot { .. })));
    }

    #[test]
    fn only_template_binds_and_device_nodes_come_from_the_host() {
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
            binds[0],
            (
                "/usr".into(),
                "/data/sandboxes/sbtest/rootfs/usr".into(),
                true
            )
        );
        for (src, target, _) in &binds[1..] {
            assert!(src.starts_with("/dev"), "unexpected host path {src:?}");
            assert!(target.starts_with("/data/sandboxes/sbtest/rootfs/dev"));
        }
        // Every target lies inside the sandbox's root.
        for op in &ops {
            if let MountOp::Bind { target, .. }
            | MountOp::Tmpfs { target, .. }
            | MountOp::Proc { target } = op
            {
                assert!(target.starts_with("/data/sandboxes/sbtest/rootfs"));
            }
        }
    }
}
