//! One-shot runs and artifacts.
//!
//! A run is a whole sandbox life in one request: create (from the warm pool when it can),
//! write the files, run the command, collect the artifacts, destroy. It runs in a task of its
//! own and destroys its sandbox whatever happens: the command fails or times out, the client
//! hangs up (the run is then cancelled at once), or a step fails.
//!
//! Artifacts are files the server keeps after the sandbox is gone, under
//! `DATA/artifacts/<id>`, until their retention time is up (the lifecycle timer deletes them).

use crate::auth::Auth;
use crate::error::ApiError;
use crate::sandboxes::{self, exec_spec, USER_UID};
use crate::util::{new_id, now_ms, rfc3339};
use crate::AppState;
use cella_agent::client::WriteError;
use cella_store::{ArtifactRow, SandboxRow};
use cella_types::{
    Artifact, CreateSandbox, ErrorCode, ExecRequest, ExecUser, RunRequest, RunResult,
};
use std::path::PathBuf;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;

/// At most this many globs per run or collect call.
pub const MAX_GLOBS: usize = 64;

pub fn artifact_dir(state: &AppState) -> PathBuf {
    state.config.data_dir.join("artifacts")
}

pub fn wire(state: &AppState, a: &ArtifactRow) -> Artifact {
    Artifact {
        id: a.id.clone(),
        sandbox_id: a.sandbox_id.clone(),
        path: a.path.clone(),
        size: a.size.max(0) as u64,
        url: format!("{}/api/v1/artifacts/{}", state.public_base(), a.id),
        created_at: rfc3339(a.created_at),
        expires_at: rfc3339(a.expires_at),
    }
}

/// A run's file contents, decoded (before any sandbox is made, so bad input changes nothing).
fn decode_files(req: &RunRequest) -> Result<Vec<(String, Vec<u8>)>, ApiError> {
    use base64::Engine;
    let mut out = Vec::new();
    for (i, f) in req.files.iter().enumerate() {
        let field = format!("files[{i}]");
        if f.path.is_empty() || f.path.contains('\0') {
            return Err(ApiError::invalid(
                &format!("{field}.path"),
                "path must not be empty",
            ));
        }
        let bytes = match f.encoding.as_deref().unwrap_or("utf8") {
            "utf8" | "utf-8" => f.content.clone().into_bytes(),
            "base64" => base64::engine::general_purpose::STANDARD
                .decode(f.content.trim())
                .map_err(|e| {
                    ApiError::invalid(&format!("{field}.content"), format!("not base64: {e}"))
                })?,
            other => {
                return Err(ApiError::invalid(
                    &format!("{field}.encoding"),
                    format!("encoding {other:?}: use utf8 or base64"),
                ))
            }
        };
        out.push((f.path.clone(), bytes));
    }
    Ok(out)
}

fn check_globs(globs: &[String], field: &str) -> Result<(), ApiError> {
    if globs.len() > MAX_GLOBS {
        return Err(ApiError::invalid(
            field,
            format!("at most {MAX_GLOBS} entries"),
        ));
    }
    if globs.iter().any(|g| g.is_empty() || g.contains('\0')) {
        return Err(ApiError::invalid(field, "entries must not be empty"));
    }
    Ok(())
}

/// Signals the run's task when the request goes away before the answer.
struct HangUp(Option<tokio::sync::oneshot::Sender<()>>);

impl Drop for HangUp {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// Carries out a one-shot run.
pub async fn run(
    state: &Arc<AppState>,
    auth: &Auth,
    req: RunRequest,
) -> Result<RunResult, ApiError> {
    let files = decode_files(&req)?;
    check_globs(&req.artifacts, "artifacts")?;
    match (&req.command, &req.argv) {
        (Some(_), None) => {}
        (None, Some(a)) if !a.is_empty() => {}
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "command",
                "give command or argv, not both",
            ))
        }
        _ => return Err(ApiError::invalid("command", "command or argv is required")),
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let mut guard = HangUp(Some(tx));
    let (st, auth2) = (state.clone(), auth.clone());
    let task = tokio::spawn(async move { run_task(&st, &auth2, req, files, rx).await });
    let res = task.await.map_err(|_| ApiError::internal())?;
    guard.0 = None; // answered: nothing to cancel
    res
}

