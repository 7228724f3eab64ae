//! The launcher: the short-lived process that turns into a sandbox.
//!
//! The server starts `cella __sandbox-init` with the launch configuration on its standard input
//! (not in argv: a sandbox can read its PID 1's command line, which must name no host path). It
//! is a fresh, single-threaded process, so forking is safe. It joins the sandbox's cgroup,
//! unshares the namespaces, and forks: the child is PID 1 of the new PID namespace, builds the
//! root, binds the agent's socket, pivots, and becomes the agent. The launcher prints the child's
//! host pid as one JSON line and exits, so the sandbox is no child of the server and outlives it.
//!
//! In order: a launcher, as soon as it starts (one is started ahead, with an empty environment,
//! and waits: `super::launchers`), closes inherited descriptors, opens the host's network
//! namespace and unshares the mount, UTS, IPC and network namespaces (all owned by the host's
//! user namespace), setting the new network namespace's `ip_unprivileged_port_start` to 0 and
//! `ping_group_range` to every group ([`ahead`]: nothing of a sandbox is needed yet). Given the
//! server's id map and the sandbox subnet on a line of its own ([`Ahead`], sent as the launcher
//! starts), it makes the user namespace too while it waits (`userns::create`: a helper child
//! running as an accounting uid unshares it, the launcher writes its `uid_map`/`gid_map`, keeps a
//! descriptor and lets the helper go; before the PID namespace, whose first child would otherwise
//! be the helper), and the link of a free slot (`net::setup_inside`). The driver takes a launcher
//! (or starts one now) and sends it the next line, a [`Start`] (sandbox id, cgroup, setup log,
//! ids, network plan). While the launcher opens the setup log as its standard error, makes the
//! user namespace and the sandbox's link if it has none for these yet, and prints the link as a
//! first line `{"net": {...}}` (the driver brings the host end up and installs this boot's
//! firewall chain while the child below builds the root), the driver creates the cgroup (on v1
//! only in the memory, cpu, cpuacct, pids and freezer hierarchies), makes the sandbox's disk at
//! its first boot (a copy of the snapshot's image when `SandboxSpec::snapshot` is set and a fork
//! did not move it in already, else one formatted ahead taken from the `diskpool`, else
//! `disk::ensure_image`) and writes `launch.json` (with the subnet and a first slot to try, when
//! the sandbox gets a network). Then the whole configuration follows on stdin; the launcher
//! refuses one that names another sandbox, cgroup, id map or network than its start, joins the
//! cgroup, unshares the PID and cgroup namespaces (after the join: the cgroup namespace's root
//! is the sandbox's cgroup), and forks.
//! The child (PID 1) applies the mount plan (`mounts::plan`: `MakePrivate`; `Disk`, the image on a
//! free loop device with auto-clear, mounted `nosuid`, `nodev`, in this mount namespace only;
//! `ShiftIds`; `PrepareUpper`, which writes `/etc/hostname` and `/etc/hosts` into the upper layer,
//! removing, never following, whatever the sandbox left there; with a user namespace, `Idmap` of
//! every template layer and bind source; the overlay root; the template's binds, a `layered` one
//! as an overlay of its own; `/proc` and `/sys` with the `MASKED` and `READ_ONLY` paths, a minimal
//! `/dev` whose nodes are made with `mknod`, `/run`). It sets the hostname, brings up `lo`, binds
//! the agent's socket on the host side, pivots (the old root is detached; the overlay keeps the
//! disk mounted), enters the user namespace as its root (`userns::enter`), puts its standard
//! streams on `/dev/null` and becomes the agent. The launcher prints
//! `{"ok": true, "pid": N, "net": {...}}` and exits. The driver records pid, process start time,
//! socket, cgroup and link as the `SandboxHandle`; with a network the host end (`net::host_up`)
//! and this boot's chain were made on the first line (until then the firewall refuses whatever
//! the sandbox sends; a failure there ends the sandbox and fails the boot; a failed boot after it
//! removes every chain of the sandbox's id), and it pings the agent.

use super::{mounts, LaunchConfig};
use nix::sched::{unshare, CloneFlags};
use nix::unistd::{fork, ForkResult};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

