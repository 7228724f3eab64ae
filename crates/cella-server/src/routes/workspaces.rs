use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::{cursor_for, reject_unknown, ApiBody, Page, QueryPairs};
use crate::util::rfc3339;
use crate::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use cella_store::WorkspaceRow;
use cella_types::{
    CreateWorkspace, Data, List, Plan, UpdateWorkspace, Workspace, WorkspaceKind,
    WorkspaceSettings, WorkspaceStorage,
};
use std::sync::Arc;

pub fn to_wire(w: &WorkspaceRow) -> Workspace {
    Workspace {
        id: w.id.clone(),
        name: w.name.clone(),
        plan: Plan::parse(&w.plan).unwrap_or(Plan::Developer),
        kind: WorkspaceKind::parse(&w.kind).unwrap_or(WorkspaceKind::Organization),
        created_at: rfc3339(w.created_at),
        settings: w.settings.clone(),
    }
}

fn check_name(name: &str) -> Result<(), ApiError> {
    if name.trim().is_empty() || name.len() > 200 {
        return Err(ApiError::invalid(
            "name",
            "name must be 1 to 200 characters",
        ));
    }
    Ok(())
}

/// Create a workspace (tenant). The operator only.
#[utoipa::path(post, path = "/api/v1/workspaces", tag = "workspaces", request_body = CreateWorkspace,
    responses((status = 201, body = Data<Workspace>), (status = 400, body = cella_types::ErrorBody), (status = 403, body = cella_types::ErrorBody)))]
pub async fn create(
    State(state): State<Arc<AppState>>,
    body: ApiBody,
) -> Result<(StatusCode, Json<Data<Workspace>>), ApiError> {
    let req: CreateWorkspace = body.json()?;
    check_name(&req.name)?;
    let row = crate::service::accounts::new_workspace(&req.name, req.plan, req.kind);
    state.store.insert_workspace(&row).await?;
    Ok((
        StatusCode::CREATED,
        Json(Data {
            data: to_wire(&row),
        }),
    ))
}

/// List workspaces, oldest first. Scope `admin`: the operator sees every workspace (but the
/// internal ones), a workspace's admin key its own.
#[utoipa::path(get, path = "/api/v1/workspaces", tag = "workspaces",
    params(("limit" = Option<u32>, Query, description = "1-1000, default 100"), ("cursor" = Option<String>, Query, description = "from next_cursor")),
    responses((status = 200, body = List<Workspace>), (status = 403, body = cella_types::ErrorBody)))]
pub async fn list(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    QueryPairs(mut q): QueryPairs,
) -> Result<Json<List<Workspace>>, ApiError> {
    let page = Page::take(&mut q)?;
    reject_unknown(&q)?;
    let rows = if auth.operator {
        state.store.list_workspaces(page.limit, page.cursor).await?
    } else {
        match (&page.cursor, find(&state, &auth, &auth.workspace_id).await) {
            (None, Ok(w)) => vec![(0, w)],
            _ => Vec::new(),
        }
    };
    let next_cursor = (rows.len() == page.limit as usize)
        .then(|| cursor_for(rows.last().map(|r| r.0).unwrap_or(0)));
    Ok(Json(List {
        data: rows.iter().map(|(_, w)| to_wire(w)).collect(),
        next_cursor,
    }))
}

async fn find(state: &AppState, auth: &Auth, id: &str) -> Result<WorkspaceRow, ApiError> {
    // A caller sees the workspace it acts in; only the operator sees the others; nobody the
    // internal ones.
    Ok(crate::service::people::visible_workspace(state, auth, id).await?)
}

/// One workspace. Any key for its own workspace; the operator for any (another workspace
/// answers 404 to every other key).
#[utoipa::path(get, path = "/api/v1/workspaces/{id}", tag = "workspaces",
    params(("id" = String, Path)), responses((status = 200, body = Data<Workspace>), (status = 404, body = cella_types::ErrorBody)))]
pub async fn get(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Data<Workspace>>, ApiError> {
    Ok(Json(Data {
        data: to_wire(&find(&state, &auth, &id).await?),
    }))
}

/// What a workspace stores against its storage quota, by kind. Any key for its own
/// workspace; the operator for any.
#[utoipa::path(get, path = "/api/v1/workspaces/{id}/storage", tag = "workspaces",
    params(("id" = String, Path)), responses((status = 200, body = Data<WorkspaceStorage>), (status = 404, body = cella_types::ErrorBody)))]
pub async fn storage(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Data<WorkspaceStorage>>, ApiError> {
    let w = find(&state, &auth, &id).await?;
    let u = state.store.storage_of(&w.id).await?;
    Ok(Json(Data {
        data: WorkspaceStorage {
            used_bytes: u.total(),
            quota_bytes: state.config.quotas.storage_bytes.get(&w.plan).copied(),
            snapshots_bytes: u.snapshots,
            artifacts_bytes: u.artifacts,
            images_bytes: u.images,
            templates_bytes: u.templates,
        },
    }))
}

/// Change a workspace's name, plan or settings. Scope `admin` (an admin key, or a signed-in
/// owner or admin; members get 403), for the caller's own workspace (the operator: any). The
/// plan is the operator's to change. Settings not named keep their values; an unknown one, a
/// wrong type or a value out of range is 400 naming `settings.<field>`.
#[utoipa::path(patch, path = "/api/v1/workspaces/{id}", tag = "workspaces", request_body = UpdateWorkspace,
    params(("id" = String, Path)), responses((status = 200, body = Data<Workspace>), (status = 400, body = cella_types::ErrorBody), (status = 404, body = cella_types::ErrorBody)))]
pub async fn update(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    body: ApiBody,
) -> Result<Json<Data<Workspace>>, ApiError> {
    let req: UpdateWorkspace = body.json()?;
    if !auth.manages(&id) {
        return Err(ApiError::not_found("workspace"));
    }
    let mut row = find(&state, &auth, &id).await?;
    if let Some(name) = req.name {
        check_name(&name)?;
        row.name = name;
    }
    if let Some(plan) = req.plan {
        if plan.as_str() != row.plan {
            auth.require_operator("change a workspace's plan")?;
        }
        row.plan = plan.as_str().into();
    }
    if let Some(changes) = req.settings {
        let mut merged = match serde_json::to_value(&row.settings) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => return Err(ApiError::internal()),
        };
        merged.extend(changes);
        let settings: WorkspaceSettings = crate::extract::parse_json(
            &serde_json::to_vec(&merged).map_err(|_| ApiError::internal())?,
        )
        .map_err(|mut e| {
            if let Some(f) = e.details.as_mut().and_then(|d| d.get_mut("field")) {
                *f = serde_json::Value::String(format!("settings.{}", f.as_str().unwrap_or("")));
            }
            e
        })?;
        if settings.compute_rate.is_negative() || settings.compute_rate > cella_billing::MAX_BALANCE
        {
            return Err(ApiError::invalid(
                "settings.compute_rate",
                "compute_rate must be a decimal string of at least 0, like \"0.000100\"",
            ));
        }
        row.settings = settings;
        crate::service::accounts::check_settings_here(&state, &row.settings)?;
    }
    state.store.update_workspace(&row).await?;
    Ok(Json(Data {
        data: to_wire(&row),
    }))
}