async fn run_task(
    state: &Arc<AppState>,
    auth: &Auth,
    req: RunRequest,
    files: Vec<(String, Vec<u8>)>,
    hang_up: tokio::sync::oneshot::Receiver<()>,
) -> Result<RunResult, ApiError> {
    let timeout = req.timeout_sec.unwrap_or(3600);
    let create = CreateSandbox {
        template_id: req.template_id.clone(),
        size: req.size,
        env: req.env.clone(),
        metadata: req.metadata.clone(),
        network: req.network.clone(),
        persistent: Some(false),
        // The sandbox outlives the command only by the time collecting takes.
        timeout_sec: Some(timeout.saturating_add(600).min(86_400)),
        idle_timeout_sec: Some(0),
        wait: Some(true),
        ..Default::default()
    };
    let sb = sandboxes::create(state, auth, create).await?;
    let id = sb.id.clone();
    let work = async {
        let row = state
            .store
            .sandbox(&id)
            .await?
            .ok_or_else(ApiError::internal)?;
        let user = req.user.unwrap_or_default();
        let (uid, home) = match user {
            ExecUser::User => (USER_UID, "/home/user"),
            ExecUser::Root => (0, "/root"),
        };
        let cwd = req.cwd.clone().unwrap_or_else(|| home.to_string());
        for (path, bytes) in files {
            let full = if path.starts_with('/') {
                path
            } else {
                format!("{}/{path}", cwd.trim_end_matches('/'))
            };
            write_file(state, &row, &full, uid, bytes).await?;
        }
        let exec = ExecRequest {
            command: req.command.clone(),
            argv: req.argv.clone(),
            env: None,
            cwd: Some(cwd.clone()),
            user: Some(user),
            stdin: req.stdin.clone(),
            timeout_sec: Some(timeout),
        };
        let result = sandboxes::exec(state, &row, exec).await?;
        let artifacts = if req.artifacts.is_empty() {
            Vec::new()
        } else {
            collect(state, &row, &req.artifacts, &cwd, user).await?
        };
        Ok::<_, ApiError>(RunResult {
            exit_code: result.exit_code,
            stdout: result.stdout,
            stderr: result.stderr,
            duration_ms: result.duration_ms,
            timed_out: result.timed_out,
            sandbox_id: id.clone(),
            artifacts: artifacts.iter().map(|a| wire(state, a)).collect(),
        })
    };
    let outcome = tokio::select! {
        r = work => r,
        _ = hang_up => Err(ApiError::new(ErrorCode::Conflict, "the client went away; the run was cancelled")),
    };
    let reason = match &outcome {
        Ok(_) => "one-shot run finished",
        Err(_) => "one-shot run ended early",
    };
    if let Err(e) = sandboxes::destroy(state, &id, Some(reason)).await {
        tracing::error!(
            sandbox = id,
            "destroying a one-shot run's sandbox: {}",
            e.message
        );
    }
    outcome
}

/// The handle of a running sandbox (409 `SANDBOX_NOT_RUNNING` otherwise).
fn running_handle(row: &SandboxRow) -> Result<cella_runtime::SandboxHandle, ApiError> {
    let probe = ExecRequest {
        argv: Some(vec!["true".into()]),
        ..Default::default()
    };
    exec_spec(row, probe, None).map(|(h, _)| h)
}

async fn write_file(
    state: &AppState,
    row: &SandboxRow,
    path: &str,
    uid: u32,
    bytes: Vec<u8>,
) -> Result<(), ApiError> {
    let handle = running_handle(row)?;
    let chunks = futures_util::stream::iter(vec![Ok::<_, std::io::Error>(bytes)]);
    let max = state.config.files.max_upload_bytes;
    match state
        .driver
        .agent(&handle)
        .write_file(path, uid, uid, 0o644, max, chunks)
        .await
    {
        Ok(_) => Ok(()),
        Err(WriteError::TooLarge) => Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("{path} is over the upload limit"),
        )),
        Err(WriteError::Agent(e)) => {
            Err(ApiError::invalid("files", format!("writing {path}: {e}")))
        }
        Err(WriteError::Source(_)) => Err(ApiError::internal()),
    }
}

