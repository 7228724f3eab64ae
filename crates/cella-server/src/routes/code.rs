//! The code interpreter: persistent Python and JavaScript contexts (the agent's `kernel.rs`).
//!
//! The handler checks the scope, then the body or query: `code_language` gives the language's
//! canonical name (`python`, `javascript`) or a 400 `UNKNOWN_LANGUAGE`; a cell's timeout defaults
//! to, and is capped at, `MAX_CELL_TIMEOUT_SEC`. The sandbox must be running (409, never waking
//! it); `call` builds the exec spec of a plain exec (user, home, environment, the template's
//! defaults) and sends one `Request::Code`, whose spec is used only if the kernel has to start.
//! The answer becomes a `CodeResult` (`error` and `outputs` left out when empty, `restarted` only
//! when true).

use crate::auth::Auth;
use crate::error::{ApiError, Internal};
use crate::extract::{ApiBody, QueryPairs};
use crate::service::{runnable, AgentOp, Runnable, SandboxError};
use crate::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use cella_agent::proto::{CodeOp, Request, Response as AgentResponse};
use cella_types::{
    code_language, CodeContext, CodeContextChange, CodeResult, CodeRunRequest, CodeState, Data,
    ErrorCode, ExecRequest, KernelInfo, List,
};
use serde_json::Value;
use std::sync::Arc;

/// A cell's timeout: the default and the cap, in seconds.
pub const MAX_CELL_TIMEOUT_SEC: f64 = 300.0;

fn language(given: Option<&str>) -> Result<&'static str, ApiError> {
    code_language(given).ok_or_else(|| {
        ApiError::new(
            ErrorCode::UnknownLanguage,
            format!(
                "unknown language {:?}: use python or javascript",
                given.unwrap_or_default()
            ),
        )
        .with_details(serde_json::json!({ "field": "language" }))
    })
}

fn context_name(given: Option<&str>) -> Result<String, ApiError> {
    let name = given.unwrap_or("default");
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
    if !ok {
        return Err(ApiError::invalid(
            "context",
            "context names are 1-64 letters, digits, '_', '.' or '-'",
        ));
    }
    Ok(name.to_string())
}

fn language_query(q: &QueryPairs) -> Result<&'static str, ApiError> {
    if let Some((k, _)) = q.0.iter().find(|(k, _)| k != "language") {
        return Err(ApiError::invalid(k, format!("unknown query parameter {k}")));
    }
    let given =
        q.0.iter()
            .find(|(k, _)| k == "language")
            .map(|(_, v)| v.as_str());
    language(given)
}

/// Sends one interpreter operation to the sandbox's agent.
async fn call(state: &AppState, sb: &Runnable, lang: &str, op: CodeOp) -> Result<Value, ApiError> {
    // The kernel starts, if it must, as the sandbox's user with the sandbox's environment.
    let spec = sb.spec(
        ExecRequest {
            argv: Some(vec!["kernel".into()]),
            ..Default::default()
        },
        None,
    )?;
    let req = Request::Code {
        language: lang.to_string(),
        action: op,
        spec,
    };
    let answer = match sb.agent(state).call(&req).await {
        Ok(a) => a,
        // A cell cut by a pause, a stop or a destroy answers as one asked after it.
        Err(e) => {
            return Err(
                crate::sandboxes::agent_failure(state, &sb.row.id, AgentOp::Code, e)
                    .await
                    .into(),
            )
        }
    };
    match answer {
        AgentResponse::Code { answer } => Ok(answer),
        _ => Err(SandboxError::UnexpectedAnswer("a code operation").into()),
    }
}

fn result(lang: &str, a: Value) -> CodeResult {
    let text = |k: &str| a[k].as_str().unwrap_or_default().to_string();
    CodeResult {
        ok: a["ok"].as_bool().unwrap_or(false),
        stdout: text("stdout"),
        stderr: text("stderr"),
        result: a["result"].as_str().map(String::from),
        language: lang.to_string(),
        error: serde_json::from_value(a["error"].clone()).ok(),
        outputs: serde_json::from_value(a["outputs"].clone()).unwrap_or_default(),
        restarted: a["restarted"].as_bool().unwrap_or(false),
    }
}

