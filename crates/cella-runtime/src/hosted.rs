//! What both backends do the same way: their sandbox is a host process (its init) in a cgroup
//! of its own, reached through its agent's socket. Exec and the liveness probe go to the agent,
//! pause and resume freeze and thaw the cgroup, usage reads it.

use crate::{
    cgroup, DriverError, ExecEvent, ExecSpec, ExitInfo, Probe, ResourceUsage, SandboxHandle,
};
use cella_agent::client::{AgentClient, ClientError};
use cella_agent::proto::ErrorKind;
use std::time::Duration;
use tokio::sync::mpsc;

/// Runs one command through the sandbox's agent.
pub async fn exec(
    handle: &SandboxHandle,
    spec: ExecSpec,
    events: mpsc::Sender<ExecEvent>,
) -> Result<ExitInfo, DriverError> {
    AgentClient::new(&handle.socket)
        .exec(spec, events)
        .await
        .map_err(|e| match e {
            ClientError::Refused {
                kind: ErrorKind::BadCwd,
                message,
            } => DriverError::BadCwd(message),
            ClientError::ConsumerGone => DriverError::ClientGone,
            other => DriverError::Agent(other.to_string()),
        })
}

/// Alive when its init (`init`: how the backend names it) runs and its agent answers, or its
/// cgroup is frozen (a frozen agent cannot answer, and must not be woken to).
pub async fn probe(handle: &SandboxHandle, init: &str) -> Probe {
    if !alive(handle) {
        return Probe::Gone(format!("the sandbox's {init} is gone"));
    }
    if cgroup::is_frozen(&handle.cgroup) {
        return Probe::Alive;
    }
    match AgentClient::new(&handle.socket)
        .ping(Duration::from_secs(3))
        .await
    {
        Ok(_) => Probe::Alive,
        Err(e) => Probe::Gone(format!("the sandbox's agent does not answer: {e}")),
    }
}

/// Freezes the sandbox's cgroup.
pub async fn pause(handle: &SandboxHandle) -> Result<(), DriverError> {
    let cg = handle.cgroup.clone();
    tokio::task::spawn_blocking(move || cgroup::freeze(&cg))
        .await
        .map_err(|e| DriverError::Cgroup(e.to_string()))?
}

/// Thaws the sandbox's cgroup.
pub fn unpause(handle: &SandboxHandle) -> Result<(), DriverError> {
    cgroup::thaw(&handle.cgroup)
}

/// Whether the init the handle names still runs (the same pid and start time).
pub fn alive(handle: &SandboxHandle) -> bool {
    crate::namespace::process_start_time(handle.pid) == Some(handle.start_time)
}

/// What the sandbox's cgroup has used, while it exists.
pub fn usage(handle: &SandboxHandle) -> Option<ResourceUsage> {
    if !cgroup::exists(&handle.cgroup) {
        return None;
    }
    let (cpu_ns, memory_bytes) = cgroup::usage(&handle.cgroup);
    Some(ResourceUsage {
        cpu_ns,
        memory_bytes,
    })
}
