//! One-shot runs and artifacts.
//!
//! A run is a whole sandbox life in one request: create (from the warm pool when it can),
//! write the files, run the command, collect the artifacts, destroy. It runs in a task of its
//! own and destroys its sandbox whatever happens: the command fails or times out, the client
//! hangs up (the run is then cancelled at once), or a step fails.
//!
//! Bad input (a file's path or encoding, the globs, command and argv) is refused before any
//! sandbox is made. The errors are [`RunError`] (in `crate::service::error`, where they become
//! the envelope).
//!
//! Artifacts are files the server keeps after the sandbox is gone, under
//! `DATA/artifacts/<id>`, until their retention time is up (the lifecycle timer deletes them).
//!
//! How a run goes (`POST /api/v1/sandboxes/run`): [`run`] checks the request, then holds a
//! `HangUp` guard whose drop (the request's future dropped: the client went away) cancels the
//! run. `run_task` runs in a task of its own: `sandboxes::create` with `wait` (the warm pool's
//! fast path included), not persistent, no idle timer, the command's timeout plus 600 s; then, in
//! a `select!` against the hang-up, each file as an upload owned by the run's user, the command
//! through `sandboxes::exec`, and [`collect`] when globs were given. Each step reads the
//! sandbox again (`service::runnable`), waiting while it is away for a gVisor fork or snapshot.
//! Whatever the outcome the sandbox is destroyed, with its `state_reason`. On a hang-up the work's future is dropped: its
//! connection to the agent closes, so the agent kills the command's tree.
//!
//! [`collect`] (also behind `POST .../artifacts`) matches the globs here against the agent's
//! directory listings, as the run's user may read them (only regular files, never through a
//! symlink), and copies each file, up to `[artifacts] max_files`, into `DATA/artifacts/<id>.part`,
//! renamed `<id>` once whole; a file past what is left of `max_bytes` (and of the workspace's
//! storage quota) is left out. `GET /api/v1/artifacts/{id}` streams the file; the timer loop calls
//! [`expire`], which deletes expired rows and their files.

use crate::auth::Auth;
use crate::error::Internal;
use crate::sandboxes::{self, USER_UID};
use crate::service::{AgentOp, RunError, Runnable, SandboxError};
use crate::util::{new_id, now_ms, rfc3339};
use crate::AppState;
use cella_agent::client::{AgentClient, ClientError, WriteError};
use cella_agent::proto::{FileInfo, Request, Response as AgentResponse};
use cella_store::ArtifactRow;
use cella_types::{Artifact, CreateSandbox, ExecRequest, ExecUser, RunRequest, RunResult};
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
fn decode_files(req: &RunRequest) -> Result<Vec<(String, Vec<u8>)>, RunError> {
    use base64::Engine;
    let mut out = Vec::new();
    for (i, f) in req.files.iter().enumerate() {
        let field = format!("files[{i}]");
        if f.path.is_empty() || f.path.contains('\0') {
            return Err(RunError::invalid(
                &format!("{field}.path"),
                "path must not be empty",
            ));
        }
        let bytes = match f.encoding.as_deref().unwrap_or("utf8") {
            "utf8" | "utf-8" => f.content.clone().into_bytes(),
            "base64" => base64::engine::general_purpose::STANDARD
                .decode(f.content.trim())
                .map_err(|e| {
                    RunError::invalid(&format!("{field}.content"), format!("not base64: {e}"))
                })?,
            other => {
                return Err(RunError::invalid(
                    &format!("{field}.encoding"),
                    format!("encoding {other:?}: use utf8 or base64"),
                ))
            }
        };
        out.push((f.path.clone(), bytes));
    }
    Ok(out)
}

