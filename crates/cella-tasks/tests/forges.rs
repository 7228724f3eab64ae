//! GitHub (App and fine-grained token) and GitLab forges against stand-ins of their REST APIs,
//! with real git over smart HTTP (`git http-backend`) behind them.
//!
//! This machine cannot reach the real GitHub or GitLab: the stand-ins in `common/standin.rs`
//! answer as the real APIs do and check each request as they would (auth header, User-Agent,
//! API version, the token request's scope, the pull request's body fields); git over HTTP is
//! refused unless Basic auth carries a live token for that repository.

mod common;

use cella_tasks::forge::{Forge, ForgeError, PullRequestSpec, RepoRef};
use cella_tasks::git::{GitError, HostGit};
use cella_tasks::{ForgeConfig, ForgeKind};
use common::standin::{Kind, StandIn, APP_ID, GITLAB_PROJECT_ID, GITLAB_TOKEN, PAT};
use common::{git, make_repo, Sandbox};
use std::path::Path;

const BRANCH: &str = "cella/tsk_forge1";

/// A bare repository at `<git_root>/<full>.git` made from a fresh repository; returns its
/// `main` tip.
fn serve_repo(tmp: &Path, git_root: &Path, full: &str) -> String {
    let src = tmp.join("src").join(full);
    let head = make_repo(&src);
    let dest = git_root.join(format!("{full}.git"));
    std::fs::create_dir_all(dest.parent().expect("parent")).expect("mkdir");
    git(
        tmp,
        &[
            "clone",
            "-q",
            "--bare",
            src.to_str().expect("utf-8"),
            dest.to_str().expect("utf-8"),
        ],
    );
    head
}

/// An RSA key pair made with openssl: (private key file, public key PEM).
fn app_key(dir: &Path) -> (std::path::PathBuf, Vec<u8>) {
    let key = dir.join("app.pem");
    let out = std::process::Command::new("openssl")
        .args(["genrsa", "-traditional", "-out"])
        .arg(&key)
        .arg("2048")
        .output()
        .expect("openssl");
    if !out.status.success() {
        // An openssl without -traditional writes PKCS#8, which is fine too.
        let out = std::process::Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(&key)
            .arg("2048")
            .output()
            .expect("openssl");
        assert!(out.status.success(), "openssl genrsa failed");
    }
    let out = std::process::Command::new("openssl")
        .args(["rsa", "-pubout", "-in"])
        .arg(&key)
        .output()
        .expect("openssl");
    assert!(out.status.success(), "openssl rsa -pubout failed");
    (key, out.stdout)
}

fn github_app(standin: &StandIn, key: &Path) -> Forge {
    Forge::from_config(ForgeConfig {
        name: "gh".into(),
        kind: ForgeKind::Github,
        url_template: None,
        app_id: Some(APP_ID),
        private_key_file: Some(key.to_path_buf()),
        api_url: Some(standin.base()),
        token: None,
        url: None,
        workspaces: Vec::new(),
    })
    .expect("github forge")
}

fn spec(title: &str) -> PullRequestSpec {
    PullRequestSpec {
        title: title.into(),
        body: "### Task\n\n> do it\n".into(),
        head: BRANCH.into(),
        base: "main".into(),
    }
}

