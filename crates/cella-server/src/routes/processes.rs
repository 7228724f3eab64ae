//! Background processes: start, list, get, signal, write stdin, follow output (SSE).

use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::{ApiBody, QueryPairs};
use crate::sse;
use crate::util::rfc3339;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::Json;
use cella_agent::proto::{ProcessInfo, Request, Response as AgentResponse};
use cella_types::{Data, ExecRequest, ExecUser, List, Process, SignalRequest, StartProcess};
use std::sync::Arc;

fn wire(p: ProcessInfo) -> Process {
    Process {
        pid: p.pid,
        argv: p.argv,
        tag: p.tag,
        user: if p.uid == 0 {
            ExecUser::Root
        } else {
            ExecUser::User
        },
        cwd: p.cwd,
        state: if p.running { "running" } else { "exited" }.into(),
        exit_code: p.exit_code,
        started_at: rfc3339(p.started_at),
        ended_at: p.ended_at.map(rfc3339),
        output_dropped_bytes: p.dropped_bytes,
    }
}

use crate::service::{runnable, AgentOp, CheckedAgent};

/// The agent of a running sandbox of the caller's workspace, for process calls.
async fn agent(state: &Arc<AppState>, auth: &Auth, id: &str) -> Result<CheckedAgent, ApiError> {
    Ok(runnable(state, auth, id)
        .await?
        .checked_agent(state, AgentOp::Processes))
}

fn one(r: AgentResponse) -> Result<Process, ApiError> {
    match r {
        AgentResponse::Process(p) => Ok(wire(p)),
        _ => Err(crate::service::SandboxError::UnexpectedAnswer("a process request").into()),
    }
}

/// Start a command in the background; it outlives the request. Scope `sandboxes:exec`.
#[utoipa::path(post, path = "/api/v1/sandboxes/{id}/processes", tag = "processes",
    params(("id" = String, Path)), request_body = StartProcess,
    responses((status = 201, body = Data<Process>), (status = 400, body = cella_types::ErrorBody),
              (status = 409, body = cella_types::ErrorBody)))]
pub async fn start(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    body: ApiBody,
) -> Result<(StatusCode, Json<Data<Process>>), ApiError> {
    let req: StartProcess = body.json()?;
    let sb = runnable(&state, &auth, &id).await?;
    let tag = req.tag.clone();
    if tag.as_ref().is_some_and(|t| t.len() > 200) {
        return Err(ApiError::invalid("tag", "tag takes at most 200 bytes"));
    }
    let exec = ExecRequest {
        command: req.command,
        argv: req.argv,
        env: req.env,
        cwd: req.cwd,
        user: req.user,
        ..Default::default()
    };
    let spec = sb.spec(exec, None)?;
    let agent = sb.checked_agent(&state, AgentOp::Processes);
    let pid = match agent.ask(&Request::Spawn { spec, tag }).await? {
        AgentResponse::Started { pid } => pid,
        _ => {
            return Err(crate::service::SandboxError::UnexpectedAnswer("starting a process").into())
        }
    };
    let p = one(agent.ask(&Request::Process { pid }).await?)?;
    Ok((StatusCode::CREATED, Json(Data { data: p })))
}

/// Processes started through the API: running ones, and the last 64 that exited. Scope `sandboxes:read`.
#[utoipa::path(get, path = "/api/v1/sandboxes/{id}/processes", tag = "processes",
    params(("id" = String, Path)), responses((status = 200, body = List<Process>), (status = 409, body = cella_types::ErrorBody)))]
pub async fn list(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<List<Process>>, ApiError> {
    match agent(&state, &auth, &id)
        .await?
        .ask(&Request::Processes)
        .await?
    {
        AgentResponse::Processes { processes } => Ok(Json(List {
            data: processes.into_iter().map(wire).collect(),
            next_cursor: None,
        })),
        _ => Err(crate::service::SandboxError::UnexpectedAnswer("listing processes").into()),
    }
}

/// One process: state and exit code. Scope `sandboxes:read`.
#[utoipa::path(get, path = "/api/v1/sandboxes/{id}/processes/{pid}", tag = "processes",
    params(("id" = String, Path), ("pid" = i32, Path)),
    responses((status = 200, body = Data<Process>), (status = 404, body = cella_types::ErrorBody)))]
pub async fn get(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path((id, pid)): Path<(String, i32)>,
) -> Result<Json<Data<Process>>, ApiError> {
    let agent = agent(&state, &auth, &id).await?;
    Ok(Json(Data {
        data: one(agent.ask(&Request::Process { pid }).await?)?,
    }))
}

