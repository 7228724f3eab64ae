//! Forges: where repositories live and pull requests are opened.
//!
//! [`Forge::open`] resolves `owner/name` to a clone URL, its default branch and a credential for
//! this one run (a GitHub App installation token scoped to the one repository with the least
//! permissions, revoked by [`Forge::close`]; a GitLab or fine-grained token; nothing for local
//! paths). [`Forge::open_pull_request`] opens the draft. Every request to a forge's API carries a
//! `User-Agent`. A credential is never logged, never put in argv, never sent into a sandbox.
//!
//! - `git`: `url_template` with `{repository}` replaced; a local path must exist (as given, or
//!   with `.git` appended), a URL is checked by git. No credential, no pull request.
//! - `github`, App: an RS256 JWT (`iat` a minute back, `exp` nine minutes on, `iss` the App id)
//!   finds the installation (`GET /repos/{o}/{r}/installation`) and mints a token
//!   (`POST /app/installations/{id}/access_tokens` with `repositories: [name]` and
//!   `contents: write, pull_requests: write, metadata: read`); `GET /repos/{o}/{r}` gives
//!   `default_branch` and `clone_url`; git authenticates as `x-access-token:<token>`; the draft
//!   is `POST /repos/{o}/{r}/pulls` with `draft: true` (retried as a normal pull request where
//!   the repository's plan has no drafts); [`Forge::close`] revokes the token
//!   (`DELETE /installation/token`). With `token` (a fine-grained personal token) the same
//!   calls, no minting, no revoking. Every request: `User-Agent: cella`,
//!   `Accept: application/vnd.github+json`, `X-GitHub-Api-Version: 2022-11-28`. `api_url`
//!   (default `https://api.github.com`) points at GitHub Enterprise Server (`.../api/v3`).
//! - `gitlab`: `GET {url}/api/v4/projects/{path}` (URL-encoded, nested groups allowed) with
//!   `PRIVATE-TOKEN` gives `default_branch`, `http_url_to_repo` and `id`; git authenticates as
//!   `oauth2:<token>`; the draft is a merge request titled `Draft: ...`.
//!
//! A 403 or 404 on the repository is [`ForgeError::NotFound`]; other refusals are
//! [`ForgeError::Refused`], 5xx/429 and network failures [`ForgeError::Unreachable`]. Their
//! details are one line with every token removed.

use crate::config::{ForgeConfig, ForgeKind};
use cella_types::PullRequest;

#[derive(Debug, thiserror::Error)]
pub enum ForgeError {
    /// The forge cannot read the repository (missing, or the credential has no access).
    #[error("repository {0} not found or not readable by the forge")]
    NotFound(String),
    /// The forge refused (auth, permissions, validation); the detail is the forge's own message,
    /// one line, without secrets.
    #[error("the forge refused: {0}")]
    Refused(String),
    /// The forge could not be reached or answered garbage.
    #[error("the forge is unreachable: {0}")]
    Unreachable(String),
    /// The forge's configuration is wrong (unreadable key file, ...).
    #[error("forge configuration: {0}")]
    Config(String),
}

/// `owner/name` (GitLab: `group/subgroup/name`), checked: each part 1-100 of `[A-Za-z0-9._-]`,
/// not starting with `.` or `-`, not `..`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoRef {
    pub parts: Vec<String>,
}

/// The most parts of a nested (GitLab) repository path.
pub const MAX_NESTED_PARTS: usize = 21;

impl RepoRef {
    /// `Err` says what is wrong, for a 400 naming `repository`.
    pub fn parse(s: &str, nested: bool) -> Result<RepoRef, String> {
        let parts: Vec<&str> = s.split('/').collect();
        if nested {
            if parts.len() < 2 || parts.len() > MAX_NESTED_PARTS {
                return Err(format!(
                    "repository must be \"group/name\" or \"group/subgroup/.../name\" (2 to {MAX_NESTED_PARTS} parts)"
                ));
            }
        } else if parts.len() != 2 {
            return Err("repository must be \"owner/name\"".into());
        }
        for p in &parts {
            let ok = !p.is_empty()
                && p.len() <= 100
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
                && !p.starts_with(['.', '-'])
                && *p != "..";
            if !ok {
                return Err(
                    "each part of repository must be 1-100 of letters, digits, '.', '_' or '-', \
                     not starting with '.' or '-'"
                        .into(),
                );
            }
        }
        Ok(RepoRef {
            parts: parts.into_iter().map(String::from).collect(),
        })
    }

