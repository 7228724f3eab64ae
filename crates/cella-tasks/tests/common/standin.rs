//! Stand-ins for GitHub's and GitLab's REST APIs, with git smart HTTP through the real
//! `git http-backend` (CGI) behind them.
//!
//! This machine cannot reach the real GitHub or GitLab, so these answer as they would and check
//! each request the way the real API does: the `Authorization`/`PRIVATE-TOKEN` header (an App
//! JWT signed RS256 with the App's key and `iss` the App's id; an installation token minted
//! here, live and scoped to the repository), the `User-Agent`, GitHub's `Accept` and
//! `X-GitHub-Api-Version`, the token request's scope (`repositories`, least `permissions`), and
//! the pull/merge request's body fields. Git over HTTP is refused without Basic auth carrying a
//! live token for that repository (user `x-access-token` on GitHub, `oauth2` on GitLab).

#![allow(dead_code)]

use axum::body::Body;
use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, delete, get, post};
use axum::{Json, Router};
use base64::Engine as _;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub const APP_ID: u64 = 123;
pub const INSTALLATION_ID: u64 = 42;
pub const PAT: &str = "github_pat_11AAAAAAA0fineGrainedStandIn";
pub const GITLAB_TOKEN: &str = "glpat-StandInToken-1234567890";
pub const GITLAB_PROJECT_ID: u64 = 7;

/// What the stand-in saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// `METHOD path` of every API request, in order.
    pub requests: Vec<String>,
    /// Every request's failures of the checks (empty when all were as the real API wants).
    pub violations: Vec<String>,
    /// The token request bodies.
    pub token_requests: Vec<Value>,
    /// Minted installation tokens (token -> repository full name).
    pub minted: HashMap<String, String>,
    pub revoked: HashSet<String>,
    /// Pull/merge request bodies.
    pub pulls: Vec<Value>,
    /// Git requests that carried valid credentials, and those refused.
    pub git_ok: u32,
    pub git_refused: u32,
}

pub struct StandIn {
    pub addr: std::net::SocketAddr,
    pub seen: Arc<Mutex<Seen>>,
    /// Where the served bare repositories live (`<root>/<path>.git`).
    pub git_root: PathBuf,
}

#[derive(Clone)]
struct Ctx {
    seen: Arc<Mutex<Seen>>,
    git_root: PathBuf,
    base: String,
    jwt_key: Option<Arc<jsonwebtoken::DecodingKey>>,
    /// Repositories (full names) the App is installed on / the PAT may read.
    installed: HashSet<String>,
    /// GitHub: repositories without a readable `/repos` (installed, but hidden).
    hidden: HashSet<String>,
    gitlab: bool,
    /// Answers a draft like GitHub does on a plan without drafts.
    no_drafts: bool,
    /// A plain git host: git over HTTP without credentials.
    anonymous: bool,
}

impl Ctx {
    fn violation(&self, v: String) {
        self.seen.lock().expect("lock").violations.push(v);
    }
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({"message": "Bad credentials", "documentation_url": "https://docs.github.com/rest"})),
    )
        .into_response()
}

fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(json!({"message": "Not Found", "documentation_url": "https://docs.github.com/rest"})),
    )
        .into_response()
}

/// GitHub's required request headers.
fn check_github_headers(ctx: &Ctx, h: &HeaderMap, what: &str) {
    let get = |k: &str| h.get(k).and_then(|v| v.to_str().ok()).unwrap_or("");
    if get("user-agent").is_empty() {
        ctx.violation(format!("{what}: no User-Agent"));
    }
    if get("user-agent") != "cella" {
        ctx.violation(format!("{what}: User-Agent is {:?}", get("user-agent")));
    }
    if get("accept") != "application/vnd.github+json" {
        ctx.violation(format!("{what}: Accept is {:?}", get("accept")));
    }
    if get("x-github-api-version") != "2022-11-28" {
        ctx.violation(format!("{what}: no X-GitHub-Api-Version"));
    }
}

fn bearer(h: &HeaderMap) -> Option<String> {
    h.get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(String::from)
}

#[derive(serde::Deserialize)]
struct Claims {
    iat: u64,
    exp: u64,
    iss: String,
}

