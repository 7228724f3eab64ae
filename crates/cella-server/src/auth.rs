//! Bearer API keys and scopes.

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
}

impl Auth {
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
    if row.last_used_at.is_none_or(|t| now - t > 60_000) {
        let _ = state.store.touch_key(&row.id, now).await;
    }
    let scopes = crate::routes::keys::parse_scopes(&row.scopes);
    Ok(Auth {
        key_id: row.id,
        workspace_id: row.workspace_id,
        scopes,
    })
}

impl FromRequestParts<Arc<AppState>> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        // The rate limiter authenticated this request already.
        if let Some(auth) = parts.extensions.get::<Auth>() {
            return Ok(auth.clone());
        }
        authenticate(state, &parts.headers).await
    }
}
