//! `POST /mcp`, `GET /mcp`, `DELETE /mcp`: the streamable HTTP transport (rmcp's), behind a
//! guard.
//!
//! The guard, per request: a Bearer key is required (401 in the API's error envelope without
//! one); the key is checked by the API itself (`GET /api/v1/api-keys/current`, whose error
//! answer, 401 or 429, is passed on as it is) and its id and scopes go to the handler as a
//! [`Caller`]. Sessions (`Mcp-Session-Id`) belong to the key that opened them: another key's
//! request naming one gets 404, as for an unknown session. Each key holds at most
//! `max_sessions_per_key` sessions and the keys of a workspace `max_sessions_per_workspace`
//! together (opening one more closes that key's or workspace's least recently used); the
//! server holds at most `max_sessions` (then a new one is 503, never another workspace's
//! closed), and a session unused for `session_idle` is closed, so sessions cannot pile up.
//! A session no answer gave an owner (yet) answers 404 to everyone.

use crate::api::{Api, ApiRequest};
use crate::server::{Caller, CellaMcp};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, SessionConfig};
use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Limits of the HTTP transport.
#[derive(Debug, Clone)]
pub struct McpHttpConfig {
    /// Sessions one key may hold at once (at least 1).
    pub max_sessions_per_key: usize,
    /// Sessions the keys of one workspace hold together (at least 1): a workspace that makes
    /// many keys still holds no more.
    pub max_sessions_per_workspace: usize,
    /// Sessions on this server at once; past it a new one is refused (503), never made by
    /// closing another workspace's.
    pub max_sessions: usize,
    /// A session unused this long is closed.
    pub session_idle: Duration,
}

impl Default for McpHttpConfig {
    fn default() -> Self {
        McpHttpConfig {
            max_sessions_per_key: 16,
            max_sessions_per_workspace: 64,
            max_sessions: 1024,
            session_idle: Duration::from_secs(1800),
        }
    }
}

struct Session {
    /// The key that opened it (`None`: rmcp made it and its answer has not come back through
    /// the guard yet; no request may use it meanwhile).
    key_id: Option<String>,
    workspace_id: Option<String>,
    last_used: Instant,
}

struct Guard {
    api: Arc<dyn Api>,
    cfg: McpHttpConfig,
    manager: Arc<LocalSessionManager>,
    sessions: tokio::sync::Mutex<HashMap<String, Session>>,
    /// When the last sweep ran: at most one a second, whatever the request rate.
    swept: std::sync::Mutex<Instant>,
}

/// How often the guard looks for idle and ended sessions.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// A session rmcp holds that no answer gave an owner within this long is closed.
const UNOWNED_GRACE: Duration = Duration::from_secs(60);

const SESSION_HEADER: &str = "mcp-session-id";

/// The `/mcp` routes, calling the API through `api`.
pub fn router(api: Arc<dyn Api>, cfg: McpHttpConfig) -> axum::Router {
    let mut sc = SessionConfig::default();
    sc.keep_alive = Some(cfg.session_idle);
    let mut manager = LocalSessionManager::default();
    manager.session_config = sc;
    let manager = Arc::new(manager);
    let handler = CellaMcp::new(api.clone());
    // Host checks guard servers that take requests without credentials from a browser (DNS
    // rebinding); every request here needs a Bearer key, which a browser never adds itself,
    // and the server is reached by whatever name its operator gives it.
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .with_max_request_body_bytes(16 * 1024 * 1024);
    let service = StreamableHttpService::new(move || Ok(handler.clone()), manager.clone(), config);
    let guard = Arc::new(Guard {
        api,
        cfg,
        manager,
        sessions: tokio::sync::Mutex::new(HashMap::new()),
        swept: std::sync::Mutex::new(Instant::now()),
    });
    axum::Router::new()
        .route_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(guard, guard_mcp))
}

