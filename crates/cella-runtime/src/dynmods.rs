//! Cgroup moves without a wait: the kernel's `favordynmods` cgroup mount option.
//!
//! Every move of a process into a cgroup (a write to `cgroup.procs`, on v1 and v2 alike) takes
//! the kernel's one global `cgroup_threadgroup_rwsem` for writing. By default that lock is tuned
//! for readers (every `fork` and `exit` takes it for reading), so a writer first waits for an RCU
//! grace period, unless another writer ran a moment before. On the development host a move after
//! a quiet 300 ms took 5-11 ms, against 0.1 ms back to back; a sandbox's boot makes one such move
//! (its launcher joins the sandbox's cgroups) and each exec's process another. With
//! `favordynmods` (Linux 6.0 and later) the lock stays in its writer-friendly mode, and the same
//! move took 0.1-0.15 ms. The price, host-wide: `fork` and `exit` take the slower reader path (an
//! atomic operation more each), which a host that starts sandboxes all day gladly pays.
//!
//! The option lives on the cgroup2 hierarchy (the lock is global, so it speeds v1 moves too).
//! [`favor`] turns it on at a server's start (`[host] cgroup_favordynmods`):
//! - already on (a `favordynmods` mount option, from a boot with `cgroup_favordynmods=1` or an
//!   earlier server): nothing to do;
//! - a cgroup2 mount (`/sys/fs/cgroup` on a v2 host, `/sys/fs/cgroup/unified` on a hybrid one):
//!   its superblock is reconfigured (`fspick`, then `fsconfig`), which leaves every mount of it
//!   as it is (read-only views stay read-only; no mount flag is touched). The kernel sets the
//!   hierarchy's flags anew at a reconfiguration, so each flag it has (`nsdelegate`,
//!   `memory_recursiveprot`, ...) is given again beside `favordynmods`;
//! - no cgroup2 mount in the server's mount namespace (a v1-only host): not set. Mounting a
//!   cgroup2 to set it would apply that mount's flags to the one cgroup2 hierarchy of the host
//!   (clearing those it had, were it mounted elsewhere) and make it visible in every process's
//!   `/proc/<pid>/cgroup`; the operator can boot with `cgroup_favordynmods=1` instead.
//!
//! Once set, this kernel (6.18) keeps its effect until a reboot: a later reconfiguration of the
//! hierarchy without it only drops it from the mount's options (the kernel logs that the
//! mechanism "can't be disabled"), and a start then sets it again; other kernels may turn it off
//! at such a reconfiguration. A kernel before 6.0 refuses the option, and a server in a cgroup namespace of its own cannot set it: both are reported and
//! the server goes on without it.
//!
//! `/proc/thread-self/mountinfo` is parsed here rather than through a crate: three of its fields
//! are read, and the format is fixed by the kernel's ABI.

use std::path::PathBuf;

/// The mount option.
pub const OPTION: &str = "favordynmods";

/// The calling thread's mounts (a thread may have a mount namespace of its own).
const MOUNTINFO: &str = "/proc/thread-self/mountinfo";

/// What [`favor`] found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Favor {
    /// The option was on already.
    AlreadyOn,
    /// The cgroup2 hierarchy mounted here was reconfigured with it.
    Reconfigured(PathBuf),
    /// It could not be set (no cgroup2 mount, an old kernel, no privilege, a cgroup namespace);
    /// the reason.
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

/// The parameters a reconfiguration of a cgroup2 hierarchy gets: each option its superblock
/// has (a flag, or `key=value`) but `rw`/`ro` (left alone when not given), then the option.
pub(crate) fn reconfigure_params(m: &Mount) -> Vec<(String, Option<String>)> {
    let mut params: Vec<(String, Option<String>)> = m
        .super_options
        .iter()
        .filter(|o| !matches!(o.as_str(), "rw" | "ro" | OPTION) && !o.is_empty())
        .map(|o| match o.split_once('=') {
            Some((k, v)) => (k.to_string(), Some(v.to_string())),
            None => (o.clone(), None),
        })
        .collect();
    params.push((OPTION.to_string(), None));
    params
}

fn read_mounts() -> std::io::Result<Vec<Mount>> {
    Ok(parse_mountinfo(&std::fs::read_to_string(MOUNTINFO)?))
}

