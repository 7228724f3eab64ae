//! Wire types of repository task runs (`/api/v1/tasks`).
//!
//! A task run takes a repository, a base branch and one message; an agent works on it in a fresh
//! sandbox on a new branch, and the branch is pushed and opened as a draft pull request. The
//! task message is kept only while the run is alive; after teardown the store keeps exactly the
//! fields of [`Task`] (never the message, the diff, file contents, the agent's output or a token).

use crate::Money;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// Where a run is. `stopped`, `failed` and `cancelled` are terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    /// Accepted, waiting for a runner.
    Queued,
    /// A sandbox is being made and the repository cloned into it.
    Provisioning,
    /// The agent is at work; heartbeats arrive.
    Running,
    /// Ended and torn down (a pull request if there were commits).
    Stopped,
    /// Ended with an error (`failure_reason` says which).
    Failed,
    /// Someone stopped it before it finished.
    Cancelled,
}

impl TaskState {
    pub const ALL: [TaskState; 6] = [
        TaskState::Queued,
        TaskState::Provisioning,
        TaskState::Running,
        TaskState::Stopped,
        TaskState::Failed,
        TaskState::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Queued => "queued",
            TaskState::Provisioning => "provisioning",
            TaskState::Running => "running",
            TaskState::Stopped => "stopped",
            TaskState::Failed => "failed",
            TaskState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<TaskState> {
        TaskState::ALL.into_iter().find(|t| t.as_str() == s)
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Stopped | TaskState::Failed | TaskState::Cancelled
        )
    }
}

impl std::fmt::Display for TaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a run ended (null while it is alive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The agent exited by itself (exit code 0: `stopped`; otherwise `failed`).
    AgentExit,
    /// `session_limit_min` was reached; what was done is pushed.
    SessionLimit,
    /// The agent's heartbeats stopped for `heartbeat_timeout_sec`.
    HeartbeatLost,
    /// Someone cancelled it.
    Cancelled,
    /// The server restarted while the run was alive.
    ServerRestart,
    /// Provisioning, the clone, the hand-off or the forge failed (`failure_reason` says how).
    Error,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::AgentExit => "agent_exit",
            StopReason::SessionLimit => "session_limit",
            StopReason::HeartbeatLost => "heartbeat_lost",
            StopReason::Cancelled => "cancelled",
            StopReason::ServerRestart => "server_restart",
            StopReason::Error => "error",
        }
    }

    pub fn parse(s: &str) -> Option<StopReason> {
        [
            StopReason::AgentExit,
            StopReason::SessionLimit,
            StopReason::HeartbeatLost,
            StopReason::Cancelled,
            StopReason::ServerRestart,
            StopReason::Error,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
    }
}

/// The draft pull (or merge) request a run opened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PullRequest {
    pub number: u64,
    pub url: String,
    pub draft: bool,
}

/// A task run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Task {
    pub id: String,
    pub workspace_id: String,
    /// The user or API key that started it (`usr_...` / `key_...` id).
    pub created_by: String,
    /// `owner/name` as given.
    pub repository: String,
    pub base_branch: String,
    /// The branch the agent works on: `[tasks] branch_prefix` + the run's id.
    pub branch: String,
    /// The configured forge's name.
    pub forge: String,
    /// The configured agent's name.
    pub agent: String,
    pub state: TaskState,
    /// One line of at most 500 characters, `<kind>: <detail>`, when `failed`; else null.
    pub failure_reason: Option<String>,
    pub stop_reason: Option<StopReason>,
    pub pull_request: Option<PullRequest>,
    pub queued_at: String,
    pub started_at: Option<String>,
    pub ended_at: Option<String>,
    /// Seconds the run's sandbox ran (billed with a 60-second minimum).
    pub compute_sec: i64,
    /// The workspace's `compute_rate` when the run was started.
    pub compute_rate: Money,
    pub compute_cost: Money,
    pub model_cost: Money,
    pub model_requests: i64,
    pub session_limit_min: u32,
    pub metadata: BTreeMap<String, String>,
}

/// `POST /api/v1/tasks`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTask {
    /// `owner/name`.
    pub repository: String,
    /// Default: the repository's default branch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_branch: Option<String>,
    /// What the agent is asked to do (1 to 65,536 bytes).
    pub task: String,
    /// A configured forge's name; default the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forge: Option<String>,
    /// A configured agent's name; default the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// The largest task message, in bytes.
pub const MAX_TASK_BYTES: usize = 65_536;

/// An event of `GET /api/v1/tasks/{id}/events` (SSE; the event name is the variant's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum TaskEvent {
    /// The run changed state (the first event is the state it is in when the stream opens).
    State {
        state: TaskState,
        at: String,
        failure_reason: Option<String>,
        stop_reason: Option<StopReason>,
    },
    /// Counts only, never content.
    Progress(TaskProgress),
}

/// What the agent has done so far, as counts (sent with heartbeats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TaskProgress {
    /// Model turns (the built-in agent) or 0.
    pub steps: u32,
    /// Commits on the run's branch.
    pub commits: u32,
    /// Files changed against the base.
    pub files_changed: u32,
}
