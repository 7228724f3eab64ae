//! Host-side git end to end with real git in temporary directories: the `git` forge over local
//! paths, clone -> share -> prepare (the sandbox side) -> edit + collect -> receive -> push, and
//! the attacks of a sandbox on the host's git.

mod common;

use cella_tasks::forge::{Forge, ForgeError, RepoRef};
use cella_tasks::git::{GitError, HostGit};
use cella_tasks::ForgeConfig;
use common::{git, git_out, git_with_input, make_repo, Sandbox};
use std::path::Path;

const BRANCH: &str = "cella/tsk_test1";

fn forge(root: &Path) -> Forge {
    Forge::from_config(ForgeConfig::local_default(root)).expect("local forge")
}

fn repo(s: &str) -> RepoRef {
    RepoRef::parse(s, false).expect("repo ref")
}

#[tokio::test]
async fn local_forge_finds_plain_and_dot_git_paths() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("repos");
    make_repo(&root.join("acme/app"));
    let bare = root.join("acme/lib.git");
    git(
        tmp.path(),
        &["init", "-q", "--bare", bare.to_str().expect("utf-8")],
    );
    let f = forge(&root);
    assert_eq!(f.name(), "local");

    let a = f.open(&repo("acme/app")).await.expect("open app");
    assert_eq!(a.clone_url, root.join("acme/app").to_string_lossy());
    assert!(a.credential.is_none());
    let a = f.open(&repo("acme/lib")).await.expect("open lib");
    assert_eq!(a.clone_url, bare.to_string_lossy());

    match f.open(&repo("acme/missing")).await {
        Err(ForgeError::NotFound(r)) => assert_eq!(r, "acme/missing"),
        other => panic!("expected NotFound, got {other:?}"),
    }
    // A git forge opens no pull request: the branch is the handoff.
    let spec = cella_tasks::forge::PullRequestSpec {
        title: "t".into(),
        body: "b".into(),
        head: BRANCH.into(),
        base: "main".into(),
    };
    let a = f.open(&repo("acme/app")).await.expect("open app");
    assert_eq!(f.open_pull_request(&a, &spec).await.expect("pr"), None);
    f.close(&a).await;
}

#[tokio::test]
async fn resolve_base_and_a_missing_branch() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("repos");
    let head = make_repo(&root.join("acme/app"));
    let f = forge(&root);
    let access = f.open(&repo("acme/app")).await.expect("open");
    let hg = HostGit::new(&tmp.path().join("run"));

    let (b, sha) = hg.resolve_base(&access, None).await.expect("default");
    assert_eq!((b.as_str(), sha.as_str()), ("main", head.as_str()));
    let (b, sha) = hg.resolve_base(&access, Some("dev")).await.expect("dev");
    assert_eq!((b.as_str(), sha.as_str()), ("dev", head.as_str()));
    match hg.resolve_base(&access, Some("nope")).await {
        Err(GitError::BaseBranchMissing(b)) => assert_eq!(b, "nope"),
        other => panic!("expected BaseBranchMissing, got {other:?}"),
    }
    match hg
        .resolve_base(&access, Some("-x --upload-pack=touch"))
        .await
    {
        Err(GitError::BaseBranchMissing(_)) => {}
        other => panic!("expected BaseBranchMissing, got {other:?}"),
    }
    // resolve_base leaves nothing behind.
    assert!(!tmp.path().join("run").exists());

    match hg.clone_base(&access, Some("nope"), 1 << 30).await {
        Err(GitError::BaseBranchMissing(b)) => assert_eq!(b, "nope"),
        other => panic!("expected BaseBranchMissing, got {other:?}"),
    }
    assert!(!tmp.path().join("run/repo.git").exists());
}

