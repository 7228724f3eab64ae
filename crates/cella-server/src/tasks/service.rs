//! The API's operations on task runs: start (its checks, in the order of the module docs of
//! `crate::tasks`), list, get, cancel, and the streams of events and of the live log.

use super::{emit_state, host_dir, wire_all, TaskError};
use crate::auth::Auth;
use crate::util::{new_id, now_ms};
use crate::AppState;
use cella_billing::Holder;
use cella_store::{TaskFilter, TaskRow};
use cella_tasks::{AgentConfig, AgentKind, Forge, ForgeError, GitError, HostGit, RepoRef};
use cella_types::{CreateTask, Money, Task, TaskEvent, TaskState, MAX_TASK_BYTES};
use std::sync::Arc;

/// The configured forge named `name` (the first when None).
pub fn forge(state: &AppState, name: Option<&str>) -> Option<Forge> {
    let forges = state.config.forges();
    let cfg = match name {
        None => forges.into_iter().next(),
        Some(n) => forges.into_iter().find(|f| f.name == n),
    }?;
    match Forge::from_config(cfg) {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::error!("a configured forge does not load: {e}");
            None
        }
    }
}

/// The forge `name` (the first this workspace may use when None), if `workspace_id` may use
/// it: a forge its `workspaces` leave out is, to that workspace, not there.
pub fn forge_for(state: &AppState, name: Option<&str>, workspace_id: &str) -> Option<Forge> {
    let first = state
        .config
        .forges()
        .into_iter()
        .find(|f| f.serves(workspace_id) && name.is_none_or(|n| f.name == n))?;
    forge(state, Some(&first.name))
}

/// The configured agent named `name` (the first when None).
pub fn agent(state: &AppState, name: Option<&str>) -> Option<AgentConfig> {
    let agents = state.config.agents();
    match name {
        None => agents.into_iter().next(),
        Some(n) => agents.into_iter().find(|a| a.name == n),
    }
}

/// A base branch name as given: something git could name, checked before any git runs.
fn check_branch(b: &str) -> Result<(), TaskError> {
    let ok = !b.is_empty()
        && b.len() <= 255
        && !b.starts_with(['-', '/', '.'])
        && !b.ends_with(['/', '.'])
        && !b.ends_with(".lock")
        && !b.contains("..")
        && !b.contains("//")
        && !b.contains("@{")
        && b.chars()
            .all(|c| !c.is_control() && !" ~^:?*[\\".contains(c));
    if ok {
        Ok(())
    } else {
        Err(TaskError::invalid(
            "base_branch",
            "base_branch is not a valid branch name",
        ))
    }
}

fn forge_error(e: ForgeError, repository: &str) -> TaskError {
    match e {
        ForgeError::NotFound(_) => TaskError::Repository(format!(
            "repository {repository} not found, or not readable by the forge"
        )),
        ForgeError::Refused(m) => TaskError::Forge(cella_tasks::failure::reason(
            cella_tasks::FailureKind::ForgeError,
            &m,
        )),
        ForgeError::Unreachable(m) => TaskError::Forge(cella_tasks::failure::reason(
            cella_tasks::FailureKind::ForgeError,
            &format!("the forge is unreachable: {m}"),
        )),
        ForgeError::Config(m) => {
            tracing::error!("forge configuration: {m}");
            TaskError::Forge("the forge is not configured correctly on this server".into())
        }
    }
}

