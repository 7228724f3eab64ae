//! The gVisor driver: a sandbox is a `runsc` container, its processes running on gVisor's
//! user-space kernel (the Sentry) instead of the host's, on the platform the server chose at its
//! start (`ptrace` unless configured; see [`platform`]).
//!
//! On the host a sandbox is `DATA/gvisor/<id>/` (its disk image, the overlay's mount point
//! `rootfs/`, the OCI bundle `bundle/config.json`, `sock/` with the agent's socket, `init.log`),
//! runsc's state in `DATA/runsc/` (`runsc --root`, used by nobody else), and the cgroup
//! `cella/<instance>/<id>`, shared with the namespace driver's naming.
//!
//! A boot: the driver makes the cgroup with the sandbox's limits, the disk image (taken from
//! the namespace driver's pool of formatted ones, [`crate::diskpool`], shared) and the
//! bundle (see [`spec::oci_spec`]), and starts `cella __gvisor-init` with a [`GvisorLaunch`] on
//! its standard input. That launcher joins the cgroup, unshares a mount namespace of its own,
//! applies the namespace driver's [`root_plan`](crate::namespace::mounts::root_plan) (the disk,
//! the overlay of the template's layers under the writable layer, the template's binds) and
//! forks: the child execs `runsc run` (so every `runsc` process of the sandbox, the Sentry,
//! the gofer and the platform's stubs, is in the sandbox's cgroup and sees the overlay, which no
//! other process of the host does; the mounts end with the last of them), the launcher prints
//! the child's pid and exits. `runsc` runs with `--host-uds=create`, `--ignore-cgroups` (the
//! cgroup is the launcher's), `--overlay2=none` (writes reach the sandbox's disk), and
//! `--network=none` (loopback only) unless the sandbox has a link.
//!
//! A link ([`GvisorNet`]; the server gives one when the policy lets something out or the
//! sandbox has model access) is the namespace driver's: the launcher makes the veth pair in a
//! network namespace of its own as the namespace launcher does (`lo` brought up first: runsc
//! gives the sandbox a loopback only when the namespace's is up), binds that namespace to
//! `netns` in the sandbox's directory (so it outlives the sandbox's processes), and runsc
//! `--network=sandbox` takes `eth0` over into gVisor's network stack; the host end, its
//! firewall chain and the gateway's listener are the same as for a namespace sandbox (one
//! shared [`Network`](crate::namespace::Network)). Two quirks of runsc 20221219: it tells the
//! host's namespace by `/proc/sys/net/core/rmem_default` existing, which newer kernels show in
//! every namespace, so the launcher hides that directory in its own mount namespace; and it
//! reaches a sandbox's control server through an abstract socket, which lives in the sandbox's
//! network namespace, so every runsc call about a linked sandbox runs there. A pause to disk
//! keeps the namespace (link and rules stay); the restore joins it and gives `eth0` its
//! address back (runsc took it out of the host kernel's view and scrapes it again). Destroy
//! and stop unbind it. A sandbox restored from another's checkpoint (a snapshot with memory,
//! a fork's child) gets a link of its own, made at its launch as at a first boot, or none: runsc
//! sets the network stack up from the namespace it starts in and the checkpoint's endpoints
//! are put on it, so it takes the new address (connections open at the checkpoint do not
//! survive the move; listeners do). Either way round works: a linked sandbox's checkpoint into
//! one without a link (loopback only), and the other way.
//!
//! The agent crosses gVisor's boundary through a Unix socket: the server's executable is
//! bound read-only into the sandbox and runs as its init (`cella __gvisor-agent`, see
//! [`agent_main`]); it binds `/run/cella-agent/agent.sock` in a bound host directory, which
//! `--host-uds=create` turns into a socket of the host (`sock/agent.sock`), then mounts an empty
//! read-only tmpfs over that directory so nothing inside can name the socket or the executable
//! again (unmounting it instead breaks gVisor's listener: `accept` fails with `EIO`), and
//! serves as in a namespace sandbox. Its commands get the same `Jail` (seccomp, capabilities, ids, rlimits:
//! gVisor implements them); timeouts kill by process tree, as gVisor has no cgroup the agent
//! could delegate.
//!
//! The executable bound in is not the server's own path but this build's pin of it,
//! `DATA/gvisor-agents/<build>/cella` (a hard link, see [`pin_agent`]), named in the sandbox's
//! `launch.json`, and in an `agent` file beside every checkpoint copied out of it (snapshots
//! with memory, boot images). A restored agent goes on with its old memory, so it must run
//! over the same code: after an upgrade, a sandbox paused to disk and a snapshot's restores
//! bind the build they were saved with (a restore over the new executable crashed the agent
//! with `SIGSEGV`); pins nothing names are removed at the next start.
//!
//! The handle's pid is `runsc run`'s (with its start time). Stop and destroy kill every
//! process of the cgroup, `runsc delete --force` the container's state and reap the pid;
//! destroy also removes the directory (a checkpoint image with it).
//!
//! Pause is to disk. runsc 20221219 refuses to save a sandbox that holds a host-backed socket
//! ("Cannot save endpoint with bound host socket"), so the agent is asked to quiesce first
//! (`Request::Quiesce`: it closes its listener and every connection, answers, and waits for
//! `SIGUSR2`); then runsc writes the whole sandbox (memory, processes, open files; file
//! contents stay on its disk, `--overlay2=none`) to `memory.partial/`, renamed `memory/` once
//! whole, and the sandbox's processes end (its RAM is freed; the cgroup stays, empty). The save
//! is asked of runsc's control server by a `cella __gvisor-checkpoint` process
//! ([`checkpoint_main`], [`control::checkpoint`]: one call, where `runsc checkpoint` and the
//! `runsc delete` after it each cost a Go program's start), or by `runsc checkpoint` run by a
//! shell where that server does not answer; either renames the image once saved. So a server
//! killed during the checkpoint (the save goes on, and ends the sandbox) finds the sandbox on
//! disk at its next start, waiting first for a checkpoint still running (a process naming its
//! image directory). runsc's record of the ended sandbox is then removed as files. The quiesce
//! is noted (`quiesced`), so that one killed between the quiesce and the checkpoint wakes the
//! agent at its next start. runsc's own work runs with the cgroup's CPU quota raised (see
//! [`GvisorDriver::lift`]).
//! Resume runs the launcher again with the boot's input (`launch.json`: the same mounts, which
//! a restore needs) and `runsc restore --image-path memory/` instead of `runsc run`, sends
//! `SIGUSR2` once runsc's state file says the restored container runs (read every 2 ms: a
//! signal tried before fails; through `runsc kill` each failure cost tens of milliseconds of a
//! runsc process on the cores the restore wants), straight to runsc's control server
//! ([`control`]; `runsc kill` where that does not answer), waits for the agent to answer on
//! its socket bound again, and removes the image; the new handle (new pid)
//! goes back to the server. A failed checkpoint, or a quiesce that failed, wakes the agent the
//! same way: the sandbox runs on. While the image is whole the sandbox counts as alive
//! (`alive`, `probe`) though it has no process. A sandbox frozen by an older server is thawed
//! before its pause to disk. The inverted channel (the agent connecting out through
//! `--host-uds=open`) was not needed: the signal keeps the host in charge of when the agent
//! may bind again.
//!
//! Snapshots live where the namespace driver keeps its own (`DATA/snapshots/<snap>/`:
//! `disk.img`, and with memory `memory/checkpoint.img`), so deleting one and the clean-up of
//! snapshot files no row names are shared. A snapshot of a running sandbox is a pause to disk
//! (above), a sparse copy of the disk image once its loop device let go of it (the sandbox's
//! mount namespace ends with its last process), a hard link of the checkpoint image into the
//! snapshot (nothing writes an image once whole), and a resume from its own image: the source
//! keeps running with a new handle, which the server records. Files and memory are of the same
//! instant, and the sentry's own file cache was flushed by the checkpoint; a snapshot without
//! memory of a running sandbox goes the same way, the image not kept. A server killed in
//! between finds the sandbox on disk with its row running and restores it (as after a pause).
//! `runsc checkpoint --leave-running` was not used: this runsc implements it by restoring the
//! container from the checkpoint process itself, outside the launcher's mount namespace (where
//! the sandbox's overlay and disk are mounted) and outside its cgroup. A paused sandbox is
//! copied as it lies (its image linked); a stopped one has files only.
//!
//! A create with [`SandboxSpec::snapshot`] copies the snapshot's disk into the new sandbox's
//! directory at its first boot and, when the snapshot has memory, runs `runsc restore
//! --image-path=<snapshot>/memory` with the new sandbox's own bundle, container id, cgroup and
//! launcher. runsc does not need the checkpoint's paths: the gofer opens the new bundle's root
//! (the new overlay on the new disk) and binds, and what the image records is the layout inside
//! the sandbox (the same template, size and spec), which is why a snapshot starts only as its
//! template and size. The restored agent is woken as after a resume and binds its socket in the
//! new `sock/`, then is told the new sandbox's hostname (`Request::SetHostname`): the image
//! holds the source's.
//!
//! A template's boot image ([`SandboxSpec::boot_image`], the server's `bootimages`) is the same
//! thing kept elsewhere: `save_boot_image` pauses a running sandbox to disk, copies it as a
//! snapshot with memory into `<dest>.partial`, renames that to `dest` once whole (a crash in
//! between leaves only the partial directory, crash point `runtime.gvisor.boot_image.written`)
//! and resumes it with a new handle; a create with `boot_image` starts from that directory as
//! from a snapshot's.
//!
//! A template build's step ([`SandboxSpec::plain_layer`]) gets no disk image: its writable
//! layer is the directory `upper/`, exported as the namespace driver exports one
//! (`namespace::export_upper`); the gofer wrote it with the ids the sandbox sees, so it needs
//! no shift. Not on gVisor yet (refused with [`DriverError::Unsupported`] naming it): a boot
//! image of a sandbox with a link.
//!
//! A restore used to start, now and then, with the agent (PID 1) dying of a `SIGSEGV` in tokio's
//! I/O driver, the same image every time: this runsc resurrects deleted epoll interests at a
//! restore, with their old user data (freed pointers for tokio). The agent quiets every interest
//! before deleting it, so one that comes back is a harmless wake-up; see [`epoll`].

pub mod control;
pub mod epoll;
pub mod memory;
pub mod platform;
pub mod preload;
pub mod spec;

use crate::cgroup::{self, Limits};
use crate::namespace::{mounts, process_start_time, LaunchConfig};
use crate::{
    Driver, DriverError, ExecEvent, ExecSpec, ExitInfo, MemorySnapshot, Probe, ResourceUsage,
    Runtime, SandboxHandle, SandboxSpec, SnapshotInfo,
};
use async_trait::async_trait;
use cella_agent::client::AgentClient;
use platform::Platform;
use serde::{Deserialize, Serialize};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use tokio::sync::mpsc;

/// What `cella __gvisor-init` reads on its standard input.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GvisorLaunch {
    /// The mounts (only the root's part of the namespace driver's plan is used).
    pub launch: LaunchConfig,
    /// `runsc` and its arguments, up to and including the container id.
    pub runsc: Vec<String>,
    /// Where `runsc`'s own messages go.
    pub log: PathBuf,
    /// The sandbox's link, when it has one.
    #[serde(default)]
    pub net: Option<GvisorNet>,
    /// The agent executable bound into the sandbox (a pinned one, see [`pin_agent`]); None in
    /// launch files written before agents were pinned.
    #[serde(default)]
    pub agent: Option<PathBuf>,
}

