//! Cgroup moves without a wait: the kernel's `favordynmods` cgroup mount option.
//!
//! Every move of a process into a cgroup (a write to `cgroup.procs`, on v1 and v2 alike) takes
//! the kernel's one global `cgroup_threadgroup_rwsem` for writing. By default that lock is tuned
//! for readers (every `fork` and `exit` takes it for reading), so a writer first waits for an RCU
//! grace period, unless another writer ran a moment before. On the development host a move after
//! a quiet 300 ms took 5-15 ms, against 0.1 ms back to back; a sandbox's boot makes one such move
//! (its launcher joins the sandbox's cgroups) and each exec's process another. With
//! `favordynmods` (Linux 6.0 and later) the lock stays in its writer-friendly mode, and the same
//! move took 0.1-0.15 ms. The price, host-wide: `fork` and `exit` take the slower reader path (an
//! atomic operation more each), which a host that starts sandboxes all day gladly pays.
//!
//! The option lives on the cgroup2 hierarchy (the lock is global, so it speeds v1 moves too).
//! [`favor`] turns it on at a server's start (`[host] cgroup_favordynmods`):
//! - already on (a `favordynmods` mount option, from a boot with `cgroup_favordynmods=true` or
//!   an earlier server): nothing to do;
//! - a cgroup2 mount (`/sys/fs/cgroup` on a v2 host, `/sys/fs/cgroup/unified` on a hybrid one):
//!   remounted with the option added to its own (a cgroup2 remount sets every flag anew, so
//!   `nsdelegate`, `memory_recursiveprot` and the like are passed again, and the mount's
//!   `nosuid`/`nodev`/`noexec` and atime flags are kept);
//! - no cgroup2 mount at all (a v1-only host): a cgroup2 is mounted with the option in a mount
//!   namespace of a short-lived thread's own and unmounted there, which sets the flag and
//!   leaves no mount behind.
//!
//! The kernels tried here (6.18) refuse to turn the option off again until a reboot. A kernel
//! before 6.0 refuses the option, and a server in a cgroup namespace of its own cannot set it:
//! both are reported and the server goes on without it.
//!
//! `/proc/self/mountinfo` is parsed here rather than through a crate: three of its fields are
//! read, and the format is fixed by the kernel's ABI.

use std::path::{Path, PathBuf};

/// The mount option.
pub const OPTION: &str = "favordynmods";

/// The calling thread's mounts (a thread may have a mount namespace of its own).
const MOUNTINFO: &str = "/proc/thread-self/mountinfo";

/// What [`favor`] found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Favor {
    /// The option was on already.
    AlreadyOn,
    /// This cgroup2 mount was remounted with it.
    Remounted(PathBuf),
    /// No cgroup2 was mounted: one was mounted and unmounted privately to set it.
    MountedPrivately,
    /// It could not be set (an old kernel, no privilege, a cgroup namespace); the reason.
    Unavailable(String),
}

/// One line of `mountinfo`, the fields that matter here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mount {
    pub point: PathBuf,
    /// The mount's own options (field 6: `rw,nosuid,nodev,noexec,relatime`).
    pub mount_options: Vec<String>,
    pub fstype: String,
    /// The superblock's options (the last field: `rw,nsdelegate,memory_recursiveprot`).
    pub super_options: Vec<String>,
}

/// `\040` and the other octal escapes the kernel writes into paths.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub(crate) fn parse_mountinfo(text: &str) -> Vec<Mount> {
    let split = |s: &str| s.split(',').map(str::to_string).collect::<Vec<_>>();
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let right: Vec<&str> = right.split(' ').collect();
            Some(Mount {
                point: PathBuf::from(unescape(left.get(4)?)),
                mount_options: split(left.get(5)?),
                fstype: right.first()?.to_string(),
                super_options: split(right.get(2)?),
            })
        })
        .collect()
}

fn is_cgroup(m: &Mount) -> bool {
    m.fstype == "cgroup2" || m.fstype == "cgroup"
}

