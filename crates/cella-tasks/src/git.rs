//! Git on the host, for task runs, trusting nothing the sandbox wrote.
//!
//! Every git process the server runs gets a cleared environment: `GIT_CONFIG_NOSYSTEM=1`,
//! `GIT_CONFIG_GLOBAL=/dev/null`, `HOME` an empty directory of the run (so no `~/.netrc`, no
//! user config), `core.hooksPath` that empty directory, `core.fsmonitor=false`, no credential
//! helper, `protocol.allow=never` with only the transport of the remote allowed (`file` for a
//! local path, given to git as a `file://` URL so `--depth` holds and nothing is hard-linked;
//! `http`/`https` for a URL), `http.followRedirects=false`, `GIT_TERMINAL_PROMPT=0`, an empty
//! `GIT_ASKPASS`, a time limit, and it works on bare repositories only (no work tree, so no
//! `.gitattributes` filter ever runs on the host). A credential reaches git through
//! `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_n`/`GIT_CONFIG_VALUE_n` (an `http.extraHeader` with
//! `Authorization: Basic base64(user:secret)`), never through argv or a URL; git's messages
//! are cut to one line with credentials removed before they become errors.
//!
//! The run's steps:
//! 1. [`HostGit::resolve_base`]: `git ls-remote` for the base branch and its tip (in a scratch
//!    directory of its own, so it leaves nothing).
//! 2. [`HostGit::clone_base`]: `git clone --bare --depth 1 --single-branch --branch <b>
//!    --template=<empty>` into `<work>/repo.git`, killed and removed when it grows past
//!    `max_repo_bytes` ([`GitError::TooLarge`]). Or, when the base commit's objects were kept
//!    by an earlier run ([`crate::cache`]), [`HostGit::from_cache`]: an empty bare repository
//!    linked to them, the branch set to the commit the forge just named.
//! 3. [`HostGit::share`]: `<work>/share` gets hard links to the clone's objects and its
//!    `shallow` (nothing else: no config, no refs), which the sandbox sees read-only at
//!    [`SANDBOX_BASE`] (a bind mount made when it boots, from [`HostGit::make_share_dir`]).
//! 4. [`sandbox_prepare`] (in the sandbox, as its user): makes [`SANDBOX_CHECKOUT`] a
//!    repository that borrows those objects (`objects/info/alternates`: nothing is copied),
//!    sets the base branch to the base commit and checks out the run's branch from it.
//! 5. [`sandbox_collect`] (in the sandbox, after the agent stopped): commits what is
//!    uncommitted as `Cella <cella@localhost>`, and writes the bundle of `base..branch` to
//!    [`SANDBOX_BUNDLE`] (none without new commits).
//! 6. [`write_capped`]: the server streams the bundle out of the sandbox into a file of the
//!    run's directory, chunk by chunk, and stops as soon as it passes `max_repo_bytes`
//!    ([`GitError::TooLarge`]; the partial file is removed). Then
//!    [`HostGit::receive_bundle`]: `git bundle verify` against the host's clone, the run's
//!    branch must be among its heads, only that ref is fetched (with `transfer.fsckObjects`)
//!    under a holding ref, and it must descend from the base commit
//!    ([`GitError::BadBundle`] otherwise); nothing else of the bundle becomes a ref.
//! 7. [`HostGit::push`]: `git push <remote> refs/heads/<b>:refs/heads/<b>`, that one ref, no
//!    force ([`GitError::PushRefused`] when the remote refuses).
//! 8. [`HostGit::remove`].
//!
//! A local repository owned by another user than the server's is refused by git itself
//! ("dubious ownership"; [`GitError::NotFound`] says what to do): the server does not lift that
//! guard, since such a repository's configuration could run commands as the server.
//!
//! Inside the sandbox the checkout lives at [`SANDBOX_CHECKOUT`], owned by the sandbox's user
//! (the server makes that directory writable by the user, and the sandbox's template has `git`
//! and `sh`).

use crate::forge::{Access, GitCredential};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// The checkout's path inside the run's sandbox (the agent's working directory).
pub const SANDBOX_CHECKOUT: &str = "/workspace";
/// Where the run's sandbox sees the base commit's objects, read-only ([`HostGit::share`]).
pub const SANDBOX_BASE: &str = "/opt/cella-base";
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
    /// The remote has no such repository or refuses to show it (one line, no secrets).
    #[error("the repository is not found or not readable: {0}")]
    NotFound(String),
    /// The remote could not be reached (one line, no secrets).
    #[error("the remote is unreachable: {0}")]
    Unreachable(String),
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

/// The name of the bare clone inside [`HostGit::work`].
const REPO_DIR: &str = "repo.git";
/// The name of what the sandbox sees of it ([`HostGit::share`]) inside [`HostGit::work`].
const SHARE_DIR: &str = "share";
/// An empty directory used as `HOME`, the hooks path and the clone template.
const EMPTY_DIR: &str = "empty";
/// The ref a received branch waits under until it is checked.
const INCOMING_REF: &str = "refs/cella/incoming";
/// The most of git's stderr kept in an error.
const MAX_DETAIL: usize = 300;

/// Which transports one git process may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    File,
    Http,
    Https,
}

impl Transport {
    fn of(url: &str) -> Result<Transport, GitError> {
        if url.starts_with("https://") {
            Ok(Transport::Https)
        } else if url.starts_with("http://") {
            Ok(Transport::Http)
        } else if url.starts_with('/') {
            Ok(Transport::File)
        } else {
            Err(GitError::Io(
                "the remote is neither an absolute path nor an http(s) URL".into(),
            ))
        }
    }

    fn protocol(self) -> &'static str {
        match self {
            Transport::File => "file",
            Transport::Http => "http",
            Transport::Https => "https",
        }
    }
}

/// One git process as built: its argv (after `git`), its environment (the whole of it: the
/// process gets nothing else) and its working directory. Pure data, so tests can check that no
/// secret is in the argv. `Debug` shows the argv and the names of the variables only.
#[derive(Clone)]
pub struct GitInvocation {
    pub args: Vec<OsString>,
    pub env: Vec<(String, OsString)>,
    pub cwd: PathBuf,
    /// The process is killed after this long.
    pub timeout: Duration,
}

impl std::fmt::Debug for GitInvocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitInvocation")
            .field("args", &self.args)
            .field(
                "env",
                &self.env.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            )
            .field("cwd", &self.cwd)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// How long a git process working only on the host's clone may take.
