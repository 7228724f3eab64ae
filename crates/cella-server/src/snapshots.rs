//! Snapshots of a sandbox's files, and forks (a snapshot taken for new sandboxes at once).
//!
//! A snapshot is a copy of the sandbox's writable layer (its disk image) taken while its
//! processes are frozen for the instant the copy needs; the template's layers stay shared. A
//! running sandbox is frozen for the copy, a paused or stopped one is copied as it is; any
//! other state has no files to copy (409). A sandbox made from a snapshot gets its own copy of
//! it, so nothing depends on a snapshot once created from it: deleting a snapshot is always
//! allowed and never affects a sandbox, except while a sandbox that has not booted yet still
//! needs its files (409 until it runs).
//!
//! A snapshot counts against its workspace's storage quota: refused when nothing is left, and
//! not kept when the copy would pass it (507). A fork takes an internal snapshot (not listed,
//! not charged), makes `count` (1-10) new sandboxes on it within the workspace's concurrency cap
//! (none made past it: 429), boots them, and removes the snapshot; that part runs in a task of
//! its own, so a client that hangs up leaves no half-made fork and no internal snapshot behind
//! (a server that stops meanwhile removes it at its next start, in `reconcile`). The fork is
//! answered once its children booted; the snapshot's removal follows (crash point
//! `fork.before_snapshot_removal`), so the answer does not wait for its files to go (nor is it
//! counted in the workspace's storage meanwhile: internal snapshots never are).
//!
//! A create with `snapshot_id` records it in the new row; the boot passes it to the driver
//! (`SandboxSpec::snapshot`), which copies the snapshot's image into the sandbox's own disk at
//! its first boot. That is why a delete waits for `provisioning` sandboxes of the snapshot
//! (`Store::booting_from_snapshot`). The driver's side of the copy (freeze, `syncfs`, sparse
//! copy, thaw) is told at the namespace driver's `take_snapshot`.
//!
//! On gVisor (the sandbox's `isolation`) the copy goes through
//! `Driver::snapshot_with_memory`: a running sandbox is checkpointed and restored, and its new
//! handle is recorded in its row whether or not the copy succeeded. `memory: true` keeps the
//! checkpoint (the row's `memory`); a create from it restores a new sandbox, and a fork of a
//! running or paused gVisor sandbox always takes one, so its children continue where the
//! source was. A fork's running source is restored while its children restore (the driver
//! leaves it written to disk once copied, `leave_on_disk`; [`resume_source`] restores it in a
//! task holding its lock). While a running gVisor sandbox is away for the checkpoint and
//! restore, calls that need its agent wait for it (`AppState::away`) rather than fail on its old
//! handle. A snapshot records its runtime (`isolation`): sandboxes made from it run on it.
//! `memory: true` on a namespace sandbox is a 400 naming the field and the runtime, checked
//! before anything is done.
//!
//! Routes parse, call one function here and encode; the errors are [`SnapshotError`], which
//! `service::error` holds and turns into the API's envelope. This module sits above
//! `service` and `billing` (each child of a fork reserves its 60-second minimum, as a create
//! does), so it is not inside `service`.

use crate::auth::Auth;
use crate::rows::state_of;
pub use crate::service::error::SnapshotError;
use crate::service::SandboxError;
use crate::util::{new_id, now_ms};
use crate::AppState;
use cella_runtime::{DriverError, Runtime, SandboxHandle, SnapshotInfo};
use cella_store::{SandboxRow, SnapshotRow};
use cella_types::{CreateSnapshot, ForkRequest, SandboxState};
use std::sync::Arc;

/// The most sandboxes one fork makes.
pub const MAX_FORK: u32 = 10;

fn driver_error(sandbox: &str, e: DriverError) -> SnapshotError {
    match e {
        DriverError::Unsupported(m) => SnapshotError::Unsupported(m),
        e if e.is_no_space() => SnapshotError::NoSpace {
            sandbox: sandbox.to_string(),
        },
        source => SnapshotError::Driver {
            sandbox: sandbox.to_string(),
            source,
        },
    }
}