/// The remount of a cgroup2 mount that adds the option and keeps everything else: the mount
/// flags from its own options, the data from its superblock's (less `rw`/`ro`, which are flags).
pub(crate) fn remount_args(m: &Mount) -> (nix::mount::MsFlags, String) {
    use nix::mount::MsFlags;
    let mut flags = MsFlags::MS_REMOUNT;
    for o in &m.mount_options {
        flags |= match o.as_str() {
            "ro" => MsFlags::MS_RDONLY,
            "nosuid" => MsFlags::MS_NOSUID,
            "nodev" => MsFlags::MS_NODEV,
            "noexec" => MsFlags::MS_NOEXEC,
            "noatime" => MsFlags::MS_NOATIME,
            "nodiratime" => MsFlags::MS_NODIRATIME,
            "relatime" => MsFlags::MS_RELATIME,
            "strictatime" => MsFlags::MS_STRICTATIME,
            _ => MsFlags::empty(),
        };
    }
    let mut data: Vec<&str> = m
        .super_options
        .iter()
        .map(String::as_str)
        .filter(|o| !matches!(*o, "rw" | "ro" | OPTION))
        .collect();
    data.push(OPTION);
    (flags, data.join(","))
}

fn read_mounts(path: &str) -> std::io::Result<Vec<Mount>> {
    Ok(parse_mountinfo(&std::fs::read_to_string(path)?))
}

/// Whether some cgroup hierarchy of the calling thread's mount namespace shows the option.
pub fn is_on() -> bool {
    read_mounts(MOUNTINFO)
        .map(|ms| {
            ms.iter()
                .any(|m| is_cgroup(m) && m.super_options.iter().any(|o| o == OPTION))
        })
        .unwrap_or(false)
}

/// Turns the option on (see the module docs). Needs root; changes nothing but that flag.
pub fn favor() -> Favor {
    let mounts = match read_mounts(MOUNTINFO) {
        Ok(m) => m,
        Err(e) => return Favor::Unavailable(format!("reading {MOUNTINFO}: {e}")),
    };
    if mounts
        .iter()
        .any(|m| is_cgroup(m) && m.super_options.iter().any(|o| o == OPTION))
    {
        return Favor::AlreadyOn;
    }
    match mounts.iter().find(|m| m.fstype == "cgroup2") {
        Some(m) => {
            let (flags, data) = remount_args(m);
            if let Err(e) = nix::mount::mount(
                None::<&str>,
                &m.point,
                None::<&str>,
                flags,
                Some(data.as_str()),
            ) {
                return Favor::Unavailable(format!(
                    "remounting {} with {OPTION}: {e}",
                    m.point.display()
                ));
            }
            // A server in a cgroup namespace of its own is not refused: the kernel ignores it.
            if is_on() {
                Favor::Remounted(m.point.clone())
            } else {
                Favor::Unavailable(format!(
                    "{} was remounted but does not show {OPTION} (a cgroup namespace of the server's own?)",
                    m.point.display()
                ))
            }
        }
        None => mount_privately(),
    }
}

/// A v1-only host: cgroup2 mounted with the option where only a thread of this process sees it.
fn mount_privately() -> Favor {
    let run = || -> Result<bool, String> {
        use nix::mount::{mount, umount2, MntFlags, MsFlags};
        use nix::sched::{unshare, CloneFlags};
        // This thread alone gets the new mount namespace (and its own root and cwd).
        unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("unshare: {e}"))?;
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&str>,
        )
        .map_err(|e| format!("making the mounts private: {e}"))?;
        let dir = tempdir_for_mount().map_err(|e| format!("a directory to mount on: {e}"))?;
        let res = mount(
            Some("cgroup2"),
            &dir,
            Some("cgroup2"),
            MsFlags::empty(),
            Some(OPTION),
        )
        .map_err(|e| format!("mounting cgroup2 with {OPTION}: {e}"));
        let on = res.is_ok() && is_on();
        if res.is_ok() {
            let _ = umount2(&dir, MntFlags::MNT_DETACH);
        }
        let _ = std::fs::remove_dir(&dir);
        res.map(|_| on)
    };
    match std::thread::spawn(run).join() {
        Ok(Ok(true)) => Favor::MountedPrivately,
        Ok(Ok(false)) => Favor::Unavailable(format!(
            "cgroup2 was mounted but does not show {OPTION} (a cgroup namespace of the server's own?)"
        )),
        Ok(Err(e)) => Favor::Unavailable(e),
        Err(_) => Favor::Unavailable("the mounting thread panicked".into()),
    }
}

