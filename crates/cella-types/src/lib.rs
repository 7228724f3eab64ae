//! Wire types of the Cella HTTP API (`/api/v1`).
//!
//! Everything that crosses the wire between the server, the CLI and the SDKs lives here, so the
//! three cannot drift apart. The contract these types follow is `shared/api-v1.md`; the project's
//! own reference is `docs/api.md`.

pub mod money;
pub mod sizes;
pub mod tasks;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

pub use money::{
    CreditRequest, LedgerEntry, LedgerKind, Money, MoneyError, UsageDay, UsageFigures, UsageReport,
    Wallet,
};
pub use sizes::{ResourceContract, Size, ALL_SIZES};
pub use tasks::{
    CreateTask, PullRequest, StopReason, Task, TaskEvent, TaskProgress, TaskState, MAX_TASK_BYTES,
};

/// `{"data": ...}`: the body of every successful single-object response.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Data<T> {
    pub data: T,
}

/// `{"data": [...], "next_cursor": ...}`: the body of every list response.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct List<T> {
    pub data: Vec<T>,
    pub next_cursor: Option<String>,
}

/// The one error body: `{"error": {"code", "message", "details"}}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorInfo,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorInfo {
    /// Stable, machine-readable code in UPPER_SNAKE case, e.g. `NOT_FOUND`.
    pub code: String,
    pub message: String,
    #[schema(value_type = Option<Object>)]
    pub details: Option<serde_json::Value>,
}

/// Every error code of the API with its HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    Unauthorized,
    Forbidden,
    NotFound,
    MethodNotAllowed,
    InvalidRequest,
    UnknownLanguage,
    SizeUnavailable,
    Conflict,
    SandboxNotRunning,
    PayloadTooLarge,
    RateLimited,
    ConcurrencyLimit,
    InsufficientFunds,
    RangeNotSatisfiable,
    /// 507: a workspace's storage quota (or a sandbox's disk) has no room for this.
    InsufficientStorage,
    /// 408: the request's body stopped arriving.
    RequestTimeout,
    /// 410: the thing existed but is gone for good (a finished run's live log).
    Gone,
    Internal,
    Unavailable,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Unauthorized => "UNAUTHORIZED",
            ErrorCode::Forbidden => "FORBIDDEN",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::MethodNotAllowed => "METHOD_NOT_ALLOWED",
            ErrorCode::InvalidRequest => "INVALID_REQUEST",
            ErrorCode::UnknownLanguage => "UNKNOWN_LANGUAGE",
            ErrorCode::SizeUnavailable => "SIZE_UNAVAILABLE",
            ErrorCode::Conflict => "CONFLICT",
            ErrorCode::SandboxNotRunning => "SANDBOX_NOT_RUNNING",
            ErrorCode::PayloadTooLarge => "PAYLOAD_TOO_LARGE",
            ErrorCode::RateLimited => "RATE_LIMITED",
            ErrorCode::ConcurrencyLimit => "CONCURRENCY_LIMIT",
            ErrorCode::InsufficientFunds => "INSUFFICIENT_FUNDS",
            ErrorCode::RangeNotSatisfiable => "RANGE_NOT_SATISFIABLE",
            ErrorCode::InsufficientStorage => "INSUFFICIENT_STORAGE",
            ErrorCode::RequestTimeout => "REQUEST_TIMEOUT",
            ErrorCode::Gone => "GONE",
            ErrorCode::Internal => "INTERNAL",
            ErrorCode::Unavailable => "UNAVAILABLE",
        }
    }

    pub fn status(self) -> u16 {
        match self {
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::InvalidRequest | ErrorCode::UnknownLanguage | ErrorCode::SizeUnavailable => {
                400
            }
            ErrorCode::Conflict | ErrorCode::SandboxNotRunning => 409,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::RateLimited | ErrorCode::ConcurrencyLimit => 429,
            ErrorCode::InsufficientFunds => 402,
            ErrorCode::RangeNotSatisfiable => 416,
            ErrorCode::InsufficientStorage => 507,
            ErrorCode::RequestTimeout => 408,
            ErrorCode::Gone => 410,
            ErrorCode::Internal => 500,
            ErrorCode::Unavailable => 503,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Scopes, workspaces, API keys
// ---------------------------------------------------------------------------------------------

/// A permission carried by an API key. `admin` implies every other scope.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema,
)]
pub enum Scope {
    #[serde(rename = "sandboxes:read")]
    SandboxesRead,
    #[serde(rename = "sandboxes:write")]
    SandboxesWrite,
    #[serde(rename = "sandboxes:exec")]
    SandboxesExec,
    #[serde(rename = "templates:write")]
    TemplatesWrite,
    #[serde(rename = "tasks:read")]
    TasksRead,
    #[serde(rename = "tasks:write")]
    TasksWrite,
    /// Calls to the model gateway (`/gateway/...`) with this API key.
    #[serde(rename = "models:use")]
    ModelsUse,
    #[serde(rename = "admin")]
    Admin,
}

