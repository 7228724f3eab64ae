//! A running sandbox, ready to be asked things: the one place that checks "it is running,
//! give me its handle", fills in what its template sets for commands, and turns an exec
//! request into the agent's spec.

use super::AgentOp;
use super::SandboxError;
use crate::auth::Auth;
use crate::rows::{handle_of, state_of};
use crate::AppState;
use cella_agent::client::{AgentClient, ClientError};
use cella_runtime::rootfs::USER_UID;
use cella_runtime::{base_env, ExecSpec, SandboxHandle};
use cella_store::SandboxRow;
use cella_types::{ExecRequest, ExecUser, SandboxState};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A command's timeout when none is given, and the longest one (also of a sandbox's active
/// session).
pub const DEFAULT_TIMEOUT_SEC: u32 = 3600;
pub const MAX_TIMEOUT_SEC: u32 = 86_400;
/// Entries a metadata or environment map takes at most.
const MAX_MAP_ENTRIES: usize = 64;

/// The one check of a timeout in seconds (`field` names it): from 1 to 86400.
pub fn check_timeout(field: &str, sec: u32) -> Result<u32, SandboxError> {
    if (1..=MAX_TIMEOUT_SEC).contains(&sec) {
        Ok(sec)
    } else {
        Err(SandboxError::invalid(
            field,
            format!("{field} must be from 1 to 86400"),
        ))
    }
}

/// Checks a metadata map (`env: false`: keys of letters, digits, `_.-`, values up to 512
/// bytes) or an environment (`env: true`: keys without `=`, no NUL anywhere).
pub fn check_map(field: &str, m: &BTreeMap<String, String>, env: bool) -> Result<(), SandboxError> {
    if m.len() > MAX_MAP_ENTRIES {
        return Err(SandboxError::invalid(
            field,
            format!("{field} takes at most {MAX_MAP_ENTRIES} entries"),
        ));
    }
    for (k, v) in m {
        let key_ok = if env {
            !k.is_empty() && !k.contains('=') && !k.contains('\0')
        } else {
            !k.is_empty()
                && k.len() <= 64
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
        };
        if !key_ok {
            return Err(SandboxError::invalid(
                &format!("{field}.{k}"),
                format!("{field} key {k:?} is not valid"),
            ));
        }
        if v.contains('\0') || (!env && v.len() > 512) {
            return Err(SandboxError::invalid(
                &format!("{field}.{k}"),
                format!("{field} value for {k:?} is not valid"),
            ));
        }
    }
    Ok(())
}

/// The caller's workspace and its plan's cap of concurrent sandboxes.
pub async fn workspace_cap(
    state: &AppState,
    auth: &Auth,
) -> Result<(cella_store::WorkspaceRow, u32), SandboxError> {
    let workspace = state
        .store
        .workspace(&auth.workspace_id)
        .await?
        .ok_or_else(|| SandboxError::NoWorkspace(auth.workspace_id.clone()))?;
    let cap = cella_types::Plan::parse(&workspace.plan)
        .unwrap_or(cella_types::Plan::Developer)
        .concurrency_cap();
    Ok((workspace, cap))
}

/// The caller's sandbox `id` (not found for another workspace's, and for the pool's).
pub async fn owned(state: &AppState, auth: &Auth, id: &str) -> Result<SandboxRow, SandboxError> {
    state
        .store
        .sandbox(id)
        .await?
        .filter(|r| {
            if cella_store::is_internal_workspace(&r.workspace_id) {
                // No key is of an internal workspace (auth refuses one): a request that gets
                // here is a bug or an attack, and answers what an unknown id does.
                tracing::warn!(
                    sandbox = r.id,
                    key = auth.key_id,
                    "an API request resolved to a warm pool sandbox; refused"
                );
                return false;
            }
            r.workspace_id == auth.workspace_id
        })
        .ok_or(SandboxError::NotFound("sandbox"))
}

/// The longest a call that needs a sandbox's agent waits for it to come back from a snapshot's
/// or fork's checkpoint and restore ([`crate::rows::Away`]).
pub const AWAY_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The sandbox `id` of the caller's workspace (not found otherwise), counted as activity,
/// which must be running (not running otherwise, and it is not woken). One whose agent is away
/// for a moment (a gVisor snapshot or fork) is waited for, and read again once it is back (the
/// caller's ownership checked first: another workspace's key learns nothing by waiting).
pub async fn runnable(state: &AppState, auth: &Auth, id: &str) -> Result<Runnable, SandboxError> {
    let mut row = owned(state, auth, id).await?;
    if state.away.settled(id, AWAY_WAIT).await {
        row = owned(state, auth, id).await?;
    }
    state.activity.touch(id);
    Runnable::of(state, row)
}

/// A running sandbox: its row, its handle, and what its template sets for commands.
pub struct Runnable {
    pub row: SandboxRow,
    pub handle: SandboxHandle,
    workdir: Option<String>,
    user: Option<ExecUser>,
    /// The model gateway's variables, when the sandbox has model access (`gateway`).
    gateway_env: BTreeMap<String, String>,
}