/// The whole round over HTTP: clone with the credential, hand over, edit, take back, push.
async fn round_trip(tmp: &Path, forge: &Forge, repo: &RepoRef) -> (cella_tasks::Access, String) {
    let access = forge.open(repo).await.expect("open");
    let hg = HostGit::new(&tmp.join("run"));
    let (b, _) = hg.resolve_base(&access, None).await.expect("resolve");
    assert_eq!(b, "main");
    let co = hg.clone_base(&access, None, 1 << 30).await.expect("clone");
    let sbx = Sandbox::new(&tmp.join("sandbox"));
    sbx.prepare(&hg, &co, BRANCH).await;
    // No credential travelled into the sandbox.
    let secret = access
        .credential
        .as_ref()
        .expect("credential")
        .secret
        .clone();
    for f in walk(&sbx.checkout) {
        let data = std::fs::read(&f).expect("read");
        assert!(
            !String::from_utf8_lossy(&data).contains(&secret),
            "the credential is in {}",
            f.display()
        );
    }
    std::fs::write(sbx.checkout.join("EDIT.md"), "over http\n").expect("w");
    sbx.collect(&co.base_sha, BRANCH, "agent edit");
    let tip = hg
        .receive_bundle(&co, &sbx.bundle, BRANCH)
        .await
        .expect("receive")
        .expect("commits");
    hg.push(&co, &access, BRANCH).await.expect("push");
    hg.remove();
    (access, tip)
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read").flatten() {
            let p = e.path();
            if e.file_type().expect("type").is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_app_mints_a_scoped_token_pushes_opens_a_draft_and_revokes() {
    let tmp = tempfile::tempdir().expect("tmp");
    let git_root = tmp.path().join("served");
    serve_repo(tmp.path(), &git_root, "acme/app");
    let (key, public) = app_key(tmp.path());
    let standin = StandIn::start(
        Kind::GithubApp {
            public_key_pem: public,
        },
        &git_root,
        &["acme/app"],
        &[],
    )
    .await;
    let forge = github_app(&standin, &key);
    let repo = RepoRef::parse("acme/app", false).expect("repo");

    let (access, tip) = round_trip(tmp.path(), &forge, &repo).await;
    let cred = access.credential.clone().expect("credential");
    assert_eq!(cred.user, "x-access-token");
    assert!(cred.secret.starts_with("ghs_") && cred.secret.len() > 500);
    assert_eq!(access.default_branch.as_deref(), Some("main"));
    assert_eq!(
        access.clone_url,
        format!("{}/git/acme/app.git", standin.base())
    );
    assert!(
        !format!("{access:?}").contains(&cred.secret),
        "Debug shows no token"
    );

    // The branch landed on the forge with the edit.
    let served = git_root.join("acme/app.git");
    assert_eq!(git(&served, &["rev-parse", BRANCH]), tip);
    assert_eq!(
        git(&served, &["show", &format!("{BRANCH}:EDIT.md")]),
        "over http"
    );

    let pr = forge
        .open_pull_request(&access, &spec("Fix it"))
        .await
        .expect("pull request")
        .expect("github opens one");
    assert_eq!(pr.number, 1);
    assert!(pr.draft);
    assert_eq!(pr.url, format!("{}/acme/app/pull/1", standin.base()));

    forge.close(&access).await;
    {
        let seen = standin.seen.lock().expect("lock");
        assert!(seen.violations.is_empty(), "{:?}", seen.violations);
        assert_eq!(seen.token_requests.len(), 1);
        assert_eq!(
            seen.token_requests[0]["repositories"],
            serde_json::json!(["app"])
        );
        assert!(seen.revoked.contains(&cred.secret), "the token is revoked");
        assert!(seen.git_ok > 0);
        assert_eq!(seen.git_refused, 0);
        let pr = &seen.pulls[0];
        assert_eq!(pr["title"], "Fix it");
        assert_eq!(pr["head"], BRANCH);
        assert_eq!(pr["base"], "main");
        assert_eq!(pr["draft"], true);
        let paths: Vec<&str> = seen.requests.iter().map(String::as_str).collect();
        assert_eq!(
            paths,
            [
                "GET /repos/acme/app/installation",
                "POST /app/installations/42/access_tokens",
                "GET /repos/acme/app",
                "POST /repos/acme/app/pulls",
                "DELETE /installation/token",
            ]
        );
    }

    // A revoked token opens nothing more: git over HTTP is refused, and the error holds no
    // secret.
    let hg = HostGit::new(&tmp.path().join("run2"));
    match hg.clone_base(&access, Some("main"), 1 << 30).await {
        Err(e) => {
            let s = e.to_string();
            assert!(!s.contains(&cred.secret) && !s.contains('\n'), "{s}");
            assert!(
                matches!(e, GitError::NotFound(_) | GitError::CloneFailed(_)),
                "{e:?}"
            );
        }
        Ok(_) => panic!("a revoked token cloned"),
    }
    assert!(standin.seen.lock().expect("lock").git_refused > 0);
    hg.remove();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_app_repository_not_installed_or_hidden_is_not_found() {
    let tmp = tempfile::tempdir().expect("tmp");
    let git_root = tmp.path().join("served");
    serve_repo(tmp.path(), &git_root, "acme/app");
    let (key, public) = app_key(tmp.path());
    let standin = StandIn::start(
        Kind::GithubApp {
            public_key_pem: public,
        },
        &git_root,
        &["acme/app"],
        &["acme/hidden"],
    )
    .await;
    let forge = github_app(&standin, &key);
    match forge
        .open(&RepoRef::parse("acme/other", false).expect("repo"))
        .await
    {
        Err(ForgeError::NotFound(r)) => assert_eq!(r, "acme/other"),
        other => panic!("expected NotFound, got {other:?}"),
    }
    // Installed, a token minted, but the repository is not readable: the token is revoked
    // before the error is returned.
    match forge
        .open(&RepoRef::parse("acme/hidden", false).expect("repo"))
        .await
    {
        Err(ForgeError::NotFound(_)) => {}
        other => panic!("expected NotFound, got {other:?}"),
    }
    let seen = standin.seen.lock().expect("lock");
    assert!(seen.violations.is_empty(), "{:?}", seen.violations);
    assert_eq!(seen.minted.len(), 1);
    assert_eq!(seen.revoked.len(), 1, "the minted token was revoked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_app_with_an_unreadable_key_fails_at_start() {
    let tmp = tempfile::tempdir().expect("tmp");
    let bad = tmp.path().join("bad.pem");
    std::fs::write(
        &bad,
        "-----BEGIN RSA PRIVATE KEY-----\nnot a key\n-----END RSA PRIVATE KEY-----\n",
    )
    .expect("w");
    let cfg = |p: &Path| ForgeConfig {
        name: "gh".into(),
        kind: ForgeKind::Github,
        url_template: None,
        app_id: Some(1),
        private_key_file: Some(p.to_path_buf()),
        api_url: None,
        token: None,
        url: None,
        workspaces: Vec::new(),
    };
    match Forge::from_config(cfg(&bad)) {
        Err(ForgeError::Config(m)) => assert!(!m.contains("not a key"), "{m}"),
        other => panic!("expected Config, got {other:?}"),
    }
    assert!(matches!(
        Forge::from_config(cfg(&tmp.path().join("missing.pem"))),
        Err(ForgeError::Config(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_fine_grained_token_needs_no_minting_and_no_revoke() {
    let tmp = tempfile::tempdir().expect("tmp");
    let git_root = tmp.path().join("served");
    serve_repo(tmp.path(), &git_root, "acme/app");
    let standin = StandIn::start(Kind::GithubToken, &git_root, &["acme/app"], &[]).await;
    let forge = Forge::from_config(ForgeConfig {
        name: "gh".into(),
        kind: ForgeKind::Github,
        url_template: None,
        app_id: None,
        private_key_file: None,
        api_url: Some(format!("{}/", standin.base())),
        token: Some(PAT.into()),
        url: None,
        workspaces: Vec::new(),
    })
    .expect("forge");
    let repo = RepoRef::parse("acme/app", false).expect("repo");
    let (access, tip) = round_trip(tmp.path(), &forge, &repo).await;
    assert_eq!(
        git(&git_root.join("acme/app.git"), &["rev-parse", BRANCH]),
        tip
    );
    let pr = forge
        .open_pull_request(&access, &spec("With a PAT"))
        .await
        .expect("pr")
        .expect("one");
    assert!(pr.draft);
    forge.close(&access).await;
    {
        let seen = standin.seen.lock().expect("lock");
        assert!(seen.violations.is_empty(), "{:?}", seen.violations);
        assert!(seen.minted.is_empty() && seen.revoked.is_empty());
        assert!(!seen.requests.iter().any(|r| r.starts_with("DELETE")));
    }

    // A repository the token cannot read is NotFound.
    match forge
        .open(&RepoRef::parse("acme/private", false).expect("repo"))
        .await
    {
        Err(ForgeError::NotFound(_)) => {}
        other => panic!("expected NotFound, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitlab_nested_project_clone_push_and_draft_merge_request() {
    let tmp = tempfile::tempdir().expect("tmp");
    let git_root = tmp.path().join("served");
    let full = "group/sub/app";
    serve_repo(tmp.path(), &git_root, full);
    let standin = StandIn::start(Kind::Gitlab, &git_root, &[full], &[]).await;
    let forge = Forge::from_config(ForgeConfig {
        name: "gl".into(),
        kind: ForgeKind::Gitlab,
        url_template: None,
        app_id: None,
        private_key_file: None,
        api_url: None,
        token: Some(GITLAB_TOKEN.into()),
        url: Some(standin.base()),
        workspaces: Vec::new(),
    })
    .expect("forge");
    assert!(forge.nested_names());
    let repo = RepoRef::parse(full, forge.nested_names()).expect("repo");
    let (access, tip) = round_trip(tmp.path(), &forge, &repo).await;
    assert_eq!(
        access.credential.as_ref().map(|c| c.user.as_str()),
        Some("oauth2")
    );
    assert_eq!(
        git(
            &git_root.join(format!("{full}.git")),
            &["rev-parse", BRANCH]
        ),
        tip
    );
    let mr = forge
        .open_pull_request(&access, &spec("Fix it"))
        .await
        .expect("mr")
        .expect("one");
    assert_eq!(mr.number, 1);
    assert!(mr.draft);
    assert_eq!(
        mr.url,
        format!("{}/{full}/-/merge_requests/1", standin.base())
    );
    forge.close(&access).await;
    {
        let seen = standin.seen.lock().expect("lock");
        assert!(seen.violations.is_empty(), "{:?}", seen.violations);
        let m = &seen.pulls[0];
        assert_eq!(m["title"], "Draft: Fix it");
        assert_eq!(m["source_branch"], BRANCH);
        assert_eq!(m["target_branch"], "main");
        assert!(seen.requests.contains(&format!(
            "POST /api/v4/projects/{GITLAB_PROJECT_ID}/merge_requests"
        )));
        assert!(seen.git_ok > 0 && seen.git_refused == 0);
    }

    // The forge refusing (here an unknown source branch, its answer echoing the token): one
    // line, no token.
    let mut bad = spec("x");
    bad.head = "cella/none".into();
    match forge.open_pull_request(&access, &bad).await {
        Err(ForgeError::Refused(m)) => {
            assert!(!m.contains(GITLAB_TOKEN) && !m.contains('\n'), "{m}");
            assert!(m.contains("source_branch"), "{m}");
        }
        other => panic!("expected Refused, got {other:?}"),
    }
    // An unknown project is NotFound; a wrong token is refused without showing it.
    match forge
        .open(&RepoRef::parse("group/none", true).expect("repo"))
        .await
    {
        Err(ForgeError::NotFound(_)) => {}
        other => panic!("expected NotFound, got {other:?}"),
    }
    let wrong = Forge::from_config(ForgeConfig {
        token: Some("glpat-wrong-token".into()),
        ..forge.config.clone()
    })
    .expect("forge");
    match wrong.open(&repo).await {
        Err(ForgeError::Refused(m)) => assert!(!m.contains("glpat-wrong-token"), "{m}"),
        other => panic!("expected Refused, got {other:?}"),
    }
}

#[tokio::test]
async fn an_unreachable_forge_is_unreachable() {
    // A port nothing listens on (bound, then closed).
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let forge = Forge::from_config(ForgeConfig {
        name: "gh".into(),
        kind: ForgeKind::Github,
        url_template: None,
        app_id: None,
        private_key_file: None,
        api_url: Some(format!("http://127.0.0.1:{port}")),
        token: Some(PAT.into()),
        url: None,
        workspaces: Vec::new(),
    })
    .expect("forge");
    match forge
        .open(&RepoRef::parse("acme/app", false).expect("repo"))
        .await
    {
        Err(ForgeError::Unreachable(m)) => assert!(!m.contains(PAT) && !m.contains('\n'), "{m}"),
        other => panic!("expected Unreachable, got {other:?}"),
    }
}

/// A repository whose plan has no draft pull requests: GitHub answers 422, and the pull request
/// is opened as a normal one (reported with `draft: false`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_without_drafts_opens_a_normal_pull_request() {
    let tmp = tempfile::tempdir().expect("tmp");
    let git_root = tmp.path().join("served");
    serve_repo(tmp.path(), &git_root, "acme/app");
    let standin = StandIn::start_with(Kind::GithubToken, &git_root, &["acme/app"], &[], true).await;
    let forge = Forge::from_config(ForgeConfig {
        name: "gh".into(),
        kind: ForgeKind::Github,
        url_template: None,
        app_id: None,
        private_key_file: None,
        api_url: Some(standin.base()),
        token: Some(PAT.into()),
        url: None,
        workspaces: Vec::new(),
    })
    .expect("forge");
    let repo = RepoRef::parse("acme/app", false).expect("repo");
    let (access, _) = round_trip(tmp.path(), &forge, &repo).await;
    let pr = forge
        .open_pull_request(&access, &spec("No drafts here"))
        .await
        .expect("pr")
        .expect("one");
    assert!(!pr.draft);
    let seen = standin.seen.lock().expect("lock");
    assert!(seen.violations.is_empty(), "{:?}", seen.violations);
    assert_eq!(seen.pulls.len(), 1);
    assert_eq!(seen.pulls[0]["draft"], false);
    let posts = seen
        .requests
        .iter()
        .filter(|r| r.as_str() == "POST /repos/acme/app/pulls")
        .count();
    assert_eq!(posts, 2, "a draft first, then a normal one");
}

/// A forge answering with a redirect to another host never gets the token sent there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_another_host_gets_no_token() {
    use axum::routing::get;
    use std::sync::{Arc, Mutex};
    let got: Arc<Mutex<Vec<String>>> = Arc::default();
    let g = got.clone();
    let other = axum::Router::new().fallback(move |h: axum::http::HeaderMap| {
        let g = g.clone();
        async move {
            let t = h
                .get("private-token")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("none")
                .to_string();
            g.lock().expect("lock").push(t);
            "{}"
        }
    });
    let l2 = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let other_addr = l2.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(l2, other).await;
    });
    // "localhost" and "127.0.0.1" are different origins.
    let target = format!("http://localhost:{}/stolen", other_addr.port());
    let first = axum::Router::new().route(
        "/api/v4/projects/{id}",
        get(move || {
            let target = target.clone();
            async move { axum::response::Redirect::temporary(&target) }
        }),
    );
    let l1 = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let first_addr = l1.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(l1, first).await;
    });
    let forge = Forge::from_config(ForgeConfig {
        name: "gl".into(),
        kind: ForgeKind::Gitlab,
        url_template: None,
        app_id: None,
        private_key_file: None,
        api_url: None,
        token: Some(GITLAB_TOKEN.into()),
        url: Some(format!("http://{first_addr}")),
        workspaces: Vec::new(),
    })
    .expect("forge");
    let r = forge
        .open(&RepoRef::parse("group/app", true).expect("repo"))
        .await;
    assert!(r.is_err(), "{r:?}");
    assert!(
        got.lock().expect("lock").is_empty(),
        "the other host was asked"
    );
}

/// A `git` forge whose `url_template` is an http URL: clone and push over smart HTTP, no
/// credential, no pull request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_forge_over_http() {
    let tmp = tempfile::tempdir().expect("tmp");
    let git_root = tmp.path().join("served");
    serve_repo(tmp.path(), &git_root, "acme/app");
    let standin = StandIn::start(Kind::AnonymousGit, &git_root, &["acme/app"], &[]).await;
    let forge = Forge::from_config(ForgeConfig {
        name: "plain".into(),
        kind: ForgeKind::Git,
        url_template: Some(format!("{}/git/{{repository}}.git", standin.base())),
        app_id: None,
        private_key_file: None,
        api_url: None,
        token: None,
        url: None,
        workspaces: Vec::new(),
    })
    .expect("forge");
    let repo = RepoRef::parse("acme/app", false).expect("repo");
    let access = forge.open(&repo).await.expect("open");
    assert!(access.credential.is_none());
    let hg = HostGit::new(&tmp.path().join("run"));
    let (b, _) = hg.resolve_base(&access, None).await.expect("resolve");
    assert_eq!(b, "main");
    let co = hg.clone_base(&access, None, 1 << 30).await.expect("clone");
    let sbx = Sandbox::new(&tmp.path().join("sandbox"));
    sbx.prepare(&hg, &co, BRANCH).await;
    std::fs::write(sbx.checkout.join("EDIT.md"), "plain http\n").expect("w");
    sbx.collect(&co.base_sha, BRANCH, "edit");
    let tip = hg
        .receive_bundle(&co, &sbx.bundle, BRANCH)
        .await
        .expect("receive")
        .expect("commits");
    hg.push(&co, &access, BRANCH).await.expect("push");
    assert_eq!(
        git(&git_root.join("acme/app.git"), &["rev-parse", BRANCH]),
        tip
    );
    assert_eq!(
        forge
            .open_pull_request(&access, &spec("x"))
            .await
            .expect("none"),
        None
    );
    // A repository the host does not have is NotFound at start.
    let missing = forge
        .open(&RepoRef::parse("acme/missing", false).expect("repo"))
        .await
        .expect("open");
    match hg.resolve_base(&missing, None).await {
        Err(GitError::NotFound(_)) => {}
        other => panic!("expected NotFound, got {other:?}"),
    }
    // A host nothing listens on is Unreachable.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let mut down = access.clone();
    down.clone_url = format!("http://127.0.0.1:{port}/git/acme/app.git");
    match hg.resolve_base(&down, None).await {
        Err(GitError::Unreachable(m)) => assert!(!m.contains('\n'), "{m}"),
        other => panic!("expected Unreachable, got {other:?}"),
    }
    hg.remove();
}

/// GitHub's rate limit answer (403 with no requests left) is the forge being unavailable, not
/// the repository being missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_github_is_unreachable_not_not_found() {
    use axum::response::IntoResponse;
    let app = axum::Router::new().fallback(|| async {
        (
            axum::http::StatusCode::FORBIDDEN,
            [("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "1")],
            "{\"message\":\"API rate limit exceeded\"}",
        )
            .into_response()
    });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    let forge = Forge::from_config(ForgeConfig {
        name: "gh".into(),
        kind: ForgeKind::Github,
        url_template: None,
        app_id: None,
        private_key_file: None,
        api_url: Some(format!("http://{addr}")),
        token: Some(PAT.into()),
        url: None,
        workspaces: Vec::new(),
    })
    .expect("forge");
    match forge
        .open(&RepoRef::parse("acme/app", false).expect("repo"))
        .await
    {
        Err(ForgeError::Unreachable(m)) => assert!(m.contains("rate limit"), "{m}"),
        other => panic!("expected Unreachable, got {other:?}"),
    }
}
