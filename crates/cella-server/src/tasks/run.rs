//! One run, from `provisioning` to teardown (the flow of `crate::tasks`' module docs):
//! provisioning (the clone on the host and the internal sandbox's boot at once, then the checkout handed over), the
//! agent under its supervisor (`cella __task-agent`), watching for its end, the session
//! limit, heartbeats and cancel, then the hand-off (bundle, verify, push, draft pull request),
//! the end state, the charges and the teardown.

use super::{emit_state, host_dir, Live, LogLine};
use crate::service::Runnable;
use crate::util::{new_id, now_ms};
use crate::AppState;
use cella_agent::proto::{Request, Response};
use cella_billing::Holder;
use cella_runtime::Runtime;
use cella_store::{SandboxRow, TaskEnd, TaskRow};
use cella_tasks::failure::reason;
use cella_tasks::{
    Access, AgentConfig, AgentKind, Checkout, CheckoutCache, FailureKind, Forge, GitError, HostGit,
    RepoRef,
};
use cella_types::{
    Egress, ExecRequest, ExecUser, Money, NetworkPolicy, PullRequest, SandboxState, StopReason,
    TaskState,
};
use std::sync::Arc;
use std::time::Duration;

/// How long the commit-and-bundle step inside the sandbox may take.
const COLLECT_TIMEOUT_SEC: u32 = 300;
/// How long unpacking the checkout inside the sandbox may take.
const PREPARE_TIMEOUT_SEC: u32 = 300;
/// The largest bundle the server reads back.
const MAX_BUNDLE_BYTES: u64 = 2 << 30;
/// The directory under the data directory that holds the kept base checkouts.
pub const CHECKOUTS_DIR: &str = "checkouts";
/// A run longer than this gets a freshly minted forge credential for its push.
const FRESH_CREDENTIAL_AFTER_MS: i64 = 30 * 60 * 1000;
/// The sandbox user's uid.
const UID: u32 = crate::sandboxes::USER_UID;

/// Why the agent stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    Exited(i32),
    SessionLimit,
    HeartbeatLost,
    Cancelled,
    /// The sandbox or its agent failed under the run.
    Lost,
}

/// How a run ends, before the hand-off may change it.
struct Ending {
    state: TaskState,
    stop: StopReason,
    failure: Option<String>,
}

impl Ending {
    fn failed(kind: FailureKind, detail: &str) -> Ending {
        Ending {
            state: TaskState::Failed,
            stop: match kind {
                FailureKind::AgentExit => StopReason::AgentExit,
                FailureKind::HeartbeatLost => StopReason::HeartbeatLost,
                FailureKind::ServerRestart => StopReason::ServerRestart,
                _ => StopReason::Error,
            },
            failure: Some(reason(kind, detail)),
        }
    }

    fn cancelled() -> Ending {
        Ending {
            state: TaskState::Cancelled,
            stop: StopReason::Cancelled,
            failure: None,
        }
    }
}

/// What the run holds that teardown gives back.
#[derive(Default)]
struct Held {
    forge: Option<Forge>,
    access: Option<Access>,
    git: Option<HostGit>,
    checkout: Option<Checkout>,
    sandbox: Option<String>,
}

/// Runs the run `id` (claimed into `provisioning` by the runner) to its end.
pub async fn drive(state: &Arc<AppState>, id: &str, live: &Arc<Live>) {
    let Ok(Some(row)) = state.store.task(id).await else {
        tracing::error!(task = id, "a claimed run has no row");
        return;
    };
    let mut held = Held::default();
    let (ending, running_ms, pr) = match provision(state, &row, live, &mut held).await {
        Err(ending) => (ending, 0, None),
        Ok(started) => {
            let why = supervise(state, &row, live, &held, started).await;
            let running_ms = (now_ms() - started).max(0);
            let mut ending = match why {
                Why::Exited(0) => Ending {
                    state: TaskState::Stopped,
                    stop: StopReason::AgentExit,
                    failure: None,
                },
                Why::Exited(code) => {
                    Ending::failed(FailureKind::AgentExit, &format!("exit code {code}"))
                }
                Why::SessionLimit => Ending {
                    state: TaskState::Stopped,
                    stop: StopReason::SessionLimit,
                    failure: None,
                },
                Why::HeartbeatLost => Ending::failed(
                    FailureKind::HeartbeatLost,
                    &format!("no heartbeat for {} s", row.heartbeat_timeout_sec),
                ),
                Why::Cancelled => Ending::cancelled(),
                Why::Lost => Ending::failed(
                    FailureKind::ProvisionFailed,
                    "the run's sandbox stopped under it",
                ),
            };
            let compute_sec = (running_ms + 999) / 1000;
            let pr = match handoff(state, &row, live, &held, &ending, compute_sec, running_ms).await
            {
                Ok(pr) => pr,
                Err(failure) => {
                    // A hand-off that fails turns a good end into a failure; a cancel stays
                    // a cancel, an earlier failure keeps its reason.
                    if ending.state == TaskState::Stopped {
                        ending = Ending {
                            state: TaskState::Failed,
                            stop: StopReason::Error,
                            failure: Some(failure),
                        };
                    } else {
                        tracing::warn!(task = id, "handing the work back failed: {failure}");
                    }
                    None
                }
            };
            (ending, running_ms, pr)
        }
    };
    finish(state, &row, ending, running_ms, pr, held).await;
}

