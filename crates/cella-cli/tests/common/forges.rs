//! Stand-ins for GitHub's and GitLab's REST APIs and for their git servers, for the task-run
//! suite. This machine cannot reach GitHub or GitLab, so the tests talk to these instead; each
//! checks every request as the real service would (auth header, the App's JWT signature, token
//! scope, body fields, `User-Agent`) and answers what the real one answers (status codes and
//! spec-shaped JSON). What a stand-in refuses is also written to its `violations`, so a test can
//! say which check the server failed. Git goes through the real `git http-backend` (CGI) behind
//! the same HTTP server, with HTTP basic auth checked first (`x-access-token:<installation token>`
//! for GitHub, `oauth2:<token>` for GitLab).
//!
//! Each stand-in serves on 127.0.0.1 on a random port from a thread of its own (a tokio runtime
//! there), and lives as long as the test holds it.
#![allow(dead_code, clippy::result_large_err)]

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router;
use base64::Engine;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

/// Serves `app` on 127.0.0.1 (random port) from its own thread; returns the port.
pub fn serve(app: Router) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            let _ = axum::serve(l, app).await;
        });
    });
    port
}

/// Runs git with `args` in `dir` (no global or system config, so the host's own settings do not
/// change what the tests see); panics with its output when it fails.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "Test")
        .env("GIT_AUTHOR_EMAIL", "test@example.org")
        .env("GIT_COMMITTER_NAME", "Test")
        .env("GIT_COMMITTER_EMAIL", "test@example.org")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Like [`git`], but answers `None` when git fails.