/// Run one cell in a persistent context. Scope `sandboxes:exec`.
#[utoipa::path(post, path = "/api/v1/sandboxes/{id}/code/run", tag = "code",
    params(("id" = String, Path)), request_body = CodeRunRequest,
    responses((status = 200, body = Data<CodeResult>), (status = 400, body = cella_types::ErrorBody),
              (status = 409, body = cella_types::ErrorBody)))]
pub async fn run(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    body: ApiBody,
) -> Result<Json<Data<CodeResult>>, ApiError> {
    let req: CodeRunRequest = body.json()?;
    let lang = language(req.language.as_deref())?;
    let context = context_name(req.context.as_deref())?;
    let timeout = match req.timeout {
        None => MAX_CELL_TIMEOUT_SEC,
        Some(t) if t.is_finite() && t > 0.0 => t.min(MAX_CELL_TIMEOUT_SEC),
        Some(_) => {
            return Err(ApiError::invalid(
                "timeout",
                "timeout must be a positive number of seconds",
            ))
        }
    };
    let sb = runnable(&state, &auth, &id).await?;
    let op = CodeOp::Run {
        context,
        code: req.code,
        timeout_ms: (timeout * 1000.0) as u64,
    };
    let answer = call(&state, &sb, lang, op).await?;
    state.activity.touch(&id);
    Ok(Json(Data {
        data: result(lang, answer),
    }))
}

/// `POST .../code`: the same as `POST .../code/run`. Scope `sandboxes:exec`.
#[utoipa::path(post, path = "/api/v1/sandboxes/{id}/code", tag = "code", operation_id = "run_alias",
    params(("id" = String, Path)), request_body = CodeRunRequest,
    responses((status = 200, body = Data<CodeResult>), (status = 400, body = cella_types::ErrorBody),
              (status = 409, body = cella_types::ErrorBody)))]
pub async fn run_alias(
    state: State<Arc<AppState>>,
    auth: Auth,
    id: Path<String>,
    body: ApiBody,
) -> Result<Json<Data<CodeResult>>, ApiError> {
    run(state, auth, id, body).await
}

/// The interpreter's state: which kernels run, their contexts, busy or idle. Never starts a
/// kernel. Scope `sandboxes:read`.
#[utoipa::path(get, path = "/api/v1/sandboxes/{id}/code", tag = "code",
    params(("id" = String, Path)),
    responses((status = 200, body = Data<CodeState>), (status = 409, body = cella_types::ErrorBody)))]
pub async fn state_of(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Data<CodeState>>, ApiError> {
    let sb = runnable(&state, &auth, &id).await?;
    let answer = call(&state, &sb, "python", CodeOp::State).await?;
    let kernels: Vec<KernelInfo> = serde_json::from_value(answer["kernels"].clone())
        .map_err(Internal::json("the code interpreter's kernels"))?;
    Ok(Json(Data {
        data: CodeState { kernels },
    }))
}

/// The contexts that exist for a language (`language`, default python). Scope `sandboxes:read`.
#[utoipa::path(get, path = "/api/v1/sandboxes/{id}/code/contexts", tag = "code",
    params(("id" = String, Path), ("language" = Option<String>, Query)),
    responses((status = 200, body = List<CodeContext>), (status = 409, body = cella_types::ErrorBody)))]
pub async fn contexts(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    q: QueryPairs,
) -> Result<Json<List<CodeContext>>, ApiError> {
    let lang = language_query(&q)?;
    let sb = runnable(&state, &auth, &id).await?;
    let answer = call(&state, &sb, lang, CodeOp::State).await?;
    let kernels: Vec<KernelInfo> = serde_json::from_value(answer["kernels"].clone())
        .map_err(Internal::json("the code interpreter's kernels"))?;
    let data = kernels
        .into_iter()
        .filter(|k| k.language == lang)
        .flat_map(|k| k.contexts)
        .map(|name| CodeContext {
            name,
            language: lang.to_string(),
        })
        .collect();
    Ok(Json(List {
        data,
        next_cursor: None,
    }))
}

