//! The snapshot and fork routes: each parses its request, calls one function of
//! [`crate::snapshots`] (where what a snapshot is, and what a fork does, is told) and
//! encodes the answer.

use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::{ApiBody, Page, QueryPairs};
use crate::sandboxes::to_wire;
use crate::snapshots as service;
use crate::util::rfc3339;
use crate::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use cella_store::SnapshotRow;
use cella_types::{CreateSnapshot, Data, ForkInfo, ForkRequest, ForkResult, List, Snapshot};
use std::sync::Arc;

fn wire(s: &SnapshotRow) -> Snapshot {
    Snapshot {
        id: s.id.clone(),
        sandbox_id: s.sandbox_id.clone(),
        template_id: crate::catalog::public_id(&s.template_id).to_string(),
        size: s.size,
        created_at: rfc3339(s.created_at),
        size_bytes: s.size_bytes.max(0) as u64,
        memory: s.memory,
    }
}

/// Snapshot a sandbox's files (running: frozen for the instant the copy takes; paused or
/// stopped: copied as they are). With `"memory": true` (gVisor sandboxes, running or paused)
/// its memory and processes too: a running one is checkpointed and restored, and sandboxes
/// made from the snapshot continue where it was. Scope `sandboxes:write`.
#[utoipa::path(post, path = "/api/v1/sandboxes/{id}/snapshots", tag = "snapshots",
    params(("id" = String, Path)), request_body(content = Option<CreateSnapshot>),
    responses((status = 201, body = Data<Snapshot>), (status = 400, body = cella_types::ErrorBody),
              (status = 404, body = cella_types::ErrorBody),
              (status = 409, body = cella_types::ErrorBody)))]
pub async fn create(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    body: ApiBody,
) -> Result<(StatusCode, Json<Data<Snapshot>>), ApiError> {
    let req: CreateSnapshot = if body.is_empty() {
        CreateSnapshot::default()
    } else {
        body.json()?
    };
    let snap = service::take(&state, &auth, &id, &req).await?;
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
    let (rows, more) = service::list(&state, &auth, page.limit, page.cursor).await?;
    Ok(Json(List {
        data: rows.iter().map(wire).collect(),
        next_cursor: more
            .then(|| rows.last().map(|r| format!("c{}", r.seq)))
            .flatten(),
    }))
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
        data: wire(&service::get(&state, &auth, &id).await?),
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
    let snap = service::delete(&state, &auth, &id).await?;
    Ok(Json(Data { data: wire(&snap) }))
}

/// Fork a sandbox: `count` (1-10) new sandboxes whose files equal the source's at this instant.
/// The source keeps running (frozen only while its files are copied). Processes and memory do
/// not carry over on the namespace runtime: the new sandboxes boot fresh on the copied files.
/// On gVisor they do: every new sandbox is restored from one checkpoint of the source.
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
    let fork = service::fork(&state, &auth, &id, req).await?;
    Ok((
        StatusCode::CREATED,
        Json(ForkResult {
            data: fork.children.iter().map(|r| to_wire(&state, r)).collect(),
            fork: ForkInfo {
                source_id: id,
                source_paused_ms: fork.source_paused_us as f64 / 1000.0,
                filesystem_copied: true,
                processes_copied: fork.memory,
            },
        }),
    ))
}