#[tokio::test]
async fn a_repository_over_the_limit_is_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("repos");
    let path = root.join("acme/big");
    make_repo(&path);
    // Random bytes do not compress: the clone is larger than 200 KB.
    let mut data = Vec::with_capacity(1 << 20);
    let mut x: u64 = 0x9e3779b97f4a7c15;
    for _ in 0..(1 << 17) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    std::fs::write(path.join("blob.bin"), &data).expect("write");
    git(&path, &["add", "-A"]);
    git(&path, &["commit", "-q", "-m", "big"]);
    let access = forge(&root).open(&repo("acme/big")).await.expect("open");
    let hg = HostGit::new(&tmp.path().join("run"));
    match hg.clone_base(&access, None, 200_000).await {
        Err(GitError::TooLarge(n)) => assert_eq!(n, 200_000),
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert!(!tmp.path().join("run/repo.git").exists());
    hg.remove();
    assert!(!tmp.path().join("run").exists());
}

/// clone -> share -> prepare -> edit + collect -> receive -> push: the remote has the branch
/// with the edit, and nothing else changed on it.
#[tokio::test]
async fn a_run_end_to_end_over_local_paths() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("repos");
    let remote = root.join("acme/app");
    let head = make_repo(&remote);
    let f = forge(&root);
    let access = f.open(&repo("acme/app")).await.expect("open");
    let hg = HostGit::new(&tmp.path().join("run"));

    let co = hg.clone_base(&access, None, 1 << 30).await.expect("clone");
    assert_eq!(co.base_branch, "main");
    assert_eq!(co.base_sha, head);
    // Shallow and bare.
    assert!(co.git_dir.join("shallow").exists());
    assert_eq!(
        git(&co.git_dir, &["rev-parse", "--is-bare-repository"]),
        "true"
    );
    assert_eq!(git(&co.git_dir, &["rev-list", "--count", "HEAD"]), "1");

    let sbx = Sandbox::new(&tmp.path().join("sandbox"));
    sbx.prepare(&hg, &co, BRANCH).await;
    // The base branch is there at the base commit; the objects are borrowed, not copied.
    assert_eq!(git(&sbx.checkout, &["rev-parse", "main"]), head);
    assert_eq!(
        std::fs::read_dir(sbx.checkout.join(".git/objects/pack"))
            .expect("pack dir")
            .count(),
        0
    );
    assert_eq!(
        std::fs::read_to_string(sbx.checkout.join("README.md")).expect("read"),
        "hello again\n"
    );
    assert_eq!(
        git(&sbx.checkout, &["rev-parse", "--abbrev-ref", "HEAD"]),
        BRANCH
    );
    assert_eq!(git(&sbx.checkout, &["status", "--porcelain"]), "");
    // The host's remote URL did not travel into the sandbox.
    let cfg = std::fs::read_to_string(sbx.checkout.join(".git/config")).expect("config");
    assert!(!cfg.contains("acme"), "{cfg}");

    // The agent commits one change and leaves another uncommitted.
    std::fs::write(sbx.checkout.join("src/lib.rs"), "pub fn f() -> u8 { 1 }\n").expect("w");
    git(
        &sbx.checkout,
        &["commit", "-q", "-am", "agent: f returns 1"],
    );
    std::fs::write(sbx.checkout.join("NEW.md"), "made by the agent\n").expect("w");
    sbx.collect(&co.base_sha, BRANCH, "Cella: the rest");
    assert!(sbx.bundle.exists());
    // The uncommitted file was committed by Cella with its identity.
    assert_eq!(
        git(&sbx.checkout, &["log", "-1", "--format=%an <%ae> %s"]),
        "Cella <cella@localhost> Cella: the rest"
    );

    let tip = hg
        .receive_bundle(&co, &sbx.bundle, BRANCH)
        .await
        .expect("receive")
        .expect("commits");
    assert_eq!(tip, git(&sbx.checkout, &["rev-parse", BRANCH]));
    assert_eq!(hg.count_commits(&co, &tip).await.expect("count"), 2);
    hg.push(&co, &access, BRANCH).await.expect("push");

    assert_eq!(git(&remote, &["rev-parse", BRANCH]), tip);
    assert_eq!(
        git(&remote, &["show", &format!("{BRANCH}:NEW.md")]),
        "made by the agent"
    );
    assert_eq!(
        git(&remote, &["show", &format!("{BRANCH}:src/lib.rs")]),
        "pub fn f() -> u8 { 1 }"
    );
    assert_eq!(git(&remote, &["rev-parse", "main"]), head, "main untouched");
    let refs = git(&remote, &["for-each-ref", "--format=%(refname)"]);
    assert_eq!(
        refs.lines().collect::<Vec<_>>(),
        [
            "refs/heads/cella/tsk_test1",
            "refs/heads/dev",
            "refs/heads/main"
        ]
    );

    hg.remove();
    assert!(!tmp.path().join("run").exists());
    hg.remove();
}