/// A gVisor sandbox's link: made by the launcher as the namespace launcher makes it, in a
/// network namespace kept at `keep` (a bind mount) so that a restore from disk joins the same
/// link, with the same firewall rules, after the sandbox's processes ended.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GvisorNet {
    /// Where to make the link at a first boot.
    pub plan: crate::namespace::net::NetLaunch,
    /// The file the sandbox's network namespace is bound to.
    pub keep: PathBuf,
    /// At a restore: the link, which exists in `keep`; `eth0` gets its address back (`runsc`
    /// took it out of the host kernel's view at boot and scrapes it again).
    #[serde(default)]
    pub again: Option<crate::namespace::net::NetInfo>,
}

/// The checkpoint image of a sandbox paused to disk, in its directory (written to
/// [`MEMORY_TMP`] first, renamed once whole).
pub const MEMORY_DIR: &str = "memory";
const MEMORY_TMP: &str = "memory.partial";
/// The file `runsc checkpoint` writes in the image directory.
const IMAGE_FILE: &str = "checkpoint.img";
/// The launcher's input of the sandbox's boot, kept for a restore.
const LAUNCH_FILE: &str = "launch.json";
/// The sandbox's network namespace, bound in its directory while it has a link.
const NETNS_FILE: &str = "netns";
/// Where the agent executables sandboxes run are pinned, one directory per build.
const AGENTS_DIR: &str = "gvisor-agents";
/// The executable's name in its pinned directory.
const AGENT_NAME: &str = "cella";
/// In a snapshot's or boot image's directory with memory: the path of the agent its
/// checkpoint was made with.
const AGENT_FILE: &str = "agent";
/// In a sandbox's directory while its CPU quota is lifted (see [`GvisorDriver::lift`]).
const QUOTA_FILE: &str = "cpu-quota";
/// The vCPUs runsc's own work in a sandbox's cgroup may use (see [`GvisorDriver::lift`]).
const LIFTED_CPUS: u64 = 2;
/// In a sandbox's directory from just before its agent is quiesced for a checkpoint until it
/// is woken or the checkpoint ended the sandbox.
const QUIESCED_FILE: &str = "quiesced";
/// The host's pids limit of a gVisor sandbox is this many times its own (`pids_max`, which its
/// commands get as `RLIMIT_NPROC`, enforced by gVisor's kernel): on the `ptrace` platform every
/// process in the sandbox costs the host about 8 tasks (its address space's stub process and a
/// stub thread for each of the Sentry's threads that ran it; a thread about 0.4), and the host's
/// limit, when reached, ends the whole sandbox (runsc cannot make a thread it needs), where the
/// sandbox's own limit fails one `fork` with `EAGAIN`. Measured: 52 host tasks idle, 480 with 50
/// `sleep`s, 898 with 100. runsc keeps its stubs' threads (stopped) after their processes end, so
/// a sandbox that starts many processes over time grows towards this limit (1,145, 1,788 and
/// 2,268 host tasks after three rounds of 150 `sleep`s); a pause or checkpoint starts it afresh.
/// The server's sandboxes together hold at most [`cgroup::host_task_budget`].
pub const HOST_TASKS_PER_TASK: u32 = 10;
/// The most host tasks one gVisor sandbox may hold (its own limit is this over
/// [`HOST_TASKS_PER_TASK`] at most): one sandbox of many vCPUs must not take the host's threads.
pub const MAX_HOST_TASKS: u32 = 32_768;

/// A gVisor sandbox's limits for `pids_max`: the tasks each of its users may run (its commands'
/// `RLIMIT_NPROC`) and its host cgroup's pids limit.
pub fn pids_limits(pids_max: u32) -> (u32, u32) {
    let own = pids_max.clamp(1, MAX_HOST_TASKS / HOST_TASKS_PER_TASK);
    (own, own * HOST_TASKS_PER_TASK)
}
/// Longest wait for the agent to close its connections before a checkpoint.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct GvisorDriver {
    data_dir: PathBuf,
    agent_exe: PathBuf,
    runsc: PathBuf,
    cgroup_parent: String,
    disk_quota: bool,
    /// The namespace driver's pool of formatted disk images, shared (one directory).
    disks: Option<crate::diskpool::DiskPool>,
    nofile: u64,
    /// The namespace driver's network (one subnet, one firewall), when sandboxes get links.
    net: Option<crate::namespace::Network>,
    /// The platform new sandboxes boot on (see [`platform`]).
    platform: Platform,
    /// The server's cgroup holds at most [`cgroup::host_task_budget`] tasks (set once).
    tasks_capped: std::sync::Arc<std::sync::OnceLock<()>>,
    /// This build's agent executable as sandboxes run it ([`pin_agent`]), made at the first
    /// boot that needs it.
    pinned: std::sync::Arc<std::sync::OnceLock<PathBuf>>,
}

/// Where `runsc` is on this host, if anywhere.
pub fn find_runsc() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([
            "/usr/bin".into(),
            "/usr/sbin".into(),
            "/usr/local/bin".into(),
        ])
        .map(|d| d.join("runsc"))
        .find(|p| p.is_file())
}

