//! HTTP handlers: each checks scopes, reads the request, calls the service, shapes the answer.

pub mod artifacts;
pub mod code;
pub mod files;
pub mod keys;
pub mod meta;
pub mod processes;
pub mod pty;
pub mod sandboxes;
pub mod snapshots;
pub mod templates;
pub mod workspaces;