/// A base commit kept by one run serves the next without a clone: the second run's host
/// repository is linked to the kept objects, its sandbox checks out the same files, and its
/// branch is received and pushed as a cloned run's is. A base that moved is a new commit: no
/// entry, so a clone.
#[tokio::test]
async fn a_kept_base_serves_the_next_run_and_a_moved_base_is_cloned() {
    use cella_tasks::cache::{CheckoutCache, Key};
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("repos");
    let remote = root.join("acme/app");
    let head = make_repo(&remote);
    let f = forge(&root);
    let access = f.open(&repo("acme/app")).await.expect("open");
    let day = std::time::Duration::from_secs(86_400);
    let cache = CheckoutCache::new(&tmp.path().join("cache"), 1 << 30, day);
    let key = |sha: &str| Key::new("local", "acme/app", sha, true).expect("key");

    let first = HostGit::new(&tmp.path().join("run1"));
    let co = first
        .clone_base(&access, None, 1 << 30)
        .await
        .expect("clone");
    assert!(cache.get(&key(&head)).is_none());
    cache.put(&co.git_dir, &key(&head)).expect("keep");
    first.remove();
    assert!(!tmp.path().join("run1").exists());

    let hg = HostGit::new(&tmp.path().join("run2"));
    let (branch, sha) = hg.resolve_base(&access, Some("dev")).await.expect("tip");
    assert_eq!(sha, head);
    let entry = cache.get(&key(&sha)).expect("kept");
    assert!(entry.bytes > 0);
    let co = hg
        .from_cache(&entry.dir, &branch, &sha)
        .await
        .expect("linked");
    assert_eq!(
        (co.base_branch.as_str(), co.base_sha.as_str()),
        ("dev", head.as_str())
    );
    assert_eq!(git(&co.git_dir, &["rev-parse", "refs/heads/dev"]), head);
    let sbx = Sandbox::new(&tmp.path().join("sandbox"));
    sbx.prepare(&hg, &co, BRANCH).await;
    assert_eq!(
        std::fs::read_to_string(sbx.checkout.join("README.md")).expect("read"),
        "hello again\n"
    );
    std::fs::write(sbx.checkout.join("NEW.md"), "from a kept base\n").expect("w");
    sbx.collect(&co.base_sha, BRANCH, "Cella: work");
    let tip = hg
        .receive_bundle(&co, &sbx.bundle, BRANCH)
        .await
        .expect("receive")
        .expect("commits");
    hg.push(&co, &access, BRANCH).await.expect("push");
    assert_eq!(git(&remote, &["rev-parse", BRANCH]), tip);
    assert_eq!(
        git(&remote, &["show", &format!("{BRANCH}:NEW.md")]),
        "from a kept base"
    );
    hg.remove();
    // The kept entry is as it was: the run's fetch wrote into its own directory only.
    let again = cache.get(&key(&head)).expect("still kept");
    assert_eq!(again.bytes, entry.bytes);

    // The base moves: its new tip has no entry.
    std::fs::write(remote.join("README.md"), "moved\n").expect("write");
    git(&remote, &["commit", "-q", "-am", "third"]);
    let hg = HostGit::new(&tmp.path().join("run3"));
    let (_, moved) = hg.resolve_base(&access, None).await.expect("tip");
    assert_ne!(moved, head);
    assert!(cache.get(&key(&moved)).is_none());
    // Objects that lack the commit they are taken for are refused, not trusted.
    assert!(hg.from_cache(&again.dir, "main", &moved).await.is_err());
    // And an entry kept under another commit's name is not served.
    cache.put(&again.dir, &key(&moved)).expect("keep");
    assert!(cache.get(&key(&moved)).is_none());
}

