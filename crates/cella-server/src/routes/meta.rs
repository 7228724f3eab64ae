use crate::error::ApiError;
use axum::response::IntoResponse;
use axum::Json;
use cella_types::Health;

/// Liveness: 200 once the server accepts work.
#[utoipa::path(get, path = "/healthz", tag = "server", responses((status = 200, body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
    })
}

/// This document.
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "server", responses((status = 200, description = "OpenAPI 3 document")))]
pub async fn openapi() -> impl IntoResponse {
    Json(crate::routes::table::document())
}

pub async fn not_found() -> ApiError {
    crate::error::for_status(axum::http::StatusCode::NOT_FOUND)
}
