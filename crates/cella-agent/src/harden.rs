//! What a command inside a sandbox may do: capabilities, `no_new_privs`, and a seccomp filter.
//!
//! Every command the agent starts goes through [`Jail::enter`] between fork and exec (or, in a
//! process that inherited the filter and bounding set, its plain part [`Confinement`]):
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
//! What a command's start costs is kept to a few system calls: the filter is compiled once, when
//! the agent starts, into one program (the `clone3` check in front of the denials), which the
//! agent installs on itself ([`Jail::filter_own_process`]; it makes none of the calls the filter
//! refuses) and every command inherits from birth, so the kernel checks and compiles no filter
//! per command; and the agent cuts its own bounding set to [`ROOT_CAPS`] once
//! ([`Jail::narrow_own_bounding_set`]), which every command inherits too. Where either fails,
//! [`Jail::enter`] does it in each command, as before.
//!
//! The agent itself (PID 1) keeps its privileges: it must set up each command (its bounding set
//! only limits what an `execve` could give, and the agent runs nothing but jailed commands).
//! Nothing inside the sandbox can reach it: its socket is outside the root, and it is not
//! dumpable, so its memory and descriptors take `CAP_SYS_PTRACE`, which [`ROOT_CAPS`] lacks
//! (also those of a command's child that still shares or copies its memory).

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

/// `program` with `clone3` (and its x32 alias) answered `ENOSYS` in front of it: libc then
/// falls back to `clone`, whose flags `program` checks. The check comes before `program`'s
/// architecture check, and answers nothing but that refusal.
// `c_long` is i64 here but not on every target: the cast is for the others.
#[allow(clippy::unnecessary_cast)]
fn with_clone3_refused(program: BpfProgram) -> BpfProgram {
    use seccompiler::sock_filter;
    let ins = |code: u32, jt: u8, jf: u8, k: u32| sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let nrs = aliases(libc::SYS_clone3 as i64);
    let m = nrs.len();
    // 0: load the call's number; 1..=m: to the refusal when it is clone3's; m+1: over the
    // refusal; m+2: the refusal; then `program`.
    let mut out = vec![ins(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0)];
    for (i, nr) in nrs.iter().enumerate() {
        let jt = (m - i) as u8; // from index i+1 to index m+2
        out.push(ins(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            jt,
            0,
            *nr as u32,
        ));
    }
    out.push(ins(libc::BPF_JMP | libc::BPF_JA, 0, 0, 1));
    out.push(ins(
        libc::BPF_RET | libc::BPF_K,
        0,
        0,
        libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
    ));
    out.extend(program);
    out
}

#[derive(Debug, thiserror::Error)]
pub enum HardenError {
    #[error("building the seccomp filter: {0}")]
    Filter(String),
}