/// Copies the files matching `globs` (relative to `cwd`) out of a running sandbox into the
/// artifact store. Symlinks are not followed; a file past the size budget is left out.
pub async fn collect(
    state: &AppState,
    row: &SandboxRow,
    globs: &[String],
    cwd: &str,
    user: ExecUser,
) -> Result<Vec<ArtifactRow>, ApiError> {
    check_globs(globs, "paths")?;
    // The workspace's storage quota bounds what this collection may keep.
    let storage = crate::quotas::storage(state, &row.workspace_id).await?;
    storage.check(0, "collecting artifacts")?;
    // The globs are expanded by bash inside the sandbox, as the command's user: they name
    // what that user could see, and are passed as arguments, never as code.
    let mut argv = vec![
        "/bin/bash".to_string(),
        "-c".to_string(),
        "shopt -s globstar nullglob dotglob; IFS=; for g in \"$@\"; do for f in $g; do \
         [ -f \"$f\" ] && [ ! -L \"$f\" ] && printf '%s\\0' \"$(realpath -- \"$f\")\"; done; done"
            .to_string(),
        "collect".to_string(),
    ];
    argv.extend(globs.iter().cloned());
    let listing = sandboxes::exec(
        state,
        row,
        ExecRequest {
            argv: Some(argv),
            cwd: Some(cwd.to_string()),
            user: Some(user),
            timeout_sec: Some(60),
            ..Default::default()
        },
    )
    .await?;
    let mut paths: Vec<String> = listing
        .stdout
        .split('\0')
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect();
    paths.dedup();
    let handle = running_handle(row)?;
    let agent = state.driver.agent(&handle);
    let dir = artifact_dir(state);
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|_| ApiError::internal())?;
    let cfg = &state.config.artifacts;
    let mut budget = cfg.max_bytes.min(storage.room());
    let now = now_ms();
    let mut out = Vec::new();
    for path in paths.into_iter().take(cfg.max_files) {
        let Ok(mut reader) = agent.read_file(&path, 0, None).await else {
            continue; // gone, or not a plain file any more
        };
        if reader.size > budget {
            tracing::warn!(
                sandbox = row.id,
                path,
                "artifact left out: over the size budget"
            );
            continue;
        }
        let id = new_id("art");
        let part = dir.join(format!("{id}.part"));
        let mut f = tokio::fs::File::create(&part)
            .await
            .map_err(|_| ApiError::internal())?;
        let mut size = 0u64;
        let mut ok = true;
        while let Some(chunk) = reader.next_chunk().await {
            match chunk {
                Ok(b) => {
                    size += b.len() as u64;
                    if size > budget || f.write_all(&b).await.is_err() {
                        ok = false;
                        break;
                    }
                }
                Err(_) => {
                    ok = false;
                    break;
                }
            }
        }
        if !ok || f.flush().await.is_err() {
            let _ = tokio::fs::remove_file(&part).await;
            continue;
        }
        drop(f);
        tokio::fs::rename(&part, dir.join(&id))
            .await
            .map_err(|_| ApiError::internal())?;
        budget -= size;
        let a = ArtifactRow {
            seq: 0,
            id,
            workspace_id: row.workspace_id.clone(),
            sandbox_id: row.id.clone(),
            path,
            size: size as i64,
            created_at: now,
            expires_at: now + cfg.retention_hours as i64 * 3_600_000,
        };
        state.store.insert_artifact(&a).await?;
        out.push(a);
    }
    Ok(out)
}

/// Deletes artifacts whose retention is over (called by the lifecycle timer).
pub async fn expire(state: &AppState) {
    let Ok(ids) = state.store.expired_artifacts(now_ms()).await else {
        return;
    };
    let dir = artifact_dir(state);
    for id in ids {
        let _ = tokio::fs::remove_file(dir.join(&id)).await;
        let _ = state.store.delete_artifact(&id).await;
    }
}
