//! Repository task runs, the parts that do not need the server: forges, host-side git, the
//! runner queue, failure reasons, pull request bodies and their configuration.
//!
//! The server (`cella-server/src/tasks/`) composes these with sandboxes, billing and the gateway:
//! a run is queued ([`queue`]), gets a runner slot, resolves its repository on a [`forge`],
//! clones the base branch on the host with [`git::HostGit`] (shallow, bare, never checked out on
//! the host; or links a base commit an earlier run kept, [`cache`]), shows the sandbox its
//! objects read-only ([`git::HostGit::share`]), which the sandbox borrows and checks out itself
//! ([`git::sandbox_prepare`]), and at the end takes the
//! branch back as a bundle ([`git::sandbox_collect`]) that [`git::HostGit::receive_bundle`]
//! verifies before [`git::HostGit::push`] pushes it. [`body`] writes the draft pull request,
//! [`failure`] the one-line reasons.

pub mod body;
pub mod cache;
pub mod config;
pub mod failure;
pub mod forge;
pub mod git;
pub mod queue;

pub use cache::CheckoutCache;
pub use config::CacheScope;
pub use config::{AgentConfig, AgentKind, ForgeConfig, ForgeKind, TasksConfig};
pub use failure::FailureKind;
pub use forge::{Access, Forge, ForgeError, RepoRef};
pub use git::{Checkout, GitError, HostGit};