/// `POST /api/v1/tasks`.
pub async fn create(
    state: &Arc<AppState>,
    auth: &Auth,
    req: CreateTask,
) -> Result<Task, TaskError> {
    // 1. The body.
    if req.task.is_empty() || req.task.len() > MAX_TASK_BYTES {
        return Err(TaskError::invalid(
            "task",
            format!("task must be 1 to {MAX_TASK_BYTES} bytes"),
        ));
    }
    if let Err(m) = RepoRef::parse(&req.repository, true) {
        return Err(TaskError::invalid("repository", m));
    }
    if let Some(b) = &req.base_branch {
        check_branch(b)?;
    }
    let metadata = req.metadata.clone().unwrap_or_default();
    crate::service::runnable::check_map("metadata", &metadata, false).map_err(|e| match e {
        crate::service::SandboxError::Invalid { field, message } => {
            TaskError::Invalid { field, message }
        }
        other => TaskError::invalid("metadata", other.to_string()),
    })?;
    // 2. The workspace's settings.
    let workspace = state
        .store
        .workspace(&auth.workspace_id)
        .await?
        .ok_or(TaskError::NotFound)?;
    let settings = &workspace.settings;
    if !settings.tasks_enabled {
        return Err(TaskError::Disabled);
    }
    // 3. The forge, 4. the agent, 5. a model for the built-in agent.
    let forge = forge_for(state, req.forge.as_deref(), &auth.workspace_id).ok_or_else(|| {
        TaskError::invalid(
            "forge",
            match &req.forge {
                Some(f) => format!("no forge named {f:?} is configured on this server"),
                None => "no forge is configured on this server".into(),
            },
        )
    })?;
    let agent = agent(state, req.agent.as_deref()).ok_or_else(|| {
        TaskError::invalid(
            "agent",
            format!(
                "no agent named {:?} is configured on this server",
                req.agent.as_deref().unwrap_or("")
            ),
        )
    })?;
    if agent.kind == AgentKind::Builtin && state.config.gateway.upstreams.is_empty() {
        return Err(TaskError::invalid(
            "agent",
            format!(
                "the built-in agent {:?} needs a model, and this server has no [[gateway.upstreams]] configured",
                agent.name
            ),
        ));
    }
    let repo = RepoRef::parse(&req.repository, forge.nested_names())
        .map_err(|m| TaskError::invalid("repository", m))?;
    // The run's worst case, checked before the forge is asked anything (a wallet that cannot
    // pay costs the forge and the host nothing); reserved for good below.
    let rate = settings.compute_rate;
    let session_limit_min = settings.session_limit_min.max(1);
    let worst = rate
        .saturating_mul(session_limit_min as i64 * 60)
        .saturating_add(state.config.gateway.reserve_per_run.max(Money::ZERO));
    if worst.micros() > 0 {
        let available = state.billing.available(&auth.workspace_id).await?;
        if available < worst {
            return Err(TaskError::InsufficientFunds {
                needed: worst,
                available,
            });
        }
    }
    // 6. The repository and its base branch, on the forge.
    let id = new_id("task");
    let access = forge
        .open(&repo)
        .await
        .map_err(|e| forge_error(e, &req.repository))?;
    let probe = HostGit::new(&host_dir(state, &format!("{id}-start")));
    let resolved = probe
        .resolve_base(&access, req.base_branch.as_deref())
        .await;
    probe.remove();
    forge.close(&access).await;
    let (base_branch, _base_sha) = resolved.map_err(|e| match e {
        GitError::BaseBranchMissing(b) => TaskError::Repository(format!(
            "the base branch {b} does not exist in {}",
            req.repository
        )),
        GitError::Unreachable(m) => TaskError::Forge(cella_tasks::failure::reason(
            cella_tasks::FailureKind::ForgeError,
            &format!("the remote is unreachable: {m}"),
        )),
        GitError::CloneFailed(m) | GitError::Io(m) | GitError::NotFound(m) => {
            tracing::info!(
                repository = req.repository,
                "reading a repository failed: {m}"
            );
            TaskError::Repository(format!(
                "repository {} not found, or not readable by the forge",
                req.repository
            ))
        }
        other => TaskError::Forge(other.to_string()),
    })?;
    // 7. The wallet: the run's worst case is reserved.
    let holder = Holder::Task(id.clone());
    if worst.micros() > 0 {
        match state
            .billing
            .reserve(&auth.workspace_id, &holder, worst)
            .await
        {
            Ok(()) => {}
            Err(cella_billing::BillingError::InsufficientFunds { available, .. }) => {
                return Err(TaskError::InsufficientFunds {
                    needed: worst,
                    available,
                })
            }
            Err(e) => return Err(e.into()),
        }
    }
    // 8. The row.
    let mut row = TaskRow::queued(
        id.clone(),
        auth.workspace_id.clone(),
        auth.user_id().unwrap_or(&auth.key_id).to_string(),
        req.repository.clone(),
        base_branch,
        format!("{}{id}", state.config.tasks.branch_prefix),
        forge.name().to_string(),
        agent.name.clone(),
        req.task,
        now_ms(),
    );
    row.compute_rate = rate;
    row.session_limit_min = session_limit_min;
    row.heartbeat_timeout_sec = settings.heartbeat_timeout_sec.max(1);
    row.metadata = metadata;
    if let Err(e) = state.store.insert_task(&row).await {
        if let Err(e) = state.billing.release(&holder).await {
            tracing::error!(task = id, "releasing a reservation: {e}");
        }
        return Err(e.into());
    }
    tracing::info!(
        task = id,
        workspace = row.workspace_id,
        repository = row.repository,
        "task run queued"
    );
    let row = state.store.task(&id).await?.ok_or(TaskError::NotFound)?;
    emit_state(state, &row);
    state.tasks.wake.notify_one();
    Ok(wire_all(state, std::slice::from_ref(&row)).await?.remove(0))
}

