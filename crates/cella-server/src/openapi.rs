//! The OpenAPI 3 document: the info, the security scheme and the shared schemas here; the
//! paths come from the route table ([`crate::routes::table`]) and the handlers' annotations.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("API key")
                    .build(),
            ),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Cella API", version = "1", description = "Sandboxes for AI agents. Contract: docs/api.md."),
    components(schemas(cella_types::ErrorBody, cella_types::ErrorInfo)),
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;

/// The whole document: [`ApiDoc`] with every route of the table.
pub fn document() -> utoipa::openapi::OpenApi {
    crate::routes::table::document()
}