/// An error in the API's envelope.
pub fn envelope(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::json!({"error": {"code": code, "message": message, "details": null}});
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

impl Guard {
    /// Closes sessions idle past the limit (and those no answer gave an owner), and forgets
    /// those rmcp has ended. Runs at most once per [`SWEEP_EVERY`], in time linear in the
    /// number of sessions.
    async fn sweep(&self) {
        {
            let Ok(mut last) = self.swept.lock() else {
                return;
            };
            if last.elapsed() < SWEEP_EVERY {
                return;
            }
            *last = Instant::now();
        }
        let t0 = Instant::now();
        let live: std::collections::HashSet<String> = self
            .manager
            .sessions
            .read()
            .await
            .keys()
            .map(|k| k.to_string())
            .collect();
        let mut close = Vec::new();
        {
            let mut s = self.sessions.lock().await;
            let now = Instant::now();
            // Ended in rmcp: forgotten (but not one recorded after the list was read).
            s.retain(|id, e| live.contains(id) || e.last_used >= t0);
            for id in &live {
                let e = s.entry(id.clone()).or_insert(Session {
                    key_id: None,
                    workspace_id: None,
                    last_used: now,
                });
                let limit = if e.key_id.is_some() {
                    self.cfg.session_idle
                } else {
                    UNOWNED_GRACE
                };
                if now.duration_since(e.last_used) >= limit {
                    close.push(id.clone());
                }
            }
            for id in &close {
                s.remove(id);
            }
        }
        for id in close {
            let _ = self.manager.close_session(&id.into()).await;
        }
    }

    /// Makes room for one more session of `key` in `workspace`: closes its own least recently
    /// used sessions beyond the key's and the workspace's limits. `false`: the server holds
    /// all the sessions it may, none of them this workspace's to close.
    async fn make_room(&self, key: &str, workspace: &str) -> bool {
        let (close, room) = {
            let mut s = self.sessions.lock().await;
            let oldest =
                |s: &HashMap<String, Session>, pick: &dyn Fn(&Session) -> bool, keep: usize| {
                    let mut mine: Vec<(String, Instant)> = s
                        .iter()
                        .filter(|(_, v)| pick(v))
                        .map(|(k, v)| (k.clone(), v.last_used))
                        .collect();
                    mine.sort_by_key(|(_, t)| *t);
                    let n = (mine.len() + 1).saturating_sub(keep.max(1));
                    mine.into_iter().take(n).map(|(k, _)| k).collect::<Vec<_>>()
                };
            let mut close = oldest(
                &s,
                &|v: &Session| v.key_id.as_deref() == Some(key),
                self.cfg.max_sessions_per_key,
            );
            for id in &close {
                s.remove(id);
            }
            let more = oldest(
                &s,
                &|v: &Session| v.workspace_id.as_deref() == Some(workspace),
                self.cfg.max_sessions_per_workspace,
            );
            for id in &more {
                s.remove(id);
            }
            close.extend(more);
            let room = s.len() < self.cfg.max_sessions.max(1);
            (close, room)
        };
        for id in close {
            let _ = self.manager.close_session(&id.into()).await;
        }
        room
    }
}

async fn guard_mcp(State(g): State<Arc<Guard>>, mut req: Request, next: Next) -> Response {
    let auth = req
        .headers()
        .get(header::AUTHORIZATION)
        .filter(|a| a.as_bytes().len() > 7 && a.as_bytes()[..7].eq_ignore_ascii_case(b"bearer "))
        .cloned();
    let Some(auth) = auth else {
        let mut r = envelope(
            StatusCode::UNAUTHORIZED,
            "UNAUTHORIZED",
            "an API key is required: send Authorization: Bearer <key>",
        );
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return r;
    };
    let workspace_id: String;
    // The API decides who the key is (401 unknown or revoked, 429 over a limit).
    let mut check = ApiRequest::new(Method::GET, "/api/v1/api-keys/current");
    check.authorization = Some(auth.clone());
    let caller: Caller = match g.api.send(check).await {
        Err(e) => {
            return envelope(
                StatusCode::SERVICE_UNAVAILABLE,
                "UNAVAILABLE",
                &e.to_string(),
            )
        }
        Ok(res) if !res.status.is_success() => {
            let (parts, body) = (res.status, res.headers.clone());
            let b = res
                .bytes_capped(64 * 1024)
                .await
                .map(|(b, _)| b)
                .unwrap_or_default();
            let mut r = Response::new(Body::from(b));
            *r.status_mut() = parts;
            for h in [
                header::CONTENT_TYPE,
                header::RETRY_AFTER,
                header::WWW_AUTHENTICATE,
            ] {
                if let Some(v) = body.get(&h) {
                    r.headers_mut().insert(h, v.clone());
                }
            }
            return r;
        }
        Ok(res) => {
            let v = match res.json().await {
                Ok(v) => v,
                Err(e) => {
                    return envelope(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "INTERNAL",
                        &e.to_string(),
                    )
                }
            };
            let d = &v["data"];
            workspace_id = d["workspace_id"].as_str().unwrap_or_default().to_string();
            Caller {
                key_id: d["id"].as_str().unwrap_or_default().to_string(),
                scopes: d["scopes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect(),
            }
        }
    };
    g.sweep().await;
    let session = req
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    if let Some(id) = &session {
        let mut s = g.sessions.lock().await;
        // Only the key that opened a session uses it; one whose owner is not known (yet) is
        // nobody's: fail closed.
        match s.get_mut(id) {
            Some(e) if e.key_id.as_deref() == Some(caller.key_id.as_str()) => {
                e.last_used = Instant::now();
            }
            _ => return envelope(StatusCode::NOT_FOUND, "NOT_FOUND", "no such MCP session"),
        }
    } else if req.method() == Method::POST && !g.make_room(&caller.key_id, &workspace_id).await {
        let mut r = envelope(
            StatusCode::SERVICE_UNAVAILABLE,
            "UNAVAILABLE",
            "this server holds as many MCP sessions as it may; try again later",
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("60"));
        return r;
    }
    let method = req.method().clone();
    let key_id = caller.key_id.clone();
    req.extensions_mut().insert(caller);
    let res = next.run(req).await;
    match (&session, res.headers().get(SESSION_HEADER)) {
        (None, Some(new)) => {
            if let Ok(new) = new.to_str() {
                g.sessions.lock().await.insert(
                    new.to_string(),
                    Session {
                        key_id: Some(key_id),
                        workspace_id: Some(workspace_id),
                        last_used: Instant::now(),
                    },
                );
            }
        }
        (Some(id), _) if method == Method::DELETE && res.status().is_success() => {
            g.sessions.lock().await.remove(id);
        }
        _ => {}
    }
    res
}
