//! The terminal: `GET /api/v1/sandboxes/{id}/pty` upgraded to a WebSocket.
//!
//! Binary frames carry terminal bytes both ways; a text frame `{"resize": {"cols", "rows"}}`
//! resizes (any other text frame is typed as input). When the program ends the server sends a
//! text frame `{"exit": {"exit_code": N}}` and closes; when the client closes, the program is
//! hung up (SIGHUP, then SIGKILL).
//!
//! The route takes the `WebSocketUpgrade` as a `Result`, so it checks the scope first, then that
//! the request is an upgrade (else 400, `field: "upgrade"`), then the query and the state, all
//! before upgrading. The spec is built like an exec's with `TERM=xterm-256color`; the default
//! program is `bash -l` when `/bin/bash` exists, else `sh -l`. Input and resizes go to the agent's
//! `PtyWriter`; the `PtyReader`'s output is relayed as binary frames and a last `{"exit"}` text
//! frame. A client that leaves drops the writer: the agent sends `SIGHUP` to the program's group,
//! then kills its tree 200 ms later.

use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::QueryPairs;
use crate::service::{runnable, AgentOp};
use crate::AppState;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::response::Response;
use cella_agent::client::PtyEvent;
use cella_types::{ErrorCode, ExecRequest, ExecUser};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use std::sync::Arc;

/// The most problems of one terminal the server logs (the agent sends at most 8).
const MAX_PROBLEMS_LOGGED: usize = 8;

/// Open an interactive terminal (a login `bash`, or `sh` where bash is absent, unless `command`
/// says otherwise). Scope `sandboxes:exec`.
#[utoipa::path(get, path = "/api/v1/sandboxes/{id}/pty", tag = "processes",
    params(("id" = String, Path), ("cols" = Option<u16>, Query, description = "default 80"),
           ("rows" = Option<u16>, Query, description = "default 24"),
           ("command" = Option<String>, Query, description = "a shell command line instead of the login shell"),
           ("user" = Option<String>, Query, description = "user (default) or root"),
           ("cwd" = Option<String>, Query)),
    responses((status = 101, description = "switched to the WebSocket protocol"),
              (status = 404, body = cella_types::ErrorBody), (status = 409, body = cella_types::ErrorBody)))]
pub async fn pty(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    QueryPairs(q): QueryPairs,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let ws = ws.map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidRequest,
            format!("this route needs a WebSocket upgrade: {e}"),
        )
        .with_details(json!({ "field": "upgrade" }))
    })?;
    let (mut cols, mut rows, mut command, mut user, mut cwd) = (80u16, 24u16, None, None, None);
    for (k, v) in q {
        let size = |v: &str, f: &str| {
            v.parse::<u16>()
                .ok()
                .filter(|n| (1..=1000).contains(n))
                .ok_or_else(|| ApiError::invalid(f, format!("{f} must be from 1 to 1000")))
        };
        match k.as_str() {
            "cols" => cols = size(&v, "cols")?,
            "rows" => rows = size(&v, "rows")?,
            "command" => command = Some(v),
            "cwd" => cwd = Some(v),
            "user" => {
                user = Some(match v.as_str() {
                    "user" => ExecUser::User,
                    "root" => ExecUser::Root,
                    _ => return Err(ApiError::invalid("user", "user must be user or root")),
                })
            }
            _ => {
                return Err(ApiError::invalid(
                    &k,
                    format!("unknown query parameter {k:?}"),
                ))
            }
        }
    }
    let sb = runnable(&state, &auth, &id).await?;
    // Chosen by sh, so that a template without bash still gets a shell.
    let login = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        "if [ -x /bin/bash ]; then exec /bin/bash -l; else exec /bin/sh -l; fi".to_string(),
    ];
    let mut env = std::collections::BTreeMap::new();
    env.insert("TERM".to_string(), "xterm-256color".to_string());
    let (command, argv) = match command {
        Some(c) => (Some(c), None),
        None => (None, Some(login)),
    };
    let req = ExecRequest {
        command,
        argv,
        env: Some(env),
        cwd,
        user,
        ..Default::default()
    };
    let spec = sb.spec(req, None)?;
    let agent = sb.checked_agent(&state, AgentOp::Pty);
    let opened = agent.open_pty(spec, cols, rows).await;
    let (_pid, mut writer, mut reader) = agent.check(opened).await?;
    let busy = state.activity.busy(&id);
    Ok(ws.on_upgrade(move |socket: WebSocket| async move {
        let (mut ws_tx, mut ws_rx) = socket.split();
        let to_agent = async {
            while let Some(Ok(msg)) = ws_rx.next().await {
                let r = match msg {
                    Message::Binary(b) => writer.input(&b).await,
                    Message::Text(t) => match serde_json::from_str::<serde_json::Value>(t.as_str())
                    {
                        Ok(v) if v.get("resize").is_some() => {
                            let c = v["resize"]["cols"]
                                .as_u64()
                                .unwrap_or(cols as u64)
                                .clamp(1, 1000) as u16;
                            let r = v["resize"]["rows"]
                                .as_u64()
                                .unwrap_or(rows as u64)
                                .clamp(1, 1000) as u16;
                            writer.resize(c, r).await
                        }
                        _ => writer.input(t.as_bytes()).await,
                    },
                    Message::Close(_) => break,
                    _ => Ok(()),
                };
                if r.is_err() {
                    break;
                }
            }
            // Dropping the writer hangs the terminal up.
        };
        let from_agent = async {
            let mut problems = 0;
            while let Some(ev) = reader.next().await {
                match ev {
                    PtyEvent::Output(b) => {
                        if ws_tx.send(Message::Binary(b.into())).await.is_err() {
                            return;
                        }
                    }
                    // A resize that did not take: the session goes on, the operator can see it.
                    // The agent's words are the sandbox's: a few lines, cut short, escaped.
                    PtyEvent::Problem(p) => {
                        problems += 1;
                        if problems <= MAX_PROBLEMS_LOGGED {
                            let p: String = p.chars().take(200).collect();
                            tracing::warn!(sandbox = %id, problem = ?p, "terminal");
                        }
                    }
                    PtyEvent::Exit(info) => {
                        let msg = json!({ "exit": { "exit_code": info.exit_code } }).to_string();
                        let _ = ws_tx.send(Message::Text(msg.into())).await;
                        let _ = ws_tx.send(Message::Close(None)).await;
                        return;
                    }
                }
            }
            let _ = ws_tx.send(Message::Close(None)).await;
        };
        tokio::select! {
            _ = to_agent => {},
            _ = from_agent => {},
        }
        drop(busy);
    }))
}