pub fn git_try(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Makes the bare repository `root/<repository>.git` with `files` committed on `main` (and
/// pushes allowed over HTTP). Returns its path.
pub fn make_repo(root: &Path, repository: &str, files: &[(&str, &str)]) -> PathBuf {
    let work = tempfile::tempdir().unwrap();
    git(work.path(), &["init", "-q", "-b", "main"]);
    for (path, content) in files {
        let p = work.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, content).unwrap();
        if path.ends_with(".sh") || path.contains("hooks/") {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    git(work.path(), &["add", "-A"]);
    git(work.path(), &["commit", "-q", "-m", "the first commit"]);
    let bare = root.join(format!("{repository}.git"));
    std::fs::create_dir_all(bare.parent().unwrap()).unwrap();
    git(
        root,
        &[
            "clone",
            "-q",
            "--bare",
            work.path().to_str().unwrap(),
            bare.to_str().unwrap(),
        ],
    );
    git(&bare, &["config", "http.receivepack", "true"]);
    bare
}

/// A file on a branch of a bare repository (`None`: no such branch or file).
pub fn file_on_branch(bare: &Path, branch: &str, path: &str) -> Option<String> {
    git_try(bare, &["show", &format!("refs/heads/{branch}:{path}")])
}

/// The commit subjects of `branch` not on `base`, newest first.
pub fn commits_between(bare: &Path, base: &str, branch: &str) -> Vec<String> {
    git_try(
        bare,
        &[
            "log",
            "--format=%s",
            &format!("refs/heads/{base}..refs/heads/{branch}"),
        ],
    )
    .map(|s| s.lines().map(String::from).collect())
    .unwrap_or_default()
}

/// Answers one smart-HTTP git request through the real `git http-backend` (CGI) over the bare
/// repositories under `root`; `user` is the authenticated HTTP user (`REMOTE_USER`).
async fn git_cgi(
    root: &Path,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Bytes,
    user: &str,
) -> Response {
    let mut cmd = tokio::process::Command::new("git");
    cmd.arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("GIT_PROJECT_ROOT", root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("PATH_INFO", uri.path())
        .env("QUERY_STRING", uri.query().unwrap_or(""))
        .env("REQUEST_METHOD", method.as_str())
        .env("REMOTE_USER", user)
        .env("REMOTE_ADDR", "127.0.0.1")
        .env("CONTENT_LENGTH", body.len().to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (h, var) in [
        ("content-type", "CONTENT_TYPE"),
        ("content-encoding", "HTTP_CONTENT_ENCODING"),
        ("git-protocol", "GIT_PROTOCOL"),
    ] {
        if let Some(v) = headers.get(h).and_then(|v| v.to_str().ok()) {
            cmd.env(var, v);
        }
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    let mut stdin = child.stdin.take().unwrap();
    let writer = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let _ = stdin.write_all(&body).await;
    });
    let out = match child.wait_with_output().await {
        Ok(o) => o,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    let _ = writer.await;
    // CGI: headers, a blank line, the body.
    let raw = out.stdout;
    let (head_end, sep) = match raw.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(i) => (i, 4),
        None => match raw.windows(2).position(|w| w == b"\n\n") {
            Some(i) => (i, 2),
            None => {
                return (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    String::from_utf8_lossy(&out.stderr).into_owned(),
                )
                    .into_response()
            }
        },
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    let mut res = Response::new(axum::body::Body::from(raw[head_end + sep..].to_vec()));
    for line in head.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        if k.eq_ignore_ascii_case("status") {
            let code = v.split_whitespace().next().and_then(|c| c.parse().ok());
            *res.status_mut() = StatusCode::from_u16(code.unwrap_or(500)).unwrap();
        } else if let (Ok(name), Ok(val)) = (
            axum::http::HeaderName::from_bytes(k.trim().as_bytes()),
            axum::http::HeaderValue::from_str(v),
        ) {
            res.headers_mut().append(name, val);
        }
    }
    res
}

/// HTTP basic credentials of a request.
fn basic(headers: &HeaderMap) -> Option<(String, String)> {
    let v = headers.get("authorization")?.to_str().ok()?;
    let b64 = v
        .strip_prefix("Basic ")
        .or_else(|| v.strip_prefix("basic "))?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .ok()?;
    let s = String::from_utf8(raw).ok()?;
    let (u, p) = s.split_once(':')?;
    Some((u.to_string(), p.to_string()))
}

fn bearer(headers: &HeaderMap) -> Option<String> {
    let v = headers.get("authorization")?.to_str().ok()?;
    v.strip_prefix("Bearer ")
        .or_else(|| v.strip_prefix("bearer "))
        .or_else(|| v.strip_prefix("token "))
        .map(|s| s.trim().to_string())
}

fn unauthorized_git(realm: &str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [("www-authenticate", format!("Basic realm=\"{realm}\""))],
        "Authentication failed\n",
    )
        .into_response()
}

/// The `owner/name` of a git URL path `/owner/name.git/...` (GitLab: `/g/sub/name.git/...`).
fn repo_of_git_path(path: &str) -> Option<String> {
    let i = path.find(".git/")?;
    Some(path[1..i].to_string())
}

fn random_hex(n: usize) -> String {
    let mut buf = vec![0u8; n];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut buf)
        .unwrap();
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

// ---------------------------------------------------------------------------------------------
// GitHub

/// A token the stand-in minted.
#[derive(Debug, Clone)]
pub struct Minted {
    pub token: String,
    /// The one repository (`owner/name`) it is scoped to.
    pub repository: String,
    pub permissions: Value,
    pub revoked: bool,
}

/// A pull request the stand-in recorded.
#[derive(Debug, Clone)]
pub struct RecordedPr {
    pub number: u64,
    pub repository: String,
    pub title: String,
    pub body: String,
    pub head: String,
    pub base: String,
    pub draft: bool,
    pub user_agent: String,
    pub token: String,
}

#[derive(Default)]
pub struct GitHubLog {
    pub minted: Vec<Minted>,
    pub pulls: Vec<RecordedPr>,
    /// Every git request: (repository, service or path, the token it came with).
    pub git: Vec<(String, String, String)>,
    /// Every check that failed (the request was refused as GitHub would refuse it).
    pub violations: Vec<String>,
    /// Every REST request: "METHOD path".
    pub requests: Vec<String>,
}

pub struct GitHubInner {
    pub app_id: u64,
    pub installation_id: u64,
    public_key: PathBuf,
    pub git_root: PathBuf,
    pub port: Mutex<u16>,
    pub log: Mutex<GitHubLog>,
}

/// The GitHub stand-in: REST under `/api/v3` (as GitHub Enterprise Server lays it out, so the
/// forge's `api_url` path prefix is exercised) and git under `/{owner}/{repo}.git`.
pub struct GitHub {
    pub inner: Arc<GitHubInner>,
    pub port: u16,
    /// The App's private key (PEM), made by `openssl genrsa` for this test.
    pub private_key_file: PathBuf,
    _keys: tempfile::TempDir,
    pub repos: tempfile::TempDir,
}

impl GitHub {
    /// A stand-in with a fresh App key; the App is installed on the repositories made with
    /// [`GitHub::repo`].
    pub fn start() -> GitHub {
        let keys = tempfile::tempdir().unwrap();
        let private = keys.path().join("app.pem");
        let public = keys.path().join("app.pub.pem");
        let st = Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(&private)
            .arg("2048")
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(st.success(), "openssl genrsa");
        let st = Command::new("openssl")
            .args(["rsa", "-in"])
            .arg(&private)
            .args(["-pubout", "-out"])
            .arg(&public)
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(st.success(), "openssl rsa -pubout");
        let repos = tempfile::tempdir().unwrap();
        let inner = Arc::new(GitHubInner {
            app_id: 424242,
            installation_id: 9_000_001,
            public_key: public,
            git_root: repos.path().to_path_buf(),
            port: Mutex::new(0),
            log: Mutex::new(GitHubLog::default()),
        });
        let app = Router::new()
            .route(
                "/api/v3/repos/{owner}/{repo}/installation",
                get(gh_installation),
            )
            .route(
                "/api/v3/app/installations/{id}/access_tokens",
                post(gh_access_token),
            )
            .route("/api/v3/repos/{owner}/{repo}", get(gh_repo))
            .route("/api/v3/repos/{owner}/{repo}/pulls", post(gh_pulls))
            .route("/api/v3/installation/token", delete(gh_revoke))
            .fallback(gh_git)
            .with_state(inner.clone());
        let port = serve(app);
        *inner.port.lock().unwrap() = port;
        GitHub {
            inner,
            port,
            private_key_file: private,
            _keys: keys,
            repos,
        }
    }

    /// The `api_url` to configure.
    pub fn api_url(&self) -> String {
        format!("http://127.0.0.1:{}/api/v3", self.port)
    }

    /// A `[[forges]]` entry for this stand-in.
    pub fn forge_toml(&self, name: &str) -> String {
        format!(
            "[[forges]]\nname = \"{name}\"\nkind = \"github\"\napp_id = {}\nprivate_key_file = \"{}\"\napi_url = \"{}\"\n",
            self.inner.app_id,
            self.private_key_file.display(),
            self.api_url()
        )
    }

    /// Makes `owner/name` with `files` on `main`; the App is installed on it.
    pub fn repo(&self, repository: &str, files: &[(&str, &str)]) -> PathBuf {
        make_repo(self.repos.path(), repository, files)
    }

    pub fn bare(&self, repository: &str) -> PathBuf {
        self.repos.path().join(format!("{repository}.git"))
    }

    pub fn log(&self) -> std::sync::MutexGuard<'_, GitHubLog> {
        self.inner.log.lock().unwrap()
    }
}

fn gh_error(status: StatusCode, message: &str) -> Response {
    (
        status,
        axum::Json(json!({
            "message": message,
            "documentation_url": "https://docs.github.com/rest",
            "status": status.as_u16().to_string()
        })),
    )
        .into_response()
}

impl GitHubInner {
    fn violation(&self, what: String) {
        self.log.lock().unwrap().violations.push(what);
    }

    /// GitHub refuses API requests without a `User-Agent` (403).
    fn user_agent(&self, headers: &HeaderMap, route: &str) -> Result<String, Response> {
        match headers.get("user-agent").and_then(|v| v.to_str().ok()) {
            Some(ua) if !ua.trim().is_empty() => Ok(ua.to_string()),
            _ => {
                self.violation(format!("{route}: no User-Agent"));
                Err(gh_error(
                    StatusCode::FORBIDDEN,
                    "Request forbidden by administrative rules. Please make sure your request has a User-Agent header",
                ))
            }
        }
    }

    /// Checks the App's JWT: RS256 signed by the App's key (verified with its public half),
    /// `iss` the App's id, `exp` at most 10 minutes ahead and not past.
    fn check_jwt(&self, headers: &HeaderMap, route: &str) -> Result<(), Response> {
        let refuse = |why: String| {
            self.violation(format!("{route}: {why}"));
            Err(gh_error(
                StatusCode::UNAUTHORIZED,
                "A JSON web token could not be decoded",
            ))
        };
        let Some(jwt) = bearer(headers) else {
            return refuse("no bearer JWT".into());
        };
        let parts: Vec<&str> = jwt.split('.').collect();
        if parts.len() != 3 {
            return refuse("not a JWT".into());
        }
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let dec = |s: &str| b64.decode(s.trim_end_matches('='));
        let (Ok(h), Ok(c), Ok(sig)) = (dec(parts[0]), dec(parts[1]), dec(parts[2])) else {
            return refuse("JWT parts are not base64url".into());
        };
        let h: Value = serde_json::from_slice(&h).unwrap_or_default();
        let c: Value = serde_json::from_slice(&c).unwrap_or_default();
        if h["alg"] != "RS256" {
            return refuse(format!("JWT alg {}", h["alg"]));
        }
        let iss_ok = c["iss"].as_u64() == Some(self.app_id)
            || c["iss"].as_str() == Some(&self.app_id.to_string());
        if !iss_ok {
            return refuse(format!("JWT iss {}", c["iss"]));
        }
        let now = now_secs();
        let (Some(iat), Some(exp)) = (c["iat"].as_i64(), c["exp"].as_i64()) else {
            return refuse("JWT without iat/exp".into());
        };
        if exp <= now || exp > now + 600 + 5 || iat > now + 60 {
            return refuse(format!("JWT times iat={iat} exp={exp} now={now}"));
        }
        // The signature, with the public half of the test's key.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("input"),
            format!("{}.{}", parts[0], parts[1]),
        )
        .unwrap();
        std::fs::write(dir.path().join("sig"), sig).unwrap();
        let ok = Command::new("openssl")
            .args(["dgst", "-sha256", "-verify"])
            .arg(&self.public_key)
            .arg("-signature")
            .arg(dir.path().join("sig"))
            .arg(dir.path().join("input"))
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !ok {
            return refuse("JWT signature does not verify with the App's public key".into());
        }
        Ok(())
    }

    /// The installation token of a request, live and scoped to `repository`.
    fn check_token(&self, token: Option<String>, repository: &str, route: &str) -> Option<String> {
        let Some(token) = token else {
            self.violation(format!("{route}: no token"));
            return None;
        };
        let log = self.log.lock().unwrap();
        let found = log.minted.iter().find(|m| m.token == token).cloned();
        drop(log);
        match found {
            Some(m) if m.revoked => {
                self.violation(format!("{route}: a revoked token"));
                None
            }
            Some(m) if m.repository != repository => {
                self.violation(format!(
                    "{route}: a token of {} used for {repository}",
                    m.repository
                ));
                None
            }
            Some(_) => Some(token),
            None => {
                self.violation(format!("{route}: a token the stand-in never minted"));
                None
            }
        }
    }

    fn repo_exists(&self, repository: &str) -> bool {
        self.git_root
            .join(format!("{repository}.git"))
            .join("HEAD")
            .is_file()
    }

    fn port(&self) -> u16 {
        *self.port.lock().unwrap()
    }
}

async fn gh_installation(
    State(gh): State<Arc<GitHubInner>>,
    UrlPath((owner, repo)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let route = format!("GET /repos/{owner}/{repo}/installation");
    gh.log.lock().unwrap().requests.push(route.clone());
    if let Err(r) = gh.user_agent(&headers, &route) {
        return r;
    }
    if let Err(r) = gh.check_jwt(&headers, &route) {
        return r;
    }
    if !gh.repo_exists(&format!("{owner}/{repo}")) {
        return gh_error(StatusCode::NOT_FOUND, "Not Found");
    }
    let port = gh.port();
    let id = gh.installation_id;
    let base = format!("http://127.0.0.1:{port}/api/v3");
    axum::Json(json!({
        "id": id,
        "account": {
            "login": owner, "id": 1, "node_id": "MDQ6VXNlcjE=", "type": "Organization",
            "avatar_url": "", "gravatar_id": "", "url": format!("{base}/users/{owner}"),
            "html_url": "", "followers_url": "", "following_url": "", "gists_url": "",
            "starred_url": "", "subscriptions_url": "", "organizations_url": "", "repos_url": "",
            "events_url": "", "received_events_url": "", "site_admin": false
        },
        "access_tokens_url": format!("{base}/app/installations/{id}/access_tokens"),
        "repositories_url": format!("{base}/installation/repositories"),
        "html_url": "", "app_id": gh.app_id, "app_slug": "cella-test", "target_id": 1,
        "target_type": "Organization",
        "permissions": {"contents": "write", "pull_requests": "write", "metadata": "read"},
        "events": [], "repository_selection": "selected",
        "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z",
        "single_file_name": null
    }))
    .into_response()
}

async fn gh_access_token(
    State(gh): State<Arc<GitHubInner>>,
    UrlPath(id): UrlPath<u64>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let route = format!("POST /app/installations/{id}/access_tokens");
    gh.log.lock().unwrap().requests.push(route.clone());
    if let Err(r) = gh.user_agent(&headers, &route) {
        return r;
    }
    if let Err(r) = gh.check_jwt(&headers, &route) {
        return r;
    }
    if id != gh.installation_id {
        return gh_error(StatusCode::NOT_FOUND, "Not Found");
    }
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    // Per run, one repository, the least permissions.
    let repos: Vec<String> = v["repositories"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| r.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    if repos.len() != 1 || v.get("repository_ids").is_some() {
        gh.violation(format!(
            "{route}: `repositories` must name exactly the run's one repository, got {}",
            v
        ));
        return gh_error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "The token must be scoped to one repository",
        );
    }
    let perms = v["permissions"].clone();
    let allowed = ["contents", "pull_requests", "metadata"];
    let least = perms.as_object().is_some_and(|o| {
        o.get("contents").and_then(|p| p.as_str()) == Some("write")
            && o.keys().all(|k| allowed.contains(&k.as_str()))
    });
    if !least {
        gh.violation(format!(
            "{route}: permissions must be the least (contents: write, pull_requests: write), got {perms}"
        ));
        return gh_error(StatusCode::UNPROCESSABLE_ENTITY, "Invalid permissions");
    }
    // The App is installed on the repositories of this stand-in's owner(s); the token names the
    // repository without its owner, so it is the installation's repository of that name.
    let name = repos[0].clone();
    let full = std::fs::read_dir(&gh.git_root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .map(|owner| format!("{owner}/{name}"))
        .find(|r| gh.repo_exists(r));
    let Some(full) = full else {
        return gh_error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "There is at least one repository that does not exist or is not accessible to the parent installation.",
        );
    };
    // The new token format: `ghs_`, long, with two dots.
    let token = format!(
        "ghs_{}.{}.{}",
        random_hex(120),
        random_hex(60),
        random_hex(70)
    );
    gh.log.lock().unwrap().minted.push(Minted {
        token: token.clone(),
        repository: full,
        permissions: perms.clone(),
        revoked: false,
    });
    let expires = "2099-01-01T00:00:00Z";
    (
        StatusCode::CREATED,
        axum::Json(json!({
            "token": token, "expires_at": expires, "permissions": perms,
            "repository_selection": "selected"
        })),
    )
        .into_response()
}

async fn gh_repo(
    State(gh): State<Arc<GitHubInner>>,
    UrlPath((owner, repo)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let route = format!("GET /repos/{owner}/{repo}");
    gh.log.lock().unwrap().requests.push(route.clone());
    if let Err(r) = gh.user_agent(&headers, &route) {
        return r;
    }
    let full = format!("{owner}/{repo}");
    if !gh.repo_exists(&full) {
        return gh_error(StatusCode::NOT_FOUND, "Not Found");
    }
    if gh.check_token(bearer(&headers), &full, &route).is_none() {
        return gh_error(StatusCode::UNAUTHORIZED, "Bad credentials");
    }
    let port = gh.port();
    let head = git_try(
        &gh.git_root.join(format!("{full}.git")),
        &["symbolic-ref", "--short", "HEAD"],
    )
    .unwrap_or_else(|| "main".into());
    axum::Json(json!({
        "id": 1296269, "node_id": "MDEwOlJlcG9zaXRvcnkxMjk2MjY5", "name": repo,
        "full_name": full, "private": true, "owner": {"login": owner, "id": 1, "type": "Organization"},
        "html_url": format!("http://127.0.0.1:{port}/{full}"),
        "url": format!("http://127.0.0.1:{port}/api/v3/repos/{full}"),
        "clone_url": format!("http://127.0.0.1:{port}/{full}.git"),
        "default_branch": head.trim(),
        "permissions": {"admin": false, "push": true, "pull": true}
    }))
    .into_response()
}

fn rev(bare: &Path, branch: &str) -> Option<String> {
    git_try(
        bare,
        &["rev-parse", "--verify", &format!("refs/heads/{branch}")],
    )
    .map(|s| s.trim().to_string())
}

async fn gh_pulls(
    State(gh): State<Arc<GitHubInner>>,
    UrlPath((owner, repo)): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let route = format!("POST /repos/{owner}/{repo}/pulls");
    gh.log.lock().unwrap().requests.push(route.clone());
    let ua = match gh.user_agent(&headers, &route) {
        Ok(ua) => ua,
        Err(r) => return r,
    };
    let full = format!("{owner}/{repo}");
    if !gh.repo_exists(&full) {
        return gh_error(StatusCode::NOT_FOUND, "Not Found");
    }
    let Some(token) = gh.check_token(bearer(&headers), &full, &route) else {
        return gh_error(StatusCode::UNAUTHORIZED, "Bad credentials");
    };
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
    let (title, head, base) = (s("title"), s("head"), s("base"));
    let invalid = |field: &str, code: &str| {
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            axum::Json(json!({
                "message": "Validation Failed",
                "errors": [{"resource": "PullRequest", "field": field, "code": code}],
                "documentation_url": "https://docs.github.com/rest/pulls/pulls#create-a-pull-request"
            })),
        )
            .into_response()
    };
    if title.trim().is_empty() {
        gh.violation(format!("{route}: no title"));
        return invalid("title", "missing_field");
    }
    if v["draft"] != true {
        gh.violation(format!("{route}: `draft` is {}, not true", v["draft"]));
    }
    let bare = gh.git_root.join(format!("{full}.git"));
    // `head` is a branch name or `owner:branch`.
    let head_branch = head
        .split_once(':')
        .map(|(_, b)| b.to_string())
        .unwrap_or(head.clone());
    let Some(head_sha) = rev(&bare, &head_branch) else {
        gh.violation(format!("{route}: head {head} is not a branch"));
        return invalid("head", "invalid");
    };
    let Some(base_sha) = rev(&bare, &base) else {
        gh.violation(format!("{route}: base {base} is not a branch"));
        return invalid("base", "invalid");
    };
    if head_sha == base_sha {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            axum::Json(json!({
                "message": "Validation Failed",
                "errors": [{"resource": "PullRequest", "code": "custom",
                    "message": format!("No commits between {base} and {head_branch}")}],
                "documentation_url": "https://docs.github.com/rest/pulls/pulls#create-a-pull-request"
            })),
        )
            .into_response();
    }
    let port = gh.port();
    let mut log = gh.log.lock().unwrap();
    let number = log.pulls.len() as u64 + 1;
    log.pulls.push(RecordedPr {
        number,
        repository: full.clone(),
        title: title.clone(),
        body: s("body"),
        head: head_branch.clone(),
        base: base.clone(),
        draft: v["draft"] == true,
        user_agent: ua,
        token,
    });
    drop(log);
    (
        StatusCode::CREATED,
        axum::Json(json!({
            "id": 1000 + number, "node_id": "PR_kwDOtest", "number": number,
            "url": format!("http://127.0.0.1:{port}/api/v3/repos/{full}/pulls/{number}"),
            "html_url": format!("http://127.0.0.1:{port}/{full}/pull/{number}"),
            "state": "open", "draft": v["draft"] == true, "title": title, "body": v["body"],
            "locked": false, "merged": false, "merged_at": null,
            "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z",
            "head": {"ref": head_branch, "sha": head_sha, "label": format!("{owner}:{head_branch}")},
            "base": {"ref": base, "sha": base_sha, "label": format!("{owner}:{base}")},
            "user": {"login": "cella-test[bot]", "id": 2}
        })),
    )
        .into_response()
}

async fn gh_revoke(State(gh): State<Arc<GitHubInner>>, headers: HeaderMap) -> Response {
    let route = "DELETE /installation/token".to_string();
    gh.log.lock().unwrap().requests.push(route.clone());
    if let Err(r) = gh.user_agent(&headers, &route) {
        return r;
    }
    let token = bearer(&headers);
    let mut log = gh.log.lock().unwrap();
    match log
        .minted
        .iter_mut()
        .find(|m| Some(&m.token) == token.as_ref() && !m.revoked)
    {
        Some(m) => {
            m.revoked = true;
            StatusCode::NO_CONTENT.into_response()
        }
        None => {
            log.violations
                .push(format!("{route}: no live installation token"));
            drop(log);
            gh_error(StatusCode::UNAUTHORIZED, "Bad credentials")
        }
    }
}

async fn gh_git(
    State(gh): State<Arc<GitHubInner>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(repository) = repo_of_git_path(uri.path()) else {
        return gh_error(StatusCode::NOT_FOUND, "Not Found");
    };
    let what = uri
        .query()
        .and_then(|q| q.strip_prefix("service="))
        .map(String::from)
        .unwrap_or_else(|| uri.path().rsplit('/').next().unwrap_or("").to_string());
    // Git asks anonymously first; 401 with a challenge makes it send its credential.
    let Some((user, pass)) = basic(&headers) else {
        return unauthorized_git("GitHub");
    };
    if user != "x-access-token" {
        gh.violation(format!("git {repository}: basic user {user:?}"));
        return unauthorized_git("GitHub");
    }
    let route = format!("git {what} {repository}");
    if gh
        .check_token(Some(pass.clone()), &repository, &route)
        .is_none()
    {
        return unauthorized_git("GitHub");
    }
    gh.log.lock().unwrap().git.push((repository, what, pass));
    git_cgi(
        &gh.git_root,
        &method,
        &uri,
        &headers,
        body,
        "x-access-token",
    )
    .await
}

// ---------------------------------------------------------------------------------------------
// GitLab

#[derive(Debug, Clone)]
pub struct RecordedMr {
    pub iid: u64,
    pub project: String,
    pub title: String,
    pub description: String,
    pub source_branch: String,
    pub target_branch: String,
}

#[derive(Default)]
pub struct GitLabLog {
    pub merge_requests: Vec<RecordedMr>,
    pub git: Vec<(String, String)>,
    pub violations: Vec<String>,
    pub requests: Vec<String>,
}

pub struct GitLabInner {
    pub token: String,
    pub git_root: PathBuf,
    pub port: Mutex<u16>,
    pub log: Mutex<GitLabLog>,
}

/// The GitLab stand-in: REST under `/api/v4`, git under `/{group}/{name}.git`, one personal
/// (or project) access token.
pub struct GitLab {
    pub inner: Arc<GitLabInner>,
    pub port: u16,
    pub repos: tempfile::TempDir,
}

impl GitLab {
    pub fn start() -> GitLab {
        let repos = tempfile::tempdir().unwrap();
        let inner = Arc::new(GitLabInner {
            token: format!("glpat-{}", random_hex(10)),
            git_root: repos.path().to_path_buf(),
            port: Mutex::new(0),
            log: Mutex::new(GitLabLog::default()),
        });
        let app = Router::new()
            .route("/api/v4/projects/{id}", get(gl_project))
            .route("/api/v4/projects/{id}/merge_requests", post(gl_mr))
            .fallback(gl_git)
            .with_state(inner.clone());
        let port = serve(app);
        *inner.port.lock().unwrap() = port;
        GitLab { inner, port, repos }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn forge_toml(&self, name: &str) -> String {
        format!(
            "[[forges]]\nname = \"{name}\"\nkind = \"gitlab\"\nurl = \"{}\"\ntoken = \"{}\"\n",
            self.url(),
            self.inner.token
        )
    }

    pub fn repo(&self, repository: &str, files: &[(&str, &str)]) -> PathBuf {
        make_repo(self.repos.path(), repository, files)
    }

    pub fn bare(&self, repository: &str) -> PathBuf {
        self.repos.path().join(format!("{repository}.git"))
    }

    pub fn log(&self) -> std::sync::MutexGuard<'_, GitLabLog> {
        self.inner.log.lock().unwrap()
    }
}

impl GitLabInner {
    /// GitLab takes `PRIVATE-TOKEN` (or `Authorization: Bearer`); anything else is 401.
    fn check(&self, headers: &HeaderMap, route: &str) -> Result<(), Response> {
        let tok = headers
            .get("private-token")
            .and_then(|v| v.to_str().ok())
            .map(String::from)
            .or_else(|| bearer(headers));
        if tok.as_deref() == Some(self.token.as_str()) {
            return Ok(());
        }
        self.log
            .lock()
            .unwrap()
            .violations
            .push(format!("{route}: no or a wrong PRIVATE-TOKEN"));
        Err((
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"message": "401 Unauthorized"})),
        )
            .into_response())
    }

    fn project_exists(&self, path: &str) -> bool {
        self.git_root
            .join(format!("{path}.git"))
            .join("HEAD")
            .is_file()
    }
}