    pub fn as_path(&self) -> String {
        self.parts.join("/")
    }

    /// The last part (GitHub's repository name).
    pub fn name(&self) -> &str {
        self.parts.last().map(String::as_str).unwrap_or("")
    }

    /// Everything but the last part (GitHub's owner, GitLab's group path).
    pub fn owner(&self) -> String {
        self.parts[..self.parts.len().saturating_sub(1)].join("/")
    }
}

impl std::fmt::Display for RepoRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.as_path())
    }
}

/// A git credential for one run. `Debug` never shows it.
#[derive(Clone)]
pub struct GitCredential {
    /// The HTTP basic user (`x-access-token` for GitHub, `oauth2` for GitLab).
    pub user: String,
    pub secret: String,
}

impl std::fmt::Debug for GitCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GitCredential({}:<redacted>)", self.user)
    }
}

/// What [`Forge::open`] found for one run.
#[derive(Debug, Clone)]
pub struct Access {
    pub repo: RepoRef,
    /// What git clones from and pushes to (a URL or a local path), without credentials in it.
    pub clone_url: String,
    pub default_branch: Option<String>,
    pub credential: Option<GitCredential>,
}

/// What a draft pull request says.
#[derive(Debug, Clone)]
pub struct PullRequestSpec {
    pub title: String,
    pub body: String,
    /// The run's branch.
    pub head: String,
    pub base: String,
}

/// A configured forge, ready to use.
#[derive(Debug, Clone)]
pub struct Forge {
    pub config: ForgeConfig,
    http: reqwest::Client,
    app_key: Option<AppKey>,
}

/// A GitHub App's private key. `Debug` never shows it.
#[derive(Clone)]
struct AppKey(std::sync::Arc<jsonwebtoken::EncodingKey>);

impl std::fmt::Debug for AppKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AppKey(<redacted>)")
    }
}

/// The `User-Agent` of every request to a forge.
pub const USER_AGENT: &str = "cella";
const GITHUB_API: &str = "https://api.github.com";
const GITHUB_API_VERSION: &str = "2022-11-28";
/// The most of a forge's error message kept in an error.
const MAX_DETAIL: usize = 300;

/// A forge's answer, read whole (bounded).
struct Reply {
    status: reqwest::StatusCode,
    json: serde_json::Value,
    /// GitHub's rate limit answer (a 403 or 429 with no requests left or a `retry-after`).
    rate_limited: bool,
}

