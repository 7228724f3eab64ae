//! Forges: where repositories live and pull requests are opened.
//!
//! [`Forge::open`] resolves `owner/name` to a clone URL, its default branch and a credential for
//! this one run (a GitHub App installation token scoped to the one repository with the least
//! permissions, revoked by [`Forge::close`]; a GitLab or fine-grained token; nothing for local
//! paths). [`Forge::open_pull_request`] opens the draft. Every request to a forge's API carries a
//! `User-Agent`. A credential is never logged, never put in argv, never sent into a sandbox.

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

impl RepoRef {
    /// `Err` says what is wrong, for a 400 naming `repository`.
    pub fn parse(s: &str, nested: bool) -> Result<RepoRef, String> {
        let _ = (s, nested);
        todo!("cella-tasks: RepoRef::parse")
    }

    pub fn as_path(&self) -> String {
        self.parts.join("/")
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
    // the implementation adds what it needs (an HTTP client, the App's key, ...)
}

impl Forge {
    /// Reads the key file (github App) and checks the config; `Err` at server start.
    pub fn from_config(config: ForgeConfig) -> Result<Forge, ForgeError> {
        let _ = config;
        todo!("cella-tasks: Forge::from_config")
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
        let _ = repo;
        todo!("cella-tasks: Forge::open")
    }

    /// Opens the draft pull (merge) request; `Ok(None)` on a plain `git` forge.
    pub async fn open_pull_request(
        &self,
        access: &Access,
        spec: &PullRequestSpec,
    ) -> Result<Option<PullRequest>, ForgeError> {
        let _ = (access, spec);
        todo!("cella-tasks: Forge::open_pull_request")
    }

    /// Revokes the run's credential (GitHub App tokens); best effort, logs a failure.
    pub async fn close(&self, access: &Access) {
        let _ = access;
        todo!("cella-tasks: Forge::close")
    }
}