/// Copies the files of `row` into a new snapshot (the caller holds its lock and checked the
/// workspace), with `memory` its checkpoint too (gVisor). `internal`: a fork's, neither listed
/// nor held to the quota. With `leave_on_disk`, a running gVisor sandbox is left written to
/// disk once copied: its handle is answered, and the caller restores it ([`resume_source`])
/// while it goes on.
async fn copy(
    state: &AppState,
    row: &SandboxRow,
    internal: bool,
    memory: bool,
    leave_on_disk: bool,
) -> Result<(SnapshotRow, SnapshotInfo, Option<SandboxHandle>), SnapshotError> {
    let handle = match state_of(row) {
        SandboxState::Running | SandboxState::Paused => crate::rows::handle_of(row)?,
        SandboxState::Stopped => None,
        state => return Err(SnapshotError::NoFiles { state }),
    };
    // The workspace's storage quota: a snapshot that would pass it is not kept. A fork's own
    // snapshot is neither held to it nor counted in it: not read for it.
    let storage = match internal {
        true => None,
        false => {
            let s = crate::timing::phase("quota", crate::quotas::storage(state, &row.workspace_id))
                .await?;
            s.check(0, "a snapshot")?;
            Some(s)
        }
    };
    let snap_id = new_id("snap");
    let gvisor = row.isolation == Runtime::Gvisor.as_str();
    let leave_on_disk = leave_on_disk && gvisor && state_of(row) == SandboxState::Running;
    let mut on_disk = None;
    let info = if gvisor {
        // A running gVisor sandbox is checkpointed and restored: its new handle is recorded
        // whatever became of the snapshot.
        let taken = state
            .driver
            .snapshot_with_memory(&row.id, handle.as_ref(), &snap_id, memory, leave_on_disk)
            .await;
        if leave_on_disk && taken.result.is_ok() {
            on_disk = handle.clone();
        }
        if let Some(new) = taken.new_handle {
            let mut r = row.clone();
            r.runtime = serde_json::to_string(&new).ok();
            if let Err(e) = state.store.update_sandbox(&r).await {
                tracing::error!(
                    sandbox = row.id,
                    "recording its handle after a snapshot: {e}"
                );
            }
        }
        taken.result
    } else if internal {
        // A fork's: its children boot from it at once.
        crate::timing::phase(
            "driver.snapshot",
            state
                .driver
                .snapshot_for_boot(&row.id, handle.as_ref(), &snap_id),
        )
        .await
    } else {
        state
            .driver
            .snapshot(&row.id, handle.as_ref(), &snap_id)
            .await
    }
    .map_err(|e| driver_error(&row.id, e))?;
    let fail = |e: SnapshotError, snap_id: String, on_disk: Option<SandboxHandle>| async move {
        let _ = state.driver.delete_snapshot(&snap_id).await;
        if let Some(h) = &on_disk {
            resume_source(state, &row.id, h).await;
        }
        Err(e)
    };
    if let Some(Err(e)) = storage.map(|s| s.check(info.size_bytes, "this snapshot")) {
        return fail(e.into(), snap_id, on_disk).await;
    }
    cella_crash::crash_point!("snapshot.take.after_copy");
    let snap = SnapshotRow {
        seq: 0,
        id: snap_id,
        workspace_id: row.workspace_id.clone(),
        sandbox_id: row.id.clone(),
        template_id: row.template_id.clone(),
        size: row.size,
        created_at: now_ms(),
        size_bytes: info.size_bytes as i64,
        internal,
        memory: gvisor && memory,
        isolation: row.isolation.clone(),
    };
    if let Err(e) = crate::timing::phase("store.insert", state.store.insert_snapshot(&snap)).await {
        return fail(e.into(), snap.id, on_disk).await;
    }
    Ok((snap, info, on_disk))
}