impl Scope {
    pub const ALL: [Scope; 8] = [
        Scope::SandboxesRead,
        Scope::SandboxesWrite,
        Scope::SandboxesExec,
        Scope::TemplatesWrite,
        Scope::TasksRead,
        Scope::TasksWrite,
        Scope::ModelsUse,
        Scope::Admin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::SandboxesRead => "sandboxes:read",
            Scope::SandboxesWrite => "sandboxes:write",
            Scope::SandboxesExec => "sandboxes:exec",
            Scope::TemplatesWrite => "templates:write",
            Scope::TasksRead => "tasks:read",
            Scope::TasksWrite => "tasks:write",
            Scope::ModelsUse => "models:use",
            Scope::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|x| x.as_str() == s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Plan {
    Developer,
    Business,
    Enterprise,
}

impl Plan {
    /// Concurrent sandboxes (provisioning, running or paused) a workspace on this plan may hold.
    pub fn concurrency_cap(self) -> u32 {
        match self {
            Plan::Developer => 10,
            Plan::Business => 250,
            Plan::Enterprise => 500,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Plan::Developer => "developer",
            Plan::Business => "business",
            Plan::Enterprise => "enterprise",
        }
    }
    pub fn parse(s: &str) -> Option<Plan> {
        [Plan::Developer, Plan::Business, Plan::Enterprise]
            .into_iter()
            .find(|p| p.as_str() == s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WorkspaceKind {
    Personal,
    Organization,
}

impl WorkspaceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkspaceKind::Personal => "personal",
            WorkspaceKind::Organization => "organization",
        }
    }
    pub fn parse(s: &str) -> Option<WorkspaceKind> {
        [WorkspaceKind::Personal, WorkspaceKind::Organization]
            .into_iter()
            .find(|p| p.as_str() == s)
    }
}

/// Settings a workspace owner changes. Fields the server does not use yet are kept as given.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceSettings {
    #[serde(default)]
    pub tasks_enabled: bool,
    /// Compute price per running second, in the workspace's currency (a decimal string with at
    /// most 6 decimals, at least 0). Each sandbox keeps the rate of when it was created.
    #[serde(default)]
    pub compute_rate: Money,
    /// Ceiling of one task run, in minutes.
    #[serde(default = "default_session_limit")]
    pub session_limit_min: u32,
    /// Models the workspace may use through the model gateway (empty: every model the
    /// gateway serves). At most 256 names, each 1-200 printable characters, no repeats.
    #[serde(default, deserialize_with = "model_allowlist")]
    pub model_allowlist: Vec<String>,
    /// Seconds a task run's agent may go without a heartbeat before the run is failed.
    #[serde(default = "default_heartbeat_timeout")]
    pub heartbeat_timeout_sec: u32,
    /// The isolation runtime of the workspace's task runs' sandboxes, `namespace` or `gvisor`
    /// (absent: `namespace`), as the setting is when a run's sandbox starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_runtime: Option<String>,
}

/// The most names `model_allowlist` takes.
pub const MAX_MODEL_ALLOWLIST: usize = 256;

fn model_allowlist<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    use serde::de::Error;
    let v = Vec::<String>::deserialize(d)?;
    if v.len() > MAX_MODEL_ALLOWLIST {
        return Err(D::Error::custom(format!(
            "model_allowlist takes at most {MAX_MODEL_ALLOWLIST} models"
        )));
    }
    for (i, m) in v.iter().enumerate() {
        if m.is_empty() || m.len() > 200 || m.chars().any(|c| c.is_control()) {
            return Err(D::Error::custom(format!(
                "model_allowlist[{i}] must be 1-200 printable characters"
            )));
        }
        if v[..i].contains(m) {
            return Err(D::Error::custom(format!(
                "model_allowlist names {m:?} twice"
            )));
        }
    }
    Ok(v)
}

impl WorkspaceSettings {
    /// Whether the allow-list lets `model` through (an empty list lets every model through).
    pub fn allows_model(&self, model: &str) -> bool {
        self.model_allowlist.is_empty() || self.model_allowlist.iter().any(|m| m == model)
    }
}

fn default_heartbeat_timeout() -> u32 {
    120
}

fn default_session_limit() -> u32 {
    60
}