const LOCAL_TIMEOUT: Duration = Duration::from_secs(300);
/// How long asking the remote for its branches may take.
const LS_REMOTE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a clone or a push may take.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(1800);

/// What every git process of a run is given: an empty directory for `HOME`, hooks and
/// templates.
#[derive(Debug, Clone)]
struct Hardening {
    empty: PathBuf,
}

impl Hardening {
    /// The invocation of `git args...` with the hardened environment, `config` as extra
    /// command-scope settings, the allowed transport, and the credential as an
    /// `http.extraHeader` in the environment.
    fn invocation(
        &self,
        args: Vec<OsString>,
        git_dir: Option<&Path>,
        transport: Option<Transport>,
        credential: Option<&GitCredential>,
    ) -> GitInvocation {
        let empty = self.empty.to_string_lossy().into_owned();
        let mut config: Vec<(String, String)> = vec![
            ("core.hooksPath".into(), empty.clone()),
            ("core.fsmonitor".into(), "false".into()),
            ("core.sshCommand".into(), "false".into()),
            ("core.askPass".into(), String::new()),
            ("credential.helper".into(), String::new()),
            ("protocol.allow".into(), "never".into()),
            ("init.templateDir".into(), empty.clone()),
            ("http.followRedirects".into(), "false".into()),
            ("gc.auto".into(), "0".into()),
            ("maintenance.auto".into(), "false".into()),
            ("advice.detachedHead".into(), "false".into()),
            // A transfer slower than 1 KB/s for a minute is given up.
            ("http.lowSpeedLimit".into(), "1000".into()),
            ("http.lowSpeedTime".into(), "60".into()),
        ];
        if let Some(t) = transport {
            config.push((format!("protocol.{}.allow", t.protocol()), "always".into()));
        }
        if let Some(c) = credential {
            use base64::Engine as _;
            let basic = base64::engine::general_purpose::STANDARD
                .encode(format!("{}:{}", c.user, c.secret));
            config.push((
                "http.extraHeader".into(),
                format!("Authorization: Basic {basic}"),
            ));
        }
        let mut env: Vec<(String, OsString)> = vec![
            (
                "PATH".into(),
                std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
            ),
            ("HOME".into(), empty.clone().into()),
            ("XDG_CONFIG_HOME".into(), empty.clone().into()),
            ("GIT_CONFIG_NOSYSTEM".into(), "1".into()),
            ("GIT_CONFIG_GLOBAL".into(), "/dev/null".into()),
            ("GIT_CONFIG_SYSTEM".into(), "/dev/null".into()),
            ("GIT_TERMINAL_PROMPT".into(), "0".into()),
            ("GIT_ASKPASS".into(), "".into()),
            ("SSH_ASKPASS".into(), "".into()),
            ("GIT_NO_REPLACE_OBJECTS".into(), "1".into()),
            ("GIT_CEILING_DIRECTORIES".into(), empty.clone().into()),
            ("GIT_PROTOCOL_FROM_USER".into(), "0".into()),
            ("LC_ALL".into(), "C".into()),
            ("LANG".into(), "C".into()),
        ];
        if let Some(d) = git_dir {
            env.push(("GIT_DIR".into(), d.as_os_str().to_owned()));
        }
        env.push(("GIT_CONFIG_COUNT".into(), config.len().to_string().into()));
        for (i, (k, v)) in config.into_iter().enumerate() {
            env.push((format!("GIT_CONFIG_KEY_{i}"), k.into()));
            env.push((format!("GIT_CONFIG_VALUE_{i}"), v.into()));
        }
        GitInvocation {
            args,
            env,
            cwd: self.empty.clone(),
            timeout: LOCAL_TIMEOUT,
        }
    }
}

/// What a finished git process said.
struct Output {
    ok: bool,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

/// Runs one invocation; nothing of the server's environment reaches git.
async fn run(inv: &GitInvocation, limit: Option<(&Path, u64)>) -> Result<Output, GitError> {
    let mut cmd = tokio::process::Command::new("git");
    cmd.args(&inv.args)
        .env_clear()
        .envs(inv.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&inv.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| GitError::Io(format!("cannot run git: {e}")))?;
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let read_out = async move {
        let mut v = Vec::new();
        if let Some(o) = out.as_mut() {
            let _ = tokio::io::AsyncReadExt::read_to_end(o, &mut v).await;
        }
        v
    };
    let read_err = async move {
        let mut v = Vec::new();
        if let Some(e) = err.as_mut() {
            // Bounded: git's stderr is only ever summarised.
            let mut buf = [0u8; 8192];
            loop {
                match tokio::io::AsyncReadExt::read(e, &mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if v.len() < 64 * 1024 {
                            v.extend_from_slice(&buf[..n]);
                        }
                    }
                }
            }
        }
        v
    };
    let wait = async {
        match limit {
            None => child.wait().await.map(Some),
            Some((dir, max)) => loop {
                tokio::select! {
                    st = child.wait() => break st.map(Some),
                    _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {
                        let d = dir.to_path_buf();
                        let size = tokio::task::spawn_blocking(move || crate::cache::size_of(&d))
                            .await
                            .unwrap_or(0);
                        if size > max {
                            let _ = child.kill().await;
                            break Ok(None);
                        }
                    }
                }
            },
        }
    };
    let all = async { tokio::join!(wait, read_out, read_err) };
    let Ok((status, stdout, stderr)) = tokio::time::timeout(inv.timeout, all).await else {
        // Dropping the child kills it (kill_on_drop).
        return Err(GitError::Unreachable(format!(
            "git did not finish within {} s",
            inv.timeout.as_secs()
        )));
    };
    let status = status.map_err(|e| GitError::Io(format!("waiting for git: {e}")))?;
    let Some(status) = status else {
        return Err(GitError::TooLarge(limit.map(|l| l.1).unwrap_or(0)));
    };
    Ok(Output {
        ok: status.success(),
        code: status.code(),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    })
}

/// git's stderr as one line without secrets: its `fatal:`/`error:`/`remote rejected` lines
/// first.
fn summary(stderr: &str, credential: Option<&GitCredential>) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let important: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| {
            l.starts_with("fatal:")
                || l.starts_with("error:")
                || l.starts_with("! ")
                || l.contains("rejected")
                || l.starts_with("remote: error")
        })
        .collect();
    let chosen = if important.is_empty() {
        lines
    } else {
        important
    };
    let mut s = chosen.join(" / ");
    if let Some(c) = credential {
        if !c.secret.is_empty() {
            s = s.replace(&c.secret, "***");
            use base64::Engine as _;
            let basic = base64::engine::general_purpose::STANDARD
                .encode(format!("{}:{}", c.user, c.secret));
            s = s.replace(&basic, "***");
        }
    }
    let s = crate::failure::redact(&crate::failure::one_line(&s));
    let s = crate::failure::cut_chars(s.trim(), MAX_DETAIL);
    if s.is_empty() {
        "git failed".into()
    } else {
        s
    }
}