#[tokio::test]
async fn no_commits_means_no_bundle_and_nothing_pushed() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("repos");
    make_repo(&root.join("acme/app"));
    let access = forge(&root).open(&repo("acme/app")).await.expect("open");
    let hg = HostGit::new(&tmp.path().join("run"));
    let co = hg
        .clone_base(&access, Some("dev"), 1 << 30)
        .await
        .expect("clone");
    assert_eq!(co.base_branch, "dev");
    let sbx = Sandbox::new(&tmp.path().join("sandbox"));
    sbx.prepare(&hg, &co, BRANCH).await;
    std::fs::write(&sbx.bundle, b"an old bundle").expect("w");
    sbx.collect(&co.base_sha, BRANCH, "nothing");
    assert!(
        !sbx.bundle.exists(),
        "no commits: no bundle (the old one removed)"
    );

    // A bundle whose branch is the base itself: no commits.
    git(
        &sbx.checkout,
        &[
            "bundle",
            "create",
            sbx.bundle.to_str().expect("utf-8"),
            BRANCH,
        ],
    );
    assert_eq!(
        hg.receive_bundle(&co, &sbx.bundle, BRANCH)
            .await
            .expect("receive"),
        None
    );
}

/// A sandbox that tried everything against the host: its `.git/config` has `core.fsmonitor`, a
/// `core.hooksPath` of its own and a filter driver named in `.gitattributes`, its hooks
/// directory has `post-checkout`, `pre-push`, `reference-transaction` (and more), each writing
/// a marker file. Receive and push on the host run none of them.
#[tokio::test]
async fn nothing_the_sandbox_wrote_runs_on_the_host() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("repos");
    let remote = root.join("acme/app");
    make_repo(&remote);
    let access = forge(&root).open(&repo("acme/app")).await.expect("open");
    let hg = HostGit::new(&tmp.path().join("run"));
    let co = hg.clone_base(&access, None, 1 << 30).await.expect("clone");
    let sbx = Sandbox::new(&tmp.path().join("sandbox"));
    sbx.prepare(&hg, &co, BRANCH).await;

    let markers = tmp.path().join("markers");
    std::fs::create_dir_all(&markers).expect("mkdir");
    let m = markers.to_str().expect("utf-8");
    let hook = |name: &str| format!("#!/bin/sh\ntouch '{m}/{name}'\nexit 0\n");
    let gitdir = sbx.checkout.join(".git");
    let evil_hooks = sbx.checkout.join(".git/evil-hooks");
    std::fs::create_dir_all(&evil_hooks).expect("mkdir");
    for dir in [gitdir.join("hooks"), evil_hooks.clone()] {
        std::fs::create_dir_all(&dir).expect("mkdir");
        for name in [
            "post-checkout",
            "pre-push",
            "reference-transaction",
            "pre-receive",
            "post-receive",
            "update",
            "post-update",
            "fsmonitor-watchman",
            "post-merge",
            "pre-auto-gc",
        ] {
            let p = dir.join(name);
            std::fs::write(&p, hook(name)).expect("w");
            std::os::unix::fs::PermissionsExt::set_mode(
                &mut std::fs::metadata(&p).expect("md").permissions(),
                0o755,
            );
            std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .expect("chmod");
        }
    }
    let mut cfg = std::fs::read_to_string(gitdir.join("config")).expect("config");
    cfg.push_str(&format!(
        "[core]\n\tfsmonitor = \"touch '{m}/fsmonitor'; false\"\n\thooksPath = {}\n\
         [filter \"evil\"]\n\tclean = \"touch '{m}/clean'; cat\"\n\tsmudge = \"touch '{m}/smudge'; cat\"\n\
         [diff \"evil\"]\n\ttextconv = \"touch '{m}/textconv'; cat\"\n\
         [uploadpack]\n\tpackObjectsHook = \"touch '{m}/packhook'\"\n\
         [protocol]\n\tallow = always\n\
         [remote \"origin\"]\n\turl = ext::sh -c touch% '{m}/ext'\n",
        evil_hooks.display()
    ));
    std::fs::write(gitdir.join("config"), cfg).expect("w");
    std::fs::write(
        sbx.checkout.join(".gitattributes"),
        "* filter=evil diff=evil\n",
    )
    .expect("w");
    std::fs::write(sbx.checkout.join("README.md"), "changed by the agent\n").expect("w");

    // The sandbox side may run what it likes (it is the sandbox); only the host matters.
    sbx.collect(&co.base_sha, BRANCH, "attack");
    assert!(sbx.bundle.exists());
    // The traps are armed: a plain git in the sandbox's checkout springs them.
    git(&sbx.checkout, &["checkout", "-q", "-b", "probe"]);
    git(&sbx.checkout, &["checkout", "-q", BRANCH]);
    let sprung: Vec<_> = std::fs::read_dir(&markers)
        .expect("read")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(sprung.iter().any(|m| m == "post-checkout"), "{sprung:?}");
    assert!(sprung.iter().any(|m| m == "fsmonitor"), "{sprung:?}");
    assert!(
        sprung.iter().any(|m| m == "reference-transaction"),
        "{sprung:?}"
    );
    for e in std::fs::read_dir(&markers).expect("read") {
        std::fs::remove_file(e.expect("entry").path()).expect("rm");
    }

    let tip = hg
        .receive_bundle(&co, &sbx.bundle, BRANCH)
        .await
        .expect("receive")
        .expect("commits");
    hg.push(&co, &access, BRANCH).await.expect("push");
    let left: Vec<_> = std::fs::read_dir(&markers)
        .expect("read")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(left.is_empty(), "the host ran the sandbox's code: {left:?}");
    assert_eq!(git(&remote, &["rev-parse", BRANCH]), tip);
    // The branch holds the agent's files as data (the attributes file too), nothing ran.
    assert_eq!(
        git(&remote, &["show", &format!("{BRANCH}:.gitattributes")]),
        "* filter=evil diff=evil"
    );
}

