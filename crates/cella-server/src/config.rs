//! Server configuration: built-in defaults, then the TOML file (`--config`), then flags.

use cella_types::{Plan, Size};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address the API listens on.
    pub listen: SocketAddr,
    /// Where the database, templates and sandboxes live.
    pub data_dir: PathBuf,
    /// The plan of the workspace made at first start.
    pub default_plan: Plan,
    pub sizes: SizesConfig,
    pub exec: ExecConfig,
    /// Requests per workspace and endpoint group.
    pub rate_limits: crate::ratelimit::RateLimitConfig,
    pub files: FilesConfig,
    pub disk: DiskConfig,
    pub isolation: IsolationConfig,
    /// `[host]`: what the server sets on the host for speed (`favordynmods`).
    pub host: HostConfig,
    /// `[runtime]`: the isolation runtime of sandboxes that do not name one.
    pub runtime: RuntimeConfig,
    pub network: NetworkConfig,
    pub pool: PoolConfig,
    pub preview: PreviewConfig,
    pub artifacts: ArtifactsConfig,
    pub sandboxes: SandboxesConfig,
    pub images: ImagesConfig,
    pub limits: LimitsConfig,
    pub server: ServerConfig,
    /// `[store]`: the database's durability (`synchronous = "normal" | "full"`).
    pub store: StoreConfig,
    pub quotas: QuotasConfig,
    /// The model gateway (`cella_gateway::config`).
    pub gateway: cella_gateway::GatewayConfig,
    pub auth: AuthConfig,
    /// `[mcp]`: the Model Context Protocol endpoint `/mcp` (sessions per key, idle expiry).
    pub mcp: McpConfig,
    /// `[tasks]`: task runs on this server (runner slots, branch prefix, heartbeats, grace).
    pub tasks: cella_tasks::TasksConfig,
    /// `[[forges]]`: where repositories live (the first is the default; none: one `git` forge
    /// named `local` over `DATA_DIR/repos/{repository}`).
    pub forges: Vec<cella_tasks::ForgeConfig>,
    /// `[[agents]]`: what runs a task (the first is the default; none: the built-in agent).
    pub agents: Vec<cella_tasks::AgentConfig>,
}

/// `[auth]`: users, sign-up and sign-in sessions.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Anyone may make a user (`POST /api/v1/users` without a key); default false: the
    /// operator only.
    pub signup: bool,
    /// Mark session cookies `Secure` on every answer (default false: only when the request
    /// came over TLS, or through a proxy that says so with `X-Forwarded-Proto: https`).
    pub secure_cookies: bool,
    /// Hours a session lasts after its last use (default 168, a week; 1 to 8760).
    pub session_ttl_hours: u64,
    /// Failed sign-ins one email may have in a row before sign-ins for it get 429 (default 5).
    pub failures_per_email: u32,
    /// Failed sign-ins one client address may have in a row before its sign-ins get 429
    /// (default 20).
    pub failures_per_address: u32,
    /// Seconds after which one past failure is forgiven (default 60): after a lockout, one
    /// more attempt is allowed every this many seconds.
    pub failure_refill_sec: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            signup: false,
            secure_cookies: false,
            session_ttl_hours: 168,
            failures_per_email: 5,
            failures_per_address: 20,
            failure_refill_sec: 60,
        }
    }
}

/// A setting the server refuses to start with (the message is printed at start).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    #[error("auth.session_ttl_hours must be from 1 to 8760")]
    SessionTtl,
    #[error("auth.failures_per_email and failures_per_address must be at least 1")]
    Failures,
    #[error("auth.failure_refill_sec must be from 1 to 86400")]
    FailureRefill,
    #[error("preview.token_ttl_sec must be from 1 to {PREVIEW_MAX_TTL_SEC}")]
    PreviewTtl,
    #[error("preview.domain {0:?} is not a DNS name")]
    PreviewDomain(String),
    #[error("tasks.runners must be from 1 to 1024")]
    Runners,
    #[error("tasks.heartbeat_interval_sec must be from 1 to 3600")]
    HeartbeatInterval,
    #[error("tasks.grace_sec must be from 0 to 3600")]
    Grace,
    #[error("tasks.branch_prefix must be 1-100 of letters, digits and /._- (not starting with /, . or -)")]
    BranchPrefix,
    #[error("pool.boot_interval_ms and pool.refill_delay_ms must be from 0 to 3600000 (an hour)")]
    PoolDelays,
    /// `[[forges]]` or `[[agents]]` entry `index` is wrong (`what` is `forges` or `agents`).
    #[error("{what}[{index}]: {message}")]
    Entry {
        what: &'static str,
        index: usize,
        message: String,
    },
}