fn gl_not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({"message": "404 Project Not Found"})),
    )
        .into_response()
}

async fn gl_project(
    State(gl): State<Arc<GitLabInner>>,
    UrlPath(id): UrlPath<String>,
    headers: HeaderMap,
) -> Response {
    let route = format!("GET /projects/{id}");
    gl.log.lock().unwrap().requests.push(route.clone());
    if let Err(r) = gl.check(&headers, &route) {
        return r;
    }
    // `id` is the URL-encoded path (`group%2Fname`), decoded by the router.
    if !gl.project_exists(&id) {
        return gl_not_found();
    }
    let port = *gl.port.lock().unwrap();
    let head = git_try(
        &gl.git_root.join(format!("{id}.git")),
        &["symbolic-ref", "--short", "HEAD"],
    )
    .unwrap_or_else(|| "main".into());
    let name = id.rsplit('/').next().unwrap_or(&id).to_string();
    axum::Json(json!({
        "id": 77, "name": name, "path": name, "path_with_namespace": id,
        "default_branch": head.trim(),
        "http_url_to_repo": format!("http://127.0.0.1:{port}/{id}.git"),
        "ssh_url_to_repo": format!("git@127.0.0.1:{id}.git"),
        "web_url": format!("http://127.0.0.1:{port}/{id}"),
        "visibility": "private"
    }))
    .into_response()
}