/// The end of a run: teardown (the sandbox, the forge's credential, the host directory), then
/// its terminal state (message cleared) and at once its charges, so that a client that sees
/// `stopped` finds nothing of the run left and (a moment later at most) its charge written.
async fn finish(
    state: &Arc<AppState>,
    row: &TaskRow,
    ending: Ending,
    running_ms: i64,
    pr: Option<PullRequest>,
    held: Held,
) {
    let end = TaskEnd {
        state: ending.state,
        failure_reason: ending.failure,
        stop_reason: Some(ending.stop),
        pull_request: pr,
        ended_at: now_ms(),
        running_ms,
        compute_sec: (running_ms + 999) / 1000,
    };
    if let Some(sb) = &held.sandbox {
        destroy_sandbox(state, sb).await;
    }
    if let (Some(f), Some(a)) = (&held.forge, &held.access) {
        f.close(a).await;
    }
    match &held.git {
        Some(g) => g.remove(),
        None => HostGit::new(&host_dir(state, &row.id)).remove(),
    }
    // Model charges the gateway queued for this run are written before the run's figures are.
    state.model_meter.flush().await;
    match state.store.end_task(&row.id, &end).await {
        Ok(true) => {}
        Ok(false) => tracing::warn!(task = row.id, "the run had ended already"),
        Err(e) => tracing::error!(task = row.id, "recording a run's end: {e}"),
    }
    cella_crash::crash_point!("task.settle.after_end");
    if let Ok(Some(r)) = state.store.task(&row.id).await {
        settle(state, &r).await;
    }
    tracing::info!(
        task = row.id,
        state = end.state.as_str(),
        stop_reason = end.stop_reason.map(|s| s.as_str()).unwrap_or(""),
        failure_reason = end.failure_reason.as_deref().unwrap_or(""),
        "task run ended"
    );
    if let Ok(Some(r)) = state.store.task(&row.id).await {
        emit_state(state, &r);
    }
}

/// A run whose task panicked: failed, `internal`, torn down as far as the row says.
pub async fn fail_internal(state: &Arc<AppState>, id: &str) {
    let Ok(Some(row)) = state.store.task(id).await else {
        return;
    };
    if !row.state.is_terminal() {
        let running_ms = row.started_at.map(|s| (now_ms() - s).max(0)).unwrap_or(0);
        let held = Held {
            sandbox: row.sandbox_id.clone(),
            ..Default::default()
        };
        finish(
            state,
            &row,
            Ending::failed(FailureKind::Internal, "the server failed while running it"),
            running_ms,
            None,
            held,
        )
        .await;
    }
}

/// Settles an ended run's compute, once: its one `compute` entry (at a rate of 0: none, the
/// reservation is released), then the row marked settled with the entry's amount.
pub async fn settle(state: &AppState, row: &TaskRow) {
    if row.settled || !row.state.is_terminal() {
        return;
    }
    let holder = Holder::Task(row.id.clone());
    let cost = if row.started_at.is_some() {
        cella_billing::compute_cost(row.compute_rate, row.running_ms)
    } else {
        Money::ZERO
    };
    let charged = if row.compute_rate.micros() <= 0 {
        state.billing.release(&holder).await.map(|_| Money::ZERO)
    } else {
        state
            .billing
            .settle(&cella_billing::Settlement {
                workspace_id: row.workspace_id.clone(),
                holder,
                cost,
                compute_sec: if cost.is_zero() {
                    0
                } else {
                    cella_billing::billed_seconds(row.running_ms)
                },
                running_ms: row.running_ms,
                rate: row.compute_rate,
            })
            .await
            .map(|e| {
                e.map(|e| Money::from_micros(-e.amount.micros()))
                    .unwrap_or(cost)
            })
    };
    match charged {
        Ok(c) => {
            if let Err(e) = state.store.settle_task(&row.id, c).await {
                tracing::error!(task = row.id, "recording a run's settlement: {e}");
            }
        }
        Err(e) => tracing::error!(task = row.id, "settling a run's compute: {e}"),
    }
}

/// Destroys a run's sandbox (idempotent), its gateway binding with it.
pub async fn destroy_sandbox(state: &AppState, sandbox_id: &str) {
    state.gateway.unbind_task(sandbox_id);
    match crate::sandboxes::destroy(state, sandbox_id, Some("its task run ended")).await {
        Ok(_) | Err(crate::service::SandboxError::NotFound(_)) => {}
        Err(e) => tracing::error!(sandbox = sandbox_id, "destroying a run's sandbox: {e}"),
    }
    if let Ok(Some(row)) = state.store.sandbox(sandbox_id).await {
        crate::billing::settle_logged(state, &row).await;
    }
}