/// Everything a command needs to confine itself, prepared before fork so that the child only
/// makes system calls.
pub struct Jail {
    /// The one seccomp program: `clone3` refused with `ENOSYS`, then the denials.
    filter: BpfProgram,
    /// [`ROOT_CAPS`] as a mask of capability bits.
    root_caps: u64,
    drop_from_bounding: Vec<Capability>,
    /// The calling process's bounding set is [`ROOT_CAPS`] already (a command inherits it).
    bounding_narrowed: bool,
    /// The calling process runs under `filter` already (a command inherits it).
    filter_inherited: bool,
    /// `RLIMIT_NOFILE` (soft and hard) of every command; 0 leaves the agent's.
    nofile: u64,
    /// `RLIMIT_NPROC` (soft and hard) of every command; 0 leaves the agent's.
    nproc: u64,
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
        let deny: BpfProgram = deny
            .try_into()
            .map_err(|e: seccompiler::BackendError| f(e))?;
        let root_caps: CapsHashSet = ROOT_CAPS.iter().copied().collect();
        let drop_from_bounding = caps::all()
            .into_iter()
            .filter(|c| !root_caps.contains(c))
            .collect();
        Ok(Jail {
            filter: with_clone3_refused(deny),
            root_caps: root_caps.iter().fold(0, |m, c| m | c.bitmask()),
            drop_from_bounding,
            bounding_narrowed: false,
            filter_inherited: false,
            nofile: 0,
            nproc: 0,
        })
    }

    /// Installs the filter on the calling process (`no_new_privs` with it), once, so that every
    /// command starts under it, inherited, and [`Jail::enter`] installs nothing. Only for a
    /// process that makes none of the calls the filter refuses and has no other thread yet
    /// (the agent, before its runtime starts). Keeps the per-command install when it fails.
    pub fn filter_own_process(&mut self) {
        self.filter_inherited = seccompiler::apply_filter(&self.filter).is_ok();
    }

    /// Cuts the calling process's own bounding set to [`ROOT_CAPS`], once, so that commands
    /// inherit it and [`Jail::enter`] has nothing to drop. Only for a process that runs nothing
    /// but jailed commands (the agent). Keeps the per-command drop when any drop fails.
    pub fn narrow_own_bounding_set(&mut self) {
        // A capability the kernel does not know cannot be dropped; that is fine.
        let unknown = |c: &Capability| caps::has_cap(None, CapSet::Bounding, *c).is_err();
        self.bounding_narrowed = self
            .drop_from_bounding
            .iter()
            .all(|c| caps::drop(None, CapSet::Bounding, *c).is_ok() || unknown(c))
            && self
                .drop_from_bounding
                .iter()
                .all(|c| !caps::has_cap(None, CapSet::Bounding, *c).unwrap_or(false));
    }

    /// Every command gets at most `n` open files (soft and hard limit; commands cannot raise
    /// it: `CAP_SYS_RESOURCE` is not among [`ROOT_CAPS`]). 0 leaves the agent's own limit.
    pub fn with_nofile(mut self, n: u64) -> Jail {
        self.nofile = n;
        self
    }

    /// Every command's user may run at most `n` tasks (processes and threads), soft and hard
    /// limit (`RLIMIT_NPROC`; commands cannot raise it without `CAP_SYS_RESOURCE`). 0 leaves the
    /// agent's own. For gVisor, whose kernel enforces it where the host's cgroup would end the
    /// whole sandbox (see `cella_runtime::gvisor`).
    pub fn with_nproc(mut self, n: u64) -> Jail {
        self.nproc = n;
        self
    }

    /// Confines the calling process and switches it to `uid`/`gid`. Runs between fork and exec.
    pub fn enter(&self, uid: u32, gid: u32) -> std::io::Result<()> {
        let plain = self.plain();
        plain.limit()?;
        // The filter first: no moment of what follows runs unfiltered (a child traced during its
        // setup could otherwise be made to call what the filter refuses). Nothing below is refused.
        if !self.filter_inherited {
            seccompiler::apply_filter(&self.filter)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
        }
        if !self.bounding_narrowed {
            for cap in &self.drop_from_bounding {
                // A capability the kernel does not know cannot be dropped; that is fine.
                let _ = caps::drop(None, CapSet::Bounding, *cap);
            }
        }
        plain.switch(uid, gid)
    }

    /// The jail as [`Confinement`], when the calling process runs under its filter and bounding
    /// set already (the agent, see [`Jail::filter_own_process`]): then nothing else of it is
    /// needed, and a child that has none of the agent's heap can enter it.
    pub fn inherited(&self) -> Option<Confinement> {
        (self.filter_inherited && self.bounding_narrowed).then(|| self.plain())
    }

    fn plain(&self) -> Confinement {
        Confinement {
            nofile: self.nofile,
            nproc: self.nproc,
            root_caps: self.root_caps,
        }
    }
}

/// What a command applies to itself besides the seccomp filter and the bounding set, as plain
/// values: entering it reads no memory but its own and makes only system calls (no allocation,
/// not even on an error). [`Jail::enter`] uses it after the filter; a standby process, forked
/// without the agent's heap (`crate::standby`), enters it alone ([`Jail::inherited`]).
#[derive(Clone, Copy, Debug)]
pub struct Confinement {
    /// `RLIMIT_NOFILE` (soft and hard); 0 leaves the agent's.
    nofile: u64,
    /// `RLIMIT_NPROC` (soft and hard); 0 leaves the agent's.
    nproc: u64,
    /// [`ROOT_CAPS`] as a mask of capability bits: what a root command keeps.
    root_caps: u64,
}

impl Confinement {
    /// Confines the calling process (it runs under the jail's filter and bounding set already)
    /// and switches it to `uid`/`gid`. Runs between fork and exec.
    pub fn enter(&self, uid: u32, gid: u32) -> std::io::Result<()> {
        self.limit()?;
        self.switch(uid, gid)
    }

