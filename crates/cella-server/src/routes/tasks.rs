//! The task run routes: each parses its request, calls one function of
//! [`crate::tasks::service`] (where the order of a start's checks is told) and encodes the
//! answer.

use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::{cursor_for, ApiBody, Page, QueryPairs};
use crate::tasks::service;
use crate::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::Json;
use cella_store::TaskFilter;
use cella_types::{CreateTask, Data, List, Task, TaskEvent, TaskState};
use futures_util::StreamExt;
use std::convert::Infallible;
use std::sync::Arc;

/// Start a task run: an agent works on `repository` at `base_branch` in a fresh sandbox, on a
/// new branch pushed and opened as a draft pull request. 403 when the workspace's
/// `tasks_enabled` is false, 402 when the wallet cannot cover the run's worst case, 404 when
/// the forge cannot read the repository or the base branch does not exist; nothing is queued
/// on any error. Scope `tasks:write`.
#[utoipa::path(post, path = "/api/v1/tasks", tag = "tasks", request_body = CreateTask,
    responses((status = 201, body = Data<Task>), (status = 400, body = cella_types::ErrorBody),
              (status = 402, body = cella_types::ErrorBody), (status = 403, body = cella_types::ErrorBody),
              (status = 404, body = cella_types::ErrorBody), (status = 503, body = cella_types::ErrorBody)))]
pub async fn create(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    body: ApiBody,
) -> Result<(StatusCode, Json<Data<Task>>), ApiError> {
    let req: CreateTask = body.json()?;
    let task = service::create(&state, &auth, req).await?;
    Ok((StatusCode::CREATED, Json(Data { data: task })))
}

/// The workspace's task runs, newest first; filters `state` and `repository`. Scope
/// `tasks:read`.
#[utoipa::path(get, path = "/api/v1/tasks", tag = "tasks",
    params(("state" = Option<String>, Query), ("repository" = Option<String>, Query),
           ("limit" = Option<u32>, Query), ("cursor" = Option<String>, Query)),
    responses((status = 200, body = List<Task>), (status = 400, body = cella_types::ErrorBody)))]
pub async fn list(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    q: QueryPairs,
) -> Result<Json<List<Task>>, ApiError> {
    let mut pairs = q.0;
    let page = Page::take(&mut pairs)?;
    let mut filter = TaskFilter {
        limit: page.limit,
        before_seq: page.cursor,
        ..Default::default()
    };
    for (k, v) in pairs {
        match k.as_str() {
            "state" => {
                filter.state = Some(TaskState::parse(&v).ok_or_else(|| {
                    ApiError::invalid(
                        "state",
                        "state must be one of queued, provisioning, running, stopped, failed, cancelled",
                    )
                })?)
            }
            "repository" => filter.repository = Some(v),
            _ => return Err(ApiError::invalid(&k, format!("unknown query parameter {k:?}"))),
        }
    }
    let (data, next) = service::list(&state, &auth, filter).await?;
    Ok(Json(List {
        data,
        next_cursor: next.map(cursor_for),
    }))
}

/// One task run (another workspace's: 404). Scope `tasks:read`.
#[utoipa::path(get, path = "/api/v1/tasks/{id}", tag = "tasks", params(("id" = String, Path)),
    responses((status = 200, body = Data<Task>), (status = 404, body = cella_types::ErrorBody)))]
pub async fn get(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Data<Task>>, ApiError> {
    Ok(Json(Data {
        data: service::get(&state, &auth, &id).await?,
    }))
}

/// Cancel a task run, in any state that is not terminal (idempotent; a terminal run is
/// answered unchanged). Queued: it never starts and costs nothing. Provisioning: its sandbox
/// is removed. Running: the agent is stopped and its work pushed as a draft; the run reaches
/// `cancelled` once that is done (the answer shows it as it is then). Scope `tasks:write`.
#[utoipa::path(post, path = "/api/v1/tasks/{id}/cancel", tag = "tasks", params(("id" = String, Path)),
    responses((status = 200, body = Data<Task>), (status = 404, body = cella_types::ErrorBody)))]
pub async fn cancel(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Data<Task>>, ApiError> {
    Ok(Json(Data {
        data: service::cancel(&state, &auth, &id).await?,
    }))
}

/// The run's events (SSE): `state` (the first is the state it is in now) and `progress`
/// (counts only); the stream ends after a terminal state. Scope `tasks:read`.
#[utoipa::path(get, path = "/api/v1/tasks/{id}/events", tag = "tasks", params(("id" = String, Path)),
    responses((status = 200, content_type = "text/event-stream", description = "state and progress events"),
              (status = 404, body = cella_types::ErrorBody)))]
pub async fn events(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let stream = service::events(&state, &auth, &id).await?;
    let stream = stream.map(|ev| {
        let name = match &ev {
            TaskEvent::State { .. } => "state",
            TaskEvent::Progress(_) => "progress",
        };
        let data = serde_json::to_string(&ev).unwrap_or_else(|_| "{}".into());
        Ok(Event::default().event(name).data(data))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// The agent's output while the run is alive (SSE `output` events, `{"stream", "text"}`);
/// never stored. Ends when the run ends; 410 `GONE` once it has. Scope `tasks:read`.
#[utoipa::path(get, path = "/api/v1/tasks/{id}/log", tag = "tasks", params(("id" = String, Path)),
    responses((status = 200, content_type = "text/event-stream", description = "output events"),
              (status = 404, body = cella_types::ErrorBody), (status = 410, body = cella_types::ErrorBody)))]
pub async fn log(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let stream = service::log(&state, &auth, &id).await?;
    let stream = stream.map(|line| {
        let data = serde_json::to_string(&line).unwrap_or_else(|_| "{}".into());
        Ok(Event::default().event("output").data(data))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