fn tempdir_for_mount() -> std::io::Result<PathBuf> {
    let dir = Path::new("/run").join(format!("cella-cgroup2-{}", std::process::id()));
    match std::fs::create_dir(&dir) {
        Ok(()) => Ok(dir),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(dir),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::mount::MsFlags;

    const V2: &str = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
    const HYBRID: &str = "\
25 24 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw
27 25 0:24 / /sys/fs/cgroup/pids rw,relatime shared:11 - cgroup cgroup rw,pids
";

    #[test]
    fn a_v2_remount_keeps_the_mount_flags_and_the_hierarchy_options() {
        let ms = parse_mountinfo(V2);
        assert_eq!(ms.len(), 1);
        assert_eq!(ms[0].point, Path::new("/sys/fs/cgroup"));
        let (flags, data) = remount_args(&ms[0]);
        assert_eq!(
            flags,
            MsFlags::MS_REMOUNT
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV
                | MsFlags::MS_NOEXEC
                | MsFlags::MS_RELATIME
        );
        assert_eq!(data, "nsdelegate,memory_recursiveprot,favordynmods");
    }

    #[test]
    fn a_hybrid_host_remounts_its_unified_hierarchy() {
        let ms = parse_mountinfo(HYBRID);
        let m = ms.iter().find(|m| m.fstype == "cgroup2").unwrap();
        assert_eq!(m.point, Path::new("/sys/fs/cgroup/unified"));
        let (flags, data) = remount_args(m);
        assert_eq!(flags, MsFlags::MS_REMOUNT | MsFlags::MS_RELATIME);
        assert_eq!(data, "favordynmods");
        assert!(!ms
            .iter()
            .any(|m| is_cgroup(m) && m.super_options.iter().any(|o| o == OPTION)));
    }

    #[test]
    fn the_option_is_not_given_twice_and_escaped_paths_are_read() {
        let ms = parse_mountinfo(
            "40 23 0:26 / /mnt/my\\040cgroups rw,relatime - cgroup2 none rw,favordynmods,nsdelegate\n",
        );
        assert_eq!(ms[0].point, Path::new("/mnt/my cgroups"));
        assert_eq!(remount_args(&ms[0]).1, "nsdelegate,favordynmods");
        // A line without the separator, or cut short, is no mount.
        assert!(parse_mountinfo("garbage\n1 2 3 - cgroup2\n").is_empty());
    }

    /// A v1-only host, made in a thread's own mount namespace by unmounting its cgroup2: the
    /// option is set through a private mount that is gone afterwards. Needs root (skipped
    /// without); the host's mounts are not touched.
    #[test]
    fn a_host_without_cgroup2_gets_the_option_through_a_private_mount() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let res = std::thread::spawn(|| {
            use nix::mount::{mount, umount2, MntFlags, MsFlags};
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).unwrap();
            mount(
                None::<&str>,
                "/",
                None::<&str>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&str>,
            )
            .unwrap();
            let cgroup2 = |ms: &[Mount]| {
                ms.iter()
                    .filter(|m| m.fstype == "cgroup2")
                    .map(|m| m.point.clone())
                    .collect::<Vec<_>>()
            };
            for p in cgroup2(&read_mounts(MOUNTINFO).unwrap()) {
                umount2(&p, MntFlags::MNT_DETACH).unwrap();
            }
            let got = favor();
            (got, cgroup2(&read_mounts(MOUNTINFO).unwrap()))
        })
        .join()
        .unwrap();
        // A v1 hierarchy shows the option only where a boot parameter turned it on.
        let v1_shows = read_mounts(MOUNTINFO)
            .unwrap()
            .iter()
            .any(|m| m.fstype == "cgroup" && m.super_options.iter().any(|o| o == OPTION));
        let want = if v1_shows {
            Favor::AlreadyOn
        } else {
            Favor::MountedPrivately
        };
        assert_eq!(res.0, want);
        assert!(res.1.is_empty(), "a cgroup2 mount was left: {:?}", res.1);
        assert!(!Path::new(&format!("/run/cella-cgroup2-{}", std::process::id())).exists());
    }
}
