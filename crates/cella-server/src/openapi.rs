//! The OpenAPI 3 document's base: the info, the security scheme and the shared schemas. The
//! paths come from the route table, which makes the whole document
//! (`crate::routes::table::document`) from this base and the handlers' annotations; a leaf.

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
