//! Helpers of the crate's tests: real git in temporary directories.

#![allow(dead_code)]

pub mod standin;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The environment of the test's own git (and of the "sandbox" side): nothing of the user's
/// configuration.
fn clean(cmd: &mut Command, home: &Path) {
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "Test")
        .env("GIT_AUTHOR_EMAIL", "test@localhost")
        .env("GIT_COMMITTER_NAME", "Test")
        .env("GIT_COMMITTER_EMAIL", "test@localhost")
        .env("LC_ALL", "C");
}

/// Runs the test's git in `dir`; panics with its stderr when it fails; returns stdout.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = git_out(dir, args);
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// [`git`] with `input` on its standard input (`hash-object --stdin`, `mktree`).
pub fn git_with_input(dir: &Path, args: &[&str], input: &str) -> String {
    use std::io::Write as _;
    let mut cmd = Command::new("git");
    clean(&mut cmd, dir);
    let mut child = cmd
        .args(args)
        .current_dir(dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run git");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(input.as_bytes()).expect("write to git");
    drop(stdin);
    let out = child.wait_with_output().expect("run git");
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

pub fn git_out(dir: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new("git");
    clean(&mut cmd, dir);
    cmd.args(args).current_dir(dir).output().expect("run git")
}

/// Runs an argv the crate built for the sandbox, as the current user, in `/`.
pub fn run_argv(argv: &[String], home: &Path) -> Output {
    let mut cmd = Command::new(&argv[0]);
    clean(&mut cmd, home);
    // What a sandbox's user has: no identity of its own beyond what the script passes.
    cmd.env_remove("GIT_AUTHOR_NAME")
        .env_remove("GIT_AUTHOR_EMAIL")
        .env_remove("GIT_COMMITTER_NAME")
        .env_remove("GIT_COMMITTER_EMAIL");
    cmd.args(&argv[1..])
        .current_dir("/")
        .output()
        .expect("run argv")
}

/// A repository with `README.md` and `src/lib.rs` on `main` and a second branch `dev`;
/// `bare` makes a bare copy at `path` (with `.git` appended by the caller as it likes).
pub fn make_repo(path: &Path) -> String {
    std::fs::create_dir_all(path).expect("mkdir repo");
    git(path, &["init", "-q", "-b", "main"]);
    std::fs::write(path.join("README.md"), "hello\n").expect("write");
    std::fs::create_dir_all(path.join("src")).expect("mkdir");
    std::fs::write(path.join("src/lib.rs"), "pub fn f() {}\n").expect("write");
    git(path, &["add", "-A"]);
    git(path, &["commit", "-q", "-m", "first"]);
    std::fs::write(path.join("README.md"), "hello again\n").expect("write");
    git(path, &["commit", "-q", "-am", "second"]);
    git(path, &["branch", "dev"]);
    git(path, &["rev-parse", "HEAD"])
}

/// A scratch "sandbox": `workspace` (the checkout), `tmp` (the bundle), `home`.
pub struct Sandbox {
    pub root: PathBuf,
    pub checkout: PathBuf,
    pub bundle: PathBuf,
    pub home: PathBuf,
}

impl Sandbox {
    pub fn new(root: &Path) -> Sandbox {
        let s = Sandbox {
            root: root.to_path_buf(),
            checkout: root.join("workspace"),
            bundle: root.join("tmp/.cella-branch.bundle"),
            home: root.join("home"),
        };
        std::fs::create_dir_all(root.join("tmp")).expect("mkdir");
        std::fs::create_dir_all(&s.home).expect("mkdir");
        s
    }

    /// What the server does before the agent starts: shares the host clone's objects (the
    /// sandbox would see `hg.share_dir()` at `/opt/cella-base`; here it reads it where it is)
    /// and runs the prepare script in the "sandbox".
    pub async fn prepare(
        &self,
        hg: &cella_tasks::HostGit,
        co: &cella_tasks::Checkout,
        branch: &str,
    ) {
        std::fs::create_dir_all(&self.checkout).expect("mkdir checkout");
        hg.share(co).await.expect("share");
        let argv = cella_tasks::git::sandbox_prepare_at(
            self.checkout.to_str().expect("utf-8"),
            hg.share_dir().to_str().expect("utf-8"),
            &co.base_branch,
            &co.base_sha,
            branch,
        );
        let out = run_argv(&argv, &self.home);
        assert!(
            out.status.success(),
            "prepare: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn collect(&self, base_sha: &str, branch: &str, message: &str) {
        let argv = cella_tasks::git::sandbox_collect_at(
            self.checkout.to_str().expect("utf-8"),
            self.bundle.to_str().expect("utf-8"),
            base_sha,
            branch,
            message,
        );
        let out = run_argv(&argv, &self.home);
        assert!(
            out.status.success(),
            "collect: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