fn cancelled(live: &Live) -> Result<(), Ending> {
    if live.cancel.is_cancelled() {
        Err(Ending::cancelled())
    } else {
        Ok(())
    }
}

/// Why `DATA_DIR/tools/cella` could not be made (kept for every run of this start, so cloned).
#[derive(Debug, Clone, thiserror::Error)]
pub enum ToolsError {
    #[error("the server's executable: {0}")]
    Exe(std::sync::Arc<std::io::Error>),
    #[error("{step} {path}: {source}")]
    Copy {
        step: &'static str,
        path: std::path::PathBuf,
        source: std::sync::Arc<std::io::Error>,
    },
    #[error("the copy task failed: {0}")]
    Join(String),
}

/// Makes sure `DATA_DIR/tools/cella` is this server's executable (copied once per start).
async fn tools(state: &AppState) -> Result<(), ToolsError> {
    if state.driver.name() == "fake" {
        return Ok(()); // the unit tests' driver binds nothing
    }
    state
        .tasks
        .tools
        .get_or_init(|| async {
            let dir = state.config.data_dir.join(crate::service::boot::TOOLS_DIR);
            let exe = std::env::current_exe().map_err(|e| ToolsError::Exe(e.into()))?;
            tokio::task::spawn_blocking(move || copy_tool(&exe, &dir))
                .await
                .map_err(|e| ToolsError::Join(e.to_string()))?
        })
        .await
        .clone()
}