/// Create a context, or reuse the one of that name. 201 when made, 200 when it existed.
/// Scope `sandboxes:exec`.
#[utoipa::path(post, path = "/api/v1/sandboxes/{id}/code/contexts", tag = "code",
    params(("id" = String, Path)), request_body = cella_types::CreateCodeContext,
    responses((status = 201, body = Data<CodeContextChange>), (status = 200, body = Data<CodeContextChange>),
              (status = 400, body = cella_types::ErrorBody), (status = 409, body = cella_types::ErrorBody)))]
pub async fn create_context(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    body: ApiBody,
) -> Result<(StatusCode, Json<Data<CodeContextChange>>), ApiError> {
    let req: cella_types::CreateCodeContext = body.json()?;
    let lang = language(req.language.as_deref())?;
    let name = context_name(req.context.as_deref())?;
    let sb = runnable(&state, &auth, &id).await?;
    let answer = call(
        &state,
        &sb,
        lang,
        CodeOp::Create {
            context: name.clone(),
        },
    )
    .await?;
    if answer["ok"] != Value::Bool(true) {
        return Err(Internal::Broken(format!(
            "code context create in sandbox {id} answered {answer}"
        ))
        .into());
    }
    let created = answer["created"].as_bool().unwrap_or(false);
    Ok((
        if created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        },
        Json(Data {
            data: CodeContextChange {
                name,
                language: lang.to_string(),
                changed: created,
            },
        }),
    ))
}

/// Reset one context: its variables, imports and definitions are forgotten. Scope `sandboxes:exec`.
#[utoipa::path(delete, path = "/api/v1/sandboxes/{id}/code/contexts/{context}", tag = "code",
    params(("id" = String, Path), ("context" = String, Path), ("language" = Option<String>, Query)),
    responses((status = 200, body = Data<CodeContextChange>), (status = 409, body = cella_types::ErrorBody)))]
pub async fn reset_context(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path((id, context)): Path<(String, String)>,
    q: QueryPairs,
) -> Result<Json<Data<CodeContextChange>>, ApiError> {
    let lang = language_query(&q)?;
    let name = context_name(Some(&context))?;
    let sb = runnable(&state, &auth, &id).await?;
    let answer = call(
        &state,
        &sb,
        lang,
        CodeOp::Reset {
            context: name.clone(),
        },
    )
    .await?;
    Ok(Json(Data {
        data: CodeContextChange {
            name,
            language: lang.to_string(),
            changed: answer["existed"].as_bool().unwrap_or(false),
        },
    }))
}

/// Reset every context of a language (`language`, default python): its kernel ends and starts
/// afresh on the next cell. Scope `sandboxes:exec`.
#[utoipa::path(delete, path = "/api/v1/sandboxes/{id}/code", tag = "code",
    params(("id" = String, Path), ("language" = Option<String>, Query)),
    responses((status = 200, body = Data<CodeState>), (status = 409, body = cella_types::ErrorBody)))]
pub async fn reset_all(
    State(state): State<Arc<AppState>>,
    auth: Auth,
    Path(id): Path<String>,
    q: QueryPairs,
) -> Result<Json<Data<CodeState>>, ApiError> {
    let lang = language_query(&q)?;
    let sb = runnable(&state, &auth, &id).await?;
    call(&state, &sb, lang, CodeOp::ResetAll).await?;
    let answer = call(&state, &sb, lang, CodeOp::State).await?;
    let kernels: Vec<KernelInfo> = serde_json::from_value(answer["kernels"].clone())
        .map_err(Internal::json("the code interpreter's kernels"))?;
    Ok(Json(Data {
        data: CodeState { kernels },
    }))
}
