//! One-shot runs, and the artifacts the server keeps (see `runs.rs`).

use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::{ApiBody, Page, QueryPairs};
use crate::runs;
use crate::service::runnable;
use crate::AppState;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cella_types::{Artifact, CollectRequest, Data, ExecUser, List, RunRequest, RunResult};
use std::sync::Arc;

/// Create a sandbox, write files, run a command, collect artifacts, destroy the sandbox, all
/// in this one request. The sandbox is destroyed whatever happens (a failure, a timeout, the
/// client hanging up). Scopes `sandboxes:write` and `sandboxes:exec`.
#[utoipa::path(post, path = "/api/v1/sandboxes/run", tag = "runs",
    request_body = RunRequest,
    responses((status = 200, body = Data<RunResult>), (status = 400, body = cella_types::ErrorBody),
              (status = 429, body = cella_types::ErrorBody)))]
pub async fn run(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    body: ApiBody,
) -> Result<Json<Data<RunResult>>, ApiError> {
    let req: RunRequest = body.json()?;
    Ok(Json(Data {
        data: runs::run(&state, &auth, req).await?,
    }))
}

/// Keep files of a running sandbox (paths or globs) as artifacts. Scope `sandboxes:exec`.
#[utoipa::path(post, path = "/api/v1/sandboxes/{id}/artifacts", tag = "runs",
    params(("id" = String, Path)), request_body = CollectRequest,
    responses((status = 201, body = List<Artifact>), (status = 409, body = cella_types::ErrorBody)))]
pub async fn collect(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    body: ApiBody,
) -> Result<(StatusCode, Json<List<Artifact>>), ApiError> {
    let req: CollectRequest = body.json()?;
    if req.paths.is_empty() {
        return Err(ApiError::invalid("paths", "name at least one path or glob"));
    }
    let sb = runnable(&state, &auth, &id).await?;
    let kept = runs::collect(&state, &sb, &req.paths, "/home/user", ExecUser::User).await?;
    Ok((
        StatusCode::CREATED,
        Json(List {
            data: kept.iter().map(|a| runs::wire(&state, a)).collect(),
            next_cursor: None,
        }),
    ))
}

/// The workspace's artifacts, newest first (`sandbox_id` narrows them). Scope `sandboxes:read`.
#[utoipa::path(get, path = "/api/v1/artifacts", tag = "runs",
    params(("sandbox_id" = Option<String>, Query), ("limit" = Option<u32>, Query), ("cursor" = Option<String>, Query)),
    responses((status = 200, body = List<Artifact>)))]
pub async fn list(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    q: QueryPairs,
) -> Result<Json<List<Artifact>>, ApiError> {
    let mut pairs = q.0;
    let page = Page::take(&mut pairs)?;
    let mut sandbox = None;
    for (k, v) in pairs {
        match k.as_str() {
            "sandbox_id" => sandbox = Some(v),
            other => {
                return Err(ApiError::invalid(
                    other,
                    format!("unknown query parameter {other}"),
                ))
            }
        }
    }
    let rows = state
        .store
        .list_artifacts(
            &auth.workspace_id,
            sandbox.as_deref(),
            page.limit + 1,
            page.cursor,
        )
        .await?;
    let more = rows.len() > page.limit as usize;
    let rows = &rows[..rows.len().min(page.limit as usize)];
    Ok(Json(List {
        data: rows.iter().map(|a| runs::wire(&state, a)).collect(),
        next_cursor: more
            .then(|| rows.last().map(|r| format!("c{}", r.seq)))
            .flatten(),
    }))
}

async fn own(
    state: &AppState,
    auth: &Auth,
    id: &str,
) -> Result<cella_store::ArtifactRow, ApiError> {
    state
        .store
        .artifact(id)
        .await?
        .filter(|a| a.workspace_id == auth.workspace_id)
        .ok_or_else(|| ApiError::not_found("artifact"))
}

/// An artifact's bytes; it stays downloadable after its sandbox is gone, until it expires.
/// Scope `sandboxes:read`.
#[utoipa::path(get, path = "/api/v1/artifacts/{id}", tag = "runs",
    params(("id" = String, Path)),
    responses((status = 200, description = "the bytes", content_type = "application/octet-stream"),
              (status = 404, body = cella_types::ErrorBody)))]
pub async fn download(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let a = own(&state, &auth, &id).await?;
    let f = tokio::fs::File::open(runs::artifact_dir(&state).join(&a.id))
        .await
        .map_err(|_| ApiError::not_found("artifact"))?;
    let stream = tokio_util::io::ReaderStream::new(f);
    let mut res = Body::from_stream(stream).into_response();
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(
        header::CONTENT_LENGTH,
        HeaderValue::from(a.size.max(0) as u64),
    );
    let name = a
        .path
        .rsplit('/')
        .next()
        .unwrap_or("artifact")
        .replace(['"', '\\'], "_");
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(res)
}

/// Delete an artifact now. Scope `sandboxes:write`.
#[utoipa::path(delete, path = "/api/v1/artifacts/{id}", tag = "runs",
    params(("id" = String, Path)),
    responses((status = 200, body = Data<Artifact>), (status = 404, body = cella_types::ErrorBody)))]
pub async fn delete(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Data<Artifact>>, ApiError> {
    let a = own(&state, &auth, &id).await?;
    state.store.delete_artifact(&a.id).await?;
    let _ = tokio::fs::remove_file(runs::artifact_dir(&state).join(&a.id)).await;
    Ok(Json(Data {
        data: runs::wire(&state, &a),
    }))
}