/// A line for the setup log (the launcher's and init's standard error, `init.log`), dropped when
/// it cannot be written: `eprintln!` panics then, and on a full disk that ended a boot with
/// nothing said ("sandbox init exited during setup") instead of its real error or its success.
macro_rules! log_line {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

/// Why the launcher could not start a sandbox. Its message is the `error` of the launcher's
/// answer, which the driver reports as the boot's error.
#[derive(Debug, thiserror::Error)]
enum LaunchError {
    /// A step of the launcher failed (`what` names it).
    #[error("{what}: {source}")]
    Step {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("parsing the launch configuration: {0}")]
    Config(#[from] serde_json::Error),
    #[error("parsing the launcher's start: {0}")]
    Start(serde_json::Error),
    #[error("the launch configuration is not the one its start named")]
    OtherSandbox,
    #[error(transparent)]
    Cgroup(#[from] crate::DriverError),
    #[error(transparent)]
    Userns(#[from] crate::userns::UsernsError),
    #[error(transparent)]
    Net(#[from] super::net::NetError),
    /// The sandbox's init reported a failure (its own message, through the ready pipe).
    #[error("{0}")]
    Init(String),
    #[error("sandbox init exited during setup")]
    InitExited,
}

/// The launcher's start (its first line, or its second after an [`Ahead`]): what it needs
/// before the sandbox's files are ready (the rest of the [`LaunchConfig`] follows, and must
/// name the same sandbox, cgroup, ids and network).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Start {
    pub id: String,
    pub cgroup: String,
    /// The setup log (`init.log` in the sandbox's directory), opened by the launcher as its
    /// standard error.
    pub log: std::path::PathBuf,
    pub userns: Option<crate::userns::IdMap>,
    pub network: Option<super::net::NetLaunch>,
}

impl Start {
    /// Whether `cfg` is the configuration this start was for.
    fn is_for(&self, cfg: &LaunchConfig) -> bool {
        self.id == cfg.id
            && self.cgroup == cfg.cgroup
            && self.userns == cfg.userns
            && self.network == cfg.network
    }
}

/// A line a launcher may get before its [`Start`], as soon as it is started: what the server
/// already knows of every sandbox it will boot. With it the launcher makes the sandbox's user
/// namespace while it waits (a helper's fork and the id maps: 0.8-2.4 ms of a boot here, on
/// its path); its owner (see [`crate::userns::IdMap::owner`]) is then picked by the launcher's
/// pid instead of the sandbox's id, which nothing else depends on. A start naming another map
/// gets a namespace made then, as without this line.
///
/// With `net` (the sandbox subnet, and the driver's guess at a free slot when the launcher was
/// started), it also makes the link of a free slot while it waits (`net::setup_inside`: the veth
/// pair, `eth0`'s address and route; 0.8-1.5 ms here, which the boot waited for once the
/// server's own part was shorter). Its host end stays down and without a firewall chain until a
/// boot takes the launcher, as when it was made at the start; a launcher that ends takes it with
/// it (the pair goes with its network namespace). A start with another subnet gets a link made
/// then, and one without a network none: the link made ahead is removed first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Ahead {
    pub userns: Option<crate::userns::IdMap>,
    #[serde(default)]
    pub net: Option<super::net::NetLaunch>,
}

/// The line that carries an [`Ahead`], before the start; a line without the `ahead` field is
/// the start.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct AheadLine {
    pub ahead: Ahead,
}

fn step<E: Into<std::io::Error>>(what: &'static str) -> impl FnOnce(E) -> LaunchError {
    move |e| LaunchError::Step {
        what,
        source: e.into(),
    }
}

/// Entry point of `cella __sandbox-init`. Returns the process exit code.
pub fn launcher_main() -> i32 {
    match run() {
        Ok((pid, net)) => {
            println!(
                "{}",
                serde_json::json!({ "ok": true, "pid": pid, "net": net })
            );
            0
        }
        Err(e) => {
            println!(
                "{}",
                serde_json::json!({ "ok": false, "error": e.to_string() })
            );
            1
        }
    }
}

fn run() -> Result<(i32, Option<super::net::NetInfo>), LaunchError> {
    // Nothing of the server's is held while waiting.
    close_inherited_fds();
    // Ahead of any sandbox: the namespaces that need nothing of it (see `ahead`). A failure
    // here is the answer to the start below, so the boot says why.
    let ahead = ahead();
    // The cgroup hierarchies' mount points, for the join after the start.
    crate::cgroup::find_mounts();
    // First, what can be made before the sandbox is known (an `Ahead`, written as this process
    // starts): the user namespace for the server's id map. Made here, it is kept only when it
    // succeeded; a failure is tried again at the start (it may have been passing).
    let mut stdin = std::io::BufReader::new(std::io::stdin());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdin, &mut line).map_err(step("reading the start"))?;
    let mut made_ahead = None;
    let mut net_ahead = None;
    if let Ok(AheadLine { ahead: early }) = serde_json::from_str::<AheadLine>(&line) {
        if let (Ok(_), Some(map)) = (&ahead, early.userns) {
            let owner = map.owner(&format!("launcher-{}", std::process::id()));
            if let Ok(made) = crate::userns::create_noting(&map, owner) {
                made_ahead = Some((map, made));
            }
        }
        if let (Ok(host), Some(plan)) = (&ahead, early.net) {
            if let Ok(info) = super::net::setup_inside(host, &plan) {
                net_ahead = Some((plan, info));
            }
        }
        line.clear();
        std::io::BufRead::read_line(&mut stdin, &mut line).map_err(step("reading the start"))?;
    }
    // Then the start: what the rest needs (`Start`). The server makes the cgroup and the
    // sandbox's files (its disk, `launch.json`) while this process makes the user namespace
    // (unless made above) and the link; then the whole configuration follows, and this process
    // joins the cgroup (made by then). A launcher started ahead waits here (see
    // `super::launchers`).
    let t0 = std::time::Instant::now();
    let start: Start = serde_json::from_str(&line).map_err(LaunchError::Start)?;
    // The setup log: this process's standard error from here on (until now it had none).
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&start.log)
        .map_err(step("opening the setup log"))?;
    nix::unistd::dup2(log.as_raw_fd(), 2).map_err(step("the setup log"))?;
    drop(log);
    let host_ns = ahead?;
    let (ready_r, ready_w) = nix::unistd::pipe().map_err(step("pipe"))?;
    // The user namespace comes first: made by a helper child, which must not become PID 1 of the
    // new PID namespace. Init uses it for its id-mapped mounts and enters it at the end.
    let mut userns_ahead = false;
    let userns = match (&start.userns, made_ahead) {
        (Some(map), Some((early, (ns, note)))) if early == *map => {
            userns_ahead = true;
            if let Some(note) = note {
                log_line!("cella: {note}");
            }
            Some(ns)
        }
        (Some(map), _) => Some(crate::userns::create(map, map.owner(&start.id))?),
        (None, _) => None,
    };
    let t_userns = t0.elapsed();
    let mut link_ahead = false;
    let net = match (&start.network, net_ahead) {
        (Some(plan), Some((early, info)))
            if (early.subnet, early.prefix) == (plan.subnet, plan.prefix) =>
        {
            link_ahead = true;
            Some(info)
        }
        (plan, early) => {
            if early.is_some() {
                super::net::remove_inside()?;
            }
            match plan {
                Some(plan) => Some(super::net::setup_inside(&host_ns, plan)?),
                None => None,
            }
        }
    };
    drop(host_ns);
    let t_net = t0.elapsed();
    if let Some(info) = &net {
        // The link exists now: the driver brings its host end up and installs its firewall
        // chain while the child below builds the root (the final answer repeats it).
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", serde_json::json!({ "net": info }));
        let _ = out.flush();
    }
    let mut text = String::new();
    stdin
        .read_to_string(&mut text)
        .map_err(step("reading the launch configuration"))?;
    let t_config = t0.elapsed();
    let cfg: LaunchConfig = serde_json::from_str(&text)?;
    if !start.is_for(&cfg) {
        return Err(LaunchError::OtherSandbox);
    }
    // Into the cgroup before the child is forked (the sandbox's every process is in it), and
    // before the PID and cgroup namespaces are unshared (the cgroup namespace's root is the
    // cgroup this process is in; the PID namespace's first child is the sandbox's init).
    crate::cgroup::join(&start.cgroup, std::process::id())?;
    let t_join = t0.elapsed();
    unshare(CloneFlags::CLONE_NEWPID | CloneFlags::CLONE_NEWCGROUP).map_err(step("unshare"))?;
    let t_unshare = t0.elapsed();
    let forked = std::time::Instant::now();
    // SAFETY: the launcher is single-threaded.
    match unsafe { fork() }.map_err(step("fork"))? {
        ForkResult::Child => {
            drop(ready_r);
            let err = init_main(&cfg, ready_w, userns, forked);
            // Only reached on failure: tell the launcher why.
            log_line!("cella-init: {err}");
            std::process::exit(1);
        }
        ForkResult::Parent { child } => {
            drop(ready_w);
            let mut msg = String::new();
            let mut f = std::fs::File::from(ready_r);
            let _ = f.read_to_string(&mut msg);
            if msg == "ok" {
                log_line!(
                    "cella-launch: userns={:.2}ms{} net={:.2}ms{} config={:.2}ms join={:.2}ms unshare={:.2}ms child-setup={:.2}ms",
                    t_userns.as_secs_f64() * 1e3,
                    if userns_ahead { " (namespace made ahead)" } else { "" },
                    (t_net - t_userns).as_secs_f64() * 1e3,
                    if link_ahead { " (link made ahead)" } else { "" },
                    (t_config - t_net).as_secs_f64() * 1e3,
                    (t_join - t_config).as_secs_f64() * 1e3,
                    (t_unshare - t_join).as_secs_f64() * 1e3,
                    (t0.elapsed() - t_unshare).as_secs_f64() * 1e3
                );
                Ok((child.as_raw(), net))
            } else {
                let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
                let _ = nix::sys::wait::waitpid(child, None);
                Err(if msg.is_empty() {
                    LaunchError::InitExited
                } else {
                    LaunchError::Init(msg)
                })
            }
        }
    }
}

