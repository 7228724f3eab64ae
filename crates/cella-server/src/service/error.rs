//! The service layer's errors: what went wrong, in domain terms, with its cause.
//!
//! Services return these; they become the API's envelope here, in one place
//! (`impl From<SandboxError> for ApiError`), which logs the causes of internal ones (never sent
//! to the client). `crate::error` (the envelope itself) is a leaf below the services.

use super::transitions::Refused;
use crate::error::ApiError;
use crate::quotas::StorageFull;
use cella_agent::client::ClientError;
use cella_runtime::DriverError;
use cella_store::StoreError;
use cella_types::ErrorCode;
use serde_json::json;

/// Which kind of agent operation failed: the same refusal of the agent means a different
/// field (or code) depending on what was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentOp {
    /// A file operation (`path` is the field).
    Files,
    /// Starting or managing a background process (`command` and `cwd`).
    Processes,
    /// The code interpreter (`language`).
    Code,
    /// Opening a terminal (`command` and `cwd`).
    Pty,
    /// Writing one of a run's files (`files`), at `path`.
    RunFile { path: String },
    /// Anything else asked of the agent.
    Other,
}

impl AgentOp {
    /// What the log calls it.
    pub fn name(&self) -> &'static str {
        match self {
            AgentOp::Files => "agent file operation",
            AgentOp::Processes => "agent process operation",
            AgentOp::Code => "code interpreter",
            AgentOp::Pty => "opening a terminal",
            AgentOp::RunFile { .. } => "writing a run's file",
            AgentOp::Other => "agent",
        }
    }

    /// A `map_err` adapter: `agent.call(..).await.map_err(AgentOp::Files.err())`.
    pub fn err(self) -> impl FnOnce(ClientError) -> SandboxError {
        move |source| SandboxError::Agent { op: self, source }
    }
}

