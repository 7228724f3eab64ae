//! `POST /mcp`, `GET /mcp`, `DELETE /mcp`: the streamable HTTP transport (rmcp's), behind a
//! guard.
//!
//! The guard, per request: a Bearer key is required (401 in the API's error envelope without
//! one); the key is checked by the API itself (`GET /api/v1/api-keys/current`, whose error
//! answer, 401 or 429, is passed on as it is) and its id and scopes go to the handler as a
//! [`Caller`]. Sessions (`Mcp-Session-Id`) belong to the key that opened them: another key's
//! request naming one gets 404, as for an unknown session. Each key holds at most
//! `max_sessions_per_key` sessions (opening one more closes its least recently used), and a
//! session unused for `session_idle` is closed, so sessions cannot pile up.

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
    /// A session unused this long is closed.
    pub session_idle: Duration,
}

impl Default for McpHttpConfig {
    fn default() -> Self {
        McpHttpConfig {
            max_sessions_per_key: 16,
            session_idle: Duration::from_secs(1800),
        }
    }
}

struct Session {
    key_id: Option<String>,
    last_used: Instant,
}

struct Guard {
    api: Arc<dyn Api>,
    cfg: McpHttpConfig,
    manager: Arc<LocalSessionManager>,
    sessions: tokio::sync::Mutex<HashMap<String, Session>>,
}

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
    /// Closes sessions idle past the limit, and forgets those rmcp has ended.
    async fn sweep(&self) {
        let live: Vec<String> = self
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
            s.retain(|id, _| live.contains(id));
            for id in &live {
                // A session the guard never saw answered (its initialize failed) idles out too.
                let e = s.entry(id.clone()).or_insert(Session {
                    key_id: None,
                    last_used: now,
                });
                if now.duration_since(e.last_used) >= self.cfg.session_idle {
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

    /// Makes room for one more session of `key`: closes its least recently used ones beyond
    /// the limit.
    async fn make_room(&self, key: &str) {
        let close = {
            let mut s = self.sessions.lock().await;
            let mut mine: Vec<(String, Instant)> = s
                .iter()
                .filter(|(_, v)| v.key_id.as_deref() == Some(key))
                .map(|(k, v)| (k.clone(), v.last_used))
                .collect();
            mine.sort_by_key(|(_, t)| *t);
            let max = self.cfg.max_sessions_per_key.max(1);
            let n = (mine.len() + 1).saturating_sub(max);
            let close: Vec<String> = mine.into_iter().take(n).map(|(k, _)| k).collect();
            for id in &close {
                s.remove(id);
            }
            close
        };
        for id in close {
            let _ = self.manager.close_session(&id.into()).await;
        }
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
        match s.get_mut(id) {
            Some(e) if e.key_id.as_deref().is_some_and(|k| k != caller.key_id) => {
                return envelope(StatusCode::NOT_FOUND, "NOT_FOUND", "no such MCP session");
            }
            Some(e) => {
                e.key_id.get_or_insert_with(|| caller.key_id.clone());
                e.last_used = Instant::now();
            }
            None => {}
        }
    } else if req.method() == Method::POST {
        g.make_room(&caller.key_id).await;
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
