//! The Linux namespace driver: a sandbox is a PID 1 (the agent) in its own mount, PID, UTS, IPC,
//! network and cgroup namespaces, with an overlay root and a cgroup holding its limits.
//!
//! On the host a sandbox is: `DATA/sandboxes/<id>/` (its writable layer and mount point),
//! `DATA/run/<id>.sock` (the agent's socket) and the cgroup `cella/<instance>/<id>`. Its mounts
//! exist only in its own mount namespace and vanish with its last process.

pub(crate) mod launch;
mod launchers;
pub mod mounts;
pub mod net;

pub(crate) use launch::close_inherited_fds;
pub use launch::launcher_main;

use crate::cgroup::{self, Limits};
use crate::rootfs::Bind;
use crate::{
    Driver, DriverError, ExecEvent, ExecSpec, ExitInfo, Probe, ResourceUsage, SandboxHandle,
    SandboxSpec, SnapshotInfo,
};
use async_trait::async_trait;
use cella_agent::client::AgentClient;
use serde::{Deserialize, Serialize};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::mpsc;

/// What the launcher reads on its standard input (also kept as `launch.json`, for inspection).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LaunchConfig {
    pub id: String,
    pub hostname: String,
    pub layers: Vec<PathBuf>,
    pub upper: PathBuf,
    pub work: PathBuf,
    pub rootfs: PathBuf,
    pub binds: Vec<Bind>,
    pub socket: PathBuf,
    pub cgroup: String,
    /// The sandbox's disk image, mounted at `disk_mount` before the overlay (which then keeps
    /// `upper` and `work` inside it). None: the writable layer is a plain host directory.
    #[serde(default)]
    pub disk: Option<PathBuf>,
    #[serde(default)]
    pub disk_mount: PathBuf,
    /// The loop device that already serves `disk`, its file system mounted ahead by the disk
    /// pool (`crate::disk::Premounted`): mounted again instead of attaching `disk`.
    #[serde(default)]
    pub disk_device: Option<PathBuf>,
    /// Make a veth pair (see [`net`]); None: loopback only.
    #[serde(default)]
    pub network: Option<net::NetLaunch>,
    /// Run the sandbox in a user namespace of its own with this mapping (see
    /// [`crate::userns`]); None: its root is the host's root, confined by the rest.
    #[serde(default)]
    pub userns: Option<crate::userns::IdMap>,
    /// `RLIMIT_NOFILE` of every process in the sandbox (0: the agent's own).
    #[serde(default)]
    pub nofile: u64,
    /// Moving a process into a cgroup does not wait for an RCU grace period on this host
    /// (`favordynmods`, see [`crate::dynmods`]): the agent may fork the next exec's process
    /// again at a warm pool sandbox's claim (`cella_agent::AgentConfig::refresh_standby`).
    #[serde(default)]
    pub fast_cgroup_moves: bool,
}

/// Whether this host's cgroup moves are fast ([`LaunchConfig::fast_cgroup_moves`]): read once,
/// at the first boot (after the server's start turned `favordynmods` on where it can).
fn fast_cgroup_moves() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(crate::dynmods::is_on)
}

#[derive(Clone)]
pub struct NamespaceDriver {
    data_dir: PathBuf,
    agent_exe: PathBuf,
    cgroup_parent: String,
    disk_quota: bool,
    disks: Option<crate::diskpool::DiskPool>,
    net: Option<Network>,
    ids: Option<crate::userns::IdMap>,
    files: FileLimits,
    launchers: launchers::Launchers,
    /// Copies attached to a loop device before their data was written, by image path, kept for
    /// the boot that mounts them next (see [`Held`]).
    held: Held,
    /// Set as the server stops ([`Driver::tidy`]): copies no longer defer their source's
    /// flushes (see [`crate::disk::buffer_for_copy`]), since no thread may be left to honour
    /// them.
    stopping: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// A fork's copy of its source's disk, attached (buffered) before it was written
/// ([`crate::disk::copy_sparse_attached`]), held until its child's boot mounts it: attaching it
/// after the copy would first write the whole copy out, on the child's boot. An entry follows
/// its image when a child is given the snapshot's files, and goes with the image (the
/// snapshot's deletion, the sandbox's removal), when a boot takes it, or after [`HELD_FOR`]
/// (a loop device is not held for a boot that never comes). A crash lets every device go with
/// the process (they clear themselves).
#[derive(Clone, Default)]
struct Held(
    std::sync::Arc<
        std::sync::Mutex<
            std::collections::HashMap<PathBuf, (std::time::Instant, crate::disk::Attached)>,
        >,
    >,
);

/// How long a held copy waits for its boot.
const HELD_FOR: std::time::Duration = std::time::Duration::from_secs(60);

impl Held {
    fn put(&self, image: PathBuf, attached: crate::disk::Attached) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.retain(|_, (at, _)| at.elapsed() < HELD_FOR);
        m.insert(image, (std::time::Instant::now(), attached));
    }

    fn take(&self, image: &Path) -> Option<crate::disk::Attached> {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.retain(|_, (at, _)| at.elapsed() < HELD_FOR);
        m.remove(image).map(|(_, a)| a)
    }

