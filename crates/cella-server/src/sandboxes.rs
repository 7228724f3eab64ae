//! The sandbox service: what create, destroy and exec do, apart from HTTP.
//!
//! A running sandbox to exec in comes from `service::Runnable` (the one place that checks it
//! runs and fills in its template's defaults); booting is in `service::boot`.
//!
//! A create (`POST /api/v1/sandboxes`): `admit` loads the `snapshot_id`'s row, if any (the
//! workspace's own, not internal; it gives the template and the size), resolves the template (a
//! built-in one or the workspace's own) and the size, checks readiness, timeouts, metadata, the
//! environment (the template's defaults with the request's over it, checked and stored together)
//! and the egress policy (`network::check`: every entry parses, at most 64 in a list, and every
//! domain resolves now, else a 400 on `network.allow` or `network.deny`), and builds a row in
//! `provisioning`. With `wait` and no `snapshot_id`, `pool::claim` tries the warm pool first;
//! otherwise `Store::insert_sandbox_capped` inserts the row only if the workspace is under its
//! plan's cap, in one SQL statement (else 429 `CONCURRENCY_LIMIT`). The boot runs in a task of its
//! own under the sandbox's lock (`service::boot`): the driver launches it (see the namespace
//! driver's `launch`), then a template's `start` command runs, as a background process tagged
//! `template-app` with the template's exec defaults, until its ready check passes (a command, or a
//! TCP connect to its port; a failure ends the sandbox and fails the boot); a `snapshot_boot`
//! template's sandbox may instead restore its boot image, app running (`crate::bootimages`). The row turns
//! `running` with its `timeout_at`, or `error` with its `state_reason` (a waiting create then
//! answers 503).
//!
//! A streamed exec (`POST .../exec/stream`) runs `Driver::exec` in a task whose output flows
//! through a channel into the response; `sse::OutputEncoder` makes each read a `stdout` or
//! `stderr` event (a JSON string, or `{"b64"}`; a character split between reads waits in a
//! `Utf8Carry`), and the last event is `exit` or `error`. A client that leaves drops the receiver,
//! so the agent's connection closes and it kills the command. A failed exec probes the sandbox;
//! one whose processes are gone is marked so (`mark_gone`, 409).

use crate::auth::Auth;
use crate::error::Internal;
use crate::service::transitions::{self, Event};
use crate::service::{check_timeout, Runnable, SandboxError};
use crate::util::{new_id, now_ms, rfc3339};
use crate::AppState;
pub(crate) use cella_runtime::rootfs::USER_UID;
use cella_runtime::Runtime;
use cella_runtime::{DriverError, ExecEvent, Probe, SandboxHandle};
use cella_store::SandboxRow;
use cella_types::{CreateSandbox, ExecRequest, ExecResult, Readiness, Sandbox, SandboxState, Size};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Workspaces made on or after 2026-10-11 (UTC) get a 30-minute idle timeout when none is given.
const IDLE_DEFAULT_FROM_MS: i64 = 1_791_676_800_000;
const IDLE_DEFAULT_SEC: u32 = 1800;
pub use crate::rows::{handle_of, handle_or_none, state_of, stop_clock, Locks};
pub(crate) use crate::service::boot::{boot, settle};
pub(crate) use crate::service::owned;
pub(crate) use crate::service::runnable::workspace_cap;
pub(crate) use crate::service::runnable::{
    check_map, AWAY_WAIT, DEFAULT_TIMEOUT_SEC, MAX_TIMEOUT_SEC,
};
const DEFAULT_TEMPLATE: &str = "base";