#[tokio::test]
async fn a_branch_not_descending_from_the_base_is_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("repos");
    let remote = root.join("acme/app");
    make_repo(&remote);
    let access = forge(&root).open(&repo("acme/app")).await.expect("open");
    let hg = HostGit::new(&tmp.path().join("run"));
    let co = hg.clone_base(&access, None, 1 << 30).await.expect("clone");
    let sbx = Sandbox::new(&tmp.path().join("sandbox"));
    sbx.prepare(&hg, &co, BRANCH).await;
    let b = sbx.bundle.to_str().expect("utf-8");

    // An orphan history under the run's branch name, bundled whole (no prerequisites).
    git(&sbx.checkout, &["checkout", "-q", "--orphan", "orphan"]);
    git(&sbx.checkout, &["rm", "-rq", "--cached", "."]);
    std::fs::write(sbx.checkout.join("OTHER.md"), "unrelated\n").expect("w");
    git(&sbx.checkout, &["add", "OTHER.md"]);
    git(&sbx.checkout, &["commit", "-q", "-m", "orphan"]);
    git(&sbx.checkout, &["branch", "-f", BRANCH, "orphan"]);
    git(&sbx.checkout, &["bundle", "create", b, BRANCH]);
    match hg.receive_bundle(&co, &sbx.bundle, BRANCH).await {
        Err(GitError::BadBundle(why)) => assert!(why.contains("descend"), "{why}"),
        other => panic!("expected BadBundle, got {other:?}"),
    }
    // Nothing of it is left on the host's clone, and nothing reaches the remote.
    assert!(
        git_out(&co.git_dir, &["rev-parse", "--verify", "-q", BRANCH])
            .stdout
            .is_empty()
    );
    assert!(git_out(&remote, &["rev-parse", "--verify", "-q", BRANCH])
        .stdout
        .is_empty());

    // A bundle whose prerequisite the host does not have (made on top of another commit).
    git(
        &sbx.checkout,
        &["commit", "-q", "--allow-empty", "-m", "two"],
    );
    git(&sbx.checkout, &["branch", "-f", BRANCH, "orphan"]);
    std::fs::remove_file(&sbx.bundle).expect("rm");
    git(
        &sbx.checkout,
        &["bundle", "create", b, &format!("orphan~1..{BRANCH}")],
    );
    match hg.receive_bundle(&co, &sbx.bundle, BRANCH).await {
        Err(GitError::BadBundle(_)) => {}
        other => panic!("expected BadBundle, got {other:?}"),
    }

    // Garbage, a bundle without the branch, a missing file, a symlink.
    std::fs::write(&sbx.bundle, b"# v2 git bundle\nnot really\n").expect("w");
    assert!(matches!(
        hg.receive_bundle(&co, &sbx.bundle, BRANCH).await,
        Err(GitError::BadBundle(_))
    ));
    std::fs::remove_file(&sbx.bundle).expect("rm");
    git(&sbx.checkout, &["bundle", "create", b, "orphan"]);
    match hg.receive_bundle(&co, &sbx.bundle, BRANCH).await {
        Err(GitError::BadBundle(why)) => {
            assert!(why.contains("no branch"), "{why}");
            // Names the sandbox chose never reach the (stored) failure reason.
            assert!(!why.contains("orphan"), "{why}");
        }
        other => panic!("expected BadBundle, got {other:?}"),
    }
    assert!(matches!(
        hg.receive_bundle(&co, &tmp.path().join("nothing"), BRANCH)
            .await,
        Err(GitError::BadBundle(_))
    ));
    let link = tmp.path().join("link.bundle");
    std::os::unix::fs::symlink(&sbx.bundle, &link).expect("symlink");
    assert!(matches!(
        hg.receive_bundle(&co, &link, BRANCH).await,
        Err(GitError::BadBundle(_))
    ));
}