fn copy_tool(exe: &std::path::Path, dir: &std::path::Path) -> Result<(), ToolsError> {
    use std::os::unix::fs::PermissionsExt;
    let at = |step: &'static str, path: &std::path::Path| {
        let path = path.to_path_buf();
        move |e: std::io::Error| ToolsError::Copy {
            step,
            path,
            source: e.into(),
        }
    };
    std::fs::create_dir_all(dir).map_err(at("making", dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
        .map_err(at("opening up", dir))?;
    let tmp = dir.join(".cella.part");
    std::fs::copy(exe, &tmp).map_err(at("copying the server's executable to", &tmp))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
        .map_err(at("making executable", &tmp))?;
    let to = dir.join("cella");
    std::fs::rename(&tmp, &to).map_err(at("moving into place", &to))
}

fn git_failure(e: GitError) -> Ending {
    match e {
        GitError::BaseBranchMissing(b) => Ending::failed(
            FailureKind::BaseBranchMissing,
            &format!("{b} does not exist"),
        ),
        GitError::TooLarge(n) => Ending::failed(
            FailureKind::CloneFailed,
            &format!("the repository is larger than {n} bytes ([tasks] max_repo_bytes)"),
        ),
        GitError::CloneFailed(m) => Ending::failed(FailureKind::CloneFailed, &m),
        GitError::PushRefused(m) => Ending::failed(FailureKind::PushRefused, &m),
        GitError::BadBundle(m) => Ending::failed(FailureKind::BadHandoff, &m),
        GitError::Io(m) => Ending::failed(FailureKind::Internal, &format!("git: {m}")),
        GitError::NotFound(m) => Ending::failed(FailureKind::CloneFailed, &m),
        GitError::Unreachable(m) => Ending::failed(
            FailureKind::ForgeError,
            &format!("the remote is unreachable: {m}"),
        ),
    }
}

/// The kept base checkouts (`[tasks] checkout_cache`; `cella_tasks::cache`).
pub fn checkout_cache(state: &AppState) -> CheckoutCache {
    let t = &state.config.tasks;
    CheckoutCache::new(
        &state.config.data_dir.join(CHECKOUTS_DIR),
        t.checkout_cache_bytes,
        Duration::from_secs(t.checkout_cache_hours.saturating_mul(3600)),
    )
}

/// The host's bare clone of the run's base branch, and whether it came from a kept checkout.
/// Where the cache covers the forge's remote, the branch's tip is asked of the forge (with
/// the run's credential) and a kept checkout of that commit of this repository is linked
/// instead of cloned; a clone is kept for the runs after it.
async fn base_checkout(
    state: &AppState,
    row: &TaskRow,
    git: &HostGit,
    access: &Access,
) -> Result<(Checkout, bool), Ending> {
    let max = state.config.tasks.max_repo_bytes;
    let local = access.clone_url.starts_with('/');
    if !state.config.tasks.checkout_cache.covers(local) {
        let co = git
            .clone_base(access, Some(&row.base_branch), max)
            .await
            .map_err(git_failure)?;
        return Ok((co, false));
    }
    let (branch, sha) = git
        .resolve_base(access, Some(&row.base_branch))
        .await
        .map_err(git_failure)?;
    let cache = checkout_cache(state);
    let key = cella_tasks::cache::Key::new(&row.forge, &row.repository, &sha, local);
    if let Some(key) = &key {
        let found = {
            let (cache, key) = (cache.clone(), key.clone());
            tokio::task::spawn_blocking(move || cache.get(&key))
                .await
                .ok()
                .flatten()
        };
        if let Some(entry) = found.filter(|e| e.bytes <= max) {
            match git.from_cache(&entry.dir, &branch, &sha).await {
                Ok(co) => return Ok((co, true)),
                Err(e) => {
                    // A kept checkout that does not serve is dropped: the run clones.
                    tracing::warn!(task = row.id, "a kept checkout did not serve: {e}");
                    let (cache, key) = (cache.clone(), key.clone());
                    let _ = tokio::task::spawn_blocking(move || cache.forget(&key)).await;
                }
            }
        }
    }
    let co = git
        .clone_base(access, Some(&branch), max)
        .await
        .map_err(git_failure)?;
    // Kept under the commit the clone holds (the branch may have moved since the tip above).
    let key = cella_tasks::cache::Key::new(&row.forge, &row.repository, &co.base_sha, local);
    if let Some(key) = key {
        let dir = co.git_dir.clone();
        match tokio::task::spawn_blocking(move || cache.put(&dir, &key)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(task = row.id, "keeping a checkout: {e}"),
            Err(e) => tracing::warn!(task = row.id, "keeping a checkout: {e}"),
        }
    }
    Ok((co, false))
}

/// Provisioning, up to `running`: the time it started running.
async fn provision(
    state: &Arc<AppState>,
    row: &TaskRow,
    live: &Arc<Live>,
    held: &mut Held,
) -> Result<i64, Ending> {
    let Some(forge) = super::service::forge(state, Some(&row.forge)) else {
        return Err(Ending::failed(
            FailureKind::ForgeError,
            &format!("the forge {} is no longer configured", row.forge),
        ));
    };
    let Some(agent) = super::service::agent(state, Some(&row.agent)) else {
        return Err(Ending::failed(
            FailureKind::ProvisionFailed,
            &format!("the agent {} is no longer configured", row.agent),
        ));
    };
    let repo = RepoRef::parse(&row.repository, forge.nested_names())
        .map_err(|m| Ending::failed(FailureKind::CloneFailed, &m))?;
    let access = forge.open(&repo).await.map_err(|e| match e {
        cella_tasks::ForgeError::NotFound(r) => {
            Ending::failed(FailureKind::CloneFailed, &format!("{r} is not readable"))
        }
        other => Ending::failed(FailureKind::ForgeError, &other.to_string()),
    })?;
    held.forge = Some(forge);
    held.access = Some(access.clone());
    cancelled(live)?;
    let git = HostGit::new(&host_dir(state, &row.id));
    held.git = Some(git.clone());
    // The sandbox: its id recorded on the run first, so a crash from here on finds it.
    let sandbox_id = new_id("sb");
    if let Err(e) = state.store.set_task_sandbox(&row.id, &sandbox_id).await {
        return Err(Ending::failed(
            FailureKind::Internal,
            &format!("store: {e}"),
        ));
    }
    held.sandbox = Some(sandbox_id.clone());
    cella_crash::crash_point!("task.provision.after_sandbox_id");
    if let Ok(mut s) = live.sandbox_id.lock() {
        *s = Some(sandbox_id.clone());
    }
    // What the sandbox will see of the clone, at `SANDBOX_BASE`: made before it boots.
    git.make_share_dir().map_err(git_failure)?;
    // The clone (on the host) and the sandbox's boot at once: neither needs the other until
    // the checkout is handed in. Both are run to their end (never dropped half-way, which
    // would leave a half-made sandbox), then the first failure is the run's.
    let began = std::time::Instant::now();
    let cloned = async {
        let t = std::time::Instant::now();
        let (checkout, kept) = base_checkout(state, row, &git, &access).await?;
        let shared = git.share(&checkout).await.map_err(git_failure);
        Ok::<_, Ending>((checkout, shared, kept, t.elapsed()))
    };
    let booted = async {
        tools(state).await.map_err(|e| {
            tracing::error!(task = row.id, "the task runs' tools directory: {e}");
            Ending::failed(
                FailureKind::ProvisionFailed,
                "the server could not make its executable ready for the sandbox",
            )
        })?;
        let t = std::time::Instant::now();
        boot_sandbox(state, row, &agent, &sandbox_id)
            .await
            .map(|sb| (sb, t.elapsed()))
    };
    let (cloned, booted) = tokio::join!(cloned, booted);
    let (checkout, shared, kept, clone_took) = cloned?;
    let base_sha = checkout.base_sha.clone();
    let base_branch = checkout.base_branch.clone();
    held.checkout = Some(checkout);
    shared?;
    let (sb, boot_took) = booted?;
    let handed = std::time::Instant::now();
    cancelled(live)?;
    let runnable = Runnable::of(state, sb)
        .map_err(|e| Ending::failed(FailureKind::ProvisionFailed, &e.to_string()))?;
    // The checkout: made by the sandbox's user from the objects shared with it.
    let client = runnable.agent(state);
    for dir in [cella_tasks::git::SANDBOX_CHECKOUT, "/task"] {
        client
            .call(&Request::Mkdir {
                path: dir.to_string(),
                uid: UID,
                gid: UID,
            })
            .await
            .map_err(|e| {
                Ending::failed(
                    FailureKind::ProvisionFailed,
                    &format!("making {dir} in the sandbox: {e}"),
                )
            })?;
    }
    let prep = exec(
        state,
        &runnable,
        cella_tasks::git::sandbox_prepare(&base_branch, &base_sha, &row.branch),
        "/",
        PREPARE_TIMEOUT_SEC,
    )
    .await?;
    if prep.exit_code != 0 {
        return Err(Ending::failed(
            FailureKind::ProvisionFailed,
            &format!("checking out the branch exited with {}", prep.exit_code),
        ));
    }
    let message = row.message.clone().unwrap_or_default();
    write_file(&client, "/task/TASK.md", message.into_bytes()).await?;
    cancelled(live)?;
    let started = now_ms();
    match state.store.task_running(&row.id, started).await {
        Ok(true) => {}
        Ok(false) => return Err(Ending::cancelled()),
        Err(e) => {
            return Err(Ending::failed(
                FailureKind::Internal,
                &format!("store: {e}"),
            ))
        }
    }
    live.beat();
    if let Ok(Some(r)) = state.store.task(&row.id).await {
        emit_state(state, &r);
    }
    tracing::info!(
        task = row.id,
        sandbox = sandbox_id,
        clone_ms = clone_took.as_millis() as u64,
        checkout = if kept { "kept" } else { "cloned" },
        boot_ms = boot_took.as_millis() as u64,
        hand_in_ms = handed.elapsed().as_millis() as u64,
        provisioning_ms = began.elapsed().as_millis() as u64,
        "task run running"
    );
    Ok(started)
}

/// Boots the run's internal sandbox (see the module docs of `crate::tasks`).
async fn boot_sandbox(
    state: &Arc<AppState>,
    row: &TaskRow,
    agent: &AgentConfig,
    sandbox_id: &str,
) -> Result<SandboxRow, Ending> {
    let template = state
        .catalog
        .visible(&agent.template, &row.workspace_id)
        .ok_or_else(|| {
            Ending::failed(
                FailureKind::ProvisionFailed,
                &format!("the agent's template {} does not exist", agent.template),
            )
        })?;
    let size = template.default_size;
    let (cpus, mem, disk) = size.shape();
    // The workspace's `task_runtime` as it is now.
    let runtime = match state.store.workspace(&row.workspace_id).await {
        Ok(Some(w)) => w.settings.task_runtime.as_deref().and_then(Runtime::parse),
        _ => None,
    }
    .unwrap_or_default();
    if !state.catalog.runtimes_of(&template).contains(&runtime) {
        return Err(Ending::failed(
            FailureKind::ProvisionFailed,
            &format!(
                "the workspace's task_runtime {runtime} is not available for the agent's template {} on this server",
                agent.template
            ),
        ));
    }
    let sb = SandboxRow {
        owner_id: row.id.clone(),
        timeout_sec: crate::sandboxes::MAX_TIMEOUT_SEC as i64,
        always_on: true,
        persistent: false,
        idle_timeout_sec: 0,
        compute_rate: Money::ZERO,
        network: NetworkPolicy {
            egress: Egress::Deny,
            allow: agent.egress.clone(),
            deny: Vec::new(),
        },
        preview_public: false,
        auto_resume: false,
        isolation: runtime.as_str().to_string(),
        ..SandboxRow::new(
            sandbox_id.to_string(),
            cella_store::TASKS_WORKSPACE.to_string(),
            template.id.clone(),
            size,
            (cpus, mem, disk),
            now_ms(),
        )
    };
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        Ending::failed(FailureKind::ProvisionFailed, &format!("{what}: {e}"))
    };
    match state.store.insert_sandbox_capped(&sb, u32::MAX).await {
        Ok(true) => {}
        Ok(false) => return Err(fail("making the sandbox", &"refused")),
        Err(e) => return Err(fail("making the sandbox", &e)),
    }
    // Model access billed to the run's workspace; its requests are the run's.
    if state.network.is_some() {
        if let Err(e) = state
            .store
            .set_model_access(sandbox_id, &row.workspace_id, now_ms())
            .await
        {
            return Err(fail("giving it model access", &e));
        }
        let budget = state.config.gateway.reserve_per_run.max(Money::ZERO);
        state.gateway.bind_task(sandbox_id, &row.id, budget);
    }
    crate::sandboxes::boot(state, sandbox_id).await;
    let sb = state
        .store
        .sandbox(sandbox_id)
        .await
        .map_err(|e| fail("reading the sandbox", &e))?
        .ok_or_else(|| fail("the sandbox", &"vanished"))?;
    if crate::sandboxes::state_of(&sb) != SandboxState::Running {
        return Err(fail(
            "the sandbox did not start",
            &sb.state_reason.clone().unwrap_or_default(),
        ));
    }
    Ok(sb)
}