/// The App's JWT: RS256 with the App's key, `iss` the App id, `iat` not in the future, at most
/// ten minutes of life.
fn check_jwt(ctx: &Ctx, h: &HeaderMap) -> bool {
    let Some(key) = &ctx.jwt_key else {
        return false;
    };
    let Some(token) = bearer(h) else {
        return false;
    };
    let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    v.set_issuer(&[APP_ID.to_string()]);
    v.set_required_spec_claims(&["exp", "iat", "iss"]);
    match jsonwebtoken::decode::<Claims>(&token, key, &v) {
        Ok(data) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_secs();
            let c = data.claims;
            if c.iat > now || c.exp <= now || c.exp - c.iat > 600 || c.iss != APP_ID.to_string() {
                ctx.violation(format!(
                    "JWT claims out of bounds: iat {} exp {}",
                    c.iat, c.exp
                ));
                return false;
            }
            true
        }
        Err(e) => {
            ctx.violation(format!("JWT refused: {e}"));
            false
        }
    }
}

/// The repository a live token may act on.
fn token_repo(ctx: &Ctx, token: &str) -> Option<String> {
    let seen = ctx.seen.lock().expect("lock");
    if seen.revoked.contains(token) {
        return None;
    }
    if let Some(r) = seen.minted.get(token) {
        return Some(r.clone());
    }
    None
}

fn token_may(ctx: &Ctx, token: &str, full: &str) -> bool {
    if ctx.jwt_key.is_none() {
        return token == PAT
            && ctx.installed.contains(full)
            && !ctx.seen.lock().expect("lock").revoked.contains(token);
    }
    token_repo(ctx, token).as_deref() == Some(full)
}

fn record(ctx: &Ctx, m: &Method, path: &str) {
    ctx.seen
        .lock()
        .expect("lock")
        .requests
        .push(format!("{m} {path}"));
}

async fn gh_installation(
    State(ctx): State<Ctx>,
    UrlPath((o, r)): UrlPath<(String, String)>,
    h: HeaderMap,
) -> Response {
    record(&ctx, &Method::GET, &format!("/repos/{o}/{r}/installation"));
    check_github_headers(&ctx, &h, "installation");
    if !check_jwt(&ctx, &h) {
        return unauthorized();
    }
    if !ctx.installed.contains(&format!("{o}/{r}")) {
        return not_found();
    }
    Json(json!({
        "id": INSTALLATION_ID,
        "app_id": APP_ID,
        "target_type": "Organization",
        "account": {"login": o, "id": 1, "type": "Organization"},
        "access_tokens_url": format!("{}/app/installations/{INSTALLATION_ID}/access_tokens", ctx.base),
        "repository_selection": "selected",
        "permissions": {"contents": "write", "pull_requests": "write", "metadata": "read"},
        "events": [],
        "created_at": "2026-01-01T00:00:00Z",
    }))
    .into_response()
}

async fn gh_access_token(
    State(ctx): State<Ctx>,
    UrlPath(id): UrlPath<u64>,
    h: HeaderMap,
    body: String,
) -> Response {
    record(
        &ctx,
        &Method::POST,
        &format!("/app/installations/{id}/access_tokens"),
    );
    check_github_headers(&ctx, &h, "access_tokens");
    if !check_jwt(&ctx, &h) {
        return unauthorized();
    }
    if id != INSTALLATION_ID {
        return not_found();
    }
    let Ok(v) = serde_json::from_str::<Value>(&body) else {
        ctx.violation("token request body is not JSON".into());
        return (StatusCode::BAD_REQUEST, "bad json").into_response();
    };
    ctx.seen
        .lock()
        .expect("lock")
        .token_requests
        .push(v.clone());
    // Scoped to exactly one repository of the installation, with the least permissions.
    let repos: Vec<String> = v
        .get("repositories")
        .and_then(|r| r.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    if repos.len() != 1 {
        ctx.violation(format!("token not scoped to one repository: {v}"));
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"message": "scope"})),
        )
            .into_response();
    }
    let want = json!({"contents": "write", "pull_requests": "write", "metadata": "read"});
    if v.get("permissions") != Some(&want) {
        ctx.violation(format!("token permissions are not the least: {v}"));
    }
    let Some(full) = ctx
        .installed
        .iter()
        .find(|f| f.rsplit('/').next() == Some(repos[0].as_str()))
        .cloned()
    else {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"message": "There is at least one repository that does not exist or is not accessible to the parent installation."})),
        )
            .into_response();
    };
    // The new token format: long, stateless, dotted.
    let n = ctx.seen.lock().expect("lock").minted.len();
    let token = format!(
        "ghs_{}.{}.sig{n}xyz",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("standin-header-{n}")),
        "P".repeat(480),
    );
    ctx.seen
        .lock()
        .expect("lock")
        .minted
        .insert(token.clone(), full);
    (
        StatusCode::CREATED,
        Json(json!({
            "token": token,
            "expires_at": "2099-01-01T00:00:00Z",
            "permissions": want,
            "repository_selection": "selected",
        })),
    )
        .into_response()
}