/// The wire form of a row; its preview URL is under the server's base (`app`).
pub fn to_wire(app: &AppState, row: &SandboxRow) -> Sandbox {
    let size: Size = row.size;
    let st = state_of(row);
    let now = now_ms();
    let timeout_remaining_ms = match (st, row.always_on, row.timeout_at) {
        (SandboxState::Running, false, Some(at)) => Some((at - now).max(0)),
        _ => None,
    };
    Sandbox {
        id: row.id.clone(),
        tenant_id: row.workspace_id.clone(),
        owner_id: row.owner_id.clone(),
        template_id: crate::catalog::public_id(&row.template_id).to_string(),
        state: st,
        size,
        resource_contract: size.contract(),
        cpu_count: row.cpu_count as u32,
        memory_mb: row.memory_mb as u32,
        disk_size_mb: row.disk_size_mb as u32,
        ready: row.ready,
        ready_at: row.ready_at.map(rfc3339),
        preview_url: (!st.is_terminal()).then(|| app.sandbox_preview_base(&row.id)),
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
        compute_rate: row.compute_rate,
        compute_cost: crate::billing::compute_cost_of(row, now),
        model_cost: row.model_cost,
        runtime: row.isolation.clone(),
        memory: (st == SandboxState::Paused).then(|| {
            if row.isolation == "gvisor" {
                cella_types::PausedMemory::OnDisk
            } else {
                cella_types::PausedMemory::InRam
            }
        }),
    }
}

