//! The template and image routes: each parses its request, calls one function of
//! `crate::builds` (custom templates) or `crate::images` (archive uploads) and encodes.

use crate::auth::Auth;
use crate::error::ApiError;
use crate::AppState;
use axum::extract::{Path, State};
use axum::Json;
use cella_types::{Data, Template, TemplateCatalog};
use std::sync::Arc;

/// The catalog of templates, sizes, readiness and resource contracts. Any valid key.
#[utoipa::path(get, path = "/api/v1/templates", tag = "templates",
    responses((status = 200, body = TemplateCatalog), (status = 401, body = cella_types::ErrorBody)))]
pub async fn list(State(state): State<Arc<AppState>>, auth: Auth) -> Json<TemplateCatalog> {
    Json(state.catalog.catalog(&auth.workspace_id))
}

/// One template, with its sizes and contracts.
#[utoipa::path(get, path = "/api/v1/templates/{id}", tag = "templates",
    params(("id" = String, Path, description = "Template id")),
    responses((status = 200, body = Data<Template>), (status = 404, body = cella_types::ErrorBody)))]
pub async fn get(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Data<Template>>, ApiError> {
    let t = crate::builds::template(&state, &auth, &id)?;
    Ok(Json(Data {
        data: state.catalog.entry(&t),
    }))
}

/// Build a custom template from a base and ordered steps (see `builds.rs`); answers 202 with
/// the build, whose state and log `GET .../builds/{build_id}` reads while it runs. Posting the
/// spec of an existing template of the workspace rebuilds it (unchanged leading steps come
/// from the layer cache). Scope `templates:write`.
#[utoipa::path(post, path = "/api/v1/templates", tag = "templates",
    request_body = cella_types::TemplateSpec,
    responses((status = 202, body = Data<cella_types::TemplateBuild>), (status = 400, body = cella_types::ErrorBody),
              (status = 409, body = cella_types::ErrorBody)))]
pub async fn build(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    body: crate::extract::ApiBody,
) -> Result<
    (
        axum::http::StatusCode,
        Json<Data<cella_types::TemplateBuild>>,
    ),
    ApiError,
> {
    let spec: cella_types::TemplateSpec = body.json()?;
    let b = crate::builds::start(&state, &auth, spec).await?;
    Ok((axum::http::StatusCode::ACCEPTED, Json(Data { data: b })))
}

/// A custom template's builds, newest first (at most 50), without their logs (read one build
/// for its log). Any valid key of the template's workspace.
#[utoipa::path(get, path = "/api/v1/templates/{id}/builds", tag = "templates",
    params(("id" = String, Path)),
    responses((status = 200, body = cella_types::List<cella_types::TemplateBuild>), (status = 404, body = cella_types::ErrorBody)))]
pub async fn builds(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    q: crate::extract::QueryPairs,
) -> Result<Json<cella_types::List<cella_types::TemplateBuild>>, ApiError> {
    crate::extract::reject_unknown(&q.0)?;
    let rows = crate::builds::builds_of(&state, &auth, &id, 50).await?;
    Ok(Json(cella_types::List {
        data: rows
            .iter()
            .map(|b| crate::builds::wire(b, b.log.len()))
            .collect(),
        next_cursor: None,
    }))
}

/// A build's state, steps and log (`log_offset`: only the log after that many bytes). Any
/// valid key of the template's workspace.
#[utoipa::path(get, path = "/api/v1/templates/{id}/builds/{build_id}", tag = "templates",
    params(("id" = String, Path), ("build_id" = String, Path), ("log_offset" = Option<u64>, Query)),
    responses((status = 200, body = Data<cella_types::TemplateBuild>), (status = 404, body = cella_types::ErrorBody)))]
pub async fn build_status(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path((id, build_id)): Path<(String, String)>,
    q: crate::extract::QueryPairs,
) -> Result<Json<Data<cella_types::TemplateBuild>>, ApiError> {
    let mut offset = 0usize;
    for (k, v) in &q.0 {
        match k.as_str() {
            "log_offset" => {
                offset = v
                    .parse()
                    .map_err(|_| ApiError::invalid("log_offset", "log_offset is a byte count"))?
            }
            other => {
                return Err(ApiError::invalid(
                    other,
                    format!("unknown query parameter {other}"),
                ))
            }
        }
    }
    let b = crate::builds::build_of(&state, &auth, &id, &build_id).await?;
    Ok(Json(Data {
        data: crate::builds::wire(&b, offset),
    }))
}

/// Delete a custom template: refused with 409 while sandboxes or snapshots use it; layers no
/// other template uses are removed. Scope `templates:write`.
#[utoipa::path(delete, path = "/api/v1/templates/{id}", tag = "templates",
    params(("id" = String, Path)),
    responses((status = 200, body = Data<Template>), (status = 404, body = cella_types::ErrorBody),
              (status = 409, body = cella_types::ErrorBody)))]
pub async fn delete(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Data<Template>>, ApiError> {
    let t = crate::builds::delete(&state, &auth, &id).await?;
    Ok(Json(Data {
        data: state.catalog.entry(&t),
    }))
}

/// Import an image from an archive (an OCI layout or a `docker save` tarball, as a tar body),
/// for templates to build on with `"image": "upload:<id>"` (the CLI does this for
/// `oci-archive:`, `oci:` and `docker-archive:` images). Scope `templates:write`.
#[utoipa::path(post, path = "/api/v1/images", tag = "templates",
    params(("name" = Option<String>, Query)),
    request_body(content = Vec<u8>, content_type = "application/x-tar"),
    responses((status = 201, body = Data<crate::images::ImportedImage>), (status = 400, body = cella_types::ErrorBody)))]
pub async fn import_image(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    q: crate::extract::QueryPairs,
    body: axum::body::Body,
) -> Result<
    (
        axum::http::StatusCode,
        Json<Data<crate::images::ImportedImage>>,
    ),
    ApiError,
> {
    let mut name = String::from("uploaded");
    for (k, v) in &q.0 {
        match k.as_str() {
            "name" => name = v.clone(),
            other => {
                return Err(ApiError::invalid(
                    other,
                    format!("unknown query parameter {other}"),
                ))
            }
        }
    }
    let img = crate::images::import(&state, &auth, &name, body).await?;
    Ok((axum::http::StatusCode::CREATED, Json(Data { data: img })))
}

/// The workspace's imported images, oldest first. Any valid key of the workspace.
#[utoipa::path(get, path = "/api/v1/images", tag = "templates",
    responses((status = 200, body = cella_types::List<crate::images::ImportedImage>)))]
pub async fn images(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    q: crate::extract::QueryPairs,
) -> Result<Json<cella_types::List<crate::images::ImportedImage>>, ApiError> {
    crate::extract::reject_unknown(&q.0)?;
    Ok(Json(cella_types::List {
        data: crate::images::list(&state, &auth.workspace_id),
        next_cursor: None,
    }))
}

/// Delete an imported image: its layers that no template and no other image uses leave the
/// layer store, and its bytes leave the workspace's storage. Templates built on it keep
/// working. Scope `templates:write`.
#[utoipa::path(delete, path = "/api/v1/images/{id}", tag = "templates",
    params(("id" = String, Path)),
    responses((status = 200, body = Data<crate::images::ImportedImage>), (status = 404, body = cella_types::ErrorBody)))]
pub async fn delete_image(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Data<crate::images::ImportedImage>>, ApiError> {
    let img = crate::images::delete(&state, &auth.workspace_id, &id).await?;
    Ok(Json(Data { data: img }))
}