/// What a launcher does before it knows its sandbox: it opens the host's network namespace (the
/// link's host end goes there), then unshares the mount, UTS, IPC and network namespaces (all
/// owned by the host's user namespace) and sets the new network namespace's sysctls. Done while
/// a launcher waits ahead, these are off the boot's path (a copy of the host's mount table and a
/// new network stack: about 1 ms of a boot here). Their kernel memory is charged to the cgroup
/// the launcher is in then, the server's: a few tens of KiB a sandbox, freed with it.
fn ahead() -> Result<super::net::HostNs, LaunchError> {
    let host = super::net::HostNs::open()?;
    let flags = CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWUTS
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWNET;
    unshare(flags).map_err(step("unshare"))?;
    net_sysctls();
    Ok(host)
}

/// PID 1 of the sandbox. Returns only with an error (already reported through `ready`).
fn init_main(
    cfg: &LaunchConfig,
    ready: OwnedFd,
    userns: Option<OwnedFd>,
    forked: std::time::Instant,
) -> String {
    let mut ready = std::fs::File::from(ready);
    let fail = |ready: &mut std::fs::File, e: String| {
        let _ = ready.write_all(e.as_bytes());
        e
    };
    let _ = nix::unistd::setsid();
    let ops = mounts::plan(cfg);
    let (pivot, before) = ops.split_last().expect("plan ends with a pivot");
    // How long each step takes goes to the setup log (init.log), for profiling boots.
    let mut timings = vec![("fork", forked.elapsed())];
    for op in before {
        let t = std::time::Instant::now();
        if let Err(e) = mounts::apply(op, userns.as_ref().map(|f| f.as_fd())) {
            return fail(&mut ready, e.to_string());
        }
        timings.push((mounts::label(op), t.elapsed()));
    }
    let t = std::time::Instant::now();
    if let Err(e) = nix::unistd::sethostname(&cfg.hostname) {
        return fail(&mut ready, format!("sethostname: {e}"));
    }
    if let Err(e) = loopback_up() {
        return fail(&mut ready, format!("bringing up lo: {e}"));
    }
    timings.push(("host+lo", t.elapsed()));
    let t = std::time::Instant::now();
    // The sandbox's cgroup for the agent's per-exec cgroups, opened on the host's side: once the
    // root is pivoted, only this descriptor reaches it.
    let exec_cgroups = exec_cgroups(cfg);
    timings.push(("execcg", t.elapsed()));
    let t = std::time::Instant::now();
    // The socket lives on the host side; once the root is pivoted nothing inside can name it.
    let _ = std::fs::remove_file(&cfg.socket);
    let listener = match std::os::unix::net::UnixListener::bind(&cfg.socket) {
        Ok(l) => l,
        Err(e) => return fail(&mut ready, format!("binding {}: {e}", cfg.socket.display())),
    };
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(&cfg.socket, std::fs::Permissions::from_mode(0o600));
    timings.push(("socket", t.elapsed()));
    let t = std::time::Instant::now();
    if let Err(e) = mounts::apply(pivot, None) {
        return fail(&mut ready, e.to_string());
    }
    timings.push(("pivot", t.elapsed()));
    let t = std::time::Instant::now();
    // The agent must be the last thing the OOM killer picks inside its sandbox; lowering the
    // score needs the host's CAP_SYS_RESOURCE, so before the user namespace.
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", "-1000") {
        log_line!("cella-init: oom_score_adj: {e}");
    }
    // From here on the agent is the root of the sandbox's user namespace: a host uid of the
    // range, with capabilities only there.
    if let Some(ns) = userns {
        if let Err(e) = crate::userns::enter(ns) {
            return fail(&mut ready, e.to_string());
        }
    }
    timings.push(("enter", t.elapsed()));
    let mut by_kind: Vec<(&str, f64)> = Vec::new();
    for (k, d) in timings {
        match by_kind.iter_mut().find(|(n, _)| *n == k) {
            Some((_, ms)) => *ms += d.as_secs_f64() * 1e3,
            None => by_kind.push((k, d.as_secs_f64() * 1e3)),
        }
    }
    let summary: Vec<String> = by_kind
        .iter()
        .map(|(k, ms)| format!("{k}={ms:.2}ms"))
        .collect();
    log_line!("cella-init: setup {}", summary.join(" "));
    // Standard output went to the launcher's pipe to the server; nothing inside may hold it.
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        // Standard error too: it was the host-side init.log, a host file the agent must not
        // hold once its setup is over (setup failures went back through `ready`).
        let _ = nix::unistd::dup2(null.as_raw_fd(), 0);
        let _ = nix::unistd::dup2(null.as_raw_fd(), 1);
        let _ = nix::unistd::dup2(null.as_raw_fd(), 2);
    }
    if ready.write_all(b"ok").is_err() {
        return "launcher went away".into();
    }
    drop(ready);
    cella_agent::serve(
        listener,
        cella_agent::AgentConfig {
            nofile: cfg.nofile,
            // The sandbox's pids cgroup limits its tasks.
            nproc: 0,
            exec_cgroups,
            rebind: None,
            refresh_standby: cfg.fast_cgroup_moves,
            // A namespace sandbox's first command is as fast as the next ones.
            warm_first_command: false,
            // Linux sends a terminal's signals itself.
            terminal_signals: false,
        },
    )
}

