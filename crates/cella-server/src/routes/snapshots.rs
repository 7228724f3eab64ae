//! Snapshots of a sandbox's files, and forks (a snapshot taken for new sandboxes at once).
//!
//! A snapshot is a copy of the sandbox's writable layer (its disk image) taken while its
//! processes are frozen for the instant the copy needs; the template's layers stay shared. A
//! sandbox made from a snapshot gets its own copy of it, so nothing depends on a snapshot once
//! created from it: deleting a snapshot is always allowed and never affects a sandbox.

use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::{ApiBody, Page, QueryPairs};
use crate::sandboxes::{state_of, to_wire};
use crate::util::{new_id, now_ms, rfc3339};
use crate::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use cella_runtime::DriverError;
use cella_store::{SandboxRow, SnapshotRow};
use cella_types::{
    Data, ErrorCode, ForkInfo, ForkRequest, ForkResult, List, SandboxState, Snapshot,
};
use std::sync::Arc;

fn wire(s: &SnapshotRow) -> Snapshot {
    Snapshot {
        id: s.id.clone(),
        sandbox_id: s.sandbox_id.clone(),
        template_id: crate::catalog::public_id(&s.template_id).to_string(),
        size: s.size,
        created_at: rfc3339(s.created_at),
        size_bytes: s.size_bytes.max(0) as u64,
    }
}

fn driver_error(id: &str, e: DriverError) -> ApiError {
    match e {
        DriverError::Unsupported(m) => ApiError::new(ErrorCode::Conflict, m),
        other => {
            tracing::error!(sandbox = id, "snapshot: {other}");
            ApiError::internal()
        }
    }
}

/// Takes a snapshot of sandbox `id` (the caller holds its lock and checked the workspace).
async fn take(
    state: &AppState,
    row: &SandboxRow,
    internal: bool,
) -> Result<(SnapshotRow, cella_runtime::SnapshotInfo), ApiError> {
    let handle = match state_of(row) {
        SandboxState::Running | SandboxState::Paused => crate::rows::handle_or_none(row),
        SandboxState::Stopped => None,
        other => {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!(
                    "sandbox is {}: only a running, paused or stopped sandbox has files to copy",
                    other.as_str()
                ),
            ))
        }
    };
    // The workspace's storage quota: a snapshot that would pass it is not kept.
    let storage = crate::quotas::storage(state, &row.workspace_id).await?;
    if !internal {
        storage.check(0, "a snapshot")?;
    }
    let snap_id = new_id("snap");
    let info = state
        .driver
        .snapshot(&row.id, handle.as_ref(), &snap_id)
        .await
        .map_err(|e| driver_error(&row.id, e))?;
    if !internal {
        if let Err(e) = storage.check(info.size_bytes, "this snapshot") {
            let _ = state.driver.delete_snapshot(&snap_id).await;
            return Err(e);
        }
    }
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
    };
    if let Err(e) = state.store.insert_snapshot(&snap).await {
        let _ = state.driver.delete_snapshot(&snap.id).await;
        return Err(e.into());
    }
    Ok((snap, info))
}

/// Snapshot a sandbox's files (running: frozen for the instant the copy takes; paused or
/// stopped: copied as they are). Scope `sandboxes:write`.
#[utoipa::path(post, path = "/api/v1/sandboxes/{id}/snapshots", tag = "snapshots",
    params(("id" = String, Path)),
    responses((status = 201, body = Data<Snapshot>), (status = 404, body = cella_types::ErrorBody),
              (status = 409, body = cella_types::ErrorBody)))]
pub async fn create(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<Data<Snapshot>>), ApiError> {
    let _guard = state.locks.lock(&id).await;
    let row = crate::sandboxes::owned(&state, &auth, &id).await?;
    let (snap, _) = take(&state, &row, false).await?;
    Ok((StatusCode::CREATED, Json(Data { data: wire(&snap) })))
}

/// The workspace's snapshots, newest first. Scope `sandboxes:read`.
#[utoipa::path(get, path = "/api/v1/snapshots", tag = "snapshots",
    params(("limit" = Option<u32>, Query), ("cursor" = Option<String>, Query)),
    responses((status = 200, body = List<Snapshot>)))]
pub async fn list(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    q: QueryPairs,
) -> Result<Json<List<Snapshot>>, ApiError> {
    let mut pairs = q.0;
    let page = Page::take(&mut pairs)?;
    if let Some((k, _)) = pairs.first() {
        return Err(ApiError::invalid(k, format!("unknown query parameter {k}")));
    }
    let rows = state
        .store
        .list_snapshots(&auth.workspace_id, page.limit + 1, page.cursor)
        .await?;
    let more = rows.len() > page.limit as usize;
    let rows = &rows[..rows.len().min(page.limit as usize)];
    Ok(Json(List {
        data: rows.iter().map(wire).collect(),
        next_cursor: more
            .then(|| rows.last().map(|r| format!("c{}", r.seq)))
            .flatten(),
    }))
}

async fn own_snapshot(state: &AppState, auth: &Auth, id: &str) -> Result<SnapshotRow, ApiError> {
    state
        .store
        .snapshot(id)
        .await?
        .filter(|s| s.workspace_id == auth.workspace_id && !s.internal)
        .ok_or_else(|| ApiError::not_found("snapshot"))
}

