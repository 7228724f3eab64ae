//! The isolation runtime.
//!
//! [`Driver`] is the one interface the server uses to make, run and remove sandboxes; it hides
//! the backend the way Cloud Hypervisor's `Hypervisor` trait does. [`namespace::NamespaceDriver`]
//! is the Linux namespace backend (the default), [`gvisor::GvisorDriver`] runs sandboxes on
//! gVisor's user-space kernel (`runsc`), and [`dispatch::Dispatch`] is the one driver the server
//! holds: it picks the backend of each sandbox by its [`Runtime`] (in its spec and handle).

pub mod cgroup;
pub mod disk;
pub mod diskpool;
pub mod dispatch;
pub mod dynmods;
pub mod firewall;
pub mod fsapi;
pub mod gvisor;
pub mod hosted;
pub mod namespace;
pub mod nftlib;
pub mod reap;
pub mod rootfs;
pub mod serial;
pub mod userns;

use async_trait::async_trait;
pub use cella_agent::client::ExecEvent;
pub use cella_agent::proto::{ExecSpec, ExitInfo};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use tokio::sync::mpsc;

/// The isolation runtime a sandbox runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    /// Linux namespaces on the host's kernel ([`namespace::NamespaceDriver`]).
    #[default]
    Namespace,
    /// gVisor's user-space kernel ([`gvisor::GvisorDriver`]).
    Gvisor,
}

impl Runtime {
    pub const ALL: [Runtime; 2] = [Runtime::Namespace, Runtime::Gvisor];

    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Namespace => "namespace",
            Runtime::Gvisor => "gvisor",
        }
    }

    pub fn parse(s: &str) -> Option<Runtime> {
        Runtime::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl std::fmt::Display for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything a driver needs to start one sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxSpec {
    pub id: String,
    /// The backend that runs it.
    #[serde(default)]
    pub runtime: Runtime,
    pub hostname: String,
    pub image: rootfs::TemplateImage,
    pub cpu_count: u32,
    pub memory_mb: u32,
    pub disk_size_mb: u32,
    pub pids_max: u32,
    /// The sandbox's egress rules; None gives it loopback only (no interface at all).
    #[serde(default)]
    pub network: Option<firewall::EgressRules>,
    /// Start from this snapshot's files (see [`Driver::snapshot`]) when the sandbox has no
    /// writable layer yet.
    #[serde(default)]
    pub snapshot: Option<String>,
    /// Start from this boot image instead (a template's first boot, saved by
    /// [`Driver::save_boot_image`]: a whole directory with the disk image and the checkpoint),
    /// when the sandbox has no writable layer yet. gVisor only.
    #[serde(default)]
    pub boot_image: Option<std::path::PathBuf>,
    /// Keep the writable layer as a plain directory (no disk image), so that
    /// [`Driver::export_layer`] can turn it into a template layer.
    #[serde(default)]
    pub plain_layer: bool,
}

/// A snapshot as the driver took it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Bytes it occupies on the host.
    pub size_bytes: u64,
    /// How long the sandbox's processes were frozen for it (0 when they were not running).
    pub paused_us: u64,
}

/// What [`Driver::snapshot_with_memory`] did: the snapshot, and the source's new handle when
/// it was restored from a checkpoint (to be recorded whether or not the snapshot succeeded).
#[derive(Debug)]
pub struct MemorySnapshot {
    pub result: Result<SnapshotInfo, DriverError>,
    pub new_handle: Option<SandboxHandle>,
}

/// What the driver needs to find a running sandbox again, also after a server restart.
/// Stored by the server as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxHandle {
    pub id: String,
    /// The backend that runs it (handles stored before there was a choice are namespace ones).
    #[serde(default)]
    pub runtime: Runtime,
    /// Host pid of the sandbox's init (the agent).
    pub pid: i32,
    /// The init's start time in clock ticks since boot, to tell it from a reused pid.
    pub start_time: u64,
    pub socket: PathBuf,
    pub cgroup: String,
    /// Its network interface, when it has one.
    #[serde(default)]
    pub net: Option<namespace::net::NetInfo>,
}

/// Resource figures read from a sandbox's cgroup (since its current boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResourceUsage {
    pub cpu_ns: u64,
    pub memory_bytes: u64,
}

