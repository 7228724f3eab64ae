//! Bearer API keys and scopes.
//!
//! Two kinds of caller. The **operator** (the bootstrap key: the one the first start generated,
//! or `CELLA_BOOTSTRAP_KEY`'s) manages every workspace. Every other key belongs to one
//! workspace; its `admin` scope is admin of that workspace only, and another workspace's
//! objects are 404 to it. Internal workspaces ([`cella_store::is_internal_workspace`], the warm
//! pool's) are addressable by no key: a key of one (which the API never makes) is refused.
//!
//! The scopes each route needs are its row in `routes::table`, whose guard authenticates the
//! caller and checks them before the handler runs; the handler gets the caller as [`Auth`].

use crate::error::ApiError;
use crate::util::{hash_key, now_ms};
use crate::AppState;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::HeaderMap;
use cella_types::{ErrorCode, Scope};
use std::sync::Arc;

/// The caller, as its API key says.
#[derive(Debug, Clone)]
pub struct Auth {
    pub key_id: String,
    pub workspace_id: String,
    pub scopes: Vec<Scope>,
    /// The operator's key: manages every workspace (see the module docs).
    pub operator: bool,
}

impl Auth {
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

    pub fn has(&self, scope: Scope) -> bool {
        self.scopes.contains(&Scope::Admin) || self.scopes.contains(&scope)
    }

    /// 403 `FORBIDDEN` unless the key carries `scope` (or `admin`).
    pub fn require(&self, scope: Scope) -> Result<(), ApiError> {
        if self.has(scope) {
            Ok(())
        } else {
            Err(ApiError::new(
                ErrorCode::Forbidden,
                format!("this API key lacks the scope {}", scope.as_str()),
            )
            .with_details(serde_json::json!({ "required_scope": scope.as_str() })))
        }
    }
}

fn unauthorized(msg: &str) -> ApiError {
    ApiError::new(ErrorCode::Unauthorized, msg)
}

/// Finds the caller from the `Authorization` header.
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
    let row = state
        .store
        .key_by_hash(&hash_key(secret))
        .await?
        .ok_or_else(|| unauthorized("invalid API key"))?;
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
        let _ = state.store.touch_key(&row.id, now).await;
    }
    let scopes = row.scopes.clone();
    Ok(Auth {
        key_id: row.id,
        workspace_id: row.workspace_id,
        scopes,
        operator: row.operator,
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
        authenticate(state, &parts.headers).await
    }
}