async fn gl_mr(
    State(gl): State<Arc<GitLabInner>>,
    UrlPath(id): UrlPath<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let route = format!("POST /projects/{id}/merge_requests");
    gl.log.lock().unwrap().requests.push(route.clone());
    if let Err(r) = gl.check(&headers, &route) {
        return r;
    }
    // The project by its path, or by the numeric id `GET /projects/:id` answered.
    let project = if id == "77" {
        std::fs::read_dir(&gl.git_root)
            .ok()
            .and_then(|_| {
                let log = gl.log.lock().unwrap();
                log.requests
                    .iter()
                    .rev()
                    .find_map(|r| r.strip_prefix("GET /projects/").map(String::from))
            })
            .unwrap_or_default()
    } else {
        id.clone()
    };
    if !gl.project_exists(&project) {
        return gl_not_found();
    }
    let v: Value = if headers
        .get("content-type")
        .and_then(|c| c.to_str().ok())
        .is_some_and(|c| c.starts_with("application/x-www-form-urlencoded"))
    {
        let mut m = serde_json::Map::new();
        for (k, val) in url_form(&body) {
            m.insert(k, Value::String(val));
        }
        Value::Object(m)
    } else {
        serde_json::from_slice(&body).unwrap_or(Value::Null)
    };
    let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
    let (title, source, target) = (s("title"), s("source_branch"), s("target_branch"));
    let bad = |m: &str| {
        (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"message": {"base": [m]}})),
        )
            .into_response()
    };
    if !title.starts_with("Draft:") {
        gl.log.lock().unwrap().violations.push(format!(
            "{route}: title {title:?} does not start with Draft:"
        ));
    }
    let bare = gl.git_root.join(format!("{project}.git"));
    let (Some(src_sha), Some(_)) = (rev(&bare, &source), rev(&bare, &target)) else {
        gl.log
            .lock()
            .unwrap()
            .violations
            .push(format!("{route}: branches {source:?} -> {target:?}"));
        return bad("Source branch or target branch does not exist");
    };
    let port = *gl.port.lock().unwrap();
    let mut log = gl.log.lock().unwrap();
    let iid = log.merge_requests.len() as u64 + 1;
    log.merge_requests.push(RecordedMr {
        iid,
        project: project.clone(),
        title: title.clone(),
        description: s("description"),
        source_branch: source.clone(),
        target_branch: target.clone(),
    });
    drop(log);
    let draft = title.starts_with("Draft:");
    (
        StatusCode::CREATED,
        axum::Json(json!({
            "id": 5000 + iid, "iid": iid, "project_id": 77, "title": title,
            "description": v["description"], "state": "opened",
            "source_branch": source, "target_branch": target, "sha": src_sha,
            "draft": draft, "work_in_progress": draft,
            "web_url": format!("http://127.0.0.1:{port}/{project}/-/merge_requests/{iid}"),
            "created_at": "2026-01-01T00:00:00Z"
        })),
    )
        .into_response()
}

fn url_form(body: &[u8]) -> Vec<(String, String)> {
    let dec = |s: &str| {
        let s = s.replace('+', " ");
        let b = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' && i + 2 < b.len() {
                if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                    out.push(v);
                    i += 3;
                    continue;
                }
            }
            out.push(b[i]);
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    String::from_utf8_lossy(body)
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (dec(k), dec(v)))
        .collect()
}

async fn gl_git(
    State(gl): State<Arc<GitLabInner>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(project) = repo_of_git_path(uri.path()) else {
        return gl_not_found();
    };
    let Some((user, pass)) = basic(&headers) else {
        return unauthorized_git("GitLab");
    };
    if user != "oauth2" || pass != gl.token {
        gl.log.lock().unwrap().violations.push(format!(
            "git {project}: basic user {user:?} or a wrong token"
        ));
        return unauthorized_git("GitLab");
    }
    let what = uri
        .query()
        .and_then(|q| q.strip_prefix("service="))
        .map(String::from)
        .unwrap_or_else(|| uri.path().rsplit('/').next().unwrap_or("").to_string());
    gl.log.lock().unwrap().git.push((project, what));
    git_cgi(&gl.git_root, &method, &uri, &headers, body, "oauth2").await
}
