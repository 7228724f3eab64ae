use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::{cursor_for, ApiBody, Page, QueryPairs};
use crate::lifecycle;
use crate::sandboxes as svc;
use crate::service::Runnable;
use crate::sse;
use crate::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::Json;
use cella_store::{SandboxFilter, SandboxRow};
use cella_types::{
    CreateSandbox, Data, ExecRequest, ExecResult, List, Sandbox, SandboxState, SetTimeout, Usage,
};
use std::sync::Arc;

/// The sandbox, if it exists and belongs to the caller's workspace; else 404.
async fn find(state: &AppState, auth: &Auth, id: &str) -> Result<SandboxRow, ApiError> {
    Ok(svc::owned(state, auth, id)
        .await
        .inspect(|r| state.activity.touch(&r.id))?)
}

/// Create a sandbox. Scope `sandboxes:write`. 201 once running (`wait`, the default), else 202.
#[utoipa::path(post, path = "/api/v1/sandboxes", tag = "sandboxes", request_body = CreateSandbox,
    responses((status = 201, body = Data<Sandbox>, description = "running and ready"),
              (status = 202, body = Data<Sandbox>, description = "provisioning (wait: false)"),
              (status = 400, body = cella_types::ErrorBody), (status = 404, body = cella_types::ErrorBody),
              (status = 429, body = cella_types::ErrorBody), (status = 503, body = cella_types::ErrorBody)))]
pub async fn create(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    body: ApiBody,
) -> Result<(StatusCode, Json<Data<Sandbox>>), ApiError> {
    let req: CreateSandbox = body.json()?;
    let wait = req.wait.unwrap_or(true);
    let sb = svc::create(&state, &auth, req).await?;
    let status = if wait {
        StatusCode::CREATED
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(Data { data: sb })))
}

/// List the workspace's sandboxes, newest first. Scope `sandboxes:read`.
#[utoipa::path(get, path = "/api/v1/sandboxes", tag = "sandboxes",
    params(("limit" = Option<u32>, Query, description = "1-1000, default 100"), ("cursor" = Option<String>, Query),
           ("state" = Option<SandboxState>, Query), ("metadata.<key>" = Option<String>, Query, description = "metadata equality filter; repeatable")),
    responses((status = 200, body = List<Sandbox>), (status = 400, body = cella_types::ErrorBody)))]
pub async fn list(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    QueryPairs(mut q): QueryPairs,
) -> Result<Json<List<Sandbox>>, ApiError> {
    let page = Page::take(&mut q)?;
    let mut filter = SandboxFilter {
        workspace_id: auth.workspace_id.clone(),
        limit: page.limit,
        before_seq: page.cursor,
        ..Default::default()
    };
    for (k, v) in q {
        if k == "state" && v == "all" {
            filter.all_states = true;
        } else if k == "state" {
            let parsed = SandboxState::parse(&v).ok_or_else(|| {
                ApiError::invalid(
                    "state",
                    format!("unknown state {v:?}; one of provisioning, running, paused, stopped, destroyed, error, or all"),
                )
            })?;
            filter.state = Some(parsed);
        } else if let Some(key) = k.strip_prefix("metadata.") {
            if key.is_empty() || key.contains('"') {
                return Err(ApiError::invalid(&k, "metadata filter needs a valid key"));
            }
            filter.metadata.push((key.to_string(), v));
        } else {
            return Err(ApiError::invalid(
                &k,
                format!("unknown query parameter {k:?}"),
            ));
        }
    }
    let rows = state.store.list_sandboxes(&filter).await?;
    let next_cursor = (rows.len() == page.limit as usize)
        .then(|| cursor_for(rows.last().map(|r| r.seq).unwrap_or(0)));
    Ok(Json(List {
        data: rows.iter().map(|r| svc::to_wire(&state, r)).collect(),
        next_cursor,
    }))
}

/// One sandbox. Scope `sandboxes:read`.
#[utoipa::path(get, path = "/api/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path)), responses((status = 200, body = Data<Sandbox>), (status = 404, body = cella_types::ErrorBody)))]
pub async fn get(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Data<Sandbox>>, ApiError> {
    Ok(Json(Data {
        data: svc::to_wire(&state, &find(&state, &auth, &id).await?),
    }))
}

/// Destroy a sandbox from any state; idempotent. Scope `sandboxes:write`.
#[utoipa::path(delete, path = "/api/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path)), responses((status = 200, body = Data<Sandbox>), (status = 404, body = cella_types::ErrorBody)))]
pub async fn destroy(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Data<Sandbox>>, ApiError> {
    find(&state, &auth, &id).await?;
    Ok(Json(Data {
        data: svc::destroy(&state, &id, None).await?,
    }))
}

/// Run a command to its end and return its output. Scope `sandboxes:exec`.
#[utoipa::path(post, path = "/api/v1/sandboxes/{id}/exec", tag = "sandboxes", request_body = ExecRequest,
    params(("id" = String, Path)),
    responses((status = 200, body = Data<ExecResult>), (status = 400, body = cella_types::ErrorBody),
              (status = 404, body = cella_types::ErrorBody), (status = 409, body = cella_types::ErrorBody)))]
