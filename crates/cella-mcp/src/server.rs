//! The MCP server handler: tools (filtered by the key's scopes) and a sandbox's files as
//! resources (`cella://sandboxes/{id}/files/{path}`), over any transport rmcp runs it on.

use crate::api::{Api, ApiRequest};
use crate::tools::{self, enc, Call, ToolFail};
use axum::http::{HeaderValue, Method};
use base64::Engine;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ResourceTemplate, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{json, Value};
use std::sync::Arc;

/// The caller as the HTTP guard found it (a request extension; `crate::http`).
#[derive(Clone, Debug)]
pub struct Caller {
    pub key_id: String,
    pub scopes: Vec<String>,
}

/// The resource URI template of a sandbox's files.
pub const FILE_TEMPLATE: &str = "cella://sandboxes/{sandbox_id}/files/{+path}";
/// The most of a file a resource read returns (larger files: use `file_read` with a range, or
/// `exec`).
pub const RESOURCE_READ_CAP: usize = 8 * 1024 * 1024;

#[derive(Clone)]
pub struct CellaMcp {
    api: Arc<dyn Api>,
}

impl CellaMcp {
    pub fn new(api: Arc<dyn Api>) -> Self {
        CellaMcp { api }
    }

    fn parts(ctx: &RequestContext<RoleServer>) -> Option<&axum::http::request::Parts> {
        ctx.extensions.get::<axum::http::request::Parts>()
    }

    fn call<'a>(&'a self, ctx: &RequestContext<RoleServer>) -> Call<'a> {
        let parts = Self::parts(ctx);
        let progress = ctx.meta.get_progress_token().map(|t| (ctx.peer.clone(), t));
        Call {
            api: self.api.as_ref(),
            authorization: parts
                .and_then(|p| p.headers.get(axum::http::header::AUTHORIZATION).cloned()),
            extensions: parts.map(|p| {
                let mut e = p.extensions.clone();
                // What the API's own routing sets afresh.
                e.remove::<Caller>();
                e.remove::<axum::extract::MatchedPath>();
                e.remove::<axum::extract::OriginalUri>();
                e
            }),
            progress,
        }
    }

    /// The scopes of the caller's key: what the HTTP guard found, else (stdio) the API's
    /// answer for the key.
    async fn scopes(&self, ctx: &RequestContext<RoleServer>) -> Result<Vec<String>, ToolFail> {
        if let Some(c) = Self::parts(ctx).and_then(|p| p.extensions.get::<Caller>()) {
            return Ok(c.scopes.clone());
        }
        let auth = Self::parts(ctx)
            .and_then(|p| p.headers.get(axum::http::header::AUTHORIZATION).cloned());
        Ok(whoami(self.api.as_ref(), auth, None).await?.scopes)
    }
}

/// The key's id and scopes (`GET /api/v1/api-keys/current`); an error answer is the failure.
pub async fn whoami(
    api: &dyn Api,
    authorization: Option<HeaderValue>,
    extensions: Option<axum::http::Extensions>,
) -> Result<Caller, ToolFail> {
    let mut r = ApiRequest::new(Method::GET, "/api/v1/api-keys/current");
    r.authorization = authorization;
    r.extensions = extensions;
    let res = api.send(r).await?;
    if !res.status.is_success() {
        return Err(tools::api_failure(res).await);
    }
    let v = res.json().await?;
    let d = &v["data"];
    Ok(Caller {
        key_id: d["id"].as_str().unwrap_or_default().to_string(),
        scopes: d["scopes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(String::from))
            .collect(),
    })
}

fn tool_error(f: ToolFail) -> CallToolResult {
    let mut r = CallToolResult::error(vec![ContentBlock::text(f.text)]);
    r.structured_content = f.structured;
    r
}

/// `cella://sandboxes/{id}/files/{path}` -> (id, absolute path).
pub fn parse_file_uri(uri: &str) -> Option<(String, String)> {
    let rest = uri.strip_prefix("cella://sandboxes/")?;
    let (id, path) = rest.split_once("/files")?;
    if id.is_empty()
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return None;
    }
    if !(path.is_empty() || path.starts_with('/')) {
        return None;
    }
    let path = percent_decode(path)?;
    let path = if path.is_empty() {
        "/".to_string()
    } else {
        path
    };
    Some((id.to_string(), path))
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The resource URI of a file (each path segment percent-encoded).
pub fn file_uri(id: &str, path: &str) -> String {
    let segs: Vec<String> = path.trim_start_matches('/').split('/').map(enc).collect();
    format!("cella://sandboxes/{id}/files/{}", segs.join("/"))
}

fn guess_mime(path: &str) -> &'static str {
    let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    match ext.as_deref() {
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("gif") => "image/gif",
        Some("svg") => "image/svg+xml",
        Some("json") => "application/json",
        Some("html" | "htm") => "text/html",
        Some("md") => "text/markdown",
        Some("csv") => "text/csv",
        Some("pdf") => "application/pdf",
        Some("py" | "js" | "ts" | "rs" | "sh" | "txt" | "toml" | "yaml" | "yml" | "c" | "h") => {
            "text/plain"
        }
        _ => "application/octet-stream",
    }
}

