//! Who the caller is: an API key, the operator, or a signed-in user.
//!
//! Three kinds of caller ([`Principal`]). The **operator** (the bootstrap key: the one the first
//! start generated, or `CELLA_BOOTSTRAP_KEY`'s) manages every workspace. Every other **API key**
//! belongs to one workspace; its `admin` scope is admin of that workspace only, and another
//! workspace's objects are 404 to it. A **signed-in user** (the `cella_session` cookie of
//! `POST /api/v1/sessions`) acts in one workspace per request: the one the header
//! `x-cella-workspace: <id>` names, else (on a route under `/api/v1/workspaces/{id}` of a
//! workspace they belong to) that one, else the one the cookie `cella_workspace` names (what a
//! browser's `EventSource` and `WebSocket`, which send no headers of their own, can carry: the
//! dashboard sets it), else their personal workspace; a workspace they are not a
//! member of is 404. Their role there gives their scopes ([`cella_types::Role::scopes`]): owners
//! and admins `admin` of that workspace, members the sandbox, template and task scopes. The
//! role is read on every request, so a removal or a demotion holds at once.
//!
//! A cookie-authenticated request that is not a GET, HEAD or OPTIONS needs the header
//! `x-csrf-token` with the session's CSRF token, and one carrying an `Origin` needs it to be the
//! server's own (its `Host`): else 403. Bearer keys need neither. When both are sent, the
//! `Authorization` header decides. Internal workspaces ([`cella_store::is_internal_workspace`],
//! the warm pool's) are addressable by nobody: a key of one (which the API never makes) is
//! refused.
//!
//! A key's row is kept in memory for a moment after it is read ([`cella_store::kept`]), so a
//! client's next requests need no read of the store; a revoke distrusts what is kept at once
//! (the next request is refused), and expiry is checked on every request.
//!
//! The scopes each route needs are its row in `routes::table`, whose guard authenticates the
//! caller ([`authenticate_request`]) and checks them before the handler runs; the handler gets
//! the caller as [`Auth`].

use crate::error::ApiError;
use crate::util::{hash_key, now_ms};
use crate::AppState;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method};
use cella_types::{ErrorCode, Role, Scope};
use std::sync::Arc;

/// When keys were last used, for the writes of it still under way (`auth` writes a key's
/// `last_used_at` off the request's path). A listing of keys reads this before the store
/// ([`KeyTouches::merge`]), so a key used just before is never shown unused: a write that
/// finished is in the store, one under way is here. One write at a time per key; a use while
/// it runs moves the time here, and the writer writes again.
#[derive(Clone, Default)]
pub struct KeyTouches(Arc<std::sync::Mutex<std::collections::HashMap<String, i64>>>);

impl KeyTouches {
    /// Notes a use at `now`; true when the caller is to start the key's write.
    fn begin(&self, id: &str, now: i64) -> bool {
        let Ok(mut m) = self.0.lock() else {
            return false;
        };
        match m.get_mut(id) {
            Some(t) => {
                *t = (*t).max(now);
                false
            }
            None => {
                m.insert(id.to_owned(), now);
                true
            }
        }
    }

    /// The writer wrote `at`: `None` when that is the latest use (the key leaves the map),
    /// else the later time to write next.
    fn written(&self, id: &str, at: i64) -> Option<i64> {
        let mut m = self.0.lock().ok()?;
        match m.get(id).copied() {
            Some(t) if t > at => Some(t),
            _ => {
                m.remove(id);
                None
            }
        }
    }

    /// The latest use of each key whose write is under way.
    pub fn snapshot(&self) -> std::collections::HashMap<String, i64> {
        self.0.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// `row` as a listing shows it: the later of the store's time and one being written.
    /// `pending` is a [`KeyTouches::snapshot`] taken before the store was read.
    pub fn merge(pending: &std::collections::HashMap<String, i64>, row: &mut cella_store::KeyRow) {
        if let Some(&t) = pending.get(&row.id) {
            row.last_used_at = Some(row.last_used_at.map_or(t, |s| s.max(t)));
        }
    }
}

/// The session cookie's name (`cella_*`: the preview proxy never passes it to a sandbox).
pub const SESSION_COOKIE: &str = "cella_session";
/// The header a session caller selects a workspace with.
pub const WORKSPACE_HEADER: &str = "x-cella-workspace";
/// The cookie that selects a session caller's workspace where no header can be sent (a
/// browser's `EventSource` and `WebSocket`: the dashboard's live streams and terminal). The
/// header wins over it; a workspace the user is not a member of is 404, as with the header.
pub const WORKSPACE_COOKIE: &str = "cella_workspace";
pub const CSRF_HEADER: &str = "x-csrf-token";

/// What kind of caller a request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// An API key (the operator's included: see [`Auth::operator`]).
    Key,
    /// A signed-in user, with their role in the selected workspace.
    User {
        user_id: String,
        session_id: String,
        role: Role,
        csrf_token: String,
    },
}