async fn gh_repo(
    State(ctx): State<Ctx>,
    UrlPath((o, r)): UrlPath<(String, String)>,
    h: HeaderMap,
) -> Response {
    record(&ctx, &Method::GET, &format!("/repos/{o}/{r}"));
    check_github_headers(&ctx, &h, "repos");
    let full = format!("{o}/{r}");
    let Some(token) = bearer(&h) else {
        return unauthorized();
    };
    if ctx.jwt_key.is_some() && token_repo(&ctx, &token).is_none() {
        return unauthorized();
    }
    if !token_may(&ctx, &token, &full) || ctx.hidden.contains(&full) {
        return not_found();
    }
    Json(json!({
        "id": 1296269,
        "name": r,
        "full_name": full,
        "private": true,
        "default_branch": "main",
        "clone_url": format!("{}/git/{full}.git", ctx.base),
        "html_url": format!("{}/{full}", ctx.base),
    }))
    .into_response()
}

fn branch_exists(ctx: &Ctx, full: &str, branch: &str) -> bool {
    std::process::Command::new("git")
        .args([
            "rev-parse",
            "--verify",
            "-q",
            &format!("refs/heads/{branch}"),
        ])
        .env("GIT_DIR", ctx.git_root.join(format!("{full}.git")))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

async fn gh_pulls(
    State(ctx): State<Ctx>,
    UrlPath((o, r)): UrlPath<(String, String)>,
    h: HeaderMap,
    body: String,
) -> Response {
    record(&ctx, &Method::POST, &format!("/repos/{o}/{r}/pulls"));
    check_github_headers(&ctx, &h, "pulls");
    let full = format!("{o}/{r}");
    let Some(token) = bearer(&h) else {
        return unauthorized();
    };
    if !token_may(&ctx, &token, &full) {
        return unauthorized();
    }
    let Ok(v) = serde_json::from_str::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "bad json").into_response();
    };
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
    for k in ["title", "head", "base", "body"] {
        if s(k).is_empty() {
            ctx.violation(format!("pull request without {k}: {v}"));
        }
    }
    let draft = v.get("draft") == Some(&json!(true));
    if ctx.no_drafts && draft {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"message": "Draft pull requests are not supported in this repository.", "documentation_url": "https://docs.github.com/rest/pulls/pulls#create-a-pull-request"})),
        )
            .into_response();
    }
    if !draft && !ctx.no_drafts {
        ctx.violation(format!("pull request not a draft: {v}"));
    }
    if !branch_exists(&ctx, &full, &s("head")) {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"message": "Validation Failed", "errors": [{"resource": "PullRequest", "field": "head", "code": "invalid"}]})),
        )
            .into_response();
    }
    if !branch_exists(&ctx, &full, &s("base")) {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"message": "Validation Failed", "errors": [{"resource": "PullRequest", "field": "base", "code": "invalid"}]})),
        )
            .into_response();
    }
    let number = {
        let mut seen = ctx.seen.lock().expect("lock");
        seen.pulls.push(v.clone());
        seen.pulls.len() as u64
    };
    (
        StatusCode::CREATED,
        Json(json!({
            "id": 1000 + number,
            "node_id": "PR_x",
            "number": number,
            "url": format!("{}/repos/{full}/pulls/{number}", ctx.base),
            "html_url": format!("{}/{full}/pull/{number}", ctx.base),
            "state": "open",
            "draft": draft,
            "head": {"ref": s("head"), "sha": "0"},
            "base": {"ref": s("base"), "sha": "0"},
        })),
    )
        .into_response()
}

async fn gh_revoke(State(ctx): State<Ctx>, h: HeaderMap) -> Response {
    record(&ctx, &Method::DELETE, "/installation/token");
    check_github_headers(&ctx, &h, "revoke");
    let Some(token) = bearer(&h) else {
        return unauthorized();
    };
    if token_repo(&ctx, &token).is_none() {
        return unauthorized();
    }
    ctx.seen.lock().expect("lock").revoked.insert(token);
    StatusCode::NO_CONTENT.into_response()
}