/// What a workspace stores against its storage quota, in bytes.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct WorkspaceStorage {
    /// Everything below together: what the quota is checked against.
    pub used_bytes: u64,
    /// The quota of the workspace's plan; `null`: none.
    pub quota_bytes: Option<u64>,
    pub snapshots_bytes: u64,
    pub artifacts_bytes: u64,
    /// Layers of the layer store its imported images list.
    pub images_bytes: u64,
    /// Layers its templates' builds pulled, made or used, that no imported image of it lists.
    pub templates_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Workspace {
    pub id: String,
    pub name: String,
    pub plan: Plan,
    pub kind: WorkspaceKind,
    pub created_at: String,
    pub settings: WorkspaceSettings,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWorkspace {
    pub name: String,
    #[serde(default = "default_plan")]
    pub plan: Plan,
    #[serde(default = "default_kind")]
    pub kind: WorkspaceKind,
}

fn default_plan() -> Plan {
    Plan::Developer
}
fn default_kind() -> WorkspaceKind {
    WorkspaceKind::Organization
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateWorkspace {
    pub name: Option<String>,
    pub plan: Option<Plan>,
    /// Settings to change; the ones not named keep their values.
    #[schema(value_type = Option<Object>)]
    pub settings: Option<serde_json::Map<String, serde_json::Value>>,
}

/// `GET /api/v1/api-keys/current`: who the caller is and what it may do.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CurrentCaller {
    /// The API key's id (a signed-in user's id for a session).
    pub id: String,
    /// `key` or `user`.
    pub kind: String,
    /// The workspace the caller acts in.
    pub workspace_id: String,
    /// Its scopes (`admin` holds every scope).
    pub scopes: Vec<Scope>,
    /// The server's operator (the bootstrap key).
    pub operator: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApiKey {
    pub id: String,
    pub workspace_id: String,
    pub name: String,
    pub scopes: Vec<Scope>,
    /// The first characters of the key, to recognise it in a list.
    pub prefix: String,
    pub created_at: String,
    pub expires_at: Option<String>,
    pub last_used_at: Option<String>,
    /// The secret itself: present only in the answer to the create call.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub key: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateApiKey {
    pub workspace_id: String,
    pub name: String,
    pub scopes: Vec<Scope>,
    /// RFC 3339 time after which the key stops working.
    pub expires_at: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// People: users, sessions, members
// ---------------------------------------------------------------------------------------------

/// A user's role in a workspace. Owners and admins manage the workspace (settings, members,
/// keys: the `admin` scope of that workspace); members use it (sandboxes, templates, tasks).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Owner,
    Admin,
    Member,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Owner => "owner",
            Role::Admin => "admin",
            Role::Member => "member",
        }
    }
    pub fn parse(s: &str) -> Option<Role> {
        [Role::Owner, Role::Admin, Role::Member]
            .into_iter()
            .find(|r| r.as_str() == s)
    }
    /// The scopes the role gives in its workspace.
    pub fn scopes(self) -> Vec<Scope> {
        match self {
            Role::Owner | Role::Admin => vec![Scope::Admin],
            Role::Member => vec![
                Scope::SandboxesRead,
                Scope::SandboxesWrite,
                Scope::SandboxesExec,
                Scope::TemplatesWrite,
                Scope::TasksRead,
                Scope::TasksWrite,
            ],
        }
    }
}

/// A person who signs in (never their password or its hash).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct User {
    pub id: String,
    pub email: String,
    pub name: String,
    pub created_at: String,
}

/// `POST /api/v1/users`.
#[derive(Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateUser {
    pub email: String,
    pub name: String,
    /// 8 to 1024 bytes.
    pub password: String,
}

/// `POST /api/v1/sessions`.
#[derive(Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    pub email: String,
    pub password: String,
}

/// The answer to a sign-in (the token itself is in the `Set-Cookie` only).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Session {
    pub user: User,
    /// Send it back in `x-csrf-token` with every cookie-authenticated write.
    pub csrf_token: String,
    pub expires_at: String,
}

/// One workspace of the signed-in user, with their role in it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MeWorkspace {
    pub workspace: Workspace,
    pub role: Role,
}

/// `GET /api/v1/me`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Me {
    pub user: User,
    pub workspaces: Vec<MeWorkspace>,
    pub csrf_token: String,
}

/// A member of a workspace.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct Member {
    pub user_id: String,
    pub email: String,
    pub name: String,
    pub role: Role,
}

/// `POST /api/v1/workspaces/{id}/members`: adds an existing user.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddMember {
    pub email: String,
    pub role: Role,
}

/// `PATCH /api/v1/workspaces/{id}/members/{user_id}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateMember {
    pub role: Role,
}

// ---------------------------------------------------------------------------------------------
// Templates
// ---------------------------------------------------------------------------------------------

/// Readiness of a template, or of one size of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Readiness {
    FastReady,
    ColdBootOnly,
    Missing,
}