/// The caller.
#[derive(Debug, Clone)]
pub struct Auth {
    /// The API key's id, or the signed-in user's id (what a sandbox's `owner_id` records).
    pub key_id: String,
    /// The workspace the caller acts in: the key's, or the user's selected one.
    pub workspace_id: String,
    pub scopes: Vec<Scope>,
    /// The operator's key: manages every workspace (see the module docs).
    pub operator: bool,
    pub principal: Principal,
}

impl Auth {
    /// The signed-in user's id (None for keys).
    pub fn user_id(&self) -> Option<&str> {
        match &self.principal {
            Principal::User { user_id, .. } => Some(user_id),
            Principal::Key => None,
        }
    }

    /// The signed-in user's role in the workspace they act in (None for keys).
    pub fn role(&self) -> Option<Role> {
        match &self.principal {
            Principal::User { role, .. } => Some(*role),
            Principal::Key => None,
        }
    }

    /// 403 `FORBIDDEN` unless the caller is a signed-in user.
    pub fn require_user(&self, what: &str) -> Result<(), ApiError> {
        match self.principal {
            Principal::User { .. } => Ok(()),
            Principal::Key => Err(ApiError::new(
                ErrorCode::Forbidden,
                format!("only a signed-in user (a session cookie of POST /api/v1/sessions) may {what}; an API key is no user"),
            )
            .with_details(serde_json::json!({ "required": "session" }))),
        }
    }

    /// Whether this caller may manage workspace `id` (read it, change it, make and list its
    /// keys): the operator any but the internal ones, an admin key its own only.
    pub fn manages(&self, id: &str) -> bool {
        !cella_store::is_internal_workspace(id)
            && self.has(Scope::Admin)
            && (self.operator || id == self.workspace_id)
    }

    /// 403 `FORBIDDEN` unless the caller is the operator.
    pub fn require_operator(&self, what: &str) -> Result<(), ApiError> {
        if self.operator {
            Ok(())
        } else {
            Err(ApiError::new(
                ErrorCode::Forbidden,
                format!("only the server's operator (the bootstrap key) may {what}"),
            )
            .with_details(serde_json::json!({ "required": "operator" })))
        }
    }

    /// Whether the caller holds `scope` (`admin` holds every scope).
    pub fn has(&self, scope: Scope) -> bool {
        self.scopes.contains(&Scope::Admin) || self.scopes.contains(&scope)
    }

    /// 403 `FORBIDDEN` unless the key carries `scope` (or `admin`).
    pub fn require(&self, scope: Scope) -> Result<(), ApiError> {
        if self.has(scope) {
            Ok(())
        } else {
            let who = match self.role() {
                Some(r) => format!("your role in this workspace ({})", r.as_str()),
                None => "this API key".to_string(),
            };
            Err(ApiError::new(
                ErrorCode::Forbidden,
                format!("{who} lacks the scope {}", scope.as_str()),
            )
            .with_details(serde_json::json!({ "required_scope": scope.as_str() })))
        }
    }
}

fn unauthorized(msg: &str) -> ApiError {
    ApiError::new(ErrorCode::Unauthorized, msg)
}