/// Opens the sandbox's own cgroup directory (see `cella_agent::execcg`) and delegates it to the
/// sandbox's root: the directory (to make exec cgroups in) and its `cgroup.procs` (to move a
/// process from it into one), never a file that sets a limit. None (timeouts then kill by
/// process tree) when there is no such hierarchy or it cannot be opened.
fn exec_cgroups(cfg: &LaunchConfig) -> Option<std::sync::Arc<cella_agent::execcg::ExecCgroups>> {
    use std::os::unix::fs::OpenOptionsExt;
    let (dir, v2) = crate::cgroup::exec_parent(&cfg.cgroup)?;
    let fd: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(&dir)
        .map_err(|e| log_line!("cella-init: exec cgroups at {}: {e}", dir.display()))
        .ok()?
        .into();
    if let Some(map) = &cfg.userns {
        let root = Some(nix::unistd::Uid::from_raw(map.base));
        let group = Some(nix::unistd::Gid::from_raw(map.base));
        for name in [".", "cgroup.procs"] {
            if let Err(e) = nix::unistd::fchownat(
                Some(fd.as_raw_fd()),
                name,
                root,
                group,
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            ) {
                log_line!("cella-init: delegating {}/{name}: {e}", dir.display());
                return None;
            }
        }
    }
    Some(std::sync::Arc::new(cella_agent::execcg::ExecCgroups::new(
        fd, v2,
    )))
}