impl Readiness {
    pub const ALL: [Readiness; 3] = [
        Readiness::FastReady,
        Readiness::ColdBootOnly,
        Readiness::Missing,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            Readiness::FastReady => "fast_ready",
            Readiness::ColdBootOnly => "cold_boot_only",
            Readiness::Missing => "missing",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TemplateSize {
    pub size: Size,
    pub state: Readiness,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub resource_contract: Option<ResourceContract>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Template {
    pub id: String,
    pub name: String,
    pub product: String,
    pub default_size: Size,
    pub primitive: String,
    pub sdk_name: String,
    pub cli_name: String,
    pub readiness: Readiness,
    pub sizes: Vec<TemplateSize>,
    /// The isolation runtimes it can run on here (`namespace`, `gvisor`); the first is its
    /// default.
    #[serde(default)]
    pub runtimes: Vec<String>,
}

impl Template {
    /// The entry as it stands in `templates`: the same, without resource contracts.
    pub fn without_contracts(&self) -> Template {
        let mut t = self.clone();
        for s in &mut t.sizes {
            s.resource_contract = None;
        }
        t
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct ShapeContracts {
    pub sandbox: Vec<ResourceContract>,
    pub computer: Vec<ResourceContract>,
}

/// The body of `GET /api/v1/templates`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TemplateCatalog {
    pub data: Vec<Template>,
    pub templates: Vec<Template>,
    pub shape_contracts: ShapeContracts,
    pub readiness_states: Vec<Readiness>,
}

// ---------------------------------------------------------------------------------------------
// Sandboxes
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    Provisioning,
    Running,
    Paused,
    Stopped,
    Destroyed,
    Error,
}

impl SandboxState {
    pub const ALL: [SandboxState; 6] = [
        SandboxState::Provisioning,
        SandboxState::Running,
        SandboxState::Paused,
        SandboxState::Stopped,
        SandboxState::Destroyed,
        SandboxState::Error,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Provisioning => "provisioning",
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
            SandboxState::Stopped => "stopped",
            SandboxState::Destroyed => "destroyed",
            SandboxState::Error => "error",
        }
    }
    pub fn parse(s: &str) -> Option<SandboxState> {
        SandboxState::ALL.into_iter().find(|x| x.as_str() == s)
    }
    /// States that hold a slot of the workspace's plan cap.
    pub fn counts_against_cap(self) -> bool {
        matches!(
            self,
            SandboxState::Provisioning | SandboxState::Running | SandboxState::Paused
        )
    }
    pub fn is_terminal(self) -> bool {
        matches!(self, SandboxState::Destroyed | SandboxState::Error)
    }
}

impl std::fmt::Display for SandboxState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// The sandbox object: every field of the seed's table, plus `state_reason`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Sandbox {
    pub id: String,
    pub tenant_id: String,
    pub owner_id: String,
    pub template_id: String,
    pub state: SandboxState,
    pub size: Size,
    pub resource_contract: ResourceContract,
    pub cpu_count: u32,
    pub memory_mb: u32,
    pub disk_size_mb: u32,
    pub ready: bool,
    pub ready_at: Option<String>,
    pub preview_url: Option<String>,
    pub timeout_sec: u32,
    pub timeout_remaining_ms: Option<i64>,
    pub always_on: bool,
    pub persistent: bool,
    pub idle_timeout_sec: u32,
    pub total_runtime_sec: Option<i64>,
    pub metadata: BTreeMap<String, String>,
    pub created_at: String,
    pub started_at: Option<String>,
    pub destroyed_at: Option<String>,
    /// Why the sandbox is in its state when the server put it there (a failure, a timer, or
    /// processes that died), else null.
    pub state_reason: Option<String>,
    /// The sandbox's egress policy, as given at create (defaults filled in).
    pub network: NetworkPolicy,
    /// Who may open its preview URLs.
    pub preview: PreviewSettings,
    /// Preview traffic resumes it when it is paused.
    pub auto_resume: bool,
    /// Compute price per running second, the workspace's `compute_rate` when it was created.
    #[serde(default)]
    pub compute_rate: Money,
    /// Compute charged for it: while it lives, what it has cost so far (its running seconds,
    /// at least 60, times `compute_rate`; 0 at a rate of 0); once destroyed, its one `compute`
    /// ledger entry.
    #[serde(default)]
    pub compute_cost: Money,
    /// The sum of its `model` ledger entries (model gateway requests).
    #[serde(default)]
    pub model_cost: Money,
    /// The isolation runtime it runs on: `namespace` (Linux namespaces on the host's kernel)
    /// or `gvisor` (gVisor's user-space kernel).
    #[serde(default = "default_runtime")]
    pub runtime: String,
    /// Where a paused sandbox's memory is: `in_ram` (namespace: its processes frozen) or
    /// `on_disk` (gVisor: the whole sandbox written to its directory, its RAM freed). Absent
    /// unless paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<PausedMemory>,
}

/// Where a paused sandbox's memory is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PausedMemory {
    InRam,
    OnDisk,
}

fn default_runtime() -> String {
    "namespace".into()
}

/// Preview access of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PreviewSettings {
    /// true (default): anyone with the URL. false: a preview token is needed (header
    /// `x-cella-preview-token`, or the signed URL that `expose` answers).
    pub public: bool,
}

