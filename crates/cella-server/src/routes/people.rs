//! Users, sessions, `GET /api/v1/me` and the members of workspaces (the service is
//! `crate::service::people`; who the caller is, `crate::auth`).

use crate::auth::{Auth, Principal, SESSION_COOKIE};
use crate::error::ApiError;
use crate::extract::{cursor_for, reject_unknown, ApiBody, Page, QueryPairs};
use crate::service::people;
use crate::util::rfc3339;
use crate::{AppState, ClientAddr};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use cella_store::{MemberRow, UserRow};
use cella_types::{
    AddMember, CreateSession, CreateUser, Data, List, Me, MeWorkspace, Member, Session,
    UpdateMember, User,
};
use std::sync::Arc;

pub fn user_to_wire(u: &UserRow) -> User {
    User {
        id: u.id.clone(),
        email: u.email.clone(),
        name: u.name.clone(),
        created_at: rfc3339(u.created_at),
    }
}

fn member_to_wire(m: &MemberRow) -> Member {
    Member {
        user_id: m.user_id.clone(),
        email: m.email.clone(),
        name: m.name.clone(),
        role: m.role,
    }
}

/// Make a user, with their personal workspace (whose owner they are). The operator only, or
/// anyone when the server's config says `[auth] signup = true`. A taken email (whatever its
/// case) is 409; a password of fewer than 8 or more than 1024 bytes is 400.
#[utoipa::path(post, path = "/api/v1/users", tag = "people", request_body = CreateUser,
    responses((status = 201, body = Data<User>), (status = 400, body = cella_types::ErrorBody), (status = 403, body = cella_types::ErrorBody), (status = 409, body = cella_types::ErrorBody)))]
pub async fn create_user(
    State(state): State<Arc<AppState>>,
    body: ApiBody,
) -> Result<(StatusCode, Json<Data<User>>), ApiError> {
    let req: CreateUser = body.json()?;
    let user = people::create_user(&state, &req.email, &req.name, req.password).await?;
    Ok((
        StatusCode::CREATED,
        Json(Data {
            data: user_to_wire(&user),
        }),
    ))
}

/// Whether the session cookie gets `Secure`: when configured, or when the request came over
/// TLS (as a proxy in front says with `X-Forwarded-Proto`).
fn secure(state: &AppState, headers: &HeaderMap) -> bool {
    state.config.auth.secure_cookies
        || headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
}

/// Sign in with an email and a password: sets the session cookie (`cella_session`, `HttpOnly`,
/// `SameSite=Lax`, `Path=/`, `Secure` behind TLS) and answers the user and the session's CSRF
/// token. An unknown email and a wrong password get the same 401; repeated failures for one
/// email or from one address get 429 with `Retry-After`.
#[utoipa::path(post, path = "/api/v1/sessions", tag = "people", request_body = CreateSession,
    responses((status = 201, body = Data<Session>), (status = 400, body = cella_types::ErrorBody), (status = 401, body = cella_types::ErrorBody), (status = 429, body = cella_types::ErrorBody)))]
pub async fn sign_in(
    State(state): State<Arc<AppState>>,
    addr: Option<Extension<ClientAddr>>,
    headers: HeaderMap,
    body: ApiBody,
) -> Result<Response, ApiError> {
    let req: CreateSession = body.json()?;
    let ip = addr.map(|Extension(ClientAddr(a))| a.ip());
    let s = people::sign_in(&state, &req.email, req.password, ip).await?;
    let max_age = people::ttl_ms(&state.config.auth) / 1000;
    let cookie = format!(
        "{SESSION_COOKIE}={}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Lax{}",
        s.token,
        if secure(&state, &headers) {
            "; Secure"
        } else {
            ""
        }
    );
    let body = Data {
        data: Session {
            user: user_to_wire(&s.user),
            csrf_token: s.row.csrf_token.clone(),
            expires_at: rfc3339(s.row.expires_at),
        },
    };
    let mut res = (StatusCode::CREATED, Json(body)).into_response();
    res.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&cookie).map_err(|_| ApiError::internal())?,
    );
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(res)
}

/// Sign out: ends the caller's session (its cookie gets 401 from the next request on) and
/// clears the cookie. A signed-in user only (with `x-csrf-token`).
#[utoipa::path(delete, path = "/api/v1/sessions/current", tag = "people",
    responses((status = 200, body = Object), (status = 401, body = cella_types::ErrorBody), (status = 403, body = cella_types::ErrorBody)))]
pub async fn sign_out(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Principal::User { session_id, .. } = &auth.principal else {
        return Err(ApiError::internal());
    };
    people::sign_out(&state, session_id).await?;
    let cookie = format!(
        "{SESSION_COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Lax{}",
        if secure(&state, &headers) {
            "; Secure"
        } else {
            ""
        }
    );
    let mut res = Json(Data {
        data: serde_json::json!({ "signed_out": true }),
    })
    .into_response();
    res.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&cookie).map_err(|_| ApiError::internal())?,
    );
    Ok(res)
}