/// The caller's run `id` (404 for another workspace's).
pub async fn owned(state: &AppState, auth: &Auth, id: &str) -> Result<TaskRow, TaskError> {
    state
        .store
        .task(id)
        .await?
        .filter(|r| r.workspace_id == auth.workspace_id)
        .ok_or(TaskError::NotFound)
}

pub async fn get(state: &AppState, auth: &Auth, id: &str) -> Result<Task, TaskError> {
    let row = owned(state, auth, id).await?;
    Ok(wire_all(state, std::slice::from_ref(&row)).await?.remove(0))
}

/// The workspace's runs, newest first; the second value says whether more follow.
pub async fn list(
    state: &AppState,
    auth: &Auth,
    filter: TaskFilter,
) -> Result<(Vec<Task>, Option<i64>), TaskError> {
    let limit = filter.limit;
    let mut f = filter;
    f.workspace_id = auth.workspace_id.clone();
    f.limit = limit + 1;
    let mut rows = state.store.list_tasks(&f).await?;
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let next = more.then(|| rows.last().map(|r| r.seq)).flatten();
    Ok((wire_all(state, &rows).await?, next))
}

/// `POST /api/v1/tasks/{id}/cancel`: idempotent; a terminal run is answered as it is.
pub async fn cancel(state: &Arc<AppState>, auth: &Auth, id: &str) -> Result<Task, TaskError> {
    let row = owned(state, auth, id).await?;
    if !row.state.is_terminal() {
        if row.state == TaskState::Queued && cancel_queued(state, &row).await? {
            tracing::info!(task = id, "task run cancelled while queued");
        } else if let Some(live) = state.tasks.live(id) {
            live.cancel.cancel();
            // A run being provisioned stops at once; a running one once its work is pushed.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
                while state.tasks.live(id).is_some() {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            })
            .await;
        }
    }
    get(state, auth, id).await
}

/// `queued -> cancelled`: nothing charged, the reservation released, never started. False
/// when the runner took it first.
async fn cancel_queued(state: &AppState, row: &TaskRow) -> Result<bool, TaskError> {
    if !state.store.cancel_queued_task(&row.id, now_ms()).await? {
        return Ok(false);
    }
    state.billing.release(&Holder::Task(row.id.clone())).await?;
    state.store.settle_task(&row.id, Money::ZERO).await?;
    if let Some(r) = state.store.task(&row.id).await? {
        emit_state(state, &r);
    }
    Ok(true)
}