impl Default for PreviewSettings {
    fn default() -> Self {
        PreviewSettings { public: true }
    }
}

/// `POST /api/v1/sandboxes/{id}/expose`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExposeRequest {
    pub port: u32,
}

/// Where a sandbox's port is reachable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Exposed {
    pub port: u16,
    /// The address to hand out: `path_url` while the preview domain is `localhost` (every HTTP
    /// client opens it; browsers are sent on to `host_url`), else `host_url`.
    pub url: String,
    /// The host-name form (`<port>-<id>.<preview domain>`), the sandbox's own origin: the only
    /// form a browser is served. Signed when the preview is private.
    pub host_url: String,
    /// The path form (`/preview/<id>/<port>/`) on the server's address, for programs (never
    /// served into a browser). Signed when the preview is private.
    pub path_url: String,
    /// The preview token, when the preview is private.
    pub token: Option<String>,
    /// When `token` stops working (RFC 3339), when there is one.
    pub token_expires_at: Option<String>,
}

/// `POST /api/v1/sandboxes/{id}/preview-token` (every field optional; no body at all is fine).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PreviewTokenRequest {
    /// Seconds the token is valid (default: the server's `[preview] token_ttl_sec`).
    pub ttl_sec: Option<u64>,
    /// true: every token of the sandbox handed out before stops working at once.
    pub rotate: Option<bool>,
}

/// A preview token of a sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PreviewToken {
    pub token: String,
    /// When it stops working (RFC 3339).
    pub expires_at: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    pub template_id: Option<String>,
    pub size: Option<Size>,
    pub cpu_count: Option<u32>,
    pub memory_mb: Option<u32>,
    pub disk_size_mb: Option<u32>,
    /// 1-86400, default 3600.
    pub timeout_sec: Option<u32>,
    pub idle_timeout_sec: Option<u32>,
    pub persistent: Option<bool>,
    pub always_on: Option<bool>,
    pub metadata: Option<BTreeMap<String, String>>,
    pub env: Option<BTreeMap<String, String>>,
    /// Answer once the sandbox is running and ready (default true).
    pub wait: Option<bool>,
    /// Where the sandbox may connect to (default: the internet, but no private ranges).
    pub network: Option<NetworkPolicy>,
    /// Start from this snapshot's files (instead of `template_id`, whose template it implies).
    pub snapshot_id: Option<String>,
    /// Preview access (default public).
    pub preview: Option<PreviewSettings>,
    /// Preview traffic resumes the sandbox when it is paused (default false: 409).
    pub auto_resume: Option<bool>,
    /// Give the sandbox access to the model gateway (default false): it gets a sandbox token
    /// and `OPENAI_BASE_URL`, `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY` in its
    /// environment. Needs a server whose sandboxes have a network.
    pub model_access: Option<bool>,
    /// The isolation runtime: `namespace` or `gvisor` (default: the template's, then the
    /// server's `[runtime] default`). `gvisor` needs `runsc` on the server; such a sandbox has
    /// loopback only (`network` must deny egress and allow nothing) and no snapshots, forks,
    /// previews or model access yet.
    pub runtime: Option<String>,
}

/// Whether a sandbox may open connections to destinations its lists do not name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Egress {
    /// The internet (public addresses); private, link-local and host addresses stay closed.
    #[default]
    Allow,
    /// Nothing but what `allow` names.
    Deny,
}

/// A sandbox's egress policy. `deny` wins over `allow`; `allow` may open private ranges.
/// Entries are IPv4 addresses, IPv4 CIDRs or domain names (resolved when the sandbox boots).
/// Other sandboxes, the host itself and inbound connections are never reachable, whatever
/// the lists say.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    #[serde(default)]
    pub egress: Egress,
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
}

/// One entry of an allow or deny list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// An IPv4 network (a plain address is a /32).
    Net(std::net::Ipv4Addr, u8),
    /// A domain name, looked up when the sandbox boots.
    Domain(String),
}

impl Destination {
    /// Parses an entry; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Destination, String> {
        let t = text.trim();
        if t.contains(':') {
            return Err(format!(
                "{text:?}: IPv6 is not supported (sandboxes have IPv4 only)"
            ));
        }
        let (addr, prefix) = match t.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (t, None),
        };
        if let Ok(ip) = addr.parse::<std::net::Ipv4Addr>() {
            let prefix = match prefix {
                None => 32,
                Some(p) => match p.parse::<u8>() {
                    Ok(n) if n <= 32 => n,
                    _ => return Err(format!("{text:?}: the prefix length must be 0-32")),
                },
            };
            // Normalise to the network address, as a firewall would read it.
            let mask = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - prefix)
            };
            return Ok(Destination::Net((u32::from(ip) & mask).into(), prefix));
        }
        if prefix.is_some() || !is_domain(t) {
            return Err(format!(
                "{text:?} is neither an IPv4 address, a CIDR nor a domain name"
            ));
        }
        Ok(Destination::Domain(
            t.trim_end_matches('.').to_ascii_lowercase(),
        ))
    }
}

