//! The files routes. Every operation is carried out by the sandbox's agent, whose root is the
//! sandbox's root, so no path (`..`, absolute or escaping symlinks) can reach the host.
//! Uploads and downloads stream through: the server never holds a whole file.
//!
//! An upload (`PUT`) with a `Content-Length` over `[files] max_upload_bytes` is a 413 at once.
//! `AgentClient::write_file` sends `Write`, the body's chunks as `Data` frames, then `DataEnd`; the
//! agent writes beside the target (a `.cella-upload-` file; missing parents are made) and at
//! `DataEnd` syncs, sets mode and owner, and renames it into place. Past the limit the client
//! shuts the connection and waits until the agent removed the partial file; the request layer reads
//! a bounded part of the rest of the body behind the 413, so that the client can read it. A download (`GET`) sends `Read`
//! and streams the agent's `Data` frames as the body (only a few frames are in flight either way,
//! so the server's memory stays flat); a suffix `Range` first learns the size, a range outside the
//! file is a 416 with `Content-Range: bytes */SIZE`. A watch (the agent's inotify) is sent on as
//! server-sent events; the agent's own upload files are hidden (their `create` and `modify` are
//! dropped, and the rename that lands one is the target's `create`).

use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::{ApiBody, QueryPairs};
use crate::service::{AgentOp, CheckedAgent};
use crate::util::rfc3339;
use crate::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cella_agent::client::WriteError;
use cella_agent::proto::{FileInfo, Request, Response as AgentResponse};
use cella_runtime::rootfs::USER_UID;
use cella_types::{Data, Deleted, ErrorCode, FileEntry, FileList, MkdirRequest, MoveRequest};
use futures_util::StreamExt;
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;

/// Entries a listing returns at most.
const LIST_LIMIT_MAX: usize = 10_000;

fn entry(i: FileInfo) -> FileEntry {
    FileEntry {
        name: i.name,
        path: i.path,
        kind: i.kind,
        size: i.size,
        mode: format!("{:04o}", i.mode),
        modified_at: rfc3339(i.modified * 1000),
        uid: i.uid,
        gid: i.gid,
        symlink_target: i.target,
    }
}

/// The agent of a running sandbox of the caller's workspace (404 / 409 otherwise).
async fn agent(state: &Arc<AppState>, auth: &Auth, id: &str) -> Result<CheckedAgent, ApiError> {
    Ok(crate::service::runnable(state, auth, id)
        .await?
        .checked_agent(state, AgentOp::Files))
}

/// Query parameters by name; unknown ones are refused.
fn params(q: Vec<(String, String)>, allowed: &[&str]) -> Result<HashMap<String, String>, ApiError> {
    let mut out = HashMap::new();
    for (k, v) in q {
        if !allowed.contains(&k.as_str()) {
            return Err(ApiError::invalid(
                &k,
                format!("unknown query parameter {k:?}"),
            ));
        }
        out.insert(k, v);
    }
    Ok(out)
}

fn path_of(p: &HashMap<String, String>, name: &str) -> Result<String, ApiError> {
    let path = p
        .get(name)
        .cloned()
        .ok_or_else(|| ApiError::invalid(name, format!("{name} is required")))?;
    if !path.starts_with('/') {
        return Err(ApiError::invalid(
            name,
            format!("{name} must be an absolute path inside the sandbox"),
        ));
    }
    Ok(path)
}

fn flag(p: &HashMap<String, String>, name: &str) -> Result<bool, ApiError> {
    match p.get(name).map(String::as_str) {
        None | Some("false") | Some("0") => Ok(false),
        Some("true") | Some("1") | Some("") => Ok(true),
        Some(_) => Err(ApiError::invalid(
            name,
            format!("{name} must be true or false"),
        )),
    }
}

fn owner(p: &HashMap<String, String>) -> Result<u32, ApiError> {
    match p.get("user").map(String::as_str) {
        None | Some("user") => Ok(USER_UID),
        Some("root") => Ok(0),
        Some(_) => Err(ApiError::invalid(
            "user",
            "user must be \"user\" or \"root\"",
        )),
    }
}

async fn stat_entry(agent: &CheckedAgent, path: &str) -> Result<FileEntry, ApiError> {
    match agent
        .check(
            agent
                .call(&Request::Stat {
                    path: path.to_string(),
                })
                .await,
        )
        .await?
    {
        AgentResponse::Stat(i) => Ok(entry(i)),
        _ => Err(crate::service::SandboxError::UnexpectedAnswer("a file's stat").into()),
    }
}

