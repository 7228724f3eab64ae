//! The one place where failures become the API's error envelope.

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

impl From<crate::service::SandboxError> for ApiError {
    fn from(e: crate::service::SandboxError) -> Self {
        use crate::service::{AgentOp, SandboxError as E};
        use cella_agent::client::ClientError;
        use cella_agent::proto::ErrorKind as K;
        let message = e.to_string();
        match e {
            E::NotFound(what) => ApiError::not_found(what),
            E::Invalid { field, message } => ApiError::invalid(&field, message),
            E::NotRunning { state, reason, .. } => {
                ApiError::new(ErrorCode::SandboxNotRunning, message)
                    .with_details(json!({ "state": state, "reason": reason }))
            }
            E::Gone { .. } => ApiError::new(ErrorCode::SandboxNotRunning, message),
            E::Refused(r) => ApiError::new(ErrorCode::Conflict, message)
                .with_details(json!({ "state": r.state.as_str() })),
            E::NotPersistent { state } => ApiError::new(ErrorCode::Conflict, message)
                .with_details(json!({ "state": state, "persistent": false })),
            E::ConcurrencyLimit { cap, plan } => {
                let mut e = ApiError::new(ErrorCode::ConcurrencyLimit, message)
                    .with_details(json!({ "limit": cap, "plan": plan }));
                e.retry_after = Some(5);
                e
            }
            E::InsufficientFunds {
                needed,
                available,
                what,
            } => crate::billing::insufficient(needed, available, what),
            E::Billing(b) => b.into(),
            E::RestartFailed { id, reason } => ApiError::unavailable(message)
                .with_details(json!({ "sandbox_id": id, "reason": reason })),
            E::Agent {
                op,
                source: ClientError::Refused { kind, message: m },
            } => match (&op, kind) {
                (AgentOp::RunFile { path }, K::NoSpace) => {
                    // The sandbox's disk is full: 507, as an upload would answer.
                    ApiError::new(
                        ErrorCode::InsufficientStorage,
                        format!("writing {path}: {m}"),
                    )
                }
                (AgentOp::RunFile { path }, _) => {
                    ApiError::invalid("files", format!("writing {path}: {m}"))
                }
                (AgentOp::Pty, K::BadCwd) => ApiError::invalid("cwd", m),
                (AgentOp::Pty, _) => ApiError::invalid("command", m),
                (AgentOp::Code, K::Conflict) => ApiError::new(ErrorCode::Conflict, m),
                (AgentOp::Code, K::BadRequest) => ApiError::invalid("language", m),
                (AgentOp::Code, _) | (_, K::Internal) => {
                    tracing::warn!("{}: {m}", op.name());
                    ApiError::internal()
                }
                (_, K::NotFound) => ApiError::new(ErrorCode::NotFound, m),
                (_, K::Conflict) => ApiError::new(ErrorCode::Conflict, m),
                (AgentOp::Files, K::BadRequest | K::BadCwd) => ApiError::invalid("path", m),
                (AgentOp::Files, K::TooLarge) => ApiError::new(ErrorCode::PayloadTooLarge, m),
                (_, K::BadCwd) => ApiError::invalid("cwd", m),
                (_, K::BadRequest | K::TooLarge) => ApiError::invalid("command", m),
                (_, K::NoSpace) => ApiError::new(ErrorCode::InsufficientStorage, m),
                (_, K::Busy) => ApiError::new(ErrorCode::ConcurrencyLimit, m),
                (_, K::Unavailable) => ApiError::unavailable(m),
            },
            E::Agent { .. } => {
                tracing::warn!("{message}");
                ApiError::unavailable("the sandbox's agent did not answer")
            }
            E::UnexpectedAnswer(_)
            | E::NoRuntime(_)
            | E::NoWorkspace(_)
            | E::Driver { .. }
            | E::Store(_)
            | E::Io { .. } => {
                tracing::error!("{message}");
                ApiError::internal()
            }
        }
    }
}

impl From<crate::service::people::PeopleError> for ApiError {
    fn from(e: crate::service::people::PeopleError) -> Self {
        use crate::service::people::PeopleError as E;
        let message = e.to_string();
        match e {
            E::Invalid { field, message } => ApiError::invalid(field, message),
            E::EmailTaken => ApiError::new(ErrorCode::Conflict, message)
                .with_details(json!({ "field": "email" })),
            E::BadCredentials => ApiError::new(ErrorCode::Unauthorized, message),
            E::RateLimited { retry_after } => {
                let mut e = ApiError::new(ErrorCode::RateLimited, message)
                    .with_details(json!({ "group": "sign-in" }));
                e.retry_after = Some(retry_after);
                e
            }
            E::NotFound(what) => ApiError::not_found(what),
            E::LastOwner => {
                ApiError::new(ErrorCode::Conflict, message).with_details(json!({ "field": "role" }))
            }
            E::Forbidden(m) => ApiError::new(ErrorCode::Forbidden, m),
            E::KeyWorkspaceNotFound => ApiError::new(ErrorCode::NotFound, message)
                .with_details(json!({ "field": "workspace_id" })),
            E::ScopeNotHeld(s) => ApiError::new(ErrorCode::Forbidden, message)
                .with_details(json!({ "field": "scopes", "required_scope": s.as_str() })),
            E::Conflict(m) => ApiError::new(ErrorCode::Conflict, m),
            E::Hash(_) | E::Store(_) => {
                tracing::error!("{message}");
                ApiError::internal()
            }
        }
    }
}