/// Checks a create request and turns it into a new row (not yet stored).
async fn admit(
    state: &AppState,
    auth: &Auth,
    req: &CreateSandbox,
    workspace: &cella_store::WorkspaceRow,
) -> Result<SandboxRow, SandboxError> {
    let snapshot = match &req.snapshot_id {
        None => None,
        Some(sid) => {
            let snap = state
                .store
                .snapshot(sid)
                .await?
                .filter(|s| s.workspace_id == auth.workspace_id && !s.internal)
                .ok_or(SandboxError::NotFound("snapshot"))?;
            if req.template_id.as_ref().is_some_and(|t| {
                state.catalog.visible(t, &auth.workspace_id).map(|e| e.id)
                    != Some(snap.template_id.clone())
            }) {
                return Err(SandboxError::invalid(
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
    .ok_or(SandboxError::NotFound("template"))?;
    let template = &template;
    let compat = [
        ("cpu_count", req.cpu_count),
        ("memory_mb", req.memory_mb),
        ("disk_size_mb", req.disk_size_mb),
    ];
    let size = if compat.iter().any(|(_, v)| v.is_some()) {
        if let Some((missing, _)) = compat.iter().find(|(_, v)| v.is_none()) {
            return Err(SandboxError::invalid(
                missing,
                "cpu_count, memory_mb and disk_size_mb must be given together and match one published contract",
            ));
        }
        let (c, m, d) = (
            req.cpu_count.unwrap_or(0),
            req.memory_mb.unwrap_or(0),
            req.disk_size_mb.unwrap_or(0),
        );
        let size = Size::from_shape(c, m, d).ok_or(SandboxError::NoContract {
            cpu: c,
            memory_mb: m,
            disk_mb: d,
        })?;
        if req.size.is_some_and(|s| s != size) {
            return Err(SandboxError::invalid(
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
            return Err(SandboxError::invalid(
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
        return Err(SandboxError::SizeUnavailable {
            size,
            template: crate::catalog::public_id(&template_id).to_string(),
        });
    }
    let timeout_sec = check_timeout(
        "timeout_sec",
        req.timeout_sec.unwrap_or(DEFAULT_TIMEOUT_SEC),
    )?;
    let idle_timeout_sec = match req.idle_timeout_sec {
        Some(v) if v > MAX_TIMEOUT_SEC => {
            return Err(SandboxError::invalid(
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
    let runtime = admit_runtime(state, req, template, snapshot.as_ref())?;
    let network = match (runtime, &req.network) {
        // On gVisor, loopback only unless asked (a link is made per boot, and its boot is the
        // cost of a gVisor create).
        (Runtime::Gvisor, None) => cella_types::NetworkPolicy {
            egress: cella_types::Egress::Deny,
            ..Default::default()
        },
        (_, n) => n.clone().unwrap_or_default(),
    };
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
        isolation: runtime.as_str().to_string(),
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

/// The runtime a create asks for (else the template's default, else the server's), checked:
/// known, run by this host for this template, and (on gVisor) asking for nothing gVisor
/// sandboxes do not have yet.
fn admit_runtime(
    state: &AppState,
    req: &CreateSandbox,
    template: &crate::catalog::TemplateEntry,
    snapshot: Option<&cella_store::SnapshotRow>,
) -> Result<Runtime, SandboxError> {
    // A snapshot's files (and memory) start on the runtime of the sandbox they were taken of.
    if let Some(snap) = snapshot {
        let theirs = Runtime::parse(&snap.isolation).unwrap_or_default();
        if req.runtime.as_deref().is_some_and(|r| r != theirs.as_str()) {
            return Err(SandboxError::invalid(
                "runtime",
                format!(
                    "snapshot {} was taken of a {theirs} sandbox and starts only on {theirs}; leave runtime out or give that one",
                    snap.id
                ),
            ));
        }
        if !state.driver.supports(theirs) {
            return Err(SandboxError::invalid(
                "runtime",
                format!("runtime {theirs} is not available: this server cannot run it (runsc is not installed)"),
            ));
        }
    }
    let offered = state.catalog.runtimes_of(template);
    let names = || {
        offered
            .iter()
            .map(|r| r.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let runtime = match &req.runtime {
        None if snapshot.is_some() => snapshot
            .and_then(|s| Runtime::parse(&s.isolation))
            .unwrap_or_default(),
        None => offered.first().copied().unwrap_or_default(),
        Some(name) => Runtime::parse(name).ok_or_else(|| {
            SandboxError::invalid(
                "runtime",
                format!("unknown runtime {name:?}: this server runs {}", names()),
            )
        })?,
    };
    if !offered.contains(&runtime) {
        let why = if state.driver.supports(runtime) {
            format!(
                "template {} does not run on it",
                crate::catalog::public_id(&template.id)
            )
        } else {
            "this server cannot run it (runsc is not installed)".to_string()
        };
        return Err(SandboxError::invalid(
            "runtime",
            format!("runtime {runtime} is not available: {why}"),
        ));
    }
    Ok(runtime)
}

/// Creates a sandbox. With `wait`, answers once it runs; else at once, in `provisioning`.
pub async fn create(
    state: &Arc<AppState>,
    auth: &Auth,
    req: CreateSandbox,
) -> Result<Sandbox, SandboxError> {
    let (workspace, cap) = crate::timing::phase("workspace", workspace_cap(state, auth)).await?;
    let model_access = req.model_access.unwrap_or(false);
    if model_access {
        crate::gateway::check_model_access(state)?;
    }
    let row = crate::timing::phase("admit", admit(state, auth, &req, &workspace)).await?;
    // Its 60-second minimum reserved first (402 and nothing made when the wallet is short).
    crate::timing::phase("billing", crate::billing::admit(state, &row)).await?;
    cella_crash::crash_point!("sandbox.create.after_reserve");
    let made = create_admitted(state, &req, row.clone(), &workspace, cap).await;
    if made.is_err() {
        crate::billing::abandon(state, &row.id).await;
    }
    made
}

async fn create_admitted(
    state: &Arc<AppState>,
    req: &CreateSandbox,
    row: SandboxRow,
    workspace: &cella_store::WorkspaceRow,
    cap: u32,
) -> Result<Sandbox, SandboxError> {
    let model_access = req.model_access.unwrap_or(false);
    // The fast path: a sandbox of the warm pool, already running (not for model access,
    // whose token and firewall opening are made at its boot).
    let pooled = crate::pool::claimable(&row);
    if req.wait.unwrap_or(true) && row.snapshot_id.is_none() && !model_access && pooled {
        match crate::pool::claim(state, &row, cap).await? {
            Some(Ok(claimed)) => {
                // The reservation follows the pool sandbox's id.
                crate::billing::moved(state, &row.id, &claimed).await;
                if state_of(&claimed) == SandboxState::Error {
                    crate::billing::settle_free(state, &claimed).await;
                    return Err(SandboxError::StartFailed {
                        id: claimed.id,
                        reason: claimed.state_reason,
                    });
                }
                return Ok(to_wire(state, &claimed));
            }
            Some(Err(())) => return Err(at_cap(cap, &workspace.plan)),
            None => {}
        }
    }
    if !crate::timing::phase("store.insert", state.store.insert_sandbox_capped(&row, cap)).await? {
        return Err(at_cap(cap, &workspace.plan));
    }
    cella_crash::crash_point!("sandbox.create.after_insert");
    if model_access {
        state
            .store
            .set_model_access(&row.id, &row.workspace_id, now_ms())
            .await?;
    }
    // The boot asks for it (its firewall rules): answered without a read.
    state
        .store
        .note_model_access(&row.id, model_access.then_some(row.workspace_id.as_str()));
    // Boot in a task of its own: a client that hangs up must not leave a half-made sandbox.
    let id = row.id.clone();
    let st = state.clone();
    let boot = tokio::spawn(crate::timing::carry(async move {
        boot(&st, &id).await;
        // A sandbox that failed to start is settled at once (at 0: it never ran).
        if let Ok(Some(r)) = st.store.sandbox(&id).await {
            if state_of(&r) == SandboxState::Error {
                crate::billing::settle_logged(&st, &r).await;
            }
        }
    }));
    if req.wait.unwrap_or(true) {
        let _ = boot.await;
        let row = crate::timing::phase("store.read", state.store.sandbox(&row.id))
            .await?
            .ok_or_else(|| {
                Internal::Broken(format!("sandbox {} lost its row in its boot", row.id))
            })?;
        if state_of(&row) == SandboxState::Error {
            // Made and settled: its reservation is gone already (not abandoned twice).
            return Err(SandboxError::StartFailed {
                id: row.id,
                reason: row.state_reason,
            });
        }
        return Ok(to_wire(state, &row));
    }
    let row = state.store.sandbox(&row.id).await?.ok_or_else(|| {
        Internal::Broken(format!("sandbox {} lost its row after its create", row.id))
    })?;
    Ok(to_wire(state, &row))
}

fn at_cap(cap: u32, plan: &str) -> SandboxError {
    SandboxError::AtCap {
        cap,
        plan: plan.to_string(),
    }
}

/// Destroys a sandbox from any state; idempotent. `reason` says why when the server decided.
/// Answers once the row is `destroyed` and settled; the teardown on the host runs after it
/// (see [`crate::teardown`]).
pub async fn destroy(
    state: &AppState,
    id: &str,
    reason: Option<&str>,
) -> Result<Sandbox, SandboxError> {
    let _guard = crate::timing::phase("lock", state.locks.lock(id)).await;
    let mut row = crate::timing::phase("store.read", state.store.sandbox(id))
        .await?
        .ok_or(SandboxError::NotFound("sandbox"))?;
    if state_of(&row) == SandboxState::Destroyed {
        return Ok(to_wire(state, &row));
    }
    transitions::check(state_of(&row), Event::Destroy)?;
    crate::timing::phase("gateway", crate::gateway::end_boot(state, id)).await;
    let now = now_ms();
    settle(state, &mut row, now);
    let handle = handle_or_none(&row);
    transitions::apply(&mut row, Event::Destroy)?;
    row.ready = false;
    row.destroyed_at = Some(now);
    row.timeout_at = None;
    row.runtime = None;
    row.total_runtime_sec = Some((row.running_ms + 999) / 1000);
    if reason.is_some() {
        row.state_reason = reason.map(str::to_string);
    }
    crate::timing::phase("store.update", state.store.update_sandbox(&row)).await?;
    state.activity.forget(id);
    // The host's side runs on after the answer (`teardown`): the row owns nothing any more,
    // so what a crash leaves of it is cleared by the next start's `reconcile`.
    state.teardowns.start(state.driver.clone(), id, handle);
    // Its one compute entry (a crash before it is recovered at the next start).
    cella_crash::crash_point!("sandbox.destroy.after_state_write");
    crate::timing::phase("billing", crate::billing::settle_logged(state, &row)).await;
    let row = crate::timing::phase("store.read", state.store.sandbox(id))
        .await?
        .unwrap_or(row);
    Ok(to_wire(state, &row))
}

/// Whether a sandbox whose processes are gone keeps its files: a persistent one that is past its
/// first boot, a stopped one booting again on its kept files (`provisioning` with a
/// `started_at`) among them.
fn keeps_files(row: &SandboxRow) -> bool {
    row.persistent && (state_of(row) != SandboxState::Provisioning || row.started_at.is_some())
}

/// Records that a sandbox's processes are gone. A persistent sandbox past its first boot keeps
/// its files and goes to `stopped` (resume boots it again); any other goes to `error` and is
/// cleared from the host.
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
    let keep = keeps_files(&row);
    let event = if keep { Event::LostKept } else { Event::Lost };
    if transitions::check(state_of(&row), event).is_err() {
        return; // already stopped, destroyed or in error
    }
    let handle = handle_or_none(&row);
    if seen.is_some() && handle.as_ref() != seen {
        return;
    }
    // Seen dead without the lock, while a change held it: a gVisor pause to disk has no
    // process between the checkpoint and its image being whole. Alive again now: nothing.
    if let Some(h) = &handle {
        if state.driver.alive(h) {
            return;
        }
    }
    crate::gateway::end_boot(state, id).await;
    // Bank the CPU time of this boot while its cgroup still exists.
    settle(state, &mut row, now_ms());
    let res = if keep {
        state.driver.stop(id, handle.as_ref()).await
    } else {
        state.driver.destroy(id, handle.as_ref()).await
    };
    if let Err(e) = res {
        tracing::error!(sandbox = id, "clearing a sandbox that is gone: {e}");
    }
    if let Err(e) = transitions::apply(&mut row, event) {
        tracing::error!(sandbox = id, "{e}");
        return;
    }
    row.ready = false;
    row.timeout_at = None;
    row.runtime = None;
    row.state_reason = Some(reason.to_string());
    if let Err(e) = state.store.update_sandbox(&row).await {
        tracing::error!(sandbox = id, "recording a sandbox that is gone: {e}");
        return;
    }
    if row.state.is_terminal() {
        state.activity.forget(id);
        crate::billing::settle_logged(state, &row).await;
    }
}

/// Why a custom template cannot start sandboxes yet: its last build failed (with its id and
/// error), or it is still being built. 400 `SIZE_UNAVAILABLE` (no size of it is available),
/// naming the build to look at.
async fn no_image_yet(state: &AppState, template: &crate::catalog::TemplateEntry) -> SandboxError {
    let last = state
        .store
        .builds_of(&template.id, 1)
        .await
        .ok()
        .and_then(|b| b.into_iter().next());
    SandboxError::NoImage {
        template: crate::catalog::public_id(&template.id).to_string(),
        build: last.map(|b| crate::service::LastBuild {
            id: b.id,
            state: b.state,
            error: b.error,
        }),
    }
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
    sb: &Runnable,
    req: ExecRequest,
) -> Result<ExecResult, SandboxError> {
    Ok(exec_kept(state, sb, req).await?.into_result())
}

/// [`exec`], with the output as kept. Each stream keeps at most `[exec] output_cap_bytes`
/// (the agent sends no more), and only what the server-wide `[exec] buffer_budget_bytes` has
/// room for: past either, the stream is cut and flagged.
pub async fn exec_kept(
    state: &AppState,
    sb: &Runnable,
    req: ExecRequest,
) -> Result<ExecOutput, SandboxError> {
    let cap = state.config.exec.output_cap_bytes;
    let spec = sb.spec(req, Some(cap))?;
    let (row, handle) = (&sb.row, &sb.handle);
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
    let (res, (out, err, held)) = crate::timing::phase("driver.exec", async {
        tokio::join!(state.driver.exec(handle, spec, tx), collect)
    })
    .await;
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
        Err(e) => {
            // What it kept goes back to the shared budget now, not after the wait below.
            drop((out, err, held));
            Err(exec_failure(state, &row.id, handle, e).await)
        }
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

/// What a call to the agent of sandbox `id` that failed with `e` answers. A call whose
/// connection broke (not one the agent refused) may have been cut by a pause to disk (gVisor),
/// a stop or a destroy that began while it ran: once that change is over (the sandbox's lock,
/// bounded), a sandbox that is no longer running answers as a call made after it would (409
/// `SANDBOX_NOT_RUNNING`, or 404 when it is gone); anything else is the agent's error for `op`.
pub async fn agent_failure(
    state: &AppState,
    id: &str,
    op: crate::service::AgentOp,
    e: cella_agent::client::ClientError,
) -> SandboxError {
    use cella_agent::client::ClientError;
    if !matches!(e, ClientError::Refused { .. }) {
        match settled(state, id).await {
            Ok(Some(row)) if state_of(&row) != SandboxState::Running => {
                return SandboxError::not_running(&row)
            }
            Ok(None) => return SandboxError::NotFound("sandbox"),
            _ => {}
        }
    }
    op.err()(e)
}

/// Sandbox `id`'s row once a change of its state that holds its lock is over (waited for at
/// most 30 s): what a call that was cut while it ran reads to know why.
async fn settled(
    state: &AppState,
    id: &str,
) -> Result<Option<SandboxRow>, cella_store::StoreError> {
    let lock = tokio::time::timeout(std::time::Duration::from_secs(30), state.locks.lock(id)).await;
    drop(lock);
    state.store.sandbox(id).await
}

/// What an exec that failed in the driver answers; a sandbox found dead is recorded as such.
pub async fn exec_failure(
    state: &AppState,
    id: &str,
    handle: &SandboxHandle,
    e: DriverError,
) -> SandboxError {
    if let DriverError::BadCwd(m) = e {
        return SandboxError::invalid("cwd", m);
    }
    tracing::warn!(sandbox = id, "exec failed: {e}");
    // A pause to disk (gVisor) closes the agent's connections, and its agent answers nothing
    // until the resume: a command cut by a pause that began while it ran answers as a call
    // made after it would (409, paused), once the pause is over, and is not taken for dead.
    if handle.runtime == cella_runtime::Runtime::Gvisor {
        if let Ok(Some(row)) = settled(state, id).await {
            if state_of(&row) != SandboxState::Running {
                return SandboxError::not_running(&row);
            }
            // Checkpointed and restored since (a snapshot or fork while it ran): the command
            // was ended with the connection (the agent kills what an exec it cannot answer
            // started).
            if handle_of(&row).ok().flatten().as_ref() != Some(handle) {
                tracing::debug!(sandbox = id, "exec cut by a checkpoint: {e}");
                return SandboxError::Checkpointed { id: id.to_string() };
            }
        }
    }
    match state.driver.probe(handle).await {
        Probe::Gone(reason) => {
            mark_gone(
                state,
                id,
                Some(handle),
                &format!("sandbox processes are gone: {reason}"),
            )
            .await;
            SandboxError::Gone { reason }
        }
        Probe::Alive => SandboxError::Driver {
            what: "exec",
            source: e,
        },
    }
}

/// At start: find every sandbox again, report honestly the ones whose processes are gone, and
/// clear whatever is left on the host of sandboxes that are not live.
///
/// PID 1 of each sandbox is reparented to the server (a child subreaper, to reap it at destroy)
/// and, once that exits, to the host's init, so sandboxes outlive the server. This leaves
/// `stopped` rows alone, moves `provisioning` ones to `error` (a stopped one that was booting
/// again goes back to `stopped`, its files kept), and probes `running` and `paused` ones,
/// keeping those alive (the warm pool's among them) and frozen or thawed as their row says (a
/// server killed between the freezer and the row's write, in a pause, a resume or a
/// snapshot's copy, left them apart); internal snapshots of forks the server did not finish
/// are deleted, and so are snapshot files no row names (a copy killed half way, or made and
/// not recorded); then, for every id `Driver::leftovers` finds (a
/// directory, cgroup or firewall chain) that is not a sandbox found alive, a stopped sandbox
/// gets `Driver::stop` without a handle (its files stay; a cgroup or an earlier boot's chain
/// goes), and anything else `Driver::destroy` (the sandboxes of build steps the server did not
/// finish among them: `builds::restore`, earlier in the start, failed their builds). A sandbox
/// found dead (here, by a failed exec, or by the liveness check) goes through `mark_gone`,
/// which acts only if the dead handle is still the row's: a persistent one that had started
/// goes to `stopped`, its layer kept; any other goes to `error` and is removed.
///
/// A corrupt row (a column that does not decode, its runtime record included) does not stop
/// the server: it is logged with its id and skipped, and what it has on the host is left as it
/// is (neither marked gone nor cleared), for an operator to look at; the others go on.
pub async fn reconcile(state: &AppState) -> Result<(), cella_store::StoreError> {
    let live = state.store.live_sandboxes_each().await?;
    let mut keep = std::collections::HashSet::new();
    // Sandboxes whose host state stays as it is: the running ones, and the corrupt rows.
    let mut running = std::collections::HashSet::new();
    let mut skip = |e: cella_store::StoreError| {
        tracing::error!("sandbox skipped at start, left as it is: {e}");
        if let cella_store::StoreError::Corrupt { id, .. } = e {
            running.insert(id);
        }
    };
    let mut found = Vec::new();
    for row in live {
        match row.and_then(|row| Ok((handle_of(&row)?, row))) {
            Ok(found_row) => found.push(found_row),
            Err(e) => skip(e),
        }
    }
    for (handle, row) in found {
        let st = state_of(&row);
        // Whatever happens below, a persistent sandbox past its first boot keeps its files.
        if keeps_files(&row) {
            keep.insert(row.id.clone());
        }
        match (st, handle) {
            (SandboxState::Stopped, _) => {}
            (SandboxState::Provisioning, _) => {
                let reason = if row.started_at.is_some() {
                    "the server stopped while the sandbox was booting again"
                } else {
                    "the server stopped while the sandbox was being created"
                };
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
                    // Frozen as its row says: a server stopped between the freezer and the
                    // row's write (a pause, a resume, a snapshot's copy) left them apart.
                    // A gVisor sandbox found written to disk while its row says running (a
                    // server killed between its checkpoint and the row's write) is restored
                    // and its new handle recorded.
                    let frozen = if st == SandboxState::Paused {
                        state.driver.pause(&h).await
                    } else {
                        match state.driver.unpause(&h).await {
                            Ok(Some(new)) => {
                                let mut row = row.clone();
                                row.runtime = serde_json::to_string(&new).ok();
                                if let Err(e) = state.store.update_sandbox(&row).await {
                                    tracing::warn!(sandbox = row.id, "recording its handle: {e}");
                                }
                                Ok(())
                            }
                            other => other.map(|_| ()),
                        }
                    };
                    if let Err(e) = frozen {
                        tracing::warn!(sandbox = row.id, "setting its freezer state: {e}");
                    }
                    // Its firewall rules again: whatever happened to the host's ruleset while
                    // the server was down (a flush, a reload, an older version's rules) heals.
                    if let (Some(dns), Some(_)) = (&state.network, &h.net) {
                        let rules =
                            crate::network::egress_rules(state, &row.id, &row.network, dns).await;
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
    // Snapshot files without a row: a copy the server did not finish, or finished and did not
    // record.
    for snap in state.driver.snapshot_files() {
        if matches!(state.store.snapshot(&snap).await, Ok(None)) {
            tracing::info!(snapshot = snap, "removing an unrecorded snapshot's files");
            if let Err(e) = state.driver.delete_snapshot(&snap).await {
                tracing::error!(snapshot = snap, "removing an unrecorded snapshot: {e}");
            }
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
