//! What a command inside a sandbox may do: capabilities, `no_new_privs`, and a seccomp filter.
//!
//! Every command the agent starts goes through [`Jail::enter`] between fork and exec:
//!
//! - `no_new_privs`, so no setuid binary or file capability gives anything back;
//! - the capability bounding set cut to [`ROOT_CAPS`] (Docker's default set without `MKNOD` and
//!   `NET_RAW`: no device nodes, no raw sockets); an unprivileged command then drops to its uid,
//!   which clears every capability; a root command keeps only [`ROOT_CAPS`];
//! - a seccomp filter refusing, with `EPERM`, the calls Docker's default profile refuses to a
//!   container without `CAP_SYS_ADMIN` (kernel modules, kexec, bpf, perf, keyrings, userfaultfd,
//!   clocks, swap, reboot, every way to mount, new namespaces, `open_by_handle_at`, io_uring, ...),
//!   `socket` for `AF_VSOCK` (not confined by network namespaces),
//!   and `clone3` with `ENOSYS` so that libc falls back to `clone`, whose namespace flags the
//!   filter can see.
//!
//! The agent itself (PID 1) keeps its privileges: it must set up each command. Nothing inside the
//! sandbox can reach it (its socket is outside the root; ptrace needs a superset of its caps).

use caps::{CapSet, Capability, CapsHashSet};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

/// Capabilities a sandbox's root keeps.
pub const ROOT_CAPS: &[Capability] = &[
    Capability::CAP_CHOWN,
    Capability::CAP_DAC_OVERRIDE,
    Capability::CAP_FSETID,
    Capability::CAP_FOWNER,
    Capability::CAP_SETGID,
    Capability::CAP_SETUID,
    Capability::CAP_SETFCAP,
    Capability::CAP_SETPCAP,
    Capability::CAP_NET_BIND_SERVICE,
    Capability::CAP_SYS_CHROOT,
    Capability::CAP_KILL,
    Capability::CAP_AUDIT_WRITE,
];

/// System calls no command in a sandbox may make.
fn denied_syscalls() -> Vec<libc::c_long> {
    let mut v = vec![
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_userfaultfd,
        libc::SYS_clock_settime,
        libc::SYS_clock_adjtime,
        libc::SYS_settimeofday,
        libc::SYS_adjtimex,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_reboot,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_move_mount,
        libc::SYS_open_tree,
        libc::SYS_fsopen,
        libc::SYS_fsmount,
        libc::SYS_fsconfig,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_acct,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        libc::SYS_quotactl,
        libc::SYS_syslog,
        libc::SYS_vhangup,
        libc::SYS_fanotify_init,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        libc::SYS_iopl,
        libc::SYS_ioperm,
        libc::SYS_uselib,
        libc::SYS_lookup_dcookie,
        libc::SYS_nfsservctl,
        libc::SYS_sysfs,
        libc::SYS__sysctl,
        libc::SYS_ustat,
        // The x32 ABI's own number of kexec_load (its other calls of their own, 512-547, are
        // ordinary ones: ioctl, readv, execve, ...).
        0x4000_0000 | 528,
    ]);
    v
}

/// The numbers under which a call can be made: on x86-64 also its x32-ABI number (the
/// x32 bit set), which a kernel with x32 enabled accepts under the same audit architecture.
fn aliases(nr: i64) -> Vec<i64> {
    #[cfg(target_arch = "x86_64")]
    {
        vec![nr, nr | 0x4000_0000]
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        vec![nr]
    }
}

/// Namespace flags that `clone` must not carry.
const CLONE_NS_FLAGS: [u64; 8] = [
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    0x80, // CLONE_NEWTIME
];

#[derive(Debug, thiserror::Error)]
pub enum HardenError {
    #[error("building the seccomp filter: {0}")]
    Filter(String),
}

/// Everything a command needs to confine itself, prepared before fork so that the child only
/// makes system calls.
pub struct Jail {
    deny: BpfProgram,
    no_clone3: BpfProgram,
    root_caps: CapsHashSet,
    drop_from_bounding: Vec<Capability>,
    /// `RLIMIT_NOFILE` (soft and hard) of every command; 0 leaves the agent's.
    nofile: u64,
}

fn arch() -> Result<TargetArch, HardenError> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| HardenError::Filter(format!("{e:?}")))
}

