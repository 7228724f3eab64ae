//! The bounded failure reasons of a run: `<kind>: <detail>`, one line, at most 500 characters,
//! never repository content or a secret.

/// The kinds a `failure_reason` starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The repository could not be cloned.
    CloneFailed,
    BaseBranchMissing,
    /// The forge's API failed (token, pull request).
    ForgeError,
    PushRefused,
    /// The agent exited non-zero (detail: the code or signal).
    AgentExit,
    HeartbeatLost,
    ServerRestart,
    /// The sandbox could not be made or the checkout not handed over.
    ProvisionFailed,
    /// The branch handed back was refused.
    BadHandoff,
    Internal,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::CloneFailed => "clone_failed",
            FailureKind::BaseBranchMissing => "base_branch_missing",
            FailureKind::ForgeError => "forge_error",
            FailureKind::PushRefused => "push_refused",
            FailureKind::AgentExit => "agent_exit",
            FailureKind::HeartbeatLost => "heartbeat_lost",
            FailureKind::ServerRestart => "server_restart",
            FailureKind::ProvisionFailed => "provision_failed",
            FailureKind::BadHandoff => "bad_handoff",
            FailureKind::Internal => "internal",
        }
    }
}

/// `kind: detail` made safe: one line, control characters dropped, anything that looks like a
/// credential in a URL (`user:secret@`) removed, cut to 500 characters (on a char boundary).
pub fn reason(kind: FailureKind, detail: &str) -> String {
    let _ = (kind, detail);
    todo!("cella-tasks: failure::reason")
}
