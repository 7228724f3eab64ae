//! Git on the host, for task runs, trusting nothing the sandbox wrote.
//!
//! Every git process the server runs has `GIT_CONFIG_NOSYSTEM=1`, `GIT_CONFIG_GLOBAL` and `HOME`
//! pointing at nothing of the host, `core.hooksPath` set to an empty directory, no
//! `core.fsmonitor`, `protocol.allow` limited to what the forge needs, `GIT_TERMINAL_PROMPT=0`,
//! and works on bare repositories only (no work tree, so no `.gitattributes` filters run). A
//! credential reaches git through `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_n`/`GIT_CONFIG_VALUE_n`
//! (an `http.extraHeader`), never through argv or a URL.
//!
//! Inside the sandbox the checkout lives at [`SANDBOX_CHECKOUT`], owned by the sandbox's user.

use crate::forge::Access;
use std::path::{Path, PathBuf};

/// The checkout's path inside the run's sandbox (the agent's working directory).
pub const SANDBOX_CHECKOUT: &str = "/workspace";
/// Where the server uploads the git directory's tar inside the sandbox.
pub const SANDBOX_TAR: &str = "/tmp/.cella-repo.tar";
/// Where [`sandbox_collect`] leaves the bundle inside the sandbox.
pub const SANDBOX_BUNDLE: &str = "/tmp/.cella-branch.bundle";

#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("the base branch {0} does not exist")]
    BaseBranchMissing(String),
    /// One line, credentials removed.
    #[error("clone failed: {0}")]
    CloneFailed(String),
    #[error("the repository is larger than {0} bytes")]
    TooLarge(u64),
    /// The bundle does not verify, holds no such branch, or its branch does not descend from
    /// the base commit.
    #[error("the branch the sandbox handed back is not acceptable: {0}")]
    BadBundle(String),
    #[error("the forge refused the push: {0}")]
    PushRefused(String),
    #[error("git: {0}")]
    Io(String),
}

/// The host's shallow, bare clone of the base branch for one run.
#[derive(Debug, Clone)]
pub struct Checkout {
    pub git_dir: PathBuf,
    pub base_branch: String,
    pub base_sha: String,
}

/// Host-side git for one run, working under its own directory.
#[derive(Debug, Clone)]
pub struct HostGit {
    pub work: PathBuf,
}

impl HostGit {
    /// `work` is made if needed and removed by [`HostGit::remove`].
    pub fn new(work: &Path) -> HostGit {
        HostGit {
            work: work.to_path_buf(),
        }
    }

    /// The base branch to use and its tip (`git ls-remote`, with the run's credential):
    /// `base` when given (else [`GitError::BaseBranchMissing`]), else the repository's default
    /// branch (the forge's `default_branch`, else the remote's `HEAD`). Called at start, so a
    /// missing branch is a 404 before anything is queued.
    pub async fn resolve_base(
        &self,
        access: &Access,
        base: Option<&str>,
    ) -> Result<(String, String), GitError> {
        let _ = (access, base);
        todo!("cella-tasks: HostGit::resolve_base")
    }

    /// Shallow (`--depth 1`) bare clone of `base_branch` (the repository's default branch when
    /// `None`, else an error naming it missing).
    pub async fn clone_base(
        &self,
        access: &Access,
        base_branch: Option<&str>,
        max_bytes: u64,
    ) -> Result<Checkout, GitError> {
        let _ = (access, base_branch, max_bytes);
        todo!("cella-tasks: HostGit::clone_base")
    }

    /// A tar of the checkout's git directory, for the server to write into the sandbox at
    /// [`SANDBOX_TAR`].
    pub async fn pack(&self, checkout: &Checkout) -> Result<Vec<u8>, GitError> {
        let _ = checkout;
        todo!("cella-tasks: HostGit::pack")
    }

    /// Verifies the bundle the sandbox made (prerequisites present, the one `branch` in it, its
    /// tip descending from the base commit) and fetches only that branch into the checkout.
    /// `Ok(None)`: no commits beyond the base.
    pub async fn receive_bundle(
        &self,
        checkout: &Checkout,
        bundle: &Path,
        branch: &str,
    ) -> Result<Option<String>, GitError> {
        let _ = (checkout, bundle, branch);
        todo!("cella-tasks: HostGit::receive_bundle")
    }

    /// Pushes `branch` (and nothing else) to the forge.
    pub async fn push(
        &self,
        checkout: &Checkout,
        access: &Access,
        branch: &str,
    ) -> Result<(), GitError> {
        let _ = (checkout, access, branch);
        todo!("cella-tasks: HostGit::push")
    }

    /// Removes the run's directory (idempotent).
    pub fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

/// The argv (run inside the sandbox as its user, in `/`) that unpacks [`SANDBOX_TAR`] into
/// [`SANDBOX_CHECKOUT`]`/.git`, checks out the base and makes `branch`.
pub fn sandbox_prepare(branch: &str) -> Vec<String> {
    let _ = branch;
    todo!("cella-tasks: sandbox_prepare")
}

/// The argv (run inside the sandbox as its user) that commits whatever is uncommitted with
/// `message` and writes the bundle of `base_sha..branch` to [`SANDBOX_BUNDLE`]
/// (no bundle file when there are no new commits).
pub fn sandbox_collect(base_sha: &str, branch: &str, message: &str) -> Vec<String> {
    let _ = (base_sha, branch, message);
    todo!("cella-tasks: sandbox_collect")
}
