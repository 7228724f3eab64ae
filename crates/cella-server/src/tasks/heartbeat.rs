//! `POST /gateway/tasks/heartbeat`: the in-sandbox supervisor's heartbeat.
//!
//! Authenticated as the gateway's routes are, by the run's sandbox token (`Authorization:
//! Bearer`), from the sandbox's own address only (403 from anywhere else, 401 for a token whose
//! sandbox ended). The body is a `TaskProgress` (counts only); the answer is 204 while the run
//! is alive and 410 `GONE` once it is over (the supervisor then stops its agent). The time of
//! the last heartbeat lives in memory only; changed counts become `progress` events.

use crate::error::ApiError;
use crate::AppState;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use cella_types::{ErrorCode, TaskEvent, TaskProgress};
use std::sync::Arc;

/// The route, for the API's router and for each sandbox link's gateway listener.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/gateway/tasks/heartbeat", post(heartbeat))
}

fn done(mut r: Response) -> Response {
    r.extensions_mut().insert(crate::error::Enveloped);
    r
}

async fn heartbeat(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let caller = match crate::gateway::caller(&state, &parts).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let Some(sandbox_id) = caller.sandbox_id else {
        return done(
            ApiError::new(
                ErrorCode::Forbidden,
                "heartbeats are sent with a task run's sandbox token",
            )
            .into_response(),
        );
    };
    let bytes = match axum::body::to_bytes(body, 64 * 1024).await {
        Ok(b) => b,
        Err(_) => return done(ApiError::invalid("body", "the body is too large").into_response()),
    };
    let progress: TaskProgress = if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        TaskProgress::default()
    } else {
        match crate::extract::parse_json(&bytes) {
            Ok(p) => p,
            Err(e) => return done(e.into_response()),
        }
    };
    let Some((task_id, live)) = state.tasks.live_by_sandbox(&sandbox_id) else {
        return done(ApiError::new(ErrorCode::Gone, "this task run is over").into_response());
    };
    if live.cancel.is_cancelled() {
        return done(
            ApiError::new(ErrorCode::Gone, "this task run is being stopped").into_response(),
        );
    }
    live.beat();
    let changed = match live.progress.lock() {
        Ok(mut p) if *p != progress => {
            *p = progress;
            true
        }
        _ => false,
    };
    if changed {
        state.tasks.emit(&task_id, TaskEvent::Progress(progress));
    }
    StatusCode::NO_CONTENT.into_response()
}