fn check_globs(globs: &[String], field: &str) -> Result<(), RunError> {
    if globs.len() > MAX_GLOBS {
        return Err(RunError::invalid(
            field,
            format!("at most {MAX_GLOBS} entries"),
        ));
    }
    if globs.iter().any(|g| g.is_empty() || g.contains('\0')) {
        return Err(RunError::invalid(field, "entries must not be empty"));
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
) -> Result<RunResult, RunError> {
    let files = decode_files(&req)?;
    check_globs(&req.artifacts, "artifacts")?;
    match (&req.command, &req.argv) {
        (Some(_), None) => {}
        (None, Some(a)) if !a.is_empty() => {}
        (Some(_), Some(_)) => {
            return Err(RunError::invalid(
                "command",
                "give command or argv, not both",
            ))
        }
        _ => return Err(RunError::invalid("command", "command or argv is required")),
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let mut guard = HangUp(Some(tx));
    let (st, auth2) = (state.clone(), auth.clone());
    let task = tokio::spawn(async move { run_task(&st, &auth2, req, files, rx).await });
    let res = task.await.map_err(Internal::task("a run's task"))?;
    guard.0 = None; // answered: nothing to cancel
    res
}

async fn run_task(
    state: &Arc<AppState>,
    auth: &Auth,
    req: RunRequest,
    files: Vec<(String, Vec<u8>)>,
    hang_up: tokio::sync::oneshot::Receiver<()>,
) -> Result<RunResult, RunError> {
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
        // As at create: the template's runtime, then the server's default.
        runtime: req.runtime.clone(),
        ..Default::default()
    };
    let sb = sandboxes::create(state, auth, create).await?;
    let id = sb.id.clone();
    let work = async {
        // The sandbox as it is now, before each step: its workspace may fork or snapshot it
        // meanwhile, which on gVisor sends its agent away for a moment and gives it a new
        // handle (waited for, then read again).
        let now = || crate::service::runnable(state, auth, &id);
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
            write_file(state, &now().await?, &full, uid, bytes).await?;
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
        let result = sandboxes::exec(state, &now().await?, exec).await?;
        let artifacts = if req.artifacts.is_empty() {
            Vec::new()
        } else {
            collect(state, &now().await?, &req.artifacts, &cwd, user).await?
        };
        Ok::<_, RunError>(RunResult {
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
        _ = hang_up => Err(RunError::Cancelled),
    };
    let reason = match &outcome {
        Ok(_) => "one-shot run finished",
        Err(_) => "one-shot run ended early",
    };
    if let Err(e) = sandboxes::destroy(state, &id, Some(reason)).await {
        tracing::error!(sandbox = id, "destroying a one-shot run's sandbox: {e}");
    }
    outcome
}

async fn write_file(
    state: &AppState,
    sb: &Runnable,
    path: &str,
    uid: u32,
    bytes: Vec<u8>,
) -> Result<(), RunError> {
    let chunks = futures_util::stream::iter(vec![Ok::<_, std::io::Error>(bytes)]);
    let max = state.config.files.max_upload_bytes;
    match sb
        .agent(state)
        .write_file(path, uid, uid, 0o644, max, chunks)
        .await
    {
        Ok(_) => Ok(()),
        Err(WriteError::TooLarge) => Err(RunError::TooLarge {
            path: path.to_string(),
        }),
        Err(WriteError::Agent(e)) => Err(AgentOp::RunFile {
            path: path.to_string(),
        }
        .err()(e)
        .into()),
        Err(WriteError::Source(e)) => Err(SandboxError::Io {
            what: "a run's file",
            source: e,
        }
        .into()),
    }
}

/// Entries one glob's listing looks at, at most.
const LIST_LIMIT: usize = 10_000;

/// Whether `part` (one path component of a glob) has a wildcard.
fn has_wildcard(part: &str) -> bool {
    part.contains(['*', '?', '['])
}

/// `fnmatch` of one path component, `dotglob` style (`*` matches a leading dot too):
/// `*`, `?`, and `[...]` classes with ranges and `!`/`^` negation.
fn match_component(pat: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        if p < pat.len() {
            match pat[p] {
                b'*' => {
                    star = Some((p, i));
                    p += 1;
                    continue;
                }
                b'?' => {
                    p += 1;
                    i += 1;
                    continue;
                }
                b'[' => {
                    if let Some((matched, next)) = class(&pat[p..], s[i]) {
                        if matched {
                            p += next;
                            i += 1;
                            continue;
                        }
                    } else if s[i] == b'[' {
                        p += 1;
                        i += 1;
                        continue;
                    }
                }
                c => {
                    if c == s[i] {
                        p += 1;
                        i += 1;
                        continue;
                    }
                }
            }
        }
        match star {
            Some((sp, si)) => {
                p = sp + 1;
                i = si + 1;
                star = Some((sp, si + 1));
            }
            None => return false,
        }
    }
    pat[p..].iter().all(|&c| c == b'*')
}

/// A `[...]` class at the start of `pat`: whether `c` is in it and the class's length; `None`
/// when the class is not closed (then `[` is a plain character).
fn class(pat: &[u8], c: u8) -> Option<(bool, usize)> {
    let mut i = 1;
    let negate = matches!(pat.get(i), Some(b'!') | Some(b'^'));
    if negate {
        i += 1;
    }
    let mut hit = false;
    let mut first = true;
    while i < pat.len() {
        if pat[i] == b']' && !first {
            return Some((hit != negate, i + 1));
        }
        first = false;
        if i + 2 < pat.len() && pat[i + 1] == b'-' && pat[i + 2] != b']' {
            if pat[i] <= c && c <= pat[i + 2] {
                hit = true;
            }
            i += 3;
        } else {
            if pat[i] == c {
                hit = true;
            }
            i += 1;
        }
    }
    None
}

/// Whether the components `path` match the glob components `pat` (`**` spans any number of
/// components, none included). Dynamic programming: linear in both lengths, whatever the glob.
fn match_path(pat: &[&str], path: &[&str]) -> bool {
    let (m, n) = (pat.len(), path.len());
    // ok[i][j]: pat[i..] matches path[j..].
    let mut ok = vec![vec![false; n + 1]; m + 1];
    ok[m][n] = true;
    for i in (0..m).rev() {
        for j in (0..=n).rev() {
            ok[i][j] = if pat[i] == "**" {
                ok[i + 1][j] || (j < n && ok[i][j + 1])
            } else {
                j < n && match_component(pat[i].as_bytes(), path[j].as_bytes()) && ok[i + 1][j + 1]
            };
        }
    }
    ok[0][0]
}

/// A glob as an absolute, lexically clean list of components (`.` dropped, `..` applied to the
/// literal part before it).
fn glob_parts(glob: &str, cwd: &str) -> Vec<String> {
    let full = if glob.starts_with('/') {
        glob.to_string()
    } else {
        format!("{}/{glob}", cwd.trim_end_matches('/'))
    };
    let mut out: Vec<String> = Vec::new();
    for part in full.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if out.last().is_some_and(|l| !has_wildcard(l) && l != "**") {
                    out.pop();
                }
            }
            p => out.push(p.to_string()),
        }
    }
    out
}