/// Upload a file (raw body, at most 500 MiB by default; parents are created). Scope `sandboxes:exec`.
#[utoipa::path(put, path = "/api/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path), ("path" = String, Query, description = "absolute path inside the sandbox"),
           ("user" = Option<String>, Query, description = "owner: user (default) or root"),
           ("mode" = Option<String>, Query, description = "permission bits in octal, default 0644")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 200, body = Data<FileEntry>), (status = 409, body = cella_types::ErrorBody),
              (status = 413, body = cella_types::ErrorBody)))]
pub async fn upload(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    QueryPairs(q): QueryPairs,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Data<FileEntry>>, ApiError> {
    let p = params(q, &["path", "user", "mode"])?;
    let path = path_of(&p, "path")?;
    let uid = owner(&p)?;
    let mode = match p.get("mode") {
        None => 0o644,
        Some(m) => u32::from_str_radix(m, 8)
            .ok()
            .filter(|m| *m <= 0o7777)
            .ok_or_else(|| {
                ApiError::invalid("mode", "mode must be octal permission bits such as 0644")
            })?,
    };
    let max = state.config.files.max_upload_bytes;
    let too_large = || {
        ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("uploads are limited to {max} bytes"),
        )
        .with_details(json!({ "limit": max }))
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max) {
        return Err(too_large());
    }
    let agent = agent(&state, &auth, &id).await?;
    let _busy = state.activity.busy(&id);
    let chunks = body
        .into_data_stream()
        .map(|r| r.map(|b: Bytes| b.to_vec()));
    match agent.write_file(&path, uid, uid, mode, max, chunks).await {
        Ok(_) => Ok(Json(Data {
            data: stat_entry(&agent, &path).await?,
        })),
        // The rest of the body is read on behind the answer (the request layer's `BodyEnd`),
        // so that the client, still sending, gets to read it instead of a reset connection.
        Err(WriteError::TooLarge) => Err(too_large()),
        Err(WriteError::Source(e)) => Err(ApiError::invalid(
            "body",
            format!("the upload was interrupted: {e}"),
        )),
        Err(WriteError::Agent(e)) => Err(agent.failure(e).await.into()),
    }
}

/// `Range: bytes=a-b | a- | -n` as (offset, length), given the file's size when needed.
fn parse_range(v: &str) -> Option<(Option<u64>, Option<u64>)> {
    let spec = v.trim().strip_prefix("bytes=")?;
    if spec.contains(',') {
        return None; // one range only
    }
    let (a, b) = spec.split_once('-')?;
    match (a.trim(), b.trim()) {
        ("", n) => Some((None, Some(n.parse().ok()?))),
        (a, "") => Some((Some(a.parse().ok()?), None)),
        (a, b) => {
            let (a, b): (u64, u64) = (a.parse().ok()?, b.parse().ok()?);
            (b >= a).then(|| (Some(a), Some(b - a + 1)))
        }
    }
}

/// Download a file (streamed; `Range` honoured). Scope `sandboxes:read`.
#[utoipa::path(get, path = "/api/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path), ("path" = String, Query)),
    responses((status = 200, description = "the file's bytes"), (status = 206, description = "the requested range"),
              (status = 404, body = cella_types::ErrorBody), (status = 416, body = cella_types::ErrorBody)))]
pub async fn download(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    QueryPairs(q): QueryPairs,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let p = params(q, &["path"])?;
    let path = path_of(&p, "path")?;
    let agent = agent(&state, &auth, &id).await?;
    // A Range this server cannot serve (several ranges, another unit, nonsense) is ignored and
    // the whole file is sent, as HTTP allows.
    let range = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_range);
    let unsatisfiable = |size: u64| {
        let mut e = ApiError::new(
            ErrorCode::RangeNotSatisfiable,
            format!("the range lies outside the file ({size} bytes)"),
        )
        .with_details(json!({ "size": size }));
        e.content_range = Some(format!("bytes */{size}"));
        e
    };
    let (offset, length) = match range {
        None => (0, None),
        Some((Some(a), len)) => (a, len),
        Some((None, Some(suffix))) => {
            // The size of what the path leads to (following links), from the agent.
            let size = agent
                .check(agent.read_file(&path, 0, Some(0)).await)
                .await?
                .size;
            (size.saturating_sub(suffix), Some(suffix.min(size)))
        }
        Some((None, None)) => (0, None),
    };
    let reader = agent
        .check(agent.read_file(&path, offset, length).await)
        .await?;
    if range.is_some() && (offset >= reader.size || reader.length == 0) {
        return Err(unsatisfiable(reader.size));
    }
    let (size, start, len) = (reader.size, reader.offset, reader.length);
    let busy = state.activity.busy(&id);
    let stream = futures_util::stream::unfold((reader, busy), |(mut r, busy)| async move {
        r.next_chunk()
            .await
            .map(|c| (c.map(Bytes::from).map_err(std::io::Error::other), (r, busy)))
    });
    let mut res = Body::from_stream(stream).into_response();
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if range.is_some() {
        *res.status_mut() = StatusCode::PARTIAL_CONTENT;
        let last = (start + len).saturating_sub(1);
        if let Ok(v) = HeaderValue::from_str(&format!("bytes {start}-{last}/{size}")) {
            res.headers_mut().insert(header::CONTENT_RANGE, v);
        }
    }
    Ok(res)
}