fn resource_error(f: ToolFail) -> McpError {
    if f.text.starts_with("NOT_FOUND") {
        McpError::resource_not_found(f.text, None)
    } else {
        McpError::invalid_params(f.text, None)
    }
}

impl ServerHandler for CellaMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new("cella", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Cella sandboxes: create one with sandbox_create, run commands with exec, move files \
             with file_write/file_read/file_list, run Python or JavaScript cells with run_code, \
             and destroy it with sandbox_destroy when done. A sandbox's files are also resources \
             at cella://sandboxes/{id}/files/{path}.",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let scopes = self
            .scopes(&ctx)
            .await
            .map_err(|f| McpError::internal_error(f.text, None))?;
        Ok(ListToolsResult::with_all_items(
            tools::all()
                .iter()
                .filter(|t| t.allowed(&scopes))
                .map(|t| t.to_tool())
                .collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        let Some(def) = tools::find(&name) else {
            return Ok(tool_error(ToolFail::msg(format!(
                "unknown tool {name:?}; tools/list names the tools this key may use"
            )))
            .into());
        };
        let scopes = match self.scopes(&ctx).await {
            Ok(s) => s,
            Err(f) => return Ok(tool_error(f).into()),
        };
        if !def.allowed(&scopes) {
            return Ok(tool_error(ToolFail {
                text: format!(
                    "FORBIDDEN: this API key lacks the scope {} that {name} needs",
                    def.scope
                ),
                structured: Some(json!({"status": 403, "error": {
                    "code": "FORBIDDEN",
                    "message": format!("this API key lacks the scope {}", def.scope),
                    "details": {"scope": def.scope}
                }})),
            })
            .into());
        }
        let call = self.call(&ctx);
        let r = tools::run(&call, &ctx, &name, request.arguments).await;
        Ok(match r {
            Ok(r) => r,
            Err(f) => tool_error(f),
        }
        .into())
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            ResourceTemplate::new(FILE_TEMPLATE, "sandbox-file")
                .with_title("A file or directory in a sandbox")
                .with_description(
                    "A file inside a running sandbox, by absolute path (a directory reads as \
                     its listing in JSON).",
                ),
        ]))
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let call = self.call(&ctx);
        let mut r = ApiRequest::new(Method::GET, "/api/v1/sandboxes?state=running&limit=20");
        r.authorization = call.authorization.clone();
        r.extensions = call.extensions.clone();
        let res = self
            .api
            .send(r)
            .await
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        if !res.status.is_success() {
            return Err(McpError::invalid_params(
                tools::api_failure(res).await.text,
                None,
            ));
        }
        let v = res
            .json()
            .await
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        let mut out = Vec::new();
        for sb in v["data"].as_array().into_iter().flatten() {
            let Some(id) = sb["id"].as_str() else {
                continue;
            };
            let mut r = ApiRequest::new(
                Method::GET,
                format!(
                    "/api/v1/sandboxes/{id}/files/list?path={}",
                    enc("/home/user")
                ),
            );
            r.authorization = call.authorization.clone();
            r.extensions = call.extensions.clone();
            let Ok(res) = self.api.send(r).await else {
                continue;
            };
            if !res.status.is_success() {
                continue;
            }
            let Ok(l) = res.json().await else { continue };
            for e in l["data"].as_array().into_iter().flatten() {
                if e["type"] != "file" || out.len() >= 500 {
                    continue;
                }
                let path = e["path"].as_str().unwrap_or_default();
                let mut res = Resource::new(file_uri(id, path), e["name"].as_str().unwrap_or(path))
                    .with_mime_type(guess_mime(path))
                    .with_description(format!("{path} in sandbox {id}"));
                if let Some(n) = e["size"].as_u64() {
                    res = res.with_size(n);
                }
                out.push(res);
            }
        }
        Ok(ListResourcesResult::with_all_items(out))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let uri = request.uri;
        let (id, path) = parse_file_uri(&uri).ok_or_else(|| {
            McpError::invalid_params(
                format!("not a Cella resource URI (expected {FILE_TEMPLATE}): {uri}"),
                None,
            )
        })?;
        let call = self.call(&ctx);
        let req = |p: String| {
            let mut r = ApiRequest::new(Method::GET, p);
            r.authorization = call.authorization.clone();
            r.extensions = call.extensions.clone();
            r
        };
        let send = |r: ApiRequest| async {
            let res = self
                .api
                .send(r)
                .await
                .map_err(|e| McpError::internal_error(e.to_string(), None))?;
            if !res.status.is_success() {
                return Err(resource_error(tools::api_failure(res).await));
            }
            Ok(res)
        };
        let stat = send(req(format!(
            "/api/v1/sandboxes/{id}/files/stat?path={}",
            enc(&path)
        )))
        .await?
        .json()
        .await
        .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        let contents = if stat["data"]["type"] == "dir" {
            let l = send(req(format!(
                "/api/v1/sandboxes/{id}/files/list?path={}",
                enc(&path)
            )))
            .await?
            .json()
            .await
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
            let entries: Vec<Value> = l["data"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| {
                    json!({"name": e["name"], "path": e["path"], "type": e["type"], "size": e["size"],
                           "uri": file_uri(&id, e["path"].as_str().unwrap_or_default())})
                })
                .collect();
            ResourceContents::TextResourceContents {
                uri: uri.clone(),
                mime_type: Some("application/json".into()),
                text: serde_json::to_string_pretty(&entries).unwrap_or_default(),
                meta: None,
            }
        } else {
            let (bytes, cut) = send(req(format!(
                "/api/v1/sandboxes/{id}/files?path={}",
                enc(&path)
            )))
            .await?
            .bytes_capped(RESOURCE_READ_CAP)
            .await
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
            if cut {
                return Err(McpError::invalid_params(
                    format!(
                        "{path} is larger than {RESOURCE_READ_CAP} bytes; read it in parts with file_read or exec"
                    ),
                    None,
                ));
            }
            let mime = guess_mime(&path);
            match String::from_utf8(bytes) {
                Ok(text) if !mime.starts_with("image/") || mime == "image/svg+xml" => {
                    ResourceContents::TextResourceContents {
                        uri: uri.clone(),
                        mime_type: Some(if mime == "application/octet-stream" {
                            "text/plain".into()
                        } else {
                            mime.into()
                        }),
                        text,
                        meta: None,
                    }
                }
                r => {
                    let b = match r {
                        Ok(s) => s.into_bytes(),
                        Err(e) => e.into_bytes(),
                    };
                    ResourceContents::BlobResourceContents {
                        uri: uri.clone(),
                        mime_type: Some(mime.into()),
                        blob: base64::engine::general_purpose::STANDARD.encode(b),
                        meta: None,
                    }
                }
            }
        };
        Ok(ReadResourceResult::new(vec![contents]).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_uris_round_trip() {
        let u = file_uri("sbx1", "/home/user/a b.txt");
        assert_eq!(u, "cella://sandboxes/sbx1/files/home/user/a%20b.txt");
        assert_eq!(
            parse_file_uri(&u),
            Some(("sbx1".into(), "/home/user/a b.txt".into()))
        );
        assert_eq!(
            parse_file_uri("cella://sandboxes/sbx1/files"),
            Some(("sbx1".into(), "/".into()))
        );
        assert_eq!(parse_file_uri("cella://sandboxes/../files/x"), None);
        assert_eq!(parse_file_uri("cella://sandboxes/sbx1/filesx"), None);
        assert_eq!(parse_file_uri("file:///etc/passwd"), None);
        assert_eq!(parse_file_uri("cella://sandboxes/sbx1/files/%zz"), None);
    }
}