fn shows_option(ms: &[Mount]) -> bool {
    ms.iter()
        .any(|m| is_cgroup(m) && m.super_options.iter().any(|o| o == OPTION))
}

/// Whether some cgroup hierarchy of the calling thread's mount namespace shows the option.
pub fn is_on() -> bool {
    read_mounts().is_ok_and(|ms| shows_option(&ms))
}

/// Reconfigures the superblock of the file system mounted at `point` with `params` (the new
/// mount API: `fspick`, `fsconfig` per parameter, `FSCONFIG_CMD_RECONFIGURE`); mounts of it are
/// not changed.
fn reconfigure(
    point: &std::path::Path,
    params: &[(String, Option<String>)],
) -> std::io::Result<()> {
    use std::os::fd::AsFd;
    let fs = crate::fsapi::pick(point)?;
    for (key, value) in params {
        crate::fsapi::set(fs.as_fd(), key, value.as_deref())?;
    }
    crate::fsapi::reconfigure(fs.as_fd())
}

/// Turns the option on (see the module docs). Needs root; changes nothing but that flag.
pub fn favor() -> Favor {
    let mounts = match read_mounts() {
        Ok(m) => m,
        Err(e) => return Favor::Unavailable(format!("reading {MOUNTINFO}: {e}")),
    };
    if shows_option(&mounts) {
        return Favor::AlreadyOn;
    }
    let Some(m) = mounts.iter().find(|m| m.fstype == "cgroup2") else {
        return Favor::Unavailable(
            "no cgroup2 hierarchy is mounted here (boot with cgroup_favordynmods=1 to have it)"
                .into(),
        );
    };
    if let Err(e) = reconfigure(&m.point, &reconfigure_params(m)) {
        return Favor::Unavailable(format!(
            "reconfiguring {} with {OPTION}: {e}",
            m.point.display()
        ));
    }
    // A server in a cgroup namespace of its own is not refused: the kernel ignores it.
    if is_on() {
        Favor::Reconfigured(m.point.clone())
    } else {
        Favor::Unavailable(format!(
            "{} was reconfigured but does not show {OPTION} (a cgroup namespace of the server's own?)",
            m.point.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const V2: &str = "30 23 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
    const HYBRID: &str = "\
25 24 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw
27 25 0:24 / /sys/fs/cgroup/pids rw,relatime shared:11 - cgroup cgroup rw,pids
";

    fn flags(names: &[&str]) -> Vec<(String, Option<String>)> {
        names.iter().map(|n| (n.to_string(), None)).collect()
    }

    #[test]
    fn a_v2_hierarchy_is_given_its_own_flags_again_and_no_read_only_state() {
        let ms = parse_mountinfo(V2);
        assert_eq!(ms.len(), 1);
        assert_eq!(ms[0].point, Path::new("/sys/fs/cgroup"));
        // The mount itself is read-only here (a container's view): nothing of it is passed, so
        // the host's hierarchy is not made read-only, nor this view writable.
        assert_eq!(
            reconfigure_params(&ms[0]),
            flags(&["nsdelegate", "memory_recursiveprot", "favordynmods"])
        );
    }

    #[test]
    fn a_hybrid_host_reconfigures_its_unified_hierarchy() {
        let ms = parse_mountinfo(HYBRID);
        let m = ms.iter().find(|m| m.fstype == "cgroup2").unwrap();
        assert_eq!(m.point, Path::new("/sys/fs/cgroup/unified"));
        assert_eq!(reconfigure_params(m), flags(&["favordynmods"]));
        assert!(!shows_option(&ms));
    }

    #[test]
    fn the_option_is_not_given_twice_values_are_kept_and_escaped_paths_are_read() {
        let ms = parse_mountinfo(
            "40 23 0:26 / /mnt/my\\040cgroups rw,relatime - cgroup2 none rw,favordynmods,nsdelegate,x=1\n",
        );
        assert_eq!(ms[0].point, Path::new("/mnt/my cgroups"));
        assert!(shows_option(&ms));
        assert_eq!(
            reconfigure_params(&ms[0]),
            vec![
                ("nsdelegate".to_string(), None),
                ("x".to_string(), Some("1".to_string())),
                ("favordynmods".to_string(), None)
            ]
        );
        // A line without the separator, or cut short, is no mount.
        assert!(parse_mountinfo("garbage\n1 2 3 - cgroup2\n").is_empty());
    }
}