/// Whether `uid` (with its group of the same number) may do `bits` (r=4, w=2, x=1) on `f`.
fn may(uid: u32, f: &FileInfo, bits: u32) -> bool {
    if uid == 0 {
        return true;
    }
    let shift = if f.uid == uid {
        6
    } else if f.gid == uid {
        3
    } else {
        0
    };
    (f.mode >> shift) & bits == bits
}

async fn agent_list(
    agent: &AgentClient,
    path: &str,
    recursive: bool,
) -> Result<Vec<FileInfo>, ClientError> {
    match agent
        .call(&Request::List {
            path: path.to_string(),
            recursive,
            limit: LIST_LIMIT,
        })
        .await?
    {
        AgentResponse::Entries { entries, .. } => Ok(entries),
        _ => Err(ClientError::Unexpected),
    }
}

async fn agent_stat(agent: &AgentClient, path: &str) -> Option<FileInfo> {
    match agent
        .call(&Request::Stat {
            path: path.to_string(),
        })
        .await
    {
        Ok(AgentResponse::Stat(i)) => Some(i),
        _ => None,
    }
}

/// The regular files that `globs` match, found through the agent's file API (which walks by
/// descriptor and never follows a symlink below the glob's literal directory) and matched
/// here, never by a shell inside the sandbox. Only what `uid` may read is kept, in directories
/// it may list.
async fn matching_files(agent: &AgentClient, globs: &[String], cwd: &str, uid: u32) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for glob in globs {
        let parts = glob_parts(glob, cwd);
        let literal = parts
            .iter()
            .take_while(|p| !has_wildcard(p) && p.as_str() != "**")
            .count();
        let base = format!("/{}", parts[..literal].join("/"));
        // Every directory on the way to the base must let the user through.
        let mut reachable = true;
        if uid != 0 {
            let mut cur = String::new();
            for p in &parts[..literal.saturating_sub(1)] {
                cur = format!("{cur}/{p}");
                if !agent_stat(agent, &cur)
                    .await
                    .is_some_and(|d| may(uid, &d, 1))
                {
                    reachable = false;
                    break;
                }
            }
        }
        if !reachable {
            continue;
        }
        let pattern: Vec<&str> = parts[literal..].iter().map(String::as_str).collect();
        if pattern.is_empty() {
            // A path without wildcards names one file.
            if let Some(f) = agent_stat(agent, &base).await {
                if f.kind == "file" && may(uid, &f, 4) {
                    out.push(f.path);
                }
            }
            continue;
        }
        let Some(top) = agent_stat(agent, &base).await else {
            continue;
        };
        if top.kind != "dir" || !may(uid, &top, 5) {
            continue;
        }
        let recursive = pattern.len() > 1 || pattern.contains(&"**");
        let Ok(entries) = agent_list(agent, &base, recursive).await else {
            continue;
        };
        let dirs: std::collections::HashMap<&str, &FileInfo> = entries
            .iter()
            .filter(|e| e.kind == "dir")
            .map(|e| (e.path.as_str(), e))
            .collect();
        let prefix = if base == "/" {
            "/".to_string()
        } else {
            format!("{base}/")
        };
        for e in &entries {
            if e.kind != "file" || !may(uid, e, 4) {
                continue;
            }
            let Some(rest) = e.path.strip_prefix(&prefix) else {
                continue;
            };
            let comps: Vec<&str> = rest.split('/').collect();
            if !match_path(&pattern, &comps) {
                continue;
            }
            // Each directory between the base and the file must be listable by the user.
            let mut dir = base.clone();
            let mut allowed = true;
            for c in &comps[..comps.len() - 1] {
                dir = if dir == "/" {
                    format!("/{c}")
                } else {
                    format!("{dir}/{c}")
                };
                if !dirs.get(dir.as_str()).is_some_and(|d| may(uid, d, 5)) {
                    allowed = false;
                    break;
                }
            }
            if allowed && !out.contains(&e.path) {
                out.push(e.path.clone());
            }
        }
    }
    out
}