impl Forge {
    /// Reads the key file (github App) and checks the config; `Err` at server start.
    pub fn from_config(config: ForgeConfig) -> Result<Forge, ForgeError> {
        config.validate().map_err(ForgeError::Config)?;
        let app_key = match (&config.kind, &config.private_key_file) {
            (ForgeKind::Github, Some(path)) => {
                let pem = std::fs::read(path).map_err(|e| {
                    ForgeError::Config(format!(
                        "forge {:?}: cannot read private_key_file {}: {e}",
                        config.name,
                        path.display()
                    ))
                })?;
                let key = jsonwebtoken::EncodingKey::from_rsa_pem(&pem).map_err(|_| {
                    ForgeError::Config(format!(
                        "forge {:?}: private_key_file {} is not an RSA private key in PEM",
                        config.name,
                        path.display()
                    ))
                })?;
                Some(AppKey(std::sync::Arc::new(key)))
            }
            _ => None,
        };
        // Redirects are followed only within the same origin: a token header (`PRIVATE-TOKEN`
        // is not one reqwest strips by itself) never goes to another host.
        let policy = reqwest::redirect::Policy::custom(|attempt| {
            let same = attempt.previous().first().is_some_and(|first| {
                first.scheme() == attempt.url().scheme()
                    && first.host_str() == attempt.url().host_str()
                    && first.port_or_known_default() == attempt.url().port_or_known_default()
            });
            if same && attempt.previous().len() < 5 {
                attempt.follow()
            } else {
                attempt.stop()
            }
        });
        let http = reqwest::Client::builder()
            .redirect(policy)
            .user_agent(USER_AGENT)
            .connect_timeout(std::time::Duration::from_secs(10))
            .timeout(std::time::Duration::from_secs(60))
            .build()
            .map_err(|e| ForgeError::Config(format!("HTTP client: {e}")))?;
        Ok(Forge {
            config,
            http,
            app_key,
        })
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn kind(&self) -> ForgeKind {
        self.config.kind
    }

    /// Whether `repository` may have more than two parts on this forge (GitLab groups).
    pub fn nested_names(&self) -> bool {
        self.config.kind == ForgeKind::Gitlab
    }

    /// Resolves the repository and mints this run's credential.
    pub async fn open(&self, repo: &RepoRef) -> Result<Access, ForgeError> {
        if repo.parts.len() != 2 && !self.nested_names() {
            return Err(ForgeError::NotFound(repo.as_path()));
        }
        match self.config.kind {
            ForgeKind::Git => self.open_git(repo),
            ForgeKind::Github => self.open_github(repo).await,
            ForgeKind::Gitlab => self.open_gitlab(repo).await,
        }
    }

    /// Opens the draft pull (merge) request; `Ok(None)` on a plain `git` forge.
    pub async fn open_pull_request(
        &self,
        access: &Access,
        spec: &PullRequestSpec,
    ) -> Result<Option<PullRequest>, ForgeError> {
        match self.config.kind {
            ForgeKind::Git => Ok(None),
            ForgeKind::Github => self.github_pull_request(access, spec).await.map(Some),
            ForgeKind::Gitlab => self.gitlab_merge_request(access, spec).await.map(Some),
        }
    }

    /// Revokes the run's credential (GitHub App tokens); best effort, logs a failure.
    pub async fn close(&self, access: &Access) {
        if self.config.kind != ForgeKind::Github || self.app_key.is_none() {
            return;
        }
        let Some(cred) = &access.credential else {
            return;
        };
        let url = format!("{}/installation/token", self.github_api());
        let res = self
            .github_request(reqwest::Method::DELETE, &url, &cred.secret)
            .send()
            .await;
        match res {
            Ok(r) if r.status().is_success() => {}
            Ok(r) => tracing::warn!(
                forge = %self.config.name,
                repository = %access.repo,
                status = %r.status(),
                "revoking the run's installation token failed"
            ),
            Err(e) => tracing::warn!(
                forge = %self.config.name,
                repository = %access.repo,
                error = %one_line_err(&e, &[&cred.secret]),
                "revoking the run's installation token failed"
            ),
        }
    }

    // ---- git ----

    fn open_git(&self, repo: &RepoRef) -> Result<Access, ForgeError> {
        let template = self
            .config
            .url_template
            .as_deref()
            .ok_or_else(|| ForgeError::Config("a git forge needs url_template".into()))?;
        let url = template.replace("{repository}", &repo.as_path());
        let clone_url = if url.starts_with('/') {
            let p = std::path::Path::new(&url);
            let with_git = format!("{url}.git");
            if p.exists() {
                url
            } else if !url.ends_with(".git") && std::path::Path::new(&with_git).exists() {
                with_git
            } else {
                return Err(ForgeError::NotFound(repo.as_path()));
            }
        } else {
            url
        };
        Ok(Access {
            repo: repo.clone(),
            clone_url,
            default_branch: None,
            credential: None,
        })
    }

    // ---- GitHub ----

    fn github_api(&self) -> String {
        self.config
            .api_url
            .as_deref()
            .unwrap_or(GITHUB_API)
            .trim_end_matches('/')
            .to_string()
    }

    fn github_request(
        &self,
        method: reqwest::Method,
        url: &str,
        bearer: &str,
    ) -> reqwest::RequestBuilder {
        self.http
            .request(method, url)
            .header(reqwest::header::USER_AGENT, USER_AGENT)
            .header(reqwest::header::ACCEPT, "application/vnd.github+json")
            .header("X-GitHub-Api-Version", GITHUB_API_VERSION)
            .bearer_auth(bearer)
    }

    /// The App's JWT: RS256, `iat` a minute ago (clock drift), `exp` in nine minutes.
    fn app_jwt(&self) -> Result<String, ForgeError> {
        let key = self
            .app_key
            .as_ref()
            .ok_or_else(|| ForgeError::Config("no App key".into()))?;
        let app_id = self
            .config
            .app_id
            .ok_or_else(|| ForgeError::Config("no app_id".into()))?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let claims = serde_json::json!({
            "iat": now.saturating_sub(60),
            "exp": now + 540,
            "iss": app_id.to_string(),
        });
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256),
            &claims,
            &key.0,
        )
        .map_err(|e| ForgeError::Config(format!("signing the App's JWT: {e}")))
    }

    async fn open_github(&self, repo: &RepoRef) -> Result<Access, ForgeError> {
        let api = self.github_api();
        let (o, r) = (repo.owner(), repo.name().to_string());
        let (token, minted) = if self.app_key.is_some() {
            let jwt = self.app_jwt()?;
            let url = format!("{api}/repos/{o}/{r}/installation");
            let reply = send(
                self.github_request(reqwest::Method::GET, &url, &jwt),
                &[&jwt],
            )
            .await?;
            match reply.status.as_u16() {
                200 => {}
                403 | 404 if !reply.rate_limited => {
                    return Err(ForgeError::NotFound(repo.as_path()))
                }
                _ => return Err(reply.error("finding the App's installation", &[&jwt])),
            }
            let id = reply
                .json
                .get("id")
                .and_then(|v| v.as_u64())
                .ok_or_else(|| {
                    ForgeError::Unreachable("the installation has no numeric id".into())
                })?;
            let url = format!("{api}/app/installations/{id}/access_tokens");
            let body = serde_json::json!({
                "repositories": [r],
                "permissions": {
                    "contents": "write",
                    "pull_requests": "write",
                    "metadata": "read",
                },
            });
            let reply = send(
                self.github_request(reqwest::Method::POST, &url, &jwt)
                    .json(&body),
                &[&jwt],
            )
            .await?;
            if !reply.status.is_success() {
                return Err(reply.error("minting an installation token", &[&jwt]));
            }
            let token = reply
                .json
                .get("token")
                .and_then(|v| v.as_str())
                .filter(|t| !t.is_empty())
                .ok_or_else(|| ForgeError::Unreachable("the token answer has no token".into()))?
                .to_string();
            (token, true)
        } else {
            let token = self
                .config
                .token
                .clone()
                .ok_or_else(|| ForgeError::Config("no token".into()))?;
            (token, false)
        };
        let access = self.github_repository(repo, &token).await;
        if access.is_err() && minted {
            // Do not leave a live token behind when the run does not go ahead.
            let revoke = Access {
                repo: repo.clone(),
                clone_url: String::new(),
                default_branch: None,
                credential: Some(GitCredential {
                    user: "x-access-token".into(),
                    secret: token.clone(),
                }),
            };
            self.close(&revoke).await;
        }
        access
    }

    async fn github_repository(&self, repo: &RepoRef, token: &str) -> Result<Access, ForgeError> {
        let url = format!(
            "{}/repos/{}/{}",
            self.github_api(),
            repo.owner(),
            repo.name()
        );
        let reply = send(
            self.github_request(reqwest::Method::GET, &url, token),
            &[token],
        )
        .await?;
        match reply.status.as_u16() {
            200 => {}
            403 | 404 if !reply.rate_limited => return Err(ForgeError::NotFound(repo.as_path())),
            _ => return Err(reply.error("reading the repository", &[token])),
        }
        let clone_url = reply
            .json
            .get("clone_url")
            .and_then(|v| v.as_str())
            .filter(|u| is_clean_http_url(u))
            .ok_or_else(|| {
                ForgeError::Unreachable(
                    "the repository has no clone_url that is an http(s) URL without credentials"
                        .into(),
                )
            })?
            .to_string();
        let default_branch = reply
            .json
            .get("default_branch")
            .and_then(|v| v.as_str())
            .map(String::from);
        Ok(Access {
            repo: repo.clone(),
            clone_url,
            default_branch,
            credential: Some(GitCredential {
                user: "x-access-token".into(),
                secret: token.to_string(),
            }),
        })
    }

    async fn github_pull_request(
        &self,
        access: &Access,
        spec: &PullRequestSpec,
    ) -> Result<PullRequest, ForgeError> {
        let cred = access
            .credential
            .as_ref()
            .ok_or_else(|| ForgeError::Config("no credential for the pull request".into()))?;
        let url = format!(
            "{}/repos/{}/{}/pulls",
            self.github_api(),
            access.repo.owner(),
            access.repo.name()
        );
        let mut draft = true;
        loop {
            let body = serde_json::json!({
                "title": spec.title,
                "body": spec.body,
                "head": spec.head,
                "base": spec.base,
                "draft": draft,
            });
            let reply = send(
                self.github_request(reqwest::Method::POST, &url, &cred.secret)
                    .json(&body),
                &[&cred.secret],
            )
            .await?;
            if reply.status.is_success() {
                let number = reply.json.get("number").and_then(|v| v.as_u64());
                let html = reply.json.get("html_url").and_then(|v| v.as_str());
                let (Some(number), Some(html)) = (number, html) else {
                    return Err(ForgeError::Unreachable(
                        "the pull request answer has no number or html_url".into(),
                    ));
                };
                return Ok(PullRequest {
                    number,
                    url: html.to_string(),
                    draft: reply
                        .json
                        .get("draft")
                        .and_then(|v| v.as_bool())
                        .unwrap_or(draft),
                });
            }
            // Drafts are not available on some plans: open it as a normal pull request then.
            let msg = reply.message();
            if draft
                && reply.status.as_u16() == 422
                && msg
                    .to_ascii_lowercase()
                    .contains("draft pull requests are not supported")
            {
                draft = false;
                continue;
            }
            return Err(reply.error("opening the pull request", &[&cred.secret]));
        }
    }

    // ---- GitLab ----

    fn gitlab_project_url(&self, repo: &RepoRef) -> String {
        format!(
            "{}/api/v4/projects/{}",
            self.config
                .url
                .as_deref()
                .unwrap_or("")
                .trim_end_matches('/'),
            repo.as_path().replace('/', "%2F")
        )
    }

    fn gitlab_token(&self) -> Result<&str, ForgeError> {
        self.config
            .token
            .as_deref()
            .ok_or_else(|| ForgeError::Config("no token".into()))
    }

    fn gitlab_request(
        &self,
        method: reqwest::Method,
        url: &str,
    ) -> Result<reqwest::RequestBuilder, ForgeError> {
        Ok(self
            .http
            .request(method, url)
            .header(reqwest::header::USER_AGENT, USER_AGENT)
            .header(reqwest::header::ACCEPT, "application/json")
            .header("PRIVATE-TOKEN", self.gitlab_token()?))
    }

    /// `GET /projects/:path`: the project's id, default branch and HTTP clone URL.
    async fn gitlab_project(
        &self,
        repo: &RepoRef,
    ) -> Result<(u64, Option<String>, String), ForgeError> {
        let token = self.gitlab_token()?;
        let url = self.gitlab_project_url(repo);
        let reply = send(self.gitlab_request(reqwest::Method::GET, &url)?, &[token]).await?;
        match reply.status.as_u16() {
            200 => {}
            403 | 404 if !reply.rate_limited => return Err(ForgeError::NotFound(repo.as_path())),
            _ => return Err(reply.error("reading the project", &[token])),
        }
        let id = reply
            .json
            .get("id")
            .and_then(|v| v.as_u64())
            .ok_or_else(|| ForgeError::Unreachable("the project has no numeric id".into()))?;
        let clone_url = reply
            .json
            .get("http_url_to_repo")
            .and_then(|v| v.as_str())
            .filter(|u| is_clean_http_url(u))
            .ok_or_else(|| {
                ForgeError::Unreachable(
                    "the project has no http_url_to_repo that is an http(s) URL without credentials"
                        .into(),
                )
            })?
            .to_string();
        let default_branch = reply
            .json
            .get("default_branch")
            .and_then(|v| v.as_str())
            .map(String::from);
        Ok((id, default_branch, clone_url))
    }

    async fn open_gitlab(&self, repo: &RepoRef) -> Result<Access, ForgeError> {
        let (_, default_branch, clone_url) = self.gitlab_project(repo).await?;
        Ok(Access {
            repo: repo.clone(),
            clone_url,
            default_branch,
            credential: Some(GitCredential {
                user: "oauth2".into(),
                secret: self.gitlab_token()?.to_string(),
            }),
        })
    }

    async fn gitlab_merge_request(
        &self,
        access: &Access,
        spec: &PullRequestSpec,
    ) -> Result<PullRequest, ForgeError> {
        let token = self.gitlab_token()?;
        let (id, _, _) = self.gitlab_project(&access.repo).await?;
        let url = format!(
            "{}/api/v4/projects/{id}/merge_requests",
            self.config
                .url
                .as_deref()
                .unwrap_or("")
                .trim_end_matches('/')
        );
        let body = serde_json::json!({
            "source_branch": spec.head,
            "target_branch": spec.base,
            "title": format!("Draft: {}", spec.title),
            "description": spec.body,
        });
        let reply = send(
            self.gitlab_request(reqwest::Method::POST, &url)?
                .json(&body),
            &[token],
        )
        .await?;
        if !reply.status.is_success() {
            return Err(reply.error("opening the merge request", &[token]));
        }
        let number = reply.json.get("iid").and_then(|v| v.as_u64());
        let web = reply.json.get("web_url").and_then(|v| v.as_str());
        let (Some(number), Some(web)) = (number, web) else {
            return Err(ForgeError::Unreachable(
                "the merge request answer has no iid or web_url".into(),
            ));
        };
        Ok(PullRequest {
            number,
            url: web.to_string(),
            draft: reply
                .json
                .get("draft")
                .and_then(|v| v.as_bool())
                .unwrap_or(true),
        })
    }
}