fn gl_checks(ctx: &Ctx, h: &HeaderMap, what: &str) -> bool {
    if h.get("user-agent").and_then(|v| v.to_str().ok()) != Some("cella") {
        ctx.violation(format!("{what}: User-Agent"));
    }
    h.get("private-token").and_then(|v| v.to_str().ok()) == Some(GITLAB_TOKEN)
}

async fn gl_project(
    State(ctx): State<Ctx>,
    UrlPath(id): UrlPath<String>,
    h: HeaderMap,
) -> Response {
    record(&ctx, &Method::GET, &format!("/api/v4/projects/{id}"));
    if !gl_checks(&ctx, &h, "project") {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"message": "401 Unauthorized"})),
        )
            .into_response();
    }
    // The path arrives URL-encoded (`group%2Fsub%2Fname`) and is decoded by the router.
    if !ctx.installed.contains(&id) {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"message": "404 Project Not Found"})),
        )
            .into_response();
    }
    Json(json!({
        "id": GITLAB_PROJECT_ID,
        "path_with_namespace": id,
        "default_branch": "main",
        "http_url_to_repo": format!("{}/git/{id}.git", ctx.base),
        "web_url": format!("{}/{id}", ctx.base),
    }))
    .into_response()
}

async fn gl_merge_requests(
    State(ctx): State<Ctx>,
    UrlPath(id): UrlPath<String>,
    h: HeaderMap,
    body: String,
) -> Response {
    record(
        &ctx,
        &Method::POST,
        &format!("/api/v4/projects/{id}/merge_requests"),
    );
    if !gl_checks(&ctx, &h, "merge_requests") {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"message": "401 Unauthorized"})),
        )
            .into_response();
    }
    if id != GITLAB_PROJECT_ID.to_string() {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"message": "404 Project Not Found"})),
        )
            .into_response();
    }
    let Ok(v) = serde_json::from_str::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "bad json").into_response();
    };
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
    for k in ["source_branch", "target_branch", "title", "description"] {
        if s(k).is_empty() {
            ctx.violation(format!("merge request without {k}: {v}"));
        }
    }
    if !s("title").starts_with("Draft: ") {
        ctx.violation(format!("merge request title without Draft: {v}"));
    }
    let full = ctx.installed.iter().next().cloned().unwrap_or_default();
    if !branch_exists(&ctx, &full, &s("source_branch")) {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"message": {"source_branch": ["is invalid"]}, "token": GITLAB_TOKEN})),
        )
            .into_response();
    }
    let iid = {
        let mut seen = ctx.seen.lock().expect("lock");
        seen.pulls.push(v.clone());
        seen.pulls.len() as u64
    };
    (
        StatusCode::CREATED,
        Json(json!({
            "id": 500 + iid,
            "iid": iid,
            "project_id": GITLAB_PROJECT_ID,
            "title": s("title"),
            "draft": true,
            "work_in_progress": true,
            "web_url": format!("{}/{full}/-/merge_requests/{iid}", ctx.base),
        })),
    )
        .into_response()
}

