//! HTTP handlers: each reads the request, calls the service, shapes the answer. Which key may
//! call a route and the rate limit it counts against are the route's row in [`table`], which
//! also makes the router and the OpenAPI paths.

pub mod artifacts;
pub mod code;
pub mod files;
pub mod keys;
pub mod meta;
pub mod money;
pub mod people;
pub mod processes;
pub mod pty;
pub mod sandboxes;
pub mod snapshots;
pub mod table;
pub mod tasks;
pub mod templates;
pub mod workspaces;