/// Restores gVisor sandbox `id`, left written to disk by a snapshot (its row still running;
/// the caller holds its lock), and records its new handle. A failure is logged: the sandbox
/// stays on disk, alive for the server, and a resume or restart restores it.
pub(crate) async fn resume_source(state: &AppState, id: &str, handle: &SandboxHandle) {
    match state.driver.unpause(handle).await {
        Ok(Some(new)) => match state.store.sandbox(id).await {
            Ok(Some(mut r)) => {
                r.runtime = serde_json::to_string(&new).ok();
                if let Err(e) = state.store.update_sandbox(&r).await {
                    tracing::error!(sandbox = id, "recording its handle after a snapshot: {e}");
                }
            }
            Ok(None) => {}
            Err(e) => tracing::error!(sandbox = id, "recording its handle after a snapshot: {e}"),
        },
        Ok(None) => {}
        Err(e) => tracing::error!(sandbox = id, "restoring it after a snapshot: {e}"),
    }
}

/// Takes a snapshot of the caller's sandbox `id` (with `memory`: its checkpoint too, gVisor
/// only).
pub async fn take(
    state: &Arc<AppState>,
    auth: &Auth,
    id: &str,
    req: &CreateSnapshot,
) -> Result<SnapshotRow, SnapshotError> {
    let memory = req.memory.unwrap_or(false);
    let guard = state.locks.lock(id).await;
    let row = crate::service::owned(state, auth, id).await?;
    if memory && row.isolation != Runtime::Gvisor.as_str() {
        return Err(SandboxError::invalid(
            "memory",
            format!(
                "a snapshot with memory needs the gvisor runtime; sandbox {id} runs on {}",
                row.isolation
            ),
        )
        .into());
    }
    if memory && state_of(&row) == SandboxState::Stopped {
        return Err(SnapshotError::Unsupported(format!(
            "sandbox {id} is stopped: it has no memory to snapshot (resume it, or leave memory out)"
        )));
    }
    if row.isolation != Runtime::Gvisor.as_str() || state_of(&row) != SandboxState::Running {
        return Ok(copy(state, &row, false, memory, false).await?.0);
    }
    // A running gVisor sandbox is checkpointed and restored: calls wait for its agent
    // meanwhile, and the work runs in a task of its own (with the lock), so that a client that
    // hangs up does not leave it written to disk with its row running.
    let away = state.away.begin(id);
    let st = state.clone();
    let work = tokio::spawn(crate::timing::carry(async move {
        let _guard = guard;
        let _away = away;
        copy(&st, &row, false, memory, false).await
    }));
    let (snap, _, _) = work.await.map_err(|source| SnapshotError::Task {
        sandbox: id.to_string(),
        source,
    })??;
    Ok(snap)
}

/// The workspace's snapshots, newest first: up to `limit` older than `before_seq`, and whether
/// there are more.
pub async fn list(
    state: &AppState,
    auth: &Auth,
    limit: u32,
    before_seq: Option<i64>,
) -> Result<(Vec<SnapshotRow>, bool), SnapshotError> {
    let mut rows = state
        .store
        .list_snapshots(&auth.workspace_id, limit + 1, before_seq)
        .await?;
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    Ok((rows, more))
}

/// The caller's snapshot `id`.
pub async fn get(state: &AppState, auth: &Auth, id: &str) -> Result<SnapshotRow, SnapshotError> {
    state
        .store
        .snapshot(id)
        .await?
        .filter(|s| s.workspace_id == auth.workspace_id && !s.internal)
        .ok_or(SnapshotError::NotFound)
}

/// Deletes the caller's snapshot `id` (refused while a sandbox still boots from it).
pub async fn delete(state: &AppState, auth: &Auth, id: &str) -> Result<SnapshotRow, SnapshotError> {
    let snap = get(state, auth, id).await?;
    // Sandboxes that have not booted yet still need its files: their first boot copies them.
    let booting = state.store.booting_from_snapshot(id).await?;
    if booting > 0 {
        return Err(SnapshotError::Booting { booting });
    }
    state.store.delete_snapshot(id).await?;
    if let Err(e) = state.driver.delete_snapshot(id).await {
        tracing::error!(snapshot = id, "removing snapshot files: {e}");
    }
    Ok(snap)
}