/// What a driver finds when it looks at a sandbox it started earlier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// Its init runs and its agent answers.
    Alive,
    /// Its processes are gone (or no longer answer); the reason says what was seen.
    Gone(String),
}

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("template image is not usable: {0}")]
    Image(String),
    #[error("cgroup setup failed: {0}")]
    Cgroup(String),
    #[error("sandbox failed to start: {0}")]
    Launch(String),
    #[error("working directory does not exist: {0}")]
    BadCwd(String),
    #[error("sandbox agent: {0}")]
    Agent(String),
    #[error("the client went away before the command ended")]
    ClientGone,
    #[error("network setup failed: {0}")]
    Network(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

impl DriverError {
    /// Whether the host's file system (the data directory's) had no room: `ENOSPC` or
    /// `EDQUOT`, from this process or in the message of a program it ran (`mkfs`, `cp`).
    pub fn is_no_space(&self) -> bool {
        match self {
            DriverError::Io(e) => matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)),
            other => says_no_space(&other.to_string()),
        }
    }
}

/// Whether an error's text (a driver error's, or the reason a boot failed, kept on the row)
/// says the host's file system had no room.
pub fn says_no_space(message: &str) -> bool {
    message.contains("No space left on device") || message.contains("Disk quota exceeded")
}

/// An isolation backend.
#[async_trait]
pub trait Driver: Send + Sync + 'static {
    fn name(&self) -> &'static str;

    /// Whether this driver can start sandboxes on `runtime`.
    fn supports(&self, runtime: Runtime) -> bool {
        runtime == Runtime::Namespace
    }

    /// Whether this driver has anything of sandbox `id` on the host (its directory): how a
    /// dispatcher finds the backend of a sandbox it has no handle for.
    fn owns(&self, _id: &str) -> bool {
        false
    }

    /// Starts a sandbox and returns once its agent answers.
    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxHandle, DriverError>;

    /// Runs one command to its end, sending output to `events` as it comes.
    async fn exec(
        &self,
        handle: &SandboxHandle,
        spec: ExecSpec,
        events: mpsc::Sender<ExecEvent>,
    ) -> Result<ExitInfo, DriverError>;

    /// Looks whether a sandbox started earlier still runs (frozen counts as running).
    async fn probe(&self, handle: &SandboxHandle) -> Probe;

    /// Readies a sandbox that will wait for its first command (a warm pool's) so that command
    /// is as fast as the ones after it; nothing by default. Best effort: a sandbox that could
    /// not be readied runs its first command as it would have.
    async fn ready_first_command(&self, _handle: &SandboxHandle) {}

    /// Pauses the sandbox: the namespace driver freezes every process (memory kept in RAM);
    /// the gVisor driver writes the whole sandbox to its directory and ends its processes
    /// (memory on disk). Idempotent; a pause that fails leaves the sandbox running.
    async fn pause(&self, handle: &SandboxHandle) -> Result<(), DriverError>;

    /// Resumes a paused sandbox (a no-op on a running one). Answers the sandbox's new handle
    /// when its processes were started again (gVisor's restore: new pids), which the caller
    /// must record; None when the handle stays.
    async fn unpause(&self, handle: &SandboxHandle) -> Result<Option<SandboxHandle>, DriverError>;

    /// Ends every process of the sandbox but keeps its writable layer, so `create` with the same
    /// id boots it again on the same files. Idempotent.
    async fn stop(&self, id: &str, handle: Option<&SandboxHandle>) -> Result<(), DriverError>;

    /// Removes every trace of a sandbox: processes, mounts, cgroups, namespaces, files.
    /// Works with or without a handle (a create that failed half way has none) and is idempotent.
    async fn destroy(&self, id: &str, handle: Option<&SandboxHandle>) -> Result<(), DriverError>;

    /// Takes a consistent copy of a sandbox's writable layer as snapshot `snapshot_id`: a running
    /// sandbox is frozen for the instant it needs (its file system synced, its layer copied);
    /// a paused one stays paused; a stopped one (no handle) is copied at rest.
    async fn snapshot(
        &self,
        id: &str,
        handle: Option<&SandboxHandle>,
        snapshot_id: &str,
    ) -> Result<SnapshotInfo, DriverError>;

    /// [`Driver::snapshot`] for sandboxes booted from it at once (a fork's children): a
    /// backend may ready the copy for that boot (the namespace backend attaches it to a loop
    /// device before writing it, so the boot need not wait for it to reach the disk).
    async fn snapshot_for_boot(
        &self,
        id: &str,
        handle: Option<&SandboxHandle>,
        snapshot_id: &str,
    ) -> Result<SnapshotInfo, DriverError> {
        self.snapshot(id, handle, snapshot_id).await
    }

    /// Moves the writable layer of a stopped sandbox (booted with `plain_layer`) to `dest`,
    /// where it serves as a read-only layer of a template (whiteouts and opaque directories
    /// included, as overlayfs wrote them).
    async fn export_layer(&self, id: &str, dest: &std::path::Path) -> Result<(), DriverError>;

    /// A snapshot of a gVisor sandbox (the only backend that has it): its files as
    /// [`Driver::snapshot`] takes them and, with `memory`, its whole running state (memory,
    /// processes, open files) as a checkpoint image beside them, from which
    /// [`Driver::create`] with [`SandboxSpec::snapshot`] restores a new sandbox. A running
    /// sandbox is checkpointed and restored: answers its new handle, which the caller must
    /// record, even when the snapshot failed (None when the handle stays: paused on disk, or
    /// stopped). With `leave_on_disk`, a running sandbox whose snapshot succeeded is not
    /// restored but left written to disk (new handle None), for the caller to restore with
    /// [`Driver::unpause`] while it does something else (a fork's children restore meanwhile);
    /// a failed snapshot restores it as without.
    async fn snapshot_with_memory(
        &self,
        _id: &str,
        _handle: Option<&SandboxHandle>,
        _snapshot_id: &str,
        _memory: bool,
        _leave_on_disk: bool,
    ) -> MemorySnapshot {
        MemorySnapshot {
            result: Err(DriverError::Unsupported(format!(
                "snapshots with memory need the gvisor runtime (this is {})",
                self.name()
            ))),
            new_handle: None,
        }
    }

    /// Saves running sandbox `handle` as a boot image at `dest` (which must not exist): its
    /// disk and its checkpoint (memory, processes), written beside `dest` and renamed into
    /// place once whole. The sandbox runs on, with the new handle answered, which the caller
    /// must record even when the image failed. gVisor only (the default refuses).
    async fn save_boot_image(
        &self,
        _handle: &SandboxHandle,
        _dest: &std::path::Path,
    ) -> MemorySnapshot {
        MemorySnapshot {
            result: Err(DriverError::Unsupported(format!(
                "boot images need the gvisor runtime (this is {})",
                self.name()
            ))),
            new_handle: None,
        }
    }

    /// Removes a snapshot's files. Idempotent.
    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<(), DriverError>;

    /// Gives a snapshot's files to sandbox `id`, which has none yet and boots from it next:
    /// moved, not copied (a fork of one child, whose snapshot is deleted after the boot).
    /// Answers whether it did; `false` (the default) leaves the boot to copy them.
    async fn give_snapshot(&self, _snapshot_id: &str, _id: &str) -> Result<bool, DriverError> {
        Ok(false)
    }

    /// Replaces a running sandbox's egress rules.
    async fn update_network(
        &self,
        handle: &SandboxHandle,
        rules: &firewall::EgressRules,
    ) -> Result<(), DriverError>;

    /// A client for the sandbox's agent (files, and the other requests the agent serves).
    fn agent(&self, handle: &SandboxHandle) -> cella_agent::client::AgentClient;

    /// Whether the sandbox's init still runs (cheap: no round trip to the agent).
    fn alive(&self, handle: &SandboxHandle) -> bool;

    /// What the sandbox's processes use now, when it has any.
    fn usage(&self, handle: &SandboxHandle) -> Option<ResourceUsage>;

    /// At a clean stop: removes what the driver keeps for itself when no sandbox of this server
    /// is left (the cgroup parent).
    fn tidy(&self) {}

    /// Ids of sandboxes that have anything left on this host (files or cgroups).
    fn leftovers(&self) -> Vec<String>;

    /// Ids of snapshots that have files on this host (whole or half-written copies).
    fn snapshot_files(&self) -> Vec<String> {
        Vec::new()
    }
}

/// The environment every command starts with, before the sandbox's and the request's own.
pub fn base_env(home: &str, user: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert(
        "PATH".into(),
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
    );
    env.insert("HOME".into(), home.into());
    env.insert("USER".into(), user.into());
    env.insert("LOGNAME".into(), user.into());
    env.insert("SHELL".into(), "/bin/bash".into());
    env.insert("LANG".into(), "C.UTF-8".into());
    env
}