/// Why an operation on a sandbox failed.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// No such sandbox (or not the caller's); `what` is what was looked for.
    #[error("{0} not found")]
    NotFound(&'static str),
    /// A request field is not valid.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    /// The sandbox is not running (with why the server put it where it is, and what brings
    /// it back).
    #[error("sandbox is {state}, not running{}{}", .reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default(), hint(.id, .state))]
    NotRunning {
        id: String,
        state: String,
        reason: Option<String>,
    },
    /// The sandbox's processes were found gone (it was marked so).
    #[error("sandbox is no longer running: {reason}")]
    Gone { reason: String },
    /// A state change the sandbox's state does not allow.
    #[error(transparent)]
    Refused(#[from] Refused),
    /// Stop asked of a sandbox that keeps no files.
    #[error("a non-persistent sandbox keeps no files to stop with; destroy it instead")]
    NotPersistent { state: String },
    /// The workspace holds its plan's cap of concurrent sandboxes.
    #[error("workspace holds its plan's cap of {cap} concurrent sandboxes")]
    ConcurrencyLimit { cap: u32, plan: String },
    /// The workspace holds its plan's cap of concurrent sandboxes, at a create.
    #[error("workspace holds its plan's cap of {cap} concurrent sandboxes; destroy one first")]
    AtCap { cap: u32, plan: String },
    /// The compatibility resource fields of a create match no published contract.
    #[error("no published contract has {cpu} vCPU, {memory_mb} MiB memory and {disk_mb} MiB disk")]
    NoContract {
        cpu: u32,
        memory_mb: u32,
        disk_mb: u32,
    },
    /// The size has no image of the template on this server.
    #[error("size {size} is not available for template {template} on this server")]
    SizeUnavailable {
        size: cella_types::Size,
        template: String,
    },
    /// A custom template has no image yet: its last build failed, or one still runs.
    #[error("{}", no_image(.template, .build.as_ref()))]
    NoImage {
        template: String,
        build: Option<LastBuild>,
    },
    /// A new sandbox did not boot.
    #[error("the sandbox failed to start")]
    StartFailed { id: String, reason: Option<String> },
    /// A stopped sandbox did not boot again.
    #[error("the sandbox failed to start again")]
    RestartFailed { id: String, reason: Option<String> },
    /// A call cut because gVisor checkpointed the sandbox while it ran (a snapshot or a fork
    /// of a running sandbox); the sandbox runs on, what the call started was ended.
    #[error("sandbox {id} was checkpointed for a snapshot or fork while this call ran (gVisor closes every connection to it then); what the call started was ended: send it again")]
    Checkpointed { id: String },
    /// The sandbox's agent refused or did not answer.
    #[error("{}: {source}", .op.name())]
    Agent { op: AgentOp, source: ClientError },
    /// The workspace's wallet does not cover what this needs (402).
    #[error("the workspace's wallet has {available} available; {what} needs {needed} (add credits first)")]
    InsufficientFunds {
        needed: cella_types::Money,
        available: cella_types::Money,
        what: &'static str,
    },
    /// The ledger or a reservation could not be read or written.
    #[error("billing: {0}")]
    Billing(#[from] cella_billing::BillingError),
    /// The agent answered with something the operation does not expect.
    #[error("unexpected answer of the agent to {0}")]
    UnexpectedAnswer(&'static str),
    /// A live sandbox has no (readable) runtime record.
    #[error("sandbox {0} has no runtime record")]
    NoRuntime(String),
    /// A sandbox's workspace row is missing.
    #[error("workspace {0} of a sandbox is missing")]
    NoWorkspace(String),
    /// The driver failed (pause, stop, destroy, exec, ...).
    #[error("{what}: {source}")]
    Driver {
        what: &'static str,
        source: DriverError,
    },
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// A failure of the server itself.
    #[error(transparent)]
    Internal(#[from] crate::error::Internal),
    /// A host-side failure around an operation (a directory, a file), with its cause.
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
}

/// The last build of a custom template without an image.
#[derive(Debug, Clone)]
pub struct LastBuild {
    pub id: String,
    pub state: String,
    pub error: Option<String>,
}

fn no_image(id: &str, build: Option<&LastBuild>) -> String {
    match build {
        Some(b) if b.state == "failed" => format!(
            "template {id} has no image: its build {} failed ({}); see GET /api/v1/templates/{id}/builds/{}",
            b.id,
            b.error.as_deref().unwrap_or("no reason recorded"),
            b.id
        ),
        Some(b) => format!(
            "template {id} is still being built (build {} is {}); create its sandboxes once it is ready",
            b.id, b.state
        ),
        None => format!("template {id} has no image on this server"),
    }
}

impl From<crate::network::BadPolicy> for SandboxError {
    fn from(e: crate::network::BadPolicy) -> Self {
        SandboxError::invalid(e.field, e.message)
    }
}

fn hint(id: &str, state: &str) -> String {
    match state {
        "paused" | "stopped" => {
            format!("; resume it (POST /api/v1/sandboxes/{id}/resume) to bring it back")
        }
        "provisioning" => "; it is still starting".to_string(),
        _ => String::new(),
    }
}

impl SandboxError {
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        SandboxError::Invalid {
            field: field.to_string(),
            message: message.into(),
        }
    }

    /// Not running, from the row as it is.
    pub fn not_running(row: &cella_store::SandboxRow) -> Self {
        SandboxError::NotRunning {
            id: row.id.clone(),
            state: row.state.as_str().to_string(),
            reason: row.state_reason.clone(),
        }
    }

    /// A driver failure, named by what was being done.
    pub fn driver(what: &'static str) -> impl FnOnce(DriverError) -> SandboxError {
        move |source| SandboxError::Driver { what, source }
    }
}

impl From<ClientError> for SandboxError {
    fn from(source: ClientError) -> Self {
        SandboxError::Agent {
            op: AgentOp::Other,
            source,
        }
    }
}

impl From<DriverError> for SandboxError {
    fn from(source: DriverError) -> Self {
        SandboxError::Driver {
            what: "driver",
            source,
        }
    }
}

/// The one place a [`SandboxError`] becomes the API's envelope; the causes of internal errors
/// are logged here, never sent.
impl From<SandboxError> for ApiError {
    fn from(e: SandboxError) -> Self {
        use cella_agent::proto::ErrorKind as K;
        use SandboxError as E;
        let message = e.to_string();
        match e {
            E::NotFound(what) => ApiError::not_found(what),
            E::Invalid { field, message } => ApiError::invalid(&field, message),
            E::NotRunning { state, reason, .. } => {
                ApiError::new(ErrorCode::SandboxNotRunning, message)
                    .with_details(json!({ "state": state, "reason": reason }))
            }
            E::Gone { .. } => ApiError::new(ErrorCode::SandboxNotRunning, message),
            E::Refused(r) => ApiError::new(ErrorCode::Conflict, message)
                .with_details(json!({ "state": r.state.as_str() })),
            E::NotPersistent { state } => ApiError::new(ErrorCode::Conflict, message)
                .with_details(json!({ "state": state, "persistent": false })),
            E::ConcurrencyLimit { cap, plan } | E::AtCap { cap, plan } => {
                let mut e = ApiError::new(ErrorCode::ConcurrencyLimit, message)
                    .with_details(json!({ "limit": cap, "plan": plan }));
                e.retry_after = Some(5);
                e
            }
            E::InsufficientFunds {
                needed,
                available,
                what,
            } => crate::error::insufficient(needed, available, what),
            E::Billing(b) => b.into(),
            E::NoContract { .. } => ApiError::invalid("cpu_count", message).with_details(json!({
                "field": "cpu_count",
                "contracts": cella_types::ALL_SIZES.map(|s| s.contract())
            })),
            E::SizeUnavailable { size, .. } => ApiError::new(ErrorCode::SizeUnavailable, message)
                .with_details(json!({ "field": "size", "size": size.as_str() })),
            E::NoImage { template, build } => {
                let details = match build {
                    Some(b) => {
                        json!({ "template_id": template, "build_id": b.id, "build_state": b.state })
                    }
                    None => json!({ "template_id": template }),
                };
                ApiError::new(ErrorCode::SizeUnavailable, message).with_details(details)
            }
            E::Internal(e) => e.into(),
            // A boot that failed for lack of room on the server's disk: 507, as a store write
            // or a snapshot on a full disk answers (the sandbox is in `error`, its files gone).
            E::RestartFailed { id, reason } | E::StartFailed { id, reason }
                if reason.as_deref().is_some_and(cella_runtime::says_no_space) =>
            {
                ApiError::new(ErrorCode::InsufficientStorage, message)
                    .with_details(json!({ "sandbox_id": id, "reason": reason }))
            }
            E::RestartFailed { id, reason } | E::StartFailed { id, reason } => {
                ApiError::unavailable(message)
                    .with_details(json!({ "sandbox_id": id, "reason": reason }))
            }
            E::Agent {
                op,
                source: ClientError::Refused { kind, message: m },
            } => match (&op, kind) {
                (AgentOp::RunFile { path }, K::NoSpace) => {
                    // The sandbox's disk is full: 507, as an upload would answer.
                    ApiError::new(
                        ErrorCode::InsufficientStorage,
                        format!("writing {path}: {m}"),
                    )
                }
                (AgentOp::RunFile { path }, _) => {
                    ApiError::invalid("files", format!("writing {path}: {m}"))
                }
                (AgentOp::Pty, K::BadCwd) => ApiError::invalid("cwd", m),
                (AgentOp::Pty, _) => ApiError::invalid("command", m),
                (AgentOp::Code, K::Conflict) => ApiError::new(ErrorCode::Conflict, m),
                (AgentOp::Code, K::BadRequest) => ApiError::invalid("language", m),
                (AgentOp::Code, _) | (_, K::Internal) => {
                    tracing::warn!("{}: {m}", op.name());
                    ApiError::internal()
                }
                (_, K::NotFound) => ApiError::new(ErrorCode::NotFound, m),
                (_, K::Conflict) => ApiError::new(ErrorCode::Conflict, m),
                (AgentOp::Files, K::BadRequest | K::BadCwd) => ApiError::invalid("path", m),
                (AgentOp::Files, K::TooLarge) => ApiError::new(ErrorCode::PayloadTooLarge, m),
                (_, K::BadCwd) => ApiError::invalid("cwd", m),
                (_, K::BadRequest | K::TooLarge) => ApiError::invalid("command", m),
                (_, K::NoSpace) => ApiError::new(ErrorCode::InsufficientStorage, m),
                (_, K::Busy) => ApiError::new(ErrorCode::ConcurrencyLimit, m),
                (_, K::Unavailable) => ApiError::unavailable(m),
            },
            E::Agent { .. } => {
                tracing::warn!("{message}");
                ApiError::unavailable("the sandbox's agent did not answer")
            }
            E::Checkpointed { id } => ApiError::unavailable(message)
                .with_details(json!({ "sandbox_id": id, "reason": "checkpointed" })),
            // The server's disk is full: 507, nothing written.
            E::Store(s) if s.is_full() => s.into(),
            E::UnexpectedAnswer(_)
            | E::NoRuntime(_)
            | E::NoWorkspace(_)
            | E::Driver { .. }
            | E::Store(_)
            | E::Io { .. } => {
                tracing::error!("{message}");
                ApiError::internal()
            }
        }
    }
}

/// Why a snapshot operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// No such snapshot in the caller's workspace (internal ones are never found).
    #[error("snapshot not found")]
    NotFound,
    /// The sandbox's state has no files to copy.
    #[error(
        "sandbox is {}: only a running, paused or stopped sandbox has files to copy",
        .state.as_str()
    )]
    NoFiles { state: cella_types::SandboxState },
    /// The sandbox's state cannot be forked.
    #[error(
        "sandbox is {}: only a running, paused or stopped sandbox can be forked",
        .state.as_str()
    )]
    NotForkable { state: cella_types::SandboxState },
    /// Sandboxes that have not booted yet still need the snapshot's files.
    #[error("{booting} sandbox(es) are starting from this snapshot; delete it once they run")]
    Booting { booting: i64 },
    /// The fork would pass the workspace's cap of concurrent sandboxes.
    #[error("forking {count} would pass the workspace's cap of {cap} concurrent sandboxes")]
    OverCap { count: u32, cap: u32 },
    /// The workspace's storage quota has no room for it.
    #[error(transparent)]
    Full(#[from] StorageFull),
    /// The backend cannot snapshot this sandbox.
    #[error("{0}")]
    Unsupported(String),
    /// The sandbox, its workspace or a request field (see [`SandboxError`]).
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// The server's own disk (its data directory) has no room for the copy; nothing is kept.
    #[error("the server's disk has no room for a snapshot of sandbox {sandbox}; nothing was kept")]
    NoSpace { sandbox: String },
    /// The driver failed to copy the files.
    #[error("snapshot of sandbox {sandbox}: {source}")]
    Driver {
        sandbox: String,
        source: cella_runtime::DriverError,
    },
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The fork's own task ended without an answer (it panicked).
    #[error("the fork of sandbox {sandbox} ended without an answer: {source}")]
    Task {
        sandbox: String,
        source: tokio::task::JoinError,
    },
}