/// One snapshot. Scope `sandboxes:read`.
#[utoipa::path(get, path = "/api/v1/snapshots/{id}", tag = "snapshots",
    params(("id" = String, Path)),
    responses((status = 200, body = Data<Snapshot>), (status = 404, body = cella_types::ErrorBody)))]
pub async fn get(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Data<Snapshot>>, ApiError> {
    Ok(Json(Data {
        data: wire(&own_snapshot(&state, &auth, &id).await?),
    }))
}

/// Delete a snapshot. Sandboxes made from it keep their own copy of its files, so this is
/// always allowed. Scope `sandboxes:write`.
#[utoipa::path(delete, path = "/api/v1/snapshots/{id}", tag = "snapshots",
    params(("id" = String, Path)),
    responses((status = 200, body = Data<Snapshot>), (status = 404, body = cella_types::ErrorBody)))]
pub async fn delete(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Data<Snapshot>>, ApiError> {
    let snap = own_snapshot(&state, &auth, &id).await?;
    // Sandboxes that have not booted yet still need its files: their first boot copies them.
    let booting = state.store.booting_from_snapshot(&id).await?;
    if booting > 0 {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!(
                "{booting} sandbox(es) are starting from this snapshot; delete it once they run"
            ),
        ));
    }
    state.store.delete_snapshot(&id).await?;
    if let Err(e) = state.driver.delete_snapshot(&id).await {
        tracing::error!(snapshot = id, "removing snapshot files: {e}");
    }
    Ok(Json(Data { data: wire(&snap) }))
}

/// Fork a sandbox: `count` (1-10) new sandboxes whose files equal the source's at this instant.
/// The source keeps running (frozen only while its files are copied). Processes and memory do
/// not carry over on the namespace backend: the new sandboxes boot fresh on the copied files.
/// Scope `sandboxes:write`.
#[utoipa::path(post, path = "/api/v1/sandboxes/{id}/fork", tag = "snapshots",
    params(("id" = String, Path)), request_body = ForkRequest,
    responses((status = 201, body = ForkResult), (status = 404, body = cella_types::ErrorBody),
              (status = 409, body = cella_types::ErrorBody), (status = 429, body = cella_types::ErrorBody)))]
pub async fn fork(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    body: ApiBody,
) -> Result<(StatusCode, Json<ForkResult>), ApiError> {
    let req: ForkRequest = if body.is_empty() {
        ForkRequest::default()
    } else {
        body.json()?
    };
    let count = req.count.unwrap_or(1);
    if !(1..=10).contains(&count) {
        return Err(ApiError::invalid("count", "count must be from 1 to 10"));
    }
    if let Some(m) = &req.metadata {
        crate::sandboxes::check_map("metadata", m, false)?;
    }
    let guard = state.locks.lock(&id).await;
    let source = crate::sandboxes::owned(&state, &auth, &id).await?;
    if !matches!(
        state_of(&source),
        SandboxState::Running | SandboxState::Paused | SandboxState::Stopped
    ) {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!(
                "sandbox is {}: only a running, paused or stopped sandbox can be forked",
                source.state
            ),
        ));
    }
    let (_, cap) = crate::sandboxes::workspace_cap(&state, &auth).await?;
    let (snap, info) = take(&state, &source, true).await?;
    drop(guard);
    // From here on a task of its own: a client that hangs up leaves no half-made fork and no
    // internal snapshot behind.
    let st = state.clone();
    let key = auth.key_id.clone();
    let work = tokio::spawn(async move {
        let res = make_children(&st, &source, &snap, &req, &key, count, cap).await;
        if let Err(e) = st.driver.delete_snapshot(&snap.id).await {
            tracing::error!(snapshot = snap.id, "removing a fork's snapshot: {e}");
        }
        let _ = st.store.delete_snapshot(&snap.id).await;
        res
    });
    let children = work.await.map_err(|_| ApiError::internal())??;
    Ok((
        StatusCode::CREATED,
        Json(ForkResult {
            data: children.iter().map(|r| to_wire(&state, r)).collect(),
            fork: ForkInfo {
                source_id: id,
                source_paused_ms: info.paused_us as f64 / 1000.0,
                filesystem_copied: true,
                processes_copied: false,
            },
        }),
    ))
}

async fn make_children(
    state: &Arc<AppState>,
    source: &SandboxRow,
    snap: &SnapshotRow,
    req: &ForkRequest,
    key_id: &str,
    count: u32,
    cap: u32,
) -> Result<Vec<SandboxRow>, ApiError> {
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
        if !state.store.insert_sandbox_capped(&child, cap).await? {
            for made in &ids {
                let _ = state.store.delete_sandbox(made).await;
            }
            let mut e = ApiError::new(
                ErrorCode::ConcurrencyLimit,
                format!(
                    "forking {count} would pass the workspace's cap of {cap} concurrent sandboxes"
                ),
            )
            .with_details(serde_json::json!({ "limit": cap, "count": count }));
            e.retry_after = Some(5);
            return Err(e);
        }
        ids.push(child.id);
    }
    let boots: Vec<_> = ids
        .iter()
        .map(|cid| {
            let (st, cid) = (state.clone(), cid.clone());
            tokio::spawn(async move { crate::sandboxes::boot(&st, &cid).await })
        })
        .collect();
    for b in boots {
        let _ = b.await;
    }
    let mut out = Vec::new();
    for cid in &ids {
        if let Some(r) = state.store.sandbox(cid).await? {
            out.push(r);
        }
    }
    Ok(out)
}