/// List a directory (`recursive=true` for the whole tree). Scope `sandboxes:read`.
#[utoipa::path(get, path = "/api/v1/sandboxes/{id}/files/list", tag = "files",
    params(("id" = String, Path), ("path" = String, Query), ("recursive" = Option<bool>, Query),
           ("limit" = Option<u32>, Query, description = "1-10000, default 1000")),
    responses((status = 200, body = FileList), (status = 404, body = cella_types::ErrorBody)))]
pub async fn list(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    QueryPairs(q): QueryPairs,
) -> Result<Json<FileList>, ApiError> {
    let p = params(q, &["path", "recursive", "limit"])?;
    let path = path_of(&p, "path")?;
    let recursive = flag(&p, "recursive")?;
    let limit = match p.get("limit") {
        None => 1000,
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|l| (1..=LIST_LIMIT_MAX).contains(l))
            .ok_or_else(|| ApiError::invalid("limit", "limit must be from 1 to 10000"))?,
    };
    let agent = agent(&state, &auth, &id).await?;
    match agent
        .check(
            agent
                .call(&Request::List {
                    path,
                    recursive,
                    limit,
                })
                .await,
        )
        .await?
    {
        AgentResponse::Entries { entries, truncated } => Ok(Json(FileList {
            data: entries.into_iter().map(entry).collect(),
            next_cursor: None,
            truncated,
        })),
        _ => Err(crate::service::SandboxError::UnexpectedAnswer("listing a directory").into()),
    }
}

/// Metadata of one path (a symlink is described, not followed). Scope `sandboxes:read`.
#[utoipa::path(get, path = "/api/v1/sandboxes/{id}/files/stat", tag = "files",
    params(("id" = String, Path), ("path" = String, Query)),
    responses((status = 200, body = Data<FileEntry>), (status = 404, body = cella_types::ErrorBody)))]
pub async fn stat(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    QueryPairs(q): QueryPairs,
) -> Result<Json<Data<FileEntry>>, ApiError> {
    let p = params(q, &["path"])?;
    let path = path_of(&p, "path")?;
    let agent = agent(&state, &auth, &id).await?;
    Ok(Json(Data {
        data: stat_entry(&agent, &path).await?,
    }))
}

/// `mkdir -p`; new directories belong to the sandbox's user. Scope `sandboxes:exec`.
#[utoipa::path(post, path = "/api/v1/sandboxes/{id}/files/mkdir", tag = "files",
    params(("id" = String, Path)), request_body = MkdirRequest,
    responses((status = 200, body = Data<FileEntry>), (status = 409, body = cella_types::ErrorBody)))]
pub async fn mkdir(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    body: ApiBody,
) -> Result<Json<Data<FileEntry>>, ApiError> {
    let req: MkdirRequest = body.json()?;
    if !req.path.starts_with('/') {
        return Err(ApiError::invalid(
            "path",
            "path must be an absolute path inside the sandbox",
        ));
    }
    let agent = agent(&state, &auth, &id).await?;
    let r = Request::Mkdir {
        path: req.path.clone(),
        uid: USER_UID,
        gid: USER_UID,
    };
    agent.check(agent.call(&r).await).await?;
    Ok(Json(Data {
        data: stat_entry(&agent, &req.path).await?,
    }))
}

/// Move or rename. Scope `sandboxes:exec`.
#[utoipa::path(post, path = "/api/v1/sandboxes/{id}/files/move", tag = "files",
    params(("id" = String, Path)), request_body = MoveRequest,
    responses((status = 200, body = Data<FileEntry>), (status = 404, body = cella_types::ErrorBody)))]
