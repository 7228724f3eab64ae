//! The API's error envelope ([`ApiError`]), and [`Internal`]: a failure of the server itself,
//! with its cause, which becomes a generic 500 `INTERNAL` (the cause logged there, once, never
//! sent to the client). A leaf: the services' errors map to the envelope in `service::error`.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use cella_types::{ErrorBody, ErrorCode, ErrorInfo};
use serde_json::{json, Value};

/// Marks a response whose body already is the error envelope.
#[derive(Clone, Copy)]
pub struct Enveloped;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub details: Option<Value>,
    pub retry_after: Option<u64>,
    /// `Content-Range` of a 416 answer (`bytes */SIZE`).
    pub content_range: Option<String>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            details: None,
            retry_after: None,
            content_range: None,
        }
    }
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }
    pub fn not_found(what: &str) -> Self {
        ApiError::new(ErrorCode::NotFound, format!("{what} not found"))
    }
    /// 400 `INVALID_REQUEST` naming the offending field.
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::InvalidRequest, message).with_details(json!({ "field": field }))
    }
    /// The generic 500 body. Prefer returning an [`Internal`] (or a service error) with the
    /// cause, which logs it and answers this.
    pub fn internal() -> Self {
        ApiError::new(
            ErrorCode::Internal,
            "internal error; the server log has the details for this request id",
        )
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::Unavailable, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = ErrorBody {
            error: ErrorInfo {
                code: self.code.as_str().to_string(),
                message: self.message,
                details: self.details,
            },
        };
        let mut res = (status, axum::Json(body)).into_response();
        if let Some(secs) = self
            .retry_after
            .or_else(|| (status == StatusCode::TOO_MANY_REQUESTS).then_some(1))
        {
            res.headers_mut()
                .insert("retry-after", HeaderValue::from(secs.max(1)));
        }
        if let Some(cr) = self
            .content_range
            .as_deref()
            .and_then(|v| HeaderValue::from_str(v).ok())
        {
            res.headers_mut().insert("content-range", cr);
        }
        res.extensions_mut().insert(Enveloped);
        res
    }
}

impl From<cella_store::StoreError> for ApiError {
    fn from(e: cella_store::StoreError) -> Self {
        tracing::error!("store: {e}");
        if e.is_full() {
            // The server's disk is full: the write did not happen; the client may retry later.
            return ApiError::new(
                ErrorCode::InsufficientStorage,
                "the server's disk is full; nothing was changed",
            );
        }
        ApiError::internal()
    }
}

/// The envelope for a bare status that some layer produced without one.
pub fn for_status(status: StatusCode) -> ApiError {
    let code = match status.as_u16() {
        401 => ErrorCode::Unauthorized,
        403 => ErrorCode::Forbidden,
        404 => ErrorCode::NotFound,
        405 => ErrorCode::MethodNotAllowed,
        408 => ErrorCode::RequestTimeout,
        413 => ErrorCode::PayloadTooLarge,
        507 => ErrorCode::InsufficientStorage,
        429 => ErrorCode::RateLimited,
        503 => ErrorCode::Unavailable,
        400..=499 => ErrorCode::InvalidRequest,
        _ => ErrorCode::Internal,
    };
    let message = match code {
        ErrorCode::NotFound => "no such route".to_string(),
        ErrorCode::MethodNotAllowed => "method not allowed on this route".to_string(),
        ErrorCode::PayloadTooLarge => "request body too large".to_string(),
        ErrorCode::Internal => "internal error".to_string(),
        _ => status.canonical_reason().unwrap_or("error").to_lowercase(),
    };
    ApiError::new(code, message)
}

/// A failure of the server itself (a host file, a task, a value it wrote), with its cause.
#[derive(Debug, thiserror::Error)]
pub enum Internal {
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Json {
        what: &'static str,
        source: serde_json::Error,
    },
    /// A task of the server's ended without its answer (it panicked or was cancelled).
    #[error("{what}: {source}")]
    Task {
        what: &'static str,
        source: tokio::task::JoinError,
    },
    /// Something the server expected to find or hold did not hold (what, and of what).
    #[error("{0}")]
    Broken(String),
}

impl Internal {
    /// A `map_err` adapter for host I/O: `.map_err(Internal::io("creating the images dir"))`.
    pub fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Internal {
        move |source| Internal::Io { what, source }
    }
    pub fn json(what: &'static str) -> impl FnOnce(serde_json::Error) -> Internal {
        move |source| Internal::Json { what, source }
    }
    pub fn task(what: &'static str) -> impl FnOnce(tokio::task::JoinError) -> Internal {
        move |source| Internal::Task { what, source }
    }
}

impl From<Internal> for ApiError {
    fn from(e: Internal) -> Self {
        tracing::error!("{e}");
        ApiError::internal()
    }
}

/// 402 `INSUFFICIENT_FUNDS`, with what was needed and what is available.
pub fn insufficient(
    needed: cella_types::Money,
    available: cella_types::Money,
    what: &str,
) -> ApiError {
    ApiError::new(
        ErrorCode::InsufficientFunds,
        format!(
            "the workspace's wallet has {available} available; {what} needs {needed} (add credits first)"
        ),
    )
    .with_details(json!({ "needed": needed, "available": available }))
}

impl From<cella_billing::BillingError> for ApiError {
    fn from(e: cella_billing::BillingError) -> Self {
        match e {
            cella_billing::BillingError::InsufficientFunds { needed, available } => {
                insufficient(needed, available, "this")
            }
            other => {
                tracing::error!("billing: {other}");
                ApiError::internal()
            }
        }
    }
}