impl Jail {
    // `c_long` is i64 here but not on every target: the casts are for the others.
    #[allow(clippy::unnecessary_cast)]
    pub fn new() -> Result<Jail, HardenError> {
        let f = |e: seccompiler::BackendError| HardenError::Filter(e.to_string());
        let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
        for nr in denied_syscalls() {
            for alias in aliases(nr as i64) {
                rules.insert(alias, vec![]);
            }
        }
        let clone_rules = CLONE_NS_FLAGS
            .iter()
            .map(|flag| {
                let cond = SeccompCondition::new(
                    0,
                    SeccompCmpArgLen::Qword,
                    SeccompCmpOp::MaskedEq(*flag),
                    *flag,
                )?;
                SeccompRule::new(vec![cond])
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(f)?;
        for alias in aliases(libc::SYS_clone as i64) {
            rules.insert(alias, clone_rules.clone());
        }
        // vsock sockets are not confined by network namespaces: on a VM host they reach the
        // hypervisor's services. Refuse that address family (as Docker's profile does).
        let vsock = SeccompRule::new(vec![SeccompCondition::new(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            libc::AF_VSOCK as u64,
        )
        .map_err(f)?])
        .map_err(f)?;
        for alias in aliases(libc::SYS_socket as i64) {
            rules.insert(alias, vec![vsock.clone()]);
        }
        let deny = SeccompFilter::new(
            rules,
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EPERM as u32),
            arch()?,
        )
        .map_err(f)?;
        let no_clone3 = SeccompFilter::new(
            aliases(libc::SYS_clone3 as i64)
                .into_iter()
                .map(|nr| (nr, vec![]))
                .collect(),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::ENOSYS as u32),
            arch()?,
        )
        .map_err(f)?;
        let root_caps: CapsHashSet = ROOT_CAPS.iter().copied().collect();
        let drop_from_bounding = caps::all()
            .into_iter()
            .filter(|c| !root_caps.contains(c))
            .collect();
        Ok(Jail {
            deny: deny
                .try_into()
                .map_err(|e: seccompiler::BackendError| f(e))?,
            no_clone3: no_clone3
                .try_into()
                .map_err(|e: seccompiler::BackendError| f(e))?,
            root_caps,
            drop_from_bounding,
            nofile: 0,
        })
    }

    /// Every command gets at most `n` open files (soft and hard limit; commands cannot raise
    /// it: `CAP_SYS_RESOURCE` is not among [`ROOT_CAPS`]). 0 leaves the agent's own limit.
    pub fn with_nofile(mut self, n: u64) -> Jail {
        self.nofile = n;
        self
    }

    /// Confines the calling process and switches it to `uid`/`gid`. Runs between fork and exec.
    pub fn enter(&self, uid: u32, gid: u32) -> std::io::Result<()> {
        let err = std::io::Error::last_os_error;
        // SAFETY: plain system calls on the calling process.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(err());
            }
            if self.nofile > 0 {
                let lim = libc::rlimit {
                    rlim_cur: self.nofile,
                    rlim_max: self.nofile,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                    return Err(err());
                }
            }
        }
        // The filters first: no moment of what follows runs unfiltered (a child traced during its
        // setup could otherwise be made to call what the filter refuses). Nothing below is refused.
        seccompiler::apply_filter(&self.deny).map_err(|e| std::io::Error::other(e.to_string()))?;
        seccompiler::apply_filter(&self.no_clone3)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        for cap in &self.drop_from_bounding {
            // A capability the kernel does not know cannot be dropped; that is fine.
            let _ = caps::drop(None, CapSet::Bounding, *cap);
        }
        // SAFETY: as above.
        unsafe {
            if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(gid) != 0 {
                return Err(err());
            }
            if uid != 0 && libc::setuid(uid) != 0 {
                return Err(err());
            }
        }
        if uid == 0 {
            let io = |e: caps::errors::CapsError| std::io::Error::other(e.to_string());
            // A kernel without ambient capabilities (gVisor's, before 2023) answers EINVAL:
            // there are none to clear then.
            // SAFETY: prctl with integer arguments on the calling process.
            if unsafe {
                libc::prctl(
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_CLEAR_ALL,
                    0,
                    0,
                    0,
                )
            } != 0
            {
                let e = err();
                if e.raw_os_error() != Some(libc::EINVAL) {
                    return Err(e);
                }
            }
            caps::clear(None, CapSet::Inheritable).map_err(io)?;
            caps::set(None, CapSet::Effective, &self.root_caps).map_err(io)?;
            caps::set(None, CapSet::Permitted, &self.root_caps).map_err(io)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_build_for_this_architecture() {
        let j = Jail::new().unwrap();
        assert!(!j.deny.is_empty() && !j.no_clone3.is_empty());
        assert!(!j.drop_from_bounding.contains(&Capability::CAP_CHOWN));
        assert!(j.drop_from_bounding.contains(&Capability::CAP_SYS_ADMIN));
        assert!(j.drop_from_bounding.contains(&Capability::CAP_MKNOD));
    }

    /// Runs a program jailed as `id` (uid and gid) and returns its output.
    fn run_jailed(prog: &str, args: &[&str], id: u32) -> std::process::Output {
        use std::os::unix::process::CommandExt;
        let jail: &'static Jail = Box::leak(Box::new(Jail::new().unwrap()));
        let mut cmd = std::process::Command::new(prog);
        cmd.args(args);
        // SAFETY: enter() makes only system calls; the jail is leaked, so it outlives the child.
        unsafe { cmd.pre_exec(move || jail.enter(id, id)) };
        cmd.output().unwrap()
    }

    #[test]
    fn a_jailed_child_runs_but_cannot_make_namespaces() {
        let out = run_jailed("/bin/sh", &["-c", "echo ran; id -u"], 65534);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n65534\n");
        // Even as root, inside the jail.
        let out = run_jailed("/usr/bin/unshare", &["-U", "true"], 0);
        assert!(!out.status.success(), "unshare worked inside the jail");
        let out = run_jailed("/bin/sh", &["-c", "grep CapEff /proc/self/status"], 0);
        // CapEff of ROOT_CAPS (Docker's default less mknod and net_raw): chown dac_override fowner
        // fsetid kill setgid setuid setpcap net_bind_service sys_chroot audit_write setfcap.
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "CapEff:\t00000000a00405fb"
        );
    }
}