    fn clear(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    fn moved(&self, from: &Path, to: PathBuf) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = m.remove(from) {
            m.insert(to, e);
        }
    }
}

/// Open files of a sandbox: per process, and what all of its processes may hold together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileLimits {
    /// `RLIMIT_NOFILE` (soft and hard) of every process in a sandbox; 0 leaves it unset.
    pub per_process: u64,
    /// The share of the host's `fs.file-max` (percent) that one sandbox may hold at most: its
    /// pids limit is lowered until pids x `per_process` fits (never below [`MIN_PIDS`]).
    pub host_share_percent: u32,
}

impl Default for FileLimits {
    fn default() -> Self {
        FileLimits {
            per_process: 1024,
            host_share_percent: 10,
        }
    }
}

/// A sandbox's pids limit is never lowered below this for its file budget.
pub const MIN_PIDS: u32 = 128;

impl FileLimits {
    /// The pids limit of a sandbox that asked for `pids_max`, on a host with `file_max`.
    pub fn pids_for(&self, pids_max: u32, file_max: u64) -> u32 {
        if self.per_process == 0 || file_max == 0 {
            return pids_max;
        }
        let budget = file_max.saturating_mul(self.host_share_percent as u64) / 100;
        let fit = (budget / self.per_process).min(u32::MAX as u64) as u32;
        pids_max.min(fit.max(MIN_PIDS))
    }
}

#[cfg(test)]
mod file_limit_tests {
    use super::FileLimits;

    #[test]
    fn pids_fit_the_share_of_file_max() {
        let f = FileLimits::default();
        // 10 % of 2.4 million files at 1024 per process: 240 processes.
        assert_eq!(f.pids_for(1024, 2_466_126), 240);
        // A smaller ask stays; a tiny host never goes below the floor.
        assert_eq!(f.pids_for(100, 2_466_126), 100);
        assert_eq!(f.pids_for(1024, 10_000), super::MIN_PIDS);
        // Off, or file-max unknown: unchanged.
        let off = FileLimits {
            per_process: 0,
            host_share_percent: 10,
        };
        assert_eq!(off.pids_for(4096, 2_466_126), 4096);
        assert_eq!(f.pids_for(4096, 0), 4096);
    }
}

/// The host's `fs.file-max` (0 when unknown).
fn host_file_max() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/file-max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The line every launcher gets at its start (nothing when it has nothing to make ahead).
fn prelude(userns: Option<crate::userns::IdMap>, net: Option<net::NetLaunch>) -> Vec<u8> {
    if userns.is_none() && net.is_none() {
        return Vec::new();
    }
    let ahead = launch::AheadLine {
        ahead: launch::Ahead { userns, net },
    };
    // Nothing rather than a bare newline, which a launcher would read as its start.
    match serde_json::to_vec(&ahead) {
        Ok(mut line) => {
            line.push(b'\n');
            line
        }
        Err(_) => Vec::new(),
    }
}

/// The sandbox network: its subnet, the firewall, and a guess at the next free slot. Shared
/// by both backends (see [`NamespaceDriver::network`]): one subnet, one firewall.
#[derive(Clone)]
pub struct Network {
    subnet: std::net::Ipv4Addr,
    prefix: u8,
    firewall: crate::firewall::Firewall,
    next_slot: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

impl Network {
    /// What a launcher needs to make a sandbox's link.
    pub(crate) fn plan(&self) -> net::NetLaunch {
        net::NetLaunch {
            subnet: self.subnet,
            prefix: self.prefix,
            first_slot: self.next_slot.load(std::sync::atomic::Ordering::Relaxed)
                % net::capacity(self.prefix),
        }
    }

    /// Once a launcher made the link (`made`, from its answer): the host end up and the
    /// sandbox's firewall rules in place. Answers the link with its interface index.
    pub(crate) fn bring_up(
        &self,
        id: &str,
        made: Option<net::NetInfo>,
        rules: &crate::firewall::EgressRules,
    ) -> (Option<net::NetInfo>, Result<(), DriverError>) {
        let Some(mut info) = made else {
            return (
                None,
                Err(DriverError::Network(
                    "the launcher made no interface".into(),
                )),
            );
        };
        self.next_slot
            .store(info.slot + 1, std::sync::atomic::Ordering::Relaxed);
        let t = std::time::Instant::now();
        let r = net::host_up(&info)
            .map_err(|e| DriverError::Network(format!("host end: {e}")))
            .and_then(|ifindex| {
                info.ifindex = ifindex;
                tracing::debug!(
                    sandbox = id,
                    host_end_ms = t.elapsed().as_secs_f64() * 1e3,
                    "host end up"
                );
                let link = Some((info.host_addr, info.sandbox_addr));
                self.firewall.install(id, ifindex, link, rules)
            });
        if r.is_err() {
            // Nothing of this boot was installed (a batch is all or nothing): no index, so
            // the failed boot's removal takes every chain of the id at once rather than queue
            // the removal of a chain that never was (whose failure fell back to the same,
            // later, when a new boot of the id may have its own).
            info.ifindex = 0;
        }
        (Some(info), r)
    }