/// `GET /api/v1/tasks/{id}/events`: the current state, then every event of the run until a
/// terminal state.
pub async fn events(
    state: &Arc<AppState>,
    auth: &Auth,
    id: &str,
) -> Result<impl futures_util::Stream<Item = TaskEvent> + Send + 'static, TaskError> {
    // Subscribed before the row is read: nothing between the two is missed.
    let rx = state.tasks.events.subscribe();
    let row = owned(state, auth, id).await?;
    let first = super::state_event(&row);
    let done = row.state.is_terminal();
    let st = state.clone();
    let id = id.to_string();
    let init = (Some(first), rx, done, st, id);
    Ok(futures_util::stream::unfold(
        init,
        |(mut first, mut rx, done, st, id)| async move {
            if let Some(ev) = first.take() {
                return Some((ev, (None, rx, done, st, id)));
            }
            if done {
                return None;
            }
            loop {
                match rx.recv().await {
                    Ok((tid, ev)) if tid == id => {
                        let end =
                            matches!(&ev, TaskEvent::State { state, .. } if state.is_terminal());
                        return Some((ev, (None, rx, end, st, id)));
                    }
                    Ok(_) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        // Missed some: the state as stored now.
                        let row = st.store.task(&id).await.ok().flatten()?;
                        let end = row.state.is_terminal();
                        return Some((super::state_event(&row), (None, rx, end, st, id)));
                    }
                    Err(_) => return None,
                }
            }
        },
    ))
}

/// `GET /api/v1/tasks/{id}/log`: the agent's output while the run is alive (410 once it
/// ended). A run still queued is waited for on the run's own state events (the broadcast the
/// `events` stream reads, subscribed before the row is read, so its start is not missed): the
/// store is not polled. The stream ends when the run's live log closes (the run ended) or a
/// terminal state of the run is seen before it went live.
pub async fn log(
    state: &Arc<AppState>,
    auth: &Auth,
    id: &str,
) -> Result<impl futures_util::Stream<Item = super::LogLine> + Send + 'static, TaskError> {
    let events = state.tasks.events.subscribe();
    let row = owned(state, auth, id).await?;
    if row.state.is_terminal() {
        return Err(TaskError::Gone);
    }
    /// Waiting for the run to go live (its state events), or following its live log.
    enum Phase {
        Waiting(tokio::sync::broadcast::Receiver<(String, TaskEvent)>),
        Live(tokio::sync::broadcast::Receiver<super::LogLine>),
    }
    let init = (Phase::Waiting(events), state.clone(), id.to_string());
    Ok(futures_util::stream::unfold(
        init,
        |(mut phase, st, id)| async move {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                match &mut phase {
                    Phase::Waiting(events) => {
                        // Registered before it leaves `queued` and before its first event:
                        // looked for on every event of this run (and once at first).
                        if let Some(live) = st.tasks.live(&id) {
                            phase = Phase::Live(live.subscribe_log()?);
                            continue;
                        }
                        match events.recv().await {
                            Ok((tid, TaskEvent::State { state, .. })) if tid == id => {
                                if state.is_terminal() {
                                    return None;
                                }
                            }
                            Ok(_) => {}
                            // Missed some events (its end among them, perhaps): the row as
                            // stored now, read once; if alive, whether it is live is looked at
                            // again.
                            Err(RecvError::Lagged(_)) => {
                                if st.tasks.live(&id).is_none() {
                                    match st.store.task(&id).await.ok().flatten() {
                                        Some(r) if !r.state.is_terminal() => {}
                                        _ => return None,
                                    }
                                }
                            }
                            Err(RecvError::Closed) => return None,
                        }
                    }
                    Phase::Live(r) => match r.recv().await {
                        Ok(line) => return Some((line, (phase, st, id))),
                        Err(RecvError::Lagged(_)) => continue,
                        Err(RecvError::Closed) => return None,
                    },
                }
            }
        },
    ))
}
