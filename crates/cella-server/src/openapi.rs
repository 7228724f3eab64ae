//! The OpenAPI 3 document's base: the info, the security scheme and the shared schemas. The
//! paths come from the route table, which makes the whole document
//! (`crate::routes::table::document`) from this base and the handlers' annotations; a leaf.

use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
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
        // A signed-in user's cookie (`POST /api/v1/sessions`); writes also need the header
        // `x-csrf-token`, and the header `x-cella-workspace` picks the workspace.
        components.add_security_scheme(
            "session",
            SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::with_description(
                "cella_session",
                "The session cookie of POST /api/v1/sessions. Writes need `x-csrf-token`; \
                 `x-cella-workspace` selects the workspace (default: the personal one).",
            ))),
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