/// Whether git's stderr says the remote has no such repository (or hides it).
fn says_not_found(stderr: &str) -> bool {
    let l = stderr.to_ascii_lowercase();
    l.contains("not found")
        || l.contains("does not appear to be a git repository")
        || l.contains("not a git repository")
        || l.contains("returned error: 403")
        || l.contains("returned error: 404")
        || l.contains("authentication failed")
        || l.contains("could not read username")
        || l.contains("no such file or directory")
}

fn says_unreachable(stderr: &str) -> bool {
    let l = stderr.to_ascii_lowercase();
    l.contains("could not resolve host")
        || l.contains("failed to connect")
        || l.contains("connection refused")
        || l.contains("connection timed out")
        || l.contains("operation timed out")
        || l.contains("returned error: 5")
        || l.contains("ssl")
}

fn remote_error(stderr: &str, credential: Option<&GitCredential>) -> GitError {
    if stderr.contains("dubious ownership") {
        // git's own guard: a local repository owned by another user than the server's is
        // not read (its configuration could run commands as the server).
        return GitError::NotFound(
            "the repository is owned by another user than the server's, and git refuses to read it; \
             give the server a bare clone of its own (git clone --bare SOURCE DEST as the server's user)"
                .into(),
        );
    }
    let s = summary(stderr, credential);
    if says_unreachable(stderr) {
        GitError::Unreachable(s)
    } else if says_not_found(stderr) {
        GitError::NotFound(s)
    } else {
        GitError::CloneFailed(s)
    }
}

/// A branch name git accepts as `refs/heads/<name>` (checked without running git).
pub fn valid_branch(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with(['-', '/', '.'])
        && !name.ends_with(['/', '.'])
        && !name.ends_with(".lock")
        && !name.contains("..")
        && !name.contains("//")
        && !name.contains("/.")
        && !name.contains(".lock/")
        && !name.contains("@{")
        && name != "@"
        && !name.chars().any(|c| {
            c.is_control() || matches!(c, ' ' | '~' | '^' | ':' | '?' | '*' | '[' | '\\' | '\u{7f}')
        })
}