fn is_domain(t: &str) -> bool {
    let t = t.trim_end_matches('.');
    !t.is_empty()
        && t.len() <= 253
        && t.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
        && !t
            .split('.')
            .next_back()
            .unwrap_or("")
            .chars()
            .all(|c| c.is_ascii_digit())
}

impl NetworkPolicy {
    /// At most this many entries per list.
    pub const MAX_ENTRIES: usize = 64;

    /// Checks every entry; the error names the field (`network.allow`) and the problem.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        for (field, list) in [("network.allow", &self.allow), ("network.deny", &self.deny)] {
            if list.len() > Self::MAX_ENTRIES {
                return Err((field, format!("at most {} entries", Self::MAX_ENTRIES)));
            }
            for e in list {
                Destination::parse(e).map_err(|m| (field, m))?;
            }
        }
        Ok(())
    }
}

/// Who a command runs as inside the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExecUser {
    /// uid 1000, home `/home/user` (the default).
    #[default]
    User,
    Root,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// A shell command line, run by `/bin/bash -c`.
    pub command: Option<String>,
    /// A program and its arguments, run without a shell.
    pub argv: Option<Vec<String>>,
    pub env: Option<BTreeMap<String, String>>,
    pub cwd: Option<String>,
    pub user: Option<ExecUser>,
    /// Text written to the command's standard input, which is then closed.
    pub stdin: Option<String>,
    /// 1-86400, default 3600. The command and its children are killed when it runs out.
    pub timeout_sec: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ExecResult {
    /// The exit code; 128 + N for a command killed by signal N.
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
    pub duration_ms: u64,
    pub timed_out: bool,
    /// True when stdout went past the server's cap and was cut.
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

/// `GET /healthz`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub status: String,
    pub version: String,
}

/// `POST /api/v1/sandboxes/{id}/timeout`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetTimeout {
    /// New active-session timeout, 1-86400; the timer restarts from now.
    pub timeout_sec: u32,
}

/// `GET /api/v1/sandboxes/{id}/usage`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Usage {
    pub sandbox_id: String,
    pub state: SandboxState,
    /// Seconds spent running (provisioning, paused and stopped time excluded).
    pub running_sec: f64,
    /// Seconds spent paused.
    pub paused_sec: f64,
    /// Billed seconds: running time, rounded up to whole seconds.
    pub billed_sec: i64,
    /// CPU time used by the sandbox's processes, across all its boots.
    pub cpu_sec: f64,
    /// Memory in use integrated over running time (MiB x seconds), sampled about every second.
    pub memory_mib_sec: f64,
    /// Memory in use now, when the sandbox has processes.
    pub memory_mib_now: Option<f64>,
    pub measured_at: String,
}

/// One file or directory inside a sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FileEntry {
    pub name: String,
    /// Absolute path inside the sandbox.
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    #[serde(rename = "type")]
    pub kind: String,
    pub size: u64,
    /// Permission bits in octal, e.g. `"0644"`.
    pub mode: String,
    pub modified_at: String,
    pub uid: u32,
    pub gid: u32,
    /// Where a symlink points (as written in the link).
    pub symlink_target: Option<String>,
}

/// `GET /api/v1/sandboxes/{id}/files/list`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FileList {
    pub data: Vec<FileEntry>,
    pub next_cursor: Option<String>,
    /// True when the listing stopped at `limit` entries.
    pub truncated: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MkdirRequest {
    pub path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveRequest {
    pub from: String,
    pub to: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Deleted {
    pub path: String,
    pub deleted: bool,
}

/// The `exit` event of a streamed exec.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ExecExit {
    pub exit_code: i32,
    pub duration_ms: u64,
    pub timed_out: bool,
}

/// `POST /api/v1/sandboxes/{id}/processes`: a command that runs in the background.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartProcess {
    /// A shell command line, run by `/bin/bash -c`.
    pub command: Option<String>,
    /// A program and its arguments, run without a shell.
    pub argv: Option<Vec<String>>,
    pub env: Option<BTreeMap<String, String>>,
    pub cwd: Option<String>,
    pub user: Option<ExecUser>,
    /// A label of the caller's, shown in listings.
    pub tag: Option<String>,
}

/// A process started through the API.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Process {
    /// Its pid inside the sandbox.
    pub pid: i32,
    pub argv: Vec<String>,
    pub tag: Option<String>,
    pub user: ExecUser,
    pub cwd: String,
    /// `running` or `exited`.
    pub state: String,
    pub exit_code: Option<i32>,
    pub started_at: String,
    pub ended_at: Option<String>,
    /// Output bytes older than the ring buffer (1 MiB per process) holds.
    pub output_dropped_bytes: u64,
}

