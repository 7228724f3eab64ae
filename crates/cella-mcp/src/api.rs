//! How the tools reach Cella: its public HTTP API, through [`Api`].
//!
//! Two implementations. [`RouterApi`] (the server's `/mcp`) sends each request through the
//! API's own axum router in process, with the MCP caller's `Authorization` header, so
//! authentication, scopes, rate limits and validation are exactly the API's. [`HttpApi`]
//! (`cella mcp --stdio`) sends it over HTTP to a server URL with one API key.

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, Method, Request, StatusCode};
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use std::future::Future;
use std::pin::Pin;

/// Why a request reached no answer (an answer with an error status is not an error here).
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("the Cella server could not be reached: {0}")]
    Unreachable(String),
    #[error("the Cella server's answer was cut off: {0}")]
    Body(String),
    #[error("the Cella server's answer was not the JSON expected: {0}")]
    Json(String),
}

/// One request to the API.
pub struct ApiRequest {
    pub method: Method,
    /// Path and query, e.g. `/api/v1/sandboxes?limit=10`.
    pub path: String,
    /// The caller's `Authorization` header (the MCP request's); None: the [`Api`]'s own key.
    pub authorization: Option<HeaderValue>,
    pub content_type: Option<&'static str>,
    pub body: Bytes,
    /// Extensions of the MCP request (the client's address), passed to the in-process API.
    pub extensions: Option<axum::http::Extensions>,
}

impl ApiRequest {
    pub fn new(method: Method, path: impl Into<String>) -> Self {
        ApiRequest {
            method,
            path: path.into(),
            authorization: None,
            content_type: None,
            body: Bytes::new(),
            extensions: None,
        }
    }

    pub fn json(mut self, v: &serde_json::Value) -> Self {
        self.content_type = Some("application/json");
        self.body = Bytes::from(v.to_string());
        self
    }

    pub fn raw(mut self, body: Vec<u8>) -> Self {
        self.content_type = Some("application/octet-stream");
        self.body = Bytes::from(body);
        self
    }
}

/// An answer: its status, headers and body as a stream (dropping it hangs up, which stops a
/// streamed command).
pub struct ApiResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: BoxStream<'static, Result<Bytes, ApiError>>,
}

impl ApiResponse {
    /// The whole body, at most `cap` bytes (and whether more was there).
    pub async fn bytes_capped(mut self, cap: usize) -> Result<(Vec<u8>, bool), ApiError> {
        let mut out = Vec::new();
        while let Some(chunk) = self.body.next().await {
            let chunk = chunk?;
            if out.len() + chunk.len() > cap {
                out.extend_from_slice(&chunk[..cap - out.len()]);
                return Ok((out, true));
            }
            out.extend_from_slice(&chunk);
        }
        Ok((out, false))
    }

    /// The body as JSON (bodies of JSON answers are small: the API caps what it sends).
    pub async fn json(self) -> Result<serde_json::Value, ApiError> {
        let (b, _) = self.bytes_capped(64 * 1024 * 1024).await?;
        if b.is_empty() {
            return Ok(serde_json::Value::Null);
        }
        serde_json::from_slice(&b).map_err(|e| ApiError::Json(e.to_string()))
    }
}

pub type ApiFuture<'a> = Pin<Box<dyn Future<Output = Result<ApiResponse, ApiError>> + Send + 'a>>;

/// Cella's public API, as the tools call it.
pub trait Api: Send + Sync + 'static {
    fn send(&self, req: ApiRequest) -> ApiFuture<'_>;
}

/// The API's own router, called in process (the server's `/mcp`).
#[derive(Clone)]
pub struct RouterApi {
    router: axum::Router,
}

impl RouterApi {
    pub fn new(router: axum::Router) -> Self {
        RouterApi { router }
    }
}

impl Api for RouterApi {
    fn send(&self, req: ApiRequest) -> ApiFuture<'_> {
        use tower::ServiceExt;
        let router = self.router.clone();
        Box::pin(async move {
            let mut b = Request::builder().method(req.method).uri(req.path);
            if let Some(a) = req.authorization {
                b = b.header(header::AUTHORIZATION, a);
            }
            if let Some(ct) = req.content_type {
                b = b.header(header::CONTENT_TYPE, ct);
            }
            let mut request = b
                .body(Body::from(req.body))
                .map_err(|e| ApiError::Unreachable(e.to_string()))?;
            if let Some(ext) = req.extensions {
                request.extensions_mut().extend(ext);
            }
            let res = router
                .oneshot(request)
                .await
                .map_err(|e| ApiError::Unreachable(e.to_string()))?;
            let (parts, body) = res.into_parts();
            Ok(ApiResponse {
                status: parts.status,
                headers: parts.headers,
                body: body
                    .into_data_stream()
                    .map_err(|e| ApiError::Body(e.to_string()))
                    .boxed(),
            })
        })
    }
}

/// A Cella server over HTTP with one API key (`cella mcp --stdio`).
pub struct HttpApi {
    base: String,
    key: Option<String>,
    http: reqwest::Client,
}

impl HttpApi {
    pub fn new(base: &str, key: Option<String>) -> Self {
        HttpApi {
            base: base.trim_end_matches('/').to_string(),
            key,
            http: reqwest::Client::builder()
                .connect_timeout(std::time::Duration::from_secs(10))
                .build()
                .unwrap_or_default(),
        }
    }
}

impl Api for HttpApi {
    fn send(&self, req: ApiRequest) -> ApiFuture<'_> {
        Box::pin(async move {
            let url = format!("{}{}", self.base, req.path);
            let method = reqwest::Method::from_bytes(req.method.as_str().as_bytes())
                .map_err(|e| ApiError::Unreachable(e.to_string()))?;
            let mut b = self.http.request(method, url);
            if let Some(a) = req.authorization {
                b = b.header(reqwest::header::AUTHORIZATION, a.as_bytes());
            } else if let Some(k) = &self.key {
                b = b.bearer_auth(k);
            }
            if let Some(ct) = req.content_type {
                b = b.header(reqwest::header::CONTENT_TYPE, ct);
            }
            if !req.body.is_empty() || req.content_type.is_some() {
                b = b.body(req.body.to_vec());
            }
            let res = b
                .send()
                .await
                .map_err(|e| ApiError::Unreachable(e.without_url().to_string()))?;
            let status =
                StatusCode::from_u16(res.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
            let mut headers = HeaderMap::new();
            for (k, v) in res.headers() {
                if let (Ok(k), Ok(v)) = (
                    header::HeaderName::from_bytes(k.as_str().as_bytes()),
                    HeaderValue::from_bytes(v.as_bytes()),
                ) {
                    headers.append(k, v);
                }
            }
            Ok(ApiResponse {
                status,
                headers,
                body: res
                    .bytes_stream()
                    .map_err(|e| ApiError::Body(e.without_url().to_string()))
                    .boxed(),
            })
        })
    }
}