fn valid_sha(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The URL git is given: a local path becomes `file://` (so `--depth` is honoured and no
/// hard links are made).
/// How a clone from a repository on this host runs the other side (see [`HostGit::clone_base`]).
const UPLOAD_PACK_LOCAL: &str =
    "--upload-pack=git -c pack.window=0 -c pack.compression=0 upload-pack";

fn git_url(clone_url: &str) -> Result<(String, Transport), GitError> {
    let t = Transport::of(clone_url)?;
    if clone_url.chars().any(|c| c.is_control()) {
        return Err(GitError::Io("the remote holds control characters".into()));
    }
    Ok(match t {
        Transport::File => (format!("file://{clone_url}"), t),
        _ => (clone_url.to_string(), t),
    })
}

impl HostGit {
    /// `work` is made if needed and removed by [`HostGit::remove`].
    pub fn new(work: &Path) -> HostGit {
        HostGit {
            work: work.to_path_buf(),
        }
    }

    fn hardening(&self) -> Result<Hardening, GitError> {
        let empty = self.work.join(EMPTY_DIR);
        std::fs::create_dir_all(&empty)
            .map_err(|e| GitError::Io(format!("making the run's directory: {e}")))?;
        Ok(Hardening { empty })
    }

    fn repo_dir(&self) -> PathBuf {
        self.work.join(REPO_DIR)
    }

    /// The invocations the steps run, built without running them (for tests).
    pub fn ls_remote_invocation(
        &self,
        access: &Access,
        patterns: &[&str],
    ) -> Result<GitInvocation, GitError> {
        self.ls_remote_with(&self.hardening()?, access, patterns)
    }

    fn ls_remote_with(
        &self,
        h: &Hardening,
        access: &Access,
        patterns: &[&str],
    ) -> Result<GitInvocation, GitError> {
        let (url, t) = git_url(&access.clone_url)?;
        let mut args = os(&["ls-remote", "--symref", &url]);
        args.extend(patterns.iter().map(OsString::from));
        let mut inv = h.invocation(args, None, Some(t), access.credential.as_ref());
        inv.timeout = LS_REMOTE_TIMEOUT;
        Ok(inv)
    }

    pub fn clone_invocation(
        &self,
        access: &Access,
        branch: &str,
    ) -> Result<GitInvocation, GitError> {
        self.clone_with(&self.hardening()?, access, Some(branch))
    }

    /// `branch` `None`: the remote's `HEAD`.
    fn clone_with(
        &self,
        h: &Hardening,
        access: &Access,
        branch: Option<&str>,
    ) -> Result<GitInvocation, GitError> {
        let (url, t) = git_url(&access.clone_url)?;
        let template = format!("--template={}", h.empty.display());
        let dest = self.repo_dir();
        let mut args = os(&[
            "clone",
            "--bare",
            "--depth",
            "1",
            "--single-branch",
            "--no-tags",
            "--no-local",
            &template,
        ]);
        if let Some(b) = branch {
            args.extend(os(&["--branch", b]));
        }
        if matches!(t, Transport::File) {
            // A repository on this host: its side of the transfer is ours to run. A shallow
            // clone's one commit gains little from delta search and compression (which took
            // most of a clone's time: over a second for 10 MB), and the pack goes no further
            // than the run's sandbox; so neither is done, and `max_repo_bytes` counts the
            // content as it is. A remote forge packs on its side as it sees fit.
            args.push(UPLOAD_PACK_LOCAL.into());
        }
        args.extend(os(&["--", &url]));
        args.push(dest.into_os_string());
        let mut inv = h.invocation(args, None, Some(t), access.credential.as_ref());
        inv.timeout = TRANSFER_TIMEOUT;
        Ok(inv)
    }

    pub fn push_invocation(
        &self,
        checkout: &Checkout,
        access: &Access,
        branch: &str,
    ) -> Result<GitInvocation, GitError> {
        let h = self.hardening()?;
        let (url, t) = git_url(&access.clone_url)?;
        let refspec = format!("refs/heads/{branch}:refs/heads/{branch}");
        let args = os(&["push", "--porcelain", "--no-verify", "--", &url, &refspec]);
        let mut inv = h.invocation(
            args,
            Some(&checkout.git_dir),
            Some(t),
            access.credential.as_ref(),
        );
        inv.timeout = TRANSFER_TIMEOUT;
        Ok(inv)
    }

    /// The base branch to use and its tip (`git ls-remote`, with the run's credential):
    /// `base` when given (else [`GitError::BaseBranchMissing`]), else the repository's default
    /// branch (the forge's `default_branch`, else the remote's `HEAD`). Called at start, so a
    /// missing branch is a 404 before anything is queued.
    ///
    /// It works in a scratch directory of its own (removed when it returns), so it leaves
    /// nothing under [`HostGit::work`].
    pub async fn resolve_base(
        &self,
        access: &Access,
        base: Option<&str>,
    ) -> Result<(String, String), GitError> {
        let scratch = tempfile::Builder::new()
            .prefix(".cella-git-")
            .tempdir()
            .map_err(|e| GitError::Io(format!("making a scratch directory: {e}")))?;
        let h = Hardening {
            empty: scratch.path().to_path_buf(),
        };
        resolve_base_with(self, &h, access, base).await
    }

    /// Shallow (`--depth 1`) bare clone of `base_branch` (the repository's default branch when
    /// `None`, else an error naming it missing).
    pub async fn clone_base(
        &self,
        access: &Access,
        base_branch: Option<&str>,
        max_bytes: u64,
    ) -> Result<Checkout, GitError> {
        let h = self.hardening()?;
        // One git process: the clone itself tells a missing branch, and without a branch it
        // takes the remote's HEAD.
        let wanted = base_branch
            .map(String::from)
            .or_else(|| access.default_branch.clone());
        if let Some(b) = &wanted {
            if !valid_branch(b) {
                return Err(GitError::BaseBranchMissing(b.clone()));
            }
        }
        let dest = self.repo_dir();
        if dest.exists() {
            std::fs::remove_dir_all(&dest)
                .map_err(|e| GitError::Io(format!("removing an old clone: {e}")))?;
        }
        let inv = self.clone_with(&h, access, wanted.as_deref())?;
        let out = match run(&inv, Some((&self.work, max_bytes))).await {
            Err(GitError::TooLarge(n)) => {
                let _ = std::fs::remove_dir_all(&dest);
                return Err(GitError::TooLarge(n));
            }
            r => r?,
        };
        if !out.ok {
            let _ = std::fs::remove_dir_all(&dest);
            let l = out.stderr.to_ascii_lowercase();
            if let Some(b) = &wanted {
                if l.contains("remote branch") && l.contains("not found") {
                    return Err(GitError::BaseBranchMissing(b.clone()));
                }
            }
            return Err(
                match remote_error(&out.stderr, access.credential.as_ref()) {
                    GitError::NotFound(s) => GitError::CloneFailed(format!("not found: {s}")),
                    e => e,
                },
            );
        }
        if crate::cache::size_of(&self.work) > max_bytes {
            let _ = std::fs::remove_dir_all(&dest);
            return Err(GitError::TooLarge(max_bytes));
        }
        let branch = match wanted {
            Some(b) => b,
            None => {
                let out = run(
                    &h.invocation(os(&["symbolic-ref", "-q", "HEAD"]), Some(&dest), None, None),
                    None,
                )
                .await?;
                match out.stdout.trim().strip_prefix("refs/heads/") {
                    Some(b) if out.ok && valid_branch(b) => b.to_string(),
                    _ => {
                        let _ = std::fs::remove_dir_all(&dest);
                        return Err(GitError::BaseBranchMissing("HEAD".into()));
                    }
                }
            }
        };
        let out = run(
            &h.invocation(
                os(&[
                    "rev-parse",
                    "--verify",
                    "-q",
                    &format!("refs/heads/{branch}^{{commit}}"),
                ]),
                Some(&dest),
                None,
                None,
            ),
            None,
        )
        .await?;
        let sha = out.stdout.trim().to_string();
        if !out.ok || !valid_sha(&sha) {
            // An empty repository: its default branch has no commit yet.
            let _ = std::fs::remove_dir_all(&dest);
            return Err(GitError::BaseBranchMissing(branch));
        }
        Ok(Checkout {
            git_dir: dest,
            base_branch: branch,
            base_sha: sha,
        })
    }

    /// The directory the run's sandbox sees read-only at [`SANDBOX_BASE`]: made empty before
    /// the sandbox boots (its bind mount needs it), filled by [`HostGit::share`].
    pub fn share_dir(&self) -> PathBuf {
        self.work.join(SHARE_DIR)
    }

    /// Makes [`HostGit::share_dir`], empty, readable by the sandbox's user.
    pub fn make_share_dir(&self) -> Result<PathBuf, GitError> {
        use std::os::unix::fs::PermissionsExt;
        let dir = self.share_dir();
        std::fs::create_dir_all(&dir)
            .and_then(|_| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)))
            .map_err(|e| GitError::Io(format!("making the run's shared directory: {e}")))?;
        Ok(dir)
    }

    /// Hands the checkout's objects to the sandbox: [`HostGit::share_dir`] gets `objects/`
    /// (hard links to the clone's files, read-only for everyone) and `shallow`, nothing else
    /// of the host's git directory (no config, no refs). The sandbox borrows the objects
    /// through `objects/info/alternates` ([`sandbox_prepare`]), so nothing is copied.
    pub async fn share(&self, checkout: &Checkout) -> Result<(), GitError> {
        let from = checkout.git_dir.clone();
        let to = self.make_share_dir()?;
        tokio::task::spawn_blocking(move || {
            crate::cache::link_tree(&from.join("objects"), &to.join("objects"))?;
            std::fs::copy(from.join("shallow"), to.join("shallow"))?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(to.join("shallow"), std::fs::Permissions::from_mode(0o444))
        })
        .await
        .map_err(|e| GitError::Io(format!("sharing the checkout: {e}")))?
        .map_err(|e| GitError::Io(format!("sharing the checkout: {e}")))
    }

    /// The host's bare clone of `base_branch` at `sha` made from a kept entry
    /// ([`crate::cache`]) instead of a clone: an empty bare repository whose `objects/` are
    /// links to the entry's, its `shallow`, and the branch set to `sha` (which git checks is
    /// there). The caller learnt `sha` from the forge ([`HostGit::resolve_base`]).
    pub async fn from_cache(
        &self,
        entry: &Path,
        base_branch: &str,
        sha: &str,
    ) -> Result<Checkout, GitError> {
        if !valid_branch(base_branch) {
            return Err(GitError::BaseBranchMissing(base_branch.to_string()));
        }
        if !valid_sha(sha) {
            return Err(GitError::Io("not a commit id".into()));
        }
        let h = self.hardening()?;
        let dest = self.repo_dir();
        if dest.exists() {
            std::fs::remove_dir_all(&dest)
                .map_err(|e| GitError::Io(format!("removing an old clone: {e}")))?;
        }
        let template = format!("--template={}", h.empty.display());
        let branch_arg = format!("--initial-branch={base_branch}");
        let mut args = os(&["init", "-q", "--bare", &template, &branch_arg, "--"]);
        args.push(dest.clone().into_os_string());
        let out = run(&h.invocation(args, None, None, None), None).await?;
        if !out.ok {
            return Err(GitError::Io(summary(&out.stderr, None)));
        }
        let (from, to) = (entry.to_path_buf(), dest.clone());
        tokio::task::spawn_blocking(move || {
            crate::cache::link_tree(&from.join("objects"), &to.join("objects"))?;
            std::fs::copy(from.join("shallow"), to.join("shallow")).map(|_| ())
        })
        .await
        .map_err(|e| GitError::Io(format!("linking a kept checkout: {e}")))?
        .map_err(|e| GitError::Io(format!("linking a kept checkout: {e}")))?;
        let refname = format!("refs/heads/{base_branch}");
        let out = run(
            &h.invocation(
                os(&["update-ref", "--no-deref", &refname, sha]),
                Some(&dest),
                None,
                None,
            ),
            None,
        )
        .await?;
        if !out.ok {
            let _ = std::fs::remove_dir_all(&dest);
            return Err(GitError::Io(format!(
                "a kept checkout lacks its commit: {}",
                summary(&out.stderr, None)
            )));
        }
        Ok(Checkout {
            git_dir: dest,
            base_branch: base_branch.to_string(),
            base_sha: sha.to_string(),
        })
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
        if !valid_branch(branch) {
            return Err(GitError::Io(format!("{branch:?} is not a branch name")));
        }
        let h = self.hardening()?;
        let gd = Some(checkout.git_dir.as_path());
        // Fixed words only: what git says about a bundle can quote names the sandbox chose,
        // and a failure reason is stored.
        let bad = |what: &str, out: &Output| {
            tracing::debug!(code = ?out.code, "a handed-back bundle was refused: {what}");
            GitError::BadBundle(what.to_string())
        };
        let bundle_arg = OsString::from(bundle.as_os_str());
        if !bundle.is_absolute() {
            return Err(GitError::Io("the bundle's path must be absolute".into()));
        }
        match std::fs::symlink_metadata(bundle) {
            Ok(md) if md.file_type().is_file() => {}
            Ok(_) => {
                return Err(GitError::BadBundle(
                    "the bundle is not a regular file".into(),
                ))
            }
            Err(e) => return Err(GitError::BadBundle(format!("no bundle: {e}"))),
        }
        let verify = run(
            &h.invocation(
                vec![
                    "bundle".into(),
                    "verify".into(),
                    "-q".into(),
                    bundle_arg.clone(),
                ],
                gd,
                Some(Transport::File),
                None,
            ),
            None,
        )
        .await?;
        if !verify.ok {
            return Err(bad("it does not verify against the base", &verify));
        }
        let heads = run(
            &h.invocation(
                vec!["bundle".into(), "list-heads".into(), bundle_arg.clone()],
                gd,
                Some(Transport::File),
                None,
            ),
            None,
        )
        .await?;
        if !heads.ok {
            return Err(bad("its heads cannot be read", &heads));
        }
        let want = format!("refs/heads/{branch}");
        let tip = heads
            .stdout
            .lines()
            .filter_map(|l| l.split_once(' '))
            .find(|(_, r)| *r == want)
            .map(|(sha, _)| sha.to_string())
            .ok_or_else(|| GitError::BadBundle(format!("it holds no branch {branch}")))?;
        if !valid_sha(&tip) {
            return Err(GitError::BadBundle(
                "its branch tip is not a commit id".into(),
            ));
        }
        if tip == checkout.base_sha {
            return Ok(None);
        }
        let refspec = format!("+{want}:{INCOMING_REF}");
        let fetch = run(
            &h.invocation(
                vec![
                    "-c".into(),
                    "transfer.fsckObjects=true".into(),
                    "fetch".into(),
                    "--no-tags".into(),
                    "--no-write-fetch-head".into(),
                    "--no-recurse-submodules".into(),
                    "--no-auto-gc".into(),
                    "--no-auto-maintenance".into(),
                    "--quiet".into(),
                    "--".into(),
                    bundle_arg,
                    refspec.into(),
                ],
                gd,
                Some(Transport::File),
                None,
            ),
            None,
        )
        .await?;
        if !fetch.ok {
            return Err(bad("it cannot be fetched", &fetch));
        }
        let cleanup = async {
            let _ = run(
                &h.invocation(os(&["update-ref", "-d", INCOMING_REF]), gd, None, None),
                None,
            )
            .await;
        };
        let got = run(
            &h.invocation(
                os(&[
                    "rev-parse",
                    "--verify",
                    "-q",
                    &format!("{INCOMING_REF}^{{commit}}"),
                ]),
                gd,
                None,
                None,
            ),
            None,
        )
        .await?;
        let got = got.stdout.trim().to_string();
        if got != tip {
            cleanup.await;
            return Err(GitError::BadBundle("its branch is not a commit".into()));
        }
        let anc = run(
            &h.invocation(
                os(&["merge-base", "--is-ancestor", &checkout.base_sha, &tip]),
                gd,
                None,
                None,
            ),
            None,
        )
        .await?;
        if !anc.ok {
            cleanup.await;
            return Err(if anc.code == Some(1) {
                GitError::BadBundle(format!(
                    "its branch does not descend from the base commit {}",
                    checkout.base_sha
                ))
            } else {
                bad("its history cannot be checked", &anc)
            });
        }
        let set = run(
            &h.invocation(os(&["update-ref", &want, &tip]), gd, None, None),
            None,
        )
        .await?;
        cleanup.await;
        if !set.ok {
            return Err(GitError::Io(summary(&set.stderr, None)));
        }
        Ok(Some(tip))
    }

    /// Pushes `branch` (and nothing else) to the forge.
    pub async fn push(
        &self,
        checkout: &Checkout,
        access: &Access,
        branch: &str,
    ) -> Result<(), GitError> {
        if !valid_branch(branch) {
            return Err(GitError::Io(format!("{branch:?} is not a branch name")));
        }
        let inv = self.push_invocation(checkout, access, branch)?;
        let out = run(&inv, None).await?;
        if out.ok {
            return Ok(());
        }
        // --porcelain puts the per-ref status (`!\tsrc:dst\t[rejected] (why)`) on stdout.
        let mut detail = String::new();
        for l in out.stdout.lines() {
            if l.starts_with('!') {
                detail = l.replace('\t', " ");
                break;
            }
        }
        let stderr = format!("{}\n{}", detail, out.stderr);
        if says_unreachable(&out.stderr) {
            return Err(GitError::Unreachable(summary(
                &stderr,
                access.credential.as_ref(),
            )));
        }
        Err(GitError::PushRefused(summary(
            &stderr,
            access.credential.as_ref(),
        )))
    }

    /// The commits on `tip` beyond the base (for the pull request's body and progress).
    pub async fn count_commits(&self, checkout: &Checkout, tip: &str) -> Result<u32, GitError> {
        if !valid_sha(tip) {
            return Err(GitError::Io("not a commit id".into()));
        }
        let h = self.hardening()?;
        let range = format!("{}..{tip}", checkout.base_sha);
        let out = run(
            &h.invocation(
                os(&["rev-list", "--count", &range]),
                Some(&checkout.git_dir),
                None,
                None,
            ),
            None,
        )
        .await?;
        if !out.ok {
            return Err(GitError::Io(summary(&out.stderr, None)));
        }
        out.stdout
            .trim()
            .parse()
            .map_err(|_| GitError::Io("rev-list answered garbage".into()))
    }

    /// Removes the run's directory (idempotent).
    pub fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

async fn resolve_base_with(
    git: &HostGit,
    h: &Hardening,
    access: &Access,
    base: Option<&str>,
) -> Result<(String, String), GitError> {
    let wanted = base
        .map(String::from)
        .or_else(|| access.default_branch.clone());
    if let Some(b) = &wanted {
        if !valid_branch(b) {
            return Err(GitError::BaseBranchMissing(b.clone()));
        }
    }
    let pattern = match &wanted {
        Some(b) => format!("refs/heads/{b}"),
        None => "HEAD".to_string(),
    };
    let inv = git.ls_remote_with(h, access, &[&pattern])?;
    let out = run(&inv, None).await?;
    if !out.ok {
        return Err(remote_error(&out.stderr, access.credential.as_ref()));
    }
    let mut head_target = None;
    let mut sha_of: std::collections::HashMap<&str, &str> = Default::default();
    for line in out.stdout.lines() {
        let Some((left, name)) = line.split_once('\t') else {
            continue;
        };
        if let Some(target) = left.strip_prefix("ref: ") {
            if name == "HEAD" {
                head_target = Some(target.to_string());
            }
        } else {
            sha_of.insert(name, left);
        }
    }
    let (branch, sha) = match wanted {
        Some(b) => {
            let full = format!("refs/heads/{b}");
            match sha_of.get(full.as_str()) {
                Some(sha) => (b, sha.to_string()),
                None => return Err(GitError::BaseBranchMissing(b)),
            }
        }
        None => {
            let target = head_target.ok_or_else(|| GitError::BaseBranchMissing("HEAD".into()))?;
            let b = target
                .strip_prefix("refs/heads/")
                .ok_or_else(|| GitError::BaseBranchMissing("HEAD".into()))?
                .to_string();
            match sha_of.get("HEAD") {
                Some(sha) if valid_branch(&b) => (b, sha.to_string()),
                _ => return Err(GitError::BaseBranchMissing(b)),
            }
        }
    };
    if !valid_sha(&sha) {
        return Err(GitError::CloneFailed("the remote answered garbage".into()));
    }
    Ok((branch, sha))
}

/// Writes the chunks of `chunks` (a stream read from the sandbox) to a new file at `path`,
/// one chunk at a time, and stops at the first chunk that takes it past `max_bytes`
/// ([`GitError::TooLarge`]) without reading further; on any error the partial file is
/// removed. Answers the bytes written. Memory holds one chunk at a time.
pub async fn write_capped<E: std::fmt::Display>(
    mut chunks: impl futures_util::Stream<Item = Result<Vec<u8>, E>> + Unpin,
    path: &Path,
    max_bytes: u64,
) -> Result<u64, GitError> {
    use futures_util::StreamExt;
    use tokio::io::AsyncWriteExt;
    let io = |e: std::io::Error| GitError::Io(format!("keeping the bundle: {e}"));
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .await
        .map_err(io)?;
    let mut written = 0u64;
    let r = async {
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| GitError::BadBundle(format!("reading it: {e}")))?;
            written = written.saturating_add(chunk.len() as u64);
            if written > max_bytes {
                return Err(GitError::TooLarge(max_bytes));
            }
            file.write_all(&chunk).await.map_err(io)?;
        }
        file.flush().await.map_err(io)?;
        Ok(written)
    }
    .await;
    drop(file);
    if r.is_err() {
        let _ = tokio::fs::remove_file(path).await;
    }
    r
}