/// Finds the caller of an API key from the `Authorization` header (keys only; see
/// [`authenticate_request`] for sessions too). A key with `x-cella-workspace` naming another
/// workspace than its own is 404.
pub async fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<Auth, ApiError> {
    let header = headers
        .get(axum::http::header::AUTHORIZATION)
        .ok_or_else(|| {
            unauthorized("missing Authorization header; send `Authorization: Bearer <api key>`")
        })?;
    let value = header
        .to_str()
        .map_err(|_| unauthorized("malformed Authorization header"))?;
    let secret = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            unauthorized("malformed Authorization header; expected `Bearer <api key>`")
        })?;
    let hash = hash_key(secret);
    // Kept for a moment (see `cella_store::kept`): a revoke moves the store's epoch first.
    let epoch = state.store.grants_epoch();
    let row = match state.keys.get(&hash, epoch) {
        Some(row) => row,
        None => {
            let row = crate::timing::phase("auth.key", state.store.key_by_hash(&hash))
                .await?
                .ok_or_else(|| unauthorized("invalid API key"))?;
            state.keys.put(&hash, epoch, row.clone());
            row
        }
    };
    let now = now_ms();
    if row.revoked_at.is_some() {
        return Err(unauthorized("this API key was revoked"));
    }
    if row.expires_at.is_some_and(|t| t <= now) {
        return Err(unauthorized("this API key has expired"));
    }
    // The API never makes a key of an internal workspace; one that exists anyway (an older
    // server made them) opens nothing.
    if cella_store::is_internal_workspace(&row.workspace_id) {
        tracing::warn!(
            key = row.id,
            "refused a key of an internal workspace ({})",
            row.workspace_id
        );
        return Err(unauthorized("invalid API key"));
    }
    if row.last_used_at.is_none_or(|t| now - t > 60_000) {
        // Off the request's path: a write waits for SQLite's lock behind any other writer
        // (the model meter's groups under load), and when a key was last used is worth no
        // request's time. Kept first, so the requests meanwhile do not write it again; one
        // write at a time per key (a key read again while its write waits finds it under
        // way, and its time moved: the writer writes again), and a later time never replaced
        // by an earlier one. A listing of keys shows the time under way ([`KeyTouches`]).
        state.keys.update(&hash, |r| r.last_used_at = Some(now));
        if state.key_touches.begin(&row.id, now) {
            let (store, touches, id) = (
                state.store.clone(),
                state.key_touches.clone(),
                row.id.clone(),
            );
            tokio::spawn(async move {
                let mut at = now;
                loop {
                    if let Err(e) = store.touch_key(&id, at).await {
                        tracing::debug!(key = id, "noting a key's last use: {e}");
                    }
                    match touches.written(&id, at) {
                        Some(later) => at = later,
                        None => break,
                    }
                }
            });
        }
    }
    if let Some(ws) = headers.get(WORKSPACE_HEADER) {
        if ws.as_bytes() != row.workspace_id.as_bytes() {
            return Err(workspace_not_found());
        }
    }
    let scopes = row.scopes.clone();
    Ok(Auth {
        key_id: row.id,
        workspace_id: row.workspace_id,
        scopes,
        operator: row.operator,
        principal: Principal::Key,
    })
}

fn workspace_not_found() -> ApiError {
    ApiError::not_found("workspace").with_details(serde_json::json!({ "header": WORKSPACE_HEADER }))
}

/// The value of cookie `name` of a request.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
}