/// An `http(s)://` URL without `user@` and without spaces or control characters.
fn is_clean_http_url(u: &str) -> bool {
    let Some(rest) = u
        .strip_prefix("https://")
        .or_else(|| u.strip_prefix("http://"))
    else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    !authority.is_empty()
        && !authority.contains('@')
        && !u.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// One line, secrets replaced, redacted, bounded.
fn clean(s: &str, secrets: &[&str]) -> String {
    let mut s = s.to_string();
    for secret in secrets {
        if !secret.is_empty() {
            s = s.replace(secret, "***");
        }
    }
    let s = crate::failure::redact(&crate::failure::one_line(&s));
    crate::failure::cut_chars(s.trim(), MAX_DETAIL)
}

fn one_line_err(e: &reqwest::Error, secrets: &[&str]) -> String {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    clean(&msg, secrets)
}

/// Sends a request and reads its JSON answer (at most 4 MiB; not JSON: `null`).
async fn send(req: reqwest::RequestBuilder, secrets: &[&str]) -> Result<Reply, ForgeError> {
    let mut res = req
        .send()
        .await
        .map_err(|e| ForgeError::Unreachable(one_line_err(&e, secrets)))?;
    let status = res.status();
    let h = res.headers();
    let rate_limited = matches!(status.as_u16(), 403 | 429)
        && (h.get("retry-after").is_some()
            || h.get("x-ratelimit-remaining").and_then(|v| v.to_str().ok()) == Some("0"));
    let mut body = Vec::new();
    while let Some(chunk) = res
        .chunk()
        .await
        .map_err(|e| ForgeError::Unreachable(one_line_err(&e, secrets)))?
    {
        body.extend_from_slice(&chunk);
        if body.len() > 4 << 20 {
            return Err(ForgeError::Unreachable("the answer is too large".into()));
        }
    }
    let json = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    Ok(Reply {
        status,
        json,
        rate_limited,
    })
}

impl Reply {
    /// The forge's own message (GitHub `message` plus `errors[].message`; GitLab `message` or
    /// `error`, a string or an object).
    fn message(&self) -> String {
        let mut parts = Vec::new();
        for key in ["message", "error"] {
            match self.json.get(key) {
                Some(serde_json::Value::String(s)) => parts.push(s.clone()),
                Some(v @ (serde_json::Value::Object(_) | serde_json::Value::Array(_))) => {
                    parts.push(v.to_string())
                }
                _ => {}
            }
        }
        if let Some(errors) = self.json.get("errors").and_then(|v| v.as_array()) {
            for e in errors.iter().take(3) {
                if let Some(m) = e.get("message").and_then(|m| m.as_str()) {
                    parts.push(m.to_string());
                } else if let Some(c) = e.get("code").and_then(|m| m.as_str()) {
                    parts.push(c.to_string());
                }
            }
        }
        parts.join("; ")
    }

    fn error(&self, doing: &str, secrets: &[&str]) -> ForgeError {
        let msg = clean(&self.message(), secrets);
        let detail = if msg.is_empty() {
            format!("{doing}: HTTP {}", self.status.as_u16())
        } else {
            format!("{doing}: HTTP {}: {msg}", self.status.as_u16())
        };
        if self.status.is_server_error() || self.status.as_u16() == 429 || self.rate_limited {
            ForgeError::Unreachable(detail)
        } else {
            ForgeError::Refused(detail)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_refs() {
        let r = RepoRef::parse("acme/app", false).expect("ok");
        assert_eq!(r.as_path(), "acme/app");
        assert_eq!((r.owner().as_str(), r.name()), ("acme", "app"));
        assert!(RepoRef::parse("a-b.c_d/x.y", false).is_ok());
        for bad in [
            "", "acme", "acme/", "/app", "a/b/c", "../x", "a/..", "a/.git", "-a/b", "a/-b",
            "a b/c", "a/b\n", "a/b%2F", "a\\b/c", "é/x",
        ] {
            assert!(RepoRef::parse(bad, false).is_err(), "{bad:?}");
        }
        assert!(RepoRef::parse(&format!("{}/x", "a".repeat(101)), false).is_err());
        assert!(RepoRef::parse(&format!("{}/x", "a".repeat(100)), false).is_ok());
        let r = RepoRef::parse("group/sub/deeper/app", true).expect("nested");
        assert_eq!(r.owner(), "group/sub/deeper");
        assert!(RepoRef::parse("group/sub/app", false).is_err());
        assert!(RepoRef::parse("app", true).is_err());
        assert!(RepoRef::parse("a//b", true).is_err());
    }

    #[test]
    fn credentials_do_not_show_in_debug() {
        let c = GitCredential {
            user: "oauth2".into(),
            secret: "glpat-SECRET".into(),
        };
        assert!(!format!("{c:?}").contains("SECRET"));
        let f = Forge::from_config(ForgeConfig {
            name: "gl".into(),
            kind: ForgeKind::Gitlab,
            url_template: None,
            app_id: None,
            private_key_file: None,
            api_url: None,
            token: Some("glpat-SECRET".into()),
            url: Some("https://gitlab.example".into()),
            workspaces: Vec::new(),
        })
        .expect("forge");
        // The config is public (the operator's own file); the client holds nothing more.
        assert!(f.nested_names());
    }

    #[test]
    fn clean_urls() {
        assert!(is_clean_http_url("https://github.com/o/r.git"));
        assert!(is_clean_http_url("http://127.0.0.1:8080/o/r.git"));
        assert!(!is_clean_http_url("https://u:p@github.com/o/r.git"));
        assert!(!is_clean_http_url("ext::sh"));
        assert!(!is_clean_http_url("file:///etc"));
        assert!(!is_clean_http_url("https:///x"));
    }
}
