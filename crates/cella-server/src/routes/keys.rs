use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::{cursor_for, reject_unknown, ApiBody, Page, QueryPairs};
use crate::service::accounts;
use crate::util::rfc3339;
use crate::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use cella_store::KeyRow;
use cella_types::{ApiKey, CreateApiKey, CurrentCaller, Data, List};
use std::sync::Arc;

pub fn to_wire(k: &KeyRow) -> ApiKey {
    ApiKey {
        id: k.id.clone(),
        workspace_id: k.workspace_id.clone(),
        name: k.name.clone(),
        scopes: k.scopes.clone(),
        prefix: k.prefix.clone(),
        created_at: rfc3339(k.created_at),
        expires_at: k.expires_at.map(rfc3339),
        last_used_at: k.last_used_at.map(rfc3339),
        key: None,
    }
}

/// Create an API key for a workspace; the key is in this answer only. Scope `admin`: a
/// workspace's admin (key, owner or admin) makes keys of its own workspace, the operator of any (another
/// workspace, and an internal one for everybody, answers 404). No key makes a key with a scope
/// it does not hold.
#[utoipa::path(post, path = "/api/v1/api-keys", tag = "api-keys", request_body = CreateApiKey,
    responses((status = 201, body = Data<ApiKey>), (status = 400, body = cella_types::ErrorBody), (status = 404, body = cella_types::ErrorBody)))]
pub async fn create(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    body: ApiBody,
) -> Result<(StatusCode, Json<Data<ApiKey>>), ApiError> {
    let req: CreateApiKey = body.json()?;
    let (row, secret) = accounts::create_key(&state, &auth, &req).await?;
    let mut key = to_wire(&row);
    key.key = Some(secret);
    Ok((StatusCode::CREATED, Json(Data { data: key })))
}

/// List API keys that are not revoked (never their secrets). Scope `admin`: a workspace's
/// admin key lists its own workspace's keys, the operator every workspace's.
#[utoipa::path(get, path = "/api/v1/api-keys", tag = "api-keys",
    params(("limit" = Option<u32>, Query), ("cursor" = Option<String>, Query)),
    responses((status = 200, body = List<ApiKey>), (status = 403, body = cella_types::ErrorBody)))]
pub async fn list(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    QueryPairs(mut q): QueryPairs,
) -> Result<Json<List<ApiKey>>, ApiError> {
    let page = Page::take(&mut q)?;
    reject_unknown(&q)?;
    let rows = accounts::list_keys(&state, &auth, page.limit, page.cursor).await?;
    let next_cursor = (rows.len() == page.limit as usize)
        .then(|| cursor_for(rows.last().map(|r| r.0).unwrap_or(0)));
    Ok(Json(List {
        data: rows.iter().map(|(_, k)| to_wire(k)).collect(),
        next_cursor,
    }))
}

/// Revoke an API key; it gets 401 from the next request on. Scope `admin`, for a key of the
/// caller's workspace (the operator: of any); another workspace's key answers 404. Only the
/// operator revokes an operator key.
#[utoipa::path(delete, path = "/api/v1/api-keys/{id}", tag = "api-keys",
    params(("id" = String, Path)), responses((status = 200, body = Data<ApiKey>), (status = 404, body = cella_types::ErrorBody)))]
pub async fn revoke(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Data<ApiKey>>, ApiError> {
    let row = accounts::revoke_key(&state, &auth, &id).await?;
    Ok(Json(Data {
        data: to_wire(&row),
    }))
}

/// Who the caller is: the key's (or signed-in user's) id, workspace and scopes. Any valid key;
/// MCP clients (`/mcp`) are told their tools from it.
#[utoipa::path(get, path = "/api/v1/api-keys/current", tag = "api-keys",
    responses((status = 200, body = Data<CurrentCaller>), (status = 401, body = cella_types::ErrorBody)))]
pub async fn current(auth: Auth) -> Json<Data<CurrentCaller>> {
    Json(Data {
        data: CurrentCaller {
            kind: if auth.user_id().is_some() {
                "user"
            } else {
                "key"
            }
            .into(),
            id: auth.key_id.clone(),
            workspace_id: auth.workspace_id.clone(),
            scopes: auth.scopes.clone(),
            operator: auth.operator,
        },
    })
}