fn signal_number(v: &serde_json::Value) -> Option<i32> {
    if let Some(n) = v.as_i64() {
        return i32::try_from(n)
            .ok()
            .filter(|n| nix::sys::signal::Signal::try_from(*n).is_ok());
    }
    if let Some(n) = v.as_str().and_then(|s| s.parse::<i32>().ok()) {
        return nix::sys::signal::Signal::try_from(n).ok().map(|s| s as i32);
    }
    let name = v.as_str()?.to_ascii_uppercase();
    let name = name.strip_prefix("SIG").unwrap_or(&name);
    nix::sys::signal::Signal::iterator()
        .find(|s| s.as_str().strip_prefix("SIG") == Some(name))
        .map(|s| s as i32)
}

/// Send a signal (`SIGTERM`, `TERM` or 15). Scope `sandboxes:exec`.
#[utoipa::path(post, path = "/api/v1/sandboxes/{id}/processes/{pid}/signal", tag = "processes",
    params(("id" = String, Path), ("pid" = i32, Path)), request_body = SignalRequest,
    responses((status = 200, body = Data<Process>), (status = 404, body = cella_types::ErrorBody),
              (status = 409, body = cella_types::ErrorBody, description = "the process has exited")))]
pub async fn signal(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path((id, pid)): Path<(String, i32)>,
    body: ApiBody,
) -> Result<Json<Data<Process>>, ApiError> {
    let req: SignalRequest = body.json()?;
    let signal =
        signal_number(&req.signal).ok_or_else(|| ApiError::invalid("signal", "unknown signal"))?;
    let agent = agent(&state, &auth, &id).await?;
    Ok(Json(Data {
        data: one(agent.ask(&Request::Signal { pid, signal }).await?)?,
    }))
}

/// Write the raw body to the process's standard input (`close=true` closes it afterwards).
/// Scope `sandboxes:exec`.
#[utoipa::path(post, path = "/api/v1/sandboxes/{id}/processes/{pid}/stdin", tag = "processes",
    params(("id" = String, Path), ("pid" = i32, Path), ("close" = Option<bool>, Query)),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 200, body = Data<Process>), (status = 404, body = cella_types::ErrorBody),
              (status = 409, body = cella_types::ErrorBody)))]
pub async fn stdin(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path((id, pid)): Path<(String, i32)>,
    QueryPairs(q): QueryPairs,
    body: Bytes,
) -> Result<Json<Data<Process>>, ApiError> {
    let mut close = false;
    for (k, v) in q {
        match (k.as_str(), v.as_str()) {
            ("close", "true" | "1" | "") => close = true,
            ("close", "false" | "0") => close = false,
            _ => {
                return Err(ApiError::invalid(
                    &k,
                    format!("unknown query parameter {k:?} or value"),
                ))
            }
        }
    }
    let agent = agent(&state, &auth, &id).await?;
    agent
        .ask(&Request::Stdin {
            pid,
            data: body.to_vec(),
            close,
        })
        .await?;
    Ok(Json(Data {
        data: one(agent.ask(&Request::Process { pid }).await?)?,
    }))
}

/// Follow a process's output as server-sent events (`from=start`, the default, replays what the
/// ring buffer holds; `from=now` only new output), then one `exit`. Leaving does not stop the
/// process. Scope `sandboxes:read`.
#[utoipa::path(get, path = "/api/v1/sandboxes/{id}/processes/{pid}/output", tag = "processes",
    params(("id" = String, Path), ("pid" = i32, Path), ("from" = Option<String>, Query, description = "start (default) or now")),
    responses((status = 200, content_type = "text/event-stream"), (status = 404, body = cella_types::ErrorBody)))]
pub async fn output(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path((id, pid)): Path<(String, i32)>,
    QueryPairs(q): QueryPairs,
) -> Result<Sse<impl futures_util::Stream<Item = Result<Event, std::convert::Infallible>>>, ApiError>
{
    let mut from_start = true;
    for (k, v) in q {
        match (k.as_str(), v.as_str()) {
            ("from", "start") => from_start = true,
            ("from", "now") => from_start = false,
            _ => return Err(ApiError::invalid(&k, "from must be start or now")),
        }
    }
    let agent = agent(&state, &auth, &id).await?;
    // Answer 404 now, not in the stream, for a pid the agent does not know.
    one(agent.ask(&Request::Process { pid }).await?)?;
    let (ev_tx, ev_rx) = tokio::sync::mpsc::channel(64);
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let busy = state.activity.busy(&id);
    tokio::spawn(async move {
        let r = agent.follow(pid, from_start, ev_tx).await;
        let r = agent.check(r).await.map_err(ApiError::from);
        let _ = done_tx.send(r);
        drop(busy);
    });
    let stream = sse::output_stream(ev_rx, done_rx);
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