/// The one place a [`SnapshotError`] becomes the envelope.
impl From<SnapshotError> for ApiError {
    fn from(e: SnapshotError) -> Self {
        use SnapshotError as E;
        let message = e.to_string();
        match e {
            E::NotFound => ApiError::not_found("snapshot"),
            E::NoFiles { .. } | E::NotForkable { .. } | E::Booting { .. } | E::Unsupported(_) => {
                ApiError::new(ErrorCode::Conflict, message)
            }
            E::OverCap { count, cap } => {
                let mut e = ApiError::new(ErrorCode::ConcurrencyLimit, message)
                    .with_details(json!({ "limit": cap, "count": count }));
                e.retry_after = Some(5);
                e
            }
            E::Full(full) => full.into(),
            E::NoSpace { .. } => ApiError::new(ErrorCode::InsufficientStorage, message),
            E::Sandbox(e) => e.into(),
            E::Store(e) => e.into(),
            E::Driver { .. } | E::Task { .. } => {
                tracing::error!("{message}");
                ApiError::internal()
            }
        }
    }
}

/// Why a one-shot run (`crate::runs::run`) or a collection of artifacts failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A request field, the sandbox's state, its agent (see [`SandboxError`]).
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// One of the run's files is larger than an upload may be.
    #[error("{path} is over the upload limit")]
    TooLarge { path: String },
    /// The client hung up before the answer: the run was stopped and its sandbox destroyed.
    #[error("the client went away; the run was cancelled")]
    Cancelled,
    /// The workspace's storage quota has no room for artifacts.
    #[error(transparent)]
    Full(#[from] StorageFull),
    /// A failure of the server itself.
    #[error(transparent)]
    Internal(#[from] crate::error::Internal),
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

impl RunError {
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        RunError::Sandbox(SandboxError::invalid(field, message))
    }
}

/// The one place a [`RunError`] becomes the envelope.
impl From<RunError> for ApiError {
    fn from(e: RunError) -> Self {
        let message = e.to_string();
        match e {
            RunError::Sandbox(e) => e.into(),
            RunError::TooLarge { .. } => ApiError::new(ErrorCode::PayloadTooLarge, message),
            RunError::Cancelled => ApiError::new(ErrorCode::Conflict, message),
            RunError::Full(e) => e.into(),
            RunError::Internal(e) => e.into(),
            RunError::Store(e) => e.into(),
        }
    }
}

/// Why an operation on a custom template (`crate::builds`: build, list its builds, delete)
/// failed.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// A field of the spec is not valid.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    /// No such template, image or build for the caller; `.0` is what was looked for.
    #[error("{0} not found")]
    NotFound(&'static str),
    /// Built-in templates are neither built nor deleted through the API.
    #[error("{0} is a built-in template")]
    BuiltIn(String),
    /// The base template has no image yet.
    #[error("template {0} is not built (yet)")]
    NotBuilt(String),
    /// Another request creates a template of this id in the workspace right now.
    #[error("template {0} is being created by another request; try again")]
    Racing(String),
    /// Sandboxes or snapshots still use the template.
    #[error("template {id} is in use by {sandboxes} sandbox(es) and {snapshots} snapshot(s); destroy or delete them first")]
    InUse {
        id: String,
        sandboxes: i64,
        snapshots: i64,
    },
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

impl TemplateError {
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        TemplateError::Invalid {
            field: field.to_string(),
            message: message.into(),
        }
    }
}

/// The one place a [`TemplateError`] becomes the envelope.
impl From<TemplateError> for ApiError {
    fn from(e: TemplateError) -> Self {
        let message = e.to_string();
        match e {
            TemplateError::Invalid { field, message } => ApiError::invalid(&field, message),
            TemplateError::NotFound(what) => ApiError::not_found(what),
            TemplateError::BuiltIn(_) | TemplateError::NotBuilt(_) | TemplateError::Racing(_) => {
                ApiError::new(ErrorCode::Conflict, message)
            }
            TemplateError::InUse {
                sandboxes,
                snapshots,
                ..
            } => ApiError::new(ErrorCode::Conflict, message)
                .with_details(json!({ "sandboxes": sandboxes, "snapshots": snapshots })),
            TemplateError::Store(e) => e.into(),
        }
    }
}

/// The one place a [`PeopleError`](super::people::PeopleError) becomes the envelope.
impl From<super::people::PeopleError> for ApiError {
    fn from(e: super::people::PeopleError) -> Self {
        use super::people::PeopleError as E;
        let message = e.to_string();
        match e {
            E::Invalid { field, message } => ApiError::invalid(field, message),
            E::EmailTaken => ApiError::new(ErrorCode::Conflict, message)
                .with_details(json!({ "field": "email" })),
            E::BadCredentials => ApiError::new(ErrorCode::Unauthorized, message),
            E::RateLimited { retry_after } => {
                let mut e = ApiError::new(ErrorCode::RateLimited, message)
                    .with_details(json!({ "group": "sign-in" }));
                e.retry_after = Some(retry_after);
                e
            }
            E::NotFound(what) => ApiError::not_found(what),
            E::LastOwner => {
                ApiError::new(ErrorCode::Conflict, message).with_details(json!({ "field": "role" }))
            }
            E::Forbidden(m) => ApiError::new(ErrorCode::Forbidden, m),
            E::KeyWorkspaceNotFound => ApiError::new(ErrorCode::NotFound, message)
                .with_details(json!({ "field": "workspace_id" })),
            E::ScopeNotHeld(s) => ApiError::new(ErrorCode::Forbidden, message)
                .with_details(json!({ "field": "scopes", "required_scope": s.as_str() })),
            E::Conflict(m) => ApiError::new(ErrorCode::Conflict, m),
            E::Hash(_) | E::Store(_) => {
                tracing::error!("{message}");
                ApiError::internal()
            }
        }
    }
}

/// Why an operation on a task run (`crate::tasks`) failed. The messages never carry the task
/// message, repository content or a credential.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// A request field is not valid (400, `details.field`).
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    /// The workspace's `tasks_enabled` is false (403, `details.reason = "tasks_disabled"`).
    #[error("task runs are not enabled for this workspace (its settings' tasks_enabled is false)")]
    Disabled,
    /// No such run (or another workspace's).
    #[error("task not found")]
    NotFound,
    /// The forge cannot read the repository, or the base branch does not exist (404).
    #[error("{0}")]
    Repository(String),
    /// The forge could not be reached or refused the server (503).
    #[error("{0}")]
    Forge(String),
    /// The wallet's `available` does not cover the run's worst case (402).
    #[error("the workspace's wallet has {available} available; a task run at this compute rate and session limit needs {needed} (add credits first)")]
    InsufficientFunds {
        needed: cella_types::Money,
        available: cella_types::Money,
    },
    /// The run has ended: its live log is gone (410).
    #[error("the run has ended; its live log is no longer available (it is never stored)")]
    Gone,
    #[error(transparent)]
    Billing(#[from] cella_billing::BillingError),
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error(transparent)]
    Internal(#[from] crate::error::Internal),
}

impl TaskError {
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        TaskError::Invalid {
            field: field.to_string(),
            message: message.into(),
        }
    }
}