async fn write_file(
    client: &cella_agent::client::AgentClient,
    path: &str,
    bytes: Vec<u8>,
) -> Result<(), Ending> {
    let len = bytes.len() as u64;
    let chunks = futures_util::stream::iter(vec![Ok::<_, std::io::Error>(bytes)]);
    client
        .write_file(path, UID, UID, 0o600, len.max(1), chunks)
        .await
        .map(|_| ())
        .map_err(|e| {
            let m = match e {
                cella_agent::client::WriteError::TooLarge => "too large".to_string(),
                cella_agent::client::WriteError::Source(e) => e.to_string(),
                cella_agent::client::WriteError::Agent(e) => e.to_string(),
            };
            Ending::failed(
                FailureKind::ProvisionFailed,
                &format!("writing {path} into the sandbox: {m}"),
            )
        })
}

/// Runs `argv` as the sandbox's user to its end.
async fn exec(
    state: &AppState,
    runnable: &Runnable,
    argv: Vec<String>,
    cwd: &str,
    timeout_sec: u32,
) -> Result<cella_types::ExecResult, Ending> {
    let req = ExecRequest {
        argv: Some(argv),
        cwd: Some(cwd.to_string()),
        user: Some(ExecUser::User),
        timeout_sec: Some(timeout_sec),
        ..Default::default()
    };
    crate::sandboxes::exec(state, runnable, req)
        .await
        .map_err(|e| Ending::failed(FailureKind::ProvisionFailed, &e.to_string()))
}