/// Copies the files matching `globs` (relative to `cwd`) out of a running sandbox into the
/// artifact store. The globs are matched here against the agent's listings; only regular files
/// are kept, read without following a symlink; a file past the size budget is left out.
pub async fn collect(
    state: &AppState,
    sb: &Runnable,
    globs: &[String],
    cwd: &str,
    user: ExecUser,
) -> Result<Vec<ArtifactRow>, RunError> {
    check_globs(globs, "paths")?;
    let row = &sb.row;
    // The workspace's storage quota bounds what this collection may keep.
    let storage = crate::quotas::storage(state, &row.workspace_id).await?;
    storage.check(0, "collecting artifacts")?;
    let uid = match user {
        ExecUser::User => USER_UID,
        ExecUser::Root => 0,
    };
    let agent = sb.agent(state);
    let paths = matching_files(&agent, globs, cwd, uid).await;
    let dir = artifact_dir(state);
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|source| SandboxError::Io {
            what: "making the artifact directory",
            source,
        })?;
    let cfg = &state.config.artifacts;
    let mut budget = cfg.max_bytes.min(storage.room());
    let now = now_ms();
    let mut out = Vec::new();
    for path in paths.into_iter().take(cfg.max_files) {
        let Ok(mut reader) = agent.read_file_with(&path, 0, None, true).await else {
            continue; // gone, or not a plain file any more (a symlink, a FIFO, ...)
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
            .map_err(Internal::io("creating an artifact's file"))?;
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
            .map_err(Internal::io("keeping an artifact's file"))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn m(glob: &str, path: &str) -> bool {
        let pat: Vec<&str> = glob.split('/').collect();
        let comps: Vec<&str> = path.split('/').collect();
        match_path(&pat, &comps)
    }

    #[test]
    fn globs_match_like_bash_with_globstar_and_dotglob() {
        assert!(m("*.csv", "a.csv"));
        assert!(m("*.csv", ".hidden.csv"));
        assert!(!m("*.csv", "d/a.csv"));
        assert!(m("**", "d/e/f"));
        assert!(m("**/*.log", "x.log"));
        assert!(m("**/*.log", "a/b/x.log"));
        assert!(!m("**/*.log", "a/b/x.txt"));
        assert!(m("out/**", "out/a/b"));
        assert!(m("r?port[0-9].txt", "report7.txt"));
        assert!(!m("r?port[!0-9].txt", "report7.txt"));
        assert!(m("a[.txt", "a[.txt"));
        assert!(m("**/**/**/**/**/**/a", "a"));
        assert_eq!(
            glob_parts("out/../*.csv", "/home/user"),
            ["home", "user", "*.csv"]
        );
        assert_eq!(glob_parts("/../../etc/x", "/w"), ["etc", "x"]);
    }
}