/// What a fork made.
pub struct Fork {
    /// The new sandboxes, as they are after their boot.
    pub children: Vec<SandboxRow>,
    /// Whether they were restored from a checkpoint of the source (gVisor): its processes and
    /// memory carried over.
    pub memory: bool,
    /// How long the source was frozen for the copy.
    pub source_paused_us: u64,
}

/// Checks a fork request before anything is done: its `count` (1 to [`MAX_FORK`]) and its
/// `metadata`. Answers the count.
pub fn check_fork(req: &ForkRequest) -> Result<u32, SnapshotError> {
    let count = req.count.unwrap_or(1);
    if !(1..=MAX_FORK).contains(&count) {
        return Err(SandboxError::invalid("count", "count must be from 1 to 10").into());
    }
    if let Some(m) = &req.metadata {
        crate::service::runnable::check_map("metadata", m, false)?;
    }
    Ok(count)
}

/// Forks the caller's sandbox `id`: `count` new sandboxes whose files equal its files now.
pub async fn fork(
    state: &Arc<AppState>,
    auth: &Auth,
    id: &str,
    req: ForkRequest,
) -> Result<Fork, SnapshotError> {
    let count = check_fork(&req)?;
    let guard = crate::timing::phase("lock", state.locks.lock(id)).await;
    let source = crate::timing::phase("store.read", crate::service::owned(state, auth, id)).await?;
    let st = state_of(&source);
    if !matches!(
        st,
        SandboxState::Running | SandboxState::Paused | SandboxState::Stopped
    ) {
        return Err(SnapshotError::NotForkable { state: st });
    }
    let (_, cap) = crate::timing::phase(
        "workspace",
        crate::service::runnable::workspace_cap(state, auth),
    )
    .await?;
    // On gVisor the children are restored from one checkpoint of a running or paused source.
    let memory = source.isolation == Runtime::Gvisor.as_str() && st != SandboxState::Stopped;
    let t = std::time::Instant::now();
    // A running gVisor source left on disk is restored while its children restore (two
    // restores at once take about 40% less than one after the other here), its lock held
    // until then. Both in tasks of their own, so a client that hangs up does not leave it on
    // disk.
    // Calls that need its agent wait until it is back (its lock alone does not hold them).
    let away = (memory && st == SandboxState::Running).then(|| state.away.begin(id));
    let (st, src) = (state.clone(), source.clone());
    let copied = tokio::spawn(crate::timing::carry(async move {
        let (snap, info, on_disk) = copy(&st, &src, true, memory, true).await?;
        cella_crash::crash_point!("fork.after_snapshot");
        let resumed = on_disk.map(|h| {
            tokio::spawn(async move {
                let _guard = guard;
                let _away = away;
                resume_source(&st, &src.id, &h).await;
                t.elapsed()
            })
        });
        Ok::<_, SnapshotError>((snap, info, resumed))
    }));
    let (snap, info, resumed) = copied.await.map_err(|e| SnapshotError::Task {
        sandbox: source.id.clone(),
        source: e,
    })??;
    // From here on a task of its own: a client that hangs up leaves no half-made fork and no
    // internal snapshot behind. The children are answered as soon as they booted; the
    // snapshot goes after (a server stopped before that removes it at its next start).
    let st = state.clone();
    let key = auth.key_id.clone();
    let sandbox = source.id.clone();
    let work = tokio::spawn(crate::timing::carry(async move {
        let _gone = RemovedAfter {
            state: st.clone(),
            snapshot: snap.id.clone(),
        };
        make_children(&st, &source, &snap, &req, &key, count, cap).await
    }));
    let children = work.await;
    let source_paused_us = match resumed {
        Some(r) => r.await.map_or(info.paused_us, |d| d.as_micros() as u64),
        None => info.paused_us,
    };
    let children = children.map_err(|source| SnapshotError::Task { sandbox, source })??;
    Ok(Fork {
        children,
        memory,
        source_paused_us,
    })
}

/// A fork's internal snapshot, removed (files, then row) in a task of its own once its
/// children booted: the fork is answered without waiting for it. A server stopped before that
/// removes it at its next start.
struct RemovedAfter {
    state: Arc<AppState>,
    snapshot: String,
}

