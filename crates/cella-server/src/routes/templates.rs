use crate::auth::Auth;
use crate::error::ApiError;
use crate::AppState;
use axum::extract::{Path, State};
use axum::Json;
use cella_types::{Data, Template, TemplateCatalog};
use std::sync::Arc;

/// The catalog of templates, sizes, readiness and resource contracts. Any valid key.
#[utoipa::path(get, path = "/api/v1/templates", tag = "templates", security(("bearer" = [])),
    responses((status = 200, body = TemplateCatalog), (status = 401, body = cella_types::ErrorBody)))]
pub async fn list(State(state): State<Arc<AppState>>, _auth: Auth) -> Json<TemplateCatalog> {
    Json(state.catalog.catalog())
}

/// One template, with its sizes and contracts.
#[utoipa::path(get, path = "/api/v1/templates/{id}", tag = "templates", security(("bearer" = [])),
    params(("id" = String, Path, description = "Template id")),
    responses((status = 200, body = Data<Template>), (status = 404, body = cella_types::ErrorBody)))]
pub async fn get(
    State(state): State<Arc<AppState>>,
    _auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Data<Template>>, ApiError> {
    let t = state
        .catalog
        .get(&id)
        .ok_or_else(|| ApiError::not_found("template"))?;
    Ok(Json(Data {
        data: state.catalog.entry(t),
    }))
}