pub async fn exec(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    body: ApiBody,
) -> Result<axum::response::Response, ApiError> {
    let req: ExecRequest = body.json()?;
    let mut row = crate::timing::phase("store.read", find(&state, &auth, &id)).await?;
    if state.away.settled(&id, svc::AWAY_WAIT).await {
        row = find(&state, &auth, &id).await?;
    }
    let sb = Runnable::of(&state, row)?;
    Ok(svc::exec_answer(svc::exec_kept(&state, &sb, req).await?))
}

/// Freeze every process of a running sandbox; memory is kept. Scope `sandboxes:write`.
#[utoipa::path(post, path = "/api/v1/sandboxes/{id}/pause", tag = "sandboxes",
    params(("id" = String, Path)),
    responses((status = 200, body = Data<Sandbox>), (status = 404, body = cella_types::ErrorBody),
              (status = 409, body = cella_types::ErrorBody, description = "not running")))]
pub async fn pause(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Data<Sandbox>>, ApiError> {
    find(&state, &auth, &id).await?;
    Ok(Json(Data {
        data: lifecycle::detached(&state, &id, lifecycle::Op::Pause).await?,
    }))
}

/// Thaw a paused sandbox, or boot a stopped one again on its kept files. Scope `sandboxes:write`.
#[utoipa::path(post, path = "/api/v1/sandboxes/{id}/resume", tag = "sandboxes",
    params(("id" = String, Path)),
    responses((status = 200, body = Data<Sandbox>), (status = 404, body = cella_types::ErrorBody),
              (status = 409, body = cella_types::ErrorBody, description = "neither paused nor stopped"),
              (status = 429, body = cella_types::ErrorBody, description = "resuming a stopped sandbox would pass the plan cap")))]
pub async fn resume(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Data<Sandbox>>, ApiError> {
    find(&state, &auth, &id).await?;
    Ok(Json(Data {
        data: lifecycle::detached(&state, &id, lifecycle::Op::Resume).await?,
    }))
}

/// End every process of a persistent sandbox and keep its files. Scope `sandboxes:write`.
#[utoipa::path(post, path = "/api/v1/sandboxes/{id}/stop", tag = "sandboxes",
    params(("id" = String, Path)),
    responses((status = 200, body = Data<Sandbox>), (status = 404, body = cella_types::ErrorBody),
              (status = 409, body = cella_types::ErrorBody, description = "neither running nor paused, or not persistent")))]
pub async fn stop(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Data<Sandbox>>, ApiError> {
    find(&state, &auth, &id).await?;
    Ok(Json(Data {
        data: lifecycle::detached(&state, &id, lifecycle::Op::Stop).await?,
    }))
}

/// Set the active-session timeout and restart its timer. Scope `sandboxes:write`.
#[utoipa::path(post, path = "/api/v1/sandboxes/{id}/timeout", tag = "sandboxes",
    params(("id" = String, Path)), request_body = SetTimeout,
    responses((status = 200, body = Data<Sandbox>), (status = 400, body = cella_types::ErrorBody),
              (status = 404, body = cella_types::ErrorBody), (status = 409, body = cella_types::ErrorBody)))]
pub async fn set_timeout(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    body: ApiBody,
) -> Result<Json<Data<Sandbox>>, ApiError> {
    let req: SetTimeout = body.json()?;
    find(&state, &auth, &id).await?;
    Ok(Json(Data {
        data: lifecycle::set_timeout(&state, &id, req.timeout_sec).await?,
    }))
}

/// Running, paused and billed seconds, CPU seconds and memory MiB-seconds. Scope `sandboxes:read`.
#[utoipa::path(get, path = "/api/v1/sandboxes/{id}/usage", tag = "sandboxes",
    params(("id" = String, Path)),
    responses((status = 200, body = Data<Usage>), (status = 404, body = cella_types::ErrorBody)))]
pub async fn usage(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Data<Usage>>, ApiError> {
    let row = find(&state, &auth, &id).await?;
    Ok(Json(Data {
        data: lifecycle::usage(&state, &row),
    }))
}

/// Run a command and stream its output as server-sent events: `stdout` and `stderr` (each a
/// JSON string of text, or `{"b64"}` for bytes that are not UTF-8), then one `exit` (or `error`).
/// A client that hangs up kills the command. Scope `sandboxes:exec`.
#[utoipa::path(post, path = "/api/v1/sandboxes/{id}/exec/stream", tag = "sandboxes",
    request_body = ExecRequest, params(("id" = String, Path)),
    responses((status = 200, content_type = "text/event-stream", description = "stdout, stderr, then exit"),
              (status = 400, body = cella_types::ErrorBody), (status = 404, body = cella_types::ErrorBody),
              (status = 409, body = cella_types::ErrorBody)))]