impl GvisorDriver {
    /// `agent_exe` is the server's executable (its `__gvisor-init` and `__gvisor-agent`);
    /// `instance` names the server's cgroup subtree (as for the namespace driver).
    pub fn new(
        data_dir: &Path,
        agent_exe: PathBuf,
        runsc: PathBuf,
        instance: &str,
    ) -> Result<Self, DriverError> {
        for d in ["gvisor", "runsc"] {
            let p = data_dir.join(d);
            std::fs::create_dir_all(&p)?;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700))?;
        }
        let driver = GvisorDriver {
            data_dir: data_dir.to_path_buf(),
            agent_exe,
            runsc,
            cgroup_parent: format!("cella/{instance}"),
            disk_quota: false,
            disks: None,
            nofile: 1024,
            net: None,
            platform: Platform::Ptrace,
            tasks_capped: Default::default(),
            pinned: Default::default(),
        };
        driver.forget_agents();
        Ok(driver)
    }

    /// The agent executable new sandboxes of this build run: the server's executable pinned
    /// under `DATA/gvisor-agents/` ([`pin_agent`]), or the executable itself where pinning
    /// failed (logged).
    fn agent(&self) -> PathBuf {
        self.pinned
            .get_or_init(|| {
                pin_agent(&self.data_dir, &self.agent_exe).unwrap_or_else(|e| {
                    tracing::warn!(
                        "pinning the gVisor agent {}: {e}; sandboxes paused to disk will not \
                         resume after an upgrade",
                        self.agent_exe.display()
                    );
                    self.agent_exe.clone()
                })
            })
            .clone()
    }

    /// Removes the pinned agents of earlier builds that nothing names any more: no sandbox's
    /// launch file, no snapshot's or boot image's `agent` record.
    fn forget_agents(&self) {
        let root = self.data_dir.join(AGENTS_DIR);
        let Ok(rd) = std::fs::read_dir(&root) else {
            return;
        };
        let current = agent_stamp(&self.agent_exe);
        let mut named: Vec<String> = Vec::new();
        let mut read = |f: PathBuf| {
            if let Ok(t) = std::fs::read_to_string(f) {
                named.push(t);
            }
        };
        let children = |d: PathBuf| -> Vec<PathBuf> {
            std::fs::read_dir(d)
                .map(|rd| rd.flatten().map(|e| e.path()).collect())
                .unwrap_or_default()
        };
        for d in children(self.data_dir.join("gvisor")) {
            read(d.join(LAUNCH_FILE));
        }
        for d in children(self.data_dir.join("snapshots")) {
            read(d.join(AGENT_FILE));
        }
        for t in children(self.data_dir.join("boot-images")) {
            for d in children(t) {
                read(d.join(AGENT_FILE));
            }
        }
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let pinned = e.path().join(AGENT_NAME).to_string_lossy().into_owned();
            if current.as_deref() != Some(name.as_str())
                && !named.iter().any(|t| t.contains(&pinned))
            {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }

    /// The agent a checkpoint in `src` (a snapshot's or boot image's directory) was made with,
    /// which its restore must run: a restored process goes on with the memory of that
    /// executable's code. None for a record from before agents were pinned.
    fn agent_of(&self, src: &Path) -> Result<Option<PathBuf>, DriverError> {
        let Ok(text) = std::fs::read_to_string(src.join(AGENT_FILE)) else {
            return Ok(None);
        };
        let agent = PathBuf::from(text.trim_end());
        if !agent.is_file() {
            return Err(DriverError::Image(format!(
                "its memory was saved by a build of cella whose agent ({}) is gone",
                agent.display()
            )));
        }
        Ok(Some(agent))
    }

    /// Gives sandboxes whose spec asks for it a link on `net` (the namespace driver's, see
    /// [`crate::namespace::NamespaceDriver::network`]).
    pub fn with_network(mut self, net: Option<crate::namespace::Network>) -> Self {
        self.net = net;
        self
    }

    /// Gives every sandbox a file system of exactly its `disk_size_mb` (see [`crate::disk`]).
    pub fn with_disk_quota(mut self, on: bool) -> Self {
        self.disk_quota = on;
        self
    }

    /// Takes first boots' disk images from `pool` (the namespace driver's, see
    /// [`crate::diskpool`]) instead of formatting one on the boot's path.
    pub fn with_disk_pool(mut self, pool: Option<crate::diskpool::DiskPool>) -> Self {
        self.disks = pool;
        self
    }

    /// Boots new sandboxes on `platform` (chosen by [`platform::choose`]); `ptrace` unless
    /// told.
    pub fn with_platform(mut self, platform: Platform) -> Self {
        self.platform = platform;
        self
    }

    /// Starts the watcher that holds this driver's sandboxes to their memory limit (see
    /// [`memory`]); the server's, once.
    pub fn with_memory_watch(self) -> Self {
        memory::spawn(self.clone());
        self
    }

    /// The platform new sandboxes boot on.
    pub fn platform(&self) -> Platform {
        self.platform
    }

    /// `RLIMIT_NOFILE` of every command (0: the agent's own).
    pub fn with_nofile(mut self, nofile: u64) -> Self {
        self.nofile = nofile;
        self
    }

    fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.data_dir.join("gvisor").join(id)
    }

    fn runsc_root(&self) -> PathBuf {
        self.data_dir.join("runsc")
    }

    fn cgroup_path(&self, id: &str) -> String {
        format!("{}/{id}", self.cgroup_parent)
    }

    /// `runsc` with the flags every call of this driver uses.
    fn runsc_base(&self) -> Vec<String> {
        vec![
            self.runsc.to_string_lossy().into_owned(),
            format!("--root={}", self.runsc_root().display()),
            self.platform.flag(),
            "--network=none".into(),
            "--host-uds=create".into(),
            "--ignore-cgroups".into(),
            "--overlay2=none".into(),
        ]
    }

    fn unsupported(what: &str) -> DriverError {
        DriverError::Unsupported(format!("{what} is not supported on the gvisor runtime yet"))
    }

    /// Makes the directory, the disk and the bundle (its init `agent`); returns the launcher's
    /// input.
    fn prepare(&self, spec: &SandboxSpec, agent: PathBuf) -> Result<GvisorLaunch, DriverError> {
        let dir = self.sandbox_dir(&spec.id);
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        let image = dir.join(crate::disk::IMAGE);
        let disk = if image.exists() {
            Some(image)
        } else if self.disk_quota && !spec.plain_layer && !dir.join("upper").exists() {
            Some(match &self.disks {
                Some(pool) => pool.take(&dir, spec.disk_size_mb)?,
                None => crate::disk::ensure_image(&dir, spec.disk_size_mb)?,
            })
        } else {
            None
        };
        let disk_mount = dir.join("disk");
        let layer = if disk.is_some() {
            disk_mount.clone()
        } else {
            dir.clone()
        };
        let rootfs = dir.join("rootfs");
        let sock = dir.join("sock");
        let bundle = dir.join("bundle");
        for d in [&rootfs, &sock, &bundle] {
            std::fs::create_dir_all(d)?;
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))?;
        }
        let _ = std::fs::remove_file(sock.join(spec::SOCKET_NAME));
        let net = match (&self.net, &spec.network) {
            (Some(n), Some(_)) => Some(GvisorNet {
                plan: n.plan(),
                keep: dir.join(NETNS_FILE),
                again: None,
            }),
            _ => None,
        };
        let launch = LaunchConfig {
            id: spec.id.clone(),
            hostname: spec.hostname.clone(),
            layers: spec.image.layers.clone(),
            upper: layer.join("upper"),
            work: layer.join("work"),
            rootfs: rootfs.clone(),
            binds: spec.image.binds.clone(),
            socket: sock.join(spec::SOCKET_NAME),
            cgroup: self.cgroup_path(&spec.id),
            disk,
            disk_mount,
            disk_device: None,
            network: None,
            userns: None,
            nofile: self.nofile,
            fast_cgroup_moves: false,
        };
        let oci = spec::oci_spec(&spec::SpecInput {
            hostname: spec.hostname.clone(),
            rootfs,
            socket_dir: sock,
            agent_exe: agent.clone(),
            cpu_count: spec.cpu_count,
            memory_mb: spec.memory_mb,
            pids_max: pids_limits(spec.pids_max).0,
            nofile: self.nofile,
            link: net.is_some(),
        });
        let json = serde_json::to_vec_pretty(&oci).map_err(std::io::Error::other)?;
        std::fs::write(bundle.join("config.json"), json)?;
        let mut runsc = self.runsc_base();
        if net.is_some() {
            for a in runsc.iter_mut().filter(|a| *a == "--network=none") {
                *a = "--network=sandbox".into();
            }
        }
        runsc.extend([
            "run".into(),
            format!("--bundle={}", bundle.display()),
            spec.id.clone(),
        ]);
        Ok(GvisorLaunch {
            launch,
            runsc,
            log: dir.join("init.log"),
            net,
            agent: Some(agent),
        })
    }

    /// Starts the sandbox; answers its handle and whether it was restored from a snapshot's
    /// checkpoint (its agent then waits to be woken).
    fn launch(&self, spec: &SandboxSpec) -> Result<(SandboxHandle, bool), DriverError> {
        // A container of the same id left by a crash: runsc refuses to make it again.
        self.runsc_delete(&spec.id);
        let cgroup_path = self.cgroup_path(&spec.id);
        cgroup::create(
            &cgroup_path,
            Limits {
                cpus: spec.cpu_count,
                memory_mb: memory::host_limit_mb(spec.memory_mb),
                pids_max: pids_limits(spec.pids_max).1,
            },
        )?;
        // All of the server's sandboxes share a part of the host's tasks: runsc's processes
        // grow with a sandbox's churn (see [`HOST_TASKS_PER_TASK`]), and the host must keep
        // some whatever its sandboxes do. Set once, at the first boot.
        self.tasks_capped.get_or_init(|| {
            let budget = cgroup::host_task_budget();
            if let Err(e) = cgroup::set_pids_max(&self.cgroup_parent, budget) {
                tracing::warn!("capping the sandboxes' tasks at {budget}: {e}");
            }
        });
        // The first boot from a snapshot: its files become the sandbox's own disk, and a
        // snapshot with memory is restored rather than booted.
        let dir = self.sandbox_dir(&spec.id);
        let mut image = None;
        let mut agent = None;
        let mut made_on = None;
        // A template's boot image is a snapshot's directory kept elsewhere.
        let source = match (&spec.boot_image, &spec.snapshot) {
            (Some(b), _) => Some((b.clone(), format!("boot image {}", b.display()))),
            (None, Some(snap)) => Some((self.snapshot_dir(snap), format!("snapshot {snap}"))),
            (None, None) => None,
        };
        if let (Some((src, what)), false) = (source, dir.join(crate::disk::IMAGE).exists()) {
            if !src.join(crate::disk::IMAGE).exists() {
                return Err(DriverError::Image(format!(
                    "{what} has no files on this host"
                )));
            }
            let mem = src.join(MEMORY_DIR);
            if mem.join(IMAGE_FILE).exists() {
                // Checked before the copy, which would be for nothing.
                agent = self.agent_of(&src)?;
                made_on = Some(platform::recorded(&src).map_err(DriverError::Image)?);
                image = Some(mem);
            }
            std::fs::create_dir_all(&dir)?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
            crate::disk::copy_sparse(&src.join(crate::disk::IMAGE), &dir.join(crate::disk::IMAGE))?;
        }
        let mut cfg = self.prepare(spec, agent.unwrap_or_else(|| self.agent()))?;
        // A checkpoint restores on the platform it was made on (and so do later resumes).
        if let Some(p) = made_on {
            platform::set_in_args(&mut cfg.runsc, p);
        }
        // Kept for a restore from disk, which needs the same mounts.
        let json = serde_json::to_vec(&cfg).map_err(std::io::Error::other)?;
        std::fs::write(dir.join(LAUNCH_FILE), json)?;
        self.lift(&spec.id, &cgroup_path);
        let (pid, start_time, made) = match &image {
            Some(mem) => self.start(&as_restore(cfg.clone(), mem)?)?,
            None => self.start(&cfg)?,
        };
        let mut handle = SandboxHandle {
            id: spec.id.clone(),
            runtime: Runtime::Gvisor,
            pid,
            start_time,
            socket: cfg.launch.socket,
            cgroup: cgroup_path,
            net: None,
        };
        if let (Some(n), Some(rules), Some(_)) = (&self.net, &spec.network, &cfg.net) {
            let (info, res) = n.bring_up(&spec.id, made, rules);
            handle.net = info;
            if let Err(e) = res {
                let _ = self.remove(&spec.id, Some(&handle), false);
                return Err(e);
            }
        }
        Ok((handle, image.is_some()))
    }

    fn snapshot_dir(&self, snapshot_id: &str) -> PathBuf {
        self.data_dir.join("snapshots").join(snapshot_id)
    }

    /// Copies a sandbox at rest (no process: stopped, or written to disk) into snapshot
    /// `snapshot_id`: its disk image and, with `memory`, its checkpoint image (a hard link:
    /// nothing writes an image once whole). Blocking.
    fn copy_at_rest(
        &self,
        id: &str,
        snapshot_id: &str,
        memory: bool,
    ) -> Result<SnapshotInfo, DriverError> {
        if memory && !self.on_disk(id) {
            return Err(DriverError::Unsupported(format!(
                "sandbox {id} has no memory to snapshot (it is not running)"
            )));
        }
        let size_bytes = self.copy_into(id, &self.snapshot_dir(snapshot_id), memory)?;
        Ok(SnapshotInfo {
            size_bytes,
            paused_us: 0,
        })
    }

    /// Copies sandbox `id` at rest (see [`Self::copy_at_rest`]) into directory `dir`; answers
    /// the bytes it takes. A failure removes `dir`. Blocking.
    fn copy_into(&self, id: &str, dir: &Path, memory: bool) -> Result<u64, DriverError> {
        let src = self.sandbox_dir(id);
        let disk = src.join(crate::disk::IMAGE);
        if !disk.exists() {
            return Err(DriverError::Unsupported(
                "snapshots need the sandbox's files in a disk image ([disk] quota = true)".into(),
            ));
        }
        let res = (|| -> Result<u64, DriverError> {
            std::fs::create_dir_all(dir)?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
            // The sandbox's file system was mounted only in its mount namespace, which ends
            // with its last process; its loop device lets go of the image a moment later.
            let t = std::time::Instant::now();
            wait_released(&disk);
            let released = t.elapsed();
            let dst = dir.join(crate::disk::IMAGE);
            crate::disk::copy_sparse(&disk, &dst)?;
            tracing::debug!(
                sandbox = id,
                released_ms = released.as_secs_f64() * 1e3,
                copied_ms = (t.elapsed() - released).as_secs_f64() * 1e3,
                "disk copy phases"
            );
            let mut bytes = crate::disk::allocated_bytes(&dst);
            if memory {
                let tmp = dir.join(MEMORY_TMP);
                let _ = std::fs::remove_dir_all(&tmp);
                std::fs::create_dir_all(&tmp)?;
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o700))?;
                for e in std::fs::read_dir(src.join(MEMORY_DIR))?.flatten() {
                    std::fs::hard_link(e.path(), tmp.join(e.file_name()))?;
                    bytes += crate::disk::allocated_bytes(&tmp.join(e.file_name()));
                }
                // The agent the checkpoint's memory runs, which its restores must bind, and
                // the platform it was made on, which they run on.
                let launch = std::fs::read(src.join(LAUNCH_FILE))
                    .ok()
                    .and_then(|b| serde_json::from_slice::<GvisorLaunch>(&b).ok());
                if let Some(a) = launch.as_ref().and_then(|l| l.agent.as_ref()) {
                    std::fs::write(dir.join(AGENT_FILE), a.as_os_str().as_encoded_bytes())?;
                }
                let made_on = launch
                    .and_then(|l| platform::of_args(&l.runsc))
                    .unwrap_or(Platform::Ptrace);
                std::fs::write(dir.join(platform::RECORD_FILE), made_on.as_str())?;
                std::fs::rename(&tmp, dir.join(MEMORY_DIR))?;
            }
            Ok(bytes)
        })();
        if res.is_err() {
            let _ = std::fs::remove_dir_all(dir);
        }
        res
    }

    /// Runs the launcher with `cfg`; answers the pid and start time of its `runsc`, and the
    /// link it made.
    fn start(
        &self,
        cfg: &GvisorLaunch,
    ) -> Result<(i32, u64, Option<crate::namespace::net::NetInfo>), DriverError> {
        use std::io::Write;
        use std::os::unix::process::CommandExt;
        let mut child = Command::new(&self.agent_exe)
            .arg0("cella")
            .env_clear()
            .arg("__gvisor-init")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                DriverError::Launch(format!("starting {}: {e}", self.agent_exe.display()))
            })?;
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| DriverError::Launch("no launcher stdin".into()))?;
        stdin.write_all(&serde_json::to_vec(&cfg).map_err(std::io::Error::other)?)?;
        drop(stdin);
        let out = child.wait_with_output()?;
        let answer: serde_json::Value = serde_json::from_slice(&out.stdout)
            .map_err(|_| DriverError::Launch("the gvisor launcher gave no answer".into()))?;
        if answer["ok"] != serde_json::Value::Bool(true) {
            return Err(DriverError::Launch(
                answer["error"]
                    .as_str()
                    .unwrap_or("unknown error")
                    .to_string(),
            ));
        }
        let pid = answer["pid"]
            .as_i64()
            .ok_or_else(|| DriverError::Launch("the gvisor launcher gave no pid".into()))?
            as i32;
        let start_time = process_start_time(pid).ok_or_else(|| {
            DriverError::Launch(format!(
                "runsc exited at start: {}",
                self.log_tail(&cfg.launch.id)
            ))
        })?;
        let made = serde_json::from_value(answer["net"].clone()).ok();
        Ok((pid, start_time, made))
    }

    /// Whether the sandbox is written to disk (a whole checkpoint image in its directory).
    fn on_disk(&self, id: &str) -> bool {
        self.sandbox_dir(id)
            .join(MEMORY_DIR)
            .join(IMAGE_FILE)
            .exists()
    }

    /// Whether sandbox `id`'s agent was quiesced for a checkpoint and not woken since.
    fn quiesced(&self, id: &str) -> bool {
        self.sandbox_dir(id).join(QUIESCED_FILE).exists()
    }

    /// Waits (up to a minute) for a checkpoint of sandbox `id` that a server killed during it
    /// left running (its helper, or runsc's shell, names the image directory): it ends the
    /// sandbox and names its image whole, or fails and leaves it running. (What a failed one
    /// wrote stays until the next checkpoint, which starts by removing it, or the destroy.)
    async fn settle_left_checkpoint(&self, id: &str) {
        let tmp = self.sandbox_dir(id).join(MEMORY_TMP);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while tmp.exists() && checkpoint_running(&tmp) && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Wakes an agent a server killed between its quiesce and the checkpoint left quiesced (one
    /// that answers was not quiesced yet: only the note goes).
    async fn wake_if_left_quiesced(&self, handle: &SandboxHandle) -> Result<(), DriverError> {
        if !self.quiesced(&handle.id) {
            return Ok(());
        }
        let client = AgentClient::new(&handle.socket);
        if client.ping(Duration::from_secs(1)).await.is_ok() {
            let _ = std::fs::remove_file(self.sandbox_dir(&handle.id).join(QUIESCED_FILE));
            return Ok(());
        }
        self.wake(handle).await
    }

    /// Raises the CPU quota of sandbox `id`'s cgroup to [`LIFTED_CPUS`] vCPUs for the
    /// platform's own work in it: a boot, a checkpoint or a restore by runsc (several Go
    /// processes and threads at once; held to a one-vCPU quota, a restore spent a third of its
    /// time throttled here). Noted in the sandbox's directory first, so that [`Self::unlift`]
    /// sets the sandbox's quota again (from its bundle), or, after a crash in between, the next
    /// start's `pause` or `unpause` of the sandbox found again. What of the tenant's can run
    /// meanwhile: nothing in a boot (the agent is the only process until the create answers);
    /// in a checkpoint, its processes until runsc stops the sandbox's kernel (tens of
    /// milliseconds: runsc starts first), and again if the checkpoint fails, until it is set
    /// back; in a restore, its processes from the moment runsc starts them to the moment runsc
    /// says it runs (a few milliseconds), before the agent is woken.
    fn lift(&self, id: &str, cgroup: &str) {
        let lifted = LIFTED_CPUS * cgroup::CPU_PERIOD_US;
        // None: no quota (nothing to lift); at or above: lifted already, or a sandbox with as
        // many vCPUs (its note, if any, stays the one to act on).
        match cgroup::cpu_quota(cgroup) {
            Some(q) if q < lifted => {}
            _ => return,
        }
        let note = self.sandbox_dir(id).join(QUOTA_FILE);
        if std::fs::write(&note, "").is_ok() {
            if let Err(e) = cgroup::set_cpu_quota(cgroup, Some(lifted)) {
                tracing::debug!(sandbox = id, "lifting its cpu quota: {e}");
                let _ = std::fs::remove_file(&note);
            }
        }
    }

    /// Sets sandbox `id`'s CPU quota again after [`Self::lift`] (nothing when none is noted):
    /// the one its bundle gives runsc, which is the one its cgroup was made with. One that
    /// cannot be set keeps its note, for the next try, and is an error.
    fn unlift(&self, id: &str, cgroup: &str) -> Result<(), DriverError> {
        let dir = self.sandbox_dir(id);
        let note = dir.join(QUOTA_FILE);
        if !note.exists() {
            return Ok(());
        }
        let quota = bundle_cpu_quota(&dir.join("bundle").join("config.json")).ok_or_else(|| {
            DriverError::Cgroup(format!("no cpu quota in the bundle of sandbox {id}"))
        })?;
        cgroup::set_cpu_quota(cgroup, Some(quota)).map_err(|e| {
            tracing::warn!(sandbox = id, "setting its cpu quota again: {e}");
            e
        })?;
        let _ = std::fs::remove_file(&note);
        Ok(())
    }

    /// `runsc` with this driver's flags, for a call about sandbox `id`. A sandbox with a link
    /// is called from inside its kept network namespace: runsc 20221219 reaches a sandbox's
    /// control server through an abstract socket, which belongs to the network namespace the
    /// sandbox runs in (from the host's, a checkpoint finds the sandbox "stopped").
    fn runsc_command(&self, id: &str) -> Command {
        self.runsc_command_by(id, &[])
    }

    /// [`Self::runsc_command`] run by `prefix` (a program and its arguments before runsc's).
    fn runsc_command_by(&self, id: &str, prefix: &[&std::ffi::OsStr]) -> Command {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let mut base = self.runsc_base();
        let ns = std::fs::File::open(self.sandbox_dir(id).join(NETNS_FILE)).ok();
        if ns.is_some() {
            for a in base.iter_mut().filter(|a| *a == "--network=none") {
                *a = "--network=sandbox".into();
            }
        }
        let mut cmd = match prefix.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).args(base);
                c
            }
            None => {
                let exe = base.remove(0);
                let mut c = Command::new(exe);
                c.args(base);
                c
            }
        };
        cmd.env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        if let Some(ns) = ns {
            // SAFETY: between fork and exec only setns(2), which is async-signal-safe; the
            // file (close-on-exec) lives in the closure until then. Not a namespace (a crash
            // left the file unbound): the call runs in the host's, as for a sandbox without one.
            unsafe {
                cmd.pre_exec(move || {
                    libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET);
                    Ok(())
                });
            }
        }
        cmd
    }

    /// `runsc` with this driver's flags and `args` (about sandbox `id`), to its end; its
    /// complaints on failure.
    fn runsc_call(&self, id: &str, args: &[String]) -> Result<(), String> {
        Self::spawn(self.runsc_command(id).args(args)).and_then(Self::finish)
    }

    /// Starts `cmd`, its output to nothing and its complaints kept.
    fn spawn(cmd: &mut Command) -> Result<std::process::Child, String> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("running runsc: {e}"))
    }

    /// Waits for `child` to end; its complaints on failure.
    fn finish(child: std::process::Child) -> Result<(), String> {
        let out = child
            .wait_with_output()
            .map_err(|e| format!("running runsc: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            Err(err.trim().lines().last().unwrap_or("failed").to_string())
        }
    }

    /// Writes the whole sandbox (memory, processes, open files) to `memory/` in its directory;
    /// its processes then end. On failure the sandbox runs on (the agent woken again).
    fn checkpoint(&self, handle: &SandboxHandle) -> Result<(), DriverError> {
        let dir = self.sandbox_dir(&handle.id);
        let tmp = dir.join(MEMORY_TMP);
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o700))?;
        // The image is named whole by the process that asked for it, once saved: a server
        // killed meanwhile (runsc saves on, and its save ends the sandbox) finds it on disk at
        // its next start, not lost.
        let dest = dir.join(MEMORY_DIR);
        let t = std::time::Instant::now();
        let saved = match self.checkpoint_by_control(handle, &tmp, &dest) {
            Some(saved) => saved,
            None => self.checkpoint_by_runsc(handle, &tmp, &dest),
        };
        if let Err(e) = saved {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(DriverError::Launch(format!("runsc checkpoint: {e}")));
        }
        let t_saved = t.elapsed();
        // runsc ends the sandbox once saved: its processes leave the cgroup. (20-30 ms here,
        // the kernel's own teardown of their mappings: killing them at once was no faster.)
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !cgroup::procs(&handle.cgroup).is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        let t_ended = t.elapsed();
        cgroup::kill(&handle.cgroup);
        crate::reap::reap(handle.pid, handle.start_time);
        // Its processes are gone: runsc's record is two files, removed without a `runsc delete`.
        self.forget_record(&handle.id);
        tracing::debug!(
            sandbox = handle.id,
            saved_ms = t_saved.as_secs_f64() * 1e3,
            ended_ms = (t_ended - t_saved).as_secs_f64() * 1e3,
            "checkpoint phases"
        );
        let _ = std::fs::remove_file(dir.join("sock").join(spec::SOCKET_NAME));
        if tmp.exists() {
            std::fs::rename(&tmp, &dest)?;
        }
        let _ = std::fs::remove_file(dir.join(QUIESCED_FILE));
        Ok(())
    }

    /// The checkpoint through runsc's control server, in a `cella __gvisor-checkpoint` process
    /// ([`checkpoint_main`]) that names `tmp` whole as `dest` once saved. None when that
    /// server did not answer (nothing was made; `runsc checkpoint` is tried), else the result.
    fn checkpoint_by_control(
        &self,
        handle: &SandboxHandle,
        tmp: &Path,
        dest: &Path,
    ) -> Option<Result<(), String>> {
        use std::os::unix::process::CommandExt;
        let netns = self.sandbox_dir(&handle.id).join(NETNS_FILE);
        let mut cmd = Command::new(&self.agent_exe);
        cmd.arg0("cella")
            .env_clear()
            .arg("__gvisor-checkpoint")
            .arg(&handle.id)
            .arg(tmp)
            .arg(dest)
            .arg(&handle.cgroup);
        if netns.exists() {
            cmd.arg(&netns);
        }
        // Not started (nothing was asked of the sandbox): `runsc checkpoint` is tried.
        let child = match Self::spawn(&mut cmd) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(sandbox = handle.id, "the checkpoint helper: {e}");
                return None;
            }
        };
        cella_crash::crash_point!("runtime.gvisor.checkpoint.running");
        let out = match child.wait_with_output() {
            Ok(out) => out,
            Err(e) => return Some(Err(e.to_string())),
        };
        let said = String::from_utf8_lossy(&out.stderr);
        let said = said.trim().lines().last().unwrap_or("failed").to_string();
        match out.status.code() {
            Some(0) => Some(Ok(())),
            Some(CHECKPOINT_UNREACHABLE) => {
                tracing::debug!(sandbox = handle.id, "checkpoint through runsc: {said}");
                None
            }
            _ => Some(Err(said)),
        }
    }

    /// The checkpoint by `runsc checkpoint`, run by a shell that names `tmp` whole as `dest`
    /// once runsc succeeded.
    fn checkpoint_by_runsc(
        &self,
        handle: &SandboxHandle,
        tmp: &Path,
        dest: &Path,
    ) -> Result<(), String> {
        let by: [&std::ffi::OsStr; 6] = [
            "/bin/sh".as_ref(),
            "-c".as_ref(),
            r#"from=$1; to=$2; shift 2; "$@" && mv -T -- "$from" "$to""#.as_ref(),
            "cella-checkpoint".as_ref(),
            tmp.as_os_str(),
            dest.as_os_str(),
        ];
        let mut cmd = self.runsc_command_by(&handle.id, &by);
        cmd.args([
            "checkpoint".to_string(),
            format!("--image-path={}", tmp.display()),
            handle.id.clone(),
        ]);
        let running = Self::spawn(&mut cmd);
        cella_crash::crash_point!("runtime.gvisor.checkpoint.running");
        running.and_then(Self::finish)
    }

    /// Starts the sandbox again from its image; answers its new handle once its `runsc
    /// restore` runs (the agent is woken and waited for by the caller).
    fn restore(&self, handle: &SandboxHandle) -> Result<SandboxHandle, DriverError> {
        let dir = self.sandbox_dir(&handle.id);
        let text = std::fs::read(dir.join(LAUNCH_FILE))?;
        let cfg: GvisorLaunch = serde_json::from_slice(&text).map_err(std::io::Error::other)?;
        let mut cfg = as_restore(cfg, &dir.join(MEMORY_DIR))?;
        // The same link, kept while the sandbox was on disk.
        if let Some(n) = cfg.net.as_mut() {
            n.again = Some(handle.net.clone().ok_or_else(|| {
                DriverError::Launch("the sandbox had a link but its handle does not say".into())
            })?);
        }
        // A restore the server did not record (killed during a resume) must not run twice.
        cgroup::kill(&handle.cgroup);
        self.runsc_delete(&handle.id);
        let _ = std::fs::remove_file(dir.join("sock").join(spec::SOCKET_NAME));
        self.lift(&handle.id, &handle.cgroup);
        let (pid, start_time, _) = self.start(&cfg)?;
        Ok(SandboxHandle {
            pid,
            start_time,
            ..handle.clone()
        })
    }

    /// Tells a quiesced agent to bind its socket again (`SIGUSR2` through runsc's control
    /// server, tried until the container takes it) and waits until it answers.
    async fn wake(&self, handle: &SandboxHandle) -> Result<(), DriverError> {
        let _ = std::fs::remove_file(&handle.socket);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let args = vec!["kill".to_string(), handle.id.clone(), "USR2".into()];
        let started = std::time::Instant::now();
        // runsc marks the container running in its state file once the restore is whole;
        // until then a signal fails, so the file is read first, which costs nothing.
        let state = self
            .runsc_root()
            .join(format!("{0}_sandbox:{0}.state", handle.id));
        while std::time::Instant::now() < deadline
            && process_start_time(handle.pid) == Some(handle.start_time)
            && !std::fs::read(&state).is_ok_and(|b| says_running(&b))
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // Restored: from here on its processes run, on the sandbox's own quota.
        self.unlift(&handle.id, &handle.cgroup)?;
        let netns = Some(self.sandbox_dir(&handle.id).join(NETNS_FILE)).filter(|f| f.exists());
        let mut tries = 0u32;
        loop {
            tries += 1;
            let this = self.clone();
            let a = args.clone();
            let id = handle.id.clone();
            let ns = netns.clone();
            let cg = handle.cgroup.clone();
            // Straight to runsc's control server; `runsc kill` only where that does not answer.
            // (Whether to try again, what failed.)
            let sent = tokio::task::spawn_blocking(move || {
                let sandbox = control::Listener::InCgroup(&cg);
                match control::signal_init(&id, libc::SIGUSR2, ns.as_deref(), sandbox) {
                    Ok(()) => Ok(()),
                    Err(control::ControlError::Refused(e)) => Err((true, e)),
                    // Not the sandbox listening: nothing to wait for.
                    Err(e @ control::ControlError::Impostor(_)) => Err((false, e.to_string())),
                    Err(control::ControlError::Unreachable(e)) => {
                        tracing::debug!(sandbox = id, "waking through runsc kill: {e}");
                        this.runsc_call(&id, &a).map_err(|e| (true, e))
                    }
                }
            })
            .await
            .map_err(|e| DriverError::Launch(e.to_string()))?;
            match sent {
                Ok(()) => break,
                Err((again, e))
                    if !again
                        || std::time::Instant::now() >= deadline
                        || process_start_time(handle.pid) != Some(handle.start_time) =>
                {
                    return Err(DriverError::Launch(format!(
                        "waking the agent: {e}; runsc: {}",
                        self.log_tail(&handle.id)
                    )));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
        let signalled = started.elapsed();
        let r = self.wait_agent(handle, deadline).await;
        // Woken, or tried: a sandbox whose agent does not come back is not taken for a
        // quiesced one again (its probe answers for it).
        let _ = std::fs::remove_file(self.sandbox_dir(&handle.id).join(QUIESCED_FILE));
        tracing::debug!(
            sandbox = handle.id,
            tries,
            signalled_ms = signalled.as_millis() as u64,
            answered_ms = started.elapsed().as_millis() as u64,
            "gvisor agent woken"
        );
        r
    }

    /// Waits until the agent's socket answers (it appears once the agent bound it).
    async fn wait_agent(
        &self,
        handle: &SandboxHandle,
        deadline: std::time::Instant,
    ) -> Result<(), DriverError> {
        while !handle.socket.exists()
            && std::time::Instant::now() < deadline
            && process_start_time(handle.pid) == Some(handle.start_time)
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // Bound is not yet listening: a refused connection is tried again, until the deadline.
        let client = AgentClient::new(&handle.socket);
        let mut answer = client.ping(Duration::from_secs(2)).await;
        while answer.is_err()
            && std::time::Instant::now() < deadline
            && process_start_time(handle.pid) == Some(handle.start_time)
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
            answer = client.ping(Duration::from_secs(2)).await;
        }
        answer.map(|_| ()).map_err(|e| {
            DriverError::Launch(format!(
                "the agent in gVisor did not answer: {e}; runsc: {}",
                self.log_tail(&handle.id)
            ))
        })
    }

    /// The end of a sandbox's `init.log` (runsc's complaints), for a boot's error.
    fn log_tail(&self, id: &str) -> String {
        let log =
            std::fs::read_to_string(self.sandbox_dir(id).join("init.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().rev().take(5).collect();
        let tail: Vec<&str> = lines.into_iter().rev().collect();
        tail.join(" | ")
    }

    /// Whether runsc keeps a record of container `id`: its state or lock file (runsc
    /// 20221219 names them `<sandbox>_sandbox:<container>.state` and `.lock`; a sandbox's
    /// container has the sandbox's id).
    fn has_record(&self, id: &str) -> bool {
        let root = self.runsc_root();
        ["state", "lock"]
            .iter()
            .any(|ext| root.join(format!("{id}_sandbox:{id}.{ext}")).exists())
    }

    /// Removes runsc's record of a container (idempotent; its processes are gone or go). No
    /// `runsc` runs when there is no record (a first boot, a restore after the checkpoint's
    /// own delete): it would only fail to load one, after a Go program's start.
    fn runsc_delete(&self, id: &str) {
        if !self.has_record(id) {
            return;
        }
        let _ = self
            .runsc_command(id)
            .args(["delete", "--force", id])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        // What runsc could not remove (a record of a container whose processes died with a
        // `kill -9` of everything).
        self.forget_record(id);
    }

    /// Removes runsc's record of container `id` whose processes are gone: the files named after
    /// it in runsc's root (its state and lock), which is all `runsc delete` removes for a
    /// container of this driver (no cgroup of runsc's, no mount on the host).
    fn forget_record(&self, id: &str) {
        if let Ok(rd) = std::fs::read_dir(self.runsc_root()) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.contains(id) {
                    let _ = std::fs::remove_file(e.path())
                        .or_else(|_| std::fs::remove_dir_all(e.path()));
                }
            }
        }
    }

    /// Ends the sandbox's processes (every process of its cgroup), runsc's record and the
    /// socket; without `keep_files`, its directory too.
    fn remove(
        &self,
        id: &str,
        handle: Option<&SandboxHandle>,
        keep_files: bool,
    ) -> Result<(), DriverError> {
        if let Some(n) = &self.net {
            n.remove_rules(id, handle);
        }
        let cg = self.cgroup_path(id);
        let res = cgroup::kill_and_remove(&cg);
        if let Some(h) = handle {
            if process_start_time(h.pid) == Some(h.start_time) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(h.pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            crate::reap::reap(h.pid, h.start_time);
        }
        res?;
        self.runsc_delete(id);
        let dir = self.sandbox_dir(id);
        let _ = std::fs::remove_file(dir.join("sock").join(spec::SOCKET_NAME));
        // The link goes with its namespace (a next boot makes another).
        release_netns(&dir.join(NETNS_FILE));
        if keep_files {
            // Its cgroup went: the next boot makes it with the sandbox's limits.
            let _ = std::fs::remove_file(dir.join(QUOTA_FILE));
            let _ = std::fs::remove_file(dir.join(QUIESCED_FILE));
            let _ = std::fs::remove_dir_all(dir.join("work"));
            let _ = std::fs::remove_dir_all(dir.join(MEMORY_DIR));
            let _ = std::fs::remove_dir_all(dir.join(MEMORY_TMP));
        } else if dir.exists() {
            // The overlay and the disk were mounted only in the sandbox's own mount namespace,
            // gone with its last process; here they are empty directories.
            std::fs::remove_dir_all(&dir)?;
        }
        Ok(())
    }
}

/// Names a build of the server's executable: its file's device, inode, size and modification
/// time (an upgrade that puts a new file in place changes them; hashing 200 MB at each start
/// would cost more than a start; the change time would change with the pin's own link). None
/// when it cannot be read.
fn agent_stamp(exe: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(exe).ok()?;
    Some(format!(
        "{:x}-{:x}-{:x}-{:x}.{:x}",
        m.dev(),
        m.ino(),
        m.len(),
        m.mtime(),
        m.mtime_nsec()
    ))
}

/// Pins `exe` for sandboxes: `DATA/gvisor-agents/<stamp>/cella`, a hard link to it (a copy
/// across file systems), made once per build. A sandbox paused to disk, a snapshot with memory
/// and a boot image hold the memory of the agent's process, which goes on with that
/// executable's code after a restore: a restore over another build's executable crashes the
/// agent (`SIGSEGV`). The pinned file outlives an upgrade that replaces the server's (a new
/// file in its place; one rewritten in place, with the same inode, is not caught). Pins nothing
/// names are removed at the next start ([`GvisorDriver::forget_agents`]).
fn pin_agent(data_dir: &Path, exe: &Path) -> std::io::Result<PathBuf> {
    let stamp = agent_stamp(exe)
        .ok_or_else(|| std::io::Error::other(format!("{} cannot be read", exe.display())))?;
    let root = data_dir.join(AGENTS_DIR);
    let dir = root.join(stamp);
    let pinned = dir.join(AGENT_NAME);
    if pinned.is_file() {
        return Ok(pinned);
    }
    for d in [&root, &dir] {
        std::fs::create_dir_all(d)?;
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))?;
    }
    let tmp = dir.join(format!("{AGENT_NAME}.{}.partial", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    if std::fs::hard_link(exe, &tmp).is_err() {
        std::fs::copy(exe, &tmp)?;
    }
    std::fs::rename(&tmp, &pinned)?;
    Ok(pinned)
}

/// Unbinds a kept network namespace (its link and the veth's host end go with it) and removes
/// the file; nothing when there is none.
fn release_netns(file: &Path) {
    if file.exists() {
        let _ = nix::mount::umount2(file, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_file(file);
    }
}

/// Whether a runsc container state file says the container is running (a file being written,
/// not yet whole JSON, does not).
fn says_running(state: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(state).is_ok_and(|v| v["status"] == "running")
}

/// The launcher's input of a boot turned into a restore of the checkpoint image in `image`
/// (the same bundle and mounts).
fn as_restore(mut cfg: GvisorLaunch, image: &Path) -> Result<GvisorLaunch, DriverError> {
    let run = cfg
        .runsc
        .iter()
        .position(|a| a == "run")
        .ok_or_else(|| DriverError::Launch("no runsc run in the launch file".into()))?;
    cfg.runsc[run] = "restore".into();
    cfg.runsc
        .insert(run + 1, format!("--image-path={}", image.display()));
    Ok(cfg)
}

/// Whether a checkpoint writing to the image directory `tmp` runs: a process whose command
/// line names it (`cella __gvisor-checkpoint`, or the shell that runs `runsc checkpoint`, and
/// runsc).
fn checkpoint_running(tmp: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let needle = tmp.as_os_str().as_bytes();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return false;
    };
    rd.flatten()
        .filter(|e| e.file_name().as_bytes().iter().all(u8::is_ascii_digit))
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .any(|c| c.windows(needle.len()).any(|w| w == needle))
}

/// A positive limit an OCI bundle's `config.json` gives under `linux.resources`, at
/// `controller`.`key` (`cpu`.`quota` in microseconds per period, `memory`.`limit` in bytes).
fn bundle_resource(config: &Path, controller: &str, key: &str) -> Option<u64> {
    let text = std::fs::read(config).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
    v["linux"]["resources"][controller][key]
        .as_i64()
        .filter(|q| *q > 0)
        .map(|q| q as u64)
}

/// The CPU quota (microseconds per period) an OCI bundle's `config.json` gives.
fn bundle_cpu_quota(config: &Path) -> Option<u64> {
    bundle_resource(config, "cpu", "quota")
}

/// Waits (up to 10 s) until no loop device is backed by `image`.
fn wait_released(image: &Path) {
    let want = image.to_string_lossy().into_owned();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let busy = std::fs::read_dir("/sys/block")
            .map(|rd| {
                rd.flatten().any(|e| {
                    std::fs::read_to_string(e.path().join("loop/backing_file"))
                        .is_ok_and(|b| b.trim_end() == want)
                })
            })
            .unwrap_or(false);
        if !busy || std::time::Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[async_trait]
impl Driver for GvisorDriver {
    fn name(&self) -> &'static str {
        "gvisor"
    }

    fn supports(&self, runtime: Runtime) -> bool {
        runtime == Runtime::Gvisor
    }

    fn owns(&self, id: &str) -> bool {
        !id.is_empty() && !id.contains('/') && self.sandbox_dir(id).exists()
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxHandle, DriverError> {
        let t = std::time::Instant::now();
        let this = self.clone();
        let spec2 = spec.clone();
        let (handle, restored) = tokio::task::spawn_blocking(move || {
            let r = this.launch(&spec2);
            if r.is_err() {
                let _ = this.remove(&spec2.id, None, true);
            }
            r
        })
        .await
        .map_err(|e| DriverError::Launch(e.to_string()))??;
        let launched = t.elapsed();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let ready = if restored {
            // Restored from a snapshot's checkpoint: its agent waits, quiesced, to be woken;
            // the hostname in the image is the source's.
            match self.wake(&handle).await {
                Ok(()) => AgentClient::new(&handle.socket)
                    .set_hostname(&spec.hostname, Duration::from_secs(10))
                    .await
                    .map_err(|e| DriverError::Agent(format!("setting the hostname: {e}"))),
                Err(e) => Err(e),
            }
        } else {
            self.wait_agent(&handle, deadline).await
        };
        let ready = ready.and_then(|()| self.unlift(&handle.id, &handle.cgroup));
        if let Err(e) = ready {
            let _ = self.stop(&handle.id, Some(&handle)).await;
            return Err(e);
        }
        tracing::debug!(
            sandbox = spec.id,
            restored,
            launched_ms = launched.as_secs_f64() * 1e3,
            ready_ms = t.elapsed().as_secs_f64() * 1e3,
            "gvisor sandbox up"
        );
        Ok(handle)
    }

    async fn exec(
        &self,
        handle: &SandboxHandle,
        spec: ExecSpec,
        events: mpsc::Sender<ExecEvent>,
    ) -> Result<ExitInfo, DriverError> {
        crate::hosted::exec(handle, spec, events).await
    }

    async fn probe(&self, handle: &SandboxHandle) -> Probe {
        self.settle_left_checkpoint(&handle.id).await;
        if self.on_disk(&handle.id) {
            return Probe::Alive;
        }
        match crate::hosted::probe(handle, "runsc process").await {
            // Its runsc runs and its agent was quiesced for a checkpoint that did not come (a
            // server killed in between): `unpause` or `pause` wakes it.
            Probe::Gone(_) if crate::hosted::alive(handle) && self.quiesced(&handle.id) => {
                Probe::Alive
            }
            other => other,
        }
    }

    /// Runs the template's `true` ([`cella_agent::proto::ExecSpec::warm_up`]: as `nobody`)
    /// once and waits for it. A gVisor sandbox's first command after its boot takes 15-20 ms more
    /// than the next ones (measured with `true`: about 32 ms against 15), whatever the program,
    /// as long as none ran before it; one command that ran leaves the next one fast, after
    /// seconds of idle too. What is cold is in gVisor's kernel and file proxy (a child that
    /// only forks and exits did not help), not in the agent. The agent runs the same itself a
    /// moment after a boot or a restore (`AgentConfig::warm_first_command`); this one is for a
    /// pool sandbox, which may be claimed at once.
    async fn ready_first_command(&self, handle: &SandboxHandle) {
        let spec = ExecSpec::warm_up();
        let (tx, mut rx) = mpsc::channel(8);
        let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
        let res = crate::hosted::exec(handle, spec, tx).await;
        let _ = drain.await;
        if let Err(e) = res {
            tracing::debug!(sandbox = handle.id, "readying its first command: {e}");
        }
    }

    /// To disk: the agent quiesces (no host socket left open), runsc writes the sandbox to
    /// `memory/` and ends it ([`Self::checkpoint`]). A failure wakes the agent: the sandbox
    /// runs on.
    async fn pause(&self, handle: &SandboxHandle) -> Result<(), DriverError> {
        // A quota a server killed mid-way left lifted is set again, and its checkpoint, if it
        // left one running, is waited for.
        self.unlift(&handle.id, &handle.cgroup)?;
        self.settle_left_checkpoint(&handle.id).await;
        if self.on_disk(&handle.id) {
            // On disk it has no process: one left is a restore the server did not record (it
            // was killed during a resume), ended so that the image is the one copy.
            let cg = handle.cgroup.clone();
            let _ = tokio::task::spawn_blocking(move || cgroup::kill(&cg)).await;
            return Ok(());
        }
        // A sandbox frozen by an older server (memory in RAM) is thawed first.
        crate::hosted::unpause(handle)?;
        self.wake_if_left_quiesced(handle).await?;
        // Noted first: a server killed once the agent quiesced finds it so at its next start.
        std::fs::write(self.sandbox_dir(&handle.id).join(QUIESCED_FILE), "")?;
        if let Err(e) = AgentClient::new(&handle.socket)
            .quiesce(QUIESCE_TIMEOUT)
            .await
        {
            // It may have quiesced before the error: woken either way.
            let _ = self.wake(handle).await;
            return Err(DriverError::Agent(format!("quiescing the agent: {e}")));
        }
        // Nothing of the tenant's runs during the checkpoint (runsc stops the sandbox's kernel
        // first): the saving, runsc's work, is not held to the sandbox's quota.
        self.lift(&handle.id, &handle.cgroup);
        cella_crash::crash_point!("runtime.gvisor.pause.lifted");
        let this = self.clone();
        let h = handle.clone();
        let saved = tokio::task::spawn_blocking(move || this.checkpoint(&h))
            .await
            .map_err(|e| DriverError::Launch(e.to_string()));
        if let (Err(e), Ok(Err(_)) | Err(_)) = (self.unlift(&handle.id, &handle.cgroup), &saved) {
            // The sandbox runs on (the checkpoint failed): its note stays, and the next pause,
            // resume or start sets the quota again.
            tracing::error!(sandbox = handle.id, "after a failed checkpoint: {e}");
        }
        let saved = saved?;
        if let Err(e) = saved {
            if let Err(w) = self.wake(handle).await {
                tracing::warn!(sandbox = handle.id, "after a failed checkpoint: {w}");
            }
            return Err(e);
        }
        Ok(())
    }

    /// From disk: `runsc restore` of `memory/` in a new launcher (the same mounts), the agent
    /// woken, the image removed. A failure ends what started and keeps the image.
    async fn unpause(&self, handle: &SandboxHandle) -> Result<Option<SandboxHandle>, DriverError> {
        // A checkpoint a server killed during it left running is waited for: saved, the
        // sandbox is on disk and restored below.
        self.settle_left_checkpoint(&handle.id).await;
        if !self.on_disk(&handle.id) {
            // A quota a server killed mid-way left lifted is set again, and an agent it left
            // quiesced (between the quiesce and the checkpoint) is woken.
            self.unlift(&handle.id, &handle.cgroup)?;
            crate::hosted::unpause(handle)?;
            self.wake_if_left_quiesced(handle).await?;
            return Ok(None);
        }
        let this = self.clone();
        let h = handle.clone();
        let new = tokio::task::spawn_blocking(move || this.restore(&h))
            .await
            .map_err(|e| DriverError::Launch(e.to_string()))
            .and_then(|r| r);
        let new = match new {
            Ok(new) => new,
            Err(e) => {
                let _ = self.unlift(&handle.id, &handle.cgroup);
                return Err(e);
            }
        };
        if let Err(e) = self.wake(&new).await {
            let _ = self.unlift(&handle.id, &handle.cgroup);
            let this = self.clone();
            let n = new.clone();
            let _ = tokio::task::spawn_blocking(move || {
                cgroup::kill(&n.cgroup);
                crate::reap::reap(n.pid, n.start_time);
                this.runsc_delete(&n.id);
            })
            .await;
            return Err(e);
        }
        std::fs::remove_dir_all(self.sandbox_dir(&handle.id).join(MEMORY_DIR))?;
        Ok(Some(new))
    }

    async fn stop(&self, id: &str, handle: Option<&SandboxHandle>) -> Result<(), DriverError> {
        let this = self.clone();
        let (id, handle) = (id.to_string(), handle.cloned());
        tokio::task::spawn_blocking(move || this.remove(&id, handle.as_ref(), true))
            .await
            .map_err(|e| DriverError::Launch(e.to_string()))?
    }

    async fn destroy(&self, id: &str, handle: Option<&SandboxHandle>) -> Result<(), DriverError> {
        let this = self.clone();
        let (id, handle) = (id.to_string(), handle.cloned());
        tokio::task::spawn_blocking(move || this.remove(&id, handle.as_ref(), false))
            .await
            .map_err(|e| DriverError::Launch(e.to_string()))?
    }

    async fn snapshot(
        &self,
        id: &str,
        handle: Option<&SandboxHandle>,
        snapshot_id: &str,
    ) -> Result<SnapshotInfo, DriverError> {
        // A running one would be restored with a new handle, which this call cannot answer.
        if handle.is_some_and(|h| !self.on_disk(&h.id)) {
            return Err(DriverError::Unsupported(
                "a snapshot of a running gvisor sandbox goes through snapshot_with_memory".into(),
            ));
        }
        let this = self.clone();
        let (id, snap) = (id.to_string(), snapshot_id.to_string());
        tokio::task::spawn_blocking(move || this.copy_at_rest(&id, &snap, false))
            .await
            .map_err(|e| DriverError::Launch(e.to_string()))?
    }

    /// A running sandbox is written to its directory as a pause to disk does (quiesce,
    /// checkpoint: its files then rest on its disk image, and the sentry flushed what it
    /// cached), copied, and restored from its own image as a resume does: new handle (or, with
    /// `leave_on_disk` and a copy made, left for the caller's `unpause`). A server killed in
    /// between finds it on disk with its row running, and restores it.
    async fn snapshot_with_memory(
        &self,
        id: &str,
        handle: Option<&SandboxHandle>,
        snapshot_id: &str,
        memory: bool,
        leave_on_disk: bool,
    ) -> MemorySnapshot {
        let at_rest = |this: GvisorDriver| {
            let (id, snap) = (id.to_string(), snapshot_id.to_string());
            async move {
                tokio::task::spawn_blocking(move || this.copy_at_rest(&id, &snap, memory))
                    .await
                    .map_err(|e| DriverError::Launch(e.to_string()))?
            }
        };
        let Some(h) = handle.filter(|h| !self.on_disk(&h.id)) else {
            return MemorySnapshot {
                result: at_rest(self.clone()).await,
                new_handle: None,
            };
        };
        let t = std::time::Instant::now();
        if let Err(e) = self.pause(h).await {
            return MemorySnapshot {
                result: Err(e),
                new_handle: None,
            };
        }
        let copied = at_rest(self.clone()).await;
        // Written to disk, copied or not, its row still running.
        cella_crash::crash_point!("runtime.gvisor.snapshot.saved");
        if leave_on_disk && copied.is_ok() {
            return MemorySnapshot {
                result: copied,
                new_handle: None,
            };
        }
        match self.unpause(h).await {
            Ok(new) => MemorySnapshot {
                result: copied.map(|info| SnapshotInfo {
                    paused_us: t.elapsed().as_micros() as u64,
                    ..info
                }),
                new_handle: new,
            },
            Err(e) => {
                // It stays on disk (alive for the server: a resume or restart restores it).
                let _ = std::fs::remove_dir_all(self.snapshot_dir(snapshot_id));
                MemorySnapshot {
                    result: Err(e),
                    new_handle: None,
                }
            }
        }
    }

    /// As a snapshot with memory of a running sandbox (pause to disk, copy, resume), into
    /// `<dest>.partial`, renamed `dest` once whole: a crash in between leaves only the partial
    /// directory, which no create takes.
    async fn save_boot_image(&self, handle: &SandboxHandle, dest: &Path) -> MemorySnapshot {
        let refused = |e: DriverError| MemorySnapshot {
            result: Err(e),
            new_handle: None,
        };
        if handle.net.is_some() {
            return refused(Self::unsupported(
                "a boot image of a sandbox with a network link",
            ));
        }
        if self.on_disk(&handle.id) {
            return refused(DriverError::Unsupported(format!(
                "sandbox {} is paused to disk, not running",
                handle.id
            )));
        }
        // Checked before the pause, which would be for nothing.
        if !self
            .sandbox_dir(&handle.id)
            .join(crate::disk::IMAGE)
            .exists()
        {
            return refused(DriverError::Unsupported(
                "boot images need the sandbox's files in a disk image ([disk] quota = true)".into(),
            ));
        }
        let Some(name) = dest.file_name() else {
            return refused(DriverError::Launch(format!(
                "{} names no directory",
                dest.display()
            )));
        };
        let mut partial = name.to_os_string();
        partial.push(".partial");
        let tmp = dest.with_file_name(partial);
        let t = std::time::Instant::now();
        if let Err(e) = self.pause(handle).await {
            return refused(e);
        }
        let this = self.clone();
        let (id, tmp2, dest2) = (handle.id.clone(), tmp.clone(), dest.to_path_buf());
        let saved = tokio::task::spawn_blocking(move || -> Result<u64, DriverError> {
            let _ = std::fs::remove_dir_all(&tmp2);
            let bytes = this.copy_into(&id, &tmp2, true)?;
            // Written, not yet in place: a crash here leaves only `.partial`.
            cella_crash::crash_point!("runtime.gvisor.boot_image.written");
            if let Err(e) = std::fs::rename(&tmp2, &dest2) {
                let _ = std::fs::remove_dir_all(&tmp2);
                return Err(e.into());
            }
            Ok(bytes)
        })
        .await
        .map_err(|e| DriverError::Launch(e.to_string()))
        .and_then(|r| r);
        match self.unpause(handle).await {
            Ok(new) => MemorySnapshot {
                result: saved.map(|size_bytes| SnapshotInfo {
                    size_bytes,
                    paused_us: t.elapsed().as_micros() as u64,
                }),
                new_handle: new,
            },
            Err(e) => {
                // It stays on disk; the image goes (a sandbox that cannot restore from its own
                // checkpoint makes no image for others).
                let _ = std::fs::remove_dir_all(dest);
                refused(e)
            }
        }
    }

    async fn export_layer(&self, id: &str, dest: &Path) -> Result<(), DriverError> {
        let dir = self.sandbox_dir(id);
        let binds = std::fs::read(dir.join(LAUNCH_FILE))
            .ok()
            .and_then(|b| serde_json::from_slice::<GvisorLaunch>(&b).ok())
            .map(|c| c.launch.binds)
            .unwrap_or_default();
        crate::namespace::export_upper(&dir, id, dest, &binds).await
    }

    async fn delete_snapshot(&self, _snapshot_id: &str) -> Result<(), DriverError> {
        Ok(())
    }

    async fn update_network(
        &self,
        handle: &SandboxHandle,
        rules: &crate::firewall::EgressRules,
    ) -> Result<(), DriverError> {
        match &self.net {
            Some(n) => n.update(handle, rules).await,
            None => Ok(()), // loopback only: nothing to filter
        }
    }

    fn agent(&self, handle: &SandboxHandle) -> AgentClient {
        AgentClient::new(&handle.socket)
    }

    fn alive(&self, handle: &SandboxHandle) -> bool {
        crate::hosted::alive(handle) || self.on_disk(&handle.id)
    }

    fn usage(&self, handle: &SandboxHandle) -> Option<ResourceUsage> {
        crate::hosted::usage(handle)
    }

    fn tidy(&self) {
        cgroup::remove_if_empty(&self.cgroup_parent);
        if let Some(n) = &self.net {
            n.wait_removals();
        }
    }

    fn leftovers(&self) -> Vec<String> {
        let mut ids: Vec<String> = std::fs::read_dir(self.data_dir.join("gvisor"))
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        ids.sort();
        ids
    }
}

/// Entry point of `cella __gvisor-init` (see the module doc). Returns the exit code.
pub fn launcher_main() -> i32 {
    match launch_run() {
        Ok((pid, net)) => {
            println!(
                "{}",
                serde_json::json!({ "ok": true, "pid": pid, "net": net })
            );
            0
        }
        Err(e) => {
            println!("{}", serde_json::json!({ "ok": false, "error": e }));
            1
        }
    }
}

/// The exit status of `cella __gvisor-checkpoint` when runsc's control server did not answer:
/// nothing was made, and `runsc checkpoint` may be run instead. (It is also the status the
/// argument parser exits with when an executable lacks the subcommand or refuses its
/// arguments, and nothing was done then either.)
const CHECKPOINT_UNREACHABLE: i32 = 2;

/// `cella __gvisor-checkpoint ID TMP DEST CGROUP [NETNS]`: writes sandbox `ID` to
/// `TMP/checkpoint.img` through runsc's control server ([`control::checkpoint`], whose listener
/// must be a process of `CGROUP`, the sandbox's; the sandbox then ends) and renames
/// `TMP` to `DEST` once saved. A process of its own rather than a call from the server, so that
/// a server killed during the save still finds the image named whole at its next start: the
/// save goes on, this process names `TMP` in its command line, and that start waits for it
/// ([`checkpoint_running`]). Exits 0 once saved and named, [`CHECKPOINT_UNREACHABLE`] when the
/// control server did not answer, else 1, with the reason on its standard error.
pub fn checkpoint_main(
    id: &str,
    tmp: &Path,
    dest: &Path,
    listener: control::Listener,
    netns: Option<&Path>,
) -> i32 {
    match control::checkpoint(id, &tmp.join(IMAGE_FILE), netns, listener) {
        Ok(()) => match std::fs::rename(tmp, dest) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("naming the image whole: {e}");
                1
            }
        },
        Err(control::ControlError::Unreachable(e)) => {
            eprintln!("{e}");
            CHECKPOINT_UNREACHABLE
        }
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

/// Puts the launcher in the sandbox's network namespace: a new one with a new link (bound at
/// `keep`), or at a restore the kept one with `eth0` addressed again. Answers the link.
fn enter_link(n: &GvisorNet) -> Result<crate::namespace::net::NetInfo, String> {
    use crate::namespace::net;
    use nix::sched::{setns, unshare, CloneFlags};
    use std::os::unix::fs::OpenOptionsExt;
    match &n.again {
        None => {
            let host = net::HostNs::open().map_err(|e| e.to_string())?;
            unshare(CloneFlags::CLONE_NEWNET).map_err(|e| format!("unshare: {e}"))?;
            // runsc gives the sandbox a loopback only if the namespace's `lo` is up.
            crate::namespace::launch::loopback_up().map_err(|e| format!("loopback: {e}"))?;
            let info = net::setup_inside(&host, &n.plan).map_err(|e| e.to_string())?;
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600)
                .open(&n.keep)
                .map_err(|e| format!("{}: {e}", n.keep.display()))?;
            nix::mount::mount(
                Some("/proc/self/ns/net"),
                &n.keep,
                None::<&str>,
                nix::mount::MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(|e| format!("keeping the network namespace: {e}"))?;
            Ok(info)
        }
        Some(info) => {
            let ns = std::fs::File::open(&n.keep)
                .map_err(|e| format!("the kept network namespace: {e}"))?;
            setns(&ns, CloneFlags::CLONE_NEWNET).map_err(|e| format!("setns: {e}"))?;
            // (Up already, but not in a namespace an older server kept.)
            crate::namespace::launch::loopback_up().map_err(|e| format!("loopback: {e}"))?;
            net::readdress(info).map_err(|e| e.to_string())?;
            Ok(info.clone())
        }
    }
}

fn launch_run() -> Result<(i32, Option<crate::namespace::net::NetInfo>), String> {
    use nix::sched::{unshare, CloneFlags};
    use nix::unistd::{fork, ForkResult};
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .map_err(|e| format!("reading the launch configuration: {e}"))?;
    let cfg: GvisorLaunch = serde_json::from_str(&text)
        .map_err(|e| format!("parsing the launch configuration: {e}"))?;
    crate::namespace::close_inherited_fds();
    cgroup::join(&cfg.launch.cgroup, std::process::id()).map_err(|e| e.to_string())?;
    // The link first, while this process still sees the host's mounts (the kept namespace's
    // bind mount must outlive it).
    let made = match &cfg.net {
        Some(n) => Some(enter_link(n)?),
        None => None,
    };
    unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("unshare: {e}"))?;
    for op in mounts::root_plan(&cfg.launch) {
        mounts::apply(&op, None).map_err(|e| e.to_string())?;
    }
    if made.is_some() {
        // runsc 20221219 tells the host's network namespace by `/proc/sys/net/core/rmem_default`
        // existing, which newer kernels show in every namespace: it would refuse the sandbox's
        // own. Hidden in this mount namespace only (runsc's processes are its only users).
        nix::mount::mount(
            Some("tmpfs"),
            "/proc/sys/net/core",
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID
                | nix::mount::MsFlags::MS_NODEV
                | nix::mount::MsFlags::MS_NOEXEC,
            Some("size=4k,mode=0555"),
        )
        .map_err(|e| format!("hiding /proc/sys/net/core from runsc: {e}"))?;
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&cfg.log)
        .map_err(|e| format!("opening {}: {e}", cfg.log.display()))?;
    let null = std::fs::File::open("/dev/null").map_err(|e| format!("/dev/null: {e}"))?;
    let (exe, args) = cfg
        .runsc
        .split_first()
        .ok_or_else(|| "no runsc command".to_string())?;
    // SAFETY: this process is single-threaded.
    match unsafe { fork() }.map_err(|e| format!("fork: {e}"))? {
        ForkResult::Child => {
            use std::os::unix::process::CommandExt;
            let _ = nix::unistd::setsid();
            let _ = nix::unistd::dup2(null.as_raw_fd(), 0);
            let _ = nix::unistd::dup2(log.as_raw_fd(), 1);
            let _ = nix::unistd::dup2(log.as_raw_fd(), 2);
            let err = Command::new(exe)
                .args(args)
                .env_clear()
                .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
                .exec();
            eprintln!("cella-gvisor-init: exec {exe}: {err}");
            std::process::exit(127);
        }
        ForkResult::Parent { child } => Ok((child.as_raw(), made)),
    }
}

/// Where the agent mounts gVisor's own `pids` cgroup hierarchy for its exec cgroups.
const EXEC_CGROUPS: &str = "/run/cella/cgroup";

/// A cgroup per exec inside gVisor ([`cella_agent::execcg::ExecCgroups::gvisor`]): gVisor's
/// kernel refuses `PR_SET_CHILD_SUBREAPER`, so a process that left its exec's session and lost
/// its parent (`(setsid cmd &)`) would otherwise outlive the exec's timeout and hang-up. The
/// hierarchy is gVisor's own (nothing of the host's), mounted on `/run`'s tmpfs, root's only;
/// commands cannot mount or unmount (no `CAP_SYS_ADMIN`, and their filter refuses it).
fn exec_cgroups() -> Result<cella_agent::execcg::ExecCgroups, String> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let dir = Path::new(EXEC_CGROUPS);
    std::fs::create_dir_all(dir).map_err(|e| format!("making {EXEC_CGROUPS}: {e}"))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("{EXEC_CGROUPS}: {e}"))?;
    nix::mount::mount(
        Some("cgroup"),
        dir,
        Some("cgroup"),
        nix::mount::MsFlags::MS_NOSUID
            | nix::mount::MsFlags::MS_NODEV
            | nix::mount::MsFlags::MS_NOEXEC,
        Some("pids"),
    )
    .map_err(|e| format!("mounting gVisor's pids cgroups on {EXEC_CGROUPS}: {e}"))?;
    let c = std::ffi::CString::new(EXEC_CGROUPS).map_err(|e| e.to_string())?;
    // SAFETY: a plain system call with a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        )
    };
    if fd < 0 {
        return Err(format!(
            "opening {EXEC_CGROUPS}: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    let dir = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(cella_agent::execcg::ExecCgroups::gvisor(dir))
}

/// Entry point of `cella __gvisor-agent`, the sandbox's init inside gVisor: binds the agent's
/// socket (a host socket through `--host-uds=create`), mounts an empty read-only tmpfs over its
/// directory so nothing in the sandbox can reach the socket or the executable by name, puts
/// the `statx` shim in place ([`preload`]), and serves. Its commands get at most `nofile` open
/// files and `nproc` tasks per user (0: the agent's own limits).
pub fn agent_main(nofile: u64, nproc: u64) -> i32 {
    use std::os::fd::AsRawFd;
    // Before any epoll instance exists: see [`epoll`].
    epoll::quiet_deleted_interests();
    let listener = match std::os::unix::net::UnixListener::bind(spec::AGENT_SOCKET) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cella-gvisor-agent: binding {}: {e}", spec::AGENT_SOCKET);
            return 1;
        }
    };
    let _ = std::fs::set_permissions(spec::AGENT_SOCKET, std::fs::Permissions::from_mode(0o600));
    // Kept open (and out of the commands' reach: close-on-exec) to bind the socket again after
    // a restore, once the directory is hidden.
    let dir_fd = match std::fs::File::open(spec::AGENT_DIR) {
        Ok(f) => std::os::fd::IntoRawFd::into_raw_fd(f),
        Err(e) => {
            eprintln!("cella-gvisor-agent: opening {}: {e}", spec::AGENT_DIR);
            return 1;
        }
    };
    // Hidden under an empty read-only tmpfs. Not unmounted: gVisor's listener of a host
    // socket breaks (EIO on accept) once its mount is gone. Commands cannot unmount it: their
    // `Jail` has no CAP_SYS_ADMIN and its seccomp filter refuses every (u)mount.
    if let Err(e) = nix::mount::mount(
        Some("none"),
        spec::AGENT_DIR,
        Some("tmpfs"),
        nix::mount::MsFlags::MS_RDONLY
            | nix::mount::MsFlags::MS_NOSUID
            | nix::mount::MsFlags::MS_NODEV
            | nix::mount::MsFlags::MS_NOEXEC,
        Some("size=4k,mode=000"),
    ) {
        eprintln!("cella-gvisor-agent: hiding {}: {e}", spec::AGENT_DIR);
        return 1;
    }
    // Not fatal: without it, coreutils' `ls PATH` and `stat` fail as they did (see [`preload`]).
    if let Err(e) = preload::install() {
        eprintln!("cella-gvisor-agent: the statx shim: {e}");
    }
    // Not fatal either: without it, a timeout or a hang-up kills an exec's process tree only.
    let exec_cgroups = match exec_cgroups() {
        Ok(c) => Some(std::sync::Arc::new(c)),
        Err(e) => {
            eprintln!("cella-gvisor-agent: exec cgroups: {e}");
            None
        }
    };
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for fd in 0..3 {
            let _ = nix::unistd::dup2(null.as_raw_fd(), fd);
        }
    }
    cella_agent::serve(
        listener,
        cella_agent::AgentConfig {
            nofile,
            nproc,
            exec_cgroups,
            rebind: Some(cella_agent::Rebind {
                dir_fd,
                name: spec::SOCKET_NAME.into(),
            }),
            // No exec cgroups, so no process waits for the next exec.
            refresh_standby: false,
            warm_first_command: true,
            // gVisor's kernel sends no terminal signals.
            terminal_signals: true,
        },
    )
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_sandboxs_own_task_limit_and_the_hosts() {
        assert_eq!(pids_limits(1024), (1024, 10_240));
        // Many vCPUs: the host's share stays bounded.
        assert_eq!(pids_limits(8192), (3276, 32_760));
        assert_eq!(pids_limits(0), (1, 10));
    }
    use super::*;

    /// An "executable" of a build: a file with `content` put in place as an upgrade puts one
    /// (written aside, renamed over the old).
    fn install(exe: &Path, content: &str) {
        let tmp = exe.with_extension("new");
        std::fs::write(&tmp, content).unwrap();
        std::fs::rename(&tmp, exe).unwrap();
    }

    #[test]
    fn each_build_of_the_agent_is_pinned_once_and_outlives_its_upgrade() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("cella");
        install(&exe, "build one");
        let data = dir.path().join("data");
        let one = pin_agent(&data, &exe).unwrap();
        assert_eq!(
            pin_agent(&data, &exe).unwrap(),
            one,
            "pinned once per build"
        );
        assert_eq!(std::fs::read_to_string(&one).unwrap(), "build one");
        install(&exe, "build two");
        let two = pin_agent(&data, &exe).unwrap();
        assert_ne!(two, one);
        assert_eq!(std::fs::read_to_string(&two).unwrap(), "build two");
        // What sandboxes of build one restore over is still build one.
        assert_eq!(std::fs::read_to_string(&one).unwrap(), "build one");
    }

    #[test]
    fn a_start_forgets_only_the_pinned_agents_nothing_names() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("cella");
        let data = dir.path().join("data");
        let mut pins = Vec::new();
        for build in [
            "paused sandbox's",
            "snapshot's",
            "boot image's",
            "nobody's",
            "current",
        ] {
            install(&exe, build);
            pins.push(pin_agent(&data, &exe).unwrap());
        }
        let put = |f: PathBuf, text: String| {
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, text).unwrap();
        };
        let launch = serde_json::json!({ "agent": pins[0], "other": "fields" });
        put(
            data.join("gvisor/sb1").join(LAUNCH_FILE),
            launch.to_string(),
        );
        put(
            data.join("snapshots/sn1").join(AGENT_FILE),
            pins[1].display().to_string(),
        );
        put(
            data.join("boot-images/t1/small-v1-x").join(AGENT_FILE),
            pins[2].display().to_string(),
        );
        let driver = GvisorDriver::new(&data, exe.clone(), "/bin/false".into(), "unit").unwrap();
        for (i, p) in pins.iter().enumerate() {
            assert_eq!(p.exists(), i != 3, "{}", p.display());
        }
        assert_eq!(
            driver.agent(),
            pins[4],
            "the current build's pin is used, not made again"
        );
    }

    #[test]
    fn a_checkpoint_restores_over_the_agent_it_was_made_with_or_says_it_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("cella");
        install(&exe, "build one");
        let driver =
            GvisorDriver::new(&dir.path().join("data"), exe, "/bin/false".into(), "unit").unwrap();
        let snap = dir.path().join("snap");
        std::fs::create_dir_all(&snap).unwrap();
        // From before agents were pinned: the current one.
        assert_eq!(driver.agent_of(&snap).unwrap(), None);
        let pinned = driver.agent();
        std::fs::write(snap.join(AGENT_FILE), pinned.display().to_string()).unwrap();
        assert_eq!(driver.agent_of(&snap).unwrap(), Some(pinned.clone()));
        std::fs::remove_file(&pinned).unwrap();
        match driver.agent_of(&snap) {
            Err(DriverError::Image(m)) => assert!(m.contains("is gone"), "{m}"),
            other => panic!("expected an image error, got {other:?}"),
        }
    }

    #[test]
    fn a_state_file_says_running_only_when_whole_and_running() {
        let running = br#"{"id":"sb1","spec":{"process":{"env":["X=\"status\":\"running\""]}},"status":"running","sandbox":{"pid":7}}"#;
        assert!(says_running(running));
        let created = br#"{"id":"sb1","spec":{"process":{"env":["X=\"status\":\"running\""]}},"status":"created"}"#;
        assert!(!says_running(created));
        // Half written.
        assert!(!says_running(&running[..running.len() - 20]));
        assert!(!says_running(b""));
    }

    #[test]
    fn the_checkpoint_helper_names_a_saved_image_whole_and_says_when_nothing_was_asked() {
        let dir = tempfile::tempdir().unwrap();
        let fresh = |name: &str| {
            let tmp = dir.path().join(format!("{name}.partial"));
            std::fs::create_dir_all(&tmp).unwrap();
            (tmp, dir.path().join(name))
        };
        let pid = std::process::id();
        // Saved: the image directory is named whole, with what the sandbox wrote.
        let id = format!("unit-{pid}-helper-ok");
        let server = control::tests::stand_in(
            &id,
            b"state",
            r#"{"success":true,"err":"","result":null}"#,
            None,
        );
        let (tmp, dest) = fresh("ok");
        assert_eq!(
            checkpoint_main(&id, &tmp, &dest, control::Listener::This, None),
            0
        );
        server.join().unwrap();
        assert!(!tmp.exists());
        assert_eq!(std::fs::read(dest.join(IMAGE_FILE)).unwrap(), b"state");
        // Refused once asked: 1, and nothing named whole (the driver wakes the sandbox).
        let id = format!("unit-{pid}-helper-refused");
        let server = control::tests::stand_in(
            &id,
            b"",
            r#"{"success":false,"err":"boom","result":null}"#,
            None,
        );
        let (tmp, dest) = fresh("refused");
        assert_eq!(
            checkpoint_main(&id, &tmp, &dest, control::Listener::This, None),
            1
        );
        server.join().unwrap();
        assert!(!dest.exists());
        // Nothing listens: the status that lets the driver run `runsc checkpoint`, and no file
        // made (runsc refuses an image that exists).
        let (tmp, dest) = fresh("nobody");
        let id = format!("unit-{pid}-helper-nobody");
        assert_eq!(
            checkpoint_main(&id, &tmp, &dest, control::Listener::This, None),
            CHECKPOINT_UNREACHABLE
        );
        assert!(!tmp.join(IMAGE_FILE).exists() && !dest.exists());
    }
}