/// `POST .../processes/{pid}/signal`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// A name (`SIGTERM`, `TERM`) or a number (15).
    #[schema(value_type = Object)]
    pub signal: serde_json::Value,
}

/// `POST /api/v1/sandboxes/{id}/code/run` (and its alias `POST .../code`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CodeRunRequest {
    pub code: String,
    /// `python` (default) or `javascript` (`js`, `node` are accepted too).
    pub language: Option<String>,
    /// The namespace the cell runs in (default `default`); made on first use.
    pub context: Option<String>,
    /// Seconds (default and cap 300). A cell past it is interrupted; the context survives.
    /// `timeout_sec`, as exec spells it, is taken too.
    #[serde(alias = "timeout_sec")]
    pub timeout: Option<f64>,
}

/// One rich output of a cell (an image, HTML, JSON, ...). Binary data is base64.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CodeOutput {
    pub mime: String,
    pub data: String,
}

/// What a cell raised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CodeError {
    pub name: String,
    pub value: String,
    pub traceback: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CodeResult {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
    /// The value of the cell's last expression as the language's REPL shows it, else null.
    pub result: Option<String>,
    pub language: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<CodeError>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<CodeOutput>,
    /// The interpreter had to be restarted (every context of the language was lost).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restarted: bool,
}

/// One language's interpreter, as `GET .../code` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct KernelInfo {
    pub language: String,
    pub running: bool,
    pub busy: bool,
    pub contexts: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CodeState {
    pub kernels: Vec<KernelInfo>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CodeContext {
    pub name: String,
    pub language: String,
}

/// `POST .../code/contexts`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateCodeContext {
    pub language: Option<String>,
    /// Its name (default `default`).
    pub context: Option<String>,
}

/// The answer to a context create or reset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CodeContextChange {
    pub name: String,
    pub language: String,
    /// Create: it was made now (false: it existed). Reset: it existed.
    pub changed: bool,
}

/// The language a request names, in its canonical spelling, or None when unknown.
pub fn code_language(given: Option<&str>) -> Option<&'static str> {
    match given.unwrap_or("python").to_ascii_lowercase().as_str() {
        "python" | "python3" | "py" => Some("python"),
        "javascript" | "js" | "node" | "nodejs" => Some("javascript"),
        _ => None,
    }
}

/// A snapshot of a sandbox's files (`POST .../snapshots`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Snapshot {
    pub id: String,
    pub sandbox_id: String,
    pub template_id: String,
    /// The size of the sandbox it was taken of; sandboxes made from it have that size.
    pub size: Size,
    pub created_at: String,
    /// Bytes the snapshot occupies on the host.
    pub size_bytes: u64,
    /// Whether it holds the sandbox's memory and processes too (a gVisor checkpoint): sandboxes
    /// made from it continue where the source was, rather than booting on its files.
    pub memory: bool,
}

/// `POST /api/v1/sandboxes/{id}/snapshots` (the body may be left out).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    /// Keep the sandbox's memory and processes too (default false). gVisor sandboxes only,
    /// running or paused.
    pub memory: Option<bool>,
}

/// `POST /api/v1/sandboxes/{id}/fork`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// 1-10 (default 1).
    pub count: Option<u32>,
    /// Merged over the source's metadata.
    pub metadata: Option<BTreeMap<String, String>>,
}

/// What a fork copied, beside the new sandboxes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ForkInfo {
    pub source_id: String,
    /// How long the source's processes were frozen for the copy, in milliseconds.
    pub source_paused_ms: f64,
    /// Always true: each new sandbox starts with the source's files as they were.
    pub filesystem_copied: bool,
    /// False on the namespace runtime: running processes and memory do not carry over (the
    /// new sandboxes start fresh on the copied files). True on gVisor: every new sandbox is
    /// restored from one checkpoint of the source and continues where it was.
    pub processes_copied: bool,
}

/// The answer to a fork: `{"data": [sandbox, ...], "fork": {...}}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ForkResult {
    pub data: Vec<Sandbox>,
    pub fork: ForkInfo,
}

/// A file written into a one-shot run's sandbox before the command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunFile {
    /// Absolute, or relative to the command's working directory.
    pub path: String,
    pub content: String,
    /// `utf8` (default) or `base64`.
    pub encoding: Option<String>,
}

/// `POST /api/v1/sandboxes/run`: create, write files, run, collect artifacts, destroy.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    pub template_id: Option<String>,
    pub size: Option<Size>,
    /// The run's isolation runtime, as at create: `namespace` or `gvisor` (default: the
    /// template's, then the server's `[runtime] default`).
    pub runtime: Option<String>,
    pub env: Option<BTreeMap<String, String>>,
    pub metadata: Option<BTreeMap<String, String>>,
    pub network: Option<NetworkPolicy>,
    #[serde(default)]
    pub files: Vec<RunFile>,
    pub command: Option<String>,
    pub argv: Option<Vec<String>>,
    pub cwd: Option<String>,
    pub user: Option<ExecUser>,
    pub stdin: Option<String>,
    /// 1-86400, default 3600: the command is killed after it (and the sandbox destroyed).
    pub timeout_sec: Option<u32>,
    /// Globs (`**` spans directories), relative to the working directory or absolute; the
    /// matching files are kept by the server after the sandbox is gone.
    #[serde(default)]
    pub artifacts: Vec<String>,
}