pub async fn exec_stream(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    body: ApiBody,
) -> Result<Sse<impl futures_util::Stream<Item = Result<Event, std::convert::Infallible>>>, ApiError>
{
    let req: ExecRequest = body.json()?;
    let mut row = find(&state, &auth, &id).await?;
    if state.away.settled(&id, svc::AWAY_WAIT).await {
        row = find(&state, &auth, &id).await?;
    }
    let sb = Runnable::of(&state, row)?;
    let spec = sb.spec(req, None)?;
    let handle = sb.handle;
    let (ev_tx, ev_rx) = tokio::sync::mpsc::channel(64);
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let busy = state.activity.busy(&id);
    let st = state.clone();
    tokio::spawn(async move {
        let outcome = match st.driver.exec(&handle, spec, ev_tx).await {
            Ok(info) => Ok(Some(info)),
            // The client hung up: the agent has killed the command; nobody is listening.
            Err(cella_runtime::DriverError::ClientGone) => return,
            Err(e) => Err(svc::exec_failure(&st, &id, &handle, e).await.into()),
        };
        let _ = done_tx.send(outcome);
        drop(busy);
    });
    let stream = sse::output_stream(ev_rx, done_rx);
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// The URLs at which a port of the sandbox is reachable through the preview proxy (signed
/// when the sandbox's preview is private, with a token valid for `[preview] token_ttl_sec`).
/// Any port can be previewed; this only hands out its addresses. Scope `sandboxes:write`.
#[utoipa::path(post, path = "/api/v1/sandboxes/{id}/expose", tag = "sandboxes",
    params(("id" = String, Path)), request_body = cella_types::ExposeRequest,
    responses((status = 200, body = Data<cella_types::Exposed>), (status = 400, body = cella_types::ErrorBody),
              (status = 404, body = cella_types::ErrorBody)))]
pub async fn expose(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    body: ApiBody,
) -> Result<Json<Data<cella_types::Exposed>>, ApiError> {
    let req: cella_types::ExposeRequest = body.json()?;
    let port = u16::try_from(req.port)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| ApiError::invalid("port", "port must be from 1 to 65535"))?;
    let row = find(&state, &auth, &id).await?;
    if svc::state_of(&row).is_terminal() {
        return Err(ApiError::new(
            cella_types::ErrorCode::Conflict,
            format!("sandbox is {}", row.state),
        ));
    }
    let token = if row.preview_public {
        None
    } else {
        Some(crate::preview::issue(&state, &row, state.config.preview.token_ttl_sec).await?)
    };
    let u = crate::preview::urls(&state, &id, port, token.as_ref().map(|t| t.0.as_str()));
    Ok(Json(Data {
        data: cella_types::Exposed {
            port,
            url: u.url,
            host_url: u.host_url,
            path_url: u.path_url,
            token_expires_at: token.as_ref().map(|t| crate::util::rfc3339(t.1 * 1000)),
            token: token.map(|t| t.0),
        },
    }))
}

/// A new preview token of the sandbox (`{"ttl_sec"?, "rotate"?}`; no body is fine): valid for
/// `ttl_sec` (default `[preview] token_ttl_sec`, at most 30 days); `rotate: true` first voids
/// every token of the sandbox handed out before. Scope `sandboxes:write`.
#[utoipa::path(post, path = "/api/v1/sandboxes/{id}/preview-token", tag = "sandboxes",
    params(("id" = String, Path)), request_body = cella_types::PreviewTokenRequest,
    responses((status = 200, body = Data<cella_types::PreviewToken>), (status = 400, body = cella_types::ErrorBody),
              (status = 404, body = cella_types::ErrorBody), (status = 409, body = cella_types::ErrorBody)))]
pub async fn preview_token(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    body: ApiBody,
) -> Result<Json<Data<cella_types::PreviewToken>>, ApiError> {
    let req: cella_types::PreviewTokenRequest = if body.is_empty() {
        Default::default()
    } else {
        body.json()?
    };
    let max = crate::preview::MAX_TTL_SEC;
    let ttl = match req.ttl_sec {
        None => state.config.preview.token_ttl_sec,
        Some(t) if (1..=max).contains(&t) => t,
        Some(_) => {
            return Err(ApiError::invalid(
                "ttl_sec",
                format!("ttl_sec must be from 1 to {max}"),
            ))
        }
    };
    let row = find(&state, &auth, &id).await?;
    if svc::state_of(&row).is_terminal() {
        return Err(ApiError::new(
            cella_types::ErrorCode::Conflict,
            format!("sandbox is {}", row.state),
        ));
    }
    if req.rotate == Some(true) {
        state.store.rotate_preview_token(&row.id).await?;
    }
    let (token, expires) = crate::preview::issue(&state, &row, ttl).await?;
    Ok(Json(Data {
        data: cella_types::PreviewToken {
            token,
            expires_at: crate::util::rfc3339(expires * 1000),
        },
    }))
}