/// The supervisor's argv and environment.
fn agent_command(
    state: &AppState,
    row: &TaskRow,
    agent: &AgentConfig,
    base_sha: &str,
    sandbox_id: &str,
) -> (Vec<String>, std::collections::BTreeMap<String, String>) {
    let exe = format!("{}/cella", crate::service::boot::TOOLS_MOUNT);
    let mut argv = vec![exe, "__task-agent".to_string()];
    if agent.kind == AgentKind::Command {
        argv.push("--".into());
        argv.extend(agent.command.iter().cloned());
    }
    let gw = state.gateway.env_of(sandbox_id);
    let heartbeat_url = gw
        .get("OPENAI_BASE_URL")
        .and_then(|u| u.strip_suffix("/openai/v1"))
        .map(|b| format!("{b}/tasks/heartbeat"))
        .unwrap_or_default();
    let model = agent.model.clone().or_else(|| {
        state
            .config
            .gateway
            .upstreams
            .first()
            .and_then(|u| u.models.first().cloned())
    });
    let mut env: std::collections::BTreeMap<String, String> = [
        ("CELLA_TASK", row.message.clone().unwrap_or_default()),
        ("CELLA_TASK_ID", row.id.clone()),
        ("CELLA_HEARTBEAT_URL", heartbeat_url),
        (
            "CELLA_HEARTBEAT_SEC",
            state.config.tasks.heartbeat_interval_sec.to_string(),
        ),
        (
            "CELLA_AGENT_KIND",
            match agent.kind {
                AgentKind::Builtin => "builtin",
                AgentKind::Command => "command",
            }
            .to_string(),
        ),
        ("CELLA_MAX_STEPS", agent.max_steps.to_string()),
        ("CELLA_BASE_SHA", base_sha.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if let Some(m) = model {
        env.insert("CELLA_MODEL".into(), m);
    }
    (argv, env)
}

/// Starts the agent and waits for its end: its exit, the session limit, lost heartbeats, a
/// cancel, or its sandbox failing.
async fn supervise(
    state: &Arc<AppState>,
    row: &TaskRow,
    live: &Arc<Live>,
    held: &Held,
    started: i64,
) -> Why {
    let (Some(sandbox_id), Some(checkout)) = (&held.sandbox, &held.checkout) else {
        return Why::Lost;
    };
    let Some(agent) = super::service::agent(state, Some(&row.agent)) else {
        return Why::Lost;
    };
    let Ok(Some(sb)) = state.store.sandbox(sandbox_id).await else {
        return Why::Lost;
    };
    let Ok(runnable) = Runnable::of(state, sb) else {
        return Why::Lost;
    };
    let (argv, env) = agent_command(state, row, &agent, &checkout.base_sha, sandbox_id);
    let spec = match runnable.spec(
        ExecRequest {
            argv: Some(argv),
            env: Some(env),
            cwd: Some(cella_tasks::git::SANDBOX_CHECKOUT.to_string()),
            user: Some(ExecUser::User),
            timeout_sec: Some(crate::sandboxes::MAX_TIMEOUT_SEC),
            ..Default::default()
        },
        None,
    ) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(task = row.id, "the agent's command: {e}");
            return Why::Lost;
        }
    };
    let client = runnable.agent(state);
    let pid = match client
        .call(&Request::Spawn {
            spec,
            tag: Some("task-agent".into()),
        })
        .await
    {
        Ok(Response::Started { pid }) => pid,
        Ok(_) | Err(_) => {
            tracing::error!(task = row.id, "the task agent did not start");
            return Why::Lost;
        }
    };
    // Its output into the live log (never stored, never logged).
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let follower = {
        let client = client.clone();
        tokio::spawn(async move { client.follow(pid, true, tx).await })
    };
    let pump = {
        let live = live.clone();
        tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                let (stream, bytes) = match ev {
                    cella_runtime::ExecEvent::Stdout(b) => ("stdout", b),
                    cella_runtime::ExecEvent::Stderr(b) => ("stderr", b),
                };
                live.send_log(LogLine {
                    stream,
                    text: String::from_utf8_lossy(&bytes).into_owned(),
                });
            }
        })
    };
    let limit = Duration::from_secs(row.session_limit_min as u64 * 60);
    let elapsed = Duration::from_millis((now_ms() - started).max(0) as u64);
    let deadline = tokio::time::Instant::now() + limit.saturating_sub(elapsed);
    let timeout = Duration::from_secs(row.heartbeat_timeout_sec.max(1) as u64);
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut follower = follower;
    let why = loop {
        tokio::select! {
            r = &mut follower => {
                break match r {
                    Ok(Ok(Some(exit))) => Why::Exited(exit.exit_code),
                    _ => Why::Lost,
                };
            }
            _ = live.cancel.cancelled() => break Why::Cancelled,
            _ = tokio::time::sleep_until(deadline) => break Why::SessionLimit,
            _ = tick.tick() => {
                if live.since_heartbeat() > timeout {
                    break Why::HeartbeatLost;
                }
            }
        }
    };
    match why {
        Why::Cancelled | Why::SessionLimit => {
            let _ = signal(&client, pid, libc::SIGTERM).await;
            let grace = Duration::from_secs(state.config.tasks.grace_sec);
            if tokio::time::timeout(grace, &mut follower).await.is_err() {
                let _ = signal(&client, pid, libc::SIGKILL).await;
                let _ = tokio::time::timeout(Duration::from_secs(10), &mut follower).await;
            }
        }
        Why::HeartbeatLost => {
            // A frozen supervisor cannot take SIGTERM; SIGKILL ends it even stopped.
            let _ = signal(&client, pid, libc::SIGKILL).await;
            let _ = tokio::time::timeout(Duration::from_secs(10), &mut follower).await;
        }
        _ => {}
    }
    follower.abort();
    let _ = tokio::time::timeout(Duration::from_secs(2), pump).await;
    why
}