/// The one place a [`TaskError`] becomes the envelope.
impl From<TaskError> for ApiError {
    fn from(e: TaskError) -> Self {
        let message = e.to_string();
        match e {
            TaskError::Invalid { field, message } => ApiError::invalid(&field, message),
            TaskError::Disabled => ApiError::new(ErrorCode::Forbidden, message)
                .with_details(json!({ "reason": "tasks_disabled" })),
            TaskError::NotFound => ApiError::not_found("task"),
            TaskError::Repository(m) => ApiError::new(ErrorCode::NotFound, m),
            TaskError::Forge(m) => ApiError::unavailable(m),
            TaskError::InsufficientFunds { needed, available } => {
                crate::error::insufficient(needed, available, "a task run (its worst case)")
            }
            TaskError::Gone => ApiError::new(ErrorCode::Gone, message),
            TaskError::Billing(b) => b.into(),
            TaskError::Store(e) => e.into(),
            TaskError::Internal(e) => e.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_boot_that_found_the_servers_disk_full_is_507_and_another_failed_boot_503() {
        let failed = |reason: &str| {
            ApiError::from(SandboxError::StartFailed {
                id: "sb1".into(),
                reason: Some(reason.into()),
            })
        };
        let full = failed("failed to start: i/o: No space left on device (os error 28)");
        assert_eq!(full.code.status(), 507);
        assert_eq!(full.details.as_ref().unwrap()["sandbox_id"], "sb1");
        assert_eq!(failed("the agent did not answer").code.status(), 503);
        let again = ApiError::from(SandboxError::RestartFailed {
            id: "sb1".into(),
            reason: Some("mkfs: Disk quota exceeded".into()),
        });
        assert_eq!(again.code.status(), 507);
    }
}