/// The script of [`sandbox_prepare`]; values come as positional parameters, never in the
/// text.
const PREPARE_SCRIPT: &str = r#"set -eu
co="$1"; base="$2"; base_branch="$3"; sha="$4"; branch="$5"
cd "$co"
git init -q --template=
# The base commit's objects stay where the host shared them (read-only): borrowed, not copied.
printf '%s\n' "$base/objects" > .git/objects/info/alternates
cp "$base/shallow" .git/shallow
git update-ref "refs/heads/$base_branch" "$sha"
# The index is empty: a forced checkout of the base commit writes its files and the index.
git checkout -q -f -B "$branch" "$sha"
"#;

/// The script of [`sandbox_collect`].
const COLLECT_SCRIPT: &str = r#"set -eu
co="$1"; bundle="$2"; base="$3"; branch="$4"; msg="$5"
rm -f "$bundle"
cd "$co"
g() { git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c commit.gpgsign=false -c user.name=Cella -c user.email=cella@localhost "$@"; }
# The agent is stopped: a lock it left (killed mid-command) is stale.
rm -f .git/index.lock
if ! g rev-parse -q --verify "refs/heads/$branch^{commit}" >/dev/null; then
  echo "cella: the branch $branch is gone; nothing to hand back" >&2
  exit 0
