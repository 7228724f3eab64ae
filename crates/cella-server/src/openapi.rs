//! The OpenAPI 3 document, built from the handlers' annotations.

use crate::routes::{files, keys, meta, processes, sandboxes, templates, workspaces};
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
    paths(
        meta::healthz,
        meta::openapi,
        workspaces::create,
        workspaces::list,
        workspaces::get,
        workspaces::update,
        workspaces::storage,
        keys::create,
        keys::list,
        keys::revoke,
        templates::list,
        templates::get,
        templates::build,
        templates::build_status,
        templates::builds,
        templates::delete,
        templates::import_image,
        templates::images,
        templates::delete_image,
        sandboxes::create,
        sandboxes::list,
        sandboxes::get,
        sandboxes::destroy,
        sandboxes::exec,
        sandboxes::pause,
        sandboxes::resume,
        sandboxes::stop,
        sandboxes::set_timeout,
        sandboxes::usage,
        sandboxes::exec_stream,
        files::upload,
        files::download,
        files::list,
        files::stat,
        files::mkdir,
        files::rename,
        files::remove,
        files::watch,
        processes::start,
        processes::list,
        processes::get,
        processes::signal,
        processes::stdin,
        processes::output,
        crate::routes::pty::pty,
        crate::routes::code::run,
        crate::routes::code::state_of,
        crate::routes::code::contexts,
        crate::routes::code::create_context,
        crate::routes::code::reset_context,
        crate::routes::code::reset_all,
        crate::routes::snapshots::create,
        crate::routes::snapshots::list,
        crate::routes::snapshots::get,
        crate::routes::snapshots::delete,
        crate::routes::snapshots::fork,
        crate::routes::sandboxes::expose,
        crate::routes::sandboxes::preview_token,
        crate::routes::artifacts::run,
        crate::routes::artifacts::collect,
        crate::routes::artifacts::list,
        crate::routes::artifacts::download,
        crate::routes::artifacts::delete,
    ),
    components(schemas(cella_types::ErrorBody, cella_types::ErrorInfo)),
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;