/// Closes every descriptor but stdin, stdout and stderr: the sandbox must inherit nothing of the
/// server's (database, listening socket, other sandboxes' pipes).
pub(crate) fn close_inherited_fds() {
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
                .collect()
        })
        .unwrap_or_default();
    for fd in fds {
        if fd > 2 {
            // SAFETY: no live Rust object owns these descriptors at this point.
            unsafe { libc::close(fd) };
        }
    }
}

/// Settings of the sandbox's new network namespace (the calling process's): any uid may bind
/// ports below 1024 and send ICMP echo without raw sockets, as in Docker. The namespace belongs
/// to the host's user namespace, where the sandbox's root has no `CAP_NET_BIND_SERVICE`.
fn net_sysctls() {
    for (key, value) in [
        ("net/ipv4/ip_unprivileged_port_start", "0"),
        ("net/ipv4/ping_group_range", "0 2147483647"),
    ] {
        if let Err(e) = std::fs::write(format!("/proc/sys/{key}"), value) {
            log_line!("cella-init: setting {key}: {e}");
        }
    }
}

/// `ip link set lo up` without a netlink dependency: two ioctls.
/// Brings `lo` up in the calling thread's network namespace (also the gVisor launcher's: runsc
/// `--network=sandbox` takes over only the interfaces that are up).
pub(crate) fn loopback_up() -> std::io::Result<()> {
    // SAFETY: plain syscalls on a zeroed ifreq that we own.
    unsafe {
        let sock = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if sock < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo\0".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        let mut res = libc::ioctl(sock, libc::SIOCGIFFLAGS, &mut req);
        if res == 0 {
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            res = libc::ioctl(sock, libc::SIOCSIFFLAGS, &req);
        }
        let err = std::io::Error::last_os_error();
        libc::close(sock);
        if res != 0 {
            return Err(err);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configuration_is_taken_only_for_the_sandbox_its_start_named() {
        let mut cfg = super::super::mounts::tests::cfg();
        cfg.userns = Some(crate::userns::IdMap {
            base: 1_000_000_000,
            count: 65536,
        });
        cfg.network = Some(super::super::net::NetLaunch {
            subnet: "10.77.0.0".parse().unwrap(),
            prefix: 16,
            first_slot: 3,
        });
        let start = Start {
            id: cfg.id.clone(),
            cgroup: cfg.cgroup.clone(),
            log: "/data/sandboxes/sbtest/init.log".into(),
            userns: cfg.userns,
            network: cfg.network.clone(),
        };
        // One JSON line, as the driver sends it.
        let line = serde_json::to_string(&start).unwrap();
        assert!(!line.contains('\n'));
        let back: Start = serde_json::from_str(&line).unwrap();
        assert!(back.is_for(&cfg));
        let other = |change: &dyn Fn(&mut LaunchConfig)| {
            let mut c = cfg.clone();
            change(&mut c);
            start.is_for(&c)
        };
        assert!(!other(&|c| c.id = "sbother".into()));
        assert!(!other(&|c| c.cgroup = "cella/x/sbother".into()));
        assert!(!other(&|c| c.userns = None));
        assert!(!other(&|c| c.network.as_mut().unwrap().first_slot = 4));
        assert!(other(&|c| c.hostname = "renamed".into()));
        // A start is never read as the line that may come before it, and that line, one JSON
        // line too, is never read as a start.
        assert!(serde_json::from_str::<AheadLine>(&line).is_err());
        let ahead = AheadLine {
            ahead: Ahead {
                userns: cfg.userns,
                net: cfg.network.clone(),
            },
        };
        let early = serde_json::to_string(&ahead).unwrap();
        assert!(!early.contains('\n'));
        assert!(serde_json::from_str::<Start>(&early).is_err());
        let back: AheadLine = serde_json::from_str(&early).unwrap();
        assert_eq!(back.ahead.userns, start.userns);
        assert_eq!(back.ahead.net, start.network);
        // The line of an older server (no network) is still read.
        let older: AheadLine = serde_json::from_str(r#"{"ahead":{"userns":null}}"#).unwrap();
        assert_eq!(older.ahead.net, None);
    }
}