fi
g add -A
if ! g diff --cached --quiet; then
  g commit -q --no-verify -m "$msg"
fi
# Work committed on another branch or a detached HEAD made from the run's branch counts too.
head=$(g rev-parse -q --verify "HEAD^{commit}" || true)
if [ -n "$head" ] && [ "$(g symbolic-ref -q HEAD || true)" != "refs/heads/$branch" ]; then
  if g merge-base --is-ancestor "refs/heads/$branch" "$head"; then
    g update-ref "refs/heads/$branch" "$head"
  fi
fi
if [ -n "$(g rev-list -n 1 "$base..refs/heads/$branch")" ]; then
  g bundle create "$bundle" "$base..refs/heads/$branch"
fi
"#;

/// The argv (run inside the sandbox as its user, in `/`) that makes [`SANDBOX_CHECKOUT`] a
/// repository borrowing the objects the host shared at [`SANDBOX_BASE`], with `base_branch`
/// at `sha`, and checks out the new `branch` there.
pub fn sandbox_prepare(base_branch: &str, sha: &str, branch: &str) -> Vec<String> {
    sandbox_prepare_at(SANDBOX_CHECKOUT, SANDBOX_BASE, base_branch, sha, branch)
}

/// [`sandbox_prepare`] with other paths (tests run it in temporary directories).
pub fn sandbox_prepare_at(
    checkout: &str,
    base: &str,
    base_branch: &str,
    sha: &str,
    branch: &str,
) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        PREPARE_SCRIPT.into(),
        "sh".into(),
        checkout.into(),
        base.into(),
        base_branch.into(),
        sha.into(),
        branch.into(),
    ]
}