async fn signal(
    client: &cella_agent::client::AgentClient,
    pid: i32,
    signal: i32,
) -> Result<(), ()> {
    match client.call(&Request::Signal { pid, signal }).await {
        Ok(_) => Ok(()),
        Err(_) => Err(()),
    }
}

/// Commits what is uncommitted, takes the branch back as a bundle, verifies and pushes it, and
/// opens the draft pull request. `Err` is the failure reason of a hand-off that failed.
async fn handoff(
    state: &Arc<AppState>,
    row: &TaskRow,
    live: &Arc<Live>,
    held: &Held,
    ending: &Ending,
    compute_sec: i64,
    running_ms: i64,
) -> Result<Option<PullRequest>, String> {
    let (Some(sandbox_id), Some(checkout), Some(git), Some(forge), Some(access)) = (
        &held.sandbox,
        &held.checkout,
        &held.git,
        &held.forge,
        &held.access,
    ) else {
        return Ok(None);
    };
    let bad = |kind: FailureKind, m: &str| reason(kind, m);
    let sb = match state.store.sandbox(sandbox_id).await {
        Ok(Some(sb)) => sb,
        _ => return Err(bad(FailureKind::BadHandoff, "the run's sandbox is gone")),
    };
    let runnable = Runnable::of(state, sb)
        .map_err(|e| bad(FailureKind::BadHandoff, &format!("the sandbox: {e}")))?;
    // Nothing the agent left behind (a `setsid` loop, a stopped process) may run on while the
    // branch is collected and handed off: every process of the sandbox's user is killed first.
    if let Err(e) = exec(
        state,
        &runnable,
        vec![
            "sh".into(),
            "-c".into(),
            "kill -KILL -1 2>/dev/null; exit 0".into(),
        ],
        "/",
        30,
    )
    .await
    {
        tracing::warn!(
            task = row.id,
            "stopping the agent's leftovers: {:?}",
            e.failure
        );
    }
    let message = format!("Cella task run {}: work in progress", row.id);
    let collect = exec(
        state,
        &runnable,
        cella_tasks::git::sandbox_collect(&checkout.base_sha, &row.branch, &message),
        "/",
        COLLECT_TIMEOUT_SEC,
    )
    .await
    .map_err(|e| e.failure.unwrap_or_default())?;
    if collect.exit_code != 0 {
        return Err(bad(
            FailureKind::BadHandoff,
            &format!("collecting the branch exited with {}", collect.exit_code),
        ));
    }
    // The bundle, read out (none: no new commits).
    let client = runnable.agent(state);
    let cap = MAX_BUNDLE_BYTES.min(state.config.tasks.max_repo_bytes);
    let mut reader = match client
        .read_file_with(
            cella_tasks::git::SANDBOX_BUNDLE,
            0,
            Some(cap.saturating_add(1)),
            true,
        )
        .await
    {
        Ok(r) => r,
        Err(cella_agent::client::ClientError::Refused {
            kind: cella_agent::proto::ErrorKind::NotFound,
            ..
        }) => return Ok(None),
        Err(e) => {
            return Err(bad(
                FailureKind::BadHandoff,
                &format!("reading the bundle: {e}"),
            ))
        }
    };
    // Asked for no more than one byte past the cap; refused at once when it says it is
    // larger, else streamed to a file of the run's directory a chunk at a time, stopping as
    // soon as the cap is passed (never held whole in memory).
    let too_large = || {
        bad(
            FailureKind::BadHandoff,
            &format!("the bundle is larger than {cap} bytes ([tasks] max_repo_bytes)"),
        )
    };
    if reader.size > cap {
        return Err(too_large());
    }
    let bundle_path = git.work.join("branch.bundle");
    let _ = tokio::fs::remove_file(&bundle_path).await;
    let chunks = Box::pin(futures_util::stream::unfold(&mut reader, |r| async move {
        r.next_chunk().await.map(|c| (c, r))
    }));
    match cella_tasks::git::write_capped(chunks, &bundle_path, cap).await {
        Ok(_) => {}
        Err(GitError::TooLarge(_)) => return Err(too_large()),
        Err(GitError::BadBundle(m)) => {
            return Err(bad(
                FailureKind::BadHandoff,
                &format!("reading the bundle: {m}"),
            ))
        }
        Err(e) => return Err(bad(FailureKind::Internal, &e.to_string())),
    }
    drop(reader);
    let tip = git
        .receive_bundle(checkout, &bundle_path, &row.branch)
        .await
        .map_err(|e| git_failure(e).failure.unwrap_or_default())?;
    if tip.is_none() {
        return Ok(None);
    }
    // A credential minted at provisioning may have expired over a long run (a GitHub App's
    // lasts an hour): after half an hour the push and the pull request use a fresh one,
    // revoked after. A shorter run keeps its own (no extra round trips to the forge).
    let fresh = if running_ms > FRESH_CREDENTIAL_AFTER_MS && access.credential.is_some() {
        match forge.open(&access.repo).await {
            Ok(a) => Some(a),
            Err(e) => {
                tracing::warn!(
                    task = row.id,
                    "a fresh forge credential: {e}; using the run's"
                );
                None
            }
        }
    } else {
        None
    };
    let result = push_and_open(
        state,
        row,
        live,
        forge,
        fresh.as_ref().unwrap_or(access),
        checkout,
        git,
        ending,
        compute_sec,
        running_ms,
    )
    .await;
    if let Some(a) = &fresh {
        forge.close(a).await;
    }
    result
}