#[tokio::test]
async fn only_the_runs_branch_lands() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("repos");
    let remote = root.join("acme/app");
    let head = make_repo(&remote);
    let access = forge(&root).open(&repo("acme/app")).await.expect("open");
    let hg = HostGit::new(&tmp.path().join("run"));
    let co = hg.clone_base(&access, None, 1 << 30).await.expect("clone");
    let sbx = Sandbox::new(&tmp.path().join("sandbox"));
    sbx.prepare(&hg, &co, BRANCH).await;

    std::fs::write(sbx.checkout.join("A.md"), "a\n").expect("w");
    git(&sbx.checkout, &["add", "A.md"]);
    git(&sbx.checkout, &["commit", "-q", "-m", "a"]);
    // Extra refs: a branch named like the base (main), another branch and a tag.
    git(&sbx.checkout, &["branch", "-f", "main", "HEAD"]);
    git(&sbx.checkout, &["branch", "evil", "HEAD"]);
    git(&sbx.checkout, &["tag", "v666", "HEAD"]);
    let b = sbx.bundle.to_str().expect("utf-8");
    let range = format!("{}..{BRANCH}", co.base_sha);
    git(
        &sbx.checkout,
        &["bundle", "create", b, &range, "main", "evil", "v666"],
    );
    let heads = git(&sbx.checkout, &["bundle", "list-heads", b]);
    assert!(heads.contains("refs/heads/evil") && heads.contains("refs/tags/v666"));

    let tip = hg
        .receive_bundle(&co, &sbx.bundle, BRANCH)
        .await
        .expect("receive")
        .expect("commits");
    hg.push(&co, &access, BRANCH).await.expect("push");
    assert_eq!(git(&remote, &["rev-parse", BRANCH]), tip);
    assert_eq!(git(&remote, &["rev-parse", "main"]), head, "main untouched");
    let refs = git(&remote, &["for-each-ref", "--format=%(refname)"]);
    assert!(!refs.contains("evil") && !refs.contains("v666"), "{refs}");
    // Neither on the host's clone.
    let refs = git(&co.git_dir, &["for-each-ref", "--format=%(refname)"]);
    assert_eq!(
        refs.lines().collect::<Vec<_>>(),
        ["refs/heads/cella/tsk_test1", "refs/heads/main"]
    );
    assert_eq!(git(&co.git_dir, &["rev-parse", "main"]), head);
}

