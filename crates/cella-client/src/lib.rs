//! Rust client for the Cella HTTP API. The `cella` CLI is built on it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), cella_client::Error> {
//! let client = cella_client::Client::from_env()?;
//! let sb = client.create_sandbox(&Default::default()).await?;
//! let out = client.exec(&sb.id, &cella_client::types::ExecRequest {
//!     command: Some("echo hello".into()), ..Default::default() }).await?;
//! assert_eq!(out.stdout, "hello\n");
//! client.destroy_sandbox(&sb.id).await?;
//! # Ok(()) }
//! ```

pub use cella_types as types;
use cella_types::*;
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Serialize;

pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7070";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with the error envelope.
    #[error("{code}: {message} (HTTP {status}, request id {request_id})")]
    Api {
        status: u16,
        code: String,
        message: String,
        details: Option<serde_json::Value>,
        request_id: String,
    },
    #[error("cannot reach the Cella server at {server}: {source}")]
    Connect {
        server: String,
        source: reqwest::Error,
    },
    #[error("unexpected answer from the server: {0}")]
    Decode(String),
    #[error("no API key: set CELLA_API_KEY or pass one")]
    NoKey,
}

#[derive(Clone)]
pub struct Client {
    base: String,
    key: Option<String>,
    http: reqwest::Client,
}

impl Client {
    pub fn new(server: &str, api_key: Option<String>) -> Client {
        Client {
            base: server.trim_end_matches('/').to_string(),
            key: api_key,
            http: reqwest::Client::new(),
        }
    }

    /// Server from `CELLA_SERVER` (default `http://127.0.0.1:7070`), key from `CELLA_API_KEY`.
    pub fn from_env() -> Result<Client, Error> {
        let server = std::env::var("CELLA_SERVER").unwrap_or_else(|_| DEFAULT_SERVER.into());
        let key = std::env::var("CELLA_API_KEY")
            .ok()
            .filter(|k| !k.is_empty())
            .ok_or(Error::NoKey)?;
        Ok(Client::new(&server, Some(key)))
    }

    pub fn server(&self) -> &str {
        &self.base
    }

    async fn call<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(String, String)],
        body: Option<&B>,
    ) -> Result<T, Error> {
        let mut req = self
            .http
            .request(method, format!("{}{}", self.base, path))
            .query(query);
        if let Some(k) = &self.key {
            req = req.bearer_auth(k);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let res = req.send().await.map_err(|source| Error::Connect {
            server: self.base.clone(),
            source,
        })?;
        let status = res.status().as_u16();
        let request_id = res
            .headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let bytes = res
            .bytes()
            .await
            .map_err(|e| Error::Decode(e.to_string()))?;
        if status >= 400 {
            return Err(match serde_json::from_slice::<ErrorBody>(&bytes) {
                Ok(e) => Error::Api {
                    status,
                    code: e.error.code,
                    message: e.error.message,
                    details: e.error.details,
                    request_id,
                },
                Err(_) => Error::Decode(format!(
                    "HTTP {status}: {}",
                    String::from_utf8_lossy(&bytes)
                )),
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| Error::Decode(e.to_string()))
    }

    async fn data<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, Error> {
        Ok(self.call::<B, Data<T>>(method, path, &[], body).await?.data)
    }

    pub async fn health(&self) -> Result<Health, Error> {
        self.call::<(), Health>(Method::GET, "/healthz", &[], None)
            .await
    }

    pub async fn templates(&self) -> Result<TemplateCatalog, Error> {
        self.call::<(), _>(Method::GET, "/api/v1/templates", &[], None)
            .await
    }

    pub async fn create_sandbox(&self, req: &CreateSandbox) -> Result<Sandbox, Error> {
        self.data(Method::POST, "/api/v1/sandboxes", Some(req))
            .await
    }

    /// One page of sandboxes; `query` takes `state`, `metadata.<key>`, `limit` and `cursor`.
    pub async fn list_sandboxes(&self, query: &[(String, String)]) -> Result<List<Sandbox>, Error> {
        self.call::<(), _>(Method::GET, "/api/v1/sandboxes", query, None)
            .await
    }

    pub async fn get_sandbox(&self, id: &str) -> Result<Sandbox, Error> {
        self.data::<(), _>(Method::GET, &format!("/api/v1/sandboxes/{id}"), None)
            .await
    }

    pub async fn destroy_sandbox(&self, id: &str) -> Result<Sandbox, Error> {
        self.data::<(), _>(Method::DELETE, &format!("/api/v1/sandboxes/{id}"), None)
            .await
    }

    pub async fn exec(&self, id: &str, req: &ExecRequest) -> Result<ExecResult, Error> {
        self.data(
            Method::POST,
            &format!("/api/v1/sandboxes/{id}/exec"),
            Some(req),
        )
        .await
    }

    pub async fn create_workspace(&self, req: &CreateWorkspace) -> Result<Workspace, Error> {
        self.data(Method::POST, "/api/v1/workspaces", Some(req))
            .await
    }

    pub async fn create_api_key(&self, req: &CreateApiKey) -> Result<ApiKey, Error> {
        self.data(Method::POST, "/api/v1/api-keys", Some(req)).await
    }
}