/// The signed-in user, their workspaces with their role in each, and the session's CSRF token
/// (send it in `x-csrf-token` with every write). A signed-in user only.
#[utoipa::path(get, path = "/api/v1/me", tag = "people",
    responses((status = 200, body = Data<Me>), (status = 401, body = cella_types::ErrorBody), (status = 403, body = cella_types::ErrorBody)))]
pub async fn me(State(state): State<Arc<AppState>>, auth: Auth) -> Result<Response, ApiError> {
    let Principal::User {
        user_id,
        csrf_token,
        ..
    } = &auth.principal
    else {
        return Err(ApiError::internal());
    };
    let user = state
        .store
        .user(user_id)
        .await?
        .ok_or_else(|| ApiError::not_found("user"))?;
    let workspaces = people::workspaces_of(&state, user_id)
        .await?
        .iter()
        .map(|(w, role)| MeWorkspace {
            workspace: super::workspaces::to_wire(w),
            role: *role,
        })
        .collect();
    let mut res = Json(Data {
        data: Me {
            user: user_to_wire(&user),
            workspaces,
            csrf_token: csrf_token.clone(),
        },
    })
    .into_response();
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(res)
}

/// A workspace's members, in the order they joined. Anyone in the workspace (any key of it, any
/// member); the operator for any.
#[utoipa::path(get, path = "/api/v1/workspaces/{id}/members", tag = "people",
    params(("id" = String, Path), ("limit" = Option<u32>, Query), ("cursor" = Option<String>, Query)),
    responses((status = 200, body = List<Member>), (status = 404, body = cella_types::ErrorBody)))]
pub async fn list_members(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    QueryPairs(mut q): QueryPairs,
) -> Result<Json<List<Member>>, ApiError> {
    let page = Page::take(&mut q)?;
    reject_unknown(&q)?;
    let rows = people::list_members(&state, &auth, &id, page.limit, page.cursor).await?;
    let next_cursor = (rows.len() == page.limit as usize)
        .then(|| cursor_for(rows.last().map(|r| r.0).unwrap_or(0)));
    Ok(Json(List {
        data: rows.iter().map(|(_, m)| member_to_wire(m)).collect(),
        next_cursor,
    }))
}

/// Add an existing user (by email) to an organization workspace with a role. Owners and admins
/// (scope `admin` of the workspace); only an owner (or the operator) adds an owner. A user who
/// is a member already, or a personal workspace, is 409.
#[utoipa::path(post, path = "/api/v1/workspaces/{id}/members", tag = "people", request_body = AddMember,
    params(("id" = String, Path)),
    responses((status = 201, body = Data<Member>), (status = 400, body = cella_types::ErrorBody), (status = 403, body = cella_types::ErrorBody), (status = 404, body = cella_types::ErrorBody), (status = 409, body = cella_types::ErrorBody)))]
pub async fn add_member(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    body: ApiBody,
) -> Result<(StatusCode, Json<Data<Member>>), ApiError> {
    let req: AddMember = body.json()?;
    let m = people::add_member(&state, &auth, &id, &req.email, req.role).await?;
    Ok((
        StatusCode::CREATED,
        Json(Data {
            data: member_to_wire(&m),
        }),
    ))
}

/// Change a member's role. Owners and admins; only an owner (or the operator) makes or changes
/// an owner. The last owner cannot be demoted (409).
#[utoipa::path(patch, path = "/api/v1/workspaces/{id}/members/{user_id}", tag = "people", request_body = UpdateMember,
    params(("id" = String, Path), ("user_id" = String, Path)),
    responses((status = 200, body = Data<Member>), (status = 400, body = cella_types::ErrorBody), (status = 403, body = cella_types::ErrorBody), (status = 404, body = cella_types::ErrorBody), (status = 409, body = cella_types::ErrorBody)))]
pub async fn update_member(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path((id, user_id)): Path<(String, String)>,
    body: ApiBody,
) -> Result<Json<Data<Member>>, ApiError> {
    let req: UpdateMember = body.json()?;
    let m = people::set_role(&state, &auth, &id, &user_id, req.role).await?;
    Ok(Json(Data {
        data: member_to_wire(&m),
    }))
}

/// Remove a member, or leave (a signed-in user removing themselves, whatever their role).
/// Removing someone else takes an owner or admin (an owner: an owner or the operator). The last
/// owner cannot leave (409).
#[utoipa::path(delete, path = "/api/v1/workspaces/{id}/members/{user_id}", tag = "people",
    params(("id" = String, Path), ("user_id" = String, Path)),
    responses((status = 200, body = Data<Member>), (status = 403, body = cella_types::ErrorBody), (status = 404, body = cella_types::ErrorBody), (status = 409, body = cella_types::ErrorBody)))]
pub async fn remove_member(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path((id, user_id)): Path<(String, String)>,
) -> Result<Json<Data<Member>>, ApiError> {
    let m = people::remove_member(&state, &auth, &id, &user_id).await?;
    Ok(Json(Data {
        data: member_to_wire(&m),
    }))
}