pub async fn rename(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    body: ApiBody,
) -> Result<Json<Data<FileEntry>>, ApiError> {
    let req: MoveRequest = body.json()?;
    for (field, v) in [("from", &req.from), ("to", &req.to)] {
        if !v.starts_with('/') {
            return Err(ApiError::invalid(
                field,
                format!("{field} must be an absolute path inside the sandbox"),
            ));
        }
    }
    let agent = agent(&state, &auth, &id).await?;
    agent
        .check(
            agent
                .call(&Request::Move {
                    from: req.from,
                    to: req.to.clone(),
                })
                .await,
        )
        .await?;
    Ok(Json(Data {
        data: stat_entry(&agent, &req.to).await?,
    }))
}

/// Delete a file, or a directory (`recursive=true` unless it is empty). Scope `sandboxes:exec`.
#[utoipa::path(delete, path = "/api/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path), ("path" = String, Query), ("recursive" = Option<bool>, Query)),
    responses((status = 200, body = Data<Deleted>), (status = 404, body = cella_types::ErrorBody),
              (status = 409, body = cella_types::ErrorBody)))]
pub async fn remove(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    QueryPairs(q): QueryPairs,
) -> Result<Json<Data<Deleted>>, ApiError> {
    let p = params(q, &["path", "recursive"])?;
    let path = path_of(&p, "path")?;
    let recursive = flag(&p, "recursive")?;
    let agent = agent(&state, &auth, &id).await?;
    agent
        .check(
            agent
                .call(&Request::Remove {
                    path: path.clone(),
                    recursive,
                })
                .await,
        )
        .await?;
    Ok(Json(Data {
        data: Deleted {
            path,
            deleted: true,
        },
    }))
}

/// Watch a directory for changes, as server-sent events `create`, `modify` (a file written and
/// closed), `delete` and `rename`; data `{"path", "dir", "from"?}`. `recursive=true` follows the
/// tree, new directories included. Scope `sandboxes:read`.
#[utoipa::path(get, path = "/api/v1/sandboxes/{id}/files/watch", tag = "files",
    params(("id" = String, Path), ("path" = String, Query), ("recursive" = Option<bool>, Query)),
    responses((status = 200, content_type = "text/event-stream"), (status = 404, body = cella_types::ErrorBody),
              (status = 409, body = cella_types::ErrorBody)))]
pub async fn watch(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    QueryPairs(q): QueryPairs,
) -> Result<
    axum::response::sse::Sse<
        impl futures_util::Stream<Item = Result<axum::response::sse::Event, std::convert::Infallible>>,
    >,
    ApiError,
> {
    let p = params(q, &["path", "recursive"])?;
    let path = path_of(&p, "path")?;
    let recursive = flag(&p, "recursive")?;
    let agent = agent(&state, &auth, &id).await?;
    let watcher = agent.check(agent.watch(&path, recursive).await).await?;
    // The agent ends a watch only when the sandbox goes away under it (destroyed, stopped,
    // paused to disk or checkpointed on gVisor, which closes every connection): the last event
    // is an `error` saying why, as a followed output's is.
    let stream = futures_util::stream::unfold(Some((watcher, agent)), |open| async move {
        let (mut w, agent) = open?;
        let Some(change) = w.next().await else {
            let e = ApiError::from(
                agent
                    .failure(cella_agent::client::ClientError::HungUp)
                    .await,
            );
            let data = json!({ "error": { "code": e.code.as_str(), "message": e.message, "details": e.details } });
            return Some((Ok(crate::sse::event("error", &data)), None));
        };
        let mut data = json!({ "path": change.path, "dir": change.dir });
        if let Some(from) = change.from {
            data["from"] = json!(from);
        }
        Some((
            Ok(crate::sse::event(&change.event, &data)),
            Some((w, agent)),
        ))
    });
    Ok(axum::response::sse::Sse::new(stream).keep_alive(axum::response::sse::KeepAlive::default()))
}

#[cfg(test)]
mod tests {
    use super::parse_range;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-99"), Some((Some(0), Some(100))));
        assert_eq!(parse_range("bytes=100-"), Some((Some(100), None)));
        assert_eq!(parse_range("bytes=-5"), Some((None, Some(5))));
        assert_eq!(parse_range("bytes=5-1"), None);
        assert_eq!(parse_range("bytes=0-1,4-5"), None);
        assert_eq!(parse_range("items=0-1"), None);
    }
}