    /// `no_new_privs` and the file and task limits: what comes before the filter.
    fn limit(&self) -> std::io::Result<()> {
        let err = std::io::Error::last_os_error;
        // SAFETY: plain system calls on the calling process.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(err());
            }
            for (resource, n) in [
                (libc::RLIMIT_NOFILE, self.nofile),
                (libc::RLIMIT_NPROC, self.nproc),
            ] {
                if n > 0 {
                    let lim = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(resource, &lim) != 0 {
                        return Err(err());
                    }
                }
            }
        }
        Ok(())
    }

    /// The ids, and a root command's capabilities: what comes after the filter.
    fn switch(&self, uid: u32, gid: u32) -> std::io::Result<()> {
        let err = std::io::Error::last_os_error;
        // The system calls themselves, not libc's wrappers: in a process that ever had a second
        // thread those signal every thread libc knows of to change it too, and a child that shares
        // the agent's memory ([`crate::vspawn`]) would reach the agent's threads' records.
        // SAFETY: as above.
        unsafe {
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setgid, gid) != 0
            {
                return Err(err());
            }
            if uid != 0 && libc::syscall(libc::SYS_setuid, uid) != 0 {
                return Err(err());
            }
            // A change of ids made the memory as dumpable as the host's `fs.suid_dumpable` says;
            // it stays the agent's (not dumpable) until `execve` gives the command its own.
            libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        }
        if uid == 0 {
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
            // Effective and permitted cut to ROOT_CAPS, inheritable emptied: one `capset`
            // (version 3: two 32-bit words per set).
            #[repr(C)]
            struct Header {
                version: u32,
                pid: libc::c_int,
            }
            #[repr(C)]
            struct Data {
                effective: u32,
                permitted: u32,
                inheritable: u32,
            }
            const VERSION_3: u32 = 0x2008_0522;
            let header = Header {
                version: VERSION_3,
                pid: 0,
            };
            let word = |i: u32| (self.root_caps >> (32 * i)) as u32;
            let data = [0, 1].map(|i| Data {
                effective: word(i),
                permitted: word(i),
                inheritable: 0,
            });
            // SAFETY: capset reads the header and two data words, all on this stack.
            if unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) } != 0 {
                return Err(err());
            }
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
        assert!(j.filter.len() > 6);
        assert!(!j.drop_from_bounding.contains(&Capability::CAP_CHOWN));
        assert!(j.drop_from_bounding.contains(&Capability::CAP_SYS_ADMIN));
        assert!(j.drop_from_bounding.contains(&Capability::CAP_MKNOD));
    }

    /// Runs a program jailed as `id` (uid and gid) and returns its output.
    fn run_jailed(prog: &str, args: &[&str], id: u32) -> std::process::Output {
        run_in(Jail::new().unwrap(), prog, args, id)
    }

    fn run_in(jail: Jail, prog: &str, args: &[&str], id: u32) -> std::process::Output {
        use std::os::unix::process::CommandExt;
        let jail: &'static Jail = Box::leak(Box::new(jail));
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

    #[test]
    fn clone3_is_refused_with_enosys_and_clone_still_works() {
        if !std::path::Path::new("/usr/bin/python3").exists() {
            return;
        }
        let code = "import ctypes, os\n\
                    libc = ctypes.CDLL(None, use_errno=True)\n\
                    print(libc.syscall(435, 0, 0), ctypes.get_errno())\n\
                    pid = os.fork()\n\
                    if pid == 0: os._exit(7)\n\
                    print(os.waitpid(pid, 0)[1] >> 8)";
        let out = run_jailed("/usr/bin/python3", &["-c", code], 65534);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("-1 {}\n7\n", libc::ENOSYS),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn a_jailed_command_runs_under_one_filter() {
        let out = run_jailed(
            "/bin/sh",
            &["-c", "grep -E '^(Seccomp|NoNewPrivs)' /proc/self/status"],
            65534,
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "NoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t1\n"
        );
    }

    #[test]
    fn a_jail_whose_maker_filtered_itself_and_narrowed_its_bounding_set_confines_as_before() {
        // On a thread of its own: the filter and the bounding set belong to a thread (this one
        // keeps them until it ends), and a child gets its thread's.
        std::thread::spawn(|| {
            let mut jail = Jail::new().unwrap();
            jail.narrow_own_bounding_set();
            assert!(jail.bounding_narrowed);
            jail.filter_own_process();
            assert!(jail.filter_inherited);
            let out = run_in(
                jail,
                "/bin/sh",
                &[
                    "-c",
                    "grep -E '^(Seccomp_filters|NoNewPrivs)' /proc/self/status; \
                     unshare -U true 2>/dev/null || echo refused",
                ],
                65534,
            );
            // One filter, inherited (not installed again); still refusing.
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "NoNewPrivs:\t1\nSeccomp_filters:\t1\nrefused\n"
            );
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_jail_whose_maker_narrowed_its_bounding_set_confines_as_before() {
        // On a thread of its own: the bounding set belongs to a thread, and a child gets its.
        std::thread::spawn(|| {
            let mut jail = Jail::new().unwrap();
            jail.narrow_own_bounding_set();
            assert!(jail.bounding_narrowed);
            let out = run_in(
                jail,
                "/bin/sh",
                &[
                    "-c",
                    "grep -E '^Cap(Eff|Bnd)' /proc/self/status; unshare -U true || echo refused",
                ],
                0,
            );
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "CapEff:\t00000000a00405fb\nCapBnd:\t00000000a00405fb\nrefused\n"
            );
        })
        .join()
        .unwrap();
    }
}