/// A file kept by the server (collected from a sandbox).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Artifact {
    pub id: String,
    pub sandbox_id: String,
    /// Where it was inside the sandbox.
    pub path: String,
    pub size: u64,
    /// `GET` it for the bytes.
    pub url: String,
    pub created_at: String,
    /// When the server deletes it.
    pub expires_at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunResult {
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
    pub duration_ms: u64,
    pub timed_out: bool,
    pub sandbox_id: String,
    pub artifacts: Vec<Artifact>,
}

/// `POST /api/v1/sandboxes/{id}/artifacts`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CollectRequest {
    /// Paths or globs inside the sandbox.
    pub paths: Vec<String>,
}

// ---------------------------------------------------------------------------------------------
// Custom templates
// ---------------------------------------------------------------------------------------------

/// One build step of a template spec; exactly one field is set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "lowercase")]
pub enum TemplateStep {
    /// A shell command (`bash -c`), run in a sandbox; what it changes becomes a layer.
    Run(String),
    /// Copies a file given in the spec's `files` to `dest` (absolute, or relative to `workdir`).
    Copy(CopyStep),
    /// Environment variables for later steps and for the template's sandboxes.
    Env(BTreeMap<String, String>),
    /// The working directory of later steps and of commands in the template's sandboxes.
    Workdir(String),
    /// `user` or `root`: who runs later steps (and, by default, the template's commands).
    User(ExecUser),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CopyStep {
    /// A key of the spec's `files`.
    pub src: String,
    pub dest: String,
    /// Permission bits as a number, default 0o644 (420); JSON has no octal: 0o755 is 493.
    pub mode: Option<u32>,
}

/// What makes a template's sandbox ready once its `start` command runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadyCheck {
    /// A command that exits 0 once the app is ready.
    pub command: Option<String>,
    /// A port inside the sandbox that accepts connections once the app is ready.
    pub port: Option<u16>,
    /// Seconds to wait (default 60).
    pub timeout_sec: Option<u32>,
}

/// `POST /api/v1/templates`: a template built from a base and ordered steps.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateSpec {
    /// The template's id (lowercase letters, digits and `-`, starting with a letter).
    pub id: String,
    pub name: Option<String>,
    /// The template to build on (default `base`).
    pub from: Option<String>,
    /// An OCI image reference to build on instead of `from`.
    pub image: Option<String>,
    /// Registry credentials for `image`.
    pub registry_auth: Option<RegistryAuth>,
    #[serde(default)]
    pub steps: Vec<TemplateStep>,
    /// Files for `copy` steps: name -> content (`utf8`, or base64 with `encoding`).
    #[serde(default)]
    pub files: BTreeMap<String, InlineFile>,
    /// A command started (in the background) when a sandbox of this template boots.
    pub start: Option<String>,
    /// When the started app is ready (default: at once).
    pub ready: Option<ReadyCheck>,
    /// The port the app serves (its preview), also the default readiness check.
    pub port: Option<u16>,
    pub default_size: Option<Size>,
    /// Sandboxes of this template kept booted ahead (in its default size; default 0).
    pub warm: Option<u32>,
    /// Boot once, then restore: the first gVisor boot of each size (its app started and
    /// ready) is checkpointed, and later creates on gVisor restore from that image (default
    /// false; the template's sandboxes then default to `gvisor`).
    #[serde(default)]
    pub snapshot_boot: Option<bool>,
}

/// A file's content inside a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InlineFile {
    pub content: String,
    /// `utf8` (default) or `base64`.
    pub encoding: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegistryAuth {
    pub username: String,
    pub password: String,
}

/// One step of a build as it went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BuildStep {
    pub index: usize,
    /// `image`, `run`, `copy`, `env`, `workdir` or `user`.
    pub kind: String,
    /// `pending`, `running`, `done`, `cached` or `failed`.
    pub state: String,
    pub duration_ms: Option<u64>,
}

/// A template build (`POST /api/v1/templates` answers it with 202).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TemplateBuild {
    pub id: String,
    pub template_id: String,
    /// `queued`, `building`, `ready` or `failed`.
    pub state: String,
    pub steps: Vec<BuildStep>,
    /// Output of the build so far (from `log_offset` when given).
    pub log: String,
    /// Bytes of log before `log`.
    pub log_offset: u64,
    pub error: Option<String>,
    pub created_at: String,
    pub finished_at: Option<String>,
}