impl Drop for RemovedAfter {
    fn drop(&mut self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (st, id) = (self.state.clone(), std::mem::take(&mut self.snapshot));
        rt.spawn(async move {
            // The children booted (the fork answered, or about to be), the snapshot still there.
            cella_crash::crash_point!("fork.before_snapshot_removal");
            if let Err(e) = st.driver.delete_snapshot(&id).await {
                tracing::error!(snapshot = id, "removing a fork's snapshot: {e}");
            } else if let Err(e) = st.store.delete_snapshot(&id).await {
                tracing::error!(snapshot = id, "removing a fork's snapshot's row: {e}");
            }
        });
    }
}

async fn make_children(
    state: &Arc<AppState>,
    source: &SandboxRow,
    snap: &SnapshotRow,
    req: &ForkRequest,
    key_id: &str,
    count: u32,
    cap: u32,
) -> Result<Vec<SandboxRow>, SnapshotError> {
    let mut metadata = source.metadata.clone();
    metadata.extend(req.metadata.clone().unwrap_or_default());
    let now = now_ms();
    let mut ids: Vec<String> = Vec::new();
    for _ in 0..count {
        let child = SandboxRow {
            owner_id: key_id.to_string(),
            timeout_sec: source.timeout_sec,
            always_on: source.always_on,
            persistent: source.persistent,
            idle_timeout_sec: source.idle_timeout_sec,
            metadata: metadata.clone(),
            env: source.env.clone(),
            compute_rate: source.compute_rate,
            network: source.network.clone(),
            snapshot_id: Some(snap.id.clone()),
            isolation: source.isolation.clone(),
            preview_public: source.preview_public,
            auto_resume: source.auto_resume,
            ..SandboxRow::new(
                new_id("sb"),
                source.workspace_id.clone(),
                source.template_id.clone(),
                source.size,
                (
                    source.cpu_count as u32,
                    source.memory_mb as u32,
                    source.disk_size_mb as u32,
                ),
                now,
            )
        };
        // Each child reserves its 60-second minimum, as a create does.
        if let Err(e) = crate::timing::phase("billing", crate::billing::admit(state, &child)).await
        {
            for made in &ids {
                let _ = state.store.delete_sandbox(made).await;
                crate::billing::abandon(state, made).await;
            }
            return Err(SnapshotError::Sandbox(e));
        }
        if !crate::timing::phase(
            "store.insert",
            state.store.insert_sandbox_capped(&child, cap),
        )
        .await?
        {
            crate::billing::abandon(state, &child.id).await;
            for made in &ids {
                let _ = state.store.delete_sandbox(made).await;
                crate::billing::abandon(state, made).await;
            }
            return Err(SnapshotError::OverCap { count, cap });
        }
        ids.push(child.id);
    }
    cella_crash::crash_point!("fork.after_children_insert");
    // One child on the namespace runtime takes the fork's own snapshot files (deleted after the
    // boot anyway) instead of a copy of them: one copy of the source's disk per fork, not two.
    if let [only] = ids.as_slice() {
        if !snap.memory && source.isolation == Runtime::Namespace.as_str() {
            match state.driver.give_snapshot(&snap.id, only).await {
                Ok(_) => {}
                Err(e) => tracing::warn!(sandbox = only, "moving a fork's files: {e}"),
            }
        }
    }
    let boots: Vec<_> = ids
        .iter()
        .map(|cid| {
            let (st, cid) = (state.clone(), cid.clone());
            tokio::spawn(crate::timing::carry(async move {
                crate::timing::phase("boot", crate::service::boot::boot(&st, &cid)).await
            }))
        })
        .collect();
    for b in boots {
        let _ = b.await;
    }
    let mut out = Vec::new();
    for cid in &ids {
        if let Some(r) = state.store.sandbox(cid).await? {
            if r.state == SandboxState::Error {
                crate::billing::settle_logged(state, &r).await;
            }
            out.push(r);
        }
    }
    Ok(out)
}