impl AuthConfig {
    /// How long a session lasts, in milliseconds.
    pub fn session_ttl_ms(&self) -> i64 {
        (self.session_ttl_hours as i64).saturating_mul(3_600_000)
    }

    /// What the server refuses to start with.
    pub fn check(&self) -> Result<(), SettingError> {
        if !(1..=8760).contains(&self.session_ttl_hours) {
            return Err(SettingError::SessionTtl);
        }
        if self.failures_per_email == 0 || self.failures_per_address == 0 {
            return Err(SettingError::Failures);
        }
        if !(1..=86400).contains(&self.failure_refill_sec) {
            return Err(SettingError::FailureRefill);
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ImagesConfig {
    /// Registries (`host:port`, as image references write them) that templates may pull from
    /// although they are on loopback, link-local or private addresses, or this host's own; they
    /// are spoken to over plain HTTP. Every other registry must be public and speak HTTPS.
    pub insecure_registries: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxesConfig {
    /// Hours a destroyed (or failed) sandbox stays readable before its row is removed
    /// (default 24, the contract's floor).
    pub destroyed_retention_hours: u64,
}

impl Default for SandboxesConfig {
    fn default() -> Self {
        SandboxesConfig {
            destroyed_retention_hours: 24,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QuotasConfig {
    /// Bytes a workspace may store in snapshots, artifacts and the layers its imported images
    /// and templates use (see `quotas.rs`), per plan (`developer`, `business`, `enterprise`);
    /// a plan not listed has no quota. Default: developer 20 GiB, business 100 GiB, enterprise
    /// 500 GiB.
    pub storage_bytes: std::collections::BTreeMap<String, u64>,
}

impl Default for QuotasConfig {
    fn default() -> Self {
        const GIB: u64 = 1024 * 1024 * 1024;
        QuotasConfig {
            storage_bytes: [
                ("developer".to_string(), 20 * GIB),
                ("business".to_string(), 100 * GIB),
                ("enterprise".to_string(), 500 * GIB),
            ]
            .into_iter()
            .collect(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArtifactsConfig {
    /// Hours an artifact is kept (default 24).
    pub retention_hours: u64,
    /// Bytes one run (or collect call) may keep (default 500 MiB); files past it are left out.
    pub max_bytes: u64,
    /// Files one run (or collect call) may keep (default 1000).
    pub max_files: usize,
}

impl Default for ArtifactsConfig {
    fn default() -> Self {
        ArtifactsConfig {
            retention_hours: 24,
            max_bytes: 500 * 1024 * 1024,
            max_files: 1000,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PreviewConfig {
    /// Previews answer at `<port>-<sandbox id>.<domain>` (default `localhost`, whose subdomains
    /// resolve to loopback in browsers and curl).
    pub domain: String,
    /// How users reach this server (`http://host:port`), for the URLs the API hands out;
    /// empty: the listen address (`localhost` for an unspecified one).
    pub base_url: String,
    /// Seconds a preview token is valid when no other validity is asked for (default 24 h; at
    /// most 30 days).
    pub token_ttl_sec: u64,
    /// Least seconds between two resumes of one paused `auto_resume` sandbox by preview
    /// traffic (default 10; 0: no such limit).
    pub resume_interval_sec: u64,
    /// Resumes by preview traffic per workspace and minute (default 30; 0: no such limit).
    pub resumes_per_minute: u32,
}

impl Default for PreviewConfig {
    fn default() -> Self {
        PreviewConfig {
            domain: "localhost".into(),
            base_url: String::new(),
            token_ttl_sec: 86400,
            resume_interval_sec: 10,
            resumes_per_minute: 30,
        }
    }
}

/// The longest a preview token may be valid (30 days).
pub const PREVIEW_MAX_TTL_SEC: u64 = 30 * 86400;

impl PreviewConfig {
    /// What the server refuses to start with.
    pub fn check(&self) -> Result<(), SettingError> {
        if !(1..=PREVIEW_MAX_TTL_SEC).contains(&self.token_ttl_sec) {
            return Err(SettingError::PreviewTtl);
        }
        let d = self.domain.trim_end_matches('.');
        if d.is_empty()
            || !d.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            })
        {
            return Err(SettingError::PreviewDomain(self.domain.clone()));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    /// Sandboxes kept booted ahead per template and size (0: no pool).
    pub default: u32,
    /// Per size overrides, e.g. `small = 4`.
    pub sizes: std::collections::BTreeMap<String, u32>,
    /// Least time between two pool boots, to bound the background load of refilling.
    pub boot_interval_ms: u64,
    /// Least time between a claim and the refill round it wakes, and each boot that refills
    /// the pool, so that the claimed sandbox's first commands do not share the CPU with them.
    pub refill_delay_ms: u64,
    /// `gvisor` sandboxes kept booted ahead per built-in template (that runs on gVisor), in its
    /// default size, beside the namespace ones (needs `runsc`; 0: none).
    pub gvisor: u32,
}

impl PoolConfig {
    /// What the server refuses to start with (a delay past an hour is a mistake, and one
    /// beyond the clock's range would end the refill task).
    pub fn check(&self) -> Result<(), SettingError> {
        if self.boot_interval_ms > 3_600_000 || self.refill_delay_ms > 3_600_000 {
            return Err(SettingError::PoolDelays);
        }
        Ok(())
    }
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            default: 1,
            sizes: [("small".to_string(), 2)].into_iter().collect(),
            boot_interval_ms: 0,
            refill_delay_ms: 50,
            gvisor: 0,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkConfig {
    /// Give sandboxes a network interface behind the egress firewall (needs `nft`; without
    /// it, or when off, sandboxes have loopback only).
    pub enabled: bool,
    /// The subnet sandboxes' /30 links are cut from (IPv4 CIDR, at most /30).
    pub subnet: String,
    /// IPv4 ranges no sandbox reaches whatever its policy allows (default: the RFC 1918 ranges
    /// and 100.64.0.0/10). Loopback, link-local (the metadata address), multicast, the sandbox
    /// subnet and the host's own addresses are always in this floor.
    pub deny_always: Vec<String>,
    /// Seconds between two lookups of the domains in live sandboxes' policies (and of the
    /// host's addresses for the floor); at least 10, default 60.
    pub resolve_interval_sec: u64,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            enabled: true,
            subnet: "10.200.0.0/16".into(),
            deny_always: cella_runtime::firewall::DEFAULT_DENY_ALWAYS
                .iter()
                .map(|s| s.to_string())
                .collect(),
            resolve_interval_sec: 60,
        }
    }
}

impl NetworkConfig {
    /// The least `resolve_interval_sec` honoured.
    pub const MIN_RESOLVE_INTERVAL_SEC: u64 = 10;
}

/// `[store]`: the embedded database.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `"normal"` (default): a commit is safe from a crash or `kill -9` of the server, not from
    /// a crash of the machine (the last transactions can be lost, the database stays whole).
    /// `"full"`: every commit is synced to the disk first (one `fsync` per write).
    pub synchronous: cella_store::Synchronous,
}

/// `[mcp]`: the MCP endpoint (`cella_mcp::http`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct McpConfig {
    /// MCP sessions one API key holds at once; opening one more closes its least recently
    /// used. Default 16 (at least 1).
    pub max_sessions_per_key: usize,
    /// MCP sessions the keys of one workspace hold together; opening one more closes the
    /// workspace's least recently used. Default 64 (at least 1).
    pub max_sessions_per_workspace: usize,
    /// MCP sessions on this server at once; past it a new one is refused (503). Default 1024.
    pub max_sessions: usize,
    /// Seconds an MCP session may go unused before it is closed. Default 1800.
    pub session_idle_sec: u64,
}

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            max_sessions_per_key: 16,
            max_sessions_per_workspace: 64,
            max_sessions: 1024,
            session_idle_sec: 1800,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Seconds a client has to send a request's headers (from its connection, or the end of
    /// its previous request); then the connection is closed. Default 10.
    pub header_timeout_sec: u64,
    /// Seconds a request body may send nothing before the request is answered 408 and the
    /// connection closed (a slow upload that keeps sending is fine). Default 30.
    pub body_idle_timeout_sec: u64,
    /// Seconds open connections (event streams, watches, terminals) get to end at a stop
    /// before they are cut. Default 5. A second signal stops the server at once.
    pub shutdown_grace_sec: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            header_timeout_sec: 10,
            body_idle_timeout_sec: 30,
            shutdown_grace_sec: 5,
        }
    }
}

/// Per-sandbox limits beyond a size's CPU, memory and disk.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Open files per process in a sandbox (`RLIMIT_NOFILE`, soft and hard; default 1024).
    pub open_files: u64,
    /// The share of the host's `fs.file-max`, in percent, that one sandbox's processes may hold
    /// together (default 10): a sandbox's pids limit is lowered until pids x `open_files` fits
    /// (never below 128).
    pub open_files_host_percent: u32,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            open_files: 1024,
            open_files_host_percent: 10,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IsolationConfig {
    /// Run each sandbox in a user namespace of its own, so that its root is an unprivileged uid
    /// on the host. Unset: whenever the host can (the server warns when it cannot); `true`: the
    /// server refuses to start without; `false`: off.
    pub userns: Option<bool>,
    /// The first host uid and gid of the range a sandbox's ids map to (65536 ids from here).
    pub uid_base: u32,
}

impl Default for IsolationConfig {
    fn default() -> Self {
        IsolationConfig {
            userns: None,
            uid_base: cella_runtime::userns::IdMap::DEFAULT_BASE,
        }
    }
}

/// `[host]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HostConfig {
    /// Turn on the cgroup mount option `favordynmods` at start, so that moving a process into a
    /// cgroup (each boot and each exec) does not wait for an RCU grace period; forks and exits
    /// cost a little more host-wide; this kernel keeps it until a reboot
    /// (`cella_runtime::dynmods`).
    pub cgroup_favordynmods: bool,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            cgroup_favordynmods: true,
        }
    }
}

/// `[runtime]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// The runtime of a sandbox whose create names none (after its template's default):
    /// `"namespace"` (the default) or `"gvisor"` (needs `runsc` on the host).
    pub default: String,
    /// How gVisor's kernel takes over its programs' system calls
    /// (`cella_runtime::gvisor::platform`): `"ptrace"` (the default: works on any host),
    /// `"kvm"` (probed at the start; the server refuses to start where it fails) or `"auto"`
    /// (`kvm` where it works, else `ptrace`).
    pub gvisor_platform: String,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            default: "namespace".into(),
            gvisor_platform: "ptrace".into(),
        }
    }
}

impl RuntimeConfig {
    /// The gVisor platform asked for, checked.
    pub fn gvisor_platform(&self) -> Result<cella_runtime::gvisor::platform::Choice, String> {
        cella_runtime::gvisor::platform::Choice::parse(&self.gvisor_platform).ok_or_else(|| {
            format!(
                "runtime.gvisor_platform {:?} is not a platform (ptrace, kvm or auto)",
                self.gvisor_platform
            )
        })
    }

    /// The default runtime, checked.
    pub fn default_runtime(&self) -> Result<cella_runtime::Runtime, String> {
        cella_runtime::Runtime::parse(&self.default).ok_or_else(|| {
            format!(
                "runtime.default {:?} is not a runtime (namespace or gvisor)",
                self.default
            )
        })
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiskConfig {
    /// Give each sandbox a file system of exactly its `disk_size_mb` (a sparse ext4 image;
    /// needs mkfs.ext4 and loop devices). Off: the writable layer is a plain directory.
    pub quota: bool,
    /// Formatted disk images kept ready per disk size (`cella_runtime::diskpool`), so a first
    /// boot need not format its own. 0: none.
    pub pool: u32,
}

impl Default for DiskConfig {
    fn default() -> Self {
        DiskConfig {
            quota: true,
            pool: 2,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FilesConfig {
    /// Largest upload in bytes (default 500 MiB); larger ones are refused with 413.
    pub max_upload_bytes: u64,
}

impl Default for FilesConfig {
    fn default() -> Self {
        FilesConfig {
            max_upload_bytes: 500 * 1024 * 1024,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct SizesConfig {
    /// Sizes this server does not offer; the catalog reports them `missing`.
    pub disabled: Vec<Size>,
    /// Offer sizes whose memory exceeds the host's (default false: such sizes are `missing`).
    pub allow_overcommit: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExecConfig {
    /// Bytes of stdout (and of stderr) kept per exec; the rest is cut and flagged.
    pub output_cap_bytes: u64,
    /// Bytes the server holds for the output of every buffered exec together (default
    /// 256 MiB; each kept byte counts twice, once read and once in the answer). Output past
    /// what the budget has room for is cut and flagged like output past the cap.
    pub buffer_budget_bytes: u64,
}

impl Default for ExecConfig {
    fn default() -> Self {
        ExecConfig {
            output_cap_bytes: 16 * 1024 * 1024,
            buffer_budget_bytes: 256 * 1024 * 1024,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:7070".parse().expect("valid default address"),
            data_dir: default_data_dir(),
            default_plan: Plan::Enterprise,
            sizes: SizesConfig::default(),
            exec: ExecConfig::default(),
            rate_limits: Default::default(),
            files: FilesConfig::default(),
            disk: DiskConfig::default(),
            isolation: IsolationConfig::default(),
            host: HostConfig::default(),
            runtime: RuntimeConfig::default(),
            network: NetworkConfig::default(),
            pool: PoolConfig::default(),
            preview: PreviewConfig::default(),
            artifacts: ArtifactsConfig::default(),
            sandboxes: SandboxesConfig::default(),
            images: ImagesConfig::default(),
            limits: LimitsConfig::default(),
            server: ServerConfig::default(),
            store: StoreConfig::default(),
            quotas: QuotasConfig::default(),
            gateway: Default::default(),
            auth: AuthConfig::default(),
            mcp: McpConfig::default(),
            tasks: Default::default(),
            forges: Vec::new(),
            agents: Vec::new(),
        }
    }
}

/// `$XDG_DATA_HOME/cella`, else `~/.local/share/cella`, else `./cella-data`.
pub fn default_data_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("cella");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(h).join(".local/share/cella");
    }
    PathBuf::from("cella-data")
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {source}")]
    Parse {
        path: PathBuf,
        source: toml::de::Error,
    },
}

impl Config {
    /// The forges runs may use: `[[forges]]`, or the embedded default (a `git` forge named
    /// `local` over `DATA_DIR/repos`).
    pub fn forges(&self) -> Vec<cella_tasks::ForgeConfig> {
        if self.forges.is_empty() {
            vec![cella_tasks::ForgeConfig::local_default(
                &self.data_dir.join("repos"),
            )]
        } else {
            self.forges.clone()
        }
    }

    /// The agents runs may use: `[[agents]]`, or the built-in agent.
    pub fn agents(&self) -> Vec<cella_tasks::AgentConfig> {
        if self.agents.is_empty() {
            vec![cella_tasks::AgentConfig::builtin_default()]
        } else {
            self.agents.clone()
        }
    }

    /// What the server refuses to start with in `[tasks]`, `[[forges]]` and `[[agents]]`.
    pub fn check_tasks(&self) -> Result<(), SettingError> {
        let t = &self.tasks;
        if !(1..=1024).contains(&t.runners) {
            return Err(SettingError::Runners);
        }
        if !(1..=3600).contains(&t.heartbeat_interval_sec) {
            return Err(SettingError::HeartbeatInterval);
        }
        if t.grace_sec > 3600 {
            return Err(SettingError::Grace);
        }
        let prefix_ok = !t.branch_prefix.is_empty()
            && t.branch_prefix.len() <= 100
            && t.branch_prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "/._-".contains(c))
            && !t.branch_prefix.starts_with(['/', '.', '-'])
            && !t.branch_prefix.contains("..")
            && !t.branch_prefix.contains("//");
        if !prefix_ok {
            return Err(SettingError::BranchPrefix);
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, f) in self.forges.iter().enumerate() {
            f.validate().map_err(|message| SettingError::Entry {
                what: "forges",
                index: i,
                message,
            })?;
            if !names.insert(f.name.clone()) {
                return Err(SettingError::Entry {
                    what: "forges",
                    index: i,
                    message: format!("the name {:?} is used twice", f.name),
                });
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, a) in self.agents.iter().enumerate() {
            a.validate().map_err(|message| SettingError::Entry {
                what: "agents",
                index: i,
                message,
            })?;
            if !names.insert(a.name.clone()) {
                return Err(SettingError::Entry {
                    what: "agents",
                    index: i,
                    message: format!("the name {:?} is used twice", a.name),
                });
            }
        }
        Ok(())
    }

    /// Which registries an image pull may reach: those listed in `[images]
    /// insecure_registries` on any address, never the server's own listen address.
    pub fn registries(&self) -> cella_image::oci::Registries {
        cella_image::oci::Registries {
            insecure: self.images.insecure_registries.clone(),
            listen: Some(self.listen),
        }
    }

    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let Some(path) = path else {
            return Ok(Config::default());
        };
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_overrides_defaults_and_rejects_unknown_keys() {
        let c: Config =
            toml::from_str("listen = \"127.0.0.1:9\"\n[sizes]\ndisabled = [\"xl\"]\n").unwrap();
        assert_eq!(c.listen.port(), 9);
        assert_eq!(c.sizes.disabled, vec![Size::Xl]);
        assert_eq!(c.exec.output_cap_bytes, 16 * 1024 * 1024);
        assert!(toml::from_str::<Config>("lisen = \"x\"").is_err());
    }

    #[test]
    fn pool_delays_are_at_most_an_hour() {
        let c: Config = toml::from_str("").unwrap();
        assert!(c.pool.check().is_ok());
        let c: Config = toml::from_str("[pool]\nrefill_delay_ms = 3600000\n").unwrap();
        assert!(c.pool.check().is_ok());
        for bad in [
            "[pool]\nrefill_delay_ms = 3600001\n",
            "[pool]\nboot_interval_ms = 9223372036854775807\n",
        ] {
            let c: Config = toml::from_str(bad).unwrap();
            assert_eq!(
                c.pool.check().expect_err(bad).to_string(),
                "pool.boot_interval_ms and pool.refill_delay_ms must be from 0 to 3600000 (an hour)"
            );
        }
    }

    #[test]
    fn auth_settings_have_defaults_and_ranges() {
        let c: Config = toml::from_str("[auth]\nsignup = true\n").unwrap();
        assert!(c.auth.signup && !c.auth.secure_cookies);
        assert_eq!(c.auth.session_ttl_hours, 168);
        assert!(c.auth.check().is_ok());
        assert!(toml::from_str::<Config>("[auth]\nsign_up = true\n").is_err());
        for (bad, said) in [
            (
                "[auth]\nsession_ttl_hours = 0\n",
                "auth.session_ttl_hours must be from 1 to 8760",
            ),
            (
                "[auth]\nfailures_per_email = 0\n",
                "auth.failures_per_email and failures_per_address must be at least 1",
            ),
            (
                "[auth]\nfailure_refill_sec = 0\n",
                "auth.failure_refill_sec must be from 1 to 86400",
            ),
        ] {
            let c: Config = toml::from_str(bad).unwrap();
            let e = c.auth.check().expect_err(bad);
            assert_eq!(e.to_string(), said);
        }
    }

    #[test]
    fn preview_settings_out_of_range_are_refused() {
        let c: Config =
            toml::from_str("[preview]\ntoken_ttl_sec = 60\nresume_interval_sec = 0\n").unwrap();
        assert!(c.preview.check().is_ok());
        assert_eq!(c.preview.resumes_per_minute, 30);
        for bad in [
            PreviewConfig {
                token_ttl_sec: 0,
                ..Default::default()
            },
            PreviewConfig {
                token_ttl_sec: PREVIEW_MAX_TTL_SEC + 1,
                ..Default::default()
            },
            PreviewConfig {
                domain: "a..b".into(),
                ..Default::default()
            },
            PreviewConfig {
                domain: "x/y".into(),
                ..Default::default()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
        let long = PreviewConfig {
            token_ttl_sec: PREVIEW_MAX_TTL_SEC + 1,
            ..Default::default()
        };
        assert_eq!(
            long.check().unwrap_err().to_string(),
            "preview.token_ttl_sec must be from 1 to 2592000"
        );
        let odd = PreviewConfig {
            domain: "x/y".into(),
            ..Default::default()
        };
        assert_eq!(
            odd.check().unwrap_err().to_string(),
            "preview.domain \"x/y\" is not a DNS name"
        );
    }
}
