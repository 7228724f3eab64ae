//! Cella over the Model Context Protocol: sandboxes and task runs as MCP tools, a sandbox's
//! files as MCP resources.
//!
//! Built on `rmcp` (the official Rust SDK). The tools ([`tools`]) and resources
//! ([`server::CellaMcp`]) do all their work through Cella's public HTTP API ([`api::Api`]), so
//! what an MCP client may do is exactly what its API key may do through the API: the same
//! authentication, scopes, rate limits, validation and error codes. Two transports:
//!
//! - the server's `POST|GET|DELETE /mcp` ([`http::router`]): streamable HTTP, each request
//!   authenticated by its own Bearer key and sent through the API's router in process
//!   ([`api::RouterApi`]);
//! - `cella mcp --stdio` ([`serve_stdio`]): stdio, for clients that launch servers as
//!   subprocesses, calling a server over HTTP with one key ([`api::HttpApi`]).
//!
//! Protocol versions are negotiated and `Mcp-Session-Id` handled as rmcp does them; the HTTP
//! guard bounds sessions per key and closes idle ones.

pub mod api;
pub mod http;
pub mod server;
pub mod tools;

use std::sync::Arc;

/// Serves the tools over stdin/stdout until the client closes them.
pub async fn serve_stdio(api: Arc<dyn api::Api>) -> Result<(), String> {
    use rmcp::ServiceExt;
    let running = server::CellaMcp::new(api)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| e.to_string())?;
    running.waiting().await.map_err(|e| e.to_string())?;
    Ok(())
}