/// The argv (run inside the sandbox as its user) that commits whatever is uncommitted with
/// `message` and writes the bundle of `base_sha..branch` to [`SANDBOX_BUNDLE`]
/// (no bundle file when there are no new commits).
pub fn sandbox_collect(base_sha: &str, branch: &str, message: &str) -> Vec<String> {
    sandbox_collect_at(SANDBOX_CHECKOUT, SANDBOX_BUNDLE, base_sha, branch, message)
}

/// [`sandbox_collect`] with other paths (tests run it in temporary directories).
pub fn sandbox_collect_at(
    checkout: &str,
    bundle: &str,
    base_sha: &str,
    branch: &str,
    message: &str,
) -> Vec<String> {
    let message = if message.trim().is_empty() {
        "Cella: uncommitted work of the run"
    } else {
        message
    };
    vec![
        "sh".into(),
        "-c".into(),
        COLLECT_SCRIPT.into(),
        "sh".into(),
        checkout.into(),
        bundle.into(),
        base_sha.into(),
        branch.into(),
        message.into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forge::RepoRef;

    const SECRET: &str = "ghs_S3CR3T.stateless.token-xyz";

    fn access(url: &str) -> Access {
        Access {
            repo: RepoRef::parse("acme/app", false).expect("repo"),
            clone_url: url.into(),
            default_branch: Some("main".into()),
            credential: Some(GitCredential {
                user: "x-access-token".into(),
                secret: SECRET.into(),
            }),
        }
    }

    fn basic() -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{SECRET}"))
    }

    fn assert_clean_argv(inv: &GitInvocation) {
        for a in &inv.args {
            let a = a.to_string_lossy();
            assert!(!a.contains(SECRET), "secret in argv: {a}");
            assert!(!a.contains(&basic()), "encoded secret in argv: {a}");
            assert!(!a.contains("x-access-token"), "credential in argv: {a}");
            assert!(!a.contains('@'), "userinfo in argv: {a}");
        }
        let header = format!("Authorization: Basic {}", basic());
        assert!(
            inv.env.iter().any(|(_, v)| v.to_string_lossy() == header),
            "the credential reaches git through its environment"
        );
        // Never a shell, never a credential helper, never a prompt.
        let get = |k: &str| {
            inv.env
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.to_string_lossy().into_owned())
        };
        assert_eq!(get("GIT_TERMINAL_PROMPT").as_deref(), Some("0"));
        assert_eq!(get("GIT_CONFIG_NOSYSTEM").as_deref(), Some("1"));
        assert_eq!(get("GIT_CONFIG_GLOBAL").as_deref(), Some("/dev/null"));
        assert_eq!(get("GIT_ASKPASS").as_deref(), Some(""));
        let count: usize = get("GIT_CONFIG_COUNT")
            .expect("count")
            .parse()
            .expect("number");
        let cfg: Vec<(String, String)> = (0..count)
            .map(|i| {
                (
                    get(&format!("GIT_CONFIG_KEY_{i}")).expect("key"),
                    get(&format!("GIT_CONFIG_VALUE_{i}")).expect("value"),
                )
            })
            .collect();
        let has = |k: &str, v: &str| cfg.iter().any(|(a, b)| a == k && b == v);
        assert!(has("protocol.allow", "never"));
        assert!(has("protocol.https.allow", "always"));
        assert!(!cfg
            .iter()
            .any(|(k, _)| k == "protocol.file.allow" || k == "protocol.ext.allow"));
        assert!(has("core.fsmonitor", "false"));
        assert!(has("credential.helper", ""));
        assert!(cfg.iter().any(|(k, _)| k == "core.hooksPath"));
    }

    #[test]
    fn the_secret_never_appears_in_a_git_argv() {
        let tmp = tempfile::tempdir().expect("tmp");
        let hg = HostGit::new(&tmp.path().join("run"));
        let a = access("https://forge.example/acme/app.git");
        let co = Checkout {
            git_dir: hg.repo_dir(),
            base_branch: "main".into(),
            base_sha: "0".repeat(40),
        };
        assert_clean_argv(&hg.ls_remote_invocation(&a, &["HEAD"]).expect("ls-remote"));
        assert_clean_argv(&hg.clone_invocation(&a, "main").expect("clone"));
        let push = hg.push_invocation(&co, &a, "cella/t").expect("push");
        assert_clean_argv(&push);
        let dbg = format!("{push:?}");
        assert!(!dbg.contains(SECRET) && !dbg.contains(&basic()), "{dbg}");
    }

    #[test]
    fn only_the_transport_of_the_url_is_allowed() {
        let tmp = tempfile::tempdir().expect("tmp");
        let hg = HostGit::new(&tmp.path().join("run"));
        let mut a = access("/srv/git/acme/app");
        a.credential = None;
        let inv = hg.clone_invocation(&a, "main").expect("clone");
        assert!(inv.args.iter().any(|x| x == "file:///srv/git/acme/app"));
        assert!(inv.env.iter().any(|(_, v)| v == "protocol.file.allow"));
        assert!(!inv
            .env
            .iter()
            .any(|(_, v)| v.to_string_lossy().contains("Authorization")));
        for bad in [
            "ext::sh -c touch% x",
            "ssh://h/x",
            "git://h/x",
            "-oProxy",
            "relative/path",
        ] {
            a.clone_url = bad.into();
            assert!(hg.clone_invocation(&a, "main").is_err(), "{bad}");
        }
    }

    #[test]
    fn errors_are_one_line_without_secrets() {
        let cred = GitCredential {
            user: "x-access-token".into(),
            secret: SECRET.into(),
        };
        let stderr = format!(
            "remote: bad\nfatal: unable to access 'https://x-access-token:{SECRET}@h/x/': \
             The requested URL returned error: 403\nheader {}\n",
            basic()
        );
        let s = summary(&stderr, Some(&cred));
        assert!(
            !s.contains(SECRET) && !s.contains(&basic()) && !s.contains('\n'),
            "{s}"
        );
        assert!(matches!(
            remote_error(&stderr, Some(&cred)),
            GitError::NotFound(_)
        ));
    }

    #[test]
    fn branch_names() {
        for ok in ["main", "cella/tsk_1", "release-1.2", "a/b/c"] {
            assert!(valid_branch(ok), "{ok}");
        }
        for bad in [
            "", "-x", "a..b", "a b", "a:b", "a~1", "a^", "/a", "a/", "a.lock", "@", "a@{1}",
            ".hidden", "a//b", "a\nb",
        ] {
            assert!(!valid_branch(bad), "{bad:?}");
        }
    }

    #[test]
    fn sandbox_argv_never_interpolates_values() {
        let evil = "x'; touch /tmp/pwned; echo '";
        let argv = sandbox_prepare(evil, "abc", evil);
        assert_eq!(argv[0], "sh");
        assert_eq!(argv[2], PREPARE_SCRIPT);
        assert_eq!(
            &argv[4..],
            [SANDBOX_CHECKOUT, SANDBOX_BASE, evil, "abc", evil]
        );
        let argv = sandbox_collect("abc", "b", evil);
        assert_eq!(argv[2], COLLECT_SCRIPT);
        assert_eq!(
            &argv[4..],
            [SANDBOX_CHECKOUT, SANDBOX_BUNDLE, "abc", "b", evil]
        );
        assert!(!COLLECT_SCRIPT.contains("abc") && !PREPARE_SCRIPT.contains("pwned"));
    }

    /// A sandbox that hands back an endless bundle: the copy stops at the first chunk past the
    /// cap (it never reads to an end there is not), leaves no partial file, and a bundle within
    /// the cap is kept byte for byte.
    #[tokio::test]
    async fn a_bundle_past_the_cap_is_refused_while_streaming_and_leaves_nothing() {
        use std::sync::atomic::{AtomicU64, Ordering};
        use std::sync::Arc;
        const CHUNK: usize = 64 * 1024;
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("branch.bundle");
        let pulled = Arc::new(AtomicU64::new(0));
        let p = pulled.clone();
        let endless = Box::pin(futures_util::stream::repeat_with(move || {
            p.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(vec![7u8; CHUNK])
        }));
        let cap = 1 << 20;
        let r = write_capped(endless, &path, cap).await;
        assert!(matches!(r, Err(GitError::TooLarge(c)) if c == cap), "{r:?}");
        // The 17th chunk is the one past 1 MiB; nothing after it was asked for.
        assert_eq!(pulled.load(Ordering::SeqCst), cap / CHUNK as u64 + 1);
        assert!(!path.exists(), "the partial bundle is removed");
        // A source that fails midway: refused as a bad bundle, nothing kept.
        let failing = Box::pin(futures_util::stream::iter(vec![
            Ok(vec![1u8; 10]),
            Err(std::io::Error::other("hung up")),
        ]));
        let r = write_capped(failing, &path, cap).await;
        assert!(matches!(r, Err(GitError::BadBundle(_))), "{r:?}");
        assert!(!path.exists());
        // Within the cap (exactly at it): written whole.
        let ok = Box::pin(futures_util::stream::iter(
            (0..16).map(|i| Ok::<_, std::io::Error>(vec![i as u8; CHUNK])),
        ));
        assert_eq!(write_capped(ok, &path, cap).await.expect("kept"), cap);
        let got = std::fs::read(&path).expect("read");
        assert_eq!(got.len() as u64, cap);
        assert_eq!(got[CHUNK * 3], 3);
    }

    /// What the sandbox is shown of the host's clone: its objects (links, read-only for
    /// everyone) and `shallow`; not its config, refs or anything else.
    #[tokio::test]
    async fn the_share_holds_only_objects_and_shallow() {
        use std::os::unix::fs::MetadataExt;
        let work = tempfile::tempdir().expect("dir");
        let hg = HostGit::new(work.path());
        let git_dir = work.path().join(REPO_DIR);
        std::fs::create_dir_all(git_dir.join("objects/pack")).expect("dirs");
        std::fs::create_dir_all(git_dir.join("refs/heads")).expect("dirs");
        std::fs::write(git_dir.join("HEAD"), "ref: refs/heads/main\n").expect("head");
        std::fs::write(git_dir.join("config"), "[remote \"origin\"]\n\turl = /x\n").expect("cfg");
        std::fs::write(git_dir.join("shallow"), "0".repeat(40)).expect("shallow");
        std::fs::write(git_dir.join("objects/pack/p.pack"), vec![0u8; 3000]).expect("pack");
        let co = Checkout {
            git_dir: git_dir.clone(),
            base_branch: "main".into(),
            base_sha: "0".repeat(40),
        };
        let share = hg.make_share_dir().expect("share dir");
        assert_eq!(share, hg.share_dir());
        hg.share(&co).await.expect("shared");
        let mut names: Vec<String> = std::fs::read_dir(&share)
            .expect("read")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["objects", "shallow"]);
        let linked = std::fs::metadata(share.join("objects/pack/p.pack")).expect("pack");
        let orig = std::fs::metadata(git_dir.join("objects/pack/p.pack")).expect("pack");
        assert_eq!(linked.ino(), orig.ino());
        assert_eq!(linked.mode() & 0o777, 0o444);
        let dir = std::fs::metadata(share.join("objects/pack")).expect("dir");
        assert_eq!(dir.mode() & 0o777, 0o755);
    }
}
