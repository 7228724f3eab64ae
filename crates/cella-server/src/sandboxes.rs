//! The sandbox service: what create, destroy and exec do, apart from HTTP.

use crate::auth::Auth;
use crate::error::ApiError;
use crate::util::{new_id, now_ms, rfc3339};
use crate::AppState;
pub(crate) use cella_runtime::rootfs::USER_UID;
use cella_runtime::{
    base_env, DriverError, ExecEvent, ExecSpec, Probe, SandboxHandle, SandboxSpec,
};
use cella_store::SandboxRow;
use cella_types::{
    CreateSandbox, ErrorCode, ExecRequest, ExecResult, ExecUser, Readiness, Sandbox, SandboxState,
    Size,
};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, OwnedMutexGuard};

/// Workspaces made on or after 2026-10-11 (UTC) get a 30-minute idle timeout when none is given.
const IDLE_DEFAULT_FROM_MS: i64 = 1_791_676_800_000;
const IDLE_DEFAULT_SEC: u32 = 1800;
pub(crate) const DEFAULT_TIMEOUT_SEC: u32 = 3600;
const MAX_TIMEOUT_SEC: u32 = 86_400;
const DEFAULT_TEMPLATE: &str = "base";
const MAX_METADATA: usize = 64;

/// One lock per sandbox, so boot, destroy and state changes never interleave.
#[derive(Default)]
pub struct Locks {
    inner: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Locks {
    pub async fn lock(&self, id: &str) -> OwnedMutexGuard<()> {
        let m = self
            .inner
            .lock()
            .expect("locks")
            .entry(id.to_string())
            .or_default()
            .clone();
        m.lock_owned().await
    }
}

pub fn state_of(row: &SandboxRow) -> SandboxState {
    row.state
}

pub fn to_wire(row: &SandboxRow) -> Sandbox {
    let size: Size = row.size;
    let state = state_of(row);
    let now = now_ms();
    let timeout_remaining_ms = match (state, row.always_on, row.timeout_at) {
        (SandboxState::Running, false, Some(at)) => Some((at - now).max(0)),
        _ => None,
    };
    Sandbox {
        id: row.id.clone(),
        tenant_id: row.workspace_id.clone(),
        owner_id: row.owner_id.clone(),
        template_id: crate::catalog::public_id(&row.template_id).to_string(),
        state,
        size,
        resource_contract: size.contract(),
        cpu_count: row.cpu_count as u32,
        memory_mb: row.memory_mb as u32,
        disk_size_mb: row.disk_size_mb as u32,
        ready: row.ready,
        ready_at: row.ready_at.map(rfc3339),
        preview_url: (!state.is_terminal())
            .then(|| crate::preview::sandbox_base(&row.id))
            .flatten(),
        timeout_sec: row.timeout_sec as u32,
        timeout_remaining_ms,
        always_on: row.always_on,
        persistent: row.persistent,
        idle_timeout_sec: row.idle_timeout_sec as u32,
        total_runtime_sec: row.total_runtime_sec,
        metadata: row.metadata.clone(),
        created_at: rfc3339(row.created_at),
        started_at: row.started_at.map(rfc3339),
        destroyed_at: row.destroyed_at.map(rfc3339),
        state_reason: row.state_reason.clone(),
        network: row.network.clone(),
        preview: cella_types::PreviewSettings {
            public: row.preview_public,
        },
        auto_resume: row.auto_resume,
    }
}

pub(crate) fn handle_of(row: &SandboxRow) -> Option<SandboxHandle> {
    row.runtime
        .as_deref()
        .and_then(|r| serde_json::from_str(r).ok())
}

/// Stops the running-time clock of a row (when it runs) at `now`.
pub(crate) fn stop_clock(row: &mut SandboxRow, now: i64) {
    if let Some(since) = row.running_since.take() {
        row.running_ms += (now - since).max(0);
    }
}

pub(crate) fn check_map(
    field: &str,
    m: &BTreeMap<String, String>,
    env: bool,
) -> Result<(), ApiError> {
    if m.len() > MAX_METADATA {
        return Err(ApiError::invalid(
            field,
            format!("{field} takes at most {MAX_METADATA} entries"),
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
            return Err(ApiError::invalid(
                &format!("{field}.{k}"),
                format!("{field} key {k:?} is not valid"),
            ));
        }
        if v.contains('\0') || (!env && v.len() > 512) {
            return Err(ApiError::invalid(
                &format!("{field}.{k}"),
                format!("{field} value for {k:?} is not valid"),
            ));
        }
    }
    Ok(())
}

/// Checks a create request and turns it into a new row (not yet stored).
/// The caller's sandbox `id` (404 for another workspace's, and for the pool's).
pub(crate) async fn owned(state: &AppState, auth: &Auth, id: &str) -> Result<SandboxRow, ApiError> {
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
        .ok_or_else(|| ApiError::not_found("sandbox"))
}

/// The caller's workspace and its plan's cap on concurrent sandboxes.
pub(crate) async fn workspace_cap(
    state: &AppState,
    auth: &Auth,
) -> Result<(cella_store::WorkspaceRow, u32), ApiError> {
    let workspace = state
        .store
        .workspace(&auth.workspace_id)
        .await?
        .ok_or_else(ApiError::internal)?;
    let cap = cella_types::Plan::parse(&workspace.plan)
        .unwrap_or(cella_types::Plan::Developer)
        .concurrency_cap();
    Ok((workspace, cap))
}

async fn admit(
    state: &AppState,
    auth: &Auth,
    req: &CreateSandbox,
    workspace: &cella_store::WorkspaceRow,
) -> Result<SandboxRow, ApiError> {
    let snapshot = match &req.snapshot_id {
        None => None,
        Some(sid) => {
            let snap = state
                .store
                .snapshot(sid)
                .await?
                .filter(|s| s.workspace_id == auth.workspace_id && !s.internal)
                .ok_or_else(|| ApiError::not_found("snapshot"))?;
            if req.template_id.as_ref().is_some_and(|t| {
                state.catalog.visible(t, &auth.workspace_id).map(|e| e.id)
                    != Some(snap.template_id.clone())
            }) {
                return Err(ApiError::invalid(
                    "template_id",
                    format!(
                        "snapshot {sid} is of template {}; leave template_id out or give that one",
                        crate::catalog::public_id(&snap.template_id)
                    ),
                ));
            }
            Some(snap)
        }
    };
    let template_id = match &snapshot {
        Some(s) => s.template_id.clone(),
        None => req
            .template_id
            .clone()
            .unwrap_or_else(|| DEFAULT_TEMPLATE.to_string()),
    };
    let template = match &snapshot {
        // A snapshot records the template's key.
        Some(_) => state.catalog.get(&template_id).filter(|t| {
            t.workspace_id
                .as_deref()
                .is_none_or(|w| w == auth.workspace_id)
        }),
        None => state.catalog.visible(&template_id, &auth.workspace_id),
    }
    .ok_or_else(|| ApiError::not_found("template"))?;
    let template = &template;
    let compat = [
        ("cpu_count", req.cpu_count),
        ("memory_mb", req.memory_mb),
        ("disk_size_mb", req.disk_size_mb),
    ];
    let size = if compat.iter().any(|(_, v)| v.is_some()) {
        if let Some((missing, _)) = compat.iter().find(|(_, v)| v.is_none()) {
            return Err(ApiError::invalid(
                missing,
                "cpu_count, memory_mb and disk_size_mb must be given together and match one published contract",
            ));
        }
        let (c, m, d) = (
            req.cpu_count.unwrap_or(0),
            req.memory_mb.unwrap_or(0),
            req.disk_size_mb.unwrap_or(0),
        );
        let size = Size::from_shape(c, m, d).ok_or_else(|| {
            ApiError::invalid("cpu_count", format!("no published contract has {c} vCPU, {m} MiB memory and {d} MiB disk"))
                .with_details(json!({ "field": "cpu_count", "contracts": cella_types::ALL_SIZES.map(|s| s.contract()) }))
        })?;
        if req.size.is_some_and(|s| s != size) {
            return Err(ApiError::invalid(
                "size",
                "size does not match the compatibility resource fields",
            ));
        }
        size
    } else {
        let snap_size = snapshot.as_ref().map(|s| s.size);
        req.size.or(snap_size).unwrap_or(template.default_size)
    };
    if let Some(snap) = &snapshot {
        if snap.size != size {
            return Err(ApiError::invalid(
                "size",
                format!(
                    "snapshot {} holds the disk of a {} sandbox and starts only as {}",
                    snap.id, snap.size, snap.size
                ),
            ));
        }
    }
    if template.image.is_none() && template.workspace_id.is_some() {
        return Err(no_image_yet(state, template).await);
    }
    if state.catalog.readiness(template, size) == Readiness::Missing {
        return Err(ApiError::new(
            ErrorCode::SizeUnavailable,
            format!(
                "size {size} is not available for template {} on this server",
                crate::catalog::public_id(&template_id)
            ),
        )
        .with_details(json!({ "field": "size", "size": size.as_str() })));
    }
    let timeout_sec = req.timeout_sec.unwrap_or(DEFAULT_TIMEOUT_SEC);
    if !(1..=MAX_TIMEOUT_SEC).contains(&timeout_sec) {
        return Err(ApiError::invalid(
            "timeout_sec",
            "timeout_sec must be from 1 to 86400",
        ));
    }
    let idle_timeout_sec = match req.idle_timeout_sec {
        Some(v) if v > MAX_TIMEOUT_SEC => {
            return Err(ApiError::invalid(
                "idle_timeout_sec",
                "idle_timeout_sec must be from 0 to 86400",
            ))
        }
        Some(v) => v,
        None if workspace.created_at >= IDLE_DEFAULT_FROM_MS => IDLE_DEFAULT_SEC,
        None => 0,
    };
    let metadata = req.metadata.clone().unwrap_or_default();
    check_map("metadata", &metadata, false)?;
    // The template's environment, under the request's own.
    let mut env = template.defaults.env.clone();
    env.extend(req.env.clone().unwrap_or_default());
    check_map("env", &env, true)?;
    let network = req.network.clone().unwrap_or_default();
    crate::network::check(&network).await?;
    let (cpus, mem, disk) = size.shape();
    Ok(SandboxRow {
        owner_id: auth.key_id.clone(),
        timeout_sec: timeout_sec as i64,
        always_on: req.always_on.unwrap_or(false),
        persistent: req.persistent.unwrap_or(true),
        idle_timeout_sec: idle_timeout_sec as i64,
        metadata,
        env,
        compute_rate: workspace.settings.compute_rate,
        network,
        snapshot_id: snapshot.map(|s| s.id),
        preview_public: req.preview.as_ref().map(|p| p.public).unwrap_or(true),
        auto_resume: req.auto_resume.unwrap_or(false),
        ..SandboxRow::new(
            new_id("sb"),
            auth.workspace_id.clone(),
            // The template's key (the store's and the pool's), not the id the caller gave.
            template.id.clone(),
            size,
            (cpus, mem, disk),
            now_ms(),
        )
    })
}

/// Creates a sandbox. With `wait`, answers once it runs; else at once, in `provisioning`.
pub async fn create(
    state: &Arc<AppState>,
    auth: &Auth,
    req: CreateSandbox,
) -> Result<Sandbox, ApiError> {
    let (workspace, cap) = workspace_cap(state, auth).await?;
    let row = admit(state, auth, &req, &workspace).await?;
    // The fast path: a sandbox of the warm pool, already running.
    if req.wait.unwrap_or(true) && row.snapshot_id.is_none() {
        match crate::pool::claim(state, &row, cap).await? {
            Some(Ok(claimed)) => {
                if state_of(&claimed) == SandboxState::Error {
                    return Err(
                        ApiError::unavailable("the sandbox failed to start").with_details(
                            json!({ "sandbox_id": claimed.id, "reason": claimed.state_reason }),
                        ),
                    );
                }
                return Ok(to_wire(&claimed));
            }
            Some(Err(())) => return Err(at_cap(cap, &workspace.plan)),
            None => {}
        }
    }
    if !state.store.insert_sandbox_capped(&row, cap).await? {
        return Err(at_cap(cap, &workspace.plan));
    }
    // Boot in a task of its own: a client that hangs up must not leave a half-made sandbox.
    let id = row.id.clone();
    let st = state.clone();
    let boot = tokio::spawn(async move { boot(&st, &id).await });
    if req.wait.unwrap_or(true) {
        let _ = boot.await;
        let row = state
            .store
            .sandbox(&row.id)
            .await?
            .ok_or_else(ApiError::internal)?;
        if state_of(&row) == SandboxState::Error {
            return Err(ApiError::unavailable("the sandbox failed to start")
                .with_details(json!({ "sandbox_id": row.id, "reason": row.state_reason })));
        }
        return Ok(to_wire(&row));
    }
    let row = state
        .store
        .sandbox(&row.id)
        .await?
        .ok_or_else(ApiError::internal)?;
    Ok(to_wire(&row))
}

fn at_cap(cap: u32, plan: &str) -> ApiError {
    let mut e = ApiError::new(
        ErrorCode::ConcurrencyLimit,
        format!("workspace holds its plan's cap of {cap} concurrent sandboxes; destroy one first"),
    )
    .with_details(json!({ "limit": cap, "plan": plan }));
    e.retry_after = Some(5);
    e
}

/// Starts a sandbox that is in `provisioning`; records `running` or `error`.
pub(crate) async fn boot(state: &AppState, id: &str) {
    let _guard = state.locks.lock(id).await;
    let Ok(Some(mut row)) = state.store.sandbox(id).await else {
        return;
    };
    if state_of(&row) != SandboxState::Provisioning {
        return; // destroyed while it waited for the lock
    }
    boot_locked(state, &mut row).await;
}

/// Boots (or boots again, on its kept files) the sandbox of `row`, which the caller holds the
/// lock of and has put in `provisioning`; records `running` or `error`.
pub(crate) async fn boot_locked(state: &AppState, row: &mut SandboxRow) {
    let image = state
        .catalog
        .get(&row.template_id)
        .and_then(|t| t.image.clone());
    let result = match image {
        None => Err(DriverError::Image(format!(
            "template {} has no image on this host",
            crate::catalog::public_id(&row.template_id)
        ))),
        Some(image) => {
            let spec = SandboxSpec {
                id: row.id.clone(),
                hostname: row.id.clone(),
                image,
                cpu_count: row.cpu_count as u32,
                memory_mb: row.memory_mb as u32,
                disk_size_mb: row.disk_size_mb as u32,
                pids_max: (row.cpu_count as u32 * 1024).max(1024),
                network: match &state.network {
                    Some(dns) => Some(crate::network::rules(&row.network, dns).await),
                    None => None,
                },
                snapshot: row.snapshot_id.clone(),
                plain_layer: false,
            };
            state.driver.create(&spec).await
        }
    };
    // A template app starts with its sandbox, which is ready only once the app is.
    let result = match result {
        Ok(handle) => match start_template_app(state, row, &handle).await {
            Ok(()) => Ok(handle),
            Err(reason) => {
                // A sandbox booted again on kept files keeps them; a new one is cleared.
                let keep = row.persistent && row.started_at.is_some();
                let _ = if keep {
                    state.driver.stop(&row.id, Some(&handle)).await
                } else {
                    state.driver.destroy(&row.id, Some(&handle)).await
                };
                Err(DriverError::Launch(reason))
            }
        },
        Err(e) => Err(e),
    };
    let now = now_ms();
    match result {
        Ok(handle) => {
            row.state = SandboxState::Running;
            row.ready = true;
            row.ready_at = Some(now);
            row.started_at.get_or_insert(now);
            row.running_since = Some(now);
            row.timeout_at = (!row.always_on).then_some(now + row.timeout_sec * 1000);
            row.runtime = serde_json::to_string(&handle).ok();
            row.state_reason = None;
            state.activity.touch(&row.id);
        }
        Err(e) => {
            tracing::error!(sandbox = row.id, "sandbox failed to start: {e}");
            row.state = SandboxState::Error;
            row.state_reason = Some(format!("failed to start: {e}"));
        }
    }
    if let Err(e) = state.store.update_sandbox(row).await {
        tracing::error!(sandbox = row.id, "recording boot result: {e}");
    }
}

/// Ends the running or paused clock of a row at `now`, and banks the CPU time of its current
/// boot (read before its cgroup goes away).
pub(crate) fn settle(state: &AppState, row: &mut SandboxRow, now: i64) {
    stop_clock(row, now);
    if let Some(since) = row.paused_since.take() {
        row.paused_ms += (now - since).max(0);
    }
    if let Some(u) = handle_of(row).and_then(|h| state.driver.usage(&h)) {
        row.cpu_ns += u.cpu_ns as i64;
    }
}

/// Destroys a sandbox from any state; idempotent. `reason` says why when the server decided.
pub async fn destroy(
    state: &AppState,
    id: &str,
    reason: Option<&str>,
) -> Result<Sandbox, ApiError> {
    let _guard = state.locks.lock(id).await;
    let mut row = state
        .store
        .sandbox(id)
        .await?
        .ok_or_else(|| ApiError::not_found("sandbox"))?;
    if state_of(&row) == SandboxState::Destroyed {
        return Ok(to_wire(&row));
    }
    let now = now_ms();
    settle(state, &mut row, now);
    if let Err(e) = state.driver.destroy(id, handle_of(&row).as_ref()).await {
        tracing::error!(sandbox = id, "destroy: {e}");
        return Err(ApiError::internal());
    }
    row.state = SandboxState::Destroyed;
    row.ready = false;
    row.destroyed_at = Some(now);
    row.timeout_at = None;
    row.runtime = None;
    row.total_runtime_sec = Some((row.running_ms + 999) / 1000);
    if reason.is_some() {
        row.state_reason = reason.map(str::to_string);
    }
    state.store.update_sandbox(&row).await?;
    Ok(to_wire(&row))
}

/// Records that a sandbox's processes are gone. A persistent sandbox keeps its files and goes to
/// `stopped` (resume boots it again); any other goes to `error` and is cleared from the host.
/// `seen` is the handle that was found dead: when the sandbox has another one by now (it was
/// stopped and resumed meanwhile), nothing is done.
pub(crate) async fn mark_gone(
    state: &AppState,
    id: &str,
    seen: Option<&SandboxHandle>,
    reason: &str,
) {
    let _guard = state.locks.lock(id).await;
    let Ok(Some(mut row)) = state.store.sandbox(id).await else {
        return;
    };
    if state_of(&row).is_terminal() || state_of(&row) == SandboxState::Stopped {
        return;
    }
    let handle = handle_of(&row);
    if seen.is_some() && handle.as_ref() != seen {
        return;
    }
    // Bank the CPU time of this boot while its cgroup still exists.
    settle(state, &mut row, now_ms());
    let keep = row.persistent && state_of(&row) != SandboxState::Provisioning;
    let res = if keep {
        state.driver.stop(id, handle.as_ref()).await
    } else {
        state.driver.destroy(id, handle.as_ref()).await
    };
    if let Err(e) = res {
        tracing::error!(sandbox = id, "clearing a sandbox that is gone: {e}");
    }
    row.state = if keep {
        SandboxState::Stopped
    } else {
        SandboxState::Error
    };
    row.ready = false;
    row.timeout_at = None;
    row.runtime = None;
    row.state_reason = Some(reason.to_string());
    if let Err(e) = state.store.update_sandbox(&row).await {
        tracing::error!(sandbox = id, "recording a sandbox that is gone: {e}");
    }
}

/// The sandbox `id` of the caller's workspace (404 otherwise), counted as activity, which must
/// be running (409 `SANDBOX_NOT_RUNNING` otherwise, and it is not woken), with its handle.
pub async fn running(
    state: &AppState,
    auth: &Auth,
    id: &str,
) -> Result<(SandboxRow, SandboxHandle), ApiError> {
    let row = owned(state, auth, id).await?;
    state.activity.touch(id);
    if state_of(&row) != SandboxState::Running {
        return Err(not_running(&row));
    }
    let handle = handle_of(&row).ok_or_else(ApiError::internal)?;
    Ok((row, handle))
}

/// Why a custom template cannot start sandboxes yet: its last build failed (with its id and
/// error), or it is still being built. 400 `SIZE_UNAVAILABLE` (no size of it is available),
/// naming the build to look at.
async fn no_image_yet(state: &AppState, template: &crate::catalog::TemplateEntry) -> ApiError {
    let id = crate::catalog::public_id(&template.id);
    let last = state
        .store
        .builds_of(&template.id, 1)
        .await
        .ok()
        .and_then(|b| b.into_iter().next());
    let (message, details) = match last {
        Some(b) if b.state == "failed" => (
            format!(
                "template {id} has no image: its build {} failed ({}); see GET /api/v1/templates/{id}/builds/{}",
                b.id,
                b.error.as_deref().unwrap_or("no reason recorded"),
                b.id
            ),
            json!({ "template_id": id, "build_id": b.id, "build_state": b.state }),
        ),
        Some(b) => (
            format!(
                "template {id} is still being built (build {} is {}); create its sandboxes once it is ready",
                b.id, b.state
            ),
            json!({ "template_id": id, "build_id": b.id, "build_state": b.state }),
        ),
        None => (
            format!("template {id} has no image on this server"),
            json!({ "template_id": id }),
        ),
    };
    ApiError::new(ErrorCode::SizeUnavailable, message).with_details(details)
}

/// 409 `SANDBOX_NOT_RUNNING` for a sandbox that is not running: its state, why the server put
/// it there (when it did), and what brings it back.
pub fn not_running(row: &SandboxRow) -> ApiError {
    let why = row
        .state_reason
        .as_deref()
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    let hint = match state_of(row) {
        SandboxState::Paused | SandboxState::Stopped => format!(
            "; resume it (POST /api/v1/sandboxes/{}/resume) to bring it back",
            row.id
        ),
        SandboxState::Provisioning => "; it is still starting".to_string(),
        _ => String::new(),
    };
    ApiError::new(
        ErrorCode::SandboxNotRunning,
        format!("sandbox is {}, not running{why}{hint}", row.state),
    )
    .with_details(serde_json::json!({ "state": row.state, "reason": row.state_reason }))
}

/// Starts the template's app (`start`) in a new sandbox and waits until its readiness check
/// passes (a command that exits 0, or a port that accepts connections).
async fn start_template_app(
    state: &AppState,
    row: &SandboxRow,
    handle: &SandboxHandle,
) -> Result<(), String> {
    let Some(t) = state.catalog.get(&row.template_id) else {
        return Ok(());
    };
    let Some(start) = t.defaults.start.clone() else {
        return Ok(());
    };
    let req = template_defaults(
        state,
        row,
        ExecRequest {
            command: Some(start),
            ..Default::default()
        },
    );
    let mut boot_row = row.clone();
    boot_row.state = SandboxState::Running;
    boot_row.runtime = serde_json::to_string(handle).ok();
    let (_, spec) = exec_spec(&boot_row, req, None).map_err(|e| e.message)?;
    let agent = state.driver.agent(handle);
    match agent
        .call(&cella_agent::proto::Request::Spawn {
            spec,
            tag: Some("template-app".into()),
        })
        .await
    {
        Ok(cella_agent::proto::Response::Started { .. }) => {}
        Ok(other) => {
            return Err(format!(
                "the template's start command did not start: {other:?}"
            ))
        }
        Err(e) => return Err(format!("the template's start command did not start: {e}")),
    }
    let ready = t.defaults.ready.clone().unwrap_or(cella_types::ReadyCheck {
        command: None,
        port: t.defaults.port,
        timeout_sec: None,
    });
    let deadline = std::time::Instant::now()
        + std::time::Duration::from_secs(ready.timeout_sec.unwrap_or(60).max(1) as u64);
    let addr = handle.net.as_ref().map(|n| n.sandbox_addr);
    loop {
        let ok = if let Some(cmd) = &ready.command {
            let check = template_defaults(
                state,
                &boot_row,
                ExecRequest {
                    command: Some(cmd.clone()),
                    timeout_sec: Some(10),
                    ..Default::default()
                },
            );
            match exec_spec(&boot_row, check, Some(64 * 1024)) {
                Ok((h, spec)) => {
                    let (tx, mut rx) = mpsc::channel(16);
                    let drain = async { while rx.recv().await.is_some() {} };
                    let (r, _) = tokio::join!(state.driver.exec(&h, spec, tx), drain);
                    r.map(|i| i.exit_code == 0).unwrap_or(false)
                }
                Err(_) => false,
            }
        } else if let Some(port) = ready.port {
            // On the sandbox's address, else on its own loopback through the agent (an app
            // bound to 127.0.0.1 only is ready too, and previews reach it the same way).
            let direct = match addr {
                Some(a) => tokio::time::timeout(
                    std::time::Duration::from_millis(500),
                    tokio::net::TcpStream::connect((a, port)),
                )
                .await
                .map(|r| r.is_ok())
                .unwrap_or(false),
                None => false,
            };
            direct || agent.connect_port(port).await.is_ok()
        } else {
            true
        };
        if ok {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "the template's app was not ready after {} s",
                ready.timeout_sec.unwrap_or(60)
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Fills in what the sandbox's template sets for commands (working directory and user) where
/// the request leaves it open.
pub fn template_defaults(state: &AppState, row: &SandboxRow, mut req: ExecRequest) -> ExecRequest {
    if req.cwd.is_some() && req.user.is_some() {
        return req;
    }
    let (workdir, user) = state.catalog.exec_defaults(&row.template_id);
    if req.cwd.is_none() {
        req.cwd = workdir;
    }
    if req.user.is_none() {
        req.user = user;
    }
    req
}

/// Checks an exec request against a running sandbox and turns it into the agent's spec.
/// `output_cap` bounds each stream (None for a streamed exec, which keeps nothing).
pub fn exec_spec(
    row: &SandboxRow,
    req: ExecRequest,
    output_cap: Option<u64>,
) -> Result<(SandboxHandle, ExecSpec), ApiError> {
    if state_of(row) != SandboxState::Running {
        return Err(not_running(row));
    }
    let handle = handle_of(row).ok_or_else(ApiError::internal)?;
    let argv = match (req.command, req.argv) {
        (Some(c), None) => vec!["/bin/bash".to_string(), "-c".to_string(), c],
        (None, Some(a)) if !a.is_empty() => a,
        (None, Some(_)) => return Err(ApiError::invalid("argv", "argv must not be empty")),
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "command",
                "give command or argv, not both",
            ))
        }
        (None, None) => return Err(ApiError::invalid("command", "command or argv is required")),
    };
    let timeout = req.timeout_sec.unwrap_or(DEFAULT_TIMEOUT_SEC);
    if !(1..=MAX_TIMEOUT_SEC).contains(&timeout) {
        return Err(ApiError::invalid(
            "timeout_sec",
            "timeout_sec must be from 1 to 86400",
        ));
    }
    let (uid, home, name) = match req.user.unwrap_or_default() {
        ExecUser::User => (USER_UID, "/home/user", "user"),
        ExecUser::Root => (0, "/root", "root"),
    };
    let cwd = req.cwd.unwrap_or_else(|| home.to_string());
    if !cwd.starts_with('/') {
        return Err(ApiError::invalid("cwd", "cwd must be an absolute path"));
    }
    let req_env = req.env.unwrap_or_default();
    check_map("env", &req_env, true)?;
    let mut env = base_env(home, name);
    env.extend(row.env.clone());
    env.extend(req_env);
    let spec = ExecSpec {
        argv,
        env,
        cwd,
        uid,
        gid: uid,
        stdin: req.stdin.map(String::into_bytes),
        timeout_ms: timeout as u64 * 1000,
        output_cap,
    };
    Ok((handle, spec))
}

/// One output stream of a buffered exec, as kept: chunks as they came (no copy while
/// reading), counted against the server's exec buffer budget.
#[derive(Default)]
struct Kept {
    chunks: Vec<Vec<u8>>,
    len: usize,
    cut: bool,
}

impl Kept {
    /// Keeps what of `b` fits under `cap` and the budget; the rest is cut (and everything after
    /// it: a stream is never kept with a hole).
    fn push(
        &mut self,
        mut b: Vec<u8>,
        cap: usize,
        budget: &Arc<tokio::sync::Semaphore>,
        held: &mut Option<tokio::sync::OwnedSemaphorePermit>,
    ) {
        if self.cut {
            return;
        }
        let take = b.len().min(cap.saturating_sub(self.len));
        if take < b.len() {
            self.cut = true;
        }
        if take == 0 {
            return;
        }
        // Each kept byte counts twice: once here, once in the answer made of it.
        let permits = u32::try_from(take.saturating_mul(2)).unwrap_or(u32::MAX);
        match budget.clone().try_acquire_many_owned(permits) {
            Ok(p) => match held {
                Some(h) => h.merge(p),
                None => *held = Some(p),
            },
            Err(_) => {
                self.cut = true;
                return;
            }
        }
        b.truncate(take);
        self.len += take;
        self.chunks.push(b);
    }

    /// The stream as text (one exact-size copy; invalid UTF-8 replaced).
    fn text(self) -> String {
        let mut all = Vec::with_capacity(self.len);
        for c in self.chunks {
            all.extend_from_slice(&c);
        }
        match String::from_utf8(all) {
            Ok(t) => t,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }
}

/// A buffered exec's result, its output as kept, and the part of the server's exec buffer
/// budget the output holds (released when this, or the answer made of it, is dropped).
pub struct ExecOutput {
    /// The result with empty `stdout` and `stderr` (they are in `out`).
    pub result: ExecResult,
    out: [Kept; 2],
    budget: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl ExecOutput {
    pub fn into_result(self) -> ExecResult {
        let [out, err] = self.out;
        ExecResult {
            stdout: out.text(),
            stderr: err.text(),
            ..self.result
        }
    }
}

/// Runs one command in a running sandbox and collects its output.
pub async fn exec(
    state: &AppState,
    row: &SandboxRow,
    req: ExecRequest,
) -> Result<ExecResult, ApiError> {
    Ok(exec_kept(state, row, req).await?.into_result())
}

/// [`exec`], with the output as kept. Each stream keeps at most `[exec] output_cap_bytes`
/// (the agent sends no more), and only what the server-wide `[exec] buffer_budget_bytes` has
/// room for: past either, the stream is cut and flagged.
pub async fn exec_kept(
    state: &AppState,
    row: &SandboxRow,
    req: ExecRequest,
) -> Result<ExecOutput, ApiError> {
    let req = template_defaults(state, row, req);
    let cap = state.config.exec.output_cap_bytes;
    let (handle, spec) = exec_spec(row, req, Some(cap))?;
    let cap = usize::try_from(cap).unwrap_or(usize::MAX);
    // A running command is activity for the idle timer for as long as it runs.
    let _busy = state.activity.busy(&row.id);
    let (tx, mut rx) = mpsc::channel(16);
    let budget = state.exec_budget.clone();
    let collect = async {
        let (mut out, mut err) = (Kept::default(), Kept::default());
        let mut held = None;
        while let Some(ev) = rx.recv().await {
            match ev {
                ExecEvent::Stdout(b) => out.push(b, cap, &budget, &mut held),
                ExecEvent::Stderr(b) => err.push(b, cap, &budget, &mut held),
            }
        }
        (out, err, held)
    };
    let (res, (out, err, held)) = tokio::join!(state.driver.exec(&handle, spec, tx), collect);
    match res {
        Ok(info) => Ok(ExecOutput {
            result: ExecResult {
                exit_code: info.exit_code,
                stdout: String::new(),
                stderr: String::new(),
                duration_ms: info.duration_ms,
                timed_out: info.timed_out,
                stdout_truncated: info.stdout_truncated || out.cut,
                stderr_truncated: info.stderr_truncated || err.cut,
            },
            out: [out, err],
            budget: held,
        }),
        Err(e) => Err(exec_failure(state, &row.id, &handle, e).await),
    }
}

/// Turns kept output into the inside of a JSON string, chunk by chunk: invalid UTF-8 becomes
/// U+FFFD (as `from_utf8_lossy` does), a character split between two chunks is carried over.
#[derive(Default)]
struct JsonText {
    carry: Vec<u8>,
}

impl JsonText {
    fn piece(&mut self, chunk: &[u8], last: bool) -> Vec<u8> {
        let mut bytes = std::mem::take(&mut self.carry);
        bytes.extend_from_slice(chunk);
        let mut text = String::with_capacity(bytes.len());
        let mut rest = &bytes[..];
        loop {
            match std::str::from_utf8(rest) {
                Ok(t) => {
                    text.push_str(t);
                    break;
                }
                Err(e) => {
                    let ok = e.valid_up_to();
                    // from_utf8 said this prefix is valid.
                    text.push_str(std::str::from_utf8(&rest[..ok]).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            text.push('\u{FFFD}');
                            rest = &rest[ok + n..];
                        }
                        None if !last => {
                            self.carry = rest[ok..].to_vec();
                            break;
                        }
                        None => {
                            text.push('\u{FFFD}');
                            break;
                        }
                    }
                }
            }
        }
        let quoted = serde_json::to_string(&text).unwrap_or_else(|_| "\"\"".into());
        quoted.as_bytes()[1..quoted.len() - 1].to_vec()
    }
}

/// The answer `{"data": ExecResult}` of a buffered exec, written chunk by chunk from the kept
/// output (no copy of the whole output as text or as JSON); the budget it holds is released
/// when the answer is sent or dropped.
pub fn exec_answer(out: ExecOutput) -> axum::response::Response {
    use axum::response::IntoResponse;
    let ExecOutput {
        result,
        out: [stdout, stderr],
        budget,
    } = out;
    let head = serde_json::json!({
        "exit_code": result.exit_code,
        "duration_ms": result.duration_ms,
        "timed_out": result.timed_out,
        "stdout_truncated": result.stdout_truncated,
        "stderr_truncated": result.stderr_truncated,
    })
    .to_string();
    let prefix = format!("{{\"data\":{},\"stdout\":\"", &head[..head.len() - 1]);
    enum Part {
        Bytes(Vec<u8>),
        Text(std::vec::IntoIter<Vec<u8>>),
    }
    let parts = vec![
        Part::Bytes(prefix.into_bytes()),
        Part::Text(stdout.chunks.into_iter()),
        Part::Bytes(b"\",\"stderr\":\"".to_vec()),
        Part::Text(stderr.chunks.into_iter()),
        Part::Bytes(b"\"}}".to_vec()),
    ];
    struct Writer {
        parts: std::vec::IntoIter<Part>,
        now: Option<Part>,
        json: JsonText,
        _budget: Option<tokio::sync::OwnedSemaphorePermit>,
    }
    let w = Writer {
        parts: parts.into_iter(),
        now: None,
        json: JsonText::default(),
        _budget: budget,
    };
    let pieces = futures_util::stream::unfold(w, |mut w| async move {
        loop {
            match w.now.take().or_else(|| w.parts.next())? {
                Part::Bytes(b) => return Some((Ok::<_, std::convert::Infallible>(b), w)),
                Part::Text(mut chunks) => match chunks.next() {
                    Some(c) => {
                        let last = chunks.len() == 0;
                        let piece = w.json.piece(&c, last);
                        drop(c);
                        w.now = Some(Part::Text(chunks));
                        return Some((Ok(piece), w));
                    }
                    None => w.json = JsonText::default(),
                },
            }
        }
    });
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        axum::body::Body::from_stream(pieces),
    )
        .into_response()
}

/// What an exec that failed in the driver answers; a sandbox found dead is recorded as such.
pub async fn exec_failure(
    state: &AppState,
    id: &str,
    handle: &SandboxHandle,
    e: DriverError,
) -> ApiError {
    if let DriverError::BadCwd(m) = e {
        return ApiError::invalid("cwd", m);
    }
    tracing::warn!(sandbox = id, "exec failed: {e}");
    match state.driver.probe(handle).await {
        Probe::Gone(reason) => {
            mark_gone(
                state,
                id,
                Some(handle),
                &format!("sandbox processes are gone: {reason}"),
            )
            .await;
            ApiError::new(
                ErrorCode::SandboxNotRunning,
                format!("sandbox is no longer running: {reason}"),
            )
        }
        Probe::Alive => ApiError::internal(),
    }
}

/// At start: find every sandbox again, report honestly the ones whose processes are gone, and
/// clear whatever is left on the host of sandboxes that are not live.
pub async fn reconcile(state: &AppState) -> Result<(), cella_store::StoreError> {
    let live = state.store.live_sandboxes().await?;
    let mut keep = std::collections::HashSet::new();
    let mut running = std::collections::HashSet::new();
    for row in live {
        let st = state_of(&row);
        // Whatever happens below, a persistent sandbox past provisioning keeps its files.
        if row.persistent && st != SandboxState::Provisioning {
            keep.insert(row.id.clone());
        }
        match (st, handle_of(&row)) {
            (SandboxState::Stopped, _) => {}
            (SandboxState::Provisioning, _) => {
                let reason = "the server stopped while the sandbox was being created";
                mark_gone(state, &row.id, None, reason).await;
            }
            (_, Some(h)) => match state.driver.probe(&h).await {
                Probe::Alive => {
                    tracing::info!(
                        sandbox = row.id,
                        state = row.state.as_str(),
                        "sandbox found again"
                    );
                    keep.insert(row.id.clone());
                    running.insert(row.id.clone());
                    // Its firewall rules again: whatever happened to the host's ruleset while
                    // the server was down (a flush, a reload, an older version's rules) heals.
                    if let (Some(dns), Some(_)) = (&state.network, &h.net) {
                        let rules = crate::network::rules(&row.network, dns).await;
                        if let Err(e) = state.driver.update_network(&h, &rules).await {
                            tracing::warn!(
                                sandbox = row.id,
                                "reinstalling its firewall rules: {e}"
                            );
                        }
                    }
                }
                Probe::Gone(reason) => {
                    tracing::warn!(sandbox = row.id, "sandbox is gone: {reason}");
                    let reason = format!("sandbox processes are gone: {reason}");
                    mark_gone(state, &row.id, Some(&h), &reason).await;
                }
            },
            (_, None) => mark_gone(state, &row.id, None, "sandbox has no runtime record").await,
        }
    }
    // A fork the server did not finish left its internal snapshot.
    for snap in state.store.internal_snapshots().await? {
        if let Err(e) = state.driver.delete_snapshot(&snap).await {
            tracing::error!(
                snapshot = snap,
                "removing an unfinished fork's snapshot: {e}"
            );
        } else {
            state.store.delete_snapshot(&snap).await?;
        }
    }
    for id in state.driver.leftovers() {
        if running.contains(&id) {
            continue;
        }
        // A stopped sandbox keeps its files; everything else of it (a cgroup, firewall rules
        // of an earlier boot) goes, as does all of a sandbox that is not live.
        let res = if keep.contains(&id) {
            state.driver.stop(&id, None).await
        } else {
            tracing::info!(
                sandbox = id,
                "clearing leftovers of a sandbox that is not live"
            );
            state.driver.destroy(&id, None).await
        };
        if let Err(e) = res {
            tracing::error!(sandbox = id, "clearing leftovers: {e}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod exec_answer_tests {
    use super::*;

    fn kept(chunks: &[&[u8]]) -> Kept {
        Kept {
            chunks: chunks.iter().map(|c| c.to_vec()).collect(),
            len: chunks.iter().map(|c| c.len()).sum(),
            cut: false,
        }
    }

    #[tokio::test]
    async fn the_answer_is_the_json_of_the_kept_output() {
        // "é" split between two chunks, quotes and a newline, an invalid byte, and a stream
        // that ends in the middle of a character.
        let out_chunks: &[&[u8]] = &[b"a\"b\n\xc3", b"\xa9c\xff", b"d\xe2\x82"];
        let err_chunks: &[&[u8]] = &[b"", b"err\\"];
        let whole = |cs: &[&[u8]]| String::from_utf8_lossy(&cs.concat()).into_owned();
        let out = ExecOutput {
            result: ExecResult {
                exit_code: 3,
                stdout: String::new(),
                stderr: String::new(),
                duration_ms: 7,
                timed_out: false,
                stdout_truncated: true,
                stderr_truncated: false,
            },
            out: [kept(out_chunks), kept(err_chunks)],
            budget: None,
        };
        let res = exec_answer(out);
        let body = axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let r: ExecResult = serde_json::from_value(v["data"].clone()).unwrap();
        assert_eq!(r.stdout, whole(out_chunks));
        assert_eq!(r.stderr, whole(err_chunks));
        assert_eq!((r.exit_code, r.duration_ms), (3, 7));
        assert!(r.stdout_truncated && !r.stderr_truncated && !r.timed_out);
    }

    #[test]
    fn kept_output_stops_at_the_cap_and_at_the_budget() {
        let budget = Arc::new(tokio::sync::Semaphore::new(100));
        let mut held = None;
        let mut k = Kept::default();
        k.push(vec![1; 30], 40, &budget, &mut held);
        k.push(vec![2; 30], 40, &budget, &mut held);
        assert_eq!((k.len, k.cut), (40, true), "cut at the cap");
        assert_eq!(
            budget.available_permits(),
            20,
            "each kept byte counts twice"
        );
        let mut k2 = Kept::default();
        k2.push(vec![3; 15], 40, &budget, &mut held);
        assert_eq!((k2.len, k2.cut), (0, true), "no room left in the budget");
        drop(held);
        assert_eq!(budget.available_permits(), 100);
    }
}