/// Compares secrets in time that does not depend on where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Finds the caller of a request: an API key (`Authorization`), else a session cookie (with
/// its CSRF and origin checks, and the workspace it selects; see the module docs).
pub async fn authenticate_request(
    state: &AppState,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
) -> Result<Auth, ApiError> {
    if headers.contains_key(axum::http::header::AUTHORIZATION) {
        return authenticate(state, headers).await;
    }
    let Some(token) = cookie(headers, SESSION_COOKIE).filter(|t| !t.is_empty()) else {
        return Err(unauthorized(
            "missing credentials; send `Authorization: Bearer <api key>`, or sign in (POST /api/v1/sessions)",
        ));
    };
    let session = state
        .store
        .session_by_hash(&hash_key(token))
        .await?
        .ok_or_else(|| unauthorized("this session ended; sign in again"))?;
    let now = now_ms();
    if session.expires_at <= now {
        let _ = state.store.delete_session(&session.id).await;
        return Err(unauthorized("this session expired; sign in again"));
    }
    let user = state
        .store
        .user(&session.user_id)
        .await?
        .ok_or_else(|| unauthorized("this session ended; sign in again"))?;
    let safe = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    if !safe {
        let sent = headers
            .get(CSRF_HEADER)
            .map(|v| v.as_bytes())
            .unwrap_or(b"");
        if !same_secret(sent, session.csrf_token.as_bytes()) {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!("a write with a session cookie needs the header {CSRF_HEADER} with the csrf_token of GET /api/v1/me"),
            )
            .with_details(serde_json::json!({ "required": CSRF_HEADER })));
        }
    }
    if let Some(origin) = headers.get(axum::http::header::ORIGIN) {
        let own = headers
            .get(axum::http::header::HOST)
            .and_then(|h| h.to_str().ok());
        let theirs = origin
            .to_str()
            .ok()
            .and_then(|o| o.split_once("://"))
            .map(|(_, rest)| rest.trim_end_matches('/'));
        let base = state.public_base();
        let listed = origin.to_str().ok().map(|o| o.trim_end_matches('/')) == Some(base);
        if !listed && (own.is_none() || theirs != own) {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                "a request with a session cookie from another origin is refused",
            )
            .with_details(serde_json::json!({ "header": "origin" })));
        }
    }
    // The workspace: the header's; else the one of the path; else the cookie's; else the
    // personal one.
    let from_path = path
        .strip_prefix("/api/v1/workspaces/")
        .map(|rest| rest.split('/').next().unwrap_or(""))
        .filter(|id| !id.is_empty());
    let (workspace_id, role) = match headers.get(WORKSPACE_HEADER) {
        Some(v) => {
            let id = v.to_str().map_err(|_| workspace_not_found())?;
            let role = state
                .store
                .member_role(id, &user.id)
                .await?
                .ok_or_else(workspace_not_found)?;
            (id.to_string(), role)
        }
        None => {
            let mut found = None;
            if let Some(id) = from_path {
                if let Some(role) = state.store.member_role(id, &user.id).await? {
                    found = Some((id.to_string(), role));
                }
            }
            let picked = cookie(headers, WORKSPACE_COOKIE).filter(|v| !v.is_empty());
            match (found, picked) {
                (Some(f), _) => f,
                (None, Some(id)) => {
                    let role = state
                        .store
                        .member_role(id, &user.id)
                        .await?
                        .ok_or_else(workspace_not_found)?;
                    (id.to_string(), role)
                }
                (None, None) => {
                    let id = user.personal_workspace_id.clone();
                    let role = state
                        .store
                        .member_role(&id, &user.id)
                        .await?
                        .ok_or_else(workspace_not_found)?;
                    (id, role)
                }
            }
        }
    };
    if now - session.last_used_at > 60_000 {
        let expires = now + state.config.auth.session_ttl_ms();
        let _ = state.store.touch_session(&session.id, now, expires).await;
    }
    Ok(Auth {
        key_id: user.id.clone(),
        workspace_id,
        scopes: role.scopes(),
        operator: false,
        principal: Principal::User {
            user_id: user.id,
            session_id: session.id,
            role,
            csrf_token: session.csrf_token,
        },
    })
}

impl FromRequestParts<Arc<AppState>> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        // The route's guard (`routes::table`) authenticated this request already.
        if let Some(auth) = parts.extensions.get::<Auth>() {
            return Ok(auth.clone());
        }
        authenticate_request(state, &parts.method, parts.uri.path(), &parts.headers).await
    }
}

#[cfg(test)]
mod tests {
    use super::KeyTouches;

    #[test]
    fn a_use_while_its_key_is_written_is_written_next() {
        let t = KeyTouches::default();
        let row = |at: Option<i64>| cella_store::KeyRow {
            id: "k".into(),
            workspace_id: "ws".into(),
            name: "n".into(),
            hash: String::new(),
            prefix: String::new(),
            scopes: Vec::new(),
            created_at: 0,
            expires_at: None,
            revoked_at: None,
            last_used_at: at,
            operator: false,
        };
        let shown = |at| {
            let mut r = row(at);
            KeyTouches::merge(&t.snapshot(), &mut r);
            r.last_used_at
        };
        assert_eq!(shown(None), None, "nothing under way");
        assert!(t.begin("k", 10), "the first use starts a write");
        assert!(!t.begin("k", 30), "one write at a time");
        assert!(!t.begin("k", 20), "an earlier use moves nothing");
        assert_eq!(shown(None), Some(30), "the latest use under way");
        assert_eq!(shown(Some(40)), Some(40), "the store's, when later");
        assert_eq!(t.written("k", 10), Some(30), "written again");
        assert_eq!(shown(Some(10)), Some(30));
        assert_eq!(t.written("k", 30), None, "done");
        assert!(t.snapshot().is_empty());
        assert!(t.begin("k", 50), "a later use starts a new write");
    }
}