impl Runnable {
    /// `row`, which must be running.
    pub fn of(state: &AppState, row: SandboxRow) -> Result<Runnable, SandboxError> {
        if state_of(&row) != SandboxState::Running {
            return Err(SandboxError::not_running(&row));
        }
        let handle = handle_of(&row)?.ok_or_else(|| SandboxError::NoRuntime(row.id.clone()))?;
        Ok(Runnable::booting(state, row, handle))
    }

    /// `row` while it boots on `handle` (not yet recorded as running): for its template's app
    /// and readiness check.
    pub fn booting(state: &AppState, row: SandboxRow, handle: SandboxHandle) -> Runnable {
        let (workdir, user) = state.catalog.exec_defaults(&row.template_id);
        let gateway_env = state.gateway.env_of(&row.id);
        Runnable {
            row,
            handle,
            workdir,
            user,
            gateway_env,
        }
    }

    pub fn agent(&self, state: &AppState) -> AgentClient {
        state.driver.agent(&self.handle)
    }

    /// Its agent for calls of one kind, whose failures [`CheckedAgent::check`] answers.
    pub fn checked_agent(&self, state: &Arc<AppState>, op: AgentOp) -> CheckedAgent {
        CheckedAgent {
            client: self.agent(state),
            state: state.clone(),
            id: self.row.id.clone(),
            op,
        }
    }

    /// Checks an exec request and turns it into the agent's spec, with the template's working
    /// directory and user where the request leaves them open. `output_cap` bounds each stream
    /// (None for a streamed exec, which keeps nothing).
    pub fn spec(
        &self,
        req: ExecRequest,
        output_cap: Option<u64>,
    ) -> Result<ExecSpec, SandboxError> {
        let argv = match (req.command, req.argv) {
            (Some(c), None) => vec!["/bin/bash".to_string(), "-c".to_string(), c],
            (None, Some(a)) if !a.is_empty() => a,
            (None, Some(_)) => return Err(SandboxError::invalid("argv", "argv must not be empty")),
            (Some(_), Some(_)) => {
                return Err(SandboxError::invalid(
                    "command",
                    "give command or argv, not both",
                ))
            }
            (None, None) => {
                return Err(SandboxError::invalid(
                    "command",
                    "command or argv is required",
                ))
            }
        };
        let timeout = check_timeout(
            "timeout_sec",
            req.timeout_sec.unwrap_or(DEFAULT_TIMEOUT_SEC),
        )?;
        let (uid, home, name) = match req.user.or(self.user).unwrap_or_default() {
            ExecUser::User => (USER_UID, "/home/user", "user"),
            ExecUser::Root => (0, "/root", "root"),
        };
        let cwd = req
            .cwd
            .or_else(|| self.workdir.clone())
            .unwrap_or_else(|| home.to_string());
        if !cwd.starts_with('/') {
            return Err(SandboxError::invalid("cwd", "cwd must be an absolute path"));
        }
        let req_env = req.env.unwrap_or_default();
        check_map("env", &req_env, true)?;
        let mut env = base_env(home, name);
        env.extend(self.row.env.clone());
        env.extend(self.gateway_env.clone());
        env.extend(req_env);
        Ok(ExecSpec {
            argv,
            env,
            cwd,
            uid,
            gid: uid,
            stdin: req.stdin.map(String::into_bytes),
            timeout_ms: timeout as u64 * 1000,
            output_cap,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_from_1_to_86400() {
        assert!(check_timeout("timeout_sec", 0).is_err());
        assert_eq!(check_timeout("timeout_sec", 1).unwrap(), 1);
        assert_eq!(check_timeout("timeout_sec", 86_400).unwrap(), 86_400);
        let e = check_timeout("timeout_sec", 86_401).unwrap_err();
        assert_eq!(
            e.to_string(),
            "timeout_sec: timeout_sec must be from 1 to 86400"
        );
    }
}

/// A running sandbox's agent, for calls of one kind (`op`): a call that fails answers what
/// [`crate::sandboxes::agent_failure`] decides, so that a call cut by a pause, a stop or a
/// destroy answers as one made after it (409 or 404), and the agent's own refusals keep their
/// meaning for `op`.
#[derive(Clone)]
pub struct CheckedAgent {
    client: AgentClient,
    state: Arc<AppState>,
    id: String,
    op: AgentOp,
}

impl std::ops::Deref for CheckedAgent {
    type Target = AgentClient;
    fn deref(&self) -> &AgentClient {
        &self.client
    }
}

impl CheckedAgent {
    /// `r`, or the answer to its failure.
    pub async fn check<T>(&self, r: Result<T, ClientError>) -> Result<T, SandboxError> {
        match r {
            Ok(v) => Ok(v),
            Err(e) => Err(self.failure(e).await),
        }
    }

    /// The answer to a call that failed with `e`.
    pub async fn failure(&self, e: ClientError) -> SandboxError {
        crate::sandboxes::agent_failure(&self.state, &self.id, self.op.clone(), e).await
    }

    /// One request and its answer.
    pub async fn ask(
        &self,
        req: &cella_agent::proto::Request,
    ) -> Result<cella_agent::proto::Response, SandboxError> {
        let r = self.client.call(req).await;
        self.check(r).await
    }
}