/// Git smart HTTP via `git http-backend`, behind a check of the Basic credential.
async fn git_http(
    State(ctx): State<Ctx>,
    UrlPath(rest): UrlPath<String>,
    req: Request,
) -> Response {
    let (parts, body) = req.into_parts();
    let full = rest.split(".git/").next().unwrap_or("").to_string();
    let user = if ctx.gitlab {
        "oauth2"
    } else {
        "x-access-token"
    };
    let authorized = parts
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|up| {
            let (u, p) = up.split_once(':')?;
            Some((u.to_string(), p.to_string()))
        })
        .is_some_and(|(u, p)| {
            u == user
                && if ctx.gitlab {
                    p == GITLAB_TOKEN
                } else {
                    token_may(&ctx, &p, &full)
                }
        });
    if !authorized && !ctx.anonymous {
        ctx.seen.lock().expect("lock").git_refused += 1;
        return Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .header("WWW-Authenticate", "Basic realm=\"standin\"")
            .body(Body::from("auth required"))
            .expect("response");
    }
    ctx.seen.lock().expect("lock").git_ok += 1;
    let input = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let h = |k: &str| {
        parts
            .headers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let mut cmd = tokio::process::Command::new("git");
    cmd.arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_PROJECT_ROOT", &ctx.git_root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("PATH_INFO", format!("/{rest}"))
        .env("REQUEST_METHOD", parts.method.as_str())
        .env("QUERY_STRING", parts.uri.query().unwrap_or(""))
        .env("CONTENT_TYPE", h("content-type"))
        .env("CONTENT_LENGTH", input.len().to_string())
        .env("HTTP_CONTENT_ENCODING", h("content-encoding"))
        .env("GIT_PROTOCOL", h("git-protocol"))
        .env("REMOTE_USER", user)
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    let mut child = cmd.spawn().expect("git http-backend");
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = tokio::spawn(async move {
        let _ = tokio::io::AsyncWriteExt::write_all(&mut stdin, &input).await;
    });
    let out = child.wait_with_output().await.expect("http-backend output");
    let _ = writer.await;
    let raw = out.stdout;
    let (head_end, sep) = match find(&raw, b"\r\n\r\n") {
        Some(i) => (i, 4),
        None => (find(&raw, b"\n\n").unwrap_or(raw.len()), 2),
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    let body = raw.get(head_end + sep..).unwrap_or(&[]).to_vec();
    let mut resp = Response::builder();
    let mut status = StatusCode::OK;
    for line in head.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        if k.eq_ignore_ascii_case("status") {
            status = v
                .split(' ')
                .next()
                .and_then(|c| c.parse::<u16>().ok())
                .and_then(|c| StatusCode::from_u16(c).ok())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        } else {
            resp = resp.header(k.trim(), v);
        }
    }
    resp.status(status)
        .body(Body::from(body))
        .expect("response")
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

pub enum Kind {
    /// A GitHub App whose public key verifies the JWTs.
    GithubApp {
        public_key_pem: Vec<u8>,
    },
    /// A fine-grained personal token ([`PAT`]).
    GithubToken,
    Gitlab,
    /// A plain git host serving without credentials (for a `git` forge with an http URL).
    AnonymousGit,
}

impl StandIn {
    /// Serves `repos` (full names; each a bare repository at `<git_root>/<name>.git`), and
    /// `hidden` ones the App is installed on but whose `/repos` answers 404.
    pub async fn start(kind: Kind, git_root: &Path, repos: &[&str], hidden: &[&str]) -> StandIn {
        StandIn::start_with(kind, git_root, repos, hidden, false).await
    }

    /// [`StandIn::start`]; `no_drafts` answers drafts as a plan without them does.
    pub async fn start_with(
        kind: Kind,
        git_root: &Path,
        repos: &[&str],
        hidden: &[&str],
        no_drafts: bool,
    ) -> StandIn {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (jwt_key, gitlab) = match &kind {
            Kind::GithubApp { public_key_pem } => (
                Some(Arc::new(
                    jsonwebtoken::DecodingKey::from_rsa_pem(public_key_pem).expect("public key"),
                )),
                false,
            ),
            Kind::GithubToken => (None, false),
            Kind::Gitlab | Kind::AnonymousGit => (None, true),
        };
        let anonymous = matches!(kind, Kind::AnonymousGit);
        let ctx = Ctx {
            seen: seen.clone(),
            git_root: git_root.to_path_buf(),
            base: format!("http://{addr}"),
            jwt_key,
            installed: repos.iter().chain(hidden).map(|s| s.to_string()).collect(),
            hidden: hidden.iter().map(|s| s.to_string()).collect(),
            gitlab,
            no_drafts,
            anonymous,
        };
        let app = Router::new()
            .route("/repos/{o}/{r}/installation", get(gh_installation))
            .route(
                "/app/installations/{id}/access_tokens",
                post(gh_access_token),
            )
            .route("/repos/{o}/{r}", get(gh_repo))
            .route("/repos/{o}/{r}/pulls", post(gh_pulls))
            .route("/installation/token", delete(gh_revoke))
            .route("/api/v4/projects/{id}", get(gl_project))
            .route(
                "/api/v4/projects/{id}/merge_requests",
                post(gl_merge_requests),
            )
            .route("/git/{*rest}", any(git_http))
            .with_state(ctx);
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        StandIn {
            addr,
            seen,
            git_root: git_root.to_path_buf(),
        }
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }
}