#[tokio::test]
async fn a_push_the_remote_refuses_is_push_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("repos");
    let remote = root.join("acme/app");
    make_repo(&remote);
    let access = forge(&root).open(&repo("acme/app")).await.expect("open");
    let hg = HostGit::new(&tmp.path().join("run"));
    let co = hg.clone_base(&access, None, 1 << 30).await.expect("clone");
    let sbx = Sandbox::new(&tmp.path().join("sandbox"));
    sbx.prepare(&hg, &co, BRANCH).await;
    std::fs::write(sbx.checkout.join("A.md"), "a\n").expect("w");
    sbx.collect(&co.base_sha, BRANCH, "a");
    hg.receive_bundle(&co, &sbx.bundle, BRANCH)
        .await
        .expect("receive")
        .expect("commits");
    // Someone else's branch of that name is already there (not a fast-forward).
    git(&remote, &["branch", BRANCH, "main~1"]);
    match hg.push(&co, &access, BRANCH).await {
        Err(GitError::PushRefused(why)) => {
            assert!(!why.contains('\n'), "{why}");
            assert!(why.contains("rejected"), "{why}");
        }
        other => panic!("expected PushRefused, got {other:?}"),
    }
}

/// The agent was killed mid-command (a stale `index.lock`) and committed on a branch of its
/// own made from the run's branch: collect still hands back all of its work.
#[tokio::test]
async fn collect_after_a_killed_agent_on_a_branch_of_its_own() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("repos");
    let remote = root.join("acme/app");
    make_repo(&remote);
    let access = forge(&root).open(&repo("acme/app")).await.expect("open");
    let hg = HostGit::new(&tmp.path().join("run"));
    let co = hg.clone_base(&access, None, 1 << 30).await.expect("clone");
    let sbx = Sandbox::new(&tmp.path().join("sandbox"));
    sbx.prepare(&hg, &co, BRANCH).await;

    git(&sbx.checkout, &["checkout", "-q", "-b", "agent-own"]);
    std::fs::write(sbx.checkout.join("A.md"), "committed\n").expect("w");
    git(&sbx.checkout, &["add", "A.md"]);
    git(&sbx.checkout, &["commit", "-q", "-m", "own branch"]);
    std::fs::write(sbx.checkout.join("B.md"), "uncommitted\n").expect("w");
    std::fs::write(sbx.checkout.join(".git/index.lock"), b"").expect("w");

    sbx.collect(&co.base_sha, BRANCH, "Cella: left over");
    let tip = hg
        .receive_bundle(&co, &sbx.bundle, BRANCH)
        .await
        .expect("receive")
        .expect("commits");
    hg.push(&co, &access, BRANCH).await.expect("push");
    assert_eq!(git(&remote, &["rev-parse", BRANCH]), tip);
    assert_eq!(
        git(&remote, &["show", &format!("{BRANCH}:A.md")]),
        "committed"
    );
    assert_eq!(
        git(&remote, &["show", &format!("{BRANCH}:B.md")]),
        "uncommitted"
    );
}