/// Pushes the run's branch with `access` and opens the draft pull request.
#[allow(clippy::too_many_arguments)]
async fn push_and_open(
    state: &Arc<AppState>,
    row: &TaskRow,
    live: &Arc<Live>,
    forge: &cella_tasks::Forge,
    access: &cella_tasks::Access,
    checkout: &cella_tasks::Checkout,
    git: &HostGit,
    ending: &Ending,
    compute_sec: i64,
    running_ms: i64,
) -> Result<Option<PullRequest>, String> {
    let bad = |kind: FailureKind, m: &str| reason(kind, m);
    git.push(checkout, access, &row.branch)
        .await
        .map_err(|e| git_failure(e).failure.unwrap_or_default())?;
    tracing::info!(
        task = row.id,
        branch = row.branch,
        "task run's branch pushed"
    );
    cella_crash::crash_point!("task.push.after_push");
    // The gateway writes model charges in groups: the ones already queued count in the body.
    state.model_meter.flush().await;
    let (model_cost, model_requests) = state
        .billing
        .task_model_costs(&[row.id.as_str()])
        .await
        .ok()
        .and_then(|m| m.get(&row.id).copied())
        .unwrap_or((Money::ZERO, 0));
    let commits = live.progress.lock().map(|p| p.commits).unwrap_or(0);
    let message = row.message.clone().unwrap_or_default();
    let summary = cella_tasks::body::RunSummary {
        task_id: &row.id,
        task: &message,
        agent: &row.agent,
        stop_reason: ending.stop,
        failure_reason: ending.failure.as_deref(),
        compute_sec,
        compute_cost: cella_billing::compute_cost(row.compute_rate, running_ms),
        model_cost,
        model_requests,
        commits,
    };
    let spec = cella_tasks::body::pull_request(&summary, &row.branch, &row.base_branch);
    forge
        .open_pull_request(access, &spec)
        .await
        .map_err(|e| bad(FailureKind::ForgeError, &e.to_string()))
}
