//! The in-sandbox agent.
//!
//! Every sandbox's PID 1 is this agent. It reaps orphans like an init, and serves requests from
//! the node (exec, background processes, terminals and files) over a Unix socket whose path lies
//! outside the sandbox's root, so nothing inside the sandbox can reach it. The node side of the
//! protocol is [`client::AgentClient`].
//!
//! Why an agent instead of the node joining the sandbox's namespaces per call: a request is then
//! one connect and one fork inside the sandbox (no `setns` dance and no helper process per call),
//! the same protocol works over vsock for a microVM driver, and long-lived work (background
//! processes, terminals) has an owner that outlives a server restart.

pub mod client;
mod exec;
pub mod execcg;
mod fds;
mod files;
pub mod harden;
pub mod kernel;
mod oom;
mod procs;
pub mod proto;
mod pty;
mod server;
mod spawn;
mod standby;
mod vspawn;
mod watch;

pub use server::{serve, AgentConfig, Rebind};