    /// Removes a sandbox's firewall rules. With the boot's interface index they are queued
    /// ([`crate::firewall::Firewall::remove_boot_later`]: deleting nftables objects waits for
    /// an RCU grace period; as the index is never reused, rules that outlive the call apply to
    /// nothing); without one, every chain of the sandbox's id and its map entries go at once.
    pub(crate) fn remove_rules(&self, id: &str, handle: Option<&SandboxHandle>) {
        let boot = handle
            .and_then(|h| h.net.as_ref())
            .filter(|i| i.ifindex != 0);
        match boot {
            Some(info) => self.firewall.remove_boot_later(id, info.ifindex),
            None => {
                if let Err(e) = self.firewall.remove_all(id) {
                    tracing::warn!(sandbox = id, "removing firewall rules: {e}");
                }
            }
        }
    }

    /// Waits a while for the firewall rules of destroyed sandboxes to be gone (a clean stop).
    pub(crate) fn wait_removals(&self) {
        let left = self.firewall.wait_removals(Duration::from_secs(10));
        if left > 0 {
            tracing::warn!("stopping: firewall rules of {left} boot(s) left to the next start");
        }
    }

    /// Replaces the rules of a running sandbox's link.
    pub(crate) async fn update(
        &self,
        handle: &SandboxHandle,
        rules: &crate::firewall::EgressRules,
    ) -> Result<(), DriverError> {
        let Some(info) = &handle.net else {
            return Ok(()); // loopback only: nothing to filter
        };
        let (fw, id, rules) = (self.firewall.clone(), handle.id.clone(), rules.clone());
        let (recorded, iface) = (info.ifindex, info.iface.clone());
        let link = Some((info.host_addr, info.sandbox_addr));
        tokio::task::spawn_blocking(move || {
            // A handle from before interface indexes were recorded: look it up, and clear
            // what older versions left for this sandbox.
            let ifindex = match recorded {
                0 => net::ifindex(&iface)
                    .map_err(|e| DriverError::Network(format!("{iface}: {e}")))?,
                i => i,
            };
            fw.replace(&id, ifindex, link, &rules)?;
            if recorded == 0 {
                fw.remove_others(&id, ifindex)?;
            }
            Ok(())
        })
        .await
        .map_err(|e| DriverError::Network(e.to_string()))?
    }
}

impl NamespaceDriver {
    /// `agent_exe` is a binary whose `__sandbox-init` runs [`launcher_main`]; `instance`
    /// names this server's cgroup subtree.
    pub fn new(data_dir: &Path, agent_exe: PathBuf, instance: &str) -> Result<Self, DriverError> {
        for d in ["sandboxes", "run"] {
            let p = data_dir.join(d);
            std::fs::create_dir_all(&p)?;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700))?;
        }
        crate::disk::honour_flushes_under(data_dir);
        Ok(NamespaceDriver {
            data_dir: data_dir.to_path_buf(),
            launchers: launchers::Launchers::new(agent_exe.clone(), false, Box::new(Vec::new)),
            agent_exe,
            cgroup_parent: format!("cella/{instance}"),
            disk_quota: false,
            disks: None,
            net: None,
            ids: None,
            files: FileLimits::default(),
            held: Held::default(),
            stopping: Default::default(),
        })
    }

    /// Gives sandboxes whose spec asks for it a network interface in `subnet/prefix`, behind
    /// `firewall` (whose base rules this installs).
    pub fn with_network(
        mut self,
        subnet: std::net::Ipv4Addr,
        prefix: u8,
        firewall: crate::firewall::Firewall,
    ) -> Result<Self, DriverError> {
        if net::capacity(prefix) == 0 {
            return Err(DriverError::Network(format!(
                "sandbox subnet /{prefix} is too small"
            )));
        }
        firewall.install_base()?;
        let next = net::host_slots().into_iter().max().map_or(0, |s| s + 1);
        self.net = Some(Network {
            subnet,
            prefix,
            firewall,
            next_slot: std::sync::Arc::new(next.into()),
        });
        Ok(self)
    }

    /// Keeps a launcher started ahead for the next boot (see [`launchers`]), starting the first
    /// one now. Each launcher is told the id map and the network (set [`Self::with_userns`] and
    /// [`Self::with_network`] first) and makes the user namespace and a link while it waits (see
    /// `launch::Ahead`).
    pub fn with_launchers_ahead(mut self) -> Self {
        let (ids, net) = (self.ids, self.net.clone());
        let prelude = move || prelude(ids, net.as_ref().map(Network::plan));
        self.launchers = launchers::Launchers::new(self.agent_exe.clone(), true, Box::new(prelude));
        self.launchers.refill();
        self
    }

    /// Whether sandboxes get a network interface.
    pub fn has_network(&self) -> bool {
        self.net.is_some()
    }

    /// The network this driver gives sandboxes, for the gVisor backend to share.
    pub fn network(&self) -> Option<Network> {
        self.net.clone()
    }

    /// Its pool of formatted disk images, for the gVisor backend to share.
    pub fn disk_pool(&self) -> Option<crate::diskpool::DiskPool> {
        self.disks.clone()
    }

    /// Runs sandboxes in user namespaces with `ids` (see [`crate::userns`]; check the host with
    /// [`crate::userns::probe`] first).
    pub fn with_userns(mut self, ids: Option<crate::userns::IdMap>) -> Self {
        self.ids = ids;
        if let Some(pool) = &self.disks {
            pool.set_owner(ids.map_or(0, |m| m.base));
        }
        self
    }

    /// Limits the open files of sandboxes (see [`FileLimits`]).
    pub fn with_file_limits(mut self, files: FileLimits) -> Self {
        self.files = files;
        self
    }

    /// Gives every new sandbox a file system of exactly its `disk_size_mb` (see [`crate::disk`]).
    pub fn with_disk_quota(mut self, on: bool) -> Self {
        self.disk_quota = on;
        self
    }

    /// Keeps `per_size` formatted disk images of each size ready in `DATA/disks/` (see
    /// [`crate::diskpool`]; emptied here, at the server's start).
    pub fn with_disk_pool(mut self, per_size: usize) -> Result<Self, DriverError> {
        let pool = crate::diskpool::DiskPool::new(&self.data_dir.join("disks"), per_size)?;
        pool.set_owner(self.ids.map_or(0, |m| m.base));
        self.disks = Some(pool);
        Ok(self)
    }

    fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.data_dir.join("sandboxes").join(id)
    }

    fn socket_path(&self, id: &str) -> PathBuf {
        self.data_dir.join("run").join(format!("{id}.sock"))
    }

    fn snapshot_image(&self, snapshot_id: &str) -> PathBuf {
        self.data_dir
            .join("snapshots")
            .join(snapshot_id)
            .join(crate::disk::IMAGE)
    }

    /// The snapshot copy itself (blocking): freeze, sync, copy, thaw.
    ///
    /// Without a disk image there is nothing to copy (`Unsupported`). Otherwise it makes
    /// `snapshots/<snap>/` (0700); for a live sandbox (its init's pid with the recorded start
    /// time), unless it is frozen already, it calls `syncfs` on a descriptor of
    /// `/proc/<pid>/root` (the sandbox's overlay root: the sync passes through the overlay to the
    /// disk's ext4 and its loop device, buffered for the syncs and the copy by
    /// [`crate::disk::buffer_for_copy`], into the image file) and freezes the cgroup; then it
    /// syncs (again: what came since), copies, and thaws the cgroup if it froze it, timing the
    /// freeze (`paused_us`). A stopped sandbox's image is copied as
    /// it lies, once nothing mounts it ([`crate::disk::wait_unmounted`]). The copy is sparse ([`crate::disk::copy_sparse`]); its
    /// `size_bytes` is the copy's allocated blocks.
    ///
    /// With `hold`, for a boot that follows at once (a fork's child), the copy is attached to a
    /// loop device before it is written and held for that boot (see [`Held`]).
    fn take_snapshot(
        &self,
        id: &str,
        handle: Option<&SandboxHandle>,
        snapshot_id: &str,
        hold: bool,
    ) -> Result<SnapshotInfo, DriverError> {
        let src = self.sandbox_dir(id).join(crate::disk::IMAGE);
        if !src.exists() {
            return Err(DriverError::Unsupported(
                "snapshots need the sandbox's files in a disk image ([disk] quota = true)".into(),
            ));
        }
        let dir = self.data_dir.join("snapshots").join(snapshot_id);
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        let dst = dir.join(crate::disk::IMAGE);
        let live = handle.filter(|h| process_start_time(h.pid) == Some(h.start_time));
        let mut paused_us = 0;
        let copy = |src: &Path, dst: &Path| -> std::io::Result<u64> {
            if !hold {
                return crate::disk::copy_sparse(src, dst);
            }
            let (n, attached) = crate::disk::copy_sparse_attached(src, dst)?;
            if let Some(a) = attached {
                self.held.put(dst.to_path_buf(), a);
            }
            Ok(n)
        };
        let res = match live {
            // At rest, once nothing mounts it any more (a sandbox stopped a moment ago).
            None => crate::disk::wait_unmounted(&src, std::time::Duration::from_secs(10))
                .and_then(|_| copy(&src, &dst))
                .map(|_| ())
                .map_err(DriverError::from),
            Some(h) => {
                // The disk's device buffered for the sync and the copy, and turned back to
                // direct I/O a while after them (see `disk::buffer_for_copy`).
                let t = std::time::Instant::now();
                let defer = !self.stopping.load(std::sync::atomic::Ordering::SeqCst);
                let window = crate::disk::buffer_for_copy(&src, defer);
                let buffer_ms = t.elapsed().as_secs_f64() * 1e3;
                let was_frozen = cgroup::is_frozen(&h.cgroup);
                let root = std::fs::File::open(format!("/proc/{}/root", h.pid));
                // A first sync while it runs: what it wrote until now goes to its image
                // before its processes stop, and the sync while they are stopped has only
                // what came since (a first fork after 100 MiB were written paused it 150-180 ms
                // without; the sync alone was 90-110 of them).
                let t = std::time::Instant::now();
                if let (false, Ok(root)) = (was_frozen, &root) {
                    // SAFETY: syncfs on a descriptor we own.
                    unsafe { libc::syncfs(root.as_raw_fd()) };
                }
                let presync_ms = t.elapsed().as_secs_f64() * 1e3;
                let t = std::time::Instant::now();
                // Frozen for the copy; one paused (or asked to pause) already is waited for
                // until the kernel says every process stopped, and stays paused.
                let res = cgroup::freeze_for_copy(&h.cgroup, was_frozen);
                // Everything the sandbox wrote reaches its image: sync its root file system
                // (the overlay passes it on to the disk's ext4, which writes through the loop
                // device into the image file).
                let frozen = t.elapsed();
                let froze = res.is_ok();
                let mut synced = frozen;
                let res = res.and_then(|_| {
                    root.and_then(|root| {
                        // SAFETY: syncfs on a descriptor we own.
                        if unsafe { libc::syncfs(root.as_raw_fd()) } != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        synced = t.elapsed();
                        Ok(())
                    })
                    .and_then(|_| copy(&src, &dst))
                    .map_err(DriverError::from)
                });
                tracing::debug!(
                    sandbox = id,
                    buffered = window.is_some(),
                    buffer_ms,
                    presync_ms,
                    freeze_ms = frozen.as_secs_f64() * 1e3,
                    sync_ms = (synced - frozen).as_secs_f64() * 1e3,
                    copy_ms = (t.elapsed() - synced).as_secs_f64() * 1e3,
                    copied_mib = res.as_ref().map_or(0, |n| n >> 20),
                    "snapshot of a live sandbox"
                );
                let res = res.map(|_| ());
                // Frozen, the copy (partly) written, its row not yet stored.
                cella_crash::crash_point!("runtime.snapshot.frozen");
                if !was_frozen && froze {
                    let _ = cgroup::thaw(&h.cgroup);
                    paused_us = t.elapsed().as_micros() as u64;
                }
                drop(window);
                res
            }
        };
        if let Err(e) = res {
            self.held.take(&dst);
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        Ok(SnapshotInfo {
            size_bytes: crate::disk::allocated_bytes(&dst),
            paused_us,
        })
    }

    /// [`NamespaceDriver::take_snapshot`] on a blocking thread.
    async fn snapshot_off_thread(
        &self,
        id: &str,
        handle: Option<&SandboxHandle>,
        snapshot_id: &str,
        hold: bool,
    ) -> Result<SnapshotInfo, DriverError> {
        let this = self.clone();
        let (id, handle, snap) = (id.to_string(), handle.cloned(), snapshot_id.to_string());
        tokio::task::spawn_blocking(move || this.take_snapshot(&id, handle.as_ref(), &snap, hold))
            .await
            .map_err(|e| DriverError::Launch(e.to_string()))?
    }

    pub fn cgroup_path(&self, id: &str) -> String {
        format!("{}/{id}", self.cgroup_parent)
    }

    /// The launcher's input, and the disk's file system as the pool mounted it ahead (to be kept
    /// until the launcher answered: its own mount then holds the file system).
    fn prepare(
        &self,
        spec: &SandboxSpec,
        network: Option<net::NetLaunch>,
    ) -> Result<(LaunchConfig, Option<crate::disk::Premounted>), DriverError> {
        let dir = self.sandbox_dir(&spec.id);
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        // A sandbox made before disk quotas keeps its plain writable layer.
        let legacy = dir.join("upper").exists() && !dir.join(crate::disk::IMAGE).exists();
        let image = dir.join(crate::disk::IMAGE);
        if let (Some(snap), false, false) = (&spec.snapshot, image.exists(), legacy) {
            let src = self.snapshot_image(snap);
            if !src.exists() {
                return Err(DriverError::Image(format!(
                    "snapshot {snap} has no files on this host"
                )));
            }
            if let (_, Some(a)) = crate::disk::copy_sparse_attached(&src, &image)? {
                self.held.put(image.clone(), a);
            }
        }
        let mut premounted = None;
        let disk = if image.exists() {
            // Its files live there, whatever the setting is now. Mounted here, beside the
            // launcher's work; a fresh copy from the device attached before it was written
            // (see `premount_attached`). Where that cannot be done, the sandbox's init attaches
            // it as before.
            let ahead = match self.held.take(&image) {
                Some(a) => crate::disk::premount_attached(a, &image),
                None => crate::disk::premount_existing(&image),
            };
            match ahead {
                Ok(m) => premounted = Some(m),
                Err(e) => tracing::debug!(sandbox = spec.id, "mounting the disk ahead: {e}"),
            }
            Some(image)
        } else if self.disk_quota && !legacy && !spec.plain_layer {
            Some(match &self.disks {
                Some(pool) => {
                    let (img, mounted) = pool.take_mounted(&dir, spec.disk_size_mb)?;
                    premounted = mounted;
                    img
                }
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
        let root = dir.join("rootfs");
        std::fs::create_dir_all(&root)?;
        let cfg = LaunchConfig {
            id: spec.id.clone(),
            hostname: spec.hostname.clone(),
            layers: spec.image.layers.clone(),
            upper: layer.join("upper"),
            work: layer.join("work"),
            rootfs: root,
            binds: spec.image.binds.clone(),
            socket: self.socket_path(&spec.id),
            cgroup: self.cgroup_path(&spec.id),
            disk,
            disk_mount,
            disk_device: premounted.as_ref().map(|m| m.device.clone()),
            network,
            userns: self.ids,
            nofile: self.files.per_process,
            fast_cgroup_moves: fast_cgroup_moves(),
        };
        let json = serde_json::to_vec_pretty(&cfg).map_err(std::io::Error::other)?;
        std::fs::write(dir.join("launch.json"), json)?;
        Ok((cfg, premounted))
    }

    /// A launcher given its start `line` (see [`launchers`]), with its input still open for the
    /// configuration. A launcher kept ahead that cannot take the line died while it waited:
    /// with `retry`, one is started now in its place.
    fn start_launcher(
        &self,
        line: &[u8],
        retry: bool,
    ) -> Result<(std::process::Child, std::process::ChildStdin), DriverError> {
        use std::io::Write;
        let mut child = self.launchers.take().map_err(|e| {
            DriverError::Launch(format!("starting {}: {e}", self.agent_exe.display()))
        })?;
        let Some(mut stdin) = child.stdin.take() else {
            launchers::reap(child, ());
            return Err(DriverError::Launch("no launcher stdin".into()));
        };
        match stdin.write_all(line).and_then(|_| stdin.flush()) {
            Ok(()) => Ok((child, stdin)),
            Err(e) => {
                drop(stdin);
                launchers::reap(child, ());
                if retry {
                    tracing::warn!("a launcher kept ahead was gone ({e}): starting another");
                    self.start_launcher(line, false)
                } else {
                    Err(DriverError::Launch(format!("starting the launcher: {e}")))
                }
            }
        }
    }

    fn launch(&self, spec: &SandboxSpec) -> Result<SandboxHandle, DriverError> {
        let t0 = std::time::Instant::now();
        let cgroup_path = self.cgroup_path(&spec.id);
        let dir = self.sandbox_dir(&spec.id);
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        use std::io::Write;
        let network = match (&self.net, &spec.network) {
            (Some(n), Some(_)) => Some(n.plan()),
            _ => None,
        };
        let start = launch::Start {
            id: spec.id.clone(),
            cgroup: cgroup_path.clone(),
            log: dir.join("init.log"),
            userns: self.ids,
            network: network.clone(),
        };
        let mut line = serde_json::to_vec(&start).map_err(std::io::Error::other)?;
        line.push(b'\n');
        // The launcher makes the link (and the user namespace, unless it made it while it
        // waited) while the cgroup and the sandbox's files are made here; it joins the cgroup
        // once the whole configuration came (after both). One that died while it waited (its input is closed) never got a
        // start: a fresh one is started in its place.
        let (mut child, mut stdin) = self.start_launcher(&line, true)?;
        let t_start = t0.elapsed();
        // A failure before the configuration is sent closes the launcher's input: it gives up,
        // lets its helpers go and exits.
        let give_up = |child, stdin| {
            drop(stdin);
            launchers::reap(child, ());
            self.launchers.refill();
        };
        let made = cgroup::create(
            &cgroup_path,
            Limits {
                cpus: spec.cpu_count,
                memory_mb: spec.memory_mb,
                pids_max: self.files.pids_for(spec.pids_max, host_file_max()),
            },
        );
        if let Err(e) = made {
            give_up(child, stdin);
            return Err(e);
        }
        let t_cgroup = t0.elapsed();
        cella_crash::crash_point!("runtime.launch.after_cgroup");
        let (cfg, premounted) = match self.prepare(spec, network) {
            Ok(c) => c,
            Err(e) => {
                give_up(child, stdin);
                return Err(e);
            }
        };
        let t_prepare = t0.elapsed();
        cella_crash::crash_point!("runtime.launch.after_disk");
        // One that failed has closed its input already: its answer below says why.
        let _ = stdin.write_all(&serde_json::to_vec(&cfg).map_err(std::io::Error::other)?);
        drop(stdin);
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| DriverError::Launch("no launcher stdout".into()))?;
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
        let mut next_line =
            || -> Option<serde_json::Value> { serde_json::from_str(&lines.next()?.ok()?).ok() };
        let mut answer = next_line();
        // With a link, a first line names it as soon as it exists: its host end and firewall
        // chain are made here while the sandbox's init builds its root.
        let mut early = None;
        if let Some(first) = answer.as_ref().filter(|a| a.get("ok").is_none()) {
            if let (Some(n), Some(rules)) = (&self.net, &spec.network) {
                let t = std::time::Instant::now();
                let made = serde_json::from_value(first["net"].clone()).ok();
                early = Some(n.bring_up(&spec.id, made, rules));
                tracing::debug!(
                    sandbox = spec.id,
                    firewall_ms = t.elapsed().as_secs_f64() * 1e3,
                    "network up during the boot"
                );
            }
            answer = next_line();
        }
        // Once it answered, the sandbox's own mount holds the disk's file system: the pool's
        // detached mount of it goes after the launcher's exit, both waited for off the boot's
        // path. A boot that failed lets go of both before it answers (its image may be mounted
        // again by the next boot of the sandbox).
        if answer
            .as_ref()
            .is_some_and(|a| a["ok"] == serde_json::Value::Bool(true))
        {
            launchers::reap(child, premounted.map(crate::disk::Premounted::settled));
        } else {
            let _ = child.wait();
            drop(premounted);
        }
        self.launchers.refill();
        tracing::debug!(
            sandbox = spec.id,
            start_ms = t_start.as_secs_f64() * 1e3,
            cgroup_ms = (t_cgroup - t_start).as_secs_f64() * 1e3,
            prepare_ms = (t_prepare - t_cgroup).as_secs_f64() * 1e3,
            launch_ms = (t0.elapsed() - t_prepare).as_secs_f64() * 1e3,
            "boot phases"
        );
        let answer = answer.ok_or_else(|| {
            let log = std::fs::read_to_string(dir.join("init.log")).unwrap_or_default();
            DriverError::Launch(format!("launcher gave no answer; its log: {}", log.trim()))
        })?;
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
            .ok_or_else(|| DriverError::Launch("launcher gave no pid".into()))?
            as i32;
        let start_time = process_start_time(pid)
            .ok_or_else(|| DriverError::Launch("sandbox init died at start".into()))?;
        let mut handle = SandboxHandle {
            id: spec.id.clone(),
            runtime: crate::Runtime::Namespace,
            pid,
            start_time,
            socket: cfg.socket,
            cgroup: cfg.cgroup,
            net: None,
        };
        cella_crash::crash_point!("runtime.launch.after_init");
        if let (Some(n), Some(rules)) = (&self.net, &spec.network) {
            let (info, res) = early.unwrap_or_else(|| {
                let made = serde_json::from_value(answer["net"].clone()).ok();
                n.bring_up(&spec.id, made, rules)
            });
            handle.net = info;
            if let Err(e) = res {
                let _ = self.remove(&spec.id, Some(&handle), true);
                return Err(e);
            }
        }
        cella_crash::crash_point!("runtime.launch.after_network");
        Ok(handle)
    }

    /// Ends the sandbox's processes and drops its cgroup and socket; with `keep_files`, its
    /// writable layer stays for a later boot.
    ///
    /// It starts with the firewall rules ([`Network::remove_rules`]: with the boot's interface
    /// index they go after the answer). The link needs nothing: it went with the namespace.
    fn remove(
        &self,
        id: &str,
        handle: Option<&SandboxHandle>,
        keep_files: bool,
    ) -> Result<(), DriverError> {
        let alive = handle.is_some_and(|h| process_start_time(h.pid) == Some(h.start_time));
        if let Some(n) = &self.net {
            n.remove_rules(id, handle);
        }
        if let Some(h) = handle {
            if alive {
                // PID 1 of a PID namespace takes every process of the namespace with it.
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(h.pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        let cg = self.cgroup_path(id);
        let res = cgroup::kill_and_remove(&cg);
        if let Some(h) = handle {
            // The init is our child when the server is its subreaper; reap it so no zombie stays.
            crate::reap::reap(h.pid, h.start_time);
        }
        let dir = self.sandbox_dir(id);
        // A copy held for a boot that did not come.
        self.held.take(&dir.join(crate::disk::IMAGE));
        res?;
        cella_crash::crash_point!("runtime.remove.after_kill");
        let _ = std::fs::remove_file(self.socket_path(id));
        if keep_files {
            // The overlay's scratch space and mount point are remade at the next boot.
            for d in ["work", "rootfs"] {
                let _ = std::fs::remove_dir_all(dir.join(d));
            }
        } else if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        Ok(())
    }
}

/// A process's start time (clock ticks after boot), or None when it does not exist.
pub fn process_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // `rest` starts at field 3 (state); starttime is field 22; a zombie is as good as gone.
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

#[async_trait]
impl Driver for NamespaceDriver {
    fn name(&self) -> &'static str {
        "namespace"
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxHandle, DriverError> {
        let this = self.clone();
        let spec2 = spec.clone();
        let res = tokio::task::spawn_blocking(move || {
            let r = this.launch(&spec2);
            if r.is_err() {
                // A failed boot keeps the writable layer (a stopped sandbox's files must survive a
                // failed resume); destroying the sandbox removes it.
                let _ = this.remove(&spec2.id, None, true);
            }
            r
        })
        .await
        .map_err(|e| DriverError::Launch(e.to_string()))?;
        let handle = res?;
        let client = AgentClient::new(&handle.socket);
        if let Err(e) = client.ping(Duration::from_secs(10)).await {
            let _ = self.stop(&handle.id, Some(&handle)).await;
            return Err(DriverError::Launch(format!("agent did not answer: {e}")));
        }
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
        crate::hosted::probe(handle, "init process").await
    }

    async fn destroy(&self, id: &str, handle: Option<&SandboxHandle>) -> Result<(), DriverError> {
        let this = self.clone();
        let (id, handle) = (id.to_string(), handle.cloned());
        tokio::task::spawn_blocking(move || this.remove(&id, handle.as_ref(), false))
            .await
            .map_err(|e| DriverError::Launch(e.to_string()))?
    }

    async fn stop(&self, id: &str, handle: Option<&SandboxHandle>) -> Result<(), DriverError> {
        let this = self.clone();
        let (id, handle) = (id.to_string(), handle.cloned());
        tokio::task::spawn_blocking(move || this.remove(&id, handle.as_ref(), true))
            .await
            .map_err(|e| DriverError::Launch(e.to_string()))?
    }

    async fn pause(&self, handle: &SandboxHandle) -> Result<(), DriverError> {
        crate::hosted::pause(handle).await
    }

    async fn unpause(&self, handle: &SandboxHandle) -> Result<Option<SandboxHandle>, DriverError> {
        crate::hosted::unpause(handle).map(|()| None)
    }

    async fn snapshot(
        &self,
        id: &str,
        handle: Option<&SandboxHandle>,
        snapshot_id: &str,
    ) -> Result<SnapshotInfo, DriverError> {
        self.snapshot_off_thread(id, handle, snapshot_id, false)
            .await
    }

    async fn snapshot_for_boot(
        &self,
        id: &str,
        handle: Option<&SandboxHandle>,
        snapshot_id: &str,
    ) -> Result<SnapshotInfo, DriverError> {
        self.snapshot_off_thread(id, handle, snapshot_id, true)
            .await
    }

    async fn export_layer(&self, id: &str, dest: &Path) -> Result<(), DriverError> {
        let dir = self.sandbox_dir(id);
        // What the sandbox changed under a layered bind (/usr) goes to that place in the layer.
        let binds: Vec<crate::rootfs::Bind> = std::fs::read(dir.join("launch.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<LaunchConfig>(&b).ok())
            .map(|c| c.binds)
            .unwrap_or_default();
        export_upper(&dir, id, dest, &binds).await
    }

    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<(), DriverError> {
        self.held.take(&self.snapshot_image(snapshot_id));
        let dir = self.data_dir.join("snapshots").join(snapshot_id);
        match tokio::fs::remove_dir_all(&dir).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }

    async fn give_snapshot(&self, snapshot_id: &str, id: &str) -> Result<bool, DriverError> {
        let src = self.snapshot_image(snapshot_id);
        let dir = self.sandbox_dir(id);
        if !src.exists() || dir.join(crate::disk::IMAGE).exists() || dir.join("upper").exists() {
            return Ok(false);
        }
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        // Same file system (both under the data directory): one rename. The boot then finds
        // its image and copies nothing.
        std::fs::rename(&src, dir.join(crate::disk::IMAGE))?;
        self.held.moved(&src, dir.join(crate::disk::IMAGE));
        Ok(true)
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
        crate::hosted::alive(handle)
    }

    fn usage(&self, handle: &SandboxHandle) -> Option<ResourceUsage> {
        crate::hosted::usage(handle)
    }

    fn tidy(&self) {
        self.held.clear();
        // Sandboxes run on without the server: no copy defers flushes any more, and those
        // still deferred after one are honoured now rather than at the next start.
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        crate::disk::honour_flushes_under(&self.data_dir);
        cgroup::remove_if_empty(&self.cgroup_parent);
        if let Some(n) = &self.net {
            n.wait_removals();
        }
    }

    fn snapshot_files(&self) -> Vec<String> {
        std::fs::read_dir(self.data_dir.join("snapshots"))
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn leftovers(&self) -> Vec<String> {
        let mut ids: Vec<String> = std::fs::read_dir(self.data_dir.join("sandboxes"))
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        ids.extend(cgroup::children(&self.cgroup_parent));
        if let Some(n) = &self.net {
            ids.extend(n.firewall.own_chains().unwrap_or_default());
        }
        ids.sort();
        ids.dedup();
        ids
    }
}

/// Moves the plain writable layer of the stopped sandbox in `dir` (and what it changed under
/// its layered `binds`, at their places) to `dest`, its ids from 0: a template build's step,
/// on either runtime (a gVisor sandbox's files already hold its own ids).
pub(crate) async fn export_upper(
    dir: &Path,
    id: &str,
    dest: &Path,
    binds: &[crate::rootfs::Bind],
) -> Result<(), DriverError> {
    let upper = dir.join("upper");
    if !upper.is_dir() {
        return Err(DriverError::Unsupported(format!(
            "sandbox {id} has no plain writable layer to export"
        )));
    }
    if let Some(parent) = dest.parent() {
        tokio::fs::create_dir_all(parent).await?;
    }
    tokio::fs::rename(&upper, dest).await?;
    for b in binds.iter().filter(|b| b.layered) {
        let from = dir
            .join("binds")
            .join(mounts::bind_name(&b.dst))
            .join("upper");
        if !from.is_dir() || std::fs::read_dir(&from)?.next().is_none() {
            continue;
        }
        let to = dest.join(b.dst.strip_prefix("/").unwrap_or(&b.dst));
        if let Ok(m) = std::fs::symlink_metadata(&to) {
            // The mount point the overlay made in the root layer: replaced by the changes.
            if m.is_dir() {
                std::fs::remove_dir_all(&to)?;
            } else {
                std::fs::remove_file(&to)?;
            }
        }
        if let Some(p) = to.parent() {
            std::fs::create_dir_all(p)?;
        }
        std::fs::rename(&from, &to)?;
    }
    // Layers hold ids from 0 (sandboxes see them through id-mapped mounts); the sandbox's
    // files carry its range's host ids.
    let base = crate::userns::recorded_base(dir).unwrap_or(0);
    if base != 0 {
        let dest = dest.to_path_buf();
        tokio::task::spawn_blocking(move || {
            crate::userns::shift_tree(&dest, base, 0, crate::userns::IdMap::COUNT)
        })
        .await
        .map_err(|e| DriverError::Launch(e.to_string()))??;
    }
    Ok(())
}