/// A local repository owned by another user is refused by git's own guard (its config could
/// run commands as the server), with a message saying what to do.
#[tokio::test]
async fn a_repository_of_another_user_is_refused_clearly() {
    let uid = std::process::Command::new("id")
        .arg("-u")
        .output()
        .expect("id");
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        eprintln!("skipped: needs root to give a repository to another user");
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("repos");
    let path = root.join("acme/app");
    make_repo(&path);
    let out = std::process::Command::new("chown")
        .args(["-R", "1000:1000"])
        .arg(&path)
        .output()
        .expect("chown");
    assert!(out.status.success());
    let access = forge(&root).open(&repo("acme/app")).await.expect("open");
    let hg = HostGit::new(&tmp.path().join("run"));
    match hg.resolve_base(&access, None).await {
        Err(GitError::NotFound(m)) => assert!(m.contains("owned by another user"), "{m}"),
        other => panic!("expected NotFound, got {other:?}"),
    }
}

#[tokio::test]
async fn an_empty_repository_has_no_base() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("repos");
    let bare = root.join("acme/empty.git");
    std::fs::create_dir_all(&bare).expect("mkdir");
    git(&bare, &["init", "-q", "--bare", "-b", "main"]);
    let access = forge(&root).open(&repo("acme/empty")).await.expect("open");
    let hg = HostGit::new(&tmp.path().join("run"));
    assert!(matches!(
        hg.resolve_base(&access, None).await,
        Err(GitError::BaseBranchMissing(_))
    ));
    assert!(matches!(
        hg.clone_base(&access, None, 1 << 30).await,
        Err(GitError::BaseBranchMissing(_))
    ));
    assert!(matches!(
        hg.clone_base(&access, Some("main"), 1 << 30).await,
        Err(GitError::BaseBranchMissing(b)) if b == "main"
    ));
    assert!(!tmp.path().join("run/repo.git").exists());
}

/// A branch whose tree holds a `.git` entry (which would take over the git directory of
/// whoever checks it out) fails the host's object checks and is refused.
#[tokio::test]
async fn a_tree_with_a_dot_git_entry_is_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("repos");
    let remote = root.join("acme/app");
    make_repo(&remote);
    let access = forge(&root).open(&repo("acme/app")).await.expect("open");
    let hg = HostGit::new(&tmp.path().join("run"));
    let co = hg.clone_base(&access, None, 1 << 30).await.expect("clone");
    let sbx = Sandbox::new(&tmp.path().join("sandbox"));
    sbx.prepare(&hg, &co, BRANCH).await;

    // A tree holding `.git/config`, which git's checkout would refuse to write.
    let blob = git_with_input(
        &sbx.checkout,
        &["hash-object", "-w", "--stdin"],
        "[core]\n\tfsmonitor = touch /tmp/x\n",
    );
    let inner = git_with_input(
        &sbx.checkout,
        &["mktree"],
        &format!("100644 blob {blob}\tconfig\n"),
    );
    let top = git_with_input(
        &sbx.checkout,
        &["mktree"],
        &format!("040000 tree {inner}\t.git\n"),
    );
    assert_eq!(top.len(), 40, "mktree made the tree");
    let commit = git(
        &sbx.checkout,
        &["commit-tree", &top, "-p", &co.base_sha, "-m", "evil"],
    );
    git(
        &sbx.checkout,
        &["update-ref", &format!("refs/heads/{BRANCH}"), &commit],
    );
    let b = sbx.bundle.to_str().expect("utf-8");
    git(
        &sbx.checkout,
        &["bundle", "create", b, &format!("{}..{BRANCH}", co.base_sha)],
    );
    match hg.receive_bundle(&co, &sbx.bundle, BRANCH).await {
        Err(GitError::BadBundle(_)) => {}
        other => panic!("expected BadBundle, got {other:?}"),
    }
    assert!(
        git_out(&co.git_dir, &["rev-parse", "--verify", "-q", BRANCH])
            .stdout
            .is_empty()
    );
}
