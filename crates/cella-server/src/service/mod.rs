//! The service layer: what operations on sandboxes do, apart from HTTP.
//!
//! Routes parse a request, call a service function and encode its answer; services return
//! typed errors ([`SandboxError`], [`SnapshotError`], [`RunError`],
//! [`TemplateError`]) that [`error`] turns into the API's envelope, each in one `From` impl,
//! logging the causes of internal ones there (a 500 `INTERNAL` body stays generic). What is
//! here so far:
//!
//! - [`transitions`]: every state change of a sandbox, as one table checked in one function.
//! - [`runnable`]: the one way to get a running sandbox (row, handle, and exec specs with its
//!   template's defaults), the one timeout check, and ownership of a sandbox by a workspace.
//! - [`boot`]: booting a sandbox (and its template's app), and settling its clock.
//! - [`accounts`]: new workspaces and API keys (for the routes and the bootstrap), changes to
//!   workspaces and keys.
//! - [`people`]: users, sessions, sign-in limits, members and roles.
//! - [`error`]: the errors, and which agent operation an agent error came from.
//!
//! The rest of the sandbox service (create, destroy, exec) is in `crate::sandboxes`
//! and `crate::lifecycle`, snapshots in `crate::snapshots`, runs in `crate::runs`, template
//! builds in `crate::builds`; they use
//! these.
//!
//! Layers: the server's top-level modules import each other without a cycle (a unit test,
//! `tests/modules.rs`, reads the sources and fails on one). The leaves are `util`, `error` (the
//! envelope and `error::Internal`), `rows` (reading a sandbox's row, the per-sandbox lock),
//! `config` (with `ratelimit`), `auth`; `network`, `quotas` and `images` sit on them; `service`
//! on those; then `billing` (which answers what the lifecycle should pause, rather than
//! pausing), `pool`, `catalog`, `sandboxes`, `snapshots`, `runs`, `lifecycle`, `builds`,
//! `preview`; `routes` on top.
//! Shared state lives in `AppState` (the crate root), passed in. A type two modules need goes
//! down to a leaf, never up.

pub mod accounts;
pub mod boot;
pub mod error;
pub mod people;
/// Reading rows is a leaf of the server (`crate::rows`), named here too.
pub use crate::rows;
pub mod runnable;
pub mod transitions;

pub use error::{
    AgentOp, LastBuild, RunError, SandboxError, SnapshotError, TaskError, TemplateError,
};
pub use runnable::{check_timeout, owned, runnable, CheckedAgent, Runnable};
